package faults

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// A split brain for the sentinel topology: the Redis primary cut from the sentinels and from the
// other data node while the stategate replicas still reach it. The sentinels then promote the
// replica, and the old primary keeps taking connections from stategate until the partition heals
// and the sentinels demote it (it then drops whatever it took meanwhile). This is the partition
// in which Jepsen found Sentinel deployments losing acknowledged writes.
//
// The harness's TCP proxy cannot make it: Sentinel hands its clients the data nodes' real
// addresses, so stategate and the sentinels would pass the same proxy. So the data nodes and the
// sentinels run as an unprivileged user (partitionUID) and an nftables rule drops that user's
// packets to the isolated node's port: the sentinels' and the other node's connections to it
// stall, while stategate's (root's) pass. Each run has its own table, named after its process,
// and its rules name only its own ports, so concurrent runs do not interfere; tables left by a
// run that was killed are removed by the next one.

// partitionUID is nobody: no other process on the machine connects as it on loopback.
const partitionUID = 65534

const nftTablePrefix = "stategate_faults_"

type partitioner struct {
	nft   string
	table string
}

func newPartitioner() (*partitioner, error) {
	nft, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("the sentinel topology's split brain needs nft (Debian package nftables; scripts/test installs it): %w", err)
	}
	p := &partitioner{nft: nft, table: fmt.Sprintf("%s%d", nftTablePrefix, os.Getpid())}
	p.removeStale()
	if err := p.run("add", "table", "inet", p.table); err != nil {
		return nil, err
	}
	if err := p.run("add", "chain", "inet", p.table, "out", "{ type filter hook output priority 0 ; policy accept ; }"); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *partitioner) run(args ...string) error {
	out, err := exec.Command(p.nft, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// isolate drops every packet the partition user sends to port: the sentinels and the other data
// node lose the node listening there.
func (p *partitioner) isolate(port int) error {
	return p.run("add", "rule", "inet", p.table, "out", "meta", "skuid", strconv.Itoa(partitionUID),
		"tcp", "dport", strconv.Itoa(port), "drop")
}

// heal removes every rule of the run.
func (p *partitioner) heal() error {
	return p.run("flush", "chain", "inet", p.table, "out")
}

func (p *partitioner) close() {
	_ = p.run("delete", "table", "inet", p.table)
}

var staleTable = regexp.MustCompile(`table inet ` + nftTablePrefix + `(\d+)`)

// removeStale deletes the tables of runs whose process is gone.
func (p *partitioner) removeStale() {
	out, err := exec.Command(p.nft, "list", "tables").Output()
	if err != nil {
		return
	}
	for _, m := range staleTable.FindAllStringSubmatch(string(out), -1) {
		pid, _ := strconv.Atoi(m[1])
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = p.run("delete", "table", "inet", nftTablePrefix+m[1])
		}
	}
}

// asPartitionUser makes dir (recursively created) writable by the partition user, for the data
// nodes' AOF and the sentinels' rewritten configuration.
func asPartitionUser(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chown(dir, partitionUID, partitionUID)
}
