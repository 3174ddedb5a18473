package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// The fencing workload: clients take one Dapr lock with a 1 s lease through random replicas,
// save the fenced key with the token they got (sometimes after sleeping past the lease, as a
// paused holder would), and unlock.

const (
	fenceWorkload = "fencing"
	fenceClients  = 3
	fenceLease    = time.Second
	// fenceMargin absorbs the difference between when a request is sent and when the server
	// starts the lease, plus the replicas' scheduling on 2 cores.
	fenceMargin = 200 * time.Millisecond
)

func runFencing(ctx context.Context, cfg Config, h *History, cl *Client, wg *sync.WaitGroup) {
	for i := 0; i < fenceClients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := cfg.rng(200 + int64(id))
			for n := 1; ctx.Err() == nil; n++ {
				owner := fmt.Sprintf("f%d-%d", id, n)
				tok, ok := fenceLock(ctx, h, cl, id, owner, rng.Intn(len(cl.replicas)))
				if !ok {
					sleepCtx(ctx, time.Duration(20+rng.Intn(80))*time.Millisecond)
					continue
				}
				if rng.Intn(4) == 0 {
					// A holder that stalls past its lease: its save must be refused once a later
					// holder saved with a higher token.
					sleepCtx(ctx, fenceLease+fenceLease/2)
				} else {
					sleepCtx(ctx, time.Duration(rng.Intn(100))*time.Millisecond)
				}
				fenceSave(ctx, h, cl, id, owner, tok, rng.Intn(len(cl.replicas)))
				fenceUnlock(ctx, h, cl, id, owner, rng.Intn(len(cl.replicas)))
			}
		}(i)
	}
}

func fenceLock(ctx context.Context, h *History, cl *Client, id int, owner string, ri int) (string, bool) {
	r := cl.replicas[ri]
	body, _ := json.Marshal(map[string]any{"resourceId": "fence", "lockOwner": owner, "expiryInSeconds": 1})
	op := Op{Workload: fenceWorkload, Client: id, Kind: "lock", Node: r.ID, Owner: owner, Invoke: h.Now()}
	rep := cl.do(ctx, "POST", r.HTTP+"/v1.0-alpha1/lock/lockstore", body, nil)
	op.Return, op.Status = h.Now(), rep.Status
	var res struct {
		Success bool `json:"success"`
	}
	switch {
	case rep.Unknown():
		op.Outcome, op.Err = Unknown, rep.ErrString()
	case rep.Status != 200:
		op.Outcome, op.Err = Fail, rep.ErrString()
	case json.Unmarshal(rep.Body, &res) != nil:
		op.Outcome, op.Err = Unknown, "undecodable: "+string(rep.Body)
	case res.Success:
		op.Outcome, op.Token = OK, rep.Header.Get("metadata.fencingtoken")
		if op.Token == "" {
			op.Err = "granted without a fencing token"
		}
	default:
		op.Outcome = Fail // held by another
	}
	h.Add(op)
	backoff(ctx, op)
	return op.Token, op.Outcome == OK && op.Token != ""
}

func fenceSave(ctx context.Context, h *History, cl *Client, id int, owner, tok string, ri int) {
	r := cl.replicas[ri]
	body, _ := json.Marshal([]map[string]any{{"key": "fenced", "value": owner, "metadata": map[string]string{"fencingToken": tok}}})
	op := Op{Workload: fenceWorkload, Client: id, Kind: "save", Node: r.ID, Key: "fenced", Value: owner, Owner: owner, Token: tok, Invoke: h.Now()}
	rep := cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore", body, nil)
	op.Return = h.Now()
	op.Saved(rep) // 409: fenced out
	h.Add(op)
	backoff(ctx, op)
}

func fenceUnlock(ctx context.Context, h *History, cl *Client, id int, owner string, ri int) {
	r := cl.replicas[ri]
	body, _ := json.Marshal(map[string]any{"resourceId": "fence", "lockOwner": owner})
	op := Op{Workload: fenceWorkload, Client: id, Kind: "unlock", Node: r.ID, Owner: owner, Invoke: h.Now()}
	rep := cl.do(ctx, "POST", r.HTTP+"/v1.0-alpha1/unlock/lockstore", body, nil)
	op.Return, op.Status = h.Now(), rep.Status
	var res struct {
		Status int `json:"status"`
	}
	switch {
	case rep.Unknown():
		op.Outcome, op.Err = Unknown, rep.ErrString()
	case rep.Status == 200 && json.Unmarshal(rep.Body, &res) == nil && res.Status == 0:
		op.Outcome = OK
	default:
		op.Outcome, op.Err = Fail, fmt.Sprintf("http %d %s", rep.Status, rep.Body)
	}
	h.Add(op)
	backoff(ctx, op)
}

// checkFencing runs the three fencing checks. Tokens are HLC strings `ms:counter:node`,
// zero-padded, so string order is token order.
func checkFencing(h *History, out string, expiries func(from, to time.Duration) []string) []Verdict {
	ops := h.Ops(fenceWorkload)
	dumpJSON(filepath.Join(out, "history-fencing.json"), ops)
	var grants, saves []Op
	unlockInvoke := map[string]time.Duration{} // owner -> when its unlock was sent
	for _, o := range ops {
		switch {
		case o.Kind == "lock" && o.Outcome == OK && o.Token != "":
			grants = append(grants, o)
		case o.Kind == "save":
			saves = append(saves, o)
		case o.Kind == "unlock":
			unlockInvoke[o.Owner] = o.Invoke
		}
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].Invoke < grants[j].Invoke })

	// (i) Tokens increase in real time: a grant that began after another one returned has a
	// higher token.
	mono := Verdict{Checker: "fencing: tokens increase across grants", Valid: true}
	n := 0
	inverted := map[string]bool{} // grants B with at least one inversion
	for _, a := range grants {
		for _, b := range grants {
			if a.Return < b.Invoke && b.Token <= a.Token {
				n++
				inverted[b.Owner] = true
				mono.violate(fmt.Sprintf("grant B got token %s not above token %s of grant A that returned %.3fs before B was invoked: A=%s B=%s",
					b.Token, a.Token, (b.Invoke - a.Return).Seconds(), a, b))
			}
		}
	}
	mono.Summary = fmt.Sprintf("%d grants, %d of them with a token not above an earlier grant's (%d inverted pairs)", len(grants), len(inverted), n)

	// (ii) No stale write accepted: once a save with token ta was acknowledged, a save with a
	// lower token invoked afterwards is refused. Only acknowledged saves count on either side:
	// an unknown save may or may not have happened.
	stale := Verdict{Checker: "fencing: no stale save accepted", Valid: true}
	n = 0
	acked := 0
	for _, a := range saves {
		if a.Outcome != OK {
			continue
		}
		acked++
		for _, b := range saves {
			if b.Outcome == OK && a.Return < b.Invoke && b.Token < a.Token {
				n++
				stale.violate(fmt.Sprintf("save with token %s acknowledged though a save with the higher token %s was acknowledged %.3fs before it was invoked: earlier=%s later=%s",
					b.Token, a.Token, (b.Invoke - a.Return).Seconds(), a, b))
			}
		}
	}
	stale.Summary = fmt.Sprintf("%d saves (%d acknowledged), %d stale saves accepted after a higher-token save (pairs)", len(saves), acked, n)

	// (iii) Mutual exclusion: B's grant is certain to overlap A's lease when B was invoked after
	// A returned, B returned before A's lease could have run out (A's invoke + lease - margin:
	// the server started the lease no earlier than A's invoke), and A had not sent its unlock
	// before B returned (an unlock in flight might have taken effect before B's grant).
	mutex := Verdict{Checker: "fencing: one holder at a time", Valid: true}
	n = 0
	second := map[string]bool{} // grants B made while another holder certainly held the lock
	for _, a := range grants {
		for _, b := range grants {
			if a.Owner == b.Owner || b.Invoke <= a.Return || b.Return >= a.Invoke+fenceLease-fenceMargin {
				continue
			}
			if u, ok := unlockInvoke[a.Owner]; ok && u <= b.Return {
				continue
			}
			n++
			second[b.Owner] = true
			mutex.violate(fmt.Sprintf("two holders: B granted %.3fs into A's %v lease, A not unlocked: A=%s B=%s; lock expiries seen between (time, version: its node expired it): %v",
				(b.Return - a.Invoke).Seconds(), fenceLease, a, b, expiries(a.Return, b.Return)))
		}
	}
	mutex.Summary = fmt.Sprintf("%d grants, %d of them while another holder's lease ran (%d overlapping pairs)", len(grants), len(second), n)
	return []Verdict{mono, stale, mutex}
}
