package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// regInput / regOutput are porcupine's views of an op.
type regInput struct {
	Kind     string // read, write, cas
	Key      string
	Old, New string
}

type regOutput struct {
	Value   string // read: the value ("" = absent)
	OK      bool   // cas: applied
	Unknown bool   // no answer: the model allows it to have happened or not
}

// registerModel: one register, state = current value, "" = absent. The checker hands it the
// history of one key at a time (see checkRegister), so it needs no partition function.
var registerModel = porcupine.Model{
	Init: func() interface{} { return "" },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s, in, out := state.(string), input.(regInput), output.(regOutput)
		switch in.Kind {
		case "read":
			return out.Value == s, s
		case "write":
			return true, in.New
		default: // cas
			if out.Unknown {
				// Linearized where it happened: applied if the value matched there, else a no-op.
				if s == in.Old {
					return true, in.New
				}
				return true, s
			}
			if out.OK {
				return s == in.Old, in.New
			}
			return s != in.Old, s
		}
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(regInput), output.(regOutput)
		res := ""
		switch {
		case out.Unknown:
			res = " -> ?"
		case in.Kind == "read":
			res = fmt.Sprintf(" -> %q", out.Value)
		case in.Kind == "cas":
			res = fmt.Sprintf(" -> %v", out.OK)
		}
		switch in.Kind {
		case "read":
			return fmt.Sprintf("read(%s)%s", in.Key, res)
		case "write":
			return fmt.Sprintf("write(%s, %q)%s", in.Key, in.New, res)
		}
		return fmt.Sprintf("cas(%s, %q, %q)%s", in.Key, in.Old, in.New, res)
	},
	DescribeState: func(state interface{}) string { return fmt.Sprintf("%q", state.(string)) },
}

// regKeyTimeout bounds porcupine on one key. A key's history is a few seconds of the run (see
// regEpoch), decided in milliseconds when linearizable; only an illegal or pathological one
// searches long. A key left undecided is reported as such, never as passed silently.
const regKeyTimeout = 30 * time.Second

// checkRegister turns the history into porcupine operations and checks every key on its own.
// Unknown reads are dropped (they constrain nothing); unknown writes and CASes return after the
// end of the history, porcupine's convention for an op that may take effect at any point after
// its invocation (or never). A refused op (4xx other than a CAS's 409) did nothing and is
// dropped. A failing key's history is kept as porcupine's HTML visualization.
func checkRegister(h *History, out string) Verdict {
	ops := h.Ops(regWorkload)
	dumpJSON(filepath.Join(out, "history-register.json"), ops)
	end := h.Now() + time.Hour
	perKey := map[string][]porcupine.Operation{}
	unknown := 0
	for _, o := range ops {
		if o.Outcome == Fail && !(o.Kind == "cas" && o.Status == 409) {
			continue
		}
		if o.Outcome == Unknown && o.Kind == "read" {
			continue
		}
		in := regInput{Kind: o.Kind, Key: o.Key, Old: o.Old, New: o.Value}
		res := regOutput{Value: o.Value, OK: o.Outcome == OK, Unknown: o.Outcome == Unknown}
		ret := o.Return
		if o.Outcome == Unknown {
			ret = end
			unknown++
		}
		perKey[o.Key] = append(perKey[o.Key], porcupine.Operation{ClientId: o.Client, Input: in, Output: res,
			Call: int64(o.Invoke), Return: int64(ret)})
	}
	keys := make([]string, 0, len(perKey))
	for k := range perKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	v := Verdict{Checker: "register (porcupine linearizability)", Valid: true}
	var undecided []string
	checked, illegal, biggest := 0, 0, 0
	started := time.Now()
	for _, k := range keys {
		pops := perKey[k]
		checked += len(pops)
		biggest = max(biggest, len(pops))
		res, info := porcupine.CheckOperationsVerbose(registerModel, pops, regKeyTimeout)
		switch res {
		case porcupine.Ok:
		case porcupine.Unknown:
			undecided = append(undecided, k)
		default:
			illegal++
			path := filepath.Join(out, "register-"+k+".html")
			if err := porcupine.VisualizePath(registerModel, info, path); err != nil {
				v.Notes = append(v.Notes, "visualization of "+k+": "+err.Error())
			}
			v.violate(fmt.Sprintf("key %s: history of %d ops not linearizable; see %s and the key's ops in history-register.json", k, len(pops), path))
		}
	}
	v.Summary = fmt.Sprintf("%d ops checked on %d keys (%d unknown writes/cas, at most %d ops on a key) in %.1fs: %d keys not linearizable, %d undecided",
		checked, len(keys), unknown, biggest, time.Since(started).Seconds(), illegal, len(undecided))
	if len(undecided) > 0 {
		v.Summary += " (UNDECIDED)"
		v.Notes = append(v.Notes, fmt.Sprintf("porcupine gave up after %v on %d keys: %s", regKeyTimeout, len(undecided), strings.Join(undecided, " ")))
	}
	return v
}

func dumpJSON(path string, x any) {
	b, err := json.MarshalIndent(x, "", " ")
	if err == nil {
		os.WriteFile(path, b, 0o644)
	}
}
