//! The embedded broker, driven by real MQTT clients over loopback TCP.
//!
//! Every wait is bounded by [`WAIT`]; nothing sleeps to synchronise. Each client's event loop
//! runs in its own task that only forwards events (never publishes), as rumqttc requires.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{ConnAck, Packet, Publish, PublishProperties, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, MqttOptions};
use rumqttc::{NetworkOptions, Outgoing};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use super::{BrokerError, BrokerOptions, EmbeddedBroker};

/// Upper bound for any single wait in these tests.
const WAIT: Duration = Duration::from_secs(10);
/// Client-side packet limit: large enough for the 1 MiB test.
const CLIENT_MAX_PACKET: u32 = 4 * 1024 * 1024;

fn options() -> BrokerOptions {
    BrokerOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_packet_bytes: 256 * 1024,
        receive_maximum: 100,
        default_message_expiry: None,
        guard: None,
        ..BrokerOptions::default()
    }
}

/// A broker plus the stream of client ids its `on_disconnect` reports.
struct TestBroker {
    broker: EmbeddedBroker,
    disconnects: mpsc::UnboundedReceiver<String>,
}

impl TestBroker {
    async fn start(opts: BrokerOptions) -> TestBroker {
        let (tx, disconnects) = mpsc::unbounded_channel();
        let on_disconnect = Arc::new(move |client_id: &str, _session: u64| {
            let _ = tx.send(client_id.to_owned());
        });
        let broker = EmbeddedBroker::start(opts, on_disconnect).await.expect("broker starts");
        TestBroker { broker, disconnects }
    }

    fn addr(&self) -> SocketAddr {
        self.broker.local_addr()
    }

    async fn next_disconnect(&mut self) -> String {
        timeout(WAIT, self.disconnects.recv())
            .await
            .expect("on_disconnect in time")
            .expect("disconnect channel open")
    }
}

fn client_options(client_id: &str, addr: SocketAddr) -> MqttOptions {
    let mut opts = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
    let mut network = NetworkOptions::new();
    network.set_tcp_nodelay(true);
    opts.set_network_options(network);
    opts.set_max_packet_size(Some(CLIENT_MAX_PACKET));
    opts.set_keep_alive(Duration::from_secs(30));
    opts
}

/// A connected rumqttc v5 client whose events arrive on a channel.
struct TestClient {
    client: AsyncClient,
    events: mpsc::UnboundedReceiver<Result<Event, ConnectionError>>,
    poller: JoinHandle<()>,
}

impl TestClient {
    /// Connects and returns the client with the broker's CONNACK.
    async fn connect(opts: MqttOptions) -> (TestClient, ConnAck) {
        let (client, mut eventloop) = AsyncClient::new(opts, 64);
        let (tx, events) = mpsc::unbounded_channel();
        let poller = tokio::spawn(async move {
            loop {
                let event = eventloop.poll().await;
                // After sending DISCONNECT a client must close the connection (MQTT 5
                // 3.14.4); rmqtt waits for that. rumqttc would keep it open: stop polling,
                // which drops the event loop and its socket.
                let last = matches!(event, Err(_) | Ok(Event::Outgoing(Outgoing::Disconnect)));
                if tx.send(event).is_err() || last {
                    break;
                }
            }
        });
        let mut this = TestClient { client, events, poller };
        let connack = this
            .wait_for(|packet| match packet {
                Packet::ConnAck(ack) => Some(ack),
                _ => None,
            })
            .await;
        (this, connack)
    }

    /// Waits for the first incoming packet `pick` accepts, skipping the others.
    async fn wait_for<T>(&mut self, mut pick: impl FnMut(Packet) -> Option<T>) -> T {
        let found = async {
            loop {
                match self.events.recv().await {
                    Some(Ok(Event::Incoming(packet))) => {
                        if let Some(found) = pick(packet) {
                            return found;
                        }
                    }
                    Some(Ok(Event::Outgoing(_))) => {}
                    Some(Err(err)) => panic!("client connection failed: {err:?}"),
                    None => panic!("client event loop ended"),
                }
            }
        };
        timeout(WAIT, found).await.expect("expected packet in time")
    }

    async fn next_publish(&mut self) -> Publish {
        self.wait_for(|packet| match packet {
            Packet::Publish(publish) => Some(publish),
            _ => None,
        })
        .await
    }

    async fn subscribe(&mut self, filter: &str) {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .expect("subscribe queued");
        let codes = self
            .wait_for(|packet| match packet {
                Packet::SubAck(ack) => Some(ack.return_codes),
                _ => None,
            })
            .await;
        assert!(
            matches!(codes[..], [SubscribeReasonCode::Success(_)]),
            "subscription to {filter} refused: {codes:?}"
        );
    }

    /// Publishes at QoS 1 and waits for the broker's PUBACK.
    async fn publish(&mut self, topic: &str, payload: impl Into<Bytes>) {
        self.publish_with(topic, payload, PublishProperties::default()).await;
    }

    async fn publish_with(&mut self, topic: &str, payload: impl Into<Bytes>, properties: PublishProperties) {
        self.client
            .publish_with_properties(topic, QoS::AtLeastOnce, false, payload.into(), properties)
            .await
            .expect("publish queued");
        self.wait_for(|packet| match packet {
            Packet::PubAck(_) => Some(()),
            _ => None,
        })
        .await;
    }

    /// Sends DISCONNECT and waits until the client has closed the connection.
    async fn disconnect(mut self) {
        self.client.disconnect().await.expect("disconnect queued");
        let closed = async { while self.events.recv().await.is_some() {} };
        timeout(WAIT, closed).await.expect("connection closes");
        let _ = timeout(WAIT, self.poller).await.expect("poller ends");
    }

    /// Drops the TCP connection without any MQTT goodbye.
    async fn drop_connection(self) {
        self.poller.abort();
        // The aborted task owns the event loop and its socket; they are dropped when it ends.
        let _ = timeout(WAIT, self.poller).await.expect("poller ends");
    }
}

fn text(bytes: &Bytes) -> &str {
    std::str::from_utf8(bytes).expect("utf-8")
}

#[tokio::test]
async fn connack_announces_the_configured_limits() {
    let broker = TestBroker::start(BrokerOptions {
        max_packet_bytes: 300_000,
        receive_maximum: 42,
        ..options()
    })
    .await;
    let (client, connack) = TestClient::connect(client_options("limits", broker.addr())).await;
    let props = connack.properties.expect("CONNACK properties");
    assert_eq!(props.max_packet_size, Some(300_000));
    assert_eq!(props.receive_max, Some(42));
    // Absent means available; 0 would mean unavailable.
    assert_ne!(props.shared_subscription_available, Some(0));
    client.disconnect().await;
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn v5_properties_are_forwarded_intact() {
    let broker = TestBroker::start(options()).await;
    let (mut sub, _) = TestClient::connect(client_options("props-sub", broker.addr())).await;
    sub.subscribe("props/+").await;
    let (mut publisher, _) = TestClient::connect(client_options("props-pub", broker.addr())).await;

    let sent = PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(60),
        response_topic: Some("props/reply/1".to_owned()),
        correlation_data: Some(Bytes::from_static(b"\x00corr\xff")),
        user_properties: vec![
            ("__ts".to_owned(), "001700000000000:00000:cli".to_owned()),
            ("k".to_owned(), "v1".to_owned()),
            ("k".to_owned(), "v2".to_owned()),
        ],
        content_type: Some("application/octet-stream".to_owned()),
        ..PublishProperties::default()
    };
    publisher
        .publish_with("props/a", Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"), sent.clone())
        .await;

    let got = sub.next_publish().await;
    assert_eq!(text(&got.topic), "props/a");
    assert_eq!(&got.payload[..], b"*1\r\n$4\r\nPING\r\n");
    let props = got.properties.expect("properties forwarded");
    assert_eq!(props.response_topic, sent.response_topic);
    assert_eq!(props.correlation_data, sent.correlation_data);
    assert_eq!(props.user_properties, sent.user_properties);
    assert_eq!(props.content_type, sent.content_type);
    assert_eq!(props.payload_format_indicator, sent.payload_format_indicator);
    // The broker forwards the remaining lifetime, at most what was sent.
    let expiry = props.message_expiry_interval.expect("expiry forwarded");
    assert!((1..=60).contains(&expiry), "expiry {expiry}");

    sub.disconnect().await;
    publisher.disconnect().await;
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn default_message_expiry_is_applied_only_when_configured() {
    for (default_expiry, expect_expiry) in [(None, false), (Some(Duration::from_secs(120)), true)] {
        let broker = TestBroker::start(BrokerOptions {
            default_message_expiry: default_expiry,
            ..options()
        })
        .await;
        let (mut sub, _) = TestClient::connect(client_options("exp-sub", broker.addr())).await;
        sub.subscribe("exp/t").await;
        let (mut publisher, _) = TestClient::connect(client_options("exp-pub", broker.addr())).await;
        publisher.publish("exp/t", "no expiry set").await;

        let got = sub.next_publish().await;
        let expiry = got.properties.and_then(|p| p.message_expiry_interval);
        match (expect_expiry, expiry) {
            (false, None) => {}
            (true, Some(secs)) => assert!((1..=120).contains(&secs), "expiry {secs}"),
            other => panic!("default {default_expiry:?}: got {other:?}"),
        }
        sub.disconnect().await;
        publisher.disconnect().await;
        broker.broker.shutdown().await;
    }
}

#[tokio::test]
async fn shared_subscription_splits_messages_between_group_members() {
    let broker = TestBroker::start(options()).await;
    let (mut a, _) = TestClient::connect(client_options("share-a", broker.addr())).await;
    let (mut b, _) = TestClient::connect(client_options("share-b", broker.addr())).await;
    a.subscribe("$share/workers/jobs/+").await;
    b.subscribe("$share/workers/jobs/+").await;
    let (mut publisher, _) = TestClient::connect(client_options("share-pub", broker.addr())).await;

    const COUNT: usize = 10;
    for i in 0..COUNT {
        publisher.publish("jobs/x", format!("job-{i}")).await;
    }

    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    while got_a.len() + got_b.len() < COUNT {
        tokio::select! {
            p = a.next_publish() => got_a.push(String::from_utf8_lossy(&p.payload).into_owned()),
            p = b.next_publish() => got_b.push(String::from_utf8_lossy(&p.payload).into_owned()),
        }
    }
    let all: HashSet<&String> = got_a.iter().chain(&got_b).collect();
    assert_eq!(all.len(), COUNT, "each message exactly once: {got_a:?} {got_b:?}");
    assert!(
        !got_a.is_empty() && !got_b.is_empty(),
        "both members get work: {got_a:?} {got_b:?}"
    );
    // Round robin over two online members.
    assert_eq!(got_a.len(), COUNT / 2, "{got_a:?} {got_b:?}");

    for c in [a, b, publisher] {
        c.disconnect().await;
    }
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn on_disconnect_fires_for_a_clean_disconnect() {
    let mut broker = TestBroker::start(options()).await;
    let (client, _) = TestClient::connect(client_options("bye-clean", broker.addr())).await;
    client.disconnect().await;
    assert_eq!(broker.next_disconnect().await, "bye-clean");
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn on_disconnect_fires_when_the_tcp_connection_is_dropped() {
    let mut broker = TestBroker::start(options()).await;
    let (client, _) = TestClient::connect(client_options("bye-dropped", broker.addr())).await;
    client.drop_connection().await;
    assert_eq!(broker.next_disconnect().await, "bye-dropped");
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn two_brokers_run_side_by_side() {
    let first = TestBroker::start(options()).await;
    let second = TestBroker::start(options()).await;
    assert_ne!(first.addr().port(), 0);
    assert_ne!(first.addr().port(), second.addr().port());

    for (broker, tag) in [(&first, "first"), (&second, "second")] {
        let (mut sub, _) = TestClient::connect(client_options("same-id-sub", broker.addr())).await;
        sub.subscribe("side/t").await;
        let (mut publisher, _) = TestClient::connect(client_options("same-id-pub", broker.addr())).await;
        publisher.publish("side/t", tag).await;
        let got = sub.next_publish().await;
        assert_eq!(text(&got.payload), tag);
        sub.disconnect().await;
        publisher.disconnect().await;
    }
    first.broker.shutdown().await;
    second.broker.shutdown().await;
}

#[tokio::test]
async fn a_one_mebibyte_payload_passes_when_the_limit_allows_it() {
    let broker = TestBroker::start(BrokerOptions {
        max_packet_bytes: 2 * 1024 * 1024,
        ..options()
    })
    .await;
    let (mut sub, _) = TestClient::connect(client_options("big-sub", broker.addr())).await;
    sub.subscribe("big/t").await;
    let (mut publisher, _) = TestClient::connect(client_options("big-pub", broker.addr())).await;

    let payload: Bytes = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    publisher.publish("big/t", payload.clone()).await;
    let got = sub.next_publish().await;
    assert_eq!(got.payload.len(), payload.len());
    assert!(got.payload == payload, "payload changed in transit");

    sub.disconnect().await;
    publisher.disconnect().await;
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn a_persistent_session_receives_what_was_published_while_offline() {
    let mut broker = TestBroker::start(options()).await;
    let addr = broker.addr();
    let persistent = || {
        let mut opts = client_options("persist-1", addr);
        opts.set_clean_start(false);
        opts.set_session_expiry_interval(Some(60));
        opts
    };

    let (mut sub, connack) = TestClient::connect(persistent()).await;
    assert!(!connack.session_present);
    sub.subscribe("persist/t").await;
    sub.disconnect().await;
    // The broker has seen the disconnect: whatever is published now is queued for the session.
    assert_eq!(broker.next_disconnect().await, "persist-1");

    let (mut publisher, _) = TestClient::connect(client_options("persist-pub", broker.addr())).await;
    for i in 0..3 {
        publisher.publish("persist/t", format!("offline-{i}")).await;
    }

    // No new SUBSCRIBE: the session, its subscription and its queue survived.
    let (mut sub, connack) = TestClient::connect(persistent()).await;
    assert!(connack.session_present);
    for i in 0..3 {
        let got = sub.next_publish().await;
        assert_eq!(text(&got.payload), format!("offline-{i}"));
        assert_eq!(got.qos, QoS::AtLeastOnce);
    }

    sub.disconnect().await;
    publisher.disconnect().await;
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn an_mqtt_3_1_1_client_talks_to_a_v5_client() {
    let broker = TestBroker::start(options()).await;
    let (mut sub, _) = TestClient::connect(client_options("v5-sub", broker.addr())).await;
    sub.subscribe("mixed/t").await;

    let opts = rumqttc::MqttOptions::new("v311-pub", "127.0.0.1", broker.addr().port());
    let (client, mut eventloop) = rumqttc::AsyncClient::new(opts, 16);
    // The 3.1.1 client keeps its network options on the event loop.
    eventloop.network_options.set_tcp_nodelay(true);
    let poller = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => return Ok(()),
                Ok(_) => {}
                Err(err) => return Err(err),
            }
        }
    });
    client
        .publish("mixed/t", rumqttc::QoS::AtLeastOnce, false, "from 3.1.1")
        .await
        .expect("publish queued");
    timeout(WAIT, poller)
        .await
        .expect("PUBACK in time")
        .expect("poller task")
        .expect("3.1.1 connection works");

    let got = sub.next_publish().await;
    assert_eq!(text(&got.payload), "from 3.1.1");
    sub.disconnect().await;
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn garbage_on_the_wire_does_not_hurt_the_broker() {
    let broker = TestBroker::start(options()).await;
    let inputs: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\n\r\n",
        // CONNECT with a remaining length far over the packet limit.
        &[0x10, 0xff, 0xff, 0xff, 0x7f],
        // CONNECT, MQTT 5, truncated properties.
        &[0x10, 0x0a, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x3c],
        &[0xff; 64],
    ];
    for input in inputs {
        let mut stream = timeout(WAIT, tokio::net::TcpStream::connect(broker.addr()))
            .await
            .expect("connect in time")
            .expect("tcp connect");
        // The broker may close the socket before everything is written.
        let _ = stream.write_all(input).await;
        drop(stream);
    }
    // Still serving.
    let (mut client, _) = TestClient::connect(client_options("after-garbage", broker.addr())).await;
    client.subscribe("still/here").await;
    client.publish("still/here", "yes").await;
    assert_eq!(text(&client.next_publish().await.payload), "yes");
    client.disconnect().await;
    broker.broker.shutdown().await;
}

#[tokio::test]
async fn shutdown_disconnects_clients_and_frees_the_port() {
    let broker = TestBroker::start(options()).await;
    let addr = broker.addr();
    let (mut client, _) = TestClient::connect(client_options("at-shutdown", addr)).await;
    let TestBroker {
        broker,
        mut disconnects,
    } = broker;
    broker.shutdown().await;

    let reported = timeout(WAIT, disconnects.recv()).await.expect("on_disconnect in time");
    assert_eq!(reported.as_deref(), Some("at-shutdown"));
    // The client's event loop sees its connection end.
    let ended = async {
        while let Some(event) = client.events.recv().await {
            if event.is_err() {
                return;
            }
        }
    };
    timeout(WAIT, ended).await.expect("client sees the disconnect");
    // The port can be bound again.
    let again = TestBroker::start(BrokerOptions {
        listen: addr,
        ..options()
    })
    .await;
    assert_eq!(again.addr(), addr);
    again.broker.shutdown().await;
}

#[tokio::test]
async fn bad_options_are_refused() {
    let on_disconnect: super::OnDisconnect = Arc::new(|_: &str, _: u64| {});
    let cases = [
        (
            BrokerOptions {
                receive_maximum: 0,
                ..options()
            },
            "receive maximum",
        ),
        (
            BrokerOptions {
                max_packet_bytes: 0,
                ..options()
            },
            "packet size",
        ),
        (
            BrokerOptions {
                default_message_expiry: Some(Duration::ZERO),
                ..options()
            },
            "message expiry",
        ),
    ];
    for (opts, what) in cases {
        let err = EmbeddedBroker::start(opts, on_disconnect.clone())
            .await
            .expect_err(what);
        assert!(err.to_string().contains(what), "{err}");
    }

    let taken = TestBroker::start(options()).await;
    let err = EmbeddedBroker::start(
        BrokerOptions {
            listen: taken.addr(),
            ..options()
        },
        on_disconnect,
    )
    .await
    .expect_err("port in use");
    assert!(matches!(err, BrokerError::Bind { .. }), "{err:?}");
    taken.broker.shutdown().await;
}
