package faults

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// gRPC Watch watchers: one per replica on every key (no keys, no patterns), the same contract as
// the SSE watcher (workload_watch.go) so that one checker judges both: a snapshot on the first
// open, and after every break (a stream error, an overflow, a replica restarted) a resume with
// since_version = the last resume position (the version of the last change sent outside a
// snapshot, or of the last KIND_SYNCED). A position the replica no longer holds gets KIND_RESET
// and a snapshot, as over SSE.

// startGRPCWatchers adds the watchers to w; they run until w.Stop. Each fetches the service's
// descriptors itself (retrying until a replica answers), so a replica down at the start only
// delays them.
func startGRPCWatchers(w *Watchers, h *History, replicas []*Replica) {
	for _, r := range replicas {
		w.add("grpc-"+r.ID, nil, func(ctx context.Context, wt *watcher) { wt.runGRPC(ctx, h, r, replicas) })
	}
}

func (wt *watcher) runGRPC(ctx context.Context, h *History, r *Replica, replicas []*Replica) {
	c, err := dialGRPC(r.GRPC)
	if err != nil {
		wt.note(h, 0, "dial: "+err.Error())
		return
	}
	defer c.Close()
	// Any replica can describe the service (this one may be down): its own connection first.
	conns := []*grpc.ClientConn{c}
	for _, o := range replicas {
		if o != r {
			if oc, err := dialGRPC(o.GRPC); err == nil {
				conns = append(conns, oc)
			}
		}
	}
	api, err := loadGRPCAPI(ctx, conns)
	for _, oc := range conns[1:] {
		oc.Close()
	}
	if err != nil {
		wt.note(h, 0, err.Error())
		return
	}
	last := ""
	for ctx.Err() == nil {
		conn := wt.connect()
		last = wt.streamGRPC(ctx, h, c, api, conn, last)
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// streamGRPC runs one Watch call and returns the resume position it ends with.
func (wt *watcher) streamGRPC(ctx context.Context, h *History, c *grpc.ClientConn, api *grpcAPI, conn int, last string) string {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := api.in(api.watch)
	if last != "" {
		setField(req, "since_version", last)
	} else {
		setField(req, "snapshot", true)
	}
	st, err := c.NewStream(sctx, &grpc.StreamDesc{ServerStreams: true}, method(api.watch))
	if err == nil {
		err = st.SendMsg(req)
	}
	if err == nil {
		err = st.CloseSend()
	}
	if err != nil {
		wt.note(h, conn, "connect: "+grpcErr(err))
		redial(c, err)
		// grpc-go fails fast while its connection is down; the SSE watcher's pause.
		sleepCtx(ctx, 100*time.Millisecond)
		return last
	}
	for {
		ev := api.out(api.watch)
		if err := st.RecvMsg(ev); err != nil {
			if ctx.Err() == nil {
				wt.streamEnded(h, conn, err)
				redial(c, err)
			}
			return last
		}
		e := watchEvent{At: h.Now(), Conn: conn, Version: getString(ev, "version")}
		switch kind := getEnumName(ev, "kind"); kind {
		case "KIND_SET", "KIND_DELETE", "KIND_EXPIRE":
			e.Kind = "set"
			if kind != "KIND_SET" {
				e.Kind = "delete"
			}
			if kind == "KIND_EXPIRE" {
				e.Reason = "expired"
			}
			e.Key, e.Snapshot = string(getBytes(ev, "key")), getBool(ev, "snapshot")
			if !e.Snapshot {
				last = e.Version
			}
		case "KIND_RESET":
			e.Kind = "reset"
		case "KIND_SYNCED":
			e.Kind = "synced"
			if e.Version != "" {
				last = e.Version
			}
		case "KIND_OVERFLOW":
			// The server ends the stream after it; the next Recv says so.
			e.Kind = "overflow"
		default:
			e.Kind = strings.ToLower(strings.TrimPrefix(kind, "KIND_"))
		}
		wt.record(e)
	}
}

// streamEnded notes why a stream ended. A status the server chose (the engine's watch failed:
// the storage is unavailable, a storage failure) is recorded as a "failed" event, as the SSE
// door sends one; a dropped connection only as a note.
func (wt *watcher) streamEnded(h *History, conn int, err error) {
	if errors.Is(err, io.EOF) {
		wt.note(h, conn, "stream: ended by the server")
		return
	}
	wt.note(h, conn, "stream: "+grpcErr(err))
	st, _ := status.FromError(err)
	switch {
	case st.Code() == codes.Unavailable && !strings.Contains(st.Message(), "storage"):
	case st.Code() == codes.Canceled, st.Code() == codes.DeadlineExceeded:
	default:
		wt.record(watchEvent{Kind: "failed", At: h.Now(), Conn: conn})
	}
}

func grpcErr(err error) string {
	st, _ := status.FromError(err)
	return st.Code().String() + ": " + st.Message()
}
