package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/Azure/iot-operations-sdks/go/protocol"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
)

// KEYNOTIFY watchers: one per replica, each on its own SDK session on that replica's embedded
// broker. KEYNOTIFY names one key (no patterns), so each watcher registers the register
// workload's keys ahead of time: the next epoch's keys as each epoch begins (and the current
// and previous epochs' at every (re)start). A watcher covers a write only if the write was
// invoked after the watcher's first registration of its key had been answered OK.
//
// Registrations belong to the MQTT session (the service drops them when the broker reports
// the client's disconnect), so every new connection (the SDK's connect event) is a break: the
// watcher records a reset, registers every current key again, GETs each (snapshot events),
// and records synced once every key is registered and read, which is the reset/snapshot/synced
// shape check_watch.go knows from SSE. A session the SDK gave up on (a restarted broker has
// no session: SessionLostError) is replaced by a new one, which starts the same way. Between
// breaks nothing is excused: a notification lost while the connection was up is a gap the
// completeness checker reports.
//
// KEYNOTIFY goes through an invoker of our own (the SDK's protocol.CommandInvoker), not the
// state store client's KeyNotify: the client counts KeyNotify calls and, on every reconnect,
// re-registers those keys, GETs them and hands the values to the Notify channels as if they were
// notifications. Those would be indistinguishable from real ones here (a version delivered
// twice, or a change older than one delivered), so the client is left with no registrations
// of its own and the watcher does the same steps itself, recording them as snapshot events.
//
// GET answers and notifications reach us through separate SDK goroutines, so a snapshot's
// GET and a notification of the same key are not ordered among themselves: a GET may return
// v5 while the notification of v4 (applied after the registration, before the GET) is still
// on its way, or after the notification of v6 was handled. Neither is a fault of the service.
// So a snapshot value older than (or equal to) what the watcher already has is not recorded,
// and a newer one is held back until a notification of the key at or above it arrives (the
// notifications below it come first, in order) or the watcher stops; a notification of
// exactly that version then stands for it.

const knWorkloadKeys = regKeysPerEpoch

type knWatcher struct {
	h  *History
	r  *Replica
	wt *watcher

	readers sync.WaitGroup // the per-key notification readers

	mu      sync.Mutex
	regAt   map[string]time.Duration // first registration answered OK, per key
	last    map[string]string        // highest version recorded per key
	pending map[string]string        // snapshot version held back, per key
	conn    int                      // the watcher's connection number (reset count)
}

func startKeyNotifyWatchers(w *Watchers, h *History, cfg Config, replicas []*Replica) {
	for _, r := range replicas {
		kw := &knWatcher{h: h, r: r, regAt: map[string]time.Duration{}, last: map[string]string{}, pending: map[string]string{}}
		w.add("keynotify-"+r.ID, kw.covers, func(ctx context.Context, wt *watcher) {
			// Behind a shared broker a replica's death hands its unsent notifications to
			// another, from its last recorded position: at least once (check_watch.go).
			wt.atLeastOnce = cfg.Broker != ""
			kw.wt = wt
			kw.run(ctx)
		})
	}
}

func (kw *knWatcher) covers(o Op) bool {
	if o.Workload != regWorkload {
		return false
	}
	kw.mu.Lock()
	defer kw.mu.Unlock()
	at, ok := kw.regAt[o.Key]
	return ok && o.Invoke >= at
}

// wantedKeys: the register keys of the previous, current and next epochs (the previous one:
// a write invoked just before the epoch turned may still be on its way).
func wantedKeys(now time.Duration) []string {
	var keys []string
	for d := -1; d <= 1; d++ {
		t := now + time.Duration(d)*regEpoch
		if t < 0 {
			continue
		}
		for i := 0; i < knWorkloadKeys; i++ {
			keys = append(keys, regKey(t, i))
		}
	}
	return keys
}

// knConn is what the watcher knows of one session: its notification channels and which keys
// are registered (and read) since its last connection.
type knConn struct {
	s        *mqttSession
	stops    map[string]func() // Notify channel closers, per key
	conns    int               // the session's connection count last synced for
	reg      map[string]bool   // registered on the current connection
	unsynced map[string]bool   // still to register and read for the open reset
	open     bool              // a reset is open (its synced not recorded yet)
}

func (kw *knWatcher) run(ctx context.Context) {
	var c *knConn
	defer func() {
		if c != nil {
			c.close()
		}
		// Every notification handed over is recorded before the held-back snapshots, so that
		// none of those lands after a notification of its own version.
		kw.readers.Wait()
		kw.flush()
	}()
	for ctx.Err() == nil {
		if c == nil || c.s.isDead() {
			if c != nil {
				kw.note(fmt.Sprintf("session %s lost: %s", c.s.id, c.s.fatalText()))
				c.close()
				c = nil
			}
			s, err := dialMQTT(kw.r, "kn", true)
			if err != nil {
				kw.note("dial: " + err.Error())
				sleepCtx(ctx, 200*time.Millisecond)
				continue
			}
			c = &knConn{s: s, stops: map[string]func(){}, reg: map[string]bool{}}
		}
		_, n := c.s.state()
		if !c.s.isReady() || n == 0 {
			kw.wait(ctx, c, 200*time.Millisecond)
			continue
		}
		if n != c.conns {
			// A new connection: whatever was registered may be gone.
			c.conns = n
			kw.reset()
			c.reg = map[string]bool{}
			c.unsynced = map[string]bool{}
			for _, k := range wantedKeys(kw.h.Now()) {
				c.unsynced[k] = true
			}
			c.open = true
		}
		failed := kw.step(ctx, c)
		if c.open && len(c.unsynced) == 0 {
			kw.record(watchEvent{Kind: "synced"})
			c.open = false
		}
		next := regEpoch - kw.h.Now()%regEpoch
		if failed {
			next = min(next, 200*time.Millisecond)
		}
		kw.wait(ctx, c, next)
	}
}

// step registers every wanted key not yet registered on this connection, and reads those the
// open reset still needs. Reports whether something failed (to be tried again soon).
func (kw *knWatcher) step(ctx context.Context, c *knConn) bool {
	for _, k := range wantedKeys(kw.h.Now()) {
		if ctx.Err() != nil {
			return true
		}
		if !c.reg[k] {
			// The channel first: a notification for a key without one is dropped by the SDK.
			if c.stops[k] == nil {
				ch, stop := c.s.ss.Notify(k)
				c.stops[k] = stop
				kw.readers.Add(1)
				go kw.read(ch)
			}
			if err := keyNotify(ctx, c.s, k); err != nil {
				kw.note(fmt.Sprintf("KEYNOTIFY %s: %v", k, err))
				return true
			}
			c.reg[k] = true
			kw.mu.Lock()
			if _, ok := kw.regAt[k]; !ok {
				kw.regAt[k] = kw.h.Now()
			}
			kw.mu.Unlock()
		}
		if c.unsynced[k] {
			cctx, cancel := context.WithTimeout(ctx, mqttCallTimeout)
			res, err := c.s.ss.Get(cctx, k, statestore.WithTimeout(mqttCallTimeout))
			cancel()
			if err != nil {
				kw.note(fmt.Sprintf("GET %s: %v", k, err))
				return true
			}
			if !res.Version.IsZero() {
				kw.snapshot(k, res.Version.String())
			}
			delete(c.unsynced, k)
		}
	}
	return false
}

// wait sleeps for d, or until the session reports a connection change or ctx ends.
func (kw *knWatcher) wait(ctx context.Context, c *knConn, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-c.s.events:
	}
}

func (c *knConn) close() {
	for _, stop := range c.stops {
		stop()
	}
	c.s.close()
}

func (s *mqttSession) fatalText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fatal == "" {
		return "stopped"
	}
	return s.fatal
}

// keyNotify sends `KEYNOTIFY key` and wants `+OK`.
func keyNotify(ctx context.Context, s *mqttSession, key string) error {
	req := fmt.Appendf(nil, "*2\r\n$9\r\nKEYNOTIFY\r\n$%d\r\n%s\r\n", len(key), key)
	cctx, cancel := context.WithTimeout(ctx, mqttCallTimeout)
	defer cancel()
	res, err := s.kn.Invoke(cctx, req, protocol.WithTimeout(mqttCallTimeout))
	if err != nil {
		return err
	}
	if string(res.Payload) != "+OK\r\n" {
		return errors.New("answer " + fmt.Sprintf("%q", res.Payload))
	}
	return nil
}

// knReorderWindow: how long a notification is held so that one of a lower version of the same
// key, handed over later, can still be recorded before it. The SDK does not keep the arrival
// order: paho hands PUBLISHes over in order, but the session client starts a goroutine per
// message (mqtt@v0.4.2 subscribe.go, makeOnPublishReceived), and WithConcurrency(1) only
// serializes them after that race. Seen without this: two notifications 1.3 ms apart on the
// SSE stream recorded swapped 0.3 ms apart here. A service that sends one key's changes out of
// order by more than this window is still reported by the order checker.
const knReorderWindow = 50 * time.Millisecond

type knHeld struct {
	e  watchEvent
	at time.Time
}

// read records the notifications of one key in version order among those handed over within
// knReorderWindow of each other (see above), otherwise in the order the SDK hands them over.
func (kw *knWatcher) read(ch <-chan statestore.Notify[string, string]) {
	defer kw.readers.Done()
	var held []knHeld // sorted by version
	release := func(all bool) {
		now := time.Now()
		for len(held) > 0 && (all || now.Sub(held[0].at) >= knReorderWindow) {
			kw.change(held[0].e)
			held = held[1:]
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if len(held) > 0 {
			timer.Reset(max(time.Millisecond, knReorderWindow-time.Since(held[0].at)))
		}
		select {
		case n, ok := <-ch:
			if !ok {
				release(true)
				return
			}
			e := kw.event(n)
			i := sort.Search(len(held), func(i int) bool { return held[i].e.Version > e.Version })
			held = slices.Insert(held, i, knHeld{e: e, at: time.Now()})
		case <-timer.C:
		}
		release(false)
	}
}

func (kw *knWatcher) event(n statestore.Notify[string, string]) watchEvent {
	e := watchEvent{Key: n.Key}
	switch n.Operation {
	case "SET":
		e.Kind = "set"
	case "DELETE":
		e.Kind = "delete"
	default:
		e.Kind = "notify-" + n.Operation
	}
	if !n.Version.IsZero() {
		e.Version = n.Version.String()
	} else {
		// Left empty, so the order checker flags it: the protocol requires __ts.
		kw.note(fmt.Sprintf("%s %s without __ts", n.Operation, n.Key))
	}
	return e
}

func (kw *knWatcher) reset() {
	kw.mu.Lock()
	kw.conn = kw.wt.connect()
	kw.mu.Unlock()
	kw.record(watchEvent{Kind: "reset"})
}

// change records a notification, after a held-back snapshot it overtakes (see the top).
func (kw *knWatcher) change(e watchEvent) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if p, ok := kw.pending[e.Key]; ok && e.Version >= p {
		delete(kw.pending, e.Key)
		if e.Version > p {
			kw.recordLocked(watchEvent{Kind: "set", Key: e.Key, Version: p, Snapshot: true})
		}
	}
	kw.recordLocked(e)
}

func (kw *knWatcher) snapshot(key, version string) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if version <= kw.last[key] {
		return
	}
	if p, ok := kw.pending[key]; ok && p < version {
		kw.recordLocked(watchEvent{Kind: "set", Key: key, Version: p, Snapshot: true})
	}
	kw.pending[key] = version
}

// flush records the snapshots still held back (the watcher is stopping).
func (kw *knWatcher) flush() {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	for k, p := range kw.pending {
		kw.recordLocked(watchEvent{Kind: "set", Key: k, Version: p, Snapshot: true})
	}
	kw.pending = map[string]string{}
}

func (kw *knWatcher) record(e watchEvent) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	kw.recordLocked(e)
}

func (kw *knWatcher) recordLocked(e watchEvent) {
	e.At, e.Conn = kw.h.Now(), kw.conn
	if e.Version > kw.last[e.Key] {
		kw.last[e.Key] = e.Version
	}
	kw.wt.record(e)
}

func (kw *knWatcher) note(s string) {
	kw.mu.Lock()
	conn := kw.conn
	kw.mu.Unlock()
	kw.wt.note(kw.h, conn, s)
}
