package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// The CAS register workload: 4 clients on 3 keys at a time over the Dapr HTTP state API, each
// request through a random replica. Every written value is unique, so an ETag read together with
// a value stands for that value and a CAS by ETag is a CAS by value.
//
// The keys rotate: every regEpoch the clients move to 3 fresh keys (reg-<epoch>-<i>), as Jepsen's
// independent keys do. Porcupine's search grows with the number of operations open at once on a
// key, and an unknown write stays open until the end of the history: on 3 keys for a whole
// 5-minute run, 1,500 unknown writes made porcupine time out (undecided) after 10 GB. A few
// seconds per key bound both the history of a key and the unknown writes in it.

const (
	regWorkload = "register"
	regClients  = 4
)

const (
	regKeysPerEpoch = 3
	regEpoch        = 5 * time.Second
)

// regKey is the key number i of the epoch the run is in at time now.
func regKey(now time.Duration, i int) string {
	return fmt.Sprintf("reg-%d-%d", now/regEpoch, i)
}

func runRegister(ctx context.Context, cfg Config, h *History, cl *Client, wg *sync.WaitGroup) {
	for i := 0; i < regClients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := cfg.rng(100 + int64(id))
			n := 0
			for ctx.Err() == nil {
				key := regKey(h.Now(), rng.Intn(regKeysPerEpoch))
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
	op.Return = h.Now()
	op.Saved(rep)
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
