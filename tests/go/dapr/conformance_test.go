// Dapr's own state store conformance suite (components-contrib tests/conformance/state) run
// against stategate's pluggable component socket through daprd's own gRPC adapter for pluggable
// state stores, so every call takes the path a real daprd takes.
//
// The Rust integration test (tests/it/daprd_conformance.rs) starts stategate, then runs this
// compiled test binary with:
//
//	STATEGATE_COMPONENT_SOCKET  the Unix socket stategate serves the component API on
//	STATEGATE_CONFORMANCE_OPS   comma-separated operations to turn on (the suite's names)
//
// and reads every subtest's verdict from `-test.v` output.
package dapr_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dapr/components-contrib/state"
	conformance "github.com/dapr/components-contrib/tests/conformance/state"
	pluggable "github.com/dapr/dapr/pkg/components/state"
	"github.com/dapr/kit/logger"
)

func TestConformance(t *testing.T) {
	socket := os.Getenv("STATEGATE_COMPONENT_SOCKET")
	if socket == "" {
		t.Fatal("STATEGATE_COMPONENT_SOCKET is not set: this test is run by the stategate integration tests")
	}
	var ops []string
	for _, op := range strings.Split(os.Getenv("STATEGATE_CONFORMANCE_OPS"), ",") {
		if op = strings.TrimSpace(op); op != "" {
			ops = append(ops, op)
		}
	}
	// A well-formed version that no key will ever have: the suite expects a stale ETag to be a
	// mismatch (FailedPrecondition), and stategate answers an unparsable one as invalid.
	config, err := conformance.NewTestConfig("stategate", ops, map[string]interface{}{
		"badEtag": "000000000000001:00000:conformance",
	})
	if err != nil {
		t.Fatalf("test config: %v", err)
	}
	store := pluggable.NewGRPCStateStore(logger.NewLogger("conformance"), socket)
	conformance.ConformanceTests(t, map[string]string{}, store, config)
}

// The conformance suite's `etag` subtest stops at its first bulk check: it expects a bulk
// write with one stale ETag to fail with one error per failed key (a joined error), and
// daprd's adapter turns the component's single gRPC status into a single error
// (pkg/components/state/pluggable.go, BulkSet and BulkDelete), so that subtest cannot pass
// through the adapter whatever the component does. This test checks what the rest of that
// subtest checks, as far as the adapter can carry it: a bulk write or delete with one stale
// ETag fails as an ETag mismatch, applies the item whose ETag is current, and leaves the
// other unchanged.
func TestBulkWithOneStaleEtagThroughAdapter(t *testing.T) {
	socket := os.Getenv("STATEGATE_COMPONENT_SOCKET")
	if socket == "" {
		t.Fatal("STATEGATE_COMPONENT_SOCKET is not set: this test is run by the stategate integration tests")
	}
	ctx := t.Context()
	store := pluggable.NewGRPCStateStore(logger.NewLogger("bulk"), socket)
	if err := store.Init(ctx, state.Metadata{}); err != nil {
		t.Fatalf("init: %v", err)
	}
	base := fmt.Sprintf("bulk-%d", time.Now().UnixNano())
	k1, k2 := base+"-1", base+"-2"
	etagOf := func(key string) string {
		res, err := store.Get(ctx, &state.GetRequest{Key: key})
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		if res.ETag == nil {
			return ""
		}
		return *res.ETag
	}
	valueOf := func(key string) string {
		res, err := store.Get(ctx, &state.GetRequest{Key: key})
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		return string(res.Data)
	}
	isMismatch := func(what string, err error) {
		var etagErr *state.ETagError
		if err == nil {
			t.Fatalf("%s: expected an ETag mismatch, the call succeeded", what)
		}
		if !errors.As(err, &etagErr) || etagErr.Kind() != state.ETagMismatch {
			t.Fatalf("%s: expected an ETag mismatch, got %v", what, err)
		}
	}
	for _, k := range []string{k1, k2} {
		if err := store.Set(ctx, &state.SetRequest{Key: k, Value: []byte("one")}); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
	stale := "000000000000001:00000:conformance"
	e1, e2 := etagOf(k1), etagOf(k2)

	err := store.BulkSet(ctx, []state.SetRequest{
		{Key: k1, Value: []byte("two"), ETag: &stale},
		{Key: k2, Value: []byte("two"), ETag: &e2},
	}, state.BulkStoreOpts{})
	isMismatch("bulk set with one stale ETag", err)
	if valueOf(k1) != "one" || etagOf(k1) != e1 {
		t.Fatalf("the item with the stale ETag changed")
	}
	if valueOf(k2) != "two" || etagOf(k2) == e2 {
		t.Fatalf("the item with the current ETag was not applied")
	}
	e2 = etagOf(k2)

	err = store.BulkDelete(ctx, []state.DeleteRequest{
		{Key: k1, ETag: &e1},
		{Key: k2, ETag: &stale},
	}, state.BulkStoreOpts{})
	isMismatch("bulk delete with one stale ETag", err)
	if valueOf(k1) != "" {
		t.Fatalf("the item with the current ETag was not deleted")
	}
	if valueOf(k2) != "two" || etagOf(k2) != e2 {
		t.Fatalf("the item with the stale ETag changed")
	}
	if err := store.BulkDelete(ctx, []state.DeleteRequest{{Key: k2, ETag: &e2}}, state.BulkStoreOpts{}); err != nil {
		t.Fatalf("bulk delete with the current ETag: %v", err)
	}
	if valueOf(k2) != "" {
		t.Fatalf("bulk delete with the current ETag left the key")
	}
}
