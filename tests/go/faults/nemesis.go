package faults

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault is one planned fault: what, on which process, when (from the run's start) and for how
// long. The whole plan is drawn from the seed before the run starts, so a seed replays the same
// faults at the same times (the system's answers to them may differ: timing is not replayed).
type Fault struct {
	At     time.Duration `json:"at_ns"`
	Kind   string        `json:"kind"`
	Target string        `json:"target"`
	For    time.Duration `json:"for_ns"`
	Delay  time.Duration `json:"delay_ns,omitempty"` // slow-replica: the added latency
	// Filled in when it ran.
	Began time.Duration `json:"began_ns"`
	Ended time.Duration `json:"ended_ns"`
	Err   string        `json:"err,omitempty"`
}

func (f Fault) String() string {
	s := fmt.Sprintf("%7.3fs %-17s %-6s for %.2fs", f.At.Seconds(), f.Kind, f.Target, f.For.Seconds())
	if f.Delay > 0 {
		s += fmt.Sprintf(" delay %dms", f.Delay.Milliseconds())
	}
	if f.Ended > 0 {
		s += fmt.Sprintf("  (ran %.3fs..%.3fs)", f.Began.Seconds(), f.Ended.Seconds())
	}
	if f.Err != "" {
		s += "  error: " + f.Err
	}
	return s
}

func dur(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int63n(int64(hi-lo)+1))
}

// planFaults draws faults one after the other between from and until, with gaps of 0.5-2 s.
// One fault at a time: each one's effect stays attributable in the histories.
func planFaults(cfg Config, nReplicas int, from, until time.Duration) []Fault {
	rng := cfg.rng(1)
	var kinds []string
	if cfg.Topology == "single" {
		kinds = []string{"kill-node", "pause-node", "kill-node-in-snapshot", "fill-disk"}
	} else if cfg.Topology == "sentinel" {
		// The primary is whichever node the sentinels name when the fault begins.
		kinds = []string{"pause-replica", "kill-replica", "kill-primary", "pause-primary", "kill-redis-replica", "isolate-primary"}
	} else {
		kinds = []string{"cut-replica", "blackhole-replica", "slow-replica", "pause-replica", "pause-redis", "kill-replica", "kill-redis"}
		if cfg.Broker != "" {
			kinds = append(kinds, "cut-replica-broker", "pause-broker")
		}
	}
	var plan []Fault
	t := from
	for {
		f := Fault{At: t, Kind: kinds[rng.Intn(len(kinds))]}
		switch f.Kind {
		case "cut-replica", "blackhole-replica", "slow-replica", "pause-replica", "kill-replica", "kill-node", "pause-node", "kill-node-in-snapshot", "cut-replica-broker":
			f.Target = fmt.Sprintf("n%d", 1+rng.Intn(nReplicas))
		case "kill-primary", "pause-primary", "isolate-primary":
			f.Target = "primary"
		case "kill-redis-replica":
			f.Target = "r-repl"
		default:
			f.Target = "redis"
		}
		switch f.Kind {
		case "cut-replica", "blackhole-replica", "pause-replica", "pause-node", "cut-replica-broker":
			// Up to 5 s: longer than a lock's 1 s lease, --redis-timeout-ms (1 s) and the
			// client's 2 s timeout.
			f.For = dur(rng, time.Second, 5*time.Second)
		case "slow-replica":
			f.For = dur(rng, time.Second, 5*time.Second)
			// Every chunk to and from Redis waits this long: below and above --redis-timeout-ms.
			f.Delay = dur(rng, 50*time.Millisecond, 1500*time.Millisecond)
		case "pause-redis":
			f.For = dur(rng, time.Second, 3*time.Second)
		case "pause-broker":
			f.Target = "mosquitto"
			f.For = dur(rng, time.Second, 3*time.Second)
		case "fill-disk":
			f.Target = "n1"
			f.For = dur(rng, time.Second, 4*time.Second)
		case "isolate-primary":
			// Past the 1 s down-after (the replica is promoted while the old primary still takes
			// stategate's connections), up to a failed election and its retry.
			f.For = dur(rng, 2*time.Second, 8*time.Second)
		case "pause-primary", "kill-primary":
			// Mostly past the sentinels' 1 s down-after (a failover; a failed election retries after
			// 2 x failover-timeout), sometimes back before it.
			f.For = dur(rng, 500*time.Millisecond, 8*time.Second)
		default: // kills: how long it stays down before the restart
			f.For = dur(rng, 500*time.Millisecond, 2*time.Second)
		}
		if f.At+f.For > until {
			return plan
		}
		plan = append(plan, f)
		t = f.At + f.For + dur(rng, 500*time.Millisecond, 2*time.Second)
	}
}

// Nemesis runs a plan against the cluster and logs each step to schedule.log.
type Nemesis struct {
	c    *Cluster
	h    *History
	plan []Fault
	log  *os.File
	mu   sync.Mutex
}

func newNemesis(c *Cluster, h *History, plan []Fault) (*Nemesis, error) {
	f, err := os.Create(filepath.Join(c.cfg.Out, "schedule.log"))
	if err != nil {
		return nil, err
	}
	n := &Nemesis{c: c, h: h, plan: plan, log: f}
	n.logf("seed %d topology %s skew %v: %d faults planned", c.cfg.Seed, c.cfg.Topology, c.cfg.Skew, len(plan))
	for _, p := range plan {
		n.logf("plan %s", p)
	}
	return n, nil
}

func (n *Nemesis) logf(format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fmt.Fprintf(n.log, "%8.3fs ", n.h.Now().Seconds())
	fmt.Fprintf(n.log, format+"\n", args...)
}

func (n *Nemesis) replica(id string) *Replica {
	for _, r := range n.c.Replicas {
		if r.ID == id {
			return r
		}
	}
	panic("no replica " + id)
}

// Run executes the plan in order, each fault at its planned time (or as soon as the previous
// one's recovery finished, if that ran late). stop ends it early; the cluster is healed after.
func (n *Nemesis) Run(stop <-chan struct{}) {
	for i := range n.plan {
		f := &n.plan[i]
		if wait := f.At - n.h.Now(); wait > 0 {
			select {
			case <-stop:
				return
			case <-time.After(wait):
			}
		}
		f.Began = n.h.Now()
		n.logf("begin %s %s for %.2fs", f.Kind, f.Target, f.For.Seconds())
		if err := n.apply(f); err != nil {
			f.Err = err.Error()
			n.logf("error %s %s: %v", f.Kind, f.Target, err)
		}
		f.Ended = n.h.Now()
		n.logf("end   %s %s", f.Kind, f.Target)
	}
}

// apply performs one fault and undoes it after f.For.
func (n *Nemesis) apply(f *Fault) error {
	switch f.Kind {
	case "cut-replica":
		px := n.c.Proxies[n.replicaIndex(f.Target)]
		px.SetCut(true)
		time.Sleep(f.For)
		px.SetCut(false)
		return nil
	case "cut-replica-broker":
		px := n.c.BrokerProxies[n.replicaIndex(f.Target)]
		px.SetCut(true)
		time.Sleep(f.For)
		px.SetCut(false)
		return nil
	case "pause-broker":
		if err := n.c.Broker.Pause(); err != nil {
			return err
		}
		time.Sleep(f.For)
		return n.c.Broker.Resume()
	case "blackhole-replica", "slow-replica":
		px := n.c.Proxies[n.replicaIndex(f.Target)]
		if f.Kind == "slow-replica" {
			px.SetMode(Delay, f.Delay)
		} else {
			px.SetMode(Blackhole, 0)
		}
		time.Sleep(f.For)
		px.SetMode(Pass, 0)
		return nil
	case "pause-replica", "pause-node":
		r := n.replica(f.Target)
		if err := r.Pause(); err != nil {
			return err
		}
		time.Sleep(f.For)
		return r.Resume()
	case "pause-redis":
		if err := n.c.Redis.Pause(); err != nil {
			return err
		}
		time.Sleep(f.For)
		return n.c.Redis.Resume()
	case "fill-disk":
		unfill, err := fillDisk(n.c.dataDisk)
		if err != nil {
			return err
		}
		n.c.unfill = unfill
		time.Sleep(f.For)
		n.c.unfill = nil
		return unfill()
	case "kill-replica", "kill-node", "kill-node-in-snapshot":
		r := n.replica(f.Target)
		if f.Kind == "kill-node-in-snapshot" {
			// Killed as soon as a snapshot is being written; after 3 s without one, killed anyway
			// (and said so).
			if snap := waitForSnapshot(n.c.dataDisk, 3*time.Second); snap != "" {
				n.logf("  killed while writing %s", snap)
			} else {
				n.logf("  no snapshot started within 3 s: killed outside one")
			}
		}
		r.Kill()
		time.Sleep(f.For)
		if err := r.Start(); err != nil {
			return err
		}
		return r.WaitReady(30 * time.Second)
	case "kill-primary", "pause-primary", "kill-redis-replica", "isolate-primary":
		p := n.c.primary()
		if p == nil {
			return fmt.Errorf("the sentinels name no primary")
		}
		if f.Kind == "kill-redis-replica" {
			p = n.c.otherData(p)
		}
		f.Target += "=" + p.Name
		n.logf("  %s is %s", f.Kind, p.Name)
		if f.Kind == "pause-primary" {
			if err := p.Pause(); err != nil {
				return err
			}
			time.Sleep(f.For)
			return p.Resume()
		}
		if f.Kind == "isolate-primary" {
			port, _ := strconv.Atoi(strings.Split(p.Addr, ":")[1])
			if err := n.c.part.isolate(port); err != nil {
				return err
			}
			time.Sleep(f.For)
			return n.c.part.heal()
		}
		p.Kill()
		time.Sleep(f.For)
		return n.c.restartData(p)
	case "kill-redis":
		n.c.Redis.Kill()
		time.Sleep(f.For)
		if err := n.c.Redis.Start(); err != nil {
			return err
		}
		return n.c.Redis.WaitReady(30 * time.Second)
	}
	return fmt.Errorf("unknown fault %s", f.Kind)
}

func (n *Nemesis) replicaIndex(id string) int {
	for i, r := range n.c.Replicas {
		if r.ID == id {
			return i
		}
	}
	panic("no replica " + id)
}
