//! State as MQTT topics (`--state-topics`, docs/state-topics.md) against the real service:
//! wildcard subscribers on the embedded broker and on Mosquitto get every current value
//! retained, then every change; a delete or expiry clears the topic; a key the subscriber may
//! not read never reaches it; a restart republishes (and, on an external broker, clears what
//! went meanwhile); set-by-publish answers with the PUBACK reason code; and replicas on one
//! Redis publish each change once.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{PubAckReason, Publish, PublishProperties};
use stategate::config::{BrokerChoice, Config};
use stategate::engine::{Command, Engine, Meta};
use stategate::mqtt::mirror::StateTopics;
use stategate::storage::Store;
use stategate::storage::durable::{DurableBackend, DurableOptions};

use crate::support::{Broker, Mosquitto, RawClient, Storage, TestEnv, copy_data_dir, now_ts, prop, unique_id};

const PREFIX: &str = "state/";

pub(crate) fn mirror(c: &mut Config) {
    let external = matches!(c.broker, BrokerChoice::External { .. });
    c.mqtt.state_topics = Some(StateTopics {
        prefix: PREFIX.into(),
        set_by_publish: false,
        external_broker: external,
    });
}

pub(crate) async fn run(engine: &Engine, args: &[&str]) {
    let args = args.iter().map(|a| Bytes::copy_from_slice(a.as_bytes())).collect();
    let cmd = Command::parse(args, Meta::default()).expect("a command");
    engine.execute(cmd).await.expect("executed");
}

fn topic(p: &Publish) -> String {
    String::from_utf8_lossy(&p.topic).into_owned()
}

/// A wildcard subscriber: what `mosquitto_sub -t 'state/#' -v` would print, with the flags.
async fn subscriber(port: u16) -> RawClient {
    let mut c = RawClient::connect(port, &unique_id("state-sub")).await;
    c.subscribe(&format!("{PREFIX}#")).await;
    c
}

/// Checks that a new subscription gets exactly `want` (topic, value) from the broker: read
/// until every wanted topic and the live `marker` key (written after the SUBACK) came. The
/// embedded broker sends retained messages from a task of their own, so the marker may
/// overtake them: waiting for both, a retained message that should not exist is caught if it
/// comes before the wanted ones are complete.
async fn expect_retained(port: u16, engine: &Engine, marker: &str, want: &[(&str, &str)]) {
    let mut c = subscriber(port).await;
    run(engine, &["SET", marker, "x"]).await;
    let marker = format!("{PREFIX}{marker}");
    let want: BTreeMap<String, String> = want.iter().map(|(t, v)| (t.to_string(), v.to_string())).collect();
    let mut seen = BTreeMap::new();
    let mut marked = false;
    while !marked || want.keys().any(|t| !seen.contains_key(t)) {
        let p = c.next().await;
        let t = topic(&p);
        if t == marker {
            marked = true;
            continue;
        }
        // Retained, or live when the mirror published it after this subscription (a restart
        // republishing): either way the broker's value now.
        seen.insert(t, String::from_utf8_lossy(&p.payload).into_owned());
    }
    assert_eq!(seen, want);
}

async fn current_values_then_every_change(broker: Broker) {
    let env = TestEnv::start_with(broker, mirror).await;
    let engine = env.engine();
    // Seen by a first subscriber, so the broker holds them before the second subscribes.
    let mut first = subscriber(env.broker_port).await;
    run(engine, &["SET", "devices/1/temp", "20"]).await;
    run(engine, &["SET", "greeting", "hi"]).await;
    for _ in 0..2 {
        first.next().await;
    }

    let mut sub = subscriber(env.broker_port).await;
    let mut retained = HashMap::new();
    for _ in 0..2 {
        let p = sub.next().await;
        assert!(p.retain, "current values come retained");
        assert_eq!(prop(&p, "kind"), Some("set"));
        assert!(prop(&p, "__ts").is_some_and(|v| v.parse::<stategate::hlc::Hlc>().is_ok()));
        retained.insert(topic(&p), p.payload.clone());
    }
    assert_eq!(retained["state/devices/1/temp"], "20");
    assert_eq!(retained["state/greeting"], "hi");

    // A key that cannot be a topic is skipped: the next message is the one after it.
    run(engine, &["SET", "bad+key", "1"]).await;
    run(engine, &["SET", "devices/1/temp", "21"]).await;
    let p = sub.next().await;
    assert_eq!(
        (topic(&p).as_str(), &p.payload[..]),
        ("state/devices/1/temp", &b"21"[..])
    );
    assert!(!p.retain, "a change to a live subscription is not flagged retained");
    let version = engine
        .read(&Bytes::from_static(b"devices/1/temp"))
        .await
        .unwrap()
        .unwrap()
        .version;
    assert_eq!(prop(&p, "__ts"), Some(version.to_string().as_str()));

    run(engine, &["DEL", "greeting"]).await;
    let p = sub.next().await;
    assert_eq!(topic(&p), "state/greeting");
    assert!(p.payload.is_empty(), "a delete clears the topic");
    assert_eq!(prop(&p, "kind"), Some("delete"));

    run(engine, &["SET", "session", "s", "PX", "1000"]).await;
    assert_eq!(&sub.next().await.payload[..], b"s");
    env.advance(2000);
    let p = sub.next().await;
    assert_eq!(
        (topic(&p).as_str(), prop(&p, "kind")),
        ("state/session", Some("expire"))
    );
    assert!(p.payload.is_empty());

    // A newcomer gets what is there now, nothing of what went.
    expect_retained(env.broker_port, engine, "marker", &[("state/devices/1/temp", "21")]).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_subscribers_get_current_values_then_every_change() {
    current_values_then_every_change(Broker::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_subscribers_get_current_values_then_every_change() {
    current_values_then_every_change(Broker::Mosquitto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_client_path_subscribers_get_current_values_then_every_change() {
    current_values_then_every_change(Broker::EmbeddedClientPath).await;
}

/// Anonymous callers may read `public/*` only. On the embedded broker each delivery is checked
/// against the subscriber's rules; behind Mosquitto (whose subscribers stategate cannot name)
/// only what an anonymous caller may read is published at all.
async fn a_denied_key_never_reaches_a_subscriber(broker: Broker) {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[[rule]]\nanonymous = true\nallow = [\"read\"]\nkeys = [\"public/*\"]\n\n\
         [[rule]]\nclient_ids = [\"*\"]\nallow = [\"read\"]\nkeys = [\"public/*\"]\n",
    )
    .unwrap();
    let env = TestEnv::start_with(broker, |c| {
        mirror(c);
        c.access.acl_file = Some(acl.clone());
    })
    .await;
    let engine = env.engine();
    run(engine, &["SET", "secret/x", "1"]).await;
    run(engine, &["SET", "public/y", "2"]).await;
    let mut sub = subscriber(env.broker_port).await;
    // Changes: the secret one first, and still only the public one arrives (its value may come
    // twice: retained, and again from the republish at start on an external broker).
    run(engine, &["SET", "secret/x", "3"]).await;
    run(engine, &["DEL", "secret/x"]).await;
    run(engine, &["SET", "public/y", "4"]).await;
    loop {
        let p = sub.next().await;
        assert_eq!(topic(&p), "state/public/y");
        if &p.payload[..] == b"4" {
            break;
        }
    }
    expect_retained(env.broker_port, engine, "public/marker", &[("state/public/y", "4")]).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_denied_key_never_reaches_a_subscriber() {
    a_denied_key_never_reaches_a_subscriber(Broker::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_a_denied_key_never_reaches_a_subscriber() {
    a_denied_key_never_reaches_a_subscriber(Broker::Mosquitto).await;
}

/// Nobody but the service publishes under the prefix of the embedded broker.
/// Changes dropped from a full notification queue do not leave topics stale: the mirror
/// notices the drop and publishes every key anew, clearing the topics of keys that went. A
/// queue of one byte takes only the first change of a transaction (they are queued back to
/// back, none taken meanwhile); the rest, the delete included, are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_dropped_from_a_full_queue_are_republished() {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        mirror(c);
        c.limits.observers.queue_bytes = 1;
    })
    .await;
    let engine = env.engine();
    let mut sub = subscriber(env.broker_port).await;
    run(engine, &["SET", "going", "soon gone"]).await;
    assert_eq!(topic(&sub.next().await), "state/going");
    let set = |k: String| {
        stategate::engine::TxOp::Set(stategate::engine::Set {
            key: Bytes::from(k),
            value: Bytes::from_static(b"v"),
            condition: stategate::engine::SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        })
    };
    let mut ops: Vec<_> = (0..20).map(|i| set(format!("k{i}"))).collect();
    ops.push(stategate::engine::TxOp::Del(stategate::engine::Del {
        key: Bytes::from_static(b"going"),
        fencing: None,
        condition: stategate::engine::DelCondition::Always,
    }));
    engine.transact(ops).await.expect("the transaction applies");
    assert!(engine.keynotify_dropped() > 0, "the queue dropped changes");
    // Every key comes back, and the deleted one is cleared (`gone`: its delete was lost).
    let mut values: HashMap<String, Bytes> = HashMap::new();
    while (0..20).any(|i| values.get(&format!("state/k{i}")).is_none_or(|v| v.is_empty()))
        || values.get("state/going").is_none_or(|v| !v.is_empty())
    {
        let p = sub.next().await;
        values.insert(topic(&p), p.payload.clone());
    }
    // A newcomer gets the keys there are, and nothing of the one that went.
    let want: Vec<(String, &str)> = (0..20).map(|i| (format!("state/k{i}"), "v")).collect();
    let want: Vec<(&str, &str)> = want.iter().map(|(t, v)| (t.as_str(), *v)).collect();
    expect_retained(env.broker_port, engine, "marker", &want).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_publish_state_topics() {
    let env = TestEnv::start_with(Broker::Embedded, mirror).await;
    let mut c = RawClient::connect(env.broker_port, &unique_id("spoofer")).await;
    c.publish(
        "state/foo",
        QoS::AtLeastOnce,
        Bytes::from_static(b"fake"),
        PublishProperties::default(),
    )
    .await;
    assert_eq!(c.next_puback().await, PubAckReason::NotAuthorized);
    env.stop().await;
}

/// The store's directory after a stop, changed offline (as another tool, or a replica, might
/// while this service is down): `b` deleted, `c` added.
async fn changed_while_down(dir: &std::path::Path) -> tempfile::TempDir {
    let offline = copy_data_dir(dir);
    {
        let store = Store::new(DurableBackend::open(DurableOptions::new(offline.path())).unwrap());
        let clock = std::sync::Arc::new(stategate::hlc::SystemClock);
        let engine = Engine::open(store, "offline", clock, Default::default()).await.unwrap();
        run(&engine, &["DEL", "b"]).await;
        run(&engine, &["SET", "c", "3"]).await;
    }
    // Started on a copy: the engine above may hold its directory's lock a moment longer.
    copy_data_dir(offline.path())
}

fn on_dir(dir: &std::path::Path) -> Storage {
    Storage::Shared(Store::new(DurableBackend::open(DurableOptions::new(dir)).unwrap()))
}

/// The embedded broker starts empty with the process: every current key is published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_republishes_on_the_embedded_broker() {
    let env = TestEnv::start_on(Broker::Embedded, Storage::Durable, mirror).await;
    run(env.engine(), &["SET", "a", "1"]).await;
    run(env.engine(), &["SET", "b", "2"]).await;
    let dir = env.stop_keeping_data().await.expect("a data dir");
    let copy = changed_while_down(dir.path()).await;
    let env = TestEnv::start_on(Broker::Embedded, on_dir(copy.path()), mirror).await;
    expect_retained(
        env.broker_port,
        env.engine(),
        "marker",
        &[("state/a", "1"), ("state/c", "3")],
    )
    .await;
    env.stop().await;
}

/// Mosquitto keeps its retained messages while the service restarts: the service publishes
/// every key again and clears the topics of keys that went while it was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_republishes_and_clears_on_an_external_broker() {
    let mosquitto = Mosquitto::start().await;
    let external = |c: &mut Config| {
        c.broker = BrokerChoice::External {
            host: "127.0.0.1".into(),
            port: mosquitto.port,
        };
        mirror(c);
    };
    let env = TestEnv::start_on(Broker::Embedded, Storage::Durable, external).await;
    run(env.engine(), &["SET", "a", "1"]).await;
    run(env.engine(), &["SET", "b", "2"]).await;
    let mut watcher = subscriber(mosquitto.port).await;
    let mut held = BTreeMap::new();
    while held.len() < 2 {
        let p = watcher.next().await;
        held.insert(topic(&p), p.payload.clone());
    }
    let dir = env.stop_keeping_data().await.expect("a data dir");
    let copy = changed_while_down(dir.path()).await;
    let env = TestEnv::start_on(Broker::Embedded, on_dir(copy.path()), external).await;
    // The watcher, subscribed throughout, sees b cleared as gone.
    loop {
        let p = watcher.next().await;
        if topic(&p) == "state/b" && p.payload.is_empty() {
            assert_eq!(prop(&p, "kind"), Some("gone"));
            break;
        }
    }
    expect_retained(
        mosquitto.port,
        env.engine(),
        "marker",
        &[("state/a", "1"), ("state/c", "3")],
    )
    .await;
    env.stop().await;
}

/// `<prefix><key>/set`: the PUBACK reason code is the whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_by_publish_answers_with_the_puback_reason() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[[rule]]\nanonymous = true\nclient_ids = [\"*\"]\nallow = [\"read\", \"write\"]\nkeys = [\"open/*\"]\n\n\
         [[rule]]\nclient_ids = [\"*\"]\nallow = [\"read\"]\nkeys = [\"ro/*\"]\n",
    )
    .unwrap();
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        mirror(c);
        if let Some(t) = &mut c.mqtt.state_topics {
            t.set_by_publish = true;
        }
        c.access.acl_file = Some(acl.clone());
        c.limits.max_keys = Some(2);
        c.limits.max_value_bytes = 16;
    })
    .await;
    let mut sub = subscriber(env.broker_port).await;
    let mut c = RawClient::connect(env.broker_port, &unique_id("setter")).await;
    let mut set = async |topic: &str, value: &str| {
        c.publish(
            topic,
            QoS::AtLeastOnce,
            Bytes::copy_from_slice(value.as_bytes()),
            PublishProperties::default(),
        )
        .await;
        c.next_puback().await
    };
    assert_eq!(set("state/open/a/set", "42").await, PubAckReason::NoMatchingSubscribers);
    assert_eq!(set("state/ro/x/set", "1").await, PubAckReason::NotAuthorized);
    assert_eq!(
        set("state/open/big/set", &"v".repeat(17)).await,
        PubAckReason::PayloadFormatInvalid
    );
    assert_eq!(set("state/open/b/set", "2").await, PubAckReason::NoMatchingSubscribers);
    assert_eq!(set("state/open/c/set", "3").await, PubAckReason::QuotaExceeded);
    // The sets went through the engine and the mirror; the requests themselves went nowhere.
    let stored = env.engine().read(&Bytes::from_static(b"open/a")).await.unwrap();
    assert_eq!(stored.unwrap().value, "42");
    for want in [("state/open/a", "42"), ("state/open/b", "2")] {
        let p = sub.next().await;
        assert_eq!((topic(&p).as_str(), &p.payload[..]), (want.0, want.1.as_bytes()));
    }
    env.stop().await;
}

/// Three replicas on one Redis behind one Mosquitto: writes spread over them by the shared
/// subscription, and each change reaches the broker once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_publish_each_change_once() {
    let env = TestEnv::start_with(Broker::RedisReplicas, mirror).await;
    // The mirror's owner is picked among the members: wait until all three joined (state the
    // heartbeats change in the background: nothing to await).
    let patience = std::time::Instant::now() + crate::support::WAIT;
    while env.engine().other_senders() != Some(2) {
        assert!(std::time::Instant::now() < patience, "the replicas did not all join");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let mut sub = subscriber(env.broker_port).await;
    let mut writer = RawClient::connect(env.broker_port, &unique_id("writer")).await;
    let n = 30;
    for i in 0..n {
        let (key, value) = (format!("k{i}"), i.to_string());
        let reply = writer
            .request(&[b"SET", key.as_bytes(), value.as_bytes()], &[("__ts", &now_ts())])
            .await;
        assert_eq!(&reply.payload[..], b"+OK\r\n");
    }
    // A last change behind all of them: once it is in, every earlier one is too (one sender
    // at a time, in log order).
    run(env.engine(), &["SET", "last", "x"]).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    loop {
        let p = sub.next().await;
        let t = topic(&p);
        *seen.entry(t.clone()).or_default() += 1;
        if t == "state/last" {
            break;
        }
    }
    assert_eq!(seen.len(), n + 1, "every change arrived: {seen:?}");
    assert!(seen.values().all(|c| *c == 1), "each change once: {seen:?}");
    env.stop().await;
}
