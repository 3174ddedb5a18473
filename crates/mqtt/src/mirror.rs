//! State as MQTT topics (`--state-topics <prefix>`): every change of a key is published,
//! retained, on `<prefix><key>`, so plain MQTT tooling (`mosquitto_sub -t 'state/#'`) gets each
//! current value on subscribing and every change after it. A delete or an expiry publishes an
//! empty retained message, which clears the topic.
//!
//! The changes come from the engine's KEYNOTIFY queue, where the mirror is the observer of
//! every key ([`crate::engine::notify::EVERY_KEY_OBSERVER`]): same order, same bounds, and on
//! replicas the same owners and handover as KEYNOTIFY (docs/state-topics.md).
//!
//! - This module: which keys can be topics, the messages, and the republish at start.
//! - `inbroker` (embedded broker): the retained store and the per-delivery `read` check;
//!   `setbypublish`: `<prefix><key>/set`, answered by the PUBACK reason code.
//! - `replay` (embedded broker): each SUBSCRIBE's retained state, filtered by the
//!   subscriber's rules before it is queued, paced by its receive window, bounded.
//! - [`external`]: clearing retained messages an external broker kept of keys that are gone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use tracing::{info, warn};

use crate::access::{Access, Op, Principal};
use crate::engine::notify::EveryKey;
use crate::engine::{Change, ChangeKind, Engine};
use crate::hlc::Hlc;
use crate::metrics::{Metrics, RetainedRead, StateTopicOutcome};

pub mod external;
#[cfg(feature = "embedded-broker")]
pub mod inbroker;
#[cfg(feature = "embedded-broker")]
pub mod replay;
#[cfg(feature = "embedded-broker")]
pub mod setbypublish;

/// The user property with the key's version, in the state store protocol's HLC format.
pub const PROP_VERSION: &str = "__ts";
/// The user property that says what happened to the key: one of the `KIND_*` values.
pub const PROP_KIND: &str = "kind";
/// A SET (or, when the mirror starts, the key's current value).
pub const KIND_SET: &str = "set";
/// DEL or VDEL removed the key.
pub const KIND_DELETE: &str = "delete";
/// The key's time to live ran out.
pub const KIND_EXPIRE: &str = "expire";
/// At start: an external broker kept a message of a key that no longer exists (when and how it
/// went is not known, so no version).
pub const KIND_GONE: &str = "gone";
/// The last topic level of a set-by-publish request.
const SET_LEVEL: &str = "set";
/// MQTT topics are UTF-8 strings of at most this many bytes.
const MAX_TOPIC_BYTES: usize = 65_535;
/// Keys read per page when the mirror republishes every key.
const REPUBLISH_PAGE: usize = 512;

/// What the mirror is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateTopics {
    /// Put before each key; ends with `/` (checked by [`check_prefix`]).
    pub prefix: String,
    /// A publish to `<prefix><key>/set` sets the key (embedded broker, in-broker serving only:
    /// only there does the PUBACK carry the service's answer).
    pub set_by_publish: bool,
    /// The broker is an external one: it may keep retained messages across a restart of this
    /// process, and stategate's rules cannot decide who receives them there.
    pub external_broker: bool,
}

/// Why a prefix cannot be used.
pub fn check_prefix(prefix: &str) -> Result<(), &'static str> {
    if !prefix.ends_with('/') || prefix.len() < 2 {
        return Err("must be a topic level or more followed by '/', e.g. state/");
    }
    if prefix.starts_with('$') {
        return Err("must not start with '$' (topics the broker reserves)");
    }
    if prefix.contains(['+', '#', '\0']) || prefix.starts_with('/') || prefix.contains("//") {
        return Err("must not contain '+', '#', NUL or empty topic levels");
    }
    let first = prefix.split('/').next().unwrap_or_default();
    if first == "statestore" || first == "clients" {
        return Err("must not be under statestore/ or clients/ (the state store protocol's topics)");
    }
    Ok(())
}

impl StateTopics {
    /// The topic of `key`, or `None` when the key cannot be one: not UTF-8, a `+`, `#`, NUL or
    /// control character, an empty level, too long, or (with set-by-publish) a last level
    /// `set`, whose topic is that of a set request.
    pub fn topic_of(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        if key.is_empty()
            || key.starts_with('/')
            || key.ends_with('/')
            || key.contains("//")
            || key.chars().any(|c| matches!(c, '+' | '#') || c.is_control())
            || self.prefix.len() + key.len() > MAX_TOPIC_BYTES
        {
            return None;
        }
        if self.set_by_publish && key.strip_suffix(SET_LEVEL).is_some_and(|k| k.ends_with('/')) {
            return None;
        }
        Some(format!("{}{key}", self.prefix))
    }

    /// The key whose mirror topic `topic` is (`None`: not a mirror topic).
    pub fn key_of<'t>(&self, topic: &'t str) -> Option<&'t str> {
        let key = topic.strip_prefix(&self.prefix)?;
        (self.topic_of(key.as_bytes()).as_deref() == Some(topic)).then_some(key)
    }

    /// The key a set-by-publish to `topic` sets (`None`: not a set topic, set-by-publish off,
    /// or a key the mirror could never carry). The key is checked as the mirror checks it
    /// ([`Self::topic_of`]): `state/a//set` would set `a/` and `state/x/set/set` `x/set`, keys
    /// whose topics cannot exist, so nobody would ever see the value a device set.
    pub fn set_key_of<'t>(&self, topic: &'t str) -> Option<&'t str> {
        let key = self.set_topic_key(topic)?;
        self.topic_of(key.as_bytes()).is_some().then_some(key)
    }

    /// Whether `topic` has the shape of a set request (`<prefix>.../set`, set-by-publish on),
    /// whether or not its key could be set.
    pub fn is_set_topic(&self, topic: &str) -> bool {
        self.set_topic_key(topic).is_some()
    }

    fn set_topic_key<'t>(&self, topic: &'t str) -> Option<&'t str> {
        if !self.set_by_publish {
            return None;
        }
        topic
            .strip_prefix(&self.prefix)?
            .strip_suffix(SET_LEVEL)?
            .strip_suffix('/')
    }

    /// Whether `topic` is under the mirror's prefix (a mirror topic, a set topic, or neither).
    pub fn owns(&self, topic: &str) -> bool {
        topic.starts_with(&self.prefix)
    }

    /// How the engine routes the mirror's changes between replicas: an embedded broker is
    /// reached only through its own replica, an external one is shared by all.
    pub fn every_key(&self) -> EveryKey {
        match self.external_broker {
            true => EveryKey::OneReplica,
            false => EveryKey::EachReplica,
        }
    }

    /// The retained message of a change (`None`: the key cannot be a topic).
    pub fn message(&self, change: &Change) -> Option<Retained> {
        let topic = self.topic_of(&change.key)?;
        let (payload, kind) = match &change.kind {
            ChangeKind::Set(v) => (v.clone(), KIND_SET),
            ChangeKind::Delete => (Bytes::new(), KIND_DELETE),
            ChangeKind::Expire => (Bytes::new(), KIND_EXPIRE),
        };
        Some(Retained {
            topic,
            payload,
            user_properties: vec![
                (PROP_VERSION.to_owned(), change.version.to_string()),
                (PROP_KIND.to_owned(), kind.to_owned()),
            ],
        })
    }
}

/// What one SUBSCRIBE's retained state may cost on the embedded broker (`replay`;
/// `--state-topics-replay-max`, `--state-topics-replays-per-client`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayLimits {
    /// Most retained messages one SUBSCRIBE delivers; past it the replay stops (counted).
    pub max_per_subscribe: usize,
    /// Replays one client may have running at once.
    pub per_client: usize,
    /// Replays reading the store at once in the broker.
    pub total: usize,
    /// Replayed messages one client may have waiting in its session at once.
    pub window: usize,
}

impl Default for ReplayLimits {
    fn default() -> ReplayLimits {
        ReplayLimits {
            max_per_subscribe: 100_000,
            per_client: 4,
            total: 64,
            window: 256,
        }
    }
}

/// A retained PUBLISH of the mirror (QoS 1); an empty payload clears the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    pub topic: String,
    pub payload: Bytes,
    pub user_properties: Vec<(String, String)>,
}

/// The mirror as the door's notifier runs it.
#[derive(Debug, Clone)]
pub struct Mirror {
    topics: StateTopics,
    access: Access,
    metrics: Metrics,
    /// Connection settings for reading what an external broker retained (clearing at start).
    external: Option<Arc<crate::service::MqttSettings>>,
    /// The topics this process left holding a value, each with the version of that value:
    /// what a resync after lost changes may have to clear, and what a change must be newer
    /// than to be published (one name and version per mirrored key, beside the broker's own
    /// copy of the value). Only the notifier task publishes, so a check and the publish after
    /// it see no other publish in between.
    live: Arc<std::sync::Mutex<HashMap<String, Hlc>>>,
}

impl Mirror {
    pub fn new(topics: StateTopics, access: Access, metrics: Metrics) -> Mirror {
        Mirror {
            topics,
            access,
            metrics,
            external: None,
            live: Default::default(),
        }
    }

    /// Clears at start what `settings`' broker retained of keys that are gone.
    pub fn clearing_stale(mut self, settings: Arc<crate::service::MqttSettings>) -> Mirror {
        self.external = Some(settings);
        self
    }

    pub fn topics(&self) -> &StateTopics {
        &self.topics
    }

    /// Whether this process republishes every key at start. Behind a shared broker with
    /// replicas running, no: they sent every change in log order (a republish would race
    /// their newer messages with older reads); only the first replica up does.
    pub fn republishes(&self, engine: &Engine) -> bool {
        !self.topics.external_broker || engine.other_senders().is_none_or(|others| others == 0)
    }

    /// The message for a change (`None`: skipped, not a topic, or withheld; counted).
    ///
    /// The embedded broker checks each delivery against the subscriber's `read` rules. An
    /// external broker's subscribers are nobody stategate can name, so there the mirror carries
    /// only keys an anonymous caller may read: any client of that broker can already read those
    /// with a GET through the state store protocol, so the mirror widens nothing.
    fn message(&self, change: &Change) -> Option<Retained> {
        if self.topics.external_broker
            && self.access.has_rules()
            && !self.access.grant(Principal::default()).may(Op::Read, &change.key)
        {
            self.metrics.state_topic(StateTopicOutcome::Withheld);
            return None;
        }
        let msg = self.topics.message(change);
        if msg.is_none() {
            self.metrics.state_topic(StateTopicOutcome::Skipped);
        }
        msg
    }

    /// Publishes a change on its topic, unless the topic already carries its version or a
    /// newer one (a republish read the key after this change was applied): a change is never
    /// published over a newer value, which would stay retained until the key changed again.
    pub async fn publish_change(&self, sink: &dyn crate::door::Sink, change: &Change) {
        let Some(msg) = self.message(change) else {
            return;
        };
        if self.carries(&msg.topic).is_some_and(|v| v >= change.version) {
            self.metrics.state_topic(StateTopicOutcome::Superseded);
            return;
        }
        self.publish(sink, &msg, Some(&change.version)).await;
    }

    /// Counts a change the notifier does not publish because a republish read the store
    /// after it was applied.
    pub fn skip_covered(&self) {
        self.metrics.state_topic(StateTopicOutcome::Superseded);
    }

    /// The version of the value this process left on `topic` (`None`: it holds none).
    fn carries(&self, topic: &str) -> Option<Hlc> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).get(topic).cloned()
    }

    /// Publishes `msg` (of the value at `version`; `None` for a clear) and remembers what its
    /// topic now holds.
    async fn publish(&self, sink: &dyn crate::door::Sink, msg: &Retained, version: Option<&Hlc>) {
        self.metrics.state_topic(StateTopicOutcome::Published);
        sink.publish_retained(msg).await;
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        match version {
            Some(v) if !msg.payload.is_empty() => match live.get_mut(&msg.topic) {
                Some(held) => *held = v.clone(),
                None => {
                    live.insert(msg.topic.clone(), v.clone());
                }
            },
            _ => {
                live.remove(&msg.topic);
            }
        }
    }

    /// Publishes every current key, so that the broker's retained messages are the store's
    /// (an embedded broker starts empty; an external one may hold values from before), and
    /// clears the topics of keys that are gone: what an external broker retained, and what
    /// this process published (after changes were lost, see `door::notifier`). Runs on the
    /// notifier before it sends any further change: changes made meanwhile wait in the queue
    /// and go out after, each only if newer than what its topic carries (see
    /// [`Self::publish_change`]), so the last message of each topic is its newest value.
    ///
    /// Returns whether every key was read: then every change applied before the call is in
    /// what it published (the notifier drops the ones still queued from before, see
    /// `door::notifier`).
    pub async fn republish(&self, engine: &Engine, sink: &dyn crate::door::Sink) -> bool {
        let published: Vec<String> = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        let mut stale: HashSet<String> = match &self.external {
            Some(settings) => match external::retained_topics(settings, &self.topics.prefix).await {
                // Only mirror topics: anything else under the prefix is not the mirror's to clear.
                Ok(topics) => {
                    self.metrics.state_topics_retained_read(RetainedRead::Read);
                    topics.into_iter().filter(|t| self.topics.key_of(t).is_some()).collect()
                }
                // Not "nothing retained": nothing is cleared from it, and the next republish
                // (restart, dropped changes) reads again (docs/state-topics.md).
                Err(e) => {
                    self.metrics.state_topics_retained_read(e.outcome());
                    warn!(
                        cause = %e,
                        prefix = %self.topics.prefix,
                        "state topics: could not read what the broker retained; topics of keys deleted while this service was away stay stale until the next republish"
                    );
                    HashSet::new()
                }
            },
            None => HashSet::new(),
        };
        stale.extend(published);
        let (mut after, mut published) = (None::<Bytes>, 0u64);
        loop {
            let page = match engine.export_page(after.as_deref(), REPUBLISH_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    warn!(cause = %e, "state topics: reading the keys to republish failed; the rest follow their next change");
                    return false;
                }
            };
            for (key, record) in page.0 {
                let change = Change {
                    key,
                    version: record.version,
                    kind: ChangeKind::Set(record.value),
                };
                if let Some(msg) = self.message(&change) {
                    stale.remove(&msg.topic);
                    self.publish(sink, &msg, Some(&change.version)).await;
                    published += 1;
                }
            }
            match page.1 {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        for topic in &stale {
            let gone = Retained {
                topic: topic.clone(),
                payload: Bytes::new(),
                user_properties: vec![(PROP_KIND.to_owned(), KIND_GONE.to_owned())],
            };
            self.publish(sink, &gone, None).await;
        }
        info!(
            published,
            cleared = stale.len(),
            prefix = %self.topics.prefix,
            "state topics: every current key republished"
        );
        true
    }
}

#[cfg(test)]
mod tests;
