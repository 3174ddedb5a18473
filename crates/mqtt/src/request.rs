//! The request/response envelope of the state store protocol, without I/O.
//!
//! [`handle`] turns one incoming request into at most one outgoing response. It never panics
//! and never changes state for a request it refuses.

use bytes::Bytes;

use super::payload::{ErrorReply, error_reply, reply_frame};
use super::{INVOKE_TOPIC, NOTIFY_TOPIC_PREFIX};
use crate::access::{self, Access, Principal};
use crate::engine::{Command, Engine, EngineError, Meta, RequestId};
use crate::hlc::Hlc;
use crate::resp3;

pub use crate::resp3::envelope::{
    CONTENT_TYPE, PROP_FENCING_TOKEN, PROP_PERSISTENCE, PROP_PROPERTY_NAME, PROP_PROTOCOL_VERSION,
    PROP_REQUEST_PROTOCOL_VERSION, PROP_SOURCE_ID, PROP_STATUS, PROP_STATUS_MESSAGE, PROP_SUPPORTED_MAJOR,
    PROP_TIMESTAMP, PROTOCOL_VERSION, notify_payload, notify_topic, notify_topic_client_level,
};

/// An incoming PUBLISH, as far as the protocol cares (independent of the MQTT client library).
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub topic: String,
    pub qos: u8,
    pub payload: Bytes,
    pub response_topic: Option<String>,
    pub correlation: Option<Bytes>,
    pub user_properties: Vec<(String, String)>,
    pub message_expiry: Option<u32>,
}

impl Request {
    /// The caller's client id as it claims it (`__srcId`), if any.
    pub fn claimed_source(&self) -> Option<&str> {
        self.property(PROP_SOURCE_ID).filter(|c| !c.is_empty())
    }

    fn property(&self, name: &str) -> Option<&str> {
        self.user_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Who sent a request, as far as the transport can tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The publisher's client id as the broker knows it (in-broker serving). `None` behind a
    /// client connection: then the claimed `__srcId` is all there is, unverified.
    pub client_id: Option<String>,
    /// The publisher's broker session: KEYNOTIFY registrations end with it.
    pub session: Option<u64>,
    /// The name the publisher authenticated with (in-broker serving): a password-file user or
    /// a certificate identity. Never taken from the request.
    pub username: Option<String>,
}

/// An outgoing PUBLISH at QoS 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub topic: String,
    pub payload: Bytes,
    pub correlation: Option<Bytes>,
    pub user_properties: Vec<(String, String)>,
    pub message_expiry: Option<u32>,
}

/// Why a request got no response at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    NotQos1,
    NoResponseTopic,
    NoCorrelationData,
    ForbiddenResponseTopic,
}

/// A response topic a state store must never publish to.
pub fn is_forbidden_response_topic(topic: &str) -> bool {
    topic == INVOKE_TOPIC || topic.starts_with(NOTIFY_TOPIC_PREFIX)
}

/// The routing part of a request that is answered.
struct ReplyTo {
    topic: String,
    correlation: Bytes,
    message_expiry: Option<u32>,
}

/// Checks the envelope: `Err` when nothing may be sent back.
fn reply_to(req: &Request) -> Result<ReplyTo, Dropped> {
    if req.qos != 1 {
        return Err(Dropped::NotQos1);
    }
    let topic = req.response_topic.clone().ok_or(Dropped::NoResponseTopic)?;
    if topic.is_empty() {
        return Err(Dropped::NoResponseTopic);
    }
    if is_forbidden_response_topic(&topic) {
        return Err(Dropped::ForbiddenResponseTopic);
    }
    let correlation = req.correlation.clone().ok_or(Dropped::NoCorrelationData)?;
    Ok(ReplyTo {
        topic,
        correlation,
        message_expiry: req.message_expiry,
    })
}

/// What the request asks for, once the envelope is valid.
enum Parsed {
    Execute(Command, Option<String>),
    /// A `-ERR` payload with `__stat=200`.
    Refused(EngineError),
    /// A broken RPC envelope: status and extra user properties.
    Rpc(u16, &'static str, Vec<(String, String)>),
}

fn parse(req: &Request, caller: &Caller) -> Parsed {
    if let Some(v) = req.property(PROP_PROTOCOL_VERSION) {
        let major = v.split('.').next().and_then(|m| m.parse::<u32>().ok());
        if major != Some(1) {
            return Parsed::Rpc(
                505,
                "unsupported protocol version",
                vec![
                    (PROP_SUPPORTED_MAJOR.into(), "1".into()),
                    (PROP_REQUEST_PROTOCOL_VERSION.into(), v.into()),
                ],
            );
        }
    }
    let args = match resp3::decode_request(&req.payload) {
        Ok(args) => args,
        Err(_) => return Parsed::Refused(EngineError::Syntax),
    };
    let hlc_prop = |name: &str| -> Result<Option<Hlc>, EngineError> {
        req.property(name)
            .map(|v| v.parse::<Hlc>().map_err(|_| EngineError::MalformedTimestamp))
            .transpose()
    };
    let timestamp = match hlc_prop(PROP_TIMESTAMP) {
        Ok(t) => t,
        Err(e) => return Parsed::Refused(e),
    };
    let fencing = match hlc_prop(PROP_FENCING_TOKEN) {
        Ok(t) => t,
        Err(e) => return Parsed::Refused(e),
    };
    let claimed = req.property(PROP_SOURCE_ID).filter(|c| !c.is_empty());
    let is_keynotify = args.first().is_some_and(|v| &v[..] == b"KEYNOTIFY");
    let client = match (&caller.client_id, claimed) {
        // Nobody registers notifications for another client.
        (Some(real), Some(claimed)) if is_keynotify && real != claimed => {
            return Parsed::Refused(EngineError::NotAuthorized);
        }
        (Some(real), _) => Some(real.clone()),
        (None, claimed) => claimed.map(str::to_owned),
    };
    if is_keynotify && client.is_none() {
        return Parsed::Rpc(
            400,
            "KEYNOTIFY needs the caller's client id",
            vec![(PROP_PROPERTY_NAME.into(), PROP_SOURCE_ID.into())],
        );
    }
    let meta = Meta {
        timestamp,
        fencing,
        client: client.clone(),
        session: caller.session,
        // The SDKs send `true` or nothing; `false` (or anything else) asks for nothing.
        persist: req
            .property(PROP_PERSISTENCE)
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
    };
    match Command::parse(args, meta) {
        Ok(Command::Set(s)) if s.timestamp.is_none() => Parsed::Refused(EngineError::MissingTimestamp),
        Ok(cmd) => Parsed::Execute(cmd, client),
        Err(e) => Parsed::Refused(e),
    }
}

/// Handles one request from a caller the transport cannot identify (behind a client
/// connection): `Err` when it must go unanswered (and unexecuted).
pub async fn handle(engine: &Engine, service_id: &str, req: &Request) -> Result<Outgoing, Dropped> {
    static OPEN: std::sync::OnceLock<Access> = std::sync::OnceLock::new();
    let access = OPEN.get_or_init(Access::open);
    handle_as(engine, access, service_id, req, &Caller::default(), None).await
}

/// Who the rules see: the identity the broker vouches for; with an external broker nothing,
/// or the claimed `__srcId` when the operator opted in to trust it.
fn principal(access: &Access, req: &Request, caller: &Caller) -> Principal {
    let claimed = || {
        access
            .trust_src_id()
            .then(|| req.claimed_source().map(str::to_owned))
            .flatten()
    };
    Principal {
        client_id: caller.client_id.clone().or_else(claimed),
        username: caller.username.clone(),
        token: None,
    }
}

/// Handles one request from `caller`, as `access` allows: `Err` when it must go unanswered
/// (and unexecuted). A write with `request` is executed at most once per id (redeliveries).
pub async fn handle_as(
    engine: &Engine,
    access: &Access,
    service_id: &str,
    req: &Request,
    caller: &Caller,
    request: Option<&RequestId>,
) -> Result<Outgoing, Dropped> {
    let to = reply_to(req)?;
    let principal = principal(access, req, caller);
    // The rate counts per verified identity; behind an external broker the claimed id is all
    // there is to tell callers apart (a liar only spends someone else's bucket or a new one).
    let rate_key = match (&principal.client_id, &principal.username, req.claimed_source()) {
        (None, None, Some(claimed)) => Principal {
            client_id: Some(claimed.to_owned()),
            ..Principal::default()
        },
        _ => principal.clone(),
    };
    let parsed = match access.admit(&rate_key) {
        Ok(()) => parse(req, caller),
        Err(e) => Parsed::Refused(e),
    };
    let (payload, status, version, extra) = match parsed {
        Parsed::Execute(cmd, client) => {
            if let Some(c) = &client {
                engine.touch_client(c);
            }
            let name = cmd.name();
            let grant = access.grant(principal);
            match access::execute_request(engine, &grant, cmd, request).await {
                Ok(resp) => (reply_frame(resp.reply).encode(), 200, resp.version, vec![]),
                Err(e) => match error_reply(&e) {
                    ErrorReply::Payload(f) => (f.encode(), 200, None, vec![]),
                    ErrorReply::Status(status, msg) => (
                        Bytes::new(),
                        status,
                        None,
                        vec![(PROP_STATUS_MESSAGE.to_owned(), msg.to_owned())],
                    ),
                    ErrorReply::ServiceFault => {
                        tracing::error!(cmd = name, cause = %e, detail = ?e, "state store request failed");
                        let msg = (PROP_STATUS_MESSAGE.to_owned(), "internal error".to_owned());
                        (Bytes::new(), 500, None, vec![msg])
                    }
                },
            }
        }
        Parsed::Refused(e) => match error_reply(&e) {
            ErrorReply::Payload(f) => (f.encode(), 200, None, vec![]),
            ErrorReply::Status(status, msg) => (
                Bytes::new(),
                status,
                None,
                vec![(PROP_STATUS_MESSAGE.to_owned(), msg.to_owned())],
            ),
            ErrorReply::ServiceFault => (Bytes::new(), 500, None, vec![]),
        },
        Parsed::Rpc(status, message, mut extra) => {
            extra.push((PROP_STATUS_MESSAGE.into(), message.into()));
            (Bytes::new(), status, None, extra)
        }
    };
    let mut props = Vec::with_capacity(4 + extra.len());
    props.push((PROP_STATUS.to_owned(), status.to_string()));
    props.push((PROP_PROTOCOL_VERSION.to_owned(), PROTOCOL_VERSION.to_owned()));
    props.push((PROP_SOURCE_ID.to_owned(), service_id.to_owned()));
    if let Some(v) = version {
        props.push((PROP_TIMESTAMP.to_owned(), v.to_string()));
    }
    props.extend(extra);
    Ok(Outgoing {
        topic: to.topic,
        payload,
        correlation: Some(to.correlation),
        user_properties: props,
        message_expiry: to.message_expiry,
    })
}

/// The id of a request across redeliveries and replicas: its response topic and correlation
/// data (what a client keeps for the request's lifetime), length-prefixed so that no two pairs
/// give the same id.
pub fn request_id(topic: &str, correlation: &[u8]) -> Bytes {
    let mut id = Vec::with_capacity(4 + topic.len() + correlation.len());
    id.extend_from_slice(&(topic.len() as u32).to_be_bytes());
    id.extend_from_slice(topic.as_bytes());
    id.extend_from_slice(correlation);
    Bytes::from(id)
}

/// Whether a payload is a command that changes nothing (GET, SCAN), judged from its first
/// argument without decoding the rest. Anything unsure counts as a change.
pub fn is_read_only(payload: &[u8]) -> bool {
    // `*<n>\r\n$<len>\r\n<verb>\r\n...`
    let Some(rest) = payload.strip_prefix(b"*") else {
        return false;
    };
    let Some(pos) = rest.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    let rest = &rest[pos + 2..];
    rest.starts_with(b"$3\r\nGET\r\n") || rest.starts_with(b"$4\r\nSCAN\r\n") || rest.starts_with(b"$4\r\nMGET\r\n")
}

/// The answer to a request refused because too many run at once: `__stat=503`, nothing executed.
/// `None` when the request cannot be answered at all.
pub fn busy(service_id: &str, req: &Request) -> Option<Outgoing> {
    let to = reply_to(req).ok()?;
    Some(Outgoing {
        topic: to.topic,
        payload: Bytes::new(),
        correlation: Some(to.correlation),
        user_properties: vec![
            (PROP_STATUS.to_owned(), "503".to_owned()),
            (
                PROP_STATUS_MESSAGE.to_owned(),
                "the state store is busy; retry".to_owned(),
            ),
            (PROP_PROTOCOL_VERSION.to_owned(), PROTOCOL_VERSION.to_owned()),
            (PROP_SOURCE_ID.to_owned(), service_id.to_owned()),
        ],
        message_expiry: to.message_expiry,
    })
}

#[cfg(test)]
mod tests;
