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
	"os"
	"strings"
	"testing"

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
