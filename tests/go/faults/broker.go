package faults

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The external broker (FAULTS_BROKER=mosquitto, redis topology): the replicas serve MQTT through
// one Mosquitto instead of their embedded brokers, sharing the requests as the share group
// `stategate` (docs/scaling.md), each reaching the broker through a proxy of its own so that the
// nemesis can cut one replica from the broker (cut-replica-broker) while it still reaches Redis.
// MQTT clients (the register door, the KEYNOTIFY watchers) connect to Mosquitto directly: which
// replica answers a request is the broker's choice.

const brokerShareGroup = "stategate"

func (c *Cluster) startBroker(t *testing.T) {
	t.Helper()
	port := freePort(t)
	dir := filepath.Join(c.cfg.Out, "mosquitto")
	os.RemoveAll(dir)
	os.MkdirAll(dir, 0o755)
	conf := filepath.Join(dir, "mosquitto.conf")
	// No persistence: a session lives as long as the broker runs. Unbounded in-flight and a deep
	// queue: the broker must not be what drops messages under the workloads.
	body := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\n"+
		"max_inflight_messages 0\nmax_queued_messages 100000\nlog_dest stderr\n", port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Broker = newProc("mosquitto", c.cfg.Mosquitto, []string{"-c", conf}, nil, c.cfg.Out)
	c.BrokerAddr = fmt.Sprintf("127.0.0.1:%d", port)
	if err := c.Broker.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor("mosquitto", 15*time.Second, c.Broker, func() bool {
		conn, err := net.DialTimeout("tcp", c.BrokerAddr, 300*time.Millisecond)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}); err != nil {
		t.Fatal(err)
	}
}

// brokerArgs are replica i's MQTT arguments with the external broker: its own proxy to it.
func (c *Cluster) brokerArgs(t *testing.T, i int) []string {
	t.Helper()
	px, err := newProxy(fmt.Sprintf("broker-proxy-n%d", i), c.BrokerAddr)
	if err != nil {
		t.Fatal(err)
	}
	c.BrokerProxies = append(c.BrokerProxies, px)
	return []string{"--mqtt-url", "mqtt://" + px.Addr(), "--mqtt-share-group", brokerShareGroup,
		"--mqtt-client-id", fmt.Sprintf("stategate-n%d", i)}
}
