//! In-broker serving: the embedded broker answers requests itself, with no MQTT client of the
//! service's own; redeliveries are answered once; limits still answer `__stat=503`; the
//! PUBACK a request gets; KEYNOTIFY bound to the publisher's real identity.

use std::time::Duration;

use bytes::Bytes;
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use stategate::config::BrokerChoice;

use crate::support::{Broker, INVOKE, RawClient, TestEnv, WAIT, now_ts, prop, unique_id, uuid_like};

fn request_props(client: &RawClient, corr: &[u8], extra: &[(&str, &str)]) -> PublishProperties {
    let mut user = vec![
        ("__srcId".to_owned(), client.id.clone()),
        ("__protVer".to_owned(), "1.0".to_owned()),
        ("__ts".to_owned(), now_ts()),
    ];
    user.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    PublishProperties {
        response_topic: Some(client.response_topic()),
        correlation_data: Some(Bytes::copy_from_slice(corr)),
        user_properties: user,
        message_expiry_interval: Some(10),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_broker_serves_without_a_client_session_of_ours() {
    let env = TestEnv::start(Broker::Embedded).await;
    let service = env.service.as_ref().unwrap();
    assert!(service.serves_in_broker());
    let mut c = RawClient::connect(env.broker_port, &unique_id("inb")).await;
    let set = c.request(&[b"SET", b"k", b"v"], &[("__ts", &now_ts())]).await;
    assert_eq!((prop(&set, "__stat"), &set.payload[..]), (Some("200"), &b"+OK\r\n"[..]));
    assert_eq!(prop(&set, "__srcId"), Some("stategate"));
    let get = c.request(&[b"GET", b"k"], &[]).await;
    assert_eq!(&get.payload[..], b"$1\r\nv\r\n");
    // The broker holds the test client's session and nothing of the service's.
    let ids = service.embedded_broker().unwrap().client_ids().await;
    assert_eq!(ids, vec![c.id.clone()], "sessions in the broker");
    env.stop().await;

    // Forcing the client path brings the service's own session back.
    let env = TestEnv::start_with(Broker::Embedded, |cfg| {
        cfg.broker = BrokerChoice::Embedded {
            listen: "127.0.0.1:0".parse().unwrap(),
            client_path: true,
        }
    })
    .await;
    let service = env.service.as_ref().unwrap();
    assert!(!service.serves_in_broker());
    let mut c = RawClient::connect(env.broker_port, &unique_id("cli")).await;
    assert_eq!(&c.request(&[b"GET", b"k"], &[]).await.payload[..], b"$-1\r\n");
    let ids = service.embedded_broker().unwrap().client_ids().await;
    assert!(ids.contains(&"stategate".to_owned()), "{ids:?}");
    env.stop().await;
}

/// A QoS 1 request is acknowledged with reason 0x10 (No matching subscribers: success-class)
/// and answered; nobody else subscribed to the invoke topic sees it (a fence published after it
/// reaches the spy first: one publisher, one subscriber, delivered in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_consumed_with_puback_0x10() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut spy = RawClient::connect(env.broker_port, &unique_id("spy")).await;
    spy.subscribe(INVOKE).await;
    let fence = format!("fence/{}", spy.id);
    spy.subscribe(&fence).await;

    let id = unique_id("acks");
    let mut o = MqttOptions::new(id.clone(), "127.0.0.1", env.broker_port);
    o.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(o, 16);
    let response = format!("clients/{id}/resp");
    client.subscribe(response.clone(), QoS::AtLeastOnce).await.unwrap();
    let props = PublishProperties {
        response_topic: Some(response),
        correlation_data: Some(Bytes::from_static(b"corr-puback-0001")),
        user_properties: vec![("__ts".into(), now_ts())],
        ..Default::default()
    };
    let mut published = false;
    // Packet ids in the order the client sent its publishes (the request, then the fence),
    // and the broker's PUBACK of each: the loop polls until both went out and were acked
    // (the fence is sent only while the event loop is polled).
    let (mut sent, mut acks) = (Vec::new(), std::collections::HashMap::new());
    let mut answer = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    while sent.len() < 2 || acks.len() < 2 || answer.is_none() {
        let ev = tokio::time::timeout_at(deadline, events.poll())
            .await
            .expect("in time")
            .expect("connected");
        match ev {
            Event::Incoming(Packet::SubAck(_)) if !published => {
                published = true;
                let set = stategate::resp3::encode_request([&b"SET"[..], b"a", b"1"]);
                client
                    .publish_with_properties(INVOKE, QoS::AtLeastOnce, false, set, props.clone())
                    .await
                    .unwrap();
                client
                    .publish(fence.clone(), QoS::AtLeastOnce, false, "fence")
                    .await
                    .unwrap();
            }
            Event::Outgoing(Outgoing::Publish(pkid)) => sent.push(pkid),
            Event::Incoming(Packet::PubAck(a)) => {
                acks.insert(a.pkid, a.reason);
            }
            Event::Incoming(Packet::Publish(p)) => answer = Some(p.payload),
            _ => {}
        }
    }
    assert_eq!(acks.get(&sent[0]), Some(&PubAckReason::NoMatchingSubscribers));
    assert_eq!(acks.get(&sent[1]), Some(&PubAckReason::Success), "the fence was routed");
    assert_eq!(answer.as_deref(), Some(&b"+OK\r\n"[..]));
    let first = spy.next().await;
    assert_eq!(
        &first.topic[..],
        fence.as_bytes(),
        "the request was routed to a subscriber"
    );
    env.stop().await;
}

/// The same request redelivered (same response topic and correlation data) runs once: both
/// copies get the first answer, `+OK`, not the `:-1` a second NX would give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_request_is_answered_once() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut c = RawClient::connect(env.broker_port, &unique_id("redeliver")).await;
    c.subscribe(&c.response_topic()).await;
    let corr = uuid_like();
    let payload = stategate::resp3::encode_request([&b"SET"[..], b"nx-key", b"v", b"NX"]);
    // The copy comes after the first answer, as a redelivery on reconnect does (a copy that
    // arrives while the first still runs is left to the first, which answers both).
    for _ in 0..2 {
        c.publish(INVOKE, QoS::AtLeastOnce, payload.clone(), request_props(&c, &corr, &[]))
            .await;
        let answer = c.next().await;
        assert_eq!(&answer.payload[..], b"+OK\r\n");
    }
    let versions = env
        .engine()
        .read(&Bytes::from_static(b"nx-key"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(versions.value, "v");
    env.stop().await;
}

/// Past the in-flight byte budget a request is answered `__stat=503` and not executed, on the
/// in-broker path and on the client path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_inflight_budget_is_503_on_both_paths() {
    for client_path in [false, true] {
        let env = TestEnv::start_with(Broker::Embedded, |cfg| {
            cfg.broker = BrokerChoice::Embedded {
                listen: "127.0.0.1:0".parse().unwrap(),
                client_path,
            };
            cfg.mqtt.door.max_inflight_bytes = 1024;
        })
        .await;
        let mut c = RawClient::connect(env.broker_port, &unique_id("busy")).await;
        let big = vec![b'x'; 4096];
        let answer = c.request(&[b"SET", b"big", &big], &[("__ts", &now_ts())]).await;
        assert_eq!(prop(&answer, "__stat"), Some("503"), "client_path={client_path}");
        assert!(prop(&answer, "__stMsg").is_some());
        assert!(answer.payload.is_empty());
        assert!(env.engine().read(&Bytes::from_static(b"big")).await.unwrap().is_none());
        // Small requests still go through.
        let ok = c.request(&[b"SET", b"small", b"v"], &[("__ts", &now_ts())]).await;
        assert_eq!(prop(&ok, "__stat"), Some("200"));
        env.stop().await;
    }
}

/// In the broker the publisher is known: a KEYNOTIFY naming another client's `__srcId` is
/// refused (403), and the honest one is registered for the publisher's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keynotify_is_bound_to_the_real_publisher() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut mallory = RawClient::connect(env.broker_port, &unique_id("mallory")).await;
    let forged = mallory.request(&[b"KEYNOTIFY", b"k"], &[("__srcId", "victim")]).await;
    assert_eq!(prop(&forged, "__stat"), Some("403"));
    assert!(forged.payload.is_empty());
    assert!(env.engine().observers_of(b"k").is_empty());
    let honest = mallory.request(&[b"KEYNOTIFY", b"k"], &[]).await;
    assert_eq!(&honest.payload[..], b"+OK\r\n");
    assert_eq!(env.engine().observers_of(b"k").len(), 1);
    env.stop().await;
}
