package faults

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// freePort picks a loopback port nothing listens on, for a process the test starts next.
// Never fixed ports: several runs (and the integration tests) may share the machine. The port
// is below the kernel's ephemeral range (ip_local_port_range), not one from a bind to port 0:
// the kernel hands ephemeral ports to every outgoing connection and every bind to port 0, so one
// of those could take the port before the child binds it, or while a killed process is down
// before its restart on the same port. Below the range only another explicit pick can; this
// process never hands a port out twice, and starts at a random place so that concurrent runs
// rarely try the same ports.
func freePort(t *testing.T) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	const lowest = 10000
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	if span := low - lowest; span >= 1000 {
		start := rand.IntN(span)
		for i := 0; i < span; i++ {
			port := lowest + (start+i)%span
			if portsGiven[port] {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue
			}
			l.Close()
			portsGiven[port] = true
			return port
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// Proc is one child process that can be killed, paused and restarted with the same command line
// (so the same ports). Each runs in its own process group so that a signal reaches all of it and
// nothing of the test's own group.
type Proc struct {
	Name string
	path string
	args []string
	env  []string
	out  string // directory for <name>.log
	// extra is appended to args at the next Start (a Redis data node restarted as a replica of
	// whichever node is primary by then).
	extra []string
	// uid, when not 0, is the user the process runs as (partition.go).
	uid int

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	starts  int
	stopped bool // SIGSTOPped
}

func newProc(name, path string, args, env []string, out string) *Proc {
	return &Proc{Name: name, path: path, args: args, env: env, out: out}
}

// Start launches the process; its stdout and stderr are appended to <out>/<name>.log, each start
// marked, so a restart's log follows the previous one's.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s already running", p.Name)
	}
	f, err := os.OpenFile(filepath.Join(p.out, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.starts++
	args := append(append([]string{}, p.args...), p.extra...)
	fmt.Fprintf(f, "=== start %d: %s %s\n", p.starts, p.path, strings.Join(args, " "))
	cmd := exec.Command(p.path, args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Pdeathsig: if the test process itself is killed (a timeout of whoever runs it), its
	// servers die with it instead of outliving the run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if p.uid != 0 {
		// Go sets the parent-death signal after switching users, so it survives the switch.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(p.uid), Gid: uint32(p.uid)}
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	p.cmd, p.done, p.stopped = cmd, done, false
	return nil
}

func (p *Proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s not running", p.Name)
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Pause sends SIGSTOP; Resume SIGCONT.
func (p *Proc) Pause() error {
	err := p.signal(syscall.SIGSTOP)
	p.mu.Lock()
	p.stopped = err == nil
	p.mu.Unlock()
	return err
}

func (p *Proc) Resume() error {
	err := p.signal(syscall.SIGCONT)
	p.mu.Lock()
	p.stopped = false
	p.mu.Unlock()
	return err
}

// Kill sends SIGKILL to the group and waits for the process to be gone, so that a restart finds
// its ports free.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// Running reports whether the process was started and has not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// waitFor polls ready every 50 ms until it holds or the deadline passes. Polling is fine for
// readiness: nothing is measured here.
func waitFor(what string, timeout time.Duration, p *Proc, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ready() {
			return nil
		}
		if p != nil && !p.Running() {
			return fmt.Errorf("%s exited before it was ready (see %s.log)", what, p.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %v", what, timeout)
}

// Replica is one stategate process and the addresses of its doors, fixed for its life so
// that a restarted replica is found where it was.
type Replica struct {
	*Proc
	ID   string
	HTTP string // base URL
	GRPC string // host:port of statestore.v1 and the Dapr runtime RPCs
	MQTT string // host:port of its embedded broker
}

func (r *Replica) healthy() bool {
	c := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get(r.HTTP + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// WaitReady waits for /healthz to answer 200.
func (r *Replica) WaitReady(timeout time.Duration) error {
	return waitFor(r.Name, timeout, r.Proc, r.healthy)
}

// Redis is the redis-server process of the redis topology.
type Redis struct {
	*Proc
	Addr string
}

func (r *Redis) ping() bool {
	c, err := net.DialTimeout("tcp", r.Addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	// While it loads the AOF after a restart Redis answers -LOADING: not ready yet.
	return err == nil && strings.HasPrefix(line, "+PONG")
}

func (r *Redis) WaitReady(timeout time.Duration) error {
	return waitFor("redis-server", timeout, r.Proc, r.ping)
}

// Cluster is the running topology.
type Cluster struct {
	cfg      Config
	Redis    *Redis
	Proxies  []*Proxy
	Replicas []*Replica
	// The sentinel topology (sentinel.go): the data nodes and the sentinels.
	Data      []*Redis
	Sentinels []*Redis
	// part isolates a data node from the sentinels and the other node (the sentinel topology).
	part     *partitioner
	partHome string // the partition user's files, removed at the end
	// The external broker (broker.go): Mosquitto and each replica's proxy to it.
	Broker        *Proc
	BrokerAddr    string
	BrokerProxies []*Proxy
	// dataDisk is the single node's data directory, a tmpfs of its own (disk.go).
	dataDisk string
	// unfill removes the file of a fill-disk fault in progress.
	unfill func() error
}

func startCluster(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	c := &Cluster{cfg: cfg}
	// Registered first so it runs even when a later start fails the test.
	t.Cleanup(c.shutdown)
	if cfg.Topology == "single" {
		// A reused output directory must not hand the run another run's keys: the checkers
		// assume every key starts absent.
		dir := filepath.Join(cfg.Out, "data-n1")
		os.RemoveAll(dir)
		if err := mountDataDisk(dir); err != nil {
			t.Fatal(err)
		}
		c.dataDisk = dir
		c.Replicas = append(c.Replicas, c.newReplica(t, 1, []string{"--data-dir", dir,
			"--segment-bytes", fmt.Sprint(singleSegmentBytes)}, nil))
	} else if cfg.Topology == "sentinel" {
		storage := c.startSentinel(t)
		for i := 1; i <= 3; i++ {
			c.Replicas = append(c.Replicas, c.newReplica(t, i, storage, skewEnv(cfg, i)))
		}
	} else {
		dir := filepath.Join(cfg.Out, "redis")
		os.RemoveAll(dir)
		os.MkdirAll(dir, 0o755)
		if cfg.Broker != "" {
			c.startBroker(t)
		}
		port := freePort(t)
		// appendfsync always by default: an acknowledged write is on disk, so a SIGKILL of Redis
		// may lose nothing that stategate acknowledged (FAULTS_REDIS_FSYNC measures the others).
		args := []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir,
			"--protected-mode", "no"}
		args = append(args, cfg.redisPersistence()...)
		c.Redis = &Redis{Proc: newProc("redis", cfg.Redis, args, nil, cfg.Out), Addr: fmt.Sprintf("127.0.0.1:%d", port)}
		if err := c.Redis.Start(); err != nil {
			t.Fatal(err)
		}
		if err := c.Redis.WaitReady(15 * time.Second); err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 3; i++ {
			px, err := newProxy(fmt.Sprintf("proxy-n%d", i), c.Redis.Addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Proxies = append(c.Proxies, px)
			args := []string{"--storage", "redis://" + px.Addr()}
			if cfg.Broker != "" {
				args = append(args, c.brokerArgs(t, i)...)
			}
			c.Replicas = append(c.Replicas, c.newReplica(t, i, args, skewEnv(cfg, i)))
		}
	}
	for _, r := range c.Replicas {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range c.Replicas {
		if err := r.WaitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// skewEnv runs replica i (from 1) under libfaketime when the run asks for skew.
func skewEnv(cfg Config, i int) []string {
	if !cfg.Skew {
		return nil
	}
	// One replica ahead of the real clock, one on it, one behind.
	offset := fmt.Sprintf("%+ds", []int{cfg.SkewSeconds, 0, -cfg.SkewSeconds}[(i-1)%3])
	return []string{"LD_PRELOAD=" + cfg.FakeTime, "FAKETIME=" + offset, "FAKETIME_DONT_FAKE_MONOTONIC=1"}
}

func (c *Cluster) newReplica(t *testing.T, i int, storage, env []string) *Replica {
	port, grpc := freePort(t), freePort(t)
	id := fmt.Sprintf("n%d", i)
	args := append(storage, "--node-id", id, "--http-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--grpc-listen", fmt.Sprintf("127.0.0.1:%d", grpc), "--log-level", "info",
		// A SIGKILL/restart should not wait for the grace of a clean stop.
		"--shutdown-grace", "1s")
	// MQTT clients of this replica reach it through its embedded broker, or through the
	// external broker that all replicas share.
	mqtt := c.BrokerAddr
	if c.Broker == nil {
		mqtt = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		args = append(args, "--mqtt-listen", mqtt)
	}
	return &Replica{Proc: newProc(id, c.cfg.Bin, args, env, c.cfg.Out), ID: id, HTTP: fmt.Sprintf("http://127.0.0.1:%d", port),
		GRPC: fmt.Sprintf("127.0.0.1:%d", grpc), MQTT: mqtt}
}

// heal undoes every fault: every proxy passes, every process runs (restarted if dead,
// continued if stopped), and everything is ready again.
func (c *Cluster) heal() error {
	for _, px := range append(c.Proxies, c.BrokerProxies...) {
		px.SetCut(false)
	}
	if c.Broker != nil {
		c.Broker.Resume()
	}
	if c.part != nil {
		if err := c.part.heal(); err != nil {
			return err
		}
	}
	if c.unfill != nil {
		if err := c.unfill(); err != nil {
			return err
		}
		c.unfill = nil
	}
	if c.Redis != nil {
		if !c.Redis.Running() {
			if err := c.Redis.Start(); err != nil {
				return err
			}
		} else {
			c.Redis.Resume()
		}
		if err := c.Redis.WaitReady(30 * time.Second); err != nil {
			return err
		}
	}
	if c.Sentinels != nil {
		if err := c.healSentinel(); err != nil {
			return err
		}
	}
	for _, r := range c.Replicas {
		if !r.Running() {
			if err := r.Start(); err != nil {
				return err
			}
		} else {
			r.Resume()
		}
	}
	for _, r := range c.Replicas {
		if err := r.WaitReady(30 * time.Second); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) shutdown() {
	for _, r := range c.Replicas {
		r.Kill()
	}
	for _, px := range append(c.Proxies, c.BrokerProxies...) {
		px.Close()
	}
	if c.Broker != nil {
		c.Broker.Kill()
	}
	if c.Redis != nil {
		c.Redis.Kill()
	}
	for _, r := range append(c.Data, c.Sentinels...) {
		r.Kill()
	}
	if c.part != nil {
		c.part.close()
	}
	if c.partHome != "" {
		os.RemoveAll(c.partHome)
	}
	if c.dataDisk != "" {
		unmountDataDisk(c.dataDisk)
	}
}
