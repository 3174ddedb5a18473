//! Retained state served per subscriber, in the embedded broker.
//!
//! rmqtt answers a SUBSCRIBE by reading every matching retained message at once and pushing
//! each into the subscriber's session queue (`--mqtt-max-queued-per-client`, oldest dropped)
//! before the per-delivery `read` check runs: on a large store a client allowed a few keys
//! lost its own among the ones it may not read, and every SUBSCRIBE copied every matching
//! message. So the mirror's retained store answers rmqtt's lookup with nothing, and a replay
//! of its own serves each subscription that can match a state topic:
//! - **filtered before it is queued**: only topics the filter matches and the subscriber may
//!   `read` (the rules in force when each page is read) reach its session;
//! - **paced**: at most [`ReplayLimits::window`] replayed messages (and at most half the
//!   session queue) wait in one client's session at once; the next is queued when one was taken
//!   for delivery or dropped. rmqtt takes a message for delivery only while the client has
//!   receive window left, so the client's PUBACKs set the pace;
//! - **bounded**: at most [`ReplayLimits::max_per_subscribe`] messages per SUBSCRIBE, at most
//!   [`ReplayLimits::per_client`] replays of one client at once (a SUBSCRIBE past it gets no
//!   retained messages; counted and logged), a repeated SUBSCRIBE of the same filter restarts its
//!   replay instead of adding one, at most [`ReplayLimits::total`] replays reading the store at
//!   once (others wait their turn), and the store is read [`PAGE`] entries per hold of its lock.
//!
//! A replayed message can cross a live one of the same topic (the mirror publishes a change
//! while the replay queues the value it read before): after queuing, the replay looks at the
//! store again, and if the topic changed meanwhile it queues what the topic holds now (or an
//! empty message, `kind=gone`, if it was cleared). The store is updated before a message is
//! routed to subscribers, so what it holds after the replay queued is never older than a live
//! message already queued ahead of it.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use rmqtt::codec::types::QoS;
use rmqtt::codec::v5::{PublishProperties, RetainHandling};
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::session::Session;
use rmqtt::topic::Topic;
use rmqtt::types::{ClientId, CodecPublish, From, Publish, Retain, Subscribe, TopicFilter};
use tokio::sync::{Notify, Semaphore};
use tokio::task::AbortHandle;

use super::{KIND_GONE, PROP_KIND, ReplayLimits, StateTopics};
use crate::access::{Access, Op};
use crate::metrics::{Metrics, StateTopicReplay};

/// Entries of the retained store read per hold of its lock.
pub const PAGE: usize = 1024;
/// Times a replay queues a topic again when the topic changed while it was queuing it.
const CATCH_UP: usize = 8;

/// The mirror's retained messages, in topic order (pages resume after a topic).
#[derive(Default)]
pub(crate) struct TopicStore {
    entries: RwLock<BTreeMap<String, Held>>,
    changes: AtomicU64,
}

/// A retained message and the change that set it (tells two values of one topic apart).
#[derive(Clone)]
struct Held {
    change: u64,
    retain: Retain,
    expires: Option<Instant>,
}

impl Held {
    fn live(&self, now: Instant) -> bool {
        self.expires.is_none_or(|at| at > now)
    }
}

/// One page of a replay: the entries kept, how many were read, where the next page starts.
struct Page {
    kept: Vec<(String, Held)>,
    examined: usize,
    next: Option<String>,
}

impl TopicStore {
    /// Holds `retain` on `topic`; an empty payload clears the topic.
    pub(crate) fn set(&self, topic: &str, retain: Retain, expiry: Option<Duration>) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if retain.publish.payload.is_empty() {
            entries.remove(topic);
            return;
        }
        let held = Held {
            change: self.changes.fetch_add(1, Ordering::Relaxed),
            retain,
            expires: expiry.map(|e| Instant::now() + e),
        };
        entries.insert(topic.to_owned(), held);
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn current(&self, topic: &str) -> Option<Held> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.get(topic).filter(|h| h.live(Instant::now())).cloned()
    }

    /// Up to [`PAGE`] entries from `start` on (after `after`) whose topic starts with `start`,
    /// keeping those `keep` wants.
    fn page(&self, start: &str, after: Option<&str>, keep: impl Fn(&str) -> bool) -> Page {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let from = match after {
            Some(t) => Bound::Excluded(t),
            None => Bound::Included(start),
        };
        let now = Instant::now();
        let (mut kept, mut examined, mut last) = (Vec::new(), 0, None);
        for (topic, held) in entries.range::<str, _>((from, Bound::Unbounded)) {
            if !topic.starts_with(start) {
                return Page {
                    kept,
                    examined,
                    next: None,
                };
            }
            if examined == PAGE {
                return Page {
                    kept,
                    examined,
                    next: last,
                };
            }
            examined += 1;
            last = Some(topic.clone());
            if held.live(now) && keep(topic) {
                kept.push((topic.clone(), held.clone()));
            }
        }
        Page {
            kept,
            examined,
            next: None,
        }
    }
}

/// The topic levels of `filter` before its first wildcard, as a topic prefix: every topic it
/// matches starts with it (a filter without wildcards is its own topic).
fn literal_start(filter: &str) -> &str {
    match filter.find(['+', '#']) {
        Some(at) => &filter[..at],
        None => filter,
    }
}

/// Whether `filter` can match a topic under `prefix` (`state/` matches `#`, `+/x/#`, `state/a`).
fn may_match(filter: &str, prefix: &str) -> bool {
    let mut levels = filter.split('/');
    for want in prefix.trim_end_matches('/').split('/') {
        match levels.next() {
            Some("#") => return true,
            Some("+") => {}
            Some(level) if level == want => {}
            _ => return false,
        }
    }
    // A mirror topic has at least one level after the prefix, never an empty one.
    levels.next().is_some_and(|level| !level.is_empty())
}

/// How many replayed messages wait in one client's session, and a wake-up when one leaves.
#[derive(Default)]
struct Pace {
    waiting: AtomicUsize,
    left: Notify,
}

impl Pace {
    fn one_left(&self) {
        let _ = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        self.left.notify_waiters();
    }

    /// Waits until fewer than `window` replayed messages wait in the session.
    async fn room(&self, window: usize) {
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.waiting.load(Ordering::SeqCst) < window {
                return;
            }
            left.await;
        }
    }
}

/// One client's replays.
#[derive(Default)]
struct ClientReplays {
    pace: Arc<Pace>,
    running: Vec<(u64, TopicFilter, AbortHandle)>,
    /// Filters subscribed again with retain handling 1 (only new subscriptions get retained
    /// messages): noted before the subscription is made, when it is known whether it existed.
    not_new: Vec<TopicFilter>,
}

/// The replays of a broker, and the hooks that start, pace and end them.
pub(crate) struct Replays {
    store: Arc<TopicStore>,
    topics: StateTopics,
    access: Access,
    limits: ReplayLimits,
    metrics: Metrics,
    /// The sender replayed messages carry (a custom one: the hooks tell them from live ones).
    service_id: String,
    slots: Arc<Semaphore>,
    clients: Mutex<HashMap<ClientId, ClientReplays>>,
    next_id: AtomicU64,
}

impl Replays {
    pub(crate) fn new(
        store: Arc<TopicStore>,
        topics: StateTopics,
        access: Access,
        limits: ReplayLimits,
        metrics: Metrics,
        service_id: String,
    ) -> Arc<Replays> {
        Arc::new(Replays {
            slots: Arc::new(Semaphore::new(limits.total.max(1))),
            store,
            topics,
            access,
            limits,
            metrics,
            service_id,
            clients: Mutex::default(),
            next_id: AtomicU64::new(0),
        })
    }

    /// Installs the hooks; the accounting one runs before the mirror's `read` check on
    /// delivery, which ends the chain for a message it withholds.
    pub(crate) async fn install(self: &Arc<Self>, hooks: &dyn rmqtt::hook::Register) {
        for typ in [
            Type::ClientSubscribe,
            Type::SessionSubscribed,
            Type::ClientDisconnected,
            Type::MessageDropped,
        ] {
            hooks.add(typ, Box::new(ReplayHook(self.clone()))).await;
        }
        hooks
            .add_priority(Type::MessageExpiryCheck, 100, Box::new(ReplayHook(self.clone())))
            .await;
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<ClientId, ClientReplays>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a subscription gets retained state from a replay (rmqtt sends none for mirror
    /// topics): not shared, retained messages asked for, a filter that can match a state topic.
    fn wants(&self, sub: &Subscribe) -> bool {
        sub.opts.shared_group().is_none()
            && !matches!(sub.opts.retain_handling(), Some(RetainHandling::NoAtSubscribe))
            && may_match(&sub.topic_filter, &self.topics.prefix)
    }

    fn is_replayed(&self, from: &From) -> bool {
        from.is_custom() && *from.id.client_id == self.service_id
    }

    /// Before the subscription is made: remembers a retain-handling-1 filter that exists.
    async fn before_subscribe(&self, session: &Session, sub: &Subscribe) {
        if !self.wants(sub) || !matches!(sub.opts.retain_handling(), Some(RetainHandling::AtSubscribeNew)) {
            return;
        }
        let existed = match session.subscriptions().await {
            Ok(subs) => subs.read().await.contains_key(&sub.topic_filter),
            Err(_) => false,
        };
        if existed {
            let mut clients = self.clients();
            let client = clients.entry(session.id.client_id.clone()).or_default();
            client.not_new.retain(|f| f != &sub.topic_filter);
            client.not_new.push(sub.topic_filter.clone());
        }
    }

    /// The subscription is made: starts its replay (or restarts the one of the same filter).
    fn subscribed(self: &Arc<Self>, session: &Session, sub: &Subscribe) {
        if !self.wants(sub) {
            return;
        }
        let client_id = session.id.client_id.clone();
        let mut clients = self.clients();
        let client = clients.entry(client_id.clone()).or_default();
        if let Some(at) = client.not_new.iter().position(|f| f == &sub.topic_filter) {
            client.not_new.swap_remove(at);
            return;
        }
        // Aborting only marks the task: it ends (and takes itself off the list) on a worker.
        if let Some(at) = client.running.iter().position(|(_, f, _)| f == &sub.topic_filter) {
            client.running.swap_remove(at).2.abort();
        }
        if client.running.len() >= self.limits.per_client {
            self.metrics.state_topics_replay(StateTopicReplay::Refused, 1);
            tracing::warn!(
                client_id = &*client_id,
                filter = &*sub.topic_filter,
                limit = self.limits.per_client,
                "state topics: no retained messages for this subscription: the client has as many replays running as allowed"
            );
            return;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let task = tokio::spawn(self.clone().replay(
            id,
            session.clone(),
            sub.topic_filter.clone(),
            sub.opts.qos(),
            client.pace.clone(),
        ));
        client.running.push((id, sub.topic_filter.clone(), task.abort_handle()));
    }

    /// The client's connection ended: its replays stop (its next SUBSCRIBEs start anew).
    fn disconnected(&self, client_id: &ClientId) {
        let client = self.clients().remove(client_id);
        for (_, _, task) in client.into_iter().flat_map(|c| c.running) {
            task.abort();
        }
    }

    fn left_session(&self, client_id: &ClientId) {
        if let Some(client) = self.clients().get(client_id) {
            client.pace.one_left();
        }
    }

    async fn replay(self: Arc<Self>, id: u64, session: Session, filter: TopicFilter, qos: QoS, pace: Arc<Pace>) {
        let _finished = Finished {
            replays: &self,
            client_id: &session.id.client_id,
            id,
        };
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let Ok(matcher) = Topic::from_str(&filter) else {
            return;
        };
        let window = self.limits.window.min(session.deliver_queue().capacity() / 2).max(1);
        let start = literal_start(&filter);
        let principal = super::inbroker::principal_of(&session.id);
        let (mut after, mut queued) = (None::<String>, 0usize);
        loop {
            let grant = self.access.has_rules().then(|| self.access.grant(principal.clone()));
            let readable = |key: &str| grant.as_ref().is_none_or(|g| g.may(Op::Read, key.as_bytes()));
            let keep = |topic: &str| matcher.matches_str(topic) && self.topics.key_of(topic).is_some_and(readable);
            let page = self.store.page(start, after.as_deref(), keep);
            self.metrics
                .state_topics_replay(StateTopicReplay::Examined, page.examined as u64);
            for (topic, held) in page.kept {
                if queued == self.limits.max_per_subscribe {
                    self.metrics.state_topics_replay(StateTopicReplay::Truncated, 1);
                    tracing::warn!(
                        client_id = &*session.id.client_id,
                        filter = &*filter,
                        limit = queued,
                        "state topics: retained messages of one subscription cut at --state-topics-replay-max"
                    );
                    return;
                }
                pace.room(window).await;
                self.queue_current(&session, &topic, held, qos, &pace).await;
                queued += 1;
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return,
            }
        }
    }

    /// Queues `held` on `topic` for the session, then what the topic holds now, as long as it
    /// changed meanwhile (a live message may have gone ahead of the one queued).
    async fn queue_current(&self, session: &Session, topic: &str, held: Held, qos: QoS, pace: &Pace) {
        // Replayed messages come from the service, marked as a custom sender (see `is_replayed`).
        let from = From::from_custom(held.retain.from.id.clone());
        let mut sent = Some(held);
        for _ in 0..CATCH_UP {
            let publish = match &sent {
                Some(h) => h.retain.publish.clone(),
                None => gone(topic),
            };
            self.queue(session, from.clone(), topic, publish, qos, pace).await;
            let now = self.store.current(topic);
            if now.as_ref().map(|h| h.change) == sent.as_ref().map(|h| h.change) {
                return;
            }
            sent = now;
        }
    }

    /// Puts one retained message in the session, as rmqtt sends retained messages.
    async fn queue(&self, session: &Session, from: From, topic: &str, mut publish: Publish, qos: QoS, pace: &Pace) {
        publish.dup = false;
        publish.retain = true;
        publish.qos = publish.qos.less_value(qos);
        publish.topic = topic.into();
        publish.packet_id = None;
        publish.create_time = Some(rmqtt::utils::timestamp_millis());
        pace.waiting.fetch_add(1, Ordering::SeqCst);
        let entry = session.scx.extends.shared().await.entry(session.id.clone());
        match entry.publish(from, publish).await {
            Ok(()) => self.metrics.state_topics_replay(StateTopicReplay::Queued, 1),
            Err(_) => pace.one_left(),
        }
    }
}

/// The empty retained message of a topic cleared while a replay queued its value.
fn gone(topic: &str) -> Publish {
    let properties = PublishProperties {
        user_properties: vec![(PROP_KIND.into(), KIND_GONE.into())],
        ..PublishProperties::default()
    };
    Publish::from(CodecPublish {
        dup: false,
        retain: true,
        qos: QoS::AtLeastOnce,
        topic: topic.into(),
        packet_id: None,
        payload: Bytes::new(),
        properties: Some(properties),
    })
}

/// Takes a replay off its client's list when it ends, however it ends (done, cut, aborted).
struct Finished<'a> {
    replays: &'a Replays,
    client_id: &'a ClientId,
    id: u64,
}

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.replays.clients().get_mut(self.client_id) {
            client.running.retain(|(id, _, _)| *id != self.id);
        }
    }
}

struct ReplayHook(Arc<Replays>);

#[async_trait]
impl Handler for ReplayHook {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let r = &self.0;
        match param {
            Parameter::ClientSubscribe(session, sub) => r.before_subscribe(session, sub).await,
            Parameter::SessionSubscribed(session, sub) => r.subscribed(session, sub),
            Parameter::ClientDisconnected(session, _) => r.disconnected(&session.id.client_id),
            Parameter::MessageExpiryCheck(session, from, _) if r.is_replayed(from) => {
                r.left_session(&session.id.client_id)
            }
            Parameter::MessageDropped(Some(to), from, _, _) if r.is_replayed(from) => r.left_session(&to.client_id),
            _ => {}
        }
        (true, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_the_prefix() {
        for (filter, yes) in [
            ("#", true),
            ("state/#", true),
            ("+/#", true),
            ("+/a", true),
            ("state/a/b", true),
            ("state/+", true),
            ("state", false),
            ("state/", false),
            ("other/#", false),
            ("clients/x/y", false),
            ("+", false),
        ] {
            assert_eq!(may_match(filter, "state/"), yes, "{filter}");
        }
        assert!(may_match("site/+/state/k", "site/7/state/"));
        assert_eq!(literal_start("state/#"), "state/");
        assert_eq!(literal_start("state/a/+/b"), "state/a/");
        assert_eq!(literal_start("+/a"), "");
        assert_eq!(literal_start("state/a"), "state/a");
    }
}
