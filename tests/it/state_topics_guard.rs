//! What clients cannot do to the state topics (docs/state-topics.md): forge a mirror message
//! with a Will or a publish under the prefix, set a key the mirror could never show, have a
//! set applied twice by a redelivery; and what the mirror does when an external broker refuses
//! the subscription it reads retained topics with.

use bytes::Bytes;
use rumqttc::v5::MqttOptions;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{LastWill, LastWillProperties, PubAckReason, Publish, PublishProperties};
use stategate::config::{BrokerChoice, Config};
use stategate::engine::{Command, Engine, Meta};
use stategate::mqtt::mirror::StateTopics;

use crate::mqtt_auth_connect::connect;
use crate::support::{Broker, Mosquitto, RawClient, TestEnv, unique_id};

const PREFIX: &str = "state/";

fn mirror(c: &mut Config, set_by_publish: bool) {
    let external = matches!(c.broker, BrokerChoice::External { .. });
    c.mqtt.state_topics = Some(StateTopics {
        prefix: PREFIX.into(),
        set_by_publish,
        external_broker: external,
    });
}

async fn run(engine: &Engine, args: &[&str]) {
    let args = args.iter().map(|a| Bytes::copy_from_slice(a.as_bytes())).collect();
    let cmd = Command::parse(args, Meta::default()).expect("a command");
    engine.execute(cmd).await.expect("executed");
}

async fn value(engine: &Engine, key: &str) -> Option<Bytes> {
    let entry = engine.read(&Bytes::copy_from_slice(key.as_bytes())).await.unwrap();
    entry.map(|e| e.value)
}

fn topic(p: &Publish) -> String {
    String::from_utf8_lossy(&p.topic).into_owned()
}

/// Sets `marker` and reads `sub` until its message comes: every message before it (which the
/// test then says must not exist).
async fn until_marker(engine: &Engine, sub: &mut RawClient, marker: &str) -> Vec<(String, Bytes)> {
    run(engine, &["SET", marker, "x"]).await;
    let marker = format!("{PREFIX}{marker}");
    let mut before = Vec::new();
    loop {
        let p = sub.next().await;
        if topic(&p) == marker {
            return before;
        }
        before.push((topic(&p), p.payload.clone()));
    }
}

/// Tried by hand against the release build: a Will on `state/door/open` with the mirror's own
/// user properties reached every `state/#` subscriber as if stategate had published it when
/// its client dropped (rmqtt publishes Wills past the publish hooks, and the Will check at
/// CONNECT covered the protocol's topics only, and only with access control). Now the prefix
/// is the service's for Wills too, with or without rules, retained or not, set topics
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_under_the_prefix_is_refused_with_or_without_rules() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[[rule]]\nanonymous = true\nclient_ids = [\"*\"]\nallow = [\"read\", \"write\"]\nkeys = [\"*\"]\n",
    )
    .unwrap();
    for rules in [false, true] {
        let acl = acl.clone();
        let env = TestEnv::start_with(Broker::Embedded, |c| {
            mirror(c, true);
            c.access.acl_file = rules.then_some(acl);
        })
        .await;
        let mut sub = RawClient::connect(env.broker_port, &unique_id("state-sub")).await;
        sub.subscribe(&format!("{PREFIX}#")).await;
        for (will_topic, retain) in [
            ("state/door/open", false),
            ("state/door/open", true),
            ("state/door/set", false),
        ] {
            let forged = LastWillProperties {
                delay_interval: None,
                payload_format_indicator: None,
                message_expiry_interval: None,
                content_type: None,
                response_topic: None,
                correlation_data: None,
                user_properties: vec![
                    ("__ts".into(), "009999999999999:00000:x".into()),
                    ("kind".into(), "set".into()),
                ],
            };
            let mut o = MqttOptions::new(unique_id("forger"), "127.0.0.1", env.broker_port);
            o.set_last_will(LastWill::new(
                will_topic,
                "false",
                QoS::AtLeastOnce,
                retain,
                Some(forged),
            ));
            // Accepted, it would be dropped here (no DISCONNECT) and its Will published.
            let case = format!("a Will on {will_topic} (retained: {retain}, rules: {rules})");
            match connect(o).await {
                Ok(_forger) => panic!("{case} was accepted"),
                Err(e) => assert!(e.contains("NotAuthorized"), "{case}: {e}"),
            }
        }
        let forged = until_marker(env.engine(), &mut sub, "marker").await;
        assert!(forged.is_empty(), "rules: {rules}: {forged:?}");
        env.stop().await;
    }
}

/// The one rule for the prefix holds for a PUBLISH too, retained or not: refused (0x87), never
/// routed, never kept for a newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_under_the_prefix_are_refused_retained_or_not() {
    let env = TestEnv::start_with(Broker::Embedded, |c| mirror(c, true)).await;
    let mut c = RawClient::connect(env.broker_port, &unique_id("spoofer")).await;
    for retain in [false, true] {
        c.client
            .publish_with_properties(
                "state/door/open",
                QoS::AtLeastOnce,
                retain,
                "false",
                PublishProperties::default(),
            )
            .await
            .unwrap();
        assert_eq!(c.next_puback().await, PubAckReason::NotAuthorized, "retained: {retain}");
    }
    let mut newcomer = RawClient::connect(env.broker_port, &unique_id("newcomer")).await;
    newcomer.subscribe(&format!("{PREFIX}#")).await;
    let kept = until_marker(env.engine(), &mut newcomer, "marker").await;
    assert!(kept.is_empty(), "{kept:?}");
    env.stop().await;
}

/// `state/a//set` set key `a/`, `state/x/set/set` key `x/set`: keys the mirror can never
/// publish, so nobody would ever see them. The set request's key is checked as the mirror's:
/// PUBACK 0x90 Topic Name invalid, nothing set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_by_publish_refuses_keys_the_mirror_cannot_carry() {
    let env = TestEnv::start_with(Broker::Embedded, |c| mirror(c, true)).await;
    let mut c = RawClient::connect(env.broker_port, &unique_id("setter")).await;
    for (set_topic, key) in [
        ("state/a//set", "a/"),
        ("state/x/set/set", "x/set"),
        ("state//a/set", "/a"),
    ] {
        c.publish(
            set_topic,
            QoS::AtLeastOnce,
            Bytes::from_static(b"v"),
            PublishProperties::default(),
        )
        .await;
        assert_eq!(c.next_puback().await, PubAckReason::TopicNameInvalid, "{set_topic}");
        assert_eq!(value(env.engine(), key).await, None, "{set_topic} set {key:?}");
    }
    c.publish(
        "state/a/set",
        QoS::AtLeastOnce,
        Bytes::from_static(b"v"),
        PublishProperties::default(),
    )
    .await;
    assert_eq!(c.next_puback().await, PubAckReason::NoMatchingSubscribers);
    assert_eq!(value(env.engine(), "a").await.as_deref(), Some(&b"v"[..]));
    env.stop().await;
}

/// MQTT5 packets written by hand: a client that resends a PUBLISH with DUP under the packet id
/// it chose, as one whose PUBACK was lost does after reconnecting.
mod raw {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use crate::resources::raw::{packet, string};
    use crate::support::within;

    /// One MQTT5 connection with a session that outlives it (clean start off, 5 minutes).
    pub struct Client(TcpStream);

    impl Client {
        pub async fn connect(port: u16, client_id: &str) -> Client {
            let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let mut b = Vec::new();
            string(b"MQTT", &mut b);
            // Version 5, no flags (clean start off), keep alive 60 s; Session Expiry 300 s.
            b.extend_from_slice(&[5, 0x00, 0, 60, 5, 0x11]);
            b.extend_from_slice(&300u32.to_be_bytes());
            string(client_id.as_bytes(), &mut b);
            s.write_all(&packet(0x10, b)).await.unwrap();
            let mut c = Client(s);
            let (kind, body) = c.read().await;
            assert_eq!((kind, body.get(1)), (0x20, Some(&0)), "CONNACK accepted: {body:?}");
            c
        }

        /// A QoS 1 PUBLISH; the PUBACK's reason code (0x00 when it carries none).
        pub async fn publish(&mut self, topic: &str, packet_id: u16, dup: bool, payload: &[u8]) -> u8 {
            let mut b = Vec::new();
            string(topic.as_bytes(), &mut b);
            b.extend_from_slice(&packet_id.to_be_bytes());
            b.push(0);
            b.extend_from_slice(payload);
            let header = if dup { 0x3a } else { 0x32 };
            self.0.write_all(&packet(header, b)).await.unwrap();
            let (kind, body) = self.read().await;
            assert_eq!(kind, 0x40, "a PUBACK");
            assert_eq!(&body[..2], &packet_id.to_be_bytes(), "the PUBACK of this packet");
            body.get(2).copied().unwrap_or(0)
        }

        /// The next packet: (type nibble << 4, body).
        async fn read(&mut self) -> (u8, Vec<u8>) {
            within("a packet from the broker", async {
                let first = self.0.read_u8().await.unwrap();
                let (mut len, mut shift) = (0usize, 0);
                loop {
                    let b = self.0.read_u8().await.unwrap();
                    len |= usize::from(b & 0x7f) << shift;
                    shift += 7;
                    if b & 0x80 == 0 {
                        break;
                    }
                }
                let mut body = vec![0; len];
                self.0.read_exact(&mut body).await.unwrap();
                (first & 0xf0, body)
            })
            .await
        }
    }
}

/// A QoS 1 set whose PUBACK was lost comes again with DUP and the same packet id after its
/// client reconnects. It was applied again, over a newer write by someone else. Now its
/// session and packet id find the first answer (dedup.rs, as the invoke path's requests): the
/// same PUBACK, nothing applied. The answer is the first one even when applying again would
/// now give another (a set refused for the key quota while there is room again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_set_is_answered_as_the_first_and_not_applied_again() {
    const SET: u8 = 0x10;
    const QUOTA: u8 = 0x97;
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        mirror(c, true);
        c.limits.max_keys = Some(2);
    })
    .await;
    let engine = env.engine();
    let id = unique_id("sensor");
    let mut first = raw::Client::connect(env.broker_port, &id).await;
    assert_eq!(first.publish("state/door/set", 7, false, b"X").await, SET);
    let mut other = RawClient::connect(env.broker_port, &unique_id("other")).await;
    for (key, v) in [("door", "Y"), ("filler", "1")] {
        let t = format!("{PREFIX}{key}/set");
        other
            .publish(
                &t,
                QoS::AtLeastOnce,
                Bytes::copy_from_slice(v.as_bytes()),
                PublishProperties::default(),
            )
            .await;
        assert_eq!(other.next_puback().await, PubAckReason::NoMatchingSubscribers, "{key}");
    }
    assert_eq!(first.publish("state/third/set", 8, false, b"3").await, QUOTA);
    run(engine, &["DEL", "filler"]).await;

    // The PUBACKs were "lost": the client comes back to its session and sends both again.
    drop(first);
    let mut again = raw::Client::connect(env.broker_port, &id).await;
    assert_eq!(again.publish("state/door/set", 7, true, b"X").await, SET);
    assert_eq!(
        value(engine, "door").await.as_deref(),
        Some(&b"Y"[..]),
        "the newer write stays"
    );
    assert_eq!(again.publish("state/third/set", 8, true, b"3").await, QUOTA);
    assert_eq!(value(engine, "third").await, None, "a redelivery is not applied");
    // Without DUP a packet id is free for a new message.
    assert_eq!(again.publish("state/door/set", 7, false, b"Z").await, SET);
    assert_eq!(value(engine, "door").await.as_deref(), Some(&b"Z"[..]));
    env.stop().await;
}

/// Mosquitto's dynamic security plugin, where Debian and Ubuntu put it.
fn dynamic_security_plugin() -> std::path::PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so",
        "/usr/lib/aarch64-linux-gnu/mosquitto_dynamic_security.so",
        "/usr/lib/mosquitto_dynamic_security.so",
        "/usr/local/lib/mosquitto_dynamic_security.so",
    ];
    let found = candidates.iter().map(std::path::PathBuf::from).find(|p| p.exists());
    found.unwrap_or_else(|| panic!("mosquitto's dynamic security plugin is not installed (looked in {candidates:?})"))
}

/// A broker whose ACL refuses the mirror's `state/#` subscription delivers nothing on it, and
/// the mirror took that for "nothing retained": it cleared nothing and said nothing. Now the
/// refused SUBACK fails the read: logged, counted
/// (`state_topics_retained_reads_total{outcome="refused"}`), nothing cleared, and the mirror
/// goes on publishing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_no_empty_retained_set() {
    let dir = tempfile::tempdir().unwrap();
    let dynsec = dir.path().join("dynamic-security.json");
    std::fs::write(
        &dynsec,
        r#"{
  "defaultACLAccess": {"publishClientSend": true, "publishClientReceive": true, "subscribe": true, "unsubscribe": true},
  "clients": [],
  "groups": [{"groupname": "anonymous", "roles": [{"rolename": "no-state-wildcard"}]}],
  "roles": [{"rolename": "no-state-wildcard", "acls": [
    {"acltype": "subscribeLiteral", "topic": "state/#", "priority": 0, "allow": false}
  ]}],
  "anonymousGroup": "anonymous"
}"#,
    )
    .unwrap();
    let plugin = dynamic_security_plugin();
    let conf = format!(
        "plugin {}\nplugin_opt_config_file {}\n",
        plugin.display(),
        dynsec.display()
    );
    let mosquitto = Mosquitto::start_with(&conf).await;
    // What a service before this one left: the topic of a key that no longer exists.
    let mut watcher = RawClient::connect(mosquitto.port, &unique_id("watcher")).await;
    watcher
        .client
        .publish("state/gone", QoS::AtLeastOnce, true, "old")
        .await
        .unwrap();
    let kept = watcher.next_puback().await;
    assert!(
        matches!(kept, PubAckReason::Success | PubAckReason::NoMatchingSubscribers),
        "{kept:?}"
    );
    assert!(
        watcher
            .try_subscribe("state/#")
            .await
            .iter()
            .all(|c| !matches!(c, rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_))),
        "the broker refuses state/#"
    );
    watcher.subscribe("state/+").await;
    let p = watcher.next().await;
    assert_eq!((topic(&p).as_str(), &p.payload[..]), ("state/gone", &b"old"[..]));

    let port = mosquitto.port;
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.broker = BrokerChoice::External {
            host: "127.0.0.1".into(),
            port,
        };
        mirror(c, false);
    })
    .await;
    // The mirror republished (nothing) and went on to changes: it keeps going.
    let before = until_marker(env.engine(), &mut watcher, "marker").await;
    assert!(before.is_empty(), "nothing was cleared or published: {before:?}");
    let metrics = reqwest::get(format!("{}/metrics", env.http()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("stategate_state_topics_retained_reads_total{outcome=\"refused\"}"));
    assert_eq!(refused.and_then(|l| l.rsplit(' ').next()), Some("1"), "{metrics}");
    env.stop().await;
}
