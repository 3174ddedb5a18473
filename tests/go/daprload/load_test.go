// Package daprload is a load generator for Dapr workflows and actors, written against the
// published Dapr Go SDK (github.com/dapr/go-sdk's client and actor runtime, and the workflow
// client and worker of github.com/dapr/durabletask-go that the SDK ecosystem publishes for
// Dapr 1.18). It is run by the integration tests (tests/it/daprd/load.rs) and by
// `cargo bench --bench workflows`, which start daprd, placement, the scheduler and a store.
//
// One process hosts the app (the workflow worker and the Counter actor type) and drives the
// load. It reads its jobs from LOAD_JOBS (comma separated) or, when LOAD_JOBS is "-", one per
// line from stdin, and prints one `RESULT {json}` line per job:
//
//	chain:N:S        N workflow instances started at once, each S sequential activities
//	fanout:A         one workflow of A activities in parallel
//	actors:I:C:K     K actor calls spread over I actor ids, C calls in flight
//
// Environment: DAPR_GRPC_PORT and DAPR_HTTP_PORT (daprd's API, read by the SDK too),
// LOAD_APP_PORT (where the actor app listens; daprd's --app-port), LOAD_RUN (a tag that keeps
// instance and actor ids of separate runs apart), LOAD_JOB_TIMEOUT (seconds a job may take;
// units still running then are reported as failures).
package daprload

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dapr/durabletask-go/workflow"
	dapr "github.com/dapr/go-sdk/client"
	daprhttp "github.com/dapr/go-sdk/service/http"
)

// env reads a required variable.
func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: this program is run by tests/it/daprd/load.rs or benches/workflows.rs", name)
	}
	return v
}

// waitHealthy polls daprd's health route (daprd has no event a client could wait on).
func waitHealthy(t *testing.T, httpPort string, limit time.Duration) {
	url := "http://127.0.0.1:" + httpPort + "/v1.0/healthz"
	deadline := time.Now().Add(limit)
	for {
		r, err := http.Get(url)
		if err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusNoContent {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("daprd's %s did not answer 204 within %v (last error %v)", url, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// printResult writes one machine-readable line for the Rust side.
func printResult(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	fmt.Printf("RESULT %s\n", b)
}

func TestLoad(t *testing.T) {
	grpcPort := env(t, "DAPR_GRPC_PORT")
	httpPort := env(t, "DAPR_HTTP_PORT")
	appPort := env(t, "LOAD_APP_PORT")
	run := os.Getenv("LOAD_RUN")
	if run == "" {
		run = fmt.Sprintf("r%d", os.Getpid())
	}
	jobs := os.Getenv("LOAD_JOBS")
	if jobs == "" {
		t.Fatal("LOAD_JOBS is not set (chain:N:S, fanout:A, actors:I:C:K, comma separated, or - for stdin)")
	}

	// The actor app listens first: daprd waits for its app port before it reports itself
	// initialized, and asks the app for its actor types there.
	service := daprhttp.NewService("127.0.0.1:" + appPort)
	service.(*daprhttp.Server).RegisterActorImplFactoryContext(newCounter)
	go func() {
		if err := service.Start(); err != nil && err != http.ErrServerClosed {
			fmt.Fprintf(os.Stderr, "FAIL: the actor app's server: %v\n", err)
			os.Exit(1)
		}
	}()
	fmt.Println("LISTENING")
	waitHealthy(t, httpPort, 120*time.Second)

	client, err := dapr.NewClientWithAddress("127.0.0.1:" + grpcPort)
	if err != nil {
		t.Fatalf("connect to daprd: %v", err)
	}
	defer client.Close()
	actorClient = client
	wf := workflow.NewClient(client.GrpcClientConn())
	registry := workflow.NewRegistry()
	for _, err := range []error{
		registry.AddWorkflowN("Chain", chainWorkflow),
		registry.AddWorkflowN("FanOut", fanOutWorkflow),
		registry.AddActivityN("Step", stepActivity),
		registry.AddActivityN("Square", squareActivity),
	} {
		if err != nil {
			t.Fatalf("register: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := wf.StartWorker(ctx, registry); err != nil {
		t.Fatalf("start the workflow worker: %v", err)
	}
	l := &loader{t: t, wf: wf, client: client, run: run}
	l.warmUp(ctx)
	fmt.Println("READY")

	if jobs != "-" {
		for _, job := range strings.Split(jobs, ",") {
			l.job(ctx, strings.TrimSpace(job))
		}
		return
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if job := strings.TrimSpace(in.Text()); job != "" {
			l.job(ctx, job)
		}
	}
}

type loader struct {
	t      *testing.T
	wf     *workflow.Client
	client dapr.Client
	run    string
	seq    int
}

// warmUp waits, with a deadline, until daprd runs a workflow and places a Counter actor:
// the worker's stream and placement's table arrive after daprd reports itself healthy, and
// neither announces itself to a client.
func (l *loader) warmUp(ctx context.Context) {
	deadline := time.Now().Add(120 * time.Second)
	var last error
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		if last = l.probe(ctx, attempt); last == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	l.t.Fatalf("daprd did not run a workflow and an actor call within 120 s: %v", last)
}

func (l *loader) probe(ctx context.Context, attempt int) error {
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	id := fmt.Sprintf("%s-warmup-%d", l.run, attempt)
	if _, err := l.wf.ScheduleWorkflow(c, "Chain", workflow.WithInstanceID(id), workflow.WithInput(chainInput{Start: 0, Steps: 1})); err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	meta, err := l.wf.WaitForWorkflowCompletion(c, id, workflow.WithFetchPayloads(true))
	if err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	if meta.RuntimeStatus != workflow.StatusCompleted {
		return fmt.Errorf("the warm-up workflow ended %s", meta.String())
	}
	_, err = l.client.InvokeActor(c, &dapr.InvokeActorRequest{
		ActorType: counterType, ActorID: l.run + "-warmup", Method: "Add", Data: []byte("0"),
	})
	return err
}

func (l *loader) job(ctx context.Context, spec string) {
	parts := strings.Split(spec, ":")
	num := func(i int) int {
		var n int
		if i >= len(parts) {
			l.t.Fatalf("job %q: too few fields", spec)
		}
		if _, err := fmt.Sscan(parts[i], &n); err != nil || n <= 0 {
			l.t.Fatalf("job %q: field %d is not a positive number", spec, i)
		}
		return n
	}
	l.seq++
	tag := fmt.Sprintf("%s-j%d", l.run, l.seq)
	switch parts[0] {
	case "chain":
		printResult(l.chains(ctx, tag, num(1), num(2)))
	case "fanout":
		printResult(l.fanOut(ctx, tag, num(1)))
	case "actors":
		printResult(l.actors(ctx, tag, num(1), num(2), num(3)))
	default:
		l.t.Fatalf("job %q: chain:N:S, fanout:A or actors:I:C:K", spec)
	}
}
