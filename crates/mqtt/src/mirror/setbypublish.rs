//! Set-by-publish (`--state-topics-set`, embedded broker serving in-broker): a PUBLISH to
//! `<prefix><key>/set` sets the key to the payload and is consumed; its publisher hears the
//! outcome only as the PUBACK reason code ([`set_reason`]).
//!
//! - Which topics are set requests: [`StateTopics::set_key_of`], whose key check is the
//!   mirror's own ([`StateTopics::topic_of`]), so no set lands on a key the mirror could never
//!   show. Set-shaped topics with such keys are refused by the broker's publishing rule
//!   (`brokerauth`), never seen here.
//! - Redeliveries: a QoS 1 PUBLISH whose PUBACK was lost comes again with DUP set and the same
//!   packet id. Applied again it could overwrite a newer write by someone else, so the answer of
//!   each set request is kept in the door's redelivery cache mechanism (`dedup`), keyed by the
//!   publisher's session and the packet id, and a DUP copy gets that answer back unapplied.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use rmqtt::codec::v5::PublishAckReason;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType};
use rmqtt::session::Session;
use rmqtt::types::{Publish, PublishAclResult, PublishResult};

use super::StateTopics;
use super::inbroker::principal_of;
use crate::access::{self, Op, Principal};
use crate::dedup::{Answer, Dedup, Key, Seen};
use crate::door::Door;
use crate::engine::{Command, EngineError, Meta};

/// The PUBACK a set request got: kept to answer its redeliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetAnswer {
    pub(crate) reason: PublishAckReason,
    pub(crate) text: Option<String>,
}

impl Answer for SetAnswer {
    /// `reason`, then the text's bytes after a `1` (or a lone `0`: no text).
    fn encode(&self) -> Box<[u8]> {
        let mut buf = vec![self.reason as u8];
        match &self.text {
            Some(text) => {
                buf.push(1);
                buf.extend_from_slice(text.as_bytes());
            }
            None => buf.push(0),
        }
        buf.into_boxed_slice()
    }

    fn decode(buf: &[u8]) -> Option<SetAnswer> {
        let (&reason, rest) = buf.split_first()?;
        let reason = PublishAckReason::try_from(reason).ok()?;
        let text = match rest.split_first()? {
            (0, []) => None,
            (1, text) => Some(String::from_utf8(text.to_vec()).ok()?),
            _ => return None,
        };
        Some(SetAnswer { reason, text })
    }
}

/// A set request's identity for its redeliveries: its publisher's client id, when that
/// client's session began (a resumed session keeps it, a clean start begins another, whose
/// packet ids are new) and the packet id.
fn request_key(client_id: &str, session_created_ms: i64, packet_id: u16) -> Key {
    let mut k = Vec::with_capacity(client_id.len() + 10);
    k.extend_from_slice(&session_created_ms.to_be_bytes());
    k.extend_from_slice(&packet_id.to_be_bytes());
    k.extend_from_slice(client_id.as_bytes());
    k.into()
}

/// The hook: a set request sets its key through the engine like any SET (the same limits,
/// the publisher's `write` rule and rate), on the publisher's connection task: the PUBACK goes
/// out once the SET is done, and that connection's next packets wait.
pub(crate) struct SetByPublish {
    /// Weak: rmqtt keeps hooks after the broker stops, the door must go with the service.
    door: Weak<Door>,
    topics: StateTopics,
    /// Answers of recent set requests (QoS 1 and 2), bounded as the door's response cache.
    answers: Dedup<SetAnswer>,
}

impl SetByPublish {
    pub(crate) fn new(door: &Arc<Door>, topics: StateTopics) -> SetByPublish {
        let limits = door.limits();
        SetByPublish {
            door: Arc::downgrade(door),
            topics,
            answers: Dedup::new(
                limits.response_cache_ttl,
                limits.response_cache_entries,
                limits.response_cache_bytes,
            ),
        }
    }

    /// The answer to a set request. A DUP copy of one answered before gets that answer again
    /// and changes nothing; a PUBLISH without DUP is a new message, even with a packet id
    /// used before (its sender got the earlier PUBACK and may reuse the id).
    async fn answer(&self, session: &Session, publish: &Publish, key: &str) -> SetAnswer {
        let Some(packet_id) = publish.packet_id else {
            // QoS 0: never redelivered, and nobody hears the answer.
            return self.apply(session, publish, key).await;
        };
        let created = session.created_at().await.unwrap_or_default();
        let id = request_key(&session.id.client_id, created, packet_id.get());
        if !publish.dup {
            self.answers.forget(&id);
        }
        match self.answers.check_key(id) {
            Seen::New(id) => {
                let answer = self.apply(session, publish, key).await;
                self.answers.answered(&id, &answer);
                answer
            }
            Seen::Answered(answer) => {
                if let Some(door) = self.door.upgrade() {
                    door.metrics().redelivery_hit();
                }
                tracing::debug!(
                    client_id = &*session.id.client_id,
                    key,
                    packet_id = packet_id.get(),
                    "state topics: a redelivered set request answered as the first time, not applied again"
                );
                SetAnswer::clone(&answer)
            }
            // Only a takeover of the session while its first copy runs gets here.
            Seen::InProgress => SetAnswer {
                reason: PublishAckReason::UnspecifiedError,
                text: Some("the first copy of this publish is still being applied".into()),
            },
        }
    }

    async fn apply(&self, session: &Session, publish: &Publish, key: &str) -> SetAnswer {
        let outcome = match self.door.upgrade() {
            Some(door) => set(&door, principal_of(&session.id), key, publish.payload.clone()).await,
            None => Err(EngineError::Unavailable),
        };
        if let Err(e) = &outcome {
            tracing::debug!(client_id = &*session.id.client_id, key, cause = %e, "state topics: a set by publish was refused");
        }
        let (reason, text) = set_reason(&outcome);
        SetAnswer { reason, text }
    }
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
        let answer = self.answer(session, publish, key).await;
        let result = PublishResult::reason_code(answer.reason, answer.text.map(Into::into), false);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_come_back_exactly_as_stored() {
        for answer in [
            SetAnswer {
                reason: PublishAckReason::NoMatchingSubscribers,
                text: None,
            },
            SetAnswer {
                reason: PublishAckReason::QuotaExceeded,
                text: Some("the quota has been exceeded".into()),
            },
            SetAnswer {
                reason: PublishAckReason::UnspecifiedError,
                text: Some(String::new()),
            },
        ] {
            assert_eq!(SetAnswer::decode(&answer.encode()), Some(answer));
        }
        for bad in [
            &[][..],
            &[0x10],
            &[0x10, 2],
            &[0x10, 0, b'x'],
            &[0x42, 0],
            &[0x10, 1, 0xff],
        ] {
            assert_eq!(SetAnswer::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_request_is_its_session_and_packet_id() {
        let k = request_key("dev-1", 7, 1);
        assert_eq!(k, request_key("dev-1", 7, 1));
        for other in [
            request_key("dev-2", 7, 1),
            request_key("dev-1", 8, 1),
            request_key("dev-1", 7, 2),
        ] {
            assert_ne!(k, other);
        }
    }
}
