package faults

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/Azure/iot-operations-sdks/go/protocol"
)

// mqttMGet: the invariant workload's snapshot read over MQTT, stategate's MGET extension (the
// SDK has no MGET, so the request goes through a raw command invoker of the session, as
// KEYNOTIFY does). The answer is an array with, per key, `$-1` (absent) or [value, version]
// (docs/sliding-expiry-and-mget.md).
type mqttMGet struct {
	mu       sync.Mutex
	sessions map[string]*mqttSession
	closed   bool
}

func newMQTTMGet() *mqttMGet { return &mqttMGet{sessions: map[string]*mqttSession{}} }

func (*mqttMGet) name() string { return "mqtt" }

func (m *mqttMGet) session(r *Replica) (*mqttSession, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errors.New("closed")
	}
	if s := m.sessions[r.ID]; s != nil && !s.isDead() {
		return s, nil
	} else if s != nil {
		go s.close()
	}
	// keynotify: the session with a raw invoker (its notification subscription goes unused).
	s, err := dialMQTT(r, "mget", true)
	if err != nil {
		delete(m.sessions, r.ID)
		return nil, err
	}
	m.sessions[r.ID] = s
	return s, nil
}

func (m *mqttMGet) Close() {
	m.mu.Lock()
	m.closed = true
	ss := m.sessions
	m.sessions = map[string]*mqttSession{}
	m.mu.Unlock()
	for _, s := range ss {
		s.close()
	}
}

func (m *mqttMGet) getMany(ctx context.Context, r *Replica, keys []string) ([]string, []bool, opResult) {
	s, err := m.session(r)
	if err == nil && !s.usable(ctx, mqttConnectWait) {
		err = errors.New("not connected; request not sent")
	}
	if err != nil {
		return nil, nil, opResult{Fail, "mqtt: " + err.Error() + " (refused)"}
	}
	req := fmt.Appendf(nil, "*%d\r\n$4\r\nMGET\r\n", len(keys)+1)
	for _, k := range keys {
		req = fmt.Appendf(req, "$%d\r\n%s\r\n", len(k), k)
	}
	cctx, cancel := context.WithTimeout(ctx, mqttCallTimeout)
	defer cancel()
	res, err := s.kn.Invoke(cctx, req, protocol.WithTimeout(mqttCallTimeout))
	if err != nil {
		// Only answered reads are checked: whether it ran does not matter.
		return nil, nil, opResult{Unknown, "mqtt: " + err.Error()}
	}
	vals, present, err := parseMGet(res.Payload, len(keys))
	if err != nil {
		return nil, nil, opResult{Unknown, err.Error()}
	}
	return vals, present, opResult{Outcome: OK}
}

// parseMGet reads MGET's answer: `*n`, then per key `$-1` or `*2` with the value and version.
func parseMGet(payload []byte, n int) ([]string, []bool, error) {
	rd := bufio.NewReader(bytes.NewReader(payload))
	line := func() (string, error) {
		l, err := rd.ReadString('\n')
		if err != nil || len(l) < 3 {
			return "", fmt.Errorf("MGET answer %q: truncated", payload)
		}
		return l[:len(l)-2], nil
	}
	bulk := func(head string) (string, bool, error) {
		if head == "$-1" || head == "_" {
			return "", false, nil
		}
		if head == "" || head[0] != '$' {
			return "", false, fmt.Errorf("MGET answer %q: %q is not a bulk string", payload, head)
		}
		size, err := strconv.Atoi(head[1:])
		if err != nil || size < 0 {
			return "", false, fmt.Errorf("MGET answer %q: bad length %q", payload, head)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			return "", false, fmt.Errorf("MGET answer %q: truncated", payload)
		}
		return string(b[:size]), true, nil
	}
	head, err := line()
	if err != nil {
		return nil, nil, err
	}
	if head != fmt.Sprintf("*%d", n) {
		return nil, nil, fmt.Errorf("MGET answer %q: want an array of %d", payload, n)
	}
	vals, present := make([]string, n), make([]bool, n)
	for i := 0; i < n; i++ {
		h, err := line()
		if err != nil {
			return nil, nil, err
		}
		if h != "*2" {
			if _, ok, err := bulk(h); err != nil || ok {
				return nil, nil, fmt.Errorf("MGET answer %q: item %d is neither absent nor [value, version]", payload, i)
			}
			continue
		}
		vh, err := line()
		if err != nil {
			return nil, nil, err
		}
		if vals[i], present[i], err = bulk(vh); err != nil {
			return nil, nil, err
		}
		verh, err := line()
		if err != nil {
			return nil, nil, err
		}
		if _, _, err := bulk(verh); err != nil {
			return nil, nil, err
		}
	}
	return vals, present, nil
}
