// Package daprsdk runs the published Dapr Go SDK's state calls against stategate's own gRPC
// door (the dapr.proto.runtime.v1.Dapr service, no daprd in between). It is run by
// tests/it/aio_go.rs, which passes the door's address in STATEGATE_GRPC_ADDR. Every call is
// bounded by a context deadline.
package daprsdk

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const store = "statestore"

func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T) dapr.Client {
	t.Helper()
	addr := os.Getenv("STATEGATE_GRPC_ADDR")
	if addr == "" {
		t.Fatal("STATEGATE_GRPC_ADDR is not set: this test is run by the Rust integration tests (cargo test --test it -- aio_go)")
	}
	c, err := dapr.NewClientWithAddressContext(bounded(t), addr)
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// Keys unique per process, so runs never share state.
func key(name string) string {
	return fmt.Sprintf("go-dapr-%d-%s", os.Getpid(), name)
}

func get(t *testing.T, c dapr.Client, k string) *dapr.StateItem {
	t.Helper()
	item, err := c.GetState(bounded(t), store, k, nil)
	if err != nil {
		t.Fatalf("GetState %s: %v", k, err)
	}
	return item
}

// refused fails unless err is a gRPC status with code want.
func refused(t *testing.T, err error, want codes.Code, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s was accepted; want %v", what, want)
	}
	if got := status.Code(err); got != want {
		t.Fatalf("%s: %v (code %v), want %v", what, err, got, want)
	}
}

// Save, get and delete with ETags (the key's version), first-write, TTL metadata.
func TestStateETags(t *testing.T) {
	c := connect(t)
	k := key("etag")
	if err := c.SaveState(bounded(t), store, k, []byte(`{"n":1}`), nil); err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	first := get(t, c, k)
	if string(first.Value) != `{"n":1}` || first.Etag == "" {
		t.Fatalf("GetState after save: %q etag %q", first.Value, first.Etag)
	}
	if err := c.SaveStateWithETag(bounded(t), store, k, []byte(`{"n":2}`), first.Etag, nil); err != nil {
		t.Fatalf("save with the current ETag: %v", err)
	}
	second := get(t, c, k)
	if string(second.Value) != `{"n":2}` || second.Etag == first.Etag {
		t.Fatalf("after the conditional save: %q etag %q (was %q)", second.Value, second.Etag, first.Etag)
	}
	err := c.SaveStateWithETag(bounded(t), store, k, []byte(`{"n":3}`), first.Etag, nil)
	refused(t, err, codes.Aborted, "a save with a stale ETag")
	err = c.SaveStateWithETag(bounded(t), store, k, []byte(`{"n":3}`), "not-a-version", nil)
	refused(t, err, codes.InvalidArgument, "a save with an ETag that is no version")
	err = c.DeleteStateWithETag(bounded(t), store, k, &dapr.ETag{Value: first.Etag}, nil, nil)
	refused(t, err, codes.Aborted, "a delete with a stale ETag")
	// First-write: a save without an ETag may only create.
	err = c.SaveState(bounded(t), store, k, []byte(`{"n":4}`), nil, dapr.WithConcurrency(dapr.StateConcurrencyFirstWrite))
	refused(t, err, codes.Aborted, "a first-write save over an existing key")
	if got := get(t, c, k); string(got.Value) != `{"n":2}` || got.Etag != second.Etag {
		t.Fatalf("refused writes changed the key: %q etag %q", got.Value, got.Etag)
	}
	if err := c.DeleteStateWithETag(bounded(t), store, k, &dapr.ETag{Value: second.Etag}, nil, nil); err != nil {
		t.Fatalf("delete with the current ETag: %v", err)
	}
	if got := get(t, c, k); got.Value != nil || got.Etag != "" {
		t.Fatalf("after delete: %q etag %q", got.Value, got.Etag)
	}

	ttl := key("ttl")
	if err := c.SaveState(bounded(t), store, ttl, []byte("brief"), map[string]string{"ttlInSeconds": "60"}); err != nil {
		t.Fatalf("SaveState with ttlInSeconds: %v", err)
	}
	got := get(t, c, ttl)
	expires, err := time.Parse(time.RFC3339, got.Metadata["ttlExpireTime"])
	if err != nil {
		t.Fatalf("ttlExpireTime %q: %v", got.Metadata["ttlExpireTime"], err)
	}
	if left := time.Until(expires); left <= 0 || left > 61*time.Second {
		t.Fatalf("ttlExpireTime %v is not a minute ahead", expires)
	}

	// Left for the Rust side to read over the engine: the ETag is the key's version.
	shared := key("shared")
	if err := c.SaveState(bounded(t), store, shared, []byte("from-go"), nil); err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	fmt.Printf("STATEGATE etag %s %s\n", shared, get(t, c, shared).Etag)
}

// Bulk save, get and delete; transactions all or nothing; a query over JSON values.
func TestStateBulkAndTransactions(t *testing.T) {
	c := connect(t)
	keys := []string{key("bulk-a"), key("bulk-b"), key("bulk-c")}
	var items []*dapr.SetStateItem
	for i, k := range keys {
		items = append(items, &dapr.SetStateItem{Key: k, Value: []byte(fmt.Sprintf(`{"color":"red","i":%d}`, i))})
	}
	if err := c.SaveBulkState(bounded(t), store, items...); err != nil {
		t.Fatalf("SaveBulkState: %v", err)
	}
	missing := key("bulk-missing")
	got, err := c.GetBulkState(bounded(t), store, append(keys, missing), nil, 2)
	if err != nil {
		t.Fatalf("GetBulkState: %v", err)
	}
	etags := map[string]string{}
	for _, item := range got {
		if item.Error != "" {
			t.Fatalf("bulk item %s: %s", item.Key, item.Error)
		}
		etags[item.Key] = item.Etag
		if item.Key == missing {
			if item.Value != nil || item.Etag != "" {
				t.Fatalf("a missing key in a bulk get: %q etag %q", item.Value, item.Etag)
			}
		} else if !strings.Contains(string(item.Value), `"color":"red"`) || item.Etag == "" {
			t.Fatalf("bulk item %s: %q etag %q", item.Key, item.Value, item.Etag)
		}
	}
	if len(etags) != 4 {
		t.Fatalf("GetBulkState answered %d keys, want 4", len(etags))
	}

	res, err := c.QueryStateAlpha1(bounded(t), store, `{"filter":{"EQ":{"color":"red"}},"sort":[{"key":"i"}]}`, nil)
	if err != nil {
		t.Fatalf("QueryStateAlpha1: %v", err)
	}
	var found []string
	for _, r := range res.Results {
		if strings.HasPrefix(r.Key, key("bulk-")) {
			found = append(found, r.Key)
		}
	}
	if !sort.StringsAreSorted(found) || len(found) != 3 {
		t.Fatalf("query found %v, want the three bulk keys in order", found)
	}

	// A transaction with one stale ETag applies nothing.
	a, b, c2 := keys[0], keys[1], keys[2]
	stale := []*dapr.StateOperation{
		{Type: dapr.StateOperationTypeUpsert, Item: &dapr.SetStateItem{Key: a, Value: []byte(`"x"`)}},
		{Type: dapr.StateOperationTypeDelete, Item: &dapr.SetStateItem{Key: b, Etag: &dapr.ETag{Value: etags[a]}}},
	}
	err = c.ExecuteStateTransaction(bounded(t), store, nil, stale)
	if err == nil {
		t.Fatal("a transaction with a stale ETag was applied")
	}
	if got := get(t, c, a); got.Etag != etags[a] {
		t.Fatalf("the refused transaction changed %s", a)
	}
	ops := []*dapr.StateOperation{
		{Type: dapr.StateOperationTypeUpsert, Item: &dapr.SetStateItem{Key: a, Value: []byte(`"x"`), Etag: &dapr.ETag{Value: etags[a]}}},
		{Type: dapr.StateOperationTypeDelete, Item: &dapr.SetStateItem{Key: b, Etag: &dapr.ETag{Value: etags[b]}}},
		{Type: dapr.StateOperationTypeDelete, Item: &dapr.SetStateItem{Key: missing}},
	}
	if err := c.ExecuteStateTransaction(bounded(t), store, nil, ops); err != nil {
		t.Fatalf("ExecuteStateTransaction: %v", err)
	}
	if got := get(t, c, a); string(got.Value) != `"x"` {
		t.Fatalf("after the transaction %s is %q", a, got.Value)
	}
	if got := get(t, c, b); got.Value != nil {
		t.Fatalf("after the transaction %s is %q", b, got.Value)
	}

	if err := c.DeleteBulkState(bounded(t), store, []string{a, c2, missing}, nil); err != nil {
		t.Fatalf("DeleteBulkState: %v", err)
	}
	left, err := c.GetBulkState(bounded(t), store, keys, nil, 1)
	if err != nil {
		t.Fatalf("GetBulkState: %v", err)
	}
	for _, item := range left {
		if item.Value != nil {
			t.Fatalf("%s survived the bulk delete: %q", item.Key, item.Value)
		}
	}
}
