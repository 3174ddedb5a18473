package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Watchers: one server-sent-events watcher per replica on every key (pattern *), opened with a
// snapshot and resumed after every break with Last-Event-ID, as docs/watching.md describes.
// Checked after the run: per key, versions strictly increase outside snapshots, no change is
// delivered twice, and every acknowledged ack-* write reaches every watcher (as a change or in
// the snapshot that follows a reset: ack keys are written once and never deleted, so a snapshot
// must show them).

type watchEvent struct {
	Kind     string        `json:"kind"` // set, delete, reset, synced, overflow, failed, shutdown...
	Key      string        `json:"key,omitempty"`
	Version  string        `json:"version,omitempty"`
	Snapshot bool          `json:"snapshot,omitempty"`
	Reason   string        `json:"reason,omitempty"` // delete: "expired" when the expiry driver removed it
	At       time.Duration `json:"at_ns"`
	Conn     int           `json:"conn"` // which connection (reconnects count up)
}

// watcher is one watch stream's record, whatever its door: SSE (here), gRPC Watch
// (watch_grpc.go) or KEYNOTIFY (watch_keynotify.go). Each door's reader turns what it receives
// into watchEvents: changes, and around every (re)start a reset, the snapshot, and synced.
type watcher struct {
	name string // door-replica, e.g. sse-n1
	// covers says whether this watcher must deliver an acknowledged write (nil: every write).
	// A KEYNOTIFY watcher observes named keys only, from the moment each was registered.
	covers func(Op) bool
	// atLeastOnce: a change may come again with the version it came with (a redelivery), which
	// a client drops by version; counted, not a violation. Anything else out of order still is.
	atLeastOnce bool
	mu          sync.Mutex
	events      []watchEvent
	conns       int
	errs        []string
}

type Watchers struct {
	ctx  context.Context // ends at Stop, after the workloads
	mu   sync.Mutex
	ws   []*watcher
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// add registers a watcher and runs it until Stop.
func (w *Watchers) add(name string, covers func(Op) bool, run func(ctx context.Context, wt *watcher)) {
	wt := &watcher{name: name, covers: covers}
	w.mu.Lock()
	w.ws = append(w.ws, wt)
	w.mu.Unlock()
	w.wg.Add(1)
	go func() { defer w.wg.Done(); run(w.ctx, wt) }()
}

// connect counts a new connection of the watcher and returns its number.
func (wt *watcher) connect() int {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	wt.conns++
	return wt.conns
}

// record appends an event (its At set by the caller from the history's clock).
func (wt *watcher) record(e watchEvent) {
	wt.mu.Lock()
	wt.events = append(wt.events, e)
	wt.mu.Unlock()
}

// startWatchers starts the watchers. They outlive the workloads' ctx: Stop ends them, after the
// last acknowledged writes had time to arrive.
func startWatchers(_ context.Context, cfg Config, h *History, cl *Client, _ *sync.WaitGroup) *Watchers {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watchers{ctx: ctx, stop: cancel}
	// No client timeout: a stream lives as long as the run; a dead replica breaks it with a reset
	// connection, a paused one only delays it.
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	for _, r := range cl.replicas {
		w.add("sse-"+r.ID, nil, func(ctx context.Context, wt *watcher) { wt.runSSE(ctx, h, hc, r) })
	}
	return w
}

func (w *Watchers) Stop() {
	w.stop()
	w.wg.Wait()
}

func (wt *watcher) runSSE(ctx context.Context, h *History, hc *http.Client, r *Replica) {
	last := ""
	for ctx.Err() == nil {
		conn := wt.connect()
		url := r.HTTP + "/v1.0-alpha1/state/statestore/subscribe?pattern=*"
		if last == "" {
			url += "&snapshot=true"
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if last != "" {
			req.Header.Set("Last-Event-ID", last)
		}
		resp, err := hc.Do(req)
		if err != nil {
			wt.note(h, conn, "connect: "+shortErr(err).Error())
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		if resp.StatusCode != 200 {
			wt.note(h, conn, fmt.Sprintf("connect: http %d", resp.StatusCode))
			resp.Body.Close()
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		last = wt.read(ctx, h, conn, resp, last)
		resp.Body.Close()
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

func (wt *watcher) note(h *History, conn int, s string) {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if len(wt.errs) < 200 {
		wt.errs = append(wt.errs, fmt.Sprintf("%.3fs conn %d: %s", h.Now().Seconds(), conn, s))
	}
}

// read consumes one stream and returns the resume position (the last non-empty event id).
func (wt *watcher) read(ctx context.Context, h *History, conn int, resp *http.Response, last string) string {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var kind, data, id string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if kind != "" || data != "" {
				wt.event(h, conn, kind, data)
				if id != "" {
					last = id
				}
			}
			kind, data, id = "", "", ""
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			kind = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			data += strings.TrimPrefix(line[5:], " ")
		case strings.HasPrefix(line, "id:"):
			id = strings.TrimSpace(line[3:])
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		wt.note(h, conn, "stream: "+shortErr(err).Error())
	}
	return last
}

func (wt *watcher) event(h *History, conn int, kind, data string) {
	if kind == "" {
		kind = "message"
	}
	e := watchEvent{Kind: kind, At: h.Now(), Conn: conn}
	var d struct {
		Key      string `json:"key"`
		ETag     string `json:"etag"`
		Snapshot bool   `json:"snapshot"`
		Reason   string `json:"reason"`
	}
	if (kind == "set" || kind == "delete") && json.Unmarshal([]byte(data), &d) == nil {
		e.Key, e.Version, e.Snapshot, e.Reason = d.Key, d.ETag, d.Snapshot, d.Reason
	}
	wt.record(e)
}
