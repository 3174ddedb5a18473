//! The retained state a SUBSCRIBE gets on the embedded broker (issue 27, item 9): on a large
//! store a subscriber allowed a few keys gets every one of them, whatever its session queue
//! holds, and what one SUBSCRIBE costs is bounded and counted.

use std::collections::BTreeSet;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;

use crate::state_topics::{mirror, run};
use crate::support::{Broker, RawClient, TestEnv, WAIT, unique_id};

/// Keys nobody of this test may read. The readable ones sit among them (`k/mine-*`,
/// `k/many-*`), so no order of going through the store puts them all last.
const OTHERS: usize = 20_000;
const SMALL_KEYS: usize = 5;
const BIG_KEYS: usize = 10;
/// Most retained messages one SUBSCRIBE delivers here.
const REPLAY_MAX: usize = 8;

/// A client that acknowledges only when told, with a receive window of one message: while it
/// holds one unacknowledged, the broker delivers it nothing else.
struct SlowReader {
    client: AsyncClient,
    incoming: mpsc::UnboundedReceiver<Publish>,
    subacks: mpsc::UnboundedReceiver<()>,
}

impl SlowReader {
    async fn connect(port: u16, id: &str) -> SlowReader {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        o.set_manual_acks(true);
        o.set_receive_maximum(Some(1));
        o.set_max_packet_size(Some(1024 * 1024));
        let (client, mut events) = AsyncClient::new(o, 64);
        let (tx, incoming) = mpsc::unbounded_channel();
        let (sub_tx, subacks) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(event) = events.poll().await {
                match event {
                    Event::Incoming(Packet::Publish(p)) => {
                        let _ = tx.send(p);
                    }
                    Event::Incoming(Packet::SubAck(_)) => {
                        let _ = sub_tx.send(());
                    }
                    _ => {}
                }
            }
        });
        SlowReader {
            client,
            incoming,
            subacks,
        }
    }

    async fn subscribe(&mut self, filter: &str) {
        self.client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        tokio::time::timeout(WAIT, self.subacks.recv())
            .await
            .expect("suback in time");
    }

    async fn next(&mut self) -> Publish {
        tokio::time::timeout(WAIT, self.incoming.recv())
            .await
            .expect("a publish in time")
            .expect("connected")
    }
}

fn topic(p: &Publish) -> String {
    String::from_utf8_lossy(&p.topic).into_owned()
}

/// `stategate_state_topics_replay_total{what}` from the service's metrics.
async fn replay_count(env: &TestEnv, what: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", env.http()))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics");
    let line = format!("stategate_state_topics_replay_total{{what=\"{what}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_allowed_a_few_keys_of_many_gets_each_of_them_and_a_subscribe_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[[rule]]\nclient_ids = [\"small-*\"]\nallow = [\"read\"]\nkeys = [\"k/mine-*\"]\n\n\
         [[rule]]\nclient_ids = [\"big-*\"]\nallow = [\"read\"]\nkeys = [\"k/many-*\"]\n\n\
         [[rule]]\nclient_ids = [\"watcher-*\"]\nallow = [\"read\"]\nkeys = [\"done\"]\n",
    )
    .unwrap();
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        mirror(c);
        c.access.acl_file = Some(acl.clone());
        // A session queue far smaller than the store: rmqtt put every retained message in it.
        c.net.mqtt_max_queued_per_client = 100;
        c.net.state_topics_replay.max_per_subscribe = REPLAY_MAX;
    })
    .await;
    let engine = env.engine();
    let mut watcher = RawClient::connect(env.broker_port, &unique_id("watcher")).await;
    watcher.subscribe("state/done").await;
    for i in 0..OTHERS {
        run(engine, &["SET", &format!("k/{i:05}"), "v"]).await;
    }
    for i in 0..SMALL_KEYS {
        run(engine, &["SET", &format!("k/mine-{i}"), "m"]).await;
    }
    for i in 0..BIG_KEYS {
        run(engine, &["SET", &format!("k/many-{i}"), "b"]).await;
    }
    // The mirror publishes in change order: once this arrived, the broker holds every key.
    run(engine, &["SET", "done", "x"]).await;
    assert_eq!(topic(&watcher.next().await), "state/done");
    let stored = OTHERS + SMALL_KEYS + BIG_KEYS + 1;

    // A client whose window is full (one message held, not acknowledged) subscribes to
    // everything: nothing can leave its session queue until it acknowledges.
    let mut small = SlowReader::connect(env.broker_port, &unique_id("small")).await;
    small.subscribe("state/k/mine-0").await;
    let held = small.next().await;
    assert_eq!(topic(&held), "state/k/mine-0");
    small.subscribe("state/#").await;
    small.client.ack(&held).await.unwrap();
    let mut mine = BTreeSet::new();
    while mine.len() < SMALL_KEYS {
        let p = small.next().await;
        let t = topic(&p);
        assert!(t.starts_with("state/k/mine-"), "only readable keys arrive: {t}");
        assert!(p.retain, "retained state comes flagged retained");
        mine.insert(t);
        small.client.ack(&p).await.unwrap();
    }

    // A client allowed more keys than one SUBSCRIBE delivers gets that many, then live changes.
    let mut big = RawClient::connect(env.broker_port, &unique_id("big")).await;
    big.subscribe("state/#").await;
    let mut many = BTreeSet::new();
    for _ in 0..REPLAY_MAX {
        let t = topic(&big.next().await);
        assert!(t.starts_with("state/k/many-"), "{t}");
        many.insert(t);
    }
    assert_eq!(many.len(), REPLAY_MAX, "distinct keys");
    // The replay counts the cut when it reaches the next readable key; then it is over.
    let patience = std::time::Instant::now() + WAIT;
    while replay_count(&env, "truncated").await == 0 {
        assert!(std::time::Instant::now() < patience, "the cut was not counted");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    run(engine, &["SET", "k/many-live", "1"]).await;
    assert_eq!(
        topic(&big.next().await),
        "state/k/many-live",
        "nothing retained after the cut"
    );

    // What the SUBSCRIBEs cost, counted: every stored entry read once per `state/#` (one for
    // the exact topic), and only readable keys queued: 1 + 5 for `small`, 8 for `big`.
    assert_eq!(replay_count(&env, "queued").await, (1 + SMALL_KEYS + REPLAY_MAX) as u64);
    assert_eq!(replay_count(&env, "examined").await, (1 + 2 * stored) as u64);
    assert_eq!(replay_count(&env, "truncated").await, 1);
    assert_eq!(replay_count(&env, "refused").await, 0);
    env.stop().await;
}
