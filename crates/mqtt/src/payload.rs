//! Engine replies and errors as RESP payload bytes, exactly as the state store clients expect.

use crate::engine::{EngineError, Reply};
use crate::resp3::Frame;

/// The payload for a reply.
pub fn reply_frame(reply: Reply) -> Frame {
    match reply {
        Reply::Ok => Frame::Simple("OK".into()),
        Reply::NotApplied => Frame::Integer(-1),
        Reply::Nil => Frame::Null,
        Reply::Value(v) => Frame::Bulk(v),
        Reply::Int(i) => Frame::Integer(i),
        Reply::Keys { keys, token } => {
            let keys = Frame::Array(keys.into_iter().map(Frame::Bulk).collect());
            match token {
                None => Frame::Array(vec![keys]),
                Some(t) => Frame::Array(vec![keys, Frame::Bulk(t)]),
            }
        }
        // One element per key asked: a null, or [value, version] (the version as `__ts`
        // carries it).
        Reply::Values(values) => Frame::Array(
            values
                .into_iter()
                .map(|v| match v {
                    None => Frame::Null,
                    Some(entry) => Frame::Array(vec![
                        Frame::Bulk(entry.value),
                        Frame::Bulk(bytes::Bytes::from(entry.version.to_string())),
                    ]),
                })
                .collect(),
        ),
    }
}

/// How an engine error travels over MQTT: a `-ERR` payload with `__stat=200`, an RPC-level
/// status with a message and an empty payload (nothing a client could mistake for data), or
/// (storage faults) an RPC-level 500 whose details stay in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorReply {
    Payload(Frame),
    Status(u16, &'static str),
    ServiceFault,
}

pub fn error_reply(err: &EngineError) -> ErrorReply {
    let text = match err {
        EngineError::UnknownCommand
        | EngineError::WrongArity
        | EngineError::Syntax
        | EngineError::EmptyKey
        | EngineError::MissingTimestamp
        | EngineError::MalformedTimestamp
        | EngineError::TimestampSkew
        | EngineError::FencingTokenRequired
        | EngineError::FencingTokenSkew
        | EngineError::FencingTokenLower
        | EngineError::QuotaExceeded
        | EngineError::TooLarge
        | EngineError::NotPersistent => err.to_string(),
        // The AIO protocol's clients know a bad PX as a syntax error.
        EngineError::TtlOutOfRange => EngineError::Syntax.to_string(),
        // Not reachable from an MQTT command (no ETags on this door); answered honestly anyway.
        EngineError::VersionMismatch => "the stored version does not match the requested version".into(),
        EngineError::NotAuthorized => return ErrorReply::Status(403, "not authorized"),
        EngineError::RateLimited => return ErrorReply::Status(429, "too many requests; slow down"),
        EngineError::Unavailable => return ErrorReply::Status(503, "the storage is unavailable; retry later"),
        EngineError::StorageFull => {
            return ErrorReply::Status(507, "the storage is full; writes are refused until space is freed");
        }
        EngineError::Storage(_) => return ErrorReply::ServiceFault,
    };
    ErrorReply::Payload(Frame::Error(format!("ERR {text}")))
}

#[cfg(test)]
mod tests;
