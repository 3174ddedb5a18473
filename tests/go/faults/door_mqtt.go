package faults

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/iot-operations-sdks/go/mqtt"
	"github.com/Azure/iot-operations-sdks/go/mqtt/retry"
	"github.com/Azure/iot-operations-sdks/go/protocol"
	protoerrors "github.com/Azure/iot-operations-sdks/go/protocol/errors"
	"github.com/Azure/iot-operations-sdks/go/services/statestore"
)

// The MQTT door of the register workload: the official Azure IoT Operations Go SDK (session
// client and state store client) on each replica's embedded broker. The protocol has no
// compare-and-set by version, so this door only reads (GET) and writes (SET).
//
// Values: the HTTP door saves a JSON string, which stategate stores as its JSON text ("c1-42"
// is stored as the 7 bytes `"c1-42"`), and MQTT carries stored bytes verbatim; as the gRPC
// door does, this one writes the JSON text and decodes it on reads, so that a key holds one
// value whichever door wrote or reads it.
//
// How a call's outcome is classified, and why:
//   - A request is only handed to the SDK while the session is connected and subscribed. The
//     session client queues a publish while it is disconnected and sends it after a reconnect,
//     whenever that is, so a request handed over can never be called "not sent". One never
//     handed over (no connection within mqttConnectWait) is Fail.
//   - No answer within mqttCallTimeout (a paused replica, a dropped connection) is Unknown: the
//     queued or already delivered request may still be executed later, which the register
//     checker allows for an unknown write (possibly applied at any later time).
//   - A `-ERR` payload (statestore.ServiceError) is Fail: stategate answers those only for
//     requests it refused before changing anything (syntax, timestamps, fencing, quota).
//   - `__stat` 400/415/505 (a broken envelope: the service did not parse the command) is Fail.
//     So is 507, the full disk's refusal, which changed nothing (as the HTTP door's 507: see
//     Reply.Unknown). The SDK keeps no status number for it (UnknownError, like 403, 429 and
//     a bare 500), so it is known by stategate's status message.
//     Any other `__stat` is Unknown: 503 is both "busy, not run" and "the storage is
//     unavailable" (a replica cut from Redis, whose write may have reached Redis before the
//     timeout), and the SDK does not tell them apart (errors.StateInvalid for both); 500 says
//     nothing either way.
//   - Anything else from the SDK (a timeout, a cancelled context, an undecodable answer, an
//     answer whose __ts the SDK's HLC refused) is Unknown.

const (
	mqttCallTimeout   = 2 * time.Second
	mqttConnectWait   = time.Second
	mqttSessionExpiry = 30 // seconds the broker keeps a dropped session for a reconnect
	// The status message of stategate's `__stat=507` (crates/mqtt/src/payload.rs).
	mqttStorageFull = "the storage is full; writes are refused"
)

// mqttApps: one HLC per replica. The SDK merges every __ts it receives into its application's
// clock and sends that clock as __ts; shared by all replicas under skewed clocks, it would carry
// the fastest replica's time to the slowest (50 s ahead at ±25 s, near the 60 s refusal).
var mqttApps sync.Map // replica id -> *protocol.Application

func mqttApp(r *Replica) (*protocol.Application, error) {
	if a, ok := mqttApps.Load(r.ID); ok {
		return a.(*protocol.Application), nil
	}
	a, err := protocol.NewApplication()
	if err != nil {
		return nil, err
	}
	a2, _ := mqttApps.LoadOrStore(r.ID, a)
	return a2.(*protocol.Application), nil
}

var mqttClientSeq atomic.Int64

// mqttSession is one SDK session client on one replica's broker with a state store client on
// it (and, for a KEYNOTIFY watcher, an invoker of its own for KEYNOTIFY: see
// watch_keynotify.go). It is never reused after its session is lost: a replica's restart
// loses the broker's sessions, the SDK then stops the session client for good
// (SessionLostError), and a new session with a new client id takes its place.
type mqttSession struct {
	id string
	mc *mqtt.SessionClient
	ss *statestore.Client[string, string]
	kn *protocol.CommandInvoker[[]byte, []byte]

	ready  chan struct{} // closed once the response (and notification) topics are subscribed
	dead   chan struct{} // closed when the session client stopped for good, or at close
	events chan struct{} // a connect, disconnect or death happened (coalesced)
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	up      bool // connected, as the SDK's connect/disconnect events last said
	conns   int  // connections made so far (connect events)
	fatal   string
	once    sync.Once
	undoers []func()
}

func dialMQTT(r *Replica, role string, keynotify bool) (*mqttSession, error) {
	host, portS, err := net.SplitHostPort(r.MQTT)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portS, 10, 16)
	if err != nil {
		return nil, err
	}
	app, err := mqttApp(r)
	if err != nil {
		return nil, err
	}
	// A fresh id per session: a reused one could resume another session's state on the broker.
	id := fmt.Sprintf("faults-%s-%s-%d-%d", role, r.ID, os.Getpid(), mqttClientSeq.Add(1))
	mc, err := mqtt.NewSessionClient(id, mqtt.TCPConnection(host, uint16(port)),
		mqtt.WithCleanStart(true),
		mqtt.WithSessionExpiry(mqttSessionExpiry),
		// Short: a paused replica must not hold a connection attempt for long, and a restarted
		// one should be found within about half a second.
		mqtt.WithConnectionTimeout(mqttCallTimeout),
		mqtt.WithConnectionRetry(&retry.ExponentialBackoff{MinInterval: 100 * time.Millisecond, MaxInterval: 500 * time.Millisecond}),
	)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &mqttSession{id: id, mc: mc, ready: make(chan struct{}), dead: make(chan struct{}),
		events: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	// Registered before Start so that no connection goes uncounted. The SDK calls these in
	// goroutines of their own, so they may run a little after the fact; nothing here relies on
	// them being immediate, only on every connection being reported eventually.
	s.undoers = append(s.undoers,
		mc.RegisterConnectEventHandler(func(*mqtt.ConnectEvent) {
			s.mu.Lock()
			s.up, s.conns = true, s.conns+1
			s.mu.Unlock()
			s.signal()
		}),
		mc.RegisterDisconnectEventHandler(func(*mqtt.DisconnectEvent) {
			s.mu.Lock()
			s.up = false
			s.mu.Unlock()
			s.signal()
		}),
		mc.RegisterFatalErrorHandler(func(err error) {
			s.mu.Lock()
			s.fatal = err.Error()
			s.mu.Unlock()
			s.kill()
		}))
	// One notification at a time, so those of one key reach their channel in the order the
	// SDK hands them over (with the default, a goroutine each, they can overtake each other).
	ss, err := statestore.New[string, string](app, mc, statestore.WithConcurrency(1))
	if err != nil {
		s.close()
		return nil, err
	}
	s.ss = ss
	listeners := protocol.Listeners{ss}
	if keynotify {
		tokens := protocol.WithTopicTokens{"clientId": strings.ToUpper(hex.EncodeToString([]byte(id)))}
		s.kn, err = protocol.NewCommandInvoker(app, mc, protocol.Raw{}, protocol.Raw{},
			"statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",
			protocol.WithResponseTopicPrefix("clients/{clientId}"),
			// Not the state store client's "response": two invokers on one response topic
			// would each see (and log as unknown) the other's answers.
			protocol.WithResponseTopicSuffix("keynotify"),
			tokens)
		if err != nil {
			s.close()
			return nil, err
		}
		listeners = append(listeners, s.kn)
	}
	if err := mc.Start(); err != nil {
		s.close()
		return nil, err
	}
	go func() {
		// Subscribing waits for the first connection; it ends with the session.
		if err := listeners.Start(ctx); err != nil {
			return
		}
		if keynotify {
			// The SDK's notification receiver never subscribes: services v0.4.1 adds the
			// command invoker to its listeners twice and the receiver not at all. An embedded
			// broker, which hands notifications to their client without a subscription, hides
			// that; Mosquitto delivers nothing. The receiver's handler is registered, so a
			// subscription of our own feeds it.
			filter := "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/" +
				strings.ToUpper(hex.EncodeToString([]byte(id))) + "/command/notify/+"
			if ack, err := mc.Subscribe(ctx, filter, mqtt.WithQoS(1)); err != nil || (ack != nil && ack.ReasonCode >= 0x80) {
				s.mu.Lock()
				s.fatal = fmt.Sprintf("subscribe to notifications: %v", err)
				s.mu.Unlock()
				s.kill()
				return
			}
		}
		close(s.ready)
		s.signal()
	}()
	return s, nil
}

func (s *mqttSession) signal() {
	select {
	case s.events <- struct{}{}:
	default:
	}
}

func (s *mqttSession) kill() {
	s.once.Do(func() { close(s.dead); s.cancel() })
	s.signal()
}

func (s *mqttSession) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

func (s *mqttSession) isReady() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// state: connected (as last reported) and how many connections were made.
func (s *mqttSession) state() (up bool, conns int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up, s.conns
}

// usable waits up to d for the session to be subscribed and connected.
func (s *mqttSession) usable(ctx context.Context, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		if up, _ := s.state(); up && s.isReady() && !s.isDead() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-s.dead:
			return false
		case <-deadline.C:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *mqttSession) close() {
	s.kill()
	for _, u := range s.undoers {
		u()
	}
	// The session client first: the listeners' UNSUBSCRIBE then gives up at once instead of
	// waiting for a broker that may be paused.
	_ = s.mc.Stop()
	if s.ss != nil {
		s.ss.Close()
	}
	if s.kn != nil {
		s.kn.Close()
	}
}

// mqttDoor holds one session per replica, made at the first call and replaced when lost.
type mqttDoor struct {
	mu       sync.Mutex
	sessions map[string]*mqttSession
	closed   bool
}

func newMQTTDoor(cfg Config, replicas []*Replica) (*mqttDoor, error) {
	d := &mqttDoor{sessions: map[string]*mqttSession{}}
	for _, r := range replicas {
		if _, err := d.session(r); err != nil {
			d.Close()
			return nil, fmt.Errorf("mqtt door on %s: %w", r.ID, err)
		}
	}
	return d, nil
}

func (*mqttDoor) name() string { return "mqtt" }
func (*mqttDoor) canCAS() bool { return false }

func (d *mqttDoor) session(r *Replica) (*mqttSession, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("mqtt door closed")
	}
	s := d.sessions[r.ID]
	if s != nil && !s.isDead() {
		return s, nil
	}
	if s != nil {
		go s.close()
	}
	s, err := dialMQTT(r, "reg", false)
	if err != nil {
		delete(d.sessions, r.ID)
		return nil, err
	}
	d.sessions[r.ID] = s
	return s, nil
}

func (d *mqttDoor) Close() {
	d.mu.Lock()
	d.closed = true
	ss := d.sessions
	d.sessions = map[string]*mqttSession{}
	d.mu.Unlock()
	for _, s := range ss {
		s.close()
	}
}

// ready returns a connected session, or marks op failed: nothing was handed to the SDK.
func (d *mqttDoor) ready(ctx context.Context, r *Replica, op *Op) *mqttSession {
	s, err := d.session(r)
	if err == nil && !s.usable(ctx, mqttConnectWait) {
		err = errors.New("not connected; request not sent")
	}
	if err != nil {
		op.Outcome, op.Err = Fail, "mqtt: "+err.Error()
		// Rate-limits the worker like a refused HTTP connection (backoff reads "refused").
		op.Err += " (refused)"
		return nil
	}
	return s
}

func (d *mqttDoor) read(ctx context.Context, r *Replica, op *Op) {
	s := d.ready(ctx, r, op)
	if s == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, mqttCallTimeout)
	defer cancel()
	res, err := s.ss.Get(cctx, op.Key, statestore.WithTimeout(mqttCallTimeout))
	if err != nil {
		op.Outcome, op.Err = mqttFailure(err)
		return
	}
	// Absent: no value and no version (GET miss carries no __ts).
	if res.Version.IsZero() {
		op.Outcome = OK
		return
	}
	var v string
	if err := json.Unmarshal([]byte(res.Value), &v); err != nil {
		op.Outcome, op.Err = Unknown, "undecodable value: "+res.Value
		return
	}
	op.Outcome, op.Value, op.ETag = OK, v, res.Version.String()
}

func (d *mqttDoor) write(ctx context.Context, r *Replica, op *Op) {
	s := d.ready(ctx, r, op)
	if s == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, mqttCallTimeout)
	defer cancel()
	val, _ := json.Marshal(op.Value)
	res, err := s.ss.Set(cctx, op.Key, string(val), statestore.WithTimeout(mqttCallTimeout))
	switch {
	case err != nil:
		op.Outcome, op.Err = mqttFailure(err)
	case !res.Value:
		// `:-1`, "condition not met": not applied. An unconditional SET never gets it.
		op.Outcome, op.Err = Fail, "mqtt: SET not applied (:-1) version "+res.Version.String()
	default:
		op.Outcome = OK
		if !res.Version.IsZero() {
			op.ETag = res.Version.String()
		}
	}
}

func (d *mqttDoor) cas(_ context.Context, _ *Replica, op *Op, _ string) {
	op.Outcome, op.Err = Fail, "mqtt: no compare-and-set by version"
}

// mqttFailure classifies an SDK error (see the top of this file).
func mqttFailure(err error) (Outcome, string) {
	msg := "mqtt: " + err.Error()
	var se statestore.ServiceError
	if errors.As(err, &se) {
		return Fail, msg
	}
	var re *protoerrors.Remote
	if errors.As(err, &re) {
		switch re.Kind.(type) {
		case protoerrors.HeaderMissing, protoerrors.HeaderInvalid, protoerrors.PayloadInvalid, protoerrors.UnsupportedVersion:
			return Fail, fmt.Sprintf("%s (%s)", msg, re.Kind)
		case protoerrors.UnknownError:
			if strings.HasPrefix(re.Message, mqttStorageFull) {
				return Fail, fmt.Sprintf("%s (%s)", msg, re.Kind)
			}
		}
		return Unknown, fmt.Sprintf("%s (%s)", msg, re.Kind)
	}
	var ce *protoerrors.Client
	if errors.As(err, &ce) && ce.Kind != nil {
		return Unknown, fmt.Sprintf("%s (%s)", msg, ce.Kind)
	}
	return Unknown, msg
}
