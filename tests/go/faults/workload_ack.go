package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"time"
)

// The acknowledged-writes workload: one client writes unique keys ack-<n> through random
// replicas throughout the run. After the faults heal, every acknowledged key must be readable
// with its value through every replica.

const ackWorkload = "ack"

func runAck(ctx context.Context, cfg Config, h *History, cl *Client, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := cfg.rng(300)
		for n := 1; ctx.Err() == nil; n++ {
			r := cl.pick(rng)
			key, val := fmt.Sprintf("ack-%d", n), fmt.Sprintf("a%d-%d", n, rng.Int63())
			body, _ := json.Marshal([]map[string]any{{"key": key, "value": val}})
			op := Op{Workload: ackWorkload, Kind: "write", Node: r.ID, Key: key, Value: val, Invoke: h.Now()}
			rep := cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore", body, nil)
			op.Return = h.Now()
			op.Saved(rep)
			h.Add(op)
			backoff(ctx, op)
			sleepCtx(ctx, time.Duration(10+rng.Intn(20))*time.Millisecond)
		}
	}()
}

// bulkRead reads keys through one replica with the Dapr bulk API, in pages, retrying a page a
// few times (the cluster was just healed; a replica may still be catching up with Redis).
func bulkRead(cl *Client, r *Replica, keys []string) (map[string]string, error) {
	got := map[string]string{}
	for i := 0; i < len(keys); i += 100 {
		page := keys[i:min(i+100, len(keys))]
		body, _ := json.Marshal(map[string]any{"keys": page})
		var rep Reply
		for try := 0; try < 5; try++ {
			rep = cl.do(context.Background(), "POST", r.HTTP+"/v1.0/state/statestore/bulk", body, nil)
			if rep.Err == nil && rep.Status == 200 {
				break
			}
			time.Sleep(time.Second)
		}
		if rep.Err != nil || rep.Status != 200 {
			return nil, fmt.Errorf("bulk read through %s: http %d %v %s", r.ID, rep.Status, rep.Err, rep.Body)
		}
		var items []struct {
			Key  string          `json:"key"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(rep.Body, &items); err != nil {
			return nil, fmt.Errorf("bulk read through %s: %v", r.ID, err)
		}
		for _, it := range items {
			var s string
			if len(it.Data) > 0 && json.Unmarshal(it.Data, &s) == nil {
				got[it.Key] = s
			}
		}
	}
	return got, nil
}

// checkAck reads every key written (acknowledged or unknown) through every replica.
// Acknowledged: must be there with its value. Unknown: may be absent, but if present must hold
// its value. Failed: should be absent (reported as a note, a definite failure that happened).
func checkAck(h *History, cl *Client, out string) Verdict {
	ops := h.Ops(ackWorkload)
	dumpJSON(filepath.Join(out, "history-ack.json"), ops)
	v := Verdict{Checker: "acknowledged writes kept on every replica", Valid: true}
	keys := make([]string, len(ops))
	for i, o := range ops {
		keys[i] = o.Key
	}
	acked, unknownN, unknownPresent := 0, 0, 0
	for _, o := range ops {
		switch o.Outcome {
		case OK:
			acked++
		case Unknown:
			unknownN++
		}
	}
	lost := 0
	for _, r := range cl.replicas {
		got, err := bulkRead(cl, r, keys)
		if err != nil {
			v.violate("could not read back: " + err.Error())
			continue
		}
		for _, o := range ops {
			val, ok := got[o.Key]
			switch o.Outcome {
			case OK:
				if !ok {
					lost++
					v.violate(fmt.Sprintf("acknowledged write missing through %s: %s", r.ID, o))
				} else if val != o.Value {
					v.violate(fmt.Sprintf("acknowledged write has value %q through %s: %s", val, r.ID, o))
				}
			case Unknown:
				if ok && val != o.Value {
					v.violate(fmt.Sprintf("unknown write has foreign value %q through %s: %s", val, r.ID, o))
				} else if ok && r == cl.replicas[0] {
					unknownPresent++
				}
			case Fail:
				if ok {
					v.Notes = append(v.Notes, fmt.Sprintf("failed write present through %s: %s", r.ID, o))
				}
			}
		}
	}
	v.Summary = fmt.Sprintf("%d writes, %d acknowledged, %d unknown (%d of them present), %d acknowledged reads missing across %d replicas",
		len(ops), acked, unknownN, unknownPresent, lost, len(cl.replicas))
	return v
}
