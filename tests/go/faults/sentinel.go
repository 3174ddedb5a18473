package faults

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The sentinel topology: two Redis data nodes (r1 primary, r2 its replica, both with AOF
// appendfsync always), three sentinels (quorum 2) and three stategate replicas on
// `redis+sentinel://` with --redis-wait-replicas 1. With one Redis replica, N = 1 is "every
// replica Sentinel may promote", the setting docs/redis.md says keeps every acknowledged write
// across a failover. The replicas reach the data nodes directly (Sentinel hands out the real
// addresses), so this topology has no per-replica proxies: its faults are pauses and kills of the
// data nodes (failovers; a paused primary comes back still believing it is primary, a split
// brain until Sentinel demotes it), the primary cut from the sentinels and the other node while
// stategate still reaches it (partition.go), and pauses and kills of the replicas.

const sentinelService = "stategate"

// Sentinel-side timings: a primary unreachable for 1 s is down, so the nemesis's 0.5-8 s pauses
// and kills of the primary fall on both sides of it; a short failover-timeout lets a split
// election among the 3 sentinels retry within the fault.
const (
	sentinelDownAfterMs = 1000
	sentinelFailoverMs  = 3000
)

func (c *Cluster) startSentinel(t *testing.T) []string {
	t.Helper()
	cfg := c.cfg
	part, err := newPartitioner()
	if err != nil {
		t.Fatal(err)
	}
	c.part = part
	// The data nodes and sentinels run as the partition user, who may not reach the output
	// directory (under /root, say): their files live in a temporary directory of their own.
	home, err := os.MkdirTemp("", "stategate-faults-sentinel-")
	if err != nil {
		t.Fatal(err)
	}
	c.partHome = home
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("r%d", i)
		dir := filepath.Join(home, name)
		if err := asPartitionUser(dir); err != nil {
			t.Fatal(err)
		}
		port := freePort(t)
		args := []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir,
			"--protected-mode", "no"}
		args = append(args, cfg.redisPersistence()...)
		r := &Redis{Proc: newProc(name, cfg.Redis, args, nil, cfg.Out), Addr: fmt.Sprintf("127.0.0.1:%d", port)}
		r.uid = partitionUID
		if i == 2 {
			r.extra = []string{"--replicaof", "127.0.0.1", strings.Split(c.Data[0].Addr, ":")[1]}
		}
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		if err := r.WaitReady(15 * time.Second); err != nil {
			t.Fatal(err)
		}
		c.Data = append(c.Data, r)
	}
	if err := waitFor("r2 replicating r1", 30*time.Second, c.Data[1].Proc, func() bool {
		return strings.Contains(infoReplication(c.Data[1].Addr), "master_link_status:up")
	}); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("s%d", i)
		dir := filepath.Join(home, name)
		if err := asPartitionUser(dir); err != nil {
			t.Fatal(err)
		}
		port := freePort(t)
		// Sentinel rewrites its configuration file: each has its own.
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %s 2\n"+
			"sentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s %d\n",
			port, dir, sentinelService, strings.Split(c.Data[0].Addr, ":")[1],
			sentinelService, sentinelDownAfterMs, sentinelService, sentinelFailoverMs)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(conf, partitionUID, partitionUID); err != nil {
			t.Fatal(err)
		}
		s := &Redis{Proc: newProc(name, cfg.Redis, []string{conf, "--sentinel"}, nil, cfg.Out), Addr: fmt.Sprintf("127.0.0.1:%d", port)}
		s.uid = partitionUID
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if err := s.WaitReady(15 * time.Second); err != nil {
			t.Fatal(err)
		}
		c.Sentinels = append(c.Sentinels, s)
		addrs = append(addrs, s.Addr)
	}
	if err := c.waitSentinelHealthy(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	return []string{"--storage", "redis+sentinel://" + strings.Join(addrs, ",") + "/" + sentinelService,
		"--redis-wait-replicas", strconv.Itoa(cfg.WaitReplicas)}
}

// primary is the data node the sentinels name (the first that answers), or nil.
func (c *Cluster) primary() *Redis {
	for _, s := range c.Sentinels {
		v, err := respCmd(s.Addr, "SENTINEL", "get-master-addr-by-name", sentinelService)
		arr, ok := v.([]any)
		if err != nil || !ok || len(arr) != 2 {
			continue
		}
		addr := fmt.Sprintf("%v:%v", arr[0], arr[1])
		for _, d := range c.Data {
			if d.Addr == addr {
				return d
			}
		}
	}
	return nil
}

// otherData is the data node that is not p.
func (c *Cluster) otherData(p *Redis) *Redis {
	if c.Data[0] == p {
		return c.Data[1]
	}
	return c.Data[0]
}

// restartData starts a killed data node again: as a replica of the node the sentinels name when
// that is another one (so it does not come back as a second primary with old data), else as the
// primary it was (it comes back with its AOF: nothing acknowledged lost).
func (c *Cluster) restartData(d *Redis) error {
	d.extra = nil
	if p := c.primary(); p != nil && p != d {
		d.extra = []string{"--replicaof", "127.0.0.1", strings.Split(p.Addr, ":")[1]}
	}
	if err := d.Start(); err != nil {
		return err
	}
	return d.WaitReady(30 * time.Second)
}

// waitSentinelHealthy waits until every sentinel names the same primary, that node says it is
// the primary, and the other node replicates it: writes with --redis-wait-replicas 1 can
// succeed again.
func (c *Cluster) waitSentinelHealthy(timeout time.Duration) error {
	return waitFor("sentinel topology healthy", timeout, nil, func() bool {
		p := c.primary()
		if p == nil {
			return false
		}
		for _, s := range c.Sentinels {
			v, err := respCmd(s.Addr, "SENTINEL", "get-master-addr-by-name", sentinelService)
			arr, ok := v.([]any)
			if err != nil || !ok || len(arr) != 2 || fmt.Sprintf("%v:%v", arr[0], arr[1]) != p.Addr {
				return false
			}
		}
		return strings.Contains(infoReplication(p.Addr), "role:master") &&
			strings.Contains(infoReplication(c.otherData(p).Addr), "master_link_status:up") &&
			strings.Contains(infoReplication(c.otherData(p).Addr), "master_port:"+strings.Split(p.Addr, ":")[1])
	})
}

// healSentinel: every data node and sentinel runs and is continued; a data node that came back
// as a primary beside the real one is left to the sentinels to demote, which waitSentinelHealthy
// awaits.
func (c *Cluster) healSentinel() error {
	for _, s := range c.Sentinels {
		if !s.Running() {
			if err := s.Start(); err != nil {
				return err
			}
		} else {
			s.Resume()
		}
	}
	for _, d := range c.Data {
		if !d.Running() {
			if err := c.restartData(d); err != nil {
				return err
			}
		} else {
			d.Resume()
		}
	}
	return c.waitSentinelHealthy(90 * time.Second)
}

func infoReplication(addr string) string {
	v, err := respCmd(addr, "INFO", "replication")
	if err != nil {
		return ""
	}
	s, _ := v.(string)
	return strings.ReplaceAll(s, "\r", "")
}

// respCmd sends one command to a Redis or Sentinel and reads its reply: a few lines of RESP2
// rather than a client library for the handful of questions the harness asks.
func respCmd(addr string, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return readResp(bufio.NewReader(conn))
}

func readResp(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readResp(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}
