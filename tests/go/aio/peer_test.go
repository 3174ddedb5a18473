// Package aio runs the published Azure IoT Operations Go SDK (statestore and leasedlock)
// against a stategate the Rust integration tests started (tests/it/aio_go.rs). It is not a
// standalone suite: the Rust side passes the broker's port and what to expect in environment
// variables, and drives the lease handover through stdin/stdout lines.
//
// Every wait is bounded: each SDK call gets a context with a deadline, and every notification
// or handshake line is awaited with a timeout. Nothing sleeps.
package aio

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/mqtt"
	"github.com/Azure/iot-operations-sdks/go/protocol"
	"github.com/Azure/iot-operations-sdks/go/protocol/hlc"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
	sserrors "github.com/Azure/iot-operations-sdks/go/services/statestore/errors"
)

const (
	// The broker's MQTT port (plain TCP on 127.0.0.1).
	envPort = "STATEGATE_MQTT_PORT"
	// Shorter than the Rust side's bound on the whole process, so a lost answer is reported
	// here, by the step that waited for it.
	wait = 10 * time.Second
	// The prefix of every line meant for the Rust side (see handshake below).
	linePrefix = "STATEGATE "
)

// One application (one HLC) for every client of the process, as the SDK's samples do.
var app = func() *protocol.Application {
	a, err := protocol.NewApplication()
	if err != nil {
		panic(err)
	}
	return a
}()

// Every client id is unique per process and per call, so that concurrent runs against one
// broker never share a session.
var clientSeq struct {
	sync.Mutex
	n int
}

func clientID(name string) string {
	clientSeq.Lock()
	defer clientSeq.Unlock()
	clientSeq.n++
	return fmt.Sprintf("go-%s-%d-%d", name, os.Getpid(), clientSeq.n)
}

func brokerPort(t *testing.T) uint16 {
	t.Helper()
	raw := os.Getenv(envPort)
	if raw == "" {
		t.Fatalf("%s is not set: this test is run by the Rust integration tests (cargo test --test it -- aio_go)", envPort)
	}
	port, err := strconv.ParseUint(raw, 10, 16)
	if err != nil {
		t.Fatalf("%s=%q is not a port: %v", envPort, raw, err)
	}
	return uint16(port)
}

// bounded is a context for one SDK call.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// peer is one SDK client: an MQTT session client and the state store client on it.
type peer struct {
	id   string
	mqtt *mqtt.SessionClient
	ss   *statestore.Client[string, string]
}

func connect(t *testing.T, name string) *peer {
	t.Helper()
	id := clientID(name)
	mc, err := mqtt.NewSessionClient(id, mqtt.TCPConnection("127.0.0.1", brokerPort(t)))
	if err != nil {
		t.Fatalf("session client %s: %v", id, err)
	}
	// One notification handler at a time: with the default (a goroutine per message) two
	// notifications of one key can reach the channel out of order.
	ss, err := statestore.New[string, string](app, mc, statestore.WithConcurrency(1))
	if err != nil {
		t.Fatalf("state store client %s: %v", id, err)
	}
	if err := mc.Start(); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	// Subscribes to the response topic, which waits for the first CONNACK and the SUBACK.
	if err := ss.Start(bounded(t)); err != nil {
		t.Fatalf("state store client %s did not start: %v", id, err)
	}
	t.Cleanup(func() {
		ss.Close()
		_ = mc.Stop()
	})
	return &peer{id: id, mqtt: mc, ss: ss}
}

func (p *peer) set(t *testing.T, key, value string, opts ...statestore.SetOption) *statestore.Response[bool] {
	t.Helper()
	r, err := p.ss.Set(bounded(t), key, value, opts...)
	if err != nil {
		t.Fatalf("SET %q by %s: %v", short(key), p.id, err)
	}
	return r
}

// setOK is an unconditional SET that must be applied; it returns the new version.
func (p *peer) setOK(t *testing.T, key, value string, opts ...statestore.SetOption) hlc.HybridLogicalClock {
	t.Helper()
	r := p.set(t, key, value, opts...)
	if !r.Value {
		t.Fatalf("SET %q was not applied", short(key))
	}
	if r.Version.IsZero() {
		t.Fatalf("an applied SET of %q came without its version (__ts)", short(key))
	}
	return r.Version
}

func (p *peer) get(t *testing.T, key string) *statestore.Response[string] {
	t.Helper()
	r, err := p.ss.Get(bounded(t), key)
	if err != nil {
		t.Fatalf("GET %q by %s: %v", short(key), p.id, err)
	}
	return r
}

func (p *peer) del(t *testing.T, key string, opts ...statestore.DelOption) int {
	t.Helper()
	r, err := p.ss.Del(bounded(t), key, opts...)
	if err != nil {
		t.Fatalf("DEL %q by %s: %v", short(key), p.id, err)
	}
	return r.Value
}

func (p *peer) vdel(t *testing.T, key, value string, opts ...statestore.VDelOption) int {
	t.Helper()
	r, err := p.ss.VDel(bounded(t), key, value, opts...)
	if err != nil {
		t.Fatalf("VDEL %q by %s: %v", short(key), p.id, err)
	}
	return r.Value
}

// watcher collects the notifications of one key. The SDK hands them over on a channel with
// a buffer of one, and its single handler waits on that channel: a test that did not read
// would stall the client's message loop (and with it the answers it waits for). So a
// goroutine moves every notification into a large buffer at once.
type watcher struct {
	key string
	got chan statestore.Notify[string, string]
}

// observe registers KEYNOTIFY for key and starts collecting its notifications.
func (p *peer) observe(t *testing.T, key string) *watcher {
	t.Helper()
	kn, stop := p.ss.Notify(key)
	t.Cleanup(stop)
	w := &watcher{key: key, got: make(chan statestore.Notify[string, string], 1024)}
	go func() {
		for n := range kn {
			w.got <- n
		}
	}()
	if err := p.ss.KeyNotify(bounded(t), key); err != nil {
		t.Fatalf("KEYNOTIFY %q by %s: %v", short(key), p.id, err)
	}
	return w
}

func (w *watcher) next(t *testing.T, what string) statestore.Notify[string, string] {
	t.Helper()
	select {
	case n := <-w.got:
		if n.Key != w.key {
			t.Fatalf("a notification for %q reached the watcher of %q", short(n.Key), short(w.key))
		}
		return n
	case <-time.After(wait):
		t.Fatalf("no notification (%s) for %q within %v", what, short(w.key), wait)
	}
	panic("unreachable")
}

// expectSet checks the next notification is a SET of value carrying version (__ts).
func (w *watcher) expectSet(t *testing.T, value string, version hlc.HybridLogicalClock) {
	t.Helper()
	n := w.next(t, "SET "+short(value))
	if n.Operation != "SET" || n.Value != value {
		t.Fatalf("expected SET %q, got %s %q", short(value), n.Operation, short(n.Value))
	}
	if n.Version.String() != version.String() {
		t.Fatalf("the SET notification carries __ts %s, the SET answered %s", n.Version, version)
	}
}

// expectDelete checks the next notification is a DELETE with a version later than after.
func (w *watcher) expectDelete(t *testing.T, what string, after hlc.HybridLogicalClock) hlc.HybridLogicalClock {
	t.Helper()
	n := w.next(t, what)
	if n.Operation != "DELETE" || n.Value != "" {
		t.Fatalf("expected DELETE (%s), got %s %q", what, n.Operation, short(n.Value))
	}
	if n.Version.IsZero() {
		t.Fatalf("the DELETE notification (%s) came without __ts", what)
	}
	later(t, n.Version, after, "the DELETE notification's version")
	return n.Version
}

// later fails unless a is strictly after b in HLC order.
func later(t *testing.T, a, b hlc.HybridLogicalClock, what string) {
	t.Helper()
	if a.Compare(b) <= 0 {
		t.Fatalf("%s %s is not later than %s", what, a, b)
	}
}

// serviceError fails unless err is the state store's error want.
func serviceError(t *testing.T, err error, want sserrors.Service, what string) {
	t.Helper()
	var got sserrors.Service
	if !errors.As(err, &got) {
		t.Fatalf("%s: expected the service error %q, got %v", what, string(want), err)
	}
	if got != want {
		t.Fatalf("%s: expected the service error %q, got %q", what, string(want), string(got))
	}
}

// parseHLC reads an HLC in its wire form (a version another client printed).
func parseHLC(t *testing.T, s string) hlc.HybridLogicalClock {
	t.Helper()
	v, err := hlc.New().Parse("hlc", s)
	if err != nil {
		t.Fatalf("%q is not an HLC: %v", s, err)
	}
	return v
}

// short keeps long keys and values readable in failure messages.
func short(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%s...(%d bytes)", s[:32], len(s))
	}
	return s
}

// handshake talks to the Rust test that runs this process: say writes a line it waits for,
// hear waits (bounded) for the next line it writes to our stdin.
type handshake struct {
	lines chan string
}

func newHandshake() *handshake {
	h := &handshake{lines: make(chan string, 16)}
	go func() {
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
			h.lines <- scanner.Text()
		}
		close(h.lines)
	}()
	return h
}

func (h *handshake) say(format string, args ...any) {
	// Straight to stdout (unbuffered), not t.Log: the Rust side reads it as it comes.
	fmt.Printf(linePrefix+format+"\n", args...)
}

func (h *handshake) hear(t *testing.T, what string) string {
	t.Helper()
	select {
	case line, ok := <-h.lines:
		if !ok {
			t.Fatalf("stdin closed while waiting for %s", what)
		}
		return line
	case <-time.After(wait):
		t.Fatalf("the Rust side did not say %s within %v", what, wait)
	}
	panic("unreachable")
}
