package aio

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/protocol"
	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
	sserrors "github.com/Azure/iot-operations-sdks/go/services/statestore/errors"
)

// SET, GET, DEL and VDEL with fencing tokens taken from a lease, the way the SDK's lock uses
// them: the token is checked before the value, a lower token is refused, a deleted key loses
// its token, and versions only grow.
func TestFencing(t *testing.T) {
	c := connect(t, "fencing")
	key := clientID("fenced")

	v1 := c.setOK(t, key, "v1")
	got := c.get(t, key)
	if got.Value != "v1" || got.Version.String() != v1.String() {
		t.Fatalf("GET after SET: %q at %s, want v1 at %s", got.Value, got.Version, v1)
	}

	lease := leasedlock.NewLease(c.ss, clientID("fence-lease"))
	if ok, err := lease.Acquire(bounded(t), time.Minute); err != nil || !ok {
		t.Fatalf("acquire the lease: %v %v", ok, err)
	}
	tok1, err := lease.Token(bounded(t))
	if err != nil {
		t.Fatalf("lease token: %v", err)
	}
	later(t, tok1, v1, "the lease's token")

	v2 := c.setOK(t, key, "v2", statestore.WithFencingToken(tok1))
	later(t, v2, v1, "the fenced SET's version")

	// The key is protected now.
	_, err = c.ss.Set(bounded(t), key, "v3")
	serviceError(t, err, sserrors.MissingFencingToken, "SET without a token")
	_, err = c.ss.Set(bounded(t), key, "v3", statestore.WithFencingToken(v1))
	serviceError(t, err, sserrors.FencingTokenLowerVersion, "SET with a lower token")
	_, err = c.ss.Del(bounded(t), key)
	serviceError(t, err, sserrors.MissingFencingToken, "DEL without a token")
	_, err = c.ss.Del(bounded(t), key, statestore.WithFencingToken(v1))
	serviceError(t, err, sserrors.FencingTokenLowerVersion, "DEL with a lower token")
	// The token is checked before the value: a lower token with a wrong value is the token error.
	_, err = c.ss.VDel(bounded(t), key, "wrong", statestore.WithFencingToken(v1))
	serviceError(t, err, sserrors.FencingTokenLowerVersion, "VDEL with a lower token")
	if n := c.vdel(t, key, "wrong", statestore.WithFencingToken(tok1)); n != -1 {
		t.Fatalf("VDEL of another value with the right token: %d, want -1", n)
	}
	if got := c.get(t, key); got.Value != "v2" || got.Version.String() != v2.String() {
		t.Fatalf("refused writes changed the key: %q at %s", got.Value, got.Version)
	}

	// A renewed lease has a later token; the key keeps the highest token it saw.
	if ok, err := lease.Acquire(bounded(t), time.Minute); err != nil || !ok {
		t.Fatalf("renew the lease: %v %v", ok, err)
	}
	tok2, err := lease.Token(bounded(t))
	if err != nil {
		t.Fatalf("lease token: %v", err)
	}
	later(t, tok2, tok1, "the renewed token")
	v4 := c.setOK(t, key, "v4", statestore.WithFencingToken(tok2))
	_, err = c.ss.Set(bounded(t), key, "v5", statestore.WithFencingToken(tok1))
	serviceError(t, err, sserrors.FencingTokenLowerVersion, "SET with the token before the renewal")

	// NX on a present key is not applied and answers the stored version; NEX with the same
	// value is applied with a new version.
	r := c.set(t, key, "other", statestore.NotExists, statestore.WithFencingToken(tok2))
	if r.Value || r.Version.String() != v4.String() {
		t.Fatalf("SET NX on a present key: applied=%v version %s, want false at %s", r.Value, r.Version, v4)
	}
	r = c.set(t, key, "v4", statestore.NotExistsOrEqual, statestore.WithFencingToken(tok2))
	if !r.Value {
		t.Fatal("SET NEX with the stored value was not applied")
	}
	later(t, r.Version, v4, "the NEX renewal's version")

	if n := c.vdel(t, key, "v4", statestore.WithFencingToken(tok2)); n != 1 {
		t.Fatalf("VDEL with the stored value and the token: %d, want 1", n)
	}
	if got := c.get(t, key); !got.Version.IsZero() || got.Value != "" {
		t.Fatalf("GET after VDEL: %q at %s, want a miss", got.Value, got.Version)
	}
	if n := c.del(t, key); n != 0 {
		t.Fatalf("DEL of an absent key: %d, want 0", n)
	}
	// The deleted key lost its token: no token is needed any more.
	c.setOK(t, key, "fresh")
	if n := c.del(t, key); n != 1 {
		t.Fatalf("DEL of an unprotected key: %d, want 1", n)
	}
	if err := lease.Release(bounded(t)); err != nil {
		t.Fatalf("release: %v", err)
	}
	if holder, held, err := lease.Holder(bounded(t)); err != nil || held {
		t.Fatalf("after release the lease is held by %q (%v)", holder, err)
	}
}

// KEYNOTIFY: another client's SET, DEL, VDEL and an expiry (a short PX) each reach the
// observer, in order, with the change's version (__ts). The expiry's DELETE is awaited, not
// slept for.
func TestKeyNotify(t *testing.T) {
	observer := connect(t, "observer")
	writer := connect(t, "writer")
	key := clientID("observed")
	w := observer.observe(t, key)

	v1 := writer.setOK(t, key, "one")
	w.expectSet(t, "one", v1)
	if n := writer.del(t, key); n != 1 {
		t.Fatalf("DEL: %d", n)
	}
	d1 := w.expectDelete(t, "DEL", v1)

	v2 := writer.setOK(t, key, "short-lived", statestore.WithExpiry(300*time.Millisecond))
	later(t, v2, d1, "the SET after the DEL")
	w.expectSet(t, "short-lived", v2)
	w.expectDelete(t, "the key's expiry", v2)
	if got := writer.get(t, key); !got.Version.IsZero() {
		t.Fatalf("the expired key is still served: %q at %s", got.Value, got.Version)
	}

	v3 := writer.setOK(t, key, "three")
	w.expectSet(t, "three", v3)
	if n := writer.vdel(t, key, "not-three"); n != -1 {
		t.Fatalf("VDEL of another value: %d", n)
	}
	if n := writer.vdel(t, key, "three"); n != 1 {
		t.Fatalf("VDEL: %d", n)
	}
	// The VDEL that did not apply sent nothing: the next notification is the one that did.
	w.expectDelete(t, "VDEL", v3)

	// The observer's own write is notified too.
	v4 := observer.setOK(t, key, "mine")
	w.expectSet(t, "mine", v4)
	if err := observer.ss.KeyNotifyStop(bounded(t), key); err != nil {
		t.Fatalf("KEYNOTIFY STOP: %v", err)
	}
	writer.del(t, key)
}

// What the Go and .NET SDK tests check and the Rust ones do not: a 6,500-byte key with a
// 65,000-byte value, an empty key refused (by the SDK before sending, and by the service when
// a raw request carries one), a fencing token 10 years ahead refused as clock skew.
func TestSdkLimits(t *testing.T) {
	c := connect(t, "limits")

	key := clientID("long") + strings.Repeat("k", 6500)
	key = key[:6500]
	value := strings.Repeat("0123456789", 6500)
	v := c.setOK(t, key, value)
	got := c.get(t, key)
	if got.Value != value || got.Version.String() != v.String() {
		t.Fatalf("GET of the 6,500-byte key: %d bytes at %s, want %d at %s", len(got.Value), got.Version, len(value), v)
	}
	if n := c.del(t, key); n != 1 {
		t.Fatalf("DEL of the 6,500-byte key: %d", n)
	}

	if _, err := c.ss.Get(bounded(t), ""); !errors.Is(err, statestore.ErrArgument) {
		t.Fatalf("GET of an empty key: %v, want the SDK's argument error", err)
	}
	// The SDK never sends an empty key, so send one the way it sends everything else: the
	// same command invoker, raw payloads.
	raw := rawInvoker(t, c)
	for _, req := range []string{
		"*2\r\n$3\r\nGET\r\n$0\r\n\r\n",
		"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$1\r\nv\r\n",
	} {
		res, err := raw.Invoke(bounded(t), []byte(req))
		if err != nil {
			t.Fatalf("raw %q: %v", req, err)
		}
		if want := "-ERR the key length is zero\r\n"; string(res.Payload) != want {
			t.Fatalf("raw %q answered %q, want %q", req, res.Payload, want)
		}
	}

	future := time.Now().AddDate(10, 0, 0).UnixMilli()
	ahead := parseHLC(t, fmt.Sprintf("%015d:%05d:%s", future, 0, "go-future"))
	skewKey := clientID("skew")
	_, err := c.ss.Set(bounded(t), skewKey, "v", statestore.WithFencingToken(ahead))
	serviceError(t, err, sserrors.FencingTokenSkew, "SET with a token 10 years ahead")
	if got := c.get(t, skewKey); !got.Version.IsZero() {
		t.Fatalf("the refused SET stored the key (%q at %s)", got.Value, got.Version)
	}
	c.setOK(t, skewKey, "v")
	_, err = c.ss.Del(bounded(t), skewKey, statestore.WithFencingToken(ahead))
	serviceError(t, err, sserrors.FencingTokenSkew, "DEL with a token 10 years ahead")
	_, err = c.ss.VDel(bounded(t), skewKey, "v", statestore.WithFencingToken(ahead))
	serviceError(t, err, sserrors.FencingTokenSkew, "VDEL with a token 10 years ahead")
	if n := c.del(t, skewKey); n != 1 {
		t.Fatalf("the refused deletes removed the key (DEL answered %d)", n)
	}
}

// rawInvoker is a command invoker on the state store's topic, with payloads as bytes, on its
// own response topic beside the client's.
func rawInvoker(t *testing.T, c *peer) *protocol.CommandInvoker[[]byte, []byte] {
	t.Helper()
	inv, err := protocol.NewCommandInvoker(
		app, c.mqtt, protocol.Raw{}, protocol.Raw{},
		"statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",
		protocol.WithResponseTopicPrefix("clients/"+c.id),
		protocol.WithResponseTopicSuffix("raw"),
	)
	if err != nil {
		t.Fatalf("raw invoker: %v", err)
	}
	t.Cleanup(inv.Close)
	if err := inv.Start(bounded(t)); err != nil {
		t.Fatalf("raw invoker start: %v", err)
	}
	return inv
}

// A SET with the SDK's persistence option (user property aio-persistence: true). The Rust side
// says what this service's storage does with it: "accepted" (durable, Redis: every key
// persists) or the exact refusal text (memory: nothing persists, and the SET changes nothing).
func TestPersistence(t *testing.T) {
	expect := os.Getenv("STATEGATE_EXPECT_PERSISTENCE")
	if expect == "" {
		t.Fatal("STATEGATE_EXPECT_PERSISTENCE is not set: run by tests/it/aio_go.rs")
	}
	c := connect(t, "persist")
	key := clientID("persisted")
	v1 := c.setOK(t, key, "plain")

	r, err := c.ss.Set(bounded(t), key, "durable", statestore.WithPersist(true))
	absent := clientID("persisted-absent")
	_, errAbsent := c.ss.Set(bounded(t), absent, "x", statestore.NotExists, statestore.WithPersist(true))
	if expect == "accepted" {
		if err != nil || !r.Value {
			t.Fatalf("SET with persistence on a persistent store: %v", err)
		}
		later(t, r.Version, v1, "the persisted SET's version")
		if got := c.get(t, key); got.Value != "durable" {
			t.Fatalf("GET after the persisted SET: %q", got.Value)
		}
		if errAbsent != nil {
			t.Fatalf("SET NX with persistence: %v", errAbsent)
		}
		if got := c.get(t, absent); got.Value != "x" {
			t.Fatalf("GET after the persisted SET NX: %q", got.Value)
		}
		return
	}
	serviceError(t, err, sserrors.Service(expect), "SET with persistence on memory storage")
	serviceError(t, errAbsent, sserrors.Service(expect), "SET NX with persistence on memory storage")
	if got := c.get(t, key); got.Value != "plain" || got.Version.String() != v1.String() {
		t.Fatalf("the refused SET changed the key: %q at %s, want plain at %s", got.Value, got.Version, v1)
	}
	if got := c.get(t, absent); !got.Version.IsZero() {
		t.Fatalf("the refused SET NX created the key: %q", got.Value)
	}
	// Without the option the same SET works: only the promise is refused.
	c.setOK(t, key, "volatile")
}
