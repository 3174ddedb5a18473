package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The invariant workload: pairs of keys (inv-<p>-x, inv-<p>-y) that only ever change together,
// in a Dapr transaction (HTTP) writing x = v and y = 100 - v with a fresh v each time. Readers
// take both keys at once with a snapshot read (MGET over gRPC GetMany, MQTT MGET: "as of one
// moment, never half of a transaction") through random replicas. Every read that answers must
// show both keys absent (before the pair's first transaction) or both present with x + y = 100.
// A torn read shows one transaction's x with another's y: with v drawn from two million values
// their sum is 100 only by chance.
//
// A transaction's outcome does not matter to the check (a half-applied transaction would itself
// show up as a broken sum), so writers only record counts.

const (
	invWorkload = "invariant"
	invPairs    = 2
	invWriters  = 2
	invReaders  = 2
)

// snapshotReader reads several keys as of one moment through a replica. vals[i] is key i's
// stored bytes, present[i] whether it exists.
type snapshotReader interface {
	name() string
	getMany(ctx context.Context, r *Replica, keys []string) (vals []string, present []bool, rep opResult)
}

// opResult is a door's classification of one call, for ops that are not recorded in full.
type opResult struct {
	Outcome Outcome
	Err     string
}

func invKeys(p int) []string {
	return []string{fmt.Sprintf("inv-%d-x", p), fmt.Sprintf("inv-%d-y", p)}
}

func runInvariant(ctx context.Context, cfg Config, h *History, cl *Client, readers []snapshotReader, replicas []*Replica, wg *sync.WaitGroup) {
	if len(readers) == 0 {
		return
	}
	for i := 0; i < invWriters; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := cfg.rng(500 + int64(id))
			for ctx.Err() == nil {
				invWrite(ctx, h, cl, rng, id, replicas[rng.Intn(len(replicas))])
				sleepCtx(ctx, time.Duration(5+rng.Intn(20))*time.Millisecond)
			}
		}(i)
	}
	for i := 0; i < invReaders; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := cfg.rng(600 + int64(id))
			for ctx.Err() == nil {
				d := readers[rng.Intn(len(readers))]
				invRead(ctx, h, d, id, replicas[rng.Intn(len(replicas))], rng.Intn(invPairs))
				sleepCtx(ctx, time.Duration(rng.Intn(15))*time.Millisecond)
			}
		}(i)
	}
}

func invWrite(ctx context.Context, h *History, cl *Client, rng *rand.Rand, id int, r *Replica) {
	p := rng.Intn(invPairs)
	keys := invKeys(p)
	v := rng.Int63n(2_000_001) - 1_000_000
	ops := []map[string]any{
		{"operation": "upsert", "request": map[string]any{"key": keys[0], "value": v}},
		{"operation": "upsert", "request": map[string]any{"key": keys[1], "value": 100 - v}},
	}
	if rng.Intn(2) == 0 {
		ops[0], ops[1] = ops[1], ops[0]
	}
	body, _ := json.Marshal(map[string]any{"operations": ops})
	op := Op{Workload: invWorkload, Client: id, Kind: "transaction", Door: "http", Node: r.ID, Key: keys[0],
		Value: strconv.FormatInt(v, 10), Invoke: h.Now()}
	op.Saved(cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore/transaction", body, nil))
	op.Return = h.Now()
	op.ETag = "" // a transaction answers no version
	h.Add(op)
	backoff(ctx, op)
}

func invRead(ctx context.Context, h *History, d snapshotReader, id int, r *Replica, p int) {
	keys := invKeys(p)
	op := Op{Workload: invWorkload, Client: id, Kind: "mget", Door: d.name(), Node: r.ID, Key: keys[0], Invoke: h.Now()}
	vals, present, res := d.getMany(ctx, r, keys)
	op.Return, op.Outcome, op.Err = h.Now(), res.Outcome, res.Err
	if res.Outcome == OK {
		op.Value = describePair(vals, present)
	}
	h.Add(op)
	backoff(ctx, op)
}

// describePair is how a read is kept in the history: "x=<v> y=<w>", "-" for an absent key.
func describePair(vals []string, present []bool) string {
	parts := make([]string, len(vals))
	for i := range vals {
		parts[i] = "-"
		if present[i] {
			parts[i] = vals[i]
		}
	}
	return "x=" + parts[0] + " y=" + parts[1]
}

// pairHolds: both absent, or both JSON integers summing to 100.
func pairHolds(value string) bool {
	var x, y string
	if _, err := fmt.Sscanf(value, "x=%s y=%s", &x, &y); err != nil {
		return false
	}
	if x == "-" && y == "-" {
		return true
	}
	xv, err1 := strconv.ParseInt(x, 10, 64)
	yv, err2 := strconv.ParseInt(y, 10, 64)
	return err1 == nil && err2 == nil && xv+yv == 100
}

func checkInvariant(h *History, out string) Verdict {
	ops := h.Ops(invWorkload)
	dumpJSON(filepath.Join(out, "history-invariant.json"), ops)
	v := Verdict{Checker: "MGET never sees half of a transaction (x + y = 100)", Valid: true}
	reads, broken := 0, 0
	writes := map[Outcome]int{}
	perDoor := map[string]int{}
	for _, o := range ops {
		switch o.Kind {
		case "transaction":
			writes[o.Outcome]++
		case "mget":
			if o.Outcome != OK {
				continue
			}
			reads++
			perDoor[o.Door]++
			if !pairHolds(o.Value) {
				broken++
				v.violate(o.String())
			}
		}
	}
	var doors []string
	for d, n := range perDoor {
		doors = append(doors, fmt.Sprintf("%s %d", d, n))
	}
	sort.Strings(doors)
	v.Summary = fmt.Sprintf("%d snapshot reads answered (%s), %d broken; transactions ok/fail/unknown %d/%d/%d",
		reads, strings.Join(doors, ", "), broken, writes[OK], writes[Fail], writes[Unknown])
	if reads == 0 {
		// A checker that saw nothing must not pass for one that checked.
		v.violate("no snapshot read answered: the invariant was never checked")
	}
	return v
}

// getMany over HTTP: the Dapr bulk get (POST /v1.0/state/<store>/bulk). Values are the JSON
// each key holds, as stored.
func (d httpDoor) getMany(ctx context.Context, r *Replica, keys []string) ([]string, []bool, opResult) {
	body, _ := json.Marshal(map[string]any{"keys": keys})
	rep := d.cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore/bulk", body, nil)
	switch {
	case rep.Unknown():
		return nil, nil, opResult{Unknown, rep.ErrString()}
	case rep.Status != 200:
		return nil, nil, opResult{Fail, rep.ErrString()}
	}
	var items []struct {
		Key  string          `json:"key"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(rep.Body, &items); err != nil || len(items) != len(keys) {
		return nil, nil, opResult{Unknown, "undecodable bulk answer: " + string(rep.Body)}
	}
	vals, present := make([]string, len(keys)), make([]bool, len(keys))
	for i, it := range items {
		present[i] = len(it.Data) > 0
		vals[i] = string(it.Data)
	}
	return vals, present, opResult{Outcome: OK}
}
