package aio

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/protocol/hlc"
	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
	sserrors "github.com/Azure/iot-operations-sdks/go/services/statestore/errors"
)

// A lease handed over between two Go clients (A, B) and the Rust SDK client the Rust test
// holds, in turn: A -> B -> Rust -> A, then B edits the protected key under the Go SDK's lock.
// Each holder writes the protected key with its fencing token; tokens grow at every handover
// and a stale holder's write is refused. The two processes take turns through lines:
//
//	Go:   held-by <A id> <token A>        Rust: release  (it saw A hold it and was refused)
//	Go:   held-by <B id> <token B>        Rust: release
//	Go:   released                        Rust: held-by-rust <token R> (and wrote the key)
//	Go:   waiting (A observes, refused)   Rust releases: A gets the DELETE and acquires
//	Go:   done <final value>
func TestLeaseHandover(t *testing.T) {
	name, resource := os.Getenv("STATEGATE_LEASE"), os.Getenv("STATEGATE_RESOURCE")
	if name == "" || resource == "" {
		t.Fatal("STATEGATE_LEASE and STATEGATE_RESOURCE are not set: run by tests/it/aio_go.rs")
	}
	h := newHandshake()
	a, b := connect(t, "lease-a"), connect(t, "lease-b")
	la, lb := leasedlock.NewLease(a.ss, name), leasedlock.NewLease(b.ss, name)
	ttl := time.Minute

	// B watches the lease from the start.
	changesB := watchLease(t, lb)
	if ok, err := la.Acquire(bounded(t), ttl); err != nil || !ok {
		t.Fatalf("A acquires a free lease: %v %v", ok, err)
	}
	tokA := token(t, la)
	expectChange(t, changesB, true, a.id, "A acquired")
	if ok, err := lb.Acquire(bounded(t), ttl); err != nil || ok {
		t.Fatalf("B acquires the lease A holds: %v %v", ok, err)
	}
	if holder, held, err := lb.Holder(bounded(t)); err != nil || !held || holder != a.id {
		t.Fatalf("holder seen by B: %q held=%v %v", holder, held, err)
	}
	h.say("held-by %s %s", a.id, tokA)
	expectLine(t, h, "release")

	if err := la.Release(bounded(t)); err != nil {
		t.Fatalf("A releases: %v", err)
	}
	expectChange(t, changesB, false, "", "A released")
	if ok, err := lb.Acquire(bounded(t), ttl); err != nil || !ok {
		t.Fatalf("B acquires after A released: %v %v", ok, err)
	}
	tokB := token(t, lb)
	later(t, tokB, tokA, "B's token")
	expectChange(t, changesB, true, b.id, "B acquired")
	b.setOK(t, resource, "by-b", statestore.WithFencingToken(tokB))
	h.say("held-by %s %s", b.id, tokB)
	expectLine(t, h, "release")

	if err := lb.Release(bounded(t)); err != nil {
		t.Fatalf("B releases: %v", err)
	}
	h.say("released")
	line := h.hear(t, "held-by-rust <token>")
	rest, ok := strings.CutPrefix(line, "held-by-rust ")
	if !ok {
		t.Fatalf("expected held-by-rust <token>, got %q", line)
	}
	tokR := parseHLC(t, rest)
	later(t, tokR, tokB, "the Rust client's token")
	if got := a.get(t, resource); got.Value != "by-rust" {
		t.Fatalf("the Rust holder's write: %q", got.Value)
	}
	// B's token is stale now; a write without a token is refused too.
	_, err := b.ss.Set(bounded(t), resource, "stale", statestore.WithFencingToken(tokB))
	serviceError(t, err, sserrors.FencingTokenLowerVersion, "B writes with its old token")
	_, err = a.ss.Set(bounded(t), resource, "blind")
	serviceError(t, err, sserrors.MissingFencingToken, "A writes without a token")

	// A waits for the lease the way the SDK's lock does: observe, try, wait for the DELETE.
	changesA := watchLease(t, la)
	if ok, err := la.Acquire(bounded(t), ttl); err != nil || ok {
		t.Fatalf("A acquires the lease the Rust client holds: %v %v", ok, err)
	}
	h.say("waiting")
	expectChange(t, changesA, false, "", "the Rust client released")
	if ok, err := la.Acquire(bounded(t), ttl); err != nil || !ok {
		t.Fatalf("A acquires after the Rust client released: %v %v", ok, err)
	}
	tokA2 := token(t, la)
	later(t, tokA2, tokR, "A's second token")
	a.setOK(t, resource, "by-a", statestore.WithFencingToken(tokA2))
	if err := la.Release(bounded(t)); err != nil {
		t.Fatalf("A releases: %v", err)
	}

	// B edits the key under the SDK's lock (lock, GET, fenced SET, unlock).
	lock := leasedlock.NewLock(b.ss, name)
	err = lock.Edit(bounded(t), resource, ttl, func(_ context.Context, value string, present bool) (string, bool, error) {
		if !present {
			t.Errorf("the protected key is absent under the lock")
		}
		return value + "+b", true, nil
	})
	if err != nil {
		t.Fatalf("B edits under the lock: %v", err)
	}
	if holder, held, err := lb.Holder(bounded(t)); err != nil || held {
		t.Fatalf("after the edit the lock is held by %q (%v)", holder, err)
	}
	final := b.get(t, resource).Value
	h.say("done %s", final)
}

// watchLease starts observing a lease and collects its changes (see watcher: the SDK's channel
// must always be read).
func watchLease(t *testing.T, l *leasedlock.Lease[string, string]) chan leasedlock.Change {
	t.Helper()
	changes, stop := l.Observe()
	t.Cleanup(stop)
	got := make(chan leasedlock.Change, 64)
	go func() {
		for c := range changes {
			got <- c
		}
	}()
	if err := l.ObserveStart(bounded(t)); err != nil {
		t.Fatalf("observe the lease: %v", err)
	}
	return got
}

func expectChange(t *testing.T, changes chan leasedlock.Change, held bool, holder, what string) {
	t.Helper()
	select {
	case c := <-changes:
		if c.Held != held || c.Holder != holder {
			t.Fatalf("%s: the lease changed to held=%v by %q, want held=%v by %q", what, c.Held, c.Holder, held, holder)
		}
	case <-time.After(wait):
		t.Fatalf("%s: no lease change within %v", what, wait)
	}
}

func token(t *testing.T, l *leasedlock.Lease[string, string]) hlc.HybridLogicalClock {
	t.Helper()
	tok, err := l.Token(bounded(t))
	if err != nil || tok.IsZero() {
		t.Fatalf("the lease's token: %s %v", tok, err)
	}
	return tok
}

func expectLine(t *testing.T, h *handshake, want string) {
	t.Helper()
	if got := h.hear(t, want); got != want {
		t.Fatalf("expected %q from the Rust side, got %q", want, got)
	}
}
