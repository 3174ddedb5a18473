package faults

import (
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Config is the whole configuration of a run, read from the environment so that
// scripts/faults (and a human replaying a seed) drive the compiled test binary without flags.
type Config struct {
	Seed     int64
	Duration time.Duration
	Out      string
	Topology string // "redis", "sentinel" or "single"
	Skew     bool
	// SkewSeconds: the replicas' clocks run at +S, 0 and -S seconds (FAULTS_SKEW=1: 25 s, inside
	// the protocol's 60 s allowance; FAULTS_SKEW_SECONDS=S for any other, e.g. 90: beyond it).
	SkewSeconds int
	// ExpectViolation (FAULTS_EXPECT_VIOLATION=1) inverts the verdict: the test fails when no
	// checker finds anything. Only to show that the checkers catch a known bug (skewed clocks on
	// a binary without the fix); never for CI.
	ExpectViolation bool
	Bin             string
	// WaitReplicas is the sentinel topology's --redis-wait-replicas (FAULTS_WAIT_REPLICAS, default
	// 1: every write waits for the Redis replica). 0 measures what a failover loses without it.
	WaitReplicas int
	// RedisFsync is the Redis data nodes' persistence (FAULTS_REDIS_FSYNC): always (the default:
	// appendfsync always), everysec, or none (no AOF: a restarted Redis is empty).
	RedisFsync string
	// Broker: "" (each replica's embedded broker) or "mosquitto" (FAULTS_BROKER, redis topology:
	// the replicas share one external broker, broker.go).
	Broker    string
	Mosquitto string
	Redis     string
	FakeTime  string
}

const libFakeTime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

func loadConfig(t *testing.T) Config {
	t.Helper()
	c := Config{Topology: "redis", Duration: 30 * time.Second, FakeTime: libFakeTime}
	if s := os.Getenv("FAULTS_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("FAULTS_SEED=%q is not an int64: %v", s, err)
		}
		c.Seed = v
	} else {
		c.Seed = time.Now().UnixNano() % 1_000_000_000
	}
	if s := os.Getenv("FAULTS_SECONDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 10 {
			t.Fatalf("FAULTS_SECONDS=%q: want an integer >= 10", s)
		}
		c.Duration = time.Duration(v) * time.Second
	}
	if s := os.Getenv("FAULTS_TOPOLOGY"); s != "" {
		if s != "redis" && s != "single" && s != "sentinel" {
			t.Fatalf("FAULTS_TOPOLOGY=%q: want redis, sentinel or single", s)
		}
		c.Topology = s
	}
	c.Skew = os.Getenv("FAULTS_SKEW") == "1"
	if c.Skew {
		c.SkewSeconds = 25
	}
	if s := os.Getenv("FAULTS_SKEW_SECONDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v > 3600 {
			t.Fatalf("FAULTS_SKEW_SECONDS=%q: want an integer in 0..3600", s)
		}
		c.SkewSeconds, c.Skew = v, v > 0
	}
	c.ExpectViolation = os.Getenv("FAULTS_EXPECT_VIOLATION") == "1"
	if c.Skew && c.Topology == "single" {
		t.Fatalf("FAULTS_SKEW needs FAULTS_TOPOLOGY=redis or sentinel (skew is between replicas)")
	}
	c.WaitReplicas = 1
	if s := os.Getenv("FAULTS_WAIT_REPLICAS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v > 1 {
			t.Fatalf("FAULTS_WAIT_REPLICAS=%q: want 0 or 1 (the sentinel topology has one Redis replica)", s)
		}
		c.WaitReplicas = v
	}
	c.RedisFsync = "always"
	if s := os.Getenv("FAULTS_REDIS_FSYNC"); s != "" {
		if s != "always" && s != "everysec" && s != "none" {
			t.Fatalf("FAULTS_REDIS_FSYNC=%q: want always, everysec or none", s)
		}
		c.RedisFsync = s
	}
	if s := os.Getenv("FAULTS_BROKER"); s != "" && s != "embedded" {
		if s != "mosquitto" || c.Topology != "redis" {
			t.Fatalf("FAULTS_BROKER=%q: want embedded, or mosquitto with FAULTS_TOPOLOGY=redis", s)
		}
		c.Broker, c.Mosquitto = s, "/usr/sbin/mosquitto"
		if p := os.Getenv("MOSQUITTO"); p != "" {
			c.Mosquitto = p
		}
		if _, err := os.Stat(c.Mosquitto); err != nil {
			t.Fatalf("FAULTS_BROKER=mosquitto: no mosquitto at %s (set MOSQUITTO): %v", c.Mosquitto, err)
		}
	}
	c.Out = os.Getenv("FAULTS_OUT")
	if c.Out == "" {
		c.Out = t.TempDir()
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		t.Fatalf("output dir %s: %v", c.Out, err)
	}
	if abs, err := filepath.Abs(c.Out); err == nil {
		c.Out = abs
	}
	c.Bin = os.Getenv("STATEGATE_BIN")
	if c.Bin == "" {
		t.Fatalf("STATEGATE_BIN is not set (the stategate binary to test)")
	}
	if st, err := os.Stat(c.Bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("STATEGATE_BIN=%s is not an executable file", c.Bin)
	}
	if c.Topology != "single" {
		c.Redis = "/usr/bin/redis-server"
		if s := os.Getenv("REDIS_SERVER"); s != "" {
			c.Redis = s
		}
		if _, err := os.Stat(c.Redis); err != nil {
			t.Fatalf("redis-server not found at %s (set REDIS_SERVER): %v", c.Redis, err)
		}
	}
	if c.Skew {
		if _, err := os.Stat(c.FakeTime); err != nil {
			t.Fatalf("FAULTS_SKEW=1 needs libfaketime at %s (Debian package faketime): %v", c.FakeTime, err)
		}
	}
	return c
}

// rng returns a generator for one concern (nemesis schedule, a workload) derived from the
// seed, so that adding randomness to one concern does not shift the schedule of another.
func (c Config) rng(stream int64) *rand.Rand {
	return rand.New(rand.NewSource(c.Seed*1_000_003 + stream))
}

// redisPersistence is the redis-server arguments for c.RedisFsync.
func (c Config) redisPersistence() []string {
	if c.RedisFsync == "none" {
		return []string{"--appendonly", "no", "--save", ""}
	}
	return []string{"--appendonly", "yes", "--appendfsync", c.RedisFsync, "--save", ""}
}
