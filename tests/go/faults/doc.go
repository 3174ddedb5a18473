// Package faults is a Jepsen-style fault-injection test bed for stategate (issue 28).
//
// TestFaults starts a topology (Redis + 3 replicas, or a single durable node), runs
// workloads through it while nemeses partition, pause, kill and restart processes on a
// seeded schedule, then heals everything and checks the recorded histories.
// Configuration is by environment: see config.go.
package faults
