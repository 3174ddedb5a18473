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

use crate::support::{Broker, INVOKE, RawClient, TestEnv, WAIT, now_ts, prop, unique_id, uuid_like, within};

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

/// A client speaking MQTT 5 byte by byte (rumqttc cannot hold acknowledgements back with a
/// receive window of one: the broker then announces one too, and rumqttc's packet ids collide),
/// reading what the broker sends it.
struct Drainer {
    tcp: tokio::io::BufReader<tokio::net::TcpStream>,
}

/// A packet the broker sent the client.
#[derive(Debug)]
enum FromBroker {
    /// PUBACK: packet id and reason code.
    PubAck(u16, u8),
    /// PUBLISH at QoS 1: packet id, correlation data, payload.
    Publish(u16, Bytes, Bytes),
    Other(u8),
}

impl Drainer {
    async fn connect(port: u16, client_id: &str, receive_maximum: u16) -> Drainer {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        tcp.write_all(&crate::resources::raw::connect_with(client_id, Some(receive_maximum)))
            .await
            .unwrap();
        let mut d = Drainer {
            tcp: tokio::io::BufReader::new(tcp),
        };
        assert!(matches!(d.next().await, Some(FromBroker::Other(0x20))), "CONNACK");
        d
    }

    async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.tcp.get_mut().write_all(bytes).await.unwrap();
    }

    /// A QoS 1 request: response topic, correlation data and a `__ts` (writes need one).
    async fn request(&mut self, packet_id: u16, response: &str, correlation: &[u8], payload: &[u8]) {
        use crate::resources::raw::{string, varint};
        let mut props = vec![0x08];
        string(response.as_bytes(), &mut props);
        props.push(0x09);
        string(correlation, &mut props);
        props.push(0x26);
        string(b"__ts", &mut props);
        string(now_ts().as_bytes(), &mut props);
        let mut body = Vec::new();
        string(INVOKE.as_bytes(), &mut body);
        body.extend_from_slice(&packet_id.to_be_bytes());
        varint(props.len(), &mut body);
        body.extend(props);
        body.extend_from_slice(payload);
        let mut packet = vec![0x32];
        varint(body.len(), &mut packet);
        packet.extend(body);
        self.send(&packet).await;
    }

    async fn puback(&mut self, packet_id: u16) {
        let [hi, lo] = packet_id.to_be_bytes();
        self.send(&[0x40, 2, hi, lo]).await;
    }

    /// The next packet (`None`: the connection ended).
    async fn next(&mut self) -> Option<FromBroker> {
        use tokio::io::AsyncReadExt;
        let header = self.tcp.read_u8().await.ok()?;
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let b = self.tcp.read_u8().await.ok()?;
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        self.tcp.read_exact(&mut body).await.ok()?;
        let u16_at = |at: usize| u16::from_be_bytes([body[at], body[at + 1]]);
        Some(match header >> 4 {
            4 => FromBroker::PubAck(u16_at(0), body.get(2).copied().unwrap_or(0)),
            3 => {
                assert_eq!((header >> 1) & 3, 1, "answers come at QoS 1");
                let topic_end = 2 + usize::from(u16_at(0));
                let packet_id = u16_at(topic_end);
                let (props_len, mut at) = varint(&body, topic_end + 2);
                let props_end = at + props_len;
                let mut correlation = Bytes::new();
                while at < props_end {
                    let id = body[at];
                    at += 1;
                    match id {
                        0x01 => at += 1,
                        0x02 => at += 4,
                        0x23 => at += 2,
                        0x0B => at = varint(&body, at).1,
                        0x03 | 0x08 | 0x09 => {
                            let n = usize::from(u16_at(at));
                            if id == 0x09 {
                                correlation = Bytes::copy_from_slice(&body[at + 2..at + 2 + n]);
                            }
                            at += 2 + n;
                        }
                        0x26 => {
                            let k = usize::from(u16_at(at));
                            at += 2 + k;
                            let v = usize::from(u16_at(at));
                            at += 2 + v;
                        }
                        other => panic!("unexpected property {other:#x} in an answer"),
                    }
                }
                FromBroker::Publish(packet_id, correlation, Bytes::copy_from_slice(&body[props_end..]))
            }
            kind => FromBroker::Other(kind << 4),
        })
    }
}

/// A variable byte integer at `at`: its value and where it ends.
fn varint(b: &[u8], mut at: usize) -> (usize, usize) {
    let (mut n, mut shift) = (0usize, 0);
    loop {
        let byte = b[at];
        at += 1;
        n |= usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte < 0x80 {
            return (n, at);
        }
    }
}

/// What the draining client saw: the broker's PUBACK reason for each of its requests (by
/// packet id), the answers (by correlation data) and the answers not acknowledged yet.
#[derive(Default)]
struct Seen {
    acks: std::collections::HashMap<u16, u8>,
    answers: std::collections::BTreeMap<Bytes, Bytes>,
    unacked: Vec<u16>,
}

impl Seen {
    fn record(&mut self, p: FromBroker) {
        match p {
            FromBroker::PubAck(id, reason) => {
                self.acks.insert(id, reason);
            }
            FromBroker::Publish(id, corr, payload) => {
                self.answers.insert(corr, payload);
                self.unacked.push(id);
            }
            FromBroker::Other(kind) => panic!("unexpected packet {kind:#x}"),
        }
    }

    /// Requests 1..=n answered.
    fn answered(&self, n: u16) -> usize {
        (1..=n)
            .filter(|i| self.answers.contains_key(&i.to_be_bytes()[..]))
            .count()
    }
}

/// Requests the embedded broker acknowledged before shutdown are all answered before it stops,
/// and one sent once it is stopping is refused (PUBACK 0x97, retry), not acknowledged.
///
/// Deterministic: the client announces a receive window of one and acknowledges no answer
/// until shutdown has begun, so 24 of its 25 answers are still queued in its session when the
/// service stops; a shutdown that does not wait for them throws them away with the session.
/// The client starts taking its answers only once its probe was refused (the door is closed;
/// the stopping service must now wait for it); a service that acknowledges the probe is not
/// waited for: the client never acknowledges, and sees how many answers reach it before the
/// broker disconnects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_every_acknowledged_request_and_refuses_new_ones() {
    use crate::resources::raw;

    const REQUESTS: u16 = 25;
    const PROBE: u16 = REQUESTS + 1;
    const ACCEPTED: u8 = 0x10;
    const QUOTA_EXCEEDED: u8 = 0x97;
    let mut env = TestEnv::start_with(Broker::Embedded, |cfg| {
        // Far longer than the test takes: the service must finish because the answers were
        // taken, not because the grace ran out.
        cfg.ops.shutdown_grace = 6 * WAIT;
    })
    .await;
    let id = unique_id("drain");
    let response = format!("clients/{id}/resp");
    let mut c = Drainer::connect(env.broker_port, &id, 1).await;
    c.send(&raw::subscribe(1, &response)).await;
    assert!(matches!(
        within("SUBACK", c.next()).await,
        Some(FromBroker::Other(0x90))
    ));
    let set = |key: &str| stategate::resp3::encode_request([&b"SET"[..], key.as_bytes(), b"v"]);
    for i in 1..=REQUESTS {
        c.request(i, &response, &i.to_be_bytes(), &set(&format!("drain-{i}")))
            .await;
    }
    let mut seen = Seen::default();
    while seen.acks.len() < usize::from(REQUESTS) {
        seen.record(within("the requests' PUBACKs", c.next()).await.expect("connected"));
    }
    for i in 1..=REQUESTS {
        assert_eq!(seen.acks.get(&i), Some(&ACCEPTED), "request {i}");
    }

    // The service begins stopping; its door is closed once `stopped()` resolves.
    let running = env.service.take().expect("running");
    let engine = running.engine().clone();
    let obs = running.observe().clone();
    let stopping = tokio::spawn(running.shutdown());
    within("shutdown to begin", obs.stopped()).await;
    c.request(PROBE, &response, b"probe", &set("drain-late")).await;
    let probe_reason = loop {
        let p = within("the probe's PUBACK", c.next())
            .await
            .expect("connected until the probe is acknowledged");
        seen.record(p);
        if let Some(reason) = seen.acks.get(&PROBE) {
            break *reason;
        }
    };
    // Refused: the door is closed and the service waits for what it owes. Taken instead: this
    // client takes nothing, and counts what it got before being disconnected.
    let refused = probe_reason == QUOTA_EXCEEDED;
    let mut disconnected = false;
    while seen.answered(REQUESTS) < usize::from(REQUESTS) {
        if refused {
            for id in std::mem::take(&mut seen.unacked) {
                c.puback(id).await;
            }
        }
        match tokio::time::timeout(WAIT, c.next()).await {
            Ok(Some(p)) => seen.record(p),
            Ok(None) => {
                disconnected = true;
                break;
            }
            Err(_) => break,
        }
    }
    assert_eq!(
        seen.answered(REQUESTS),
        usize::from(REQUESTS),
        "{REQUESTS} requests acknowledged before shutdown, {} answered (then disconnected: {disconnected})",
        seen.answered(REQUESTS)
    );
    for (corr, payload) in &seen.answers {
        assert_eq!(&payload[..], b"+OK\r\n", "the answer to {corr:?}");
    }
    assert_eq!(probe_reason, QUOTA_EXCEEDED, "a request sent while stopping is refused");
    assert!(
        engine.read(&Bytes::from_static(b"drain-late")).await.unwrap().is_none(),
        "the refused request was not executed"
    );
    for id in std::mem::take(&mut seen.unacked) {
        c.puback(id).await;
    }
    // Every answer taken: the service stops, and the broker disconnects the client.
    while let Some(p) = within("the broker to disconnect the client", c.next()).await {
        assert!(
            matches!(p, FromBroker::Other(0xE0)),
            "only DISCONNECT after the answers: {p:?}"
        );
    }
    within("the shutdown", stopping).await.expect("shutdown");
}
