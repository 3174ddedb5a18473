//! Prometheus metrics, and the link state readiness reads.
//!
//! One [`Metrics`] handle per process, created in `main` and passed down like the engine
//! handle (a cheap `Clone`). Every series a request touches is created the first time and
//! cached in a slot: the hot path does an atomic load, an atomic add and a lock-free histogram
//! observation, never a label lookup or a format. Gauges that show engine or storage state
//! (keys, bytes, registrations) are read when `/metrics` is scraped, not on every write.
//! [`Metrics::disabled`] records nothing (`--no-metrics`, and the benchmark's baseline).
//!
//! Crate: `prometheus` 0.14 (already in the tree through rmqtt): its histograms are lock-free,
//! where `prometheus-client`'s take a mutex per observation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Which door served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Mqtt,
    Http,
    Grpc,
    /// The Dapr pluggable component socket.
    Component,
}

impl Door {
    const ALL: [Door; 4] = [Door::Mqtt, Door::Http, Door::Grpc, Door::Component];
    pub fn label(self) -> &'static str {
        match self {
            Door::Mqtt => "mqtt",
            Door::Http => "http",
            Door::Grpc => "grpc",
            Door::Component => "dapr_component",
        }
    }
}

/// What a request asked for, across doors (Dapr's save is a set, its bulk get a bulk get...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    Get,
    Set,
    Del,
    VDel,
    KeyNotify,
    Scan,
    BulkGet,
    Transaction,
    Query,
    ListKeys,
    /// A change stream: server-sent events, gRPC Watch.
    Watch,
    Other,
}

impl Cmd {
    const COUNT: usize = 12;
    pub fn label(self) -> &'static str {
        match self {
            Cmd::Get => "get",
            Cmd::Set => "set",
            Cmd::Del => "del",
            Cmd::VDel => "vdel",
            Cmd::KeyNotify => "keynotify",
            Cmd::Scan => "scan",
            Cmd::BulkGet => "bulk_get",
            Cmd::Transaction => "transaction",
            Cmd::Query => "query",
            Cmd::ListKeys => "list_keys",
            Cmd::Watch => "watch",
            Cmd::Other => "other",
        }
    }

    /// A state store verb as the MQTT door receives it (RESP bulk string, any case).
    pub fn from_verb(verb: &[u8]) -> Cmd {
        const VERBS: [(&[u8], Cmd); 6] = [
            (b"GET", Cmd::Get),
            (b"SET", Cmd::Set),
            (b"DEL", Cmd::Del),
            (b"VDEL", Cmd::VDel),
            (b"KEYNOTIFY", Cmd::KeyNotify),
            (b"SCAN", Cmd::Scan),
        ];
        VERBS
            .iter()
            .find(|(v, _)| v.eq_ignore_ascii_case(verb))
            .map_or(Cmd::Other, |(_, c)| *c)
    }

    /// A gRPC method (the last segment of the path) of statestore.v1, the Dapr runtime or
    /// the Dapr state component.
    pub fn from_grpc_method(method: &str) -> Cmd {
        match method {
            "Get" | "GetState" => Cmd::Get,
            "Set" | "SaveState" | "BulkSet" => Cmd::Set,
            "Del" | "Delete" | "DeleteState" | "BulkDelete" | "DeleteBulkState" => Cmd::Del,
            "VDel" => Cmd::VDel,
            "Scan" => Cmd::Scan,
            "Watch" => Cmd::Watch,
            "GetBulkState" | "BulkGet" => Cmd::BulkGet,
            "ExecuteStateTransaction" | "Transact" => Cmd::Transaction,
            "QueryStateAlpha1" | "Query" => Cmd::Query,
            _ => Cmd::Other,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The caller's request was refused (bad input, a condition, authorization, quota).
    ClientError,
    /// Busy or the storage unreachable: retrying later may work.
    Unavailable,
    /// A fault of the service.
    Error,
}

impl Outcome {
    const ALL: [Outcome; 4] = [Outcome::Ok, Outcome::ClientError, Outcome::Unavailable, Outcome::Error];
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::Unavailable => "unavailable",
            Outcome::Error => "error",
        }
    }

    /// From an HTTP status (also the MQTT `__stat`).
    pub fn from_status(status: u16) -> Outcome {
        match status {
            503 => Outcome::Unavailable,
            500..=599 => Outcome::Error,
            400..=499 => Outcome::ClientError,
            _ => Outcome::Ok,
        }
    }

    /// From a gRPC status code.
    pub fn from_grpc(code: i32) -> Outcome {
        match code {
            0 => Outcome::Ok,
            14 => Outcome::Unavailable,
            // UNKNOWN, INTERNAL, DATA_LOSS
            2 | 13 | 15 => Outcome::Error,
            _ => Outcome::ClientError,
        }
    }
}

/// Latency buckets, seconds: 50 us .. 5 s.
const LATENCY_BUCKETS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The series of one (door, command), created on first use.
struct Slot {
    by_outcome: [IntCounter; 4],
    latency: Histogram,
}

/// Which streams are counted as open.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    Sse,
    GrpcWatch,
}

/// The MQTT link of the service (its own client connection, or in-broker serving).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Down,
    Connected,
    Subscribed,
}

struct Handles {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    slots: Vec<OnceLock<Slot>>,
    streams: IntGaugeVec,
    notifications_sent: IntCounter,
    notifications_withheld: IntCounter,
    notifications_dropped: IntCounter,
    /// The state topics mirror (`--state-topics`), per outcome of a change.
    state_topics: IntCounterVec,
    /// Retained state replays at SUBSCRIBE (embedded broker), per [`StateTopicReplay`].
    state_topics_replay: IntCounterVec,
    state_topics_retained_reads: IntCounterVec,
    registrations: IntGauge,
    observing_clients: IntGauge,
    keys: IntGauge,
    value_bytes: IntGauge,
    storage_writable: IntGauge,
    expired: IntCounter,
    mqtt_connected: IntGauge,
    mqtt_subscribed: IntGauge,
    mqtt_reconnects: IntCounter,
    mqtt_busy: IntCounter,
    redelivery_hits: IntCounter,
    response_cache_bytes: IntGauge,
    feed_held: IntGauge,
    storage_write: Histogram,
    commit_batch: Histogram,
    fsync: Histogram,
    snapshots: IntCounterVec,
    broker_connections: IntGauge,
    broker_messages: IntCounterVec,
}

/// Readiness inputs that exist whether metrics are recorded or not.
#[derive(Default)]
struct State {
    link: std::sync::atomic::AtomicU8,
    ever_connected: AtomicBool,
    /// Values last copied from cumulative engine counters (to turn them into counter adds).
    last_dropped: AtomicU64,
    last_expired: AtomicU64,
}

struct Inner {
    handles: Option<Handles>,
    state: State,
}

/// The process's metrics (and the MQTT link state). Cheap to clone.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("enabled", &self.0.handles.is_some())
            .finish()
    }
}

impl Default for Metrics {
    /// Disabled: nothing is recorded (the link state still is).
    fn default() -> Metrics {
        Metrics::disabled()
    }
}

impl Metrics {
    /// A registry with every metric family registered.
    pub fn new() -> Metrics {
        Metrics(Arc::new(Inner {
            handles: Some(Handles::new()),
            state: State::default(),
        }))
    }

    pub fn disabled() -> Metrics {
        Metrics(Arc::new(Inner {
            handles: None,
            state: State::default(),
        }))
    }

    /// [`Metrics::new`] or [`Metrics::disabled`].
    pub fn enabled(on: bool) -> Metrics {
        if on { Metrics::new() } else { Metrics::disabled() }
    }

    pub fn is_enabled(&self) -> bool {
        self.0.handles.is_some()
    }

    /// Counts a finished request and its latency since `started`.
    #[inline]
    pub fn request(&self, door: Door, cmd: Cmd, outcome: Outcome, started: Instant) {
        if let Some(h) = &self.0.handles {
            let slot = h.slot(door, cmd);
            slot.by_outcome[outcome as usize].inc();
            slot.latency.observe(started.elapsed().as_secs_f64());
        }
    }

    /// Counts a stream as open until the guard is dropped.
    pub fn stream_opened(&self, stream: Stream) -> StreamGuard {
        let gauge = self.0.handles.as_ref().map(|h| {
            let label = match stream {
                Stream::Sse => "sse",
                Stream::GrpcWatch => "grpc_watch",
            };
            let g = h.streams.with_label_values(&[label]);
            g.inc();
            g
        });
        StreamGuard(gauge)
    }

    /// `n` KEYNOTIFY notifications sent (one change to `n` observers).
    pub fn notifications_sent(&self, n: usize) {
        if let Some(h) = &self.0.handles {
            h.notifications_sent.inc_by(n as u64);
        }
    }

    pub fn notification_withheld(&self) {
        if let Some(h) = &self.0.handles {
            h.notifications_withheld.inc();
        }
    }

    /// A change the state topics mirror published, or did not (see [`StateTopicOutcome`]).
    pub fn state_topic(&self, outcome: StateTopicOutcome) {
        if let Some(h) = &self.0.handles {
            h.state_topics.with_label_values(&[outcome.label()]).inc();
        }
    }

    /// `n` more of what the retained state replays count (see [`StateTopicReplay`]).
    pub fn state_topics_replay(&self, what: StateTopicReplay, n: u64) {
        if let Some(h) = &self.0.handles {
            h.state_topics_replay.with_label_values(&[what.label()]).inc_by(n);
        }
    }

    /// A read of what an external broker retained under the mirror's prefix.
    pub fn state_topics_retained_read(&self, outcome: RetainedRead) {
        if let Some(h) = &self.0.handles {
            h.state_topics_retained_reads
                .with_label_values(&[outcome.label()])
                .inc();
        }
    }

    pub fn redelivery_hit(&self) {
        if let Some(h) = &self.0.handles {
            h.redelivery_hits.inc();
        }
    }

    pub fn mqtt_busy(&self) {
        if let Some(h) = &self.0.handles {
            h.mqtt_busy.inc();
        }
    }

    /// The service's MQTT link changed state.
    pub fn mqtt_link(&self, link: Link) {
        let s = &self.0.state;
        s.link.store(link as u8, Ordering::Relaxed);
        let reconnect = link == Link::Connected && s.ever_connected.swap(true, Ordering::Relaxed);
        if let Some(h) = &self.0.handles {
            h.mqtt_connected.set(i64::from(link != Link::Down));
            h.mqtt_subscribed.set(i64::from(link == Link::Subscribed));
            if reconnect {
                h.mqtt_reconnects.inc();
            }
        }
    }

    /// Whether the MQTT door receives requests (subscribed, or served inside the broker).
    pub fn mqtt_subscribed(&self) -> bool {
        self.0.state.link.load(Ordering::Relaxed) == Link::Subscribed as u8
    }

    /// One storage write (a swap) took since `started`.
    #[inline]
    pub fn storage_write(&self, started: Instant) {
        if let Some(h) = &self.0.handles {
            h.storage_write.observe(started.elapsed().as_secs_f64());
        }
    }

    /// A group commit of the durable log acknowledged `writes` writes.
    pub fn commit(&self, writes: usize) {
        if let Some(h) = &self.0.handles {
            h.commit_batch.observe(writes as f64);
        }
    }

    /// An fdatasync of the durable log that began at `started` ended.
    pub fn fsync(&self, started: Instant) {
        if let Some(h) = &self.0.handles {
            h.fsync.observe(started.elapsed().as_secs_f64());
        }
    }

    /// A snapshot (compaction of the log) ended.
    pub fn snapshot(&self, ok: bool) {
        if let Some(h) = &self.0.handles {
            h.snapshots.with_label_values(&[if ok { "ok" } else { "error" }]).inc();
        }
    }

    /// A message the embedded broker received (`in`) or delivered (`out`).
    pub fn broker_message(&self, inbound: bool) {
        if let Some(h) = &self.0.handles {
            h.broker_messages
                .with_label_values(&[if inbound { "in" } else { "out" }])
                .inc();
        }
    }

    /// Copies what the parts of the service report (keys, bytes, registrations...) into the
    /// gauges, then renders the text exposition format. `None` when metrics are disabled.
    pub async fn render(&self, sources: &Sources) -> Option<String> {
        let h = self.0.handles.as_ref()?;
        let m = sources.read().await;
        let set = |g: &IntGauge, v: Option<u64>| {
            if let Some(v) = v {
                g.set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        };
        set(&h.keys, m.keys);
        set(&h.value_bytes, m.value_bytes);
        set(&h.storage_writable, m.storage_writable.map(u64::from));
        set(&h.registrations, m.registrations);
        set(&h.observing_clients, m.observing_clients);
        set(&h.feed_held, m.feed_held);
        set(&h.response_cache_bytes, m.response_cache_bytes);
        set(&h.broker_connections, m.broker_connections);
        if let Some(n) = m.keynotify_dropped {
            add_to(&h.notifications_dropped, &self.0.state.last_dropped, n);
        }
        if let Some(n) = m.expired {
            add_to(&h.expired, &self.0.state.last_expired, n);
        }
        let mut out = String::new();
        match prometheus::TextEncoder::new().encode_utf8(&h.registry.gather(), &mut out) {
            Ok(()) => Some(out),
            Err(e) => {
                tracing::warn!(cause = %e, "rendering metrics failed");
                Some(String::new())
            }
        }
    }
}

/// Raises `counter` to `now`, a cumulative value kept elsewhere.
fn add_to(counter: &IntCounter, last: &AtomicU64, now: u64) {
    let before = last.swap(now, Ordering::Relaxed);
    if now > before {
        counter.inc_by(now - before);
    }
}

/// Holds a stream's place in the open-streams gauge.
#[derive(Debug)]
pub struct StreamGuard(Option<IntGauge>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(g) = &self.0 {
            g.dec();
        }
    }
}

impl Handles {
    fn new() -> Handles {
        let registry = Registry::new_custom(Some("stategate".into()), None).unwrap_or_default();
        let reg = |c: Box<dyn prometheus::core::Collector>| {
            if let Err(e) = registry.register(c) {
                tracing::warn!(cause = %e, "a metric could not be registered");
            }
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).unwrap_or_else(|e| unreachable_metric(name, e));
            reg(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).unwrap_or_else(|e| unreachable_metric(name, e));
            reg(Box::new(g.clone()));
            g
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .unwrap_or_else(|e| unreachable_metric(name, e));
            reg(Box::new(h.clone()));
            h
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| unreachable_metric(name, e));
            reg(Box::new(c.clone()));
            c
        };
        let requests = counter_vec(
            "requests_total",
            "Requests answered, by door, command and outcome.",
            &["door", "command", "outcome"],
        );
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "request_duration_seconds",
                "Time to answer a request, by door and command.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["door", "command"],
        )
        .unwrap_or_else(|e| unreachable_metric("request_duration_seconds", e));
        reg(Box::new(latency.clone()));
        let streams = IntGaugeVec::new(
            Opts::new("streams_active", "Change streams open: server-sent events, gRPC Watch."),
            &["kind"],
        )
        .unwrap_or_else(|e| unreachable_metric("streams_active", e));
        reg(Box::new(streams.clone()));
        let pow2 = (0..14).map(|i| f64::from(1u32 << i)).collect();
        Handles {
            requests,
            latency,
            slots: (0..Door::ALL.len() * Cmd::COUNT).map(|_| OnceLock::new()).collect(),
            streams,
            notifications_sent: counter(
                "keynotify_notifications_sent_total",
                "KEYNOTIFY notifications published.",
            ),
            notifications_withheld: counter(
                "keynotify_notifications_withheld_total",
                "KEYNOTIFY notifications not sent because the rules in force no longer let the observer observe the key.",
            ),
            notifications_dropped: counter(
                "keynotify_notifications_dropped_total",
                "KEYNOTIFY notifications dropped because the notification queue was full.",
            ),
            state_topics: counter_vec(
                "state_topics_messages_total",
                "Changes of keys the state topics mirror handled: published, skipped (the key cannot be a topic) or withheld (external broker: an anonymous caller may not read the key).",
                &["outcome"],
            ),
            state_topics_replay: counter_vec(
                "state_topics_replay_total",
                "Retained state served per SUBSCRIBE by the embedded broker: messages queued (matching and readable only), store entries examined, replays truncated at --state-topics-replay-max, SUBSCRIBEs refused a replay (--state-topics-replays-per-client).",
                &["what"],
            ),
            state_topics_retained_reads: counter_vec(
                "state_topics_retained_reads_total",
                "Reads of what an external broker retained under the state topics prefix (to clear topics of keys that went): read, refused (the broker refused the subscription) or failed; stale topics are cleared only after a read.",
                &["outcome"],
            ),
            registrations: gauge("keynotify_registrations", "KEYNOTIFY registrations (client, key)."),
            observing_clients: gauge("keynotify_clients", "Clients with at least one KEYNOTIFY registration."),
            keys: gauge("keys", "Keys stored (expired keys not yet removed included)."),
            value_bytes: gauge("value_bytes", "Bytes of stored values (memory and durable storage)."),
            storage_writable: gauge(
                "storage_writable",
                "1 while the storage takes writes; 0 while its disk is full or its log failed.",
            ),
            expired: counter("expired_keys_total", "Keys removed because their time to live ended."),
            mqtt_connected: gauge("mqtt_connected", "1 while the service's MQTT connection is up."),
            mqtt_subscribed: gauge(
                "mqtt_subscribed",
                "1 while the MQTT door receives requests (subscribed, or inside the broker).",
            ),
            mqtt_reconnects: counter("mqtt_reconnects_total", "MQTT connections made again after the first."),
            mqtt_busy: counter(
                "mqtt_busy_total",
                "MQTT requests refused with __stat=503 (over a limit).",
            ),
            redelivery_hits: counter(
                "mqtt_redelivery_hits_total",
                "Redelivered MQTT writes answered from the response cache.",
            ),
            response_cache_bytes: gauge("mqtt_response_cache_bytes", "Bytes of answers kept for redeliveries."),
            feed_held: gauge(
                "change_feed_bytes",
                "Bytes of changes kept for change streams to resume from.",
            ),
            storage_write: histogram(
                "storage_write_duration_seconds",
                "Time of one storage write (an atomic swap), any backend.",
                LATENCY_BUCKETS.to_vec(),
            ),
            commit_batch: histogram(
                "storage_commit_batch_writes",
                "Writes per group commit of the durable log.",
                pow2,
            ),
            fsync: histogram(
                "storage_fsync_duration_seconds",
                "Time of one fdatasync of the durable log.",
                LATENCY_BUCKETS.to_vec(),
            ),
            snapshots: counter_vec(
                "storage_snapshots_total",
                "Snapshots written (each compacts the durable log), by result.",
                &["result"],
            ),
            broker_connections: gauge("broker_connections", "MQTT connections to the embedded broker."),
            broker_messages: counter_vec(
                "broker_messages_total",
                "Messages through the embedded broker: in = published to it, out = delivered by it.",
                &["direction"],
            ),
            registry,
        }
    }

    #[inline]
    fn slot(&self, door: Door, cmd: Cmd) -> &Slot {
        self.slots[door as usize * Cmd::COUNT + cmd as usize].get_or_init(|| {
            let (d, c) = (door.label(), cmd.label());
            Slot {
                by_outcome: Outcome::ALL.map(|o| self.requests.with_label_values(&[d, c, o.label()])),
                latency: self.latency.with_label_values(&[d, c]),
            }
        })
    }
}

/// Metric names and help texts are constants: a failure is a bug caught by the unit tests.
fn unreachable_metric<T>(name: &str, e: prometheus::Error) -> T {
    panic!("metric {name} is malformed: {e}")
}

mod gauges;
mod state_topics;
pub use gauges::{GaugeReadings, GaugeSource, Sources};
pub use state_topics::{RetainedRead, StateTopicOutcome, StateTopicReplay};

#[cfg(test)]
mod tests;
