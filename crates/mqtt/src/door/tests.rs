//! Admission and serving without a broker: limits answered 503, redeliveries answered once,
//! the verified caller used for KEYNOTIFY.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::INVOKE_TOPIC;
use crate::engine::Limits;
use crate::hlc::ManualClock;
use crate::resp3;
use crate::storage::Store;

const NOW: u64 = 1_700_000_000_000;

async fn door(limits: DoorLimits) -> Door {
    let engine = Engine::open(
        Store::memory(),
        "svc",
        Arc::new(ManualClock::new(NOW)),
        Limits::default(),
    )
    .await
    .unwrap();
    Door::new(engine, "svc-client".into(), limits)
}

fn req(args: &[&[u8]], corr: &str, props: &[(&str, &str)]) -> Request {
    Request {
        topic: INVOKE_TOPIC.into(),
        qos: 1,
        payload: resp3::encode_request(args),
        response_topic: Some("clients/c1/resp".into()),
        correlation: Some(Bytes::copy_from_slice(corr.as_bytes())),
        user_properties: props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        message_expiry: Some(10),
    }
}

fn ts() -> String {
    format!("{NOW:015}:00000:c")
}

fn status(out: &Outgoing) -> &str {
    out.user_properties
        .iter()
        .find(|(k, _)| k == "__stat")
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

#[tokio::test]
async fn the_inflight_limits_refuse_with_503_and_free_up_on_drop() {
    let d = door(DoorLimits {
        max_inflight: 2,
        ..DoorLimits::default()
    })
    .await;
    let get = req(&[b"GET", b"k"], "1", &[]);
    let a = d.admit(&get, None).expect("first");
    let b = d.admit(&get, None).expect("second");
    assert!(d.admit(&get, None).is_none(), "the third is over the limit");
    let busy = d.busy(&get).expect("answerable");
    assert_eq!(status(&busy), "503");
    assert!(busy.payload.is_empty());
    assert_eq!(busy.correlation.as_deref(), Some(&b"1"[..]));
    assert_eq!(d.refused_busy(), 1);
    drop(a);
    assert!(d.admit(&get, None).is_some());
    drop(b);

    // Bytes: a payload bigger than the byte budget is refused.
    let d = door(DoorLimits {
        max_inflight_bytes: 4096,
        ..DoorLimits::default()
    })
    .await;
    let big = vec![b'v'; 8192];
    let set = req(&[b"SET", b"k", &big], "2", &[("__ts", &ts())]);
    assert!(d.admit(&set, None).is_none());
    assert!(d.admit(&get, None).is_some());
}

#[tokio::test]
async fn one_caller_cannot_take_every_slot() {
    let d = door(DoorLimits {
        max_inflight_per_caller: 2,
        ..DoorLimits::default()
    })
    .await;
    let get = req(&[b"GET", b"k"], "1", &[]);
    let _a = d.admit(&get, Some("flood")).unwrap();
    let b = d.admit(&get, Some("flood")).unwrap();
    assert!(d.admit(&get, Some("flood")).is_none());
    assert!(d.admit(&get, Some("polite")).is_some(), "another caller is let in");
    drop(b);
    assert!(d.admit(&get, Some("flood")).is_some());
}

#[tokio::test]
async fn a_redelivered_write_runs_once_and_gets_the_same_answer() {
    let d = door(DoorLimits::default()).await;
    let set = req(&[b"SET", b"k", b"v", b"NX"], "c-1", &[("__ts", &ts())]);
    let first = d.serve(&set, &Caller::default()).await.unwrap();
    assert_eq!(&first.payload[..], b"+OK\r\n");
    let again = d.serve(&set, &Caller::default()).await.unwrap();
    assert_eq!(again, first, "the cached answer, not `:-1` from running NX again");
    // A new correlation is a new request: NX is not met now.
    let other = req(&[b"SET", b"k", b"v", b"NX"], "c-2", &[("__ts", &ts())]);
    assert_eq!(
        &d.serve(&other, &Caller::default()).await.unwrap().payload[..],
        b":-1\r\n"
    );
}

#[tokio::test]
async fn keynotify_for_another_client_is_refused_when_the_publisher_is_known() {
    let d = door(DoorLimits::default()).await;
    let real = Caller {
        client_id: Some("device-1".into()),
        session: Some(7),
        username: None,
    };
    let forged = req(&[b"KEYNOTIFY", b"k"], "n-1", &[("__srcId", "device-2")]);
    let out = d.serve(&forged, &real).await.unwrap();
    assert_eq!(status(&out), "403");
    assert!(out.payload.is_empty());
    assert!(d.engine().observers_of(b"k").is_empty());
    let honest = req(&[b"KEYNOTIFY", b"k"], "n-2", &[("__srcId", "device-1")]);
    assert_eq!(&d.serve(&honest, &real).await.unwrap().payload[..], b"+OK\r\n");
    assert_eq!(d.engine().observers_of(b"k").len(), 1);
    // The registration belongs to the publisher's session.
    assert_eq!(d.engine().drop_client("device-1", Some(8)).await, 0);
    assert_eq!(d.engine().drop_client("device-1", Some(7)).await, 1);
}

/// A sink that records the mirror's messages and holds the first one of `state/g` until
/// released, so a test can arrange the KEYNOTIFY queue while the notifier is busy.
struct HeldSink {
    published: tokio::sync::mpsc::UnboundedSender<(String, Bytes)>,
    release: tokio::sync::Semaphore,
    first: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Sink for HeldSink {
    async fn publish(&self, _out: &Outgoing) {}

    async fn publish_retained(&self, msg: &Retained) {
        let _ = self.published.send((msg.topic.clone(), msg.payload.clone()));
        if msg.topic == "state/g" && self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let _ = self.release.acquire().await;
        }
    }
}

async fn set(engine: &Engine, key: &str, value: &str) {
    let args = [b"SET".as_slice(), key.as_bytes(), value.as_bytes()]
        .iter()
        .map(|a| Bytes::copy_from_slice(a))
        .collect();
    let cmd = crate::engine::Command::parse(args, crate::engine::Meta::default()).unwrap();
    engine.execute(cmd).await.unwrap();
}

/// Item 5 of issue 27: after changes were dropped the mirror republishes every key; a change
/// still queued from before (older than what the republish read) must not follow it onto the
/// topic. The queue holds one notification (one byte: only an empty queue takes one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_queued_before_a_republish_does_not_overwrite_it() {
    let mut limits = Limits::default();
    limits.observers.queue_bytes = 1;
    let engine = Engine::open(Store::memory(), "svc", Arc::new(ManualClock::new(NOW)), limits)
        .await
        .unwrap();
    let topics = StateTopics {
        prefix: "state/".into(),
        set_by_publish: false,
        external_broker: false,
    };
    let d = Door::new(engine.clone(), "svc-client".into(), DoorLimits::default()).with_state_topics(Some(topics));
    // Written before the feed exists: the notifier's first republish sends it, and once it
    // arrived that republish is over.
    set(&engine, "a", "1").await;
    let feed = d.keynotify_feed().expect("the feed");
    let (tx, mut published) = tokio::sync::mpsc::unbounded_channel();
    let sink = Arc::new(HeldSink {
        published: tx,
        release: tokio::sync::Semaphore::new(0),
        first: true.into(),
    });
    let (_stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(notifier(feed, sink.clone(), &d, d.mirror(), stop));
    let mut next = async || published.recv().await.expect("the notifier runs");
    assert_eq!(next().await.0, "state/a");

    // The notifier takes `g` and is held publishing it: the queue is empty again.
    set(&engine, "g", "1").await;
    assert_eq!(next().await.0, "state/g");
    set(&engine, "k", "old").await; // queued
    set(&engine, "k", "new").await; // dropped: the queue is full
    set(&engine, "z", "1").await; // dropped
    assert_eq!(engine.keynotify_dropped(), 2);
    sink.release.add_permits(1);

    // The republish comes first (it read k = new), then what was queued. A last change, live
    // or (dropped while `k old` still waits) republished, comes after `k old` was taken.
    let mut k = Vec::new();
    let mut republished_z = false;
    while !republished_z {
        let (topic, value) = next().await;
        match topic.as_str() {
            "state/k" => k.push(value),
            "state/z" => republished_z = true,
            _ => {}
        }
    }
    set(&engine, "m", "1").await;
    loop {
        let (topic, value) = next().await;
        match topic.as_str() {
            "state/k" => k.push(value),
            "state/m" => break,
            _ => {}
        }
    }
    assert_eq!(
        k.first().map(|v| &v[..]),
        Some(&b"new"[..]),
        "the republish read k = new"
    );
    assert!(
        !k.iter().any(|v| v == "old"),
        "the value queued before the republish was published after it: {k:?}"
    );
    task.abort();
}
