package faults

import (
	"testing"
	"time"
)

func TestFaults(t *testing.T) {
	cfg := loadConfig(t)
	t.Logf("seed %d topology %s skew %v duration %v out %s", cfg.Seed, cfg.Topology, cfg.Skew, cfg.Duration, cfg.Out)
	c := startCluster(t, cfg)
	t.Logf("cluster up: %d replicas", len(c.Replicas))
	time.Sleep(time.Second)
	if err := c.heal(); err != nil {
		t.Fatal(err)
	}
}
