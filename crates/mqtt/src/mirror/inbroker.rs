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
//! - Publishing under the prefix: only the service does, except a set request
//!   (`<prefix><key>/set` with `--state-topics-set`), which is consumed: it sets the key and
//!   its publisher hears the outcome only as the PUBACK reason code (see [`set_reason`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rmqtt::codec::v5::PublishAckReason;
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::retain::RetainStorage;
use rmqtt::types::{PublishAclResult, PublishResult, Retain, TopicFilter, TopicName};

use super::ReplayLimits;
use super::StateTopics;
use super::replay::{Replays, TopicStore};
use crate::access::{self, Access, Op, Principal};
use crate::door::Door;
use crate::engine::{Command, EngineError, Meta};
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

/// The broker-wide hooks: who may publish under the prefix, and who receives mirror messages.
pub(crate) async fn install_guards(
    hooks: &dyn rmqtt::hook::Register,
    topics: StateTopics,
    access: Access,
    service_id: String,
    client_path: bool,
) {
    let guard = Arc::new(Guard {
        topics,
        access,
        service_id,
        client_path,
    });
    hooks
        .add(Type::MessagePublishCheckAcl, Box::new(PublishGuard(guard.clone())))
        .await;
    hooks
        .add(Type::MessageExpiryCheck, Box::new(ReadOnDelivery(guard)))
        .await;
}

struct Guard {
    topics: StateTopics,
    access: Access,
    service_id: String,
    /// The service publishes through a client connection of its own (`--mqtt-client-path`).
    client_path: bool,
}

/// The name the broker authenticated a session with, for the rules.
pub(super) fn principal_of(id: &rmqtt::types::Id) -> Principal {
    Principal {
        client_id: Some(id.client_id.to_string()),
        username: id.username.as_ref().map(|u| u.to_string()),
        token: None,
    }
}

struct PublishGuard(Arc<Guard>);

#[async_trait]
impl Handler for PublishGuard {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let Parameter::MessagePublishCheckAcl(session, publish) = param else {
            return (true, acc);
        };
        let g = &self.0;
        let is_service = g.client_path && *session.id.client_id == g.service_id;
        // A set request goes on to its own hook; the service's own mirror messages pass.
        if !g.topics.owns(&publish.topic) || is_service || g.topics.set_key_of(&publish.topic).is_some() {
            return (true, acc);
        }
        tracing::info!(
            client_id = &*session.id.client_id,
            topic = &*publish.topic,
            "mqtt: publish under the state topics prefix refused (only the service publishes there)"
        );
        let refused = PublishAclResult::rejected(false, Some("the state topics are the service's".into()));
        (false, Some(HookResult::PublishAclResult(refused)))
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

/// Set-by-publish: `<prefix><key>/set` sets the key to the payload, through the engine like any
/// SET (the same limits, the publisher's `write` rule and rate), on the publisher's connection
/// task: the PUBACK goes out once the SET is done, and that connection's next packets wait.
pub(crate) struct SetByPublish {
    /// Weak: rmqtt keeps hooks after the broker stops, the door must go with the service.
    pub(crate) door: Weak<Door>,
    pub(crate) topics: StateTopics,
}

#[async_trait]
impl Handler for SetByPublish {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let Parameter::MessagePublishCheckAcl(session, publish) = param else {
            return (true, acc);
        };
        let Some(key) = self.topics.set_key_of(&publish.topic) else {
            return (true, acc);
        };
        let outcome = match self.door.upgrade() {
            Some(door) => set(&door, principal_of(&session.id), key, publish.payload.clone()).await,
            None => Err(EngineError::Unavailable),
        };
        if let Err(e) = &outcome {
            tracing::debug!(client_id = &*session.id.client_id, key, cause = %e, "state topics: a set by publish was refused");
        }
        let (reason, text) = set_reason(&outcome);
        let result = PublishResult::reason_code(reason, text.map(Into::into), false);
        (false, Some(HookResult::PublishAclResult(PublishAclResult(result))))
    }
}

async fn set(door: &Door, principal: Principal, key: &str, value: Bytes) -> Result<(), EngineError> {
    door.access().admit(&principal)?;
    let grant = door.access().grant(principal);
    grant.check(Op::Write, key.as_bytes())?;
    let args = vec![
        Bytes::from_static(b"SET"),
        Bytes::copy_from_slice(key.as_bytes()),
        value,
    ];
    let cmd = Command::parse(args, Meta::default())?;
    access::execute(door.engine(), &grant, cmd).await.map(|_| ())
}

/// The PUBACK reason code (and reason string) of a set by publish. Success is 0x10 (No
/// matching subscribers), a success code that also says the request went nowhere else: 0x00
/// would make the broker route it. MQTT5 gives a PUBACK no "too large" code (0x95 is for
/// DISCONNECT only), so a key or value over its limit is 0x99 Payload format invalid.
pub fn set_reason(outcome: &Result<(), EngineError>) -> (PublishAckReason, Option<String>) {
    let e = match outcome {
        Ok(()) => return (PublishAckReason::NoMatchingSubscribers, None),
        Err(e) => e,
    };
    let reason = match e {
        EngineError::NotAuthorized => PublishAckReason::NotAuthorized,
        EngineError::QuotaExceeded | EngineError::RateLimited | EngineError::StorageFull => {
            PublishAckReason::QuotaExceeded
        }
        EngineError::TooLarge => PublishAckReason::PayloadFormatInvalid,
        EngineError::EmptyKey => PublishAckReason::TopicNameInvalid,
        // A plain SET meets these only when the key is fenced (it carries no token) or never.
        EngineError::UnknownCommand
        | EngineError::WrongArity
        | EngineError::Syntax
        | EngineError::MissingTimestamp
        | EngineError::MalformedTimestamp
        | EngineError::TimestampSkew
        | EngineError::FencingTokenRequired
        | EngineError::FencingTokenSkew
        | EngineError::FencingTokenLower
        | EngineError::TtlOutOfRange
        | EngineError::VersionMismatch
        | EngineError::NotPersistent
        | EngineError::Unavailable
        | EngineError::Storage(_) => PublishAckReason::UnspecifiedError,
    };
    // The engine's messages are the ones every door sends; a storage fault says no more.
    (reason, Some(e.to_string()))
}
