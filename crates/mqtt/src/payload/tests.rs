//! Every reply and every error of spec section 3, byte for byte.

use bytes::Bytes;

use super::*;
use crate::storage::StorageError;

#[track_caller]
fn check_reply(reply: Reply, wire: &[u8]) {
    let frame = reply_frame(reply.clone());
    assert_eq!(frame.encode(), Bytes::copy_from_slice(wire), "{reply:?}");
}

#[track_caller]
fn check_error(err: EngineError, wire: &str) {
    match error_reply(&err) {
        ErrorReply::Payload(frame) => {
            assert_eq!(frame.encode(), Bytes::copy_from_slice(wire.as_bytes()), "{err:?}")
        }
        ErrorReply::Status(..) | ErrorReply::ServiceFault => panic!("{err:?} must be a -ERR payload"),
    }
}

fn keys(list: &[&[u8]]) -> Vec<Bytes> {
    list.iter().map(|k| Bytes::copy_from_slice(k)).collect()
}

#[test]
fn replies_are_byte_exact() {
    check_reply(Reply::Ok, b"+OK\r\n");
    check_reply(Reply::NotApplied, b":-1\r\n");
    check_reply(Reply::Nil, b"$-1\r\n");
    check_reply(Reply::Value(Bytes::from_static(b"hello")), b"$5\r\nhello\r\n");
    check_reply(Reply::Value(Bytes::new()), b"$0\r\n\r\n");
    check_reply(Reply::Value(Bytes::from_static(b"a\r\nb")), b"$4\r\na\r\nb\r\n");
    check_reply(Reply::Int(1), b":1\r\n");
    check_reply(Reply::Int(0), b":0\r\n");
}

#[test]
fn scan_replies_are_byte_exact() {
    check_reply(
        Reply::Keys {
            keys: keys(&[b"key1", b"key2"]),
            token: None,
        },
        b"*1\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n",
    );
    check_reply(
        Reply::Keys {
            keys: vec![],
            token: None,
        },
        b"*1\r\n*0\r\n",
    );
    check_reply(
        Reply::Keys {
            keys: keys(&[b"key1"]),
            token: Some(Bytes::from_static(b"6B657931")),
        },
        b"*2\r\n*1\r\n$4\r\nkey1\r\n$8\r\n6B657931\r\n",
    );
    // More pages follow although none of the examined keys matched (k = 0).
    check_reply(
        Reply::Keys {
            keys: vec![],
            token: Some(Bytes::from_static(b"6B")),
        },
        b"*2\r\n*0\r\n$2\r\n6B\r\n",
    );
    // Binary keys travel as they are.
    check_reply(
        Reply::Keys {
            keys: keys(&[b"\x00\r\n\xff"]),
            token: None,
        },
        b"*1\r\n*1\r\n$4\r\n\x00\r\n\xff\r\n",
    );
}

#[test]
fn errors_are_byte_exact() {
    let cases = [
        (
            EngineError::TimestampSkew,
            "-ERR the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n",
        ),
        (
            EngineError::FencingTokenRequired,
            "-ERR a fencing token is required for this request\r\n",
        ),
        (
            EngineError::FencingTokenSkew,
            "-ERR the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n",
        ),
        (
            EngineError::FencingTokenLower,
            "-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n",
        ),
        (EngineError::QuotaExceeded, "-ERR the quota has been exceeded\r\n"),
        (EngineError::Syntax, "-ERR syntax error\r\n"),
        (EngineError::UnknownCommand, "-ERR unknown command\r\n"),
        (EngineError::WrongArity, "-ERR wrong number of arguments\r\n"),
        (EngineError::MissingTimestamp, "-ERR missing timestamp\r\n"),
        (EngineError::MalformedTimestamp, "-ERR malformed timestamp\r\n"),
        (EngineError::EmptyKey, "-ERR the key length is zero\r\n"),
        (
            EngineError::VersionMismatch,
            "-ERR the stored version does not match the requested version\r\n",
        ),
    ];
    for (err, wire) in cases {
        check_error(err, wire);
    }
}

#[test]
fn error_payloads_have_no_colon_and_one_space() {
    for err in [EngineError::Syntax, EngineError::QuotaExceeded, EngineError::EmptyKey] {
        let ErrorReply::Payload(Frame::Error(text)) = error_reply(&err) else {
            panic!("{err:?} must be a -ERR payload");
        };
        assert!(text.starts_with("ERR ") && !text.starts_with("ERR  "), "{text:?}");
        assert!(!text.starts_with("ERR:"), "{text:?}");
        assert!(!text.contains('\r') && !text.contains('\n'), "{text:?}");
    }
}

#[test]
fn storage_failures_are_service_faults_without_details() {
    for err in [
        StorageError::Backend("secret connection string".into()),
        StorageError::Corrupt("page 7".into()),
        StorageError::Io(std::io::Error::other("disk on fire")),
    ] {
        assert_eq!(error_reply(&EngineError::Storage(err)), ErrorReply::ServiceFault);
    }
}

#[test]
fn refusals_a_client_can_act_on_are_rpc_statuses_with_an_empty_payload() {
    let cases = [
        (EngineError::NotAuthorized, 403),
        (EngineError::RateLimited, 429),
        (EngineError::Unavailable, 503),
        (EngineError::StorageFull, 507),
        (EngineError::from(StorageError::Unavailable("redis down".into())), 503),
        (EngineError::from(StorageError::Full("ENOSPC".into())), 507),
    ];
    for (err, status) in cases {
        match error_reply(&err) {
            ErrorReply::Status(s, msg) => {
                assert_eq!(s, status, "{err:?}");
                assert!(!msg.contains("redis") && !msg.contains("ENOSPC"), "{msg}");
            }
            other => panic!("{err:?} must be an RPC status, got {other:?}"),
        }
    }
}
