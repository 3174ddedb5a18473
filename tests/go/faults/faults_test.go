package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// quiet is how long the workloads keep running after every fault healed, before the final
// checks: replicas reconnect, catch up with Redis, and watchers resume.
const quiet = 5 * time.Second

// workloads, in the order the summary lists them.
var workloads = []string{regWorkload, fenceWorkload, ackWorkload, invWorkload}

// Result is result.json.
type Result struct {
	Seed     int64                      `json:"seed"`
	Topology string                     `json:"topology"`
	Skew     bool                       `json:"skew"`
	SkewSecs int                        `json:"skew_seconds,omitempty"`
	Wait     int                        `json:"redis_wait_replicas,omitempty"`
	Fsync    string                     `json:"redis_fsync,omitempty"`
	Broker   string                     `json:"broker,omitempty"`
	Binary   string                     `json:"binary"`
	Seconds  float64                    `json:"seconds"`
	Schedule []Fault                    `json:"schedule"`
	Counts   map[string]map[Outcome]int `json:"counts"`
	// Doors: the register workload's counts per door (http, grpc, mqtt).
	Doors    map[string]map[Outcome]int `json:"doors"`
	Verdicts []Verdict                  `json:"verdicts"`
	Valid    bool                       `json:"valid"`
}

func TestFaults(t *testing.T) {
	cfg := loadConfig(t)
	// Printed first, so a run that dies early still tells how to replay it.
	fmt.Printf("faults: seed %d topology %s skew %v duration %v out %s bin %s\n",
		cfg.Seed, cfg.Topology, cfg.Skew, cfg.Duration, cfg.Out, cfg.Bin)
	c := startCluster(t, cfg)
	h := newHistory()
	cl := newClient(c.Replicas)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	gd, err := newGRPCDoor(c.Replicas)
	if err != nil {
		t.Fatal(err)
	}
	defer gd.Close()
	md, err := newMQTTDoor(cfg, c.Replicas)
	if err != nil {
		t.Fatal(err)
	}
	defer md.Close()
	runRegister(ctx, cfg, h, []regDoor{httpDoor{cl}, gd, md}, c.Replicas, &wg)
	runFencing(ctx, cfg, h, cl, &wg)
	runAck(ctx, cfg, h, cl, &wg)
	mg := newMQTTMGet()
	defer mg.Close()
	runInvariant(ctx, cfg, h, cl, []snapshotReader{httpDoor{cl}, gd, mg}, c.Replicas, &wg)
	w := startWatchers(ctx, cfg, h, cl, &wg)
	startGRPCWatchers(w, h, c.Replicas)
	startKeyNotifyWatchers(w, h, cfg, c.Replicas)

	plan := planFaults(cfg, len(c.Replicas), 3*time.Second, cfg.Duration-quiet-time.Second)
	nem, err := newNemesis(c, h, plan)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { nem.Run(stop); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.Duration - quiet):
		close(stop)
		<-done
	}
	if err := c.heal(); err != nil {
		nem.logf("heal failed: %v", err)
		t.Fatalf("heal: %v", err)
	}
	healed := h.Now()
	nem.logf("healed; quiet period")
	end := max(cfg.Duration, healed+quiet)
	time.Sleep(end - h.Now())
	cancel()
	wg.Wait()
	// The last acknowledged writes reach the watchers within this.
	time.Sleep(3 * time.Second)
	w.Stop()
	nem.logf("workloads and watchers stopped; checking")

	var verdicts []Verdict
	verdicts = append(verdicts, checkRegister(h, cfg.Out))
	fv := checkFencing(h, cfg.Out, w.lockExpiries)
	verdicts = append(verdicts, fv...)
	verdicts = append(verdicts, checkAck(h, cl, cfg.Out))
	verdicts = append(verdicts, checkInvariant(h, cfg.Out))
	verdicts = append(verdicts, w.check(h, cfg.Out)...)
	nem.logf("checked")
	nem.log.Close()

	res := Result{Seed: cfg.Seed, Topology: cfg.Topology, Skew: cfg.Skew, SkewSecs: cfg.SkewSeconds, Wait: cfg.WaitReplicas, Fsync: cfg.RedisFsync, Broker: cfg.Broker, Binary: cfg.Bin,
		Seconds: h.Now().Seconds(), Schedule: nem.plan, Counts: map[string]map[Outcome]int{}, Valid: true, Verdicts: verdicts}
	for _, wl := range workloads {
		res.Counts[wl] = h.Counts(wl)
	}
	res.Doors = map[string]map[Outcome]int{}
	for _, o := range h.Ops(regWorkload) {
		if res.Doors[o.Door] == nil {
			res.Doors[o.Door] = map[Outcome]int{}
		}
		res.Doors[o.Door][o.Outcome]++
	}
	for _, v := range verdicts {
		res.Valid = res.Valid && v.Valid
	}
	dumpJSON(filepath.Join(cfg.Out, "result.json"), res)
	summary := summarize(res)
	os.WriteFile(filepath.Join(cfg.Out, "summary.txt"), []byte(summary), 0o644)
	fmt.Print(summary)
	switch {
	case cfg.ExpectViolation && res.Valid:
		t.Errorf("FAULTS_EXPECT_VIOLATION=1 but no checker found a violation (seed %d); see %s", cfg.Seed, cfg.Out)
	case cfg.ExpectViolation:
		t.Logf("violations found, as FAULTS_EXPECT_VIOLATION=1 expects (seed %d); see %s", cfg.Seed, cfg.Out)
	case !res.Valid:
		t.Errorf("violations found (seed %d); see %s", cfg.Seed, cfg.Out)
	}
}

func summarize(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "==== faults: seed %d topology %s skew ±%ds, %.1fs, binary %s\n", r.Seed, r.Topology, r.SkewSecs, r.Seconds, r.Binary)
	fmt.Fprintf(&b, "schedule (%d faults):\n", len(r.Schedule))
	for _, f := range r.Schedule {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	fmt.Fprintf(&b, "operations (ok/fail/unknown):\n")
	for _, wl := range workloads {
		c := r.Counts[wl]
		fmt.Fprintf(&b, "  %-9s %d/%d/%d\n", wl, c[OK], c[Fail], c[Unknown])
		if wl == regWorkload {
			for _, d := range []string{"http", "grpc", "mqtt"} {
				if c, ok := r.Doors[d]; ok {
					fmt.Fprintf(&b, "    %-7s %d/%d/%d\n", d, c[OK], c[Fail], c[Unknown])
				}
			}
		}
	}
	fmt.Fprintf(&b, "checkers:\n")
	for _, v := range r.Verdicts {
		verdict := "PASS"
		if !v.Valid {
			verdict = "FAIL"
		}
		fmt.Fprintf(&b, "  %s %s: %s\n", verdict, v.Checker, v.Summary)
		for _, x := range v.Violations {
			fmt.Fprintf(&b, "      violation: %s\n", x)
		}
		for _, x := range v.Notes {
			fmt.Fprintf(&b, "      note: %s\n", x)
		}
	}
	verdict := "VALID"
	if !r.Valid {
		verdict = "INVALID"
	}
	fmt.Fprintf(&b, "==== %s (seed %d)\n", verdict, r.Seed)
	return b.String()
}
