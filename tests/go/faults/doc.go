// Package faults is a Jepsen-style fault-injection test bed for stategate (issue 28).
//
// TestFaults starts a topology (FAULTS_TOPOLOGY: redis = one Redis with AOF and 3 replicas, each
// through its own cuttable proxy; sentinel = a primary, a replica and 3 sentinels under 3
// replicas with --redis-wait-replicas 1; single = one durable node), runs workloads through it
// while nemeses partition, blackhole, slow, pause, kill and restart processes on a seeded
// schedule (optionally with the replicas' clocks skewed by libfaketime), then heals everything
// and checks the recorded histories: a linearizable CAS register per key (porcupine), fencing
// tokens and mutual exclusion of a Dapr lock, acknowledged writes kept on every replica, and
// complete, ordered watchers. Configuration is by environment: see config.go; scripts/faults
// runs it for long runs.
package faults
