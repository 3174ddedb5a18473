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

// regDoor is one way the register clients reach a replica: the Dapr HTTP API here, gRPC
// (door_grpc.go), MQTT (door_mqtt.go). Each fills op (Outcome, and Value/ETag/Status/Err as the
// reply gives them); the caller times and records it. A door without a compare-and-set answers
// canCAS false and is not asked for one.
type regDoor interface {
	name() string
	read(ctx context.Context, r *Replica, op *Op)
	// write stores op.Value unconditionally.
	write(ctx context.Context, r *Replica, op *Op)
	// cas stores op.Value only if the key's version is still etag.
	cas(ctx context.Context, r *Replica, op *Op, etag string)
	canCAS() bool
}

func runRegister(ctx context.Context, cfg Config, h *History, doors []regDoor, replicas []*Replica, wg *sync.WaitGroup) {
	var casDoors []regDoor
	for _, d := range doors {
		if d.canCAS() {
			casDoors = append(casDoors, d)
		}
	}
	for i := 0; i < regClients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := cfg.rng(100 + int64(id))
			n := 0
			pick := func(ds []regDoor) (regDoor, *Replica) {
				return ds[rng.Intn(len(ds))], replicas[rng.Intn(len(replicas))]
			}
			for ctx.Err() == nil {
				key := regKey(h.Now(), rng.Intn(regKeysPerEpoch))
				n++
				val := fmt.Sprintf("c%d-%d", id, n)
				switch p := rng.Intn(10); {
				case p < 4:
					d, r := pick(doors)
					regRead(ctx, h, d, r, id, key)
				case p < 6:
					d, r := pick(doors)
					regWrite(ctx, h, d, r, id, key, val)
				default:
					// CAS: a read (recorded as a read of its own) gives the value and its ETag,
					// then the conditional save goes through another random door and replica.
					d, r := pick(doors)
					v, etag, ok := regRead(ctx, h, d, r, id, key)
					if ok && etag != "" {
						d, r = pick(casDoors)
						regCAS(ctx, h, d, r, id, key, v, etag, val)
					}
				}
				// Keeps the history small enough for the checker and the 2 cores free.
				sleepCtx(ctx, time.Duration(rng.Intn(15))*time.Millisecond)
			}
		}(i)
	}
}

func regRead(ctx context.Context, h *History, d regDoor, r *Replica, id int, key string) (string, string, bool) {
	op := Op{Workload: regWorkload, Client: id, Kind: "read", Door: d.name(), Node: r.ID, Key: key, Invoke: h.Now()}
	d.read(ctx, r, &op)
	op.Return = h.Now()
	h.Add(op)
	backoff(ctx, op)
	return op.Value, op.ETag, op.Outcome == OK
}

func regWrite(ctx context.Context, h *History, d regDoor, r *Replica, id int, key, val string) {
	op := Op{Workload: regWorkload, Client: id, Kind: "write", Door: d.name(), Node: r.ID, Key: key, Value: val, Invoke: h.Now()}
	d.write(ctx, r, &op)
	op.Return = h.Now()
	h.Add(op)
	backoff(ctx, op)
}

func regCAS(ctx context.Context, h *History, d regDoor, r *Replica, id int, key, old, etag, val string) {
	op := Op{Workload: regWorkload, Client: id, Kind: "cas", Door: d.name(), Node: r.ID, Key: key, Old: old, Value: val, Invoke: h.Now()}
	d.cas(ctx, r, &op, etag)
	op.Return = h.Now()
	h.Add(op)
	backoff(ctx, op)
}

// httpDoor: the Dapr HTTP state API. A read's ETag is the version; a CAS is a save with the
// ETag (and first-write, so that a missing key is not created by it).
type httpDoor struct{ cl *Client }

func (httpDoor) name() string { return "http" }
func (httpDoor) canCAS() bool { return true }

func (d httpDoor) read(ctx context.Context, r *Replica, op *Op) {
	rep := d.cl.do(ctx, "GET", r.HTTP+"/v1.0/state/statestore/"+op.Key, nil, nil)
	op.Status = rep.Status
	switch {
	case rep.Unknown():
		op.Outcome, op.Err = Unknown, rep.ErrString()
	case rep.Status == 204:
		op.Outcome = OK
	case rep.Status == 200:
		var s string
		if err := json.Unmarshal(rep.Body, &s); err != nil {
			op.Outcome, op.Err = Unknown, "undecodable value: "+string(rep.Body)
		} else {
			op.Outcome, op.Value, op.ETag = OK, s, rep.Header.Get("Etag")
		}
	default:
		op.Outcome, op.Err = Fail, rep.ErrString()
	}
}

func (d httpDoor) write(ctx context.Context, r *Replica, op *Op) {
	body, _ := json.Marshal([]map[string]any{{"key": op.Key, "value": op.Value}})
	op.Saved(d.cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore", body, nil))
}

func (d httpDoor) cas(ctx context.Context, r *Replica, op *Op, etag string) {
	body, _ := json.Marshal([]map[string]any{{"key": op.Key, "value": op.Value, "etag": etag,
		"options": map[string]string{"concurrency": "first-write"}}})
	// 409 (the ETag did not match) is a definite failure, as Saved has it.
	op.Saved(d.cl.do(ctx, "POST", r.HTTP+"/v1.0/state/statestore", body, nil))
}
