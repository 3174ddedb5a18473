use std::sync::Arc;

use super::*;
use crate::engine::Limits;
use crate::hlc::ManualClock;
use crate::storage::Store;

const NOW: u64 = 1_700_000_000_000;

async fn engine() -> Engine {
    Engine::open(
        Store::memory(),
        "svc",
        Arc::new(ManualClock::new(NOW)),
        Limits::default(),
    )
    .await
    .unwrap()
}

fn req(args: &[&[u8]], props: &[(&str, &str)]) -> Request {
    Request {
        topic: INVOKE_TOPIC.into(),
        qos: 1,
        payload: resp3::encode_request(args),
        response_topic: Some("clients/c1/resp".into()),
        correlation: Some(Bytes::from_static(b"corr-0123456789a")),
        user_properties: props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        message_expiry: Some(10),
    }
}

fn ts() -> String {
    format!("{NOW:015}:00000:c")
}

fn user(out: &Outgoing, name: &str) -> Option<String> {
    out.user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

#[tokio::test]
async fn set_answer_has_the_full_envelope() {
    let e = engine().await;
    let out = handle(&e, "svc-client", &req(&[b"SET", b"k", b"v"], &[("__ts", &ts())]))
        .await
        .unwrap();
    assert_eq!(out.topic, "clients/c1/resp");
    assert_eq!(&out.payload[..], b"+OK\r\n");
    assert_eq!(out.correlation.as_deref(), Some(&b"corr-0123456789a"[..]));
    assert_eq!(out.message_expiry, Some(10));
    assert_eq!(user(&out, "__stat").as_deref(), Some("200"));
    assert_eq!(user(&out, "__protVer").as_deref(), Some("1.0"));
    assert_eq!(user(&out, "__srcId").as_deref(), Some("svc-client"));
    assert_eq!(user(&out, "__ts").as_deref(), Some("001700000000000:00001:svc"));
}

#[tokio::test]
async fn envelopes_that_cannot_be_answered_are_dropped_unexecuted() {
    let e = engine().await;
    let set = |k: &[u8]| req(&[b"SET", k, b"v"], &[("__ts", &ts())]);
    let mut r = set(b"a");
    r.qos = 0;
    assert_eq!(handle(&e, "s", &r).await, Err(Dropped::NotQos1));
    let mut r = set(b"b");
    r.response_topic = None;
    assert_eq!(handle(&e, "s", &r).await, Err(Dropped::NoResponseTopic));
    let mut r = set(b"c");
    r.correlation = None;
    assert_eq!(handle(&e, "s", &r).await, Err(Dropped::NoCorrelationData));
    let mut r = set(b"d");
    r.response_topic = Some(INVOKE_TOPIC.into());
    assert_eq!(handle(&e, "s", &r).await, Err(Dropped::ForbiddenResponseTopic));
    let mut r = set(b"e");
    r.response_topic = Some(format!("{NOTIFY_TOPIC_PREFIX}/abc"));
    assert_eq!(handle(&e, "s", &r).await, Err(Dropped::ForbiddenResponseTopic));
    for k in [&b"a"[..], b"b", b"c", b"d", b"e"] {
        let got = handle(&e, "s", &req(&[b"GET", k], &[])).await.unwrap();
        assert_eq!(&got.payload[..], b"$-1\r\n");
    }
}

#[tokio::test]
async fn keynotify_without_a_caller_id_is_a_400() {
    let e = engine().await;
    let out = handle(&e, "s", &req(&[b"KEYNOTIFY", b"k"], &[])).await.unwrap();
    assert_eq!(user(&out, "__stat").as_deref(), Some("400"));
    assert_eq!(user(&out, "__propName").as_deref(), Some("__srcId"));
    assert!(out.payload.is_empty());
    assert_eq!(e.observing_clients(), 0);
}

#[tokio::test]
async fn protocol_version_major_must_be_one() {
    let e = engine().await;
    for v in ["1.0", "1.7", "1"] {
        let out = handle(&e, "s", &req(&[b"GET", b"k"], &[("__protVer", v)]))
            .await
            .unwrap();
        assert_eq!(user(&out, "__stat").as_deref(), Some("200"), "{v}");
    }
    for v in ["2.0", "0.9", "x", ""] {
        let out = handle(&e, "s", &req(&[b"GET", b"k"], &[("__protVer", v)]))
            .await
            .unwrap();
        assert_eq!(user(&out, "__stat").as_deref(), Some("505"), "{v}");
        assert_eq!(user(&out, "__supProtMajVer").as_deref(), Some("1"));
    }
}

#[tokio::test]
async fn malformed_fencing_token_is_a_malformed_timestamp() {
    let e = engine().await;
    let out = handle(&e, "s", &req(&[b"DEL", b"k"], &[("__ft", "nope")]))
        .await
        .unwrap();
    assert_eq!(&out.payload[..], b"-ERR malformed timestamp\r\n");
}

#[test]
fn notification_topic_is_upper_hex() {
    assert_eq!(
        notify_topic("client-id1", b"SOMEKEY"),
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
    );
    assert!(notify_topic("c", &[0xab, 0x0f]).ends_with("/command/notify/AB0F"));
}

#[test]
fn notification_payloads_are_exact() {
    assert_eq!(
        &notify_payload(Some(&Bytes::from_static(b"v\r\n")))[..],
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nv\r\n\r\n"
    );
    assert_eq!(&notify_payload(None)[..], b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
}

#[test]
fn read_only_commands_are_recognised_from_the_payload() {
    assert!(is_read_only(&resp3::encode_request([&b"GET"[..], b"k"])));
    assert!(is_read_only(&resp3::encode_request([&b"MGET"[..], b"k", b"j"])));
    assert!(is_read_only(&resp3::encode_request([&b"SCAN"[..], b"*", b"tok"])));
    for args in [
        &[&b"SET"[..], b"k", b"v"][..],
        &[b"GETX", b"k"],
        &[b"DEL", b"k"],
        &[b"VDEL", b"k", b"v"],
        &[],
    ] {
        assert!(!is_read_only(&resp3::encode_request(args.iter())), "{args:?}");
    }
    assert!(!is_read_only(b"GET k"));
    assert!(!is_read_only(b""));
}

/// MGET (a stategate extension): one element per key, `$-1` for an absent one, else
/// `[value, version]`; `__ts` is the newest version read.
#[tokio::test]
async fn mget_answers_values_and_versions() {
    let e = engine().await;
    let set = handle(&e, "s", &req(&[b"SET", b"a", b"1"], &[("__ts", &ts())]))
        .await
        .unwrap();
    let version = user(&set, "__ts").unwrap();
    let out = handle(&e, "s", &req(&[b"MGET", b"a", b"none"], &[])).await.unwrap();
    let expected = format!("*2\r\n*2\r\n$1\r\n1\r\n${}\r\n{version}\r\n$-1\r\n", version.len());
    assert_eq!(String::from_utf8_lossy(&out.payload), expected);
    assert_eq!(user(&out, "__ts").as_deref(), Some(version.as_str()));
    let out = handle(&e, "s", &req(&[b"MGET"], &[])).await.unwrap();
    assert_eq!(&out.payload[..], b"-ERR wrong number of arguments\r\n");
}
