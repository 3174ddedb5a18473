//! The state topics mirror inside the embedded broker (rmqtt hooks and its retained store).
//!
//! - Retained store: rmqtt's own keeps nothing ("use the rmqtt-retainer plugin"), so the mirror
//!   brings one ([`super::replay::TopicStore`], in topic order), holding only what the service
//!   published under the prefix. Other clients' retained messages are delivered as usual but
//!   not kept, as before the mirror existed: the broker's memory holds state, not whatever
//!   clients leave. rmqtt's lookup at SUBSCRIBE gets nothing from it: each subscription's
//!   retained state is served by a replay of its own, filtered, paced and bounded
//!   ([`super::replay`]).
//! - Who receives what: a mirror message reaches a subscriber only if the rules let it `read`
//!   the key. The check sits on delivery (rmqtt's `MessageExpiryCheck` hook, run per session
//!   for live, queued and retained messages alike), so a subscription to `state/#` is accepted
//!   and delivers just the keys its client may read, with the rules in force at delivery.
//! - Publishing under the prefix: only the service does (the broker's one publishing rule,
//!   `brokerauth`), except a set request (`<prefix><key>/set` with `--state-topics-set`,
//!   `setbypublish`), which is consumed: it sets the key and its publisher hears the outcome
//!   only as the PUBACK reason code.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::retain::RetainStorage;
use rmqtt::types::{Retain, TopicFilter, TopicName};

use super::ReplayLimits;
use super::StateTopics;
use super::replay::{Replays, TopicStore};
use crate::access::{Access, Op, Principal};
use crate::metrics::Metrics;

/// The broker's retained store: the mirror's messages only.
struct MirrorRetained {
    messages: Arc<TopicStore>,
    topics: StateTopics,
    service_id: String,
}

#[async_trait]
impl RetainStorage for MirrorRetained {
    fn enable(&self) -> bool {
        true
    }

    async fn set(&self, topic: &TopicName, retain: Retain, expiry: Option<Duration>) -> rmqtt::Result<()> {
        if *retain.from.id.client_id != self.service_id || !self.topics.owns(topic) {
            return Ok(());
        }
        // A client's publish (the service's own, with `--mqtt-client-path`) comes with the
        // listener's message expiry, where zero means "never" but rmqtt's tree reads "now".
        let expiry = expiry.filter(|e| !e.is_zero());
        self.messages.set(topic, retain, expiry);
        Ok(())
    }

    /// Nothing: the replays serve mirror topics (per subscriber), and nothing else is kept.
    async fn get(&self, _filter: &TopicFilter) -> rmqtt::Result<Vec<(TopicName, Retain)>> {
        Ok(Vec::new())
    }

    async fn count(&self) -> isize {
        isize::try_from(self.messages.len()).unwrap_or(isize::MAX)
    }

    async fn max(&self) -> isize {
        self.count().await
    }
}

/// Installs the mirror's retained store, and the replays that serve it, in a broker about to
/// listen.
pub(crate) async fn install_retained_store(
    scx: &ServerContext,
    hooks: &dyn rmqtt::hook::Register,
    topics: StateTopics,
    service_id: String,
    serving: (Access, ReplayLimits, Metrics),
) {
    let (access, limits, metrics) = serving;
    let store = Arc::new(TopicStore::default());
    let replays = Replays::new(
        store.clone(),
        topics.clone(),
        access,
        limits,
        metrics,
        service_id.clone(),
    );
    replays.install(hooks).await;
    *scx.extends.retain_mut().await = Box::new(MirrorRetained {
        messages: store,
        topics,
        service_id,
    });
}

/// The broker-wide hook that decides who receives mirror messages. (Who may publish under the
/// prefix is the broker's one publishing rule, `brokerauth`.)
pub(crate) async fn install_guards(hooks: &dyn rmqtt::hook::Register, topics: StateTopics, access: Access) {
    let guard = Arc::new(Guard { topics, access });
    hooks
        .add(Type::MessageExpiryCheck, Box::new(ReadOnDelivery(guard)))
        .await;
}

struct Guard {
    topics: StateTopics,
    access: Access,
}

/// The name the broker authenticated a session with, for the rules.
pub(super) fn principal_of(id: &rmqtt::types::Id) -> Principal {
    Principal {
        client_id: Some(id.client_id.to_string()),
        username: id.username.as_ref().map(|u| u.to_string()),
        token: None,
    }
}

struct ReadOnDelivery(Arc<Guard>);

#[async_trait]
impl Handler for ReadOnDelivery {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let Parameter::MessageExpiryCheck(session, _, publish) = param else {
            return (true, acc);
        };
        let g = &self.0;
        let Some(key) = g.topics.key_of(&publish.topic) else {
            return (true, acc);
        };
        if !g.access.has_rules() || g.access.grant(principal_of(&session.id)).may(Op::Read, key.as_bytes()) {
            return (true, acc);
        }
        // Dropped for this session only, as if it had expired: never sent, nothing leaks.
        (false, Some(HookResult::MessageExpiry))
    }
}
