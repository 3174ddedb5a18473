package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Outcome of an operation as the client knows it.
type Outcome string

const (
	OK      Outcome = "ok"
	Fail    Outcome = "fail"    // definitely did not happen (e.g. 409 etag mismatch)
	Unknown Outcome = "unknown" // timeout, connection error, 5xx: may or may not have happened
)

// Op is one recorded operation. Invoke and Return come from one monotonic clock (the run's
// start), so that ops from different goroutines can be ordered.
type Op struct {
	Workload string        `json:"workload"`
	Client   int           `json:"client"`
	Kind     string        `json:"kind"`           // read, write, cas, lock, save, unlock, ack-write
	Door     string        `json:"door,omitempty"` // http, grpc or mqtt (the register workload)
	Node     string        `json:"node"`           // the replica the request went through
	Key      string        `json:"key,omitempty"`
	Value    string        `json:"value,omitempty"` // written value, or value read
	Old      string        `json:"old,omitempty"`   // cas: the value its etag stands for
	Owner    string        `json:"owner,omitempty"` // fencing
	Token    string        `json:"token,omitempty"` // fencing token got (lock) or sent (save)
	ETag     string        `json:"etag,omitempty"`  // version returned by a read or a write
	Invoke   time.Duration `json:"invoke_ns"`
	Return   time.Duration `json:"return_ns"`
	Outcome  Outcome       `json:"outcome"`
	Status   int           `json:"status,omitempty"`
	Err      string        `json:"err,omitempty"`
}

func (o Op) String() string {
	via := o.Node
	if o.Door != "" {
		via = o.Door + "@" + o.Node
	}
	s := fmt.Sprintf("[%s c%d %s via %s", o.Workload, o.Client, o.Kind, via)
	for _, kv := range [][2]string{{"key", o.Key}, {"old", o.Old}, {"value", o.Value}, {"owner", o.Owner}, {"token", o.Token}, {"etag", o.ETag}} {
		if kv[1] != "" {
			s += " " + kv[0] + "=" + kv[1]
		}
	}
	s += fmt.Sprintf(" invoke=%.3fs return=%.3fs %s", o.Invoke.Seconds(), o.Return.Seconds(), o.Outcome)
	if o.Status != 0 {
		s += fmt.Sprintf(" http=%d", o.Status)
	}
	if o.Err != "" {
		s += " err=" + o.Err
	}
	return s + "]"
}

// History collects ops from all workloads.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

func newHistory() *History { return &History{start: time.Now()} }

// Now is the one clock every invoke and return time is read from.
func (h *History) Now() time.Duration { return time.Since(h.start) }

func (h *History) Add(o Op) {
	h.mu.Lock()
	h.ops = append(h.ops, o)
	h.mu.Unlock()
}

func (h *History) Ops(workload string) []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Op
	for _, o := range h.ops {
		if o.Workload == workload {
			out = append(out, o)
		}
	}
	return out
}

// Counts per outcome of a workload's ops.
func (h *History) Counts(workload string) map[Outcome]int {
	m := map[Outcome]int{OK: 0, Fail: 0, Unknown: 0}
	for _, o := range h.Ops(workload) {
		m[o.Outcome]++
	}
	return m
}

// Client is the HTTP side of the workloads: a 2 s timeout so that a paused replica or a cut
// Redis gives an unknown outcome quickly rather than stalling a worker for the whole fault.
type Client struct {
	c        *http.Client
	replicas []*Replica
}

func newClient(replicas []*Replica) *Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	return &Client{c: &http.Client{Timeout: 2 * time.Second, Transport: tr}, replicas: replicas}
}

func (c *Client) pick(r *rand.Rand) *Replica { return c.replicas[r.Intn(len(c.replicas))] }

// Reply is an HTTP answer, or the error that stands for an unknown outcome.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
	Err    error
}

// Unknown: no answer, or a 5xx. The request may have taken effect either way, so it is never
// counted as failed. The one exception is a refused connection (the replica is down): the
// request was never sent, so it is a definite failure. Counting those as unknown would add
// thousands of never-returning writes while a node is down, which makes porcupine's search
// blow up without checking anything more.
// Saved records the outcome of a state save: 204 is applied (its ETag kept), an unknown
// reply is unknown, anything else (409 included: an ETag or fencing refusal) was not applied.
func (op *Op) Saved(rep Reply) {
	op.Status = rep.Status
	switch {
	case rep.Unknown():
		op.Outcome, op.Err = Unknown, rep.ErrString()
	case rep.Status == 204:
		op.Outcome, op.ETag = OK, rep.Header.Get("Etag")
	default:
		op.Outcome, op.Err = Fail, rep.ErrString()
	}
}

// 507 is the one 5xx that is definite: a write refused for a full disk changed nothing (the
// service's contract; the checkers hold it to that).
func (r Reply) Unknown() bool {
	return (r.Err != nil && !r.Refused()) || (r.Status >= 500 && r.Status != 507)
}

// Refused: the connection was refused, so the request was not sent.
func (r Reply) Refused() bool { return r.Err != nil && errors.Is(r.Err, syscall.ECONNREFUSED) }

func (r Reply) ErrString() string {
	if r.Err != nil {
		return r.Err.Error()
	}
	if r.Status >= 400 {
		return string(bytes.TrimSpace(r.Body))
	}
	return ""
}

func (c *Client) do(ctx context.Context, method, url string, body []byte, hdr map[string]string) Reply {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Reply{Err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.c.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return Reply{Err: syscall.ECONNREFUSED}
		}
		return Reply{Err: shortErr(err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Reply{Status: resp.StatusCode, Err: shortErr(err)}
	}
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// shortErr keeps the error's kind for the history without the full URL.
func shortErr(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return errors.New("timeout")
	case errors.Is(err, context.Canceled):
		return errors.New("canceled")
	}
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) && ue.Unwrap() != nil {
		return ue.Unwrap()
	}
	return err
}

// backoff after an op: a pause after an unknown or refused outcome, so that a worker does not
// spin against a dead or paused replica (and fill the history with ops that say nothing).
func backoff(ctx context.Context, o Op) {
	if o.Outcome == Unknown || strings.Contains(o.Err, "refused") {
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// sleepCtx sleeps unless ctx ends first; false when it ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Verdict of one checker.
type Verdict struct {
	Checker    string   `json:"checker"`
	Valid      bool     `json:"valid"`
	Summary    string   `json:"summary"`
	Violations []string `json:"violations,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// maxListed bounds how many violations a verdict lists (the count is always exact).
const maxListed = 20

func (v *Verdict) violate(s string) {
	v.Valid = false
	if len(v.Violations) < maxListed {
		v.Violations = append(v.Violations, s)
	}
}
