package daprload

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/dapr/durabletask-go/workflow"
)

type chainInput struct {
	Start int `json:"start"`
	Steps int `json:"steps"`
}

// chainWorkflow runs Steps activities one after the other, each adding one to the value: its
// output is Start + Steps, which the load generator checks.
func chainWorkflow(ctx *workflow.WorkflowContext) (any, error) {
	var in chainInput
	if err := ctx.GetInput(&in); err != nil {
		return nil, err
	}
	v := in.Start
	for range in.Steps {
		if err := ctx.CallActivity("Step", workflow.WithActivityInput(v)).Await(&v); err != nil {
			return nil, err
		}
	}
	return v, nil
}

func stepActivity(ctx workflow.ActivityContext) (any, error) {
	var v int
	if err := ctx.GetInput(&v); err != nil {
		return nil, err
	}
	return v + 1, nil
}

// fanOutWorkflow schedules its input's count of activities at once and sums their answers:
// the sum of the squares 0..count-1.
func fanOutWorkflow(ctx *workflow.WorkflowContext) (any, error) {
	var count int
	if err := ctx.GetInput(&count); err != nil {
		return nil, err
	}
	tasks := make([]workflow.Task, count)
	for i := range count {
		tasks[i] = ctx.CallActivity("Square", workflow.WithActivityInput(i))
	}
	sum := 0
	for _, task := range tasks {
		var v int
		if err := task.Await(&v); err != nil {
			return nil, err
		}
		sum += v
	}
	return sum, nil
}

func squareActivity(ctx workflow.ActivityContext) (any, error) {
	var v int
	if err := ctx.GetInput(&v); err != nil {
		return nil, err
	}
	return v * v, nil
}

// Result is what one job reports: how many units (workflows or actor calls) it ran, how many
// ended right, the time from the first start to the last end, and the latency of each unit
// (from its start to its end) as percentiles in milliseconds.
type Result struct {
	Job        string  `json:"job"`
	Units      int     `json:"units"`
	Ok         int     `json:"ok"`
	Failures   int     `json:"failures"`
	FirstError string  `json:"first_error,omitempty"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"per_second"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
	// Calls made after the timed part to check the outcome (actor rows read every counter):
	// the CPU a row's processes spent covers them too.
	Checks int `json:"checks"`
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

// tally collects the outcome of concurrent units.
type tally struct {
	mu        sync.Mutex
	latencies []time.Duration
	ok, fails int
	firstErr  string
	// When the last unit that ended right ended: throughput counts only those, so units
	// that never end (cut at the job's time limit) do not stretch it.
	lastOk time.Time
}

func (t *tally) add(latency time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.fails++
		if t.firstErr == "" {
			t.firstErr = err.Error()
		}
		return
	}
	t.ok++
	t.latencies = append(t.latencies, latency)
	t.lastOk = time.Now()
}

// result reports the units; elapsed runs from the first start to the last unit that ended
// right.
func (t *tally) result(job string, units int, begin time.Time) Result {
	elapsed := t.lastOk.Sub(begin)
	if t.ok == 0 {
		elapsed = time.Since(begin)
	}
	sort.Slice(t.latencies, func(i, j int) bool { return t.latencies[i] < t.latencies[j] })
	r := Result{
		Job: job, Units: units, Ok: t.ok, Failures: t.fails, FirstError: t.firstErr,
		Seconds:   elapsed.Seconds(),
		PerSecond: float64(t.ok) / elapsed.Seconds(),
		P50Ms:     percentile(t.latencies, 0.50),
		P99Ms:     percentile(t.latencies, 0.99),
	}
	if n := len(t.latencies); n > 0 {
		r.MaxMs = float64(t.latencies[n-1].Microseconds()) / 1000
	}
	return r
}

// jobTimeout is how long a job may run (LOAD_JOB_TIMEOUT, in seconds; 600 by default):
// units still running then count as failures, and the job reports what ended by then.
func jobTimeout() time.Duration {
	if v, err := strconv.Atoi(os.Getenv("LOAD_JOB_TIMEOUT")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return 600 * time.Second
}

// runWorkflow schedules one instance, waits for it and checks its output.
func (l *loader) runWorkflow(ctx context.Context, name, id string, input any, want int) error {
	if _, err := l.wf.ScheduleWorkflow(ctx, name, workflow.WithInstanceID(id), workflow.WithInput(input)); err != nil {
		return fmt.Errorf("schedule %s: %w", id, err)
	}
	meta, err := l.wf.WaitForWorkflowCompletion(ctx, id, workflow.WithFetchPayloads(true))
	if err != nil {
		return fmt.Errorf("wait for %s: %w", id, err)
	}
	if meta.RuntimeStatus != workflow.StatusCompleted {
		return fmt.Errorf("%s ended %s: %v", id, meta.String(), meta.FailureDetails)
	}
	var got int
	output := meta.Output.GetValue()
	if err := json.Unmarshal([]byte(output), &got); err != nil || got != want {
		return fmt.Errorf("%s answered %q, want %d", id, output, want)
	}
	return nil
}

// chains starts n Chain instances at once (one goroutine each) and waits for all of them.
func (l *loader) chains(ctx context.Context, tag string, n, steps int) Result {
	ctx, cancel := context.WithTimeout(ctx, jobTimeout())
	defer cancel()
	var t tally
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			err := l.runWorkflow(ctx, "Chain", fmt.Sprintf("%s-chain-%d", tag, i), chainInput{Start: i, Steps: steps}, i+steps)
			t.add(time.Since(start), err)
		})
	}
	wg.Wait()
	return t.result(fmt.Sprintf("chain:%d:%d", n, steps), n, begin)
}

// fanOut runs one FanOut instance of count parallel activities.
func (l *loader) fanOut(ctx context.Context, tag string, count int) Result {
	ctx, cancel := context.WithTimeout(ctx, jobTimeout())
	defer cancel()
	want := 0
	for i := range count {
		want += i * i
	}
	var t tally
	begin := time.Now()
	err := l.runWorkflow(ctx, "FanOut", tag+"-fanout", count, want)
	t.add(time.Since(begin), err)
	return t.result(fmt.Sprintf("fanout:%d", count), 1, begin)
}
