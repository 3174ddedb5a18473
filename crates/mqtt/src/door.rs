//! What both MQTT transports share: admission (bounded work), the redelivery cache, the pure
//! request handler, and KEYNOTIFY notifications. A transport (the rumqttc client in
//! [`super::service`], the in-broker hooks in `super::inbroker`) only moves packets: it turns a
//! PUBLISH into a [`Request`], asks [`Door::admit`], runs [`Door::serve`] and publishes what
//! comes back through its [`Sink`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tracing::{debug, warn};

use super::dedup::{Dedup, Seen};
use super::mirror::{Mirror, Retained, StateTopics};
use super::request::{
    self, Caller, Outgoing, PROP_PROTOCOL_VERSION, PROP_SOURCE_ID, PROP_TIMESTAMP, PROTOCOL_VERSION, Request,
};
use crate::access::limits::{PerKeyCounts, PerKeySlot};
use crate::access::{Access, Op, Principal};
use crate::engine::notify::EVERY_KEY_OBSERVER;
use crate::engine::{ChangeKind, Engine, KeyNotification, KeyNotifyReceiver, RequestId};

/// Where a transport publishes answers and notifications.
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    async fn publish(&self, out: &Outgoing);

    /// Publishes one change's KEYNOTIFY notification to each of `observers` (client id, its
    /// notification topic), in that order; `out` holds all but the topic. Through a client
    /// connection the broker routes each by subscriptions like anything else; in the broker it
    /// also reaches an observer that never subscribed (see `inbroker::BrokerSink`), and the
    /// packet is built once for all of them.
    async fn notify(&self, out: &Outgoing, observers: &[(Arc<str>, String)]) {
        let mut out = out.clone();
        for (_, topic) in observers {
            out.topic.clone_from(topic);
            self.publish(&out).await;
        }
    }

    /// Publishes a retained message of the state topics mirror, at QoS 1.
    async fn publish_retained(&self, msg: &Retained);

    /// Who observer `client_id` is for the rules, as its requests were judged (see
    /// `request::principal`). Through a client connection the broker vouches for nothing:
    /// the id (registered from the request's `__srcId`) counts only when `--mqtt-trust-src-id`
    /// says so.
    async fn observer(&self, access: &Access, client_id: &str) -> Principal {
        Principal {
            client_id: access.trust_src_id().then(|| client_id.to_owned()),
            ..Principal::default()
        }
    }
}

/// Limits on the work the MQTT door takes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorLimits {
    /// Requests executing at once; past it a request is answered `__stat=503` at once.
    pub max_inflight: usize,
    /// Bytes of request payloads executing at once; past it, `__stat=503`.
    pub max_inflight_bytes: usize,
    /// Requests of one caller executing at once. In the broker, a connection past it waits
    /// (its packets are not read meanwhile); through a client connection, `__stat=503`.
    pub max_inflight_per_caller: usize,
    /// Embedded broker: answers waiting in one client's session (it does not take them); past
    /// it the client's requests are answered `__stat=503` without running.
    pub max_queued_answers: usize,
    /// How long an answer is kept to resend on a QoS 1 redelivery.
    pub response_cache_ttl: Duration,
    /// Most answers kept for redeliveries, and their bytes.
    pub response_cache_entries: usize,
    pub response_cache_bytes: usize,
}

impl Default for DoorLimits {
    fn default() -> DoorLimits {
        DoorLimits {
            max_inflight: 8192,
            max_inflight_bytes: 256 * 1024 * 1024,
            max_inflight_per_caller: 256,
            max_queued_answers: 64,
            response_cache_ttl: Duration::from_secs(60),
            response_cache_entries: 100_000,
            response_cache_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Request payloads are admitted in units of this many bytes.
const BYTE_UNIT: usize = 1024;

/// The shared serving path of the MQTT door.
pub struct Door {
    engine: Engine,
    access: Access,
    service_id: String,
    limits: DoorLimits,
    dedup: Dedup,
    inflight: Arc<Semaphore>,
    inflight_units: Arc<Semaphore>,
    /// Requests in flight per caller.
    per_caller: PerKeyCounts,
    refused_busy: AtomicU64,
    metrics: crate::metrics::Metrics,
    /// Set at shutdown: nothing more is admitted.
    closed: std::sync::atomic::AtomicBool,
    /// The state topics mirror, when asked for (`--state-topics`).
    state_topics: Option<StateTopics>,
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Door")
            .field("service_id", &self.service_id)
            .finish_non_exhaustive()
    }
}

/// A request let in: holds its share of the limits until dropped.
#[derive(Debug)]
pub struct Admitted {
    _count: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
    _caller: Option<PerKeySlot>,
}

impl Door {
    pub fn new(engine: Engine, service_id: String, limits: DoorLimits) -> Door {
        let units = limits
            .max_inflight_bytes
            .div_ceil(BYTE_UNIT)
            .clamp(1, Semaphore::MAX_PERMITS);
        Door {
            dedup: Dedup::new(
                limits.response_cache_ttl,
                limits.response_cache_entries,
                limits.response_cache_bytes,
            ),
            inflight: Arc::new(Semaphore::new(limits.max_inflight.clamp(1, Semaphore::MAX_PERMITS))),
            inflight_units: Arc::new(Semaphore::new(units)),
            per_caller: PerKeyCounts::default(),
            refused_busy: AtomicU64::new(0),
            metrics: crate::metrics::Metrics::disabled(),
            closed: Default::default(),
            state_topics: None,
            access: Access::open(),
            engine,
            service_id,
            limits,
        }
    }

    /// The door, recording its requests in `metrics`.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Door {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// The same door, deciding who may do what with `access`.
    pub fn with_access(mut self, access: Access) -> Door {
        self.access = access;
        self
    }

    /// The same door, mirroring state on MQTT topics when `topics` says so.
    pub fn with_state_topics(mut self, topics: Option<StateTopics>) -> Door {
        self.state_topics = topics;
        self
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The state topics mirror, if asked for.
    pub fn mirror(&self) -> Option<Mirror> {
        let topics = self.state_topics.clone()?;
        Some(Mirror::new(topics, self.access.clone(), self.metrics.clone()))
    }

    /// Takes the engine's notifications (see [`Engine::keynotify_feed`]), with every change
    /// for the state topics mirror when there is one.
    pub fn keynotify_feed(&self) -> Option<KeyNotifyReceiver> {
        let every_key = self.state_topics.as_ref().map(StateTopics::every_key);
        self.engine.keynotify_feed_with(every_key)
    }

    pub fn access(&self) -> &Access {
        &self.access
    }

    pub fn service_id(&self) -> &str {
        &self.service_id
    }

    pub fn limits(&self) -> &DoorLimits {
        &self.limits
    }

    /// Answers kept for redeliveries, and their bytes.
    pub fn response_cache_held(&self) -> (usize, usize) {
        self.dedup.held()
    }

    /// Admits nothing more (shutdown): new requests are answered `__stat=503`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Whether [`Door::close`] was called (the service is stopping).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Resolves once no admitted request is running.
    pub async fn drained(&self) {
        let all = u32::try_from(self.limits.max_inflight.max(1)).unwrap_or(u32::MAX);
        let _ = self.inflight.acquire_many(all).await;
    }

    /// Requests refused with `__stat=503` so far.
    pub fn refused_busy(&self) -> u64 {
        self.refused_busy.load(Ordering::Relaxed)
    }

    /// Lets a request in, or `None` when a limit is reached (answer it with [`Door::busy`]).
    /// `caller` is counted against the per-caller limit when given. Never waits.
    pub fn admit(&self, req: &Request, caller: Option<&str>) -> Option<Admitted> {
        if self.closed.load(Ordering::Relaxed) {
            return None;
        }
        let count = self.inflight.clone().try_acquire_owned().ok()?;
        let units = req.payload.len().div_ceil(BYTE_UNIT).max(1);
        let units = u32::try_from(units).ok()?;
        let bytes = self.inflight_units.clone().try_acquire_many_owned(units).ok()?;
        let caller = match caller {
            None => None,
            Some(key) => Some(self.per_caller.try_take(key, self.limits.max_inflight_per_caller)?),
        };
        Some(Admitted {
            _count: count,
            _bytes: bytes,
            _caller: caller,
        })
    }

    /// The `__stat=503` answer for a request that was not let in (`None`: not answerable).
    pub fn busy(&self, req: &Request) -> Option<Outgoing> {
        let n = self.refused_busy.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.mqtt_busy();
        if n.is_power_of_two() {
            warn!(refused_total = n, "mqtt: busy; requests refused with __stat=503");
        }
        request::busy(&self.service_id, req)
    }

    /// Runs an admitted request and returns the answer to publish, if any. A write redelivered
    /// within the cache's lifetime gets the first answer again without running twice; a copy
    /// that arrives while the first still runs gets nothing (the first one answers).
    pub async fn serve(&self, req: &Request, caller: &Caller) -> Option<Arc<Outgoing>> {
        let started = std::time::Instant::now();
        let (cmd, key_len) = super::observe::verb_and_key_len(&req.payload);
        let span = tracing::debug_span!(
            target: stategate_telemetry::REQUEST_SPANS,
            "request",
            door = "mqtt",
            command = cmd.label(),
            key_len,
            request_id = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if !span.is_disabled()
            && let Some(c) = &req.correlation
        {
            span.record("request_id", hex::encode(c));
        }
        let out = tracing::Instrument::instrument(self.serve_unobserved(req, caller), span.clone()).await;
        if let Some(out) = &out {
            let outcome = super::observe::outcome(out);
            span.record("outcome", outcome.label());
            self.metrics.request(crate::metrics::Door::Mqtt, cmd, outcome, started);
        }
        out
    }

    async fn serve_unobserved(&self, req: &Request, caller: &Caller) -> Option<Arc<Outgoing>> {
        // GET and SCAN change nothing: a redelivered copy may simply run again.
        let mut key = None;
        if let (Some(t), Some(c)) = (&req.response_topic, &req.correlation)
            && req.qos == 1
            && !request::is_read_only(&req.payload)
        {
            match self.dedup.check(t, c) {
                Seen::New(k) => key = Some(k),
                Seen::InProgress => return None,
                Seen::Answered(out) => {
                    self.metrics.redelivery_hit();
                    debug!(topic = %t, "mqtt: redelivered request answered from the cache");
                    return Some(out);
                }
            }
        }
        // The same id marks the write in shared storage, so that a redelivery to another
        // replica (this one died after receiving it) is not executed again either.
        let id = key.as_ref().map(|k| RequestId {
            // The cache's key is the request id's bytes (`request::request_id`).
            id: Bytes::copy_from_slice(k),
            ttl: self.limits.response_cache_ttl,
        });
        match request::handle_as(&self.engine, &self.access, &self.service_id, req, caller, id.as_ref()).await {
            Ok(out) => {
                let out = Arc::new(out);
                if let Some(k) = &key {
                    self.dedup.answered(k, &out);
                }
                Some(out)
            }
            Err(why) => {
                if let Some(k) = &key {
                    self.dedup.forget(k);
                }
                debug!(?why, topic = %req.topic, "mqtt: request not answered");
                None
            }
        }
    }
}

/// What the metrics mirror of the door: the bytes its response cache holds.
#[async_trait]
impl crate::metrics::GaugeSource for Door {
    async fn gauges(&self) -> crate::metrics::GaugeReadings {
        crate::metrics::GaugeReadings {
            response_cache_bytes: Some(self.response_cache_held().1 as u64),
            ..Default::default()
        }
    }
}

/// Publishes `door`'s KEYNOTIFY notifications through `sink`, in change order, until `stop`.
/// Each observer is sent a change only if the rules in force now let it observe the key: a
/// registration made before a reload took `observe` away stays, silent. With `mirror` (the
/// state topics), every key is republished first, then each change is published on its topic
/// in the same order as the notifications.
///
/// A republish (at start, and after changes were dropped) reads every key after the changes
/// then waiting in the queue were applied, so those are in what it published or superseded
/// by it: the mirror skips them (a queued older value would otherwise be retained over the
/// newer one). Their KEYNOTIFY observers still get them.
pub fn notifier(
    feed: KeyNotifyReceiver,
    sink: Arc<dyn Sink>,
    door: &Door,
    mirror: Option<Mirror>,
    stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (access, service_id, metrics) = (door.access.clone(), door.service_id.clone(), door.metrics.clone());
    let engine = door.engine.clone();
    let mut stop = stop;
    async move {
        let mut superseded = 0;
        if let Some(m) = &mirror
            && m.republishes(&engine)
        {
            let queued = feed.waiting();
            tokio::select! {
                complete = m.republish(&engine, &*sink) => if complete { superseded = queued },
                _ = stop.changed() => return,
            }
        }
        let parts = (access, service_id, metrics, engine);
        send_notifications(feed, sink, mirror, superseded, stop, parts).await
    }
}

/// `superseded`: how many of the changes at the head of the queue the last republish covered.
async fn send_notifications(
    mut feed: KeyNotifyReceiver,
    sink: Arc<dyn Sink>,
    mirror: Option<Mirror>,
    mut superseded: usize,
    mut stop: watch::Receiver<bool>,
    (access, service_id, metrics, engine): (Access, String, crate::metrics::Metrics, Engine),
) {
    let mut dropped = engine.keynotify_dropped();
    loop {
        // Changes were lost on the way (the queue was full): the mirror's topics may be stale
        // until their keys change again, so they are all published anew, as at start (where
        // this process may, see `Mirror::republishes`).
        if let Some(m) = &mirror
            && engine.keynotify_dropped() != dropped
            && m.republishes(&engine)
        {
            dropped = engine.keynotify_dropped();
            tracing::warn!("state topics: changes were dropped from a full queue; republishing every key");
            let queued = feed.waiting();
            tokio::select! {
                complete = m.republish(&engine, &*sink) => if complete { superseded = queued },
                _ = stop.changed() => return,
            }
        }
        let n = tokio::select! {
            _ = stop.changed() => return,
            n = feed.recv() => n,
        };
        let Some(KeyNotification { change, observers, .. }) = n else {
            return;
        };
        let covered = superseded > 0;
        superseded = superseded.saturating_sub(1);
        let payload = request::notify_payload(match &change.kind {
            ChangeKind::Set(v) => Some(v),
            ChangeKind::Delete | ChangeKind::Expire => None,
        });
        let version = change.version.to_string();
        let mut targets = Vec::with_capacity(observers.len());
        for client_id in observers {
            if &*client_id == EVERY_KEY_OBSERVER {
                if let Some(m) = &mirror {
                    match covered {
                        true => m.skip_covered(),
                        false => m.publish_change(&*sink, &change).await,
                    }
                }
                continue;
            }
            if access.has_rules() {
                let observer = sink.observer(&access, &client_id).await;
                if !access.grant(observer).may(Op::Observe, &change.key) {
                    metrics.notification_withheld();
                    continue;
                }
            }
            let topic = request::notify_topic(&client_id, &change.key);
            targets.push((client_id, topic));
        }
        if targets.is_empty() {
            continue;
        }
        let out = Outgoing {
            topic: String::new(),
            payload,
            correlation: None,
            user_properties: vec![
                (PROP_TIMESTAMP.to_owned(), version),
                (PROP_PROTOCOL_VERSION.to_owned(), PROTOCOL_VERSION.to_owned()),
                (PROP_SOURCE_ID.to_owned(), service_id.clone()),
            ],
            message_expiry: None,
        };
        sink.notify(&out, &targets).await;
        metrics.notifications_sent(targets.len());
    }
}

#[cfg(test)]
mod tests;
