package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// The CAS register workload: 4 clients on 3 keys over the Dapr HTTP state API, each request
// through a random replica. Every written value is unique, so an ETag read together with a value
// stands for that value and a CAS by ETag is a CAS by value.

const (
	regWorkload = "register"
	regClients  = 4
)

var regKeys = []string{"reg-0", "reg-1", "reg-2"}

func runRegister(ctx context.Context, cfg Config, h *History, cl *Client, wg *sync.WaitGroup) {
	for i := 0; i < regClients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := cfg.rng(100 + int64(id))
			n := 0
			for ctx.Err() == nil {
				key := regKeys[rng.Intn(len(regKeys))]
				n++
				val := fmt.Sprintf("c%d-%d", id, n)
				switch p := rng.Intn(10); {
				case p < 4:
					regRead(ctx, h, cl, id, key, rng.Intn(len(cl.replicas)))
				case p < 6:
					regWrite(ctx, h, cl, id, key, val, rng.Intn(len(cl.replicas)))
				default:
					// CAS: a read (recorded as a read of its own) gives the value and its ETag,
					// then the conditional save goes through another random replica.
					v, etag, ok := regRead(ctx, h, cl, id, key, rng.Intn(len(cl.replicas)))
					if ok && etag != "" {
						regCAS(ctx, h, cl, id, key, v, etag, val, rng.Intn(len(cl.replicas)))
					}
				}
				// Keeps the history small enough for the checker and the 2 cores free.
				sleepCtx(ctx, time.Duration(rng.Intn(15))*time.Millisecond)
			}
		}(i)
	}
}

func regRead(ctx context.Context, h *History, cl *Client, id int, key string, ri int) (string, string, bool) {
	r := cl.replicas[ri]
	op := Op{Workload: regWorkload, Client: id, Kind: "read", Node: r.ID, Key: key, Invoke: h.Now()}
	rep := cl.do(ctx, "GET", r.HTTP+"/v1.0/state/statestore/"+key, nil, nil)
	op.Return, op.Status = h.Now(), rep.Status
	ok := false
	switch {
	case rep.Unknown():
		op.Outcome, op.Err = Unknown, rep.ErrString()
	case rep.Status == 204:
		op.Outcome, ok = OK, true
	case rep.Status == 200:
		var s string
		if err := json.Unmarshal(rep.Body, &s); err != nil {
			op.Outcome, op.Err = Unknown, "undecodable value: "+string(rep.Body)
		} else {
			op.Outcome, op.Value, op.ETag, ok = OK, s, rep.Header.Get("Etag"), true
		}
	default:
		op.Outcome, op.Err = Fail, rep.ErrString()
	}
	h.Add(op)
	backoff(ctx, op)
	return op.Value, op.ETag, ok
}

func regWrite(ctx context.Context, h *History, cl *Client, id int, key, val string, ri int) {
	r := cl.replicas[ri]
	body, _ := json.Marshal([]map[string]any{{"key": key, "value": val}})
	op := Op{Workload: regWorkload, Client: id, Kind: "write", Node: r.ID, Key: key, Value: val, Invoke: h.Now()}
	rep := cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore", body, nil)
	op.Return, op.Status = h.Now(), rep.Status
	switch {
	case rep.Unknown():
		op.Outcome, op.Err = Unknown, rep.ErrString()
	case rep.Status == 204:
		op.Outcome, op.ETag = OK, rep.Header.Get("Etag")
	default:
		op.Outcome, op.Err = Fail, rep.ErrString()
	}
	h.Add(op)
	backoff(ctx, op)
}

func regCAS(ctx context.Context, h *History, cl *Client, id int, key, old, etag, val string, ri int) {
	r := cl.replicas[ri]
	body, _ := json.Marshal([]map[string]any{{"key": key, "value": val, "etag": etag,
		"options": map[string]string{"concurrency": "first-write"}}})
	op := Op{Workload: regWorkload, Client: id, Kind: "cas", Node: r.ID, Key: key, Old: old, Value: val, Invoke: h.Now()}
	rep := cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore", body, nil)
	op.Return, op.Status = h.Now(), rep.Status
	switch {
	case rep.Unknown():
		op.Outcome, op.Err = Unknown, rep.ErrString()
	case rep.Status == 204:
		op.Outcome, op.ETag = OK, rep.Header.Get("Etag")
	case rep.Status == 409:
		op.Outcome = Fail // the ETag did not match: definitely not applied
	default:
		op.Outcome, op.Err = Fail, rep.ErrString()
	}
	h.Add(op)
	backoff(ctx, op)
}

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

// registerModel: one register per key (partitioned by key), state = current value, "" = absent.
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		m := map[string][]porcupine.Operation{}
		for _, o := range history {
			k := o.Input.(regInput).Key
			m[k] = append(m[k], o)
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, m[k])
		}
		return out
	},
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

// checkRegister turns the history into porcupine operations and checks it. Unknown reads are
// dropped (they constrain nothing); unknown writes and CASes return at the end of the history,
// porcupine's convention for an op that may take effect at any point after its invocation.
func checkRegister(h *History, out string) Verdict {
	ops := h.Ops(regWorkload)
	end := h.Now() + time.Hour
	var pops []porcupine.Operation
	unknown := 0
	for _, o := range ops {
		if o.Outcome == Fail && !(o.Kind == "cas" && o.Status == 409) {
			continue // refused (4xx other than a CAS's 409): nothing happened, nothing learnt
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
		pops = append(pops, porcupine.Operation{ClientId: o.Client, Input: in, Output: res,
			Call: int64(o.Invoke), Return: int64(ret)})
	}
	v := Verdict{Checker: "register (porcupine linearizability)", Valid: true}
	res, info := porcupine.CheckOperationsVerbose(registerModel, pops, 5*time.Minute)
	v.Summary = fmt.Sprintf("%d ops checked on %d keys (%d unknown writes/cas), result %s", len(pops), len(regKeys), unknown, res)
	switch res {
	case porcupine.Ok:
	case porcupine.Unknown:
		v.Summary += " (UNDECIDED)"
		v.Notes = append(v.Notes, "porcupine timed out: linearizability not decided")
	default:
		path := filepath.Join(out, "register-porcupine.html")
		if err := porcupine.VisualizePath(registerModel, info, path); err != nil {
			v.Notes = append(v.Notes, "visualization: "+err.Error())
		}
		// Which keys failed: check each key alone.
		for _, part := range registerModel.Partition(pops) {
			if porcupine.CheckOperationsTimeout(registerModel, part, time.Minute) == porcupine.Illegal {
				key := part[0].Input.(regInput).Key
				v.violate(fmt.Sprintf("key %s: history not linearizable (%d ops); see %s", key, len(part), path))
			}
		}
		if v.Valid {
			v.violate("history not linearizable; see " + path)
		}
	}
	dumpJSON(filepath.Join(out, "history-register.json"), ops)
	return v
}

func dumpJSON(path string, x any) {
	b, err := json.MarshalIndent(x, "", " ")
	if err == nil {
		os.WriteFile(path, b, 0o644)
	}
}
