package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// grpcDoor: the register over statestore.v1 (Get, Set, Set with if_version), one client
// connection per replica.
//
// Values: the HTTP door saves a JSON string, which stategate stores as its JSON text (quotes
// included: "c1-42" is stored as the 7 bytes `"c1-42"`), and statestore.v1 carries stored bytes
// verbatim. So this door writes the JSON text and decodes it on reads, and a key holds one value
// whichever door wrote or reads it.
type grpcDoor struct {
	api   *grpcAPI
	conns map[string]*grpc.ClientConn // by replica ID
}

// grpcTimeout bounds every call, so that a paused replica gives an unknown outcome.
const grpcTimeout = 2 * time.Second

func newGRPCDoor(replicas []*Replica) (*grpcDoor, error) {
	d := &grpcDoor{conns: map[string]*grpc.ClientConn{}}
	var conns []*grpc.ClientConn
	for _, r := range replicas {
		c, err := dialGRPC(r.GRPC)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.conns[r.ID] = c
		conns = append(conns, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, err := loadGRPCAPI(ctx, conns)
	if err != nil {
		d.Close()
		return nil, err
	}
	d.api = api
	return d, nil
}

func (d *grpcDoor) Close() {
	for _, c := range d.conns {
		c.Close()
	}
}

func (*grpcDoor) name() string { return "grpc" }
func (*grpcDoor) canCAS() bool { return true }

func (d *grpcDoor) read(ctx context.Context, r *Replica, op *Op) {
	req, resp := d.api.in(d.api.get), d.api.out(d.api.get)
	setField(req, "key", []byte(op.Key))
	if !d.call(ctx, r, d.api.get, req, resp, op) {
		return
	}
	if !getBool(resp, "found") {
		op.Outcome = OK
		return
	}
	raw := getBytes(resp, "value")
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		op.Outcome, op.Err = Unknown, "undecodable value: "+string(raw)
		return
	}
	op.Outcome, op.Value, op.ETag = OK, s, getString(resp, "version")
}

func (d *grpcDoor) write(ctx context.Context, r *Replica, op *Op) { d.set(ctx, r, op, "") }

// cas: a version mismatch (or a key gone) is ABORTED: refused, recorded as HTTP's 409 so that
// the register checker keeps it as a CAS that did not apply.
func (d *grpcDoor) cas(ctx context.Context, r *Replica, op *Op, etag string) { d.set(ctx, r, op, etag) }

func (d *grpcDoor) set(ctx context.Context, r *Replica, op *Op, ifVersion string) {
	req, resp := d.api.in(d.api.set), d.api.out(d.api.set)
	val, _ := json.Marshal(op.Value)
	setField(req, "key", []byte(op.Key))
	setField(req, "value", val)
	if ifVersion != "" {
		setField(req, "if_version", ifVersion)
	}
	if !d.call(ctx, r, d.api.set, req, resp, op) {
		return
	}
	if !getBool(resp, "applied") {
		// Only NX/NEX answer "not applied" and this door sends neither; kept as a refusal in
		// case the server ever answers so instead of ABORTED.
		op.Outcome, op.Status, op.Err = Fail, 409, "not applied"
		return
	}
	op.Outcome, op.ETag = OK, getString(resp, "version")
}

// call invokes one unary RPC under grpcTimeout; false when it failed (op's outcome set).
func (d *grpcDoor) call(ctx context.Context, r *Replica, m protoreflect.MethodDescriptor, req, resp any, op *Op) bool {
	c, ok := d.conns[r.ID]
	if !ok {
		op.Outcome, op.Err = Fail, fmt.Sprintf("no gRPC connection to %s", r.ID)
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, grpcTimeout)
	defer cancel()
	err := c.Invoke(cctx, method(m), req, resp)
	if err == nil {
		return true
	}
	op.Outcome, op.Err = grpcOutcome(err)
	redial(c, err)
	if status.Code(err) == codes.Aborted {
		op.Status = 409
	}
	return false
}

// getMany: the snapshot read of the invariant workload (GetMany: every key as of one moment).
// Values are the stored bytes (the transactions write JSON numbers).
func (d *grpcDoor) getMany(ctx context.Context, r *Replica, keys []string) ([]string, []bool, opResult) {
	req, resp := d.api.in(d.api.getMany), d.api.out(d.api.getMany)
	list := req.Mutable(fieldOf(req, "keys")).List()
	for _, k := range keys {
		list.Append(protoreflect.ValueOfBytes([]byte(k)))
	}
	var op Op
	if !d.call(ctx, r, d.api.getMany, req, resp, &op) {
		return nil, nil, opResult{op.Outcome, op.Err}
	}
	items := resp.Get(fieldOf(resp, "items")).List()
	if items.Len() != len(keys) {
		return nil, nil, opResult{Unknown, fmt.Sprintf("GetMany answered %d items for %d keys", items.Len(), len(keys))}
	}
	vals, present := make([]string, len(keys)), make([]bool, len(keys))
	for i := 0; i < items.Len(); i++ {
		it := items.Get(i).Message()
		present[i] = it.Get(it.Descriptor().Fields().ByName("found")).Bool()
		vals[i] = string(it.Get(it.Descriptor().Fields().ByName("value")).Bytes())
	}
	return vals, present, opResult{Outcome: OK}
}
