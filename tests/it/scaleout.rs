//! Three replicas of the real binary on one Redis and one Mosquitto, requests spread by a
//! shared subscription: a write through one is seen by watchers on the others with its
//! version; KEYNOTIFY is honoured whichever replica serves each request; a replica killed
//! with SIGKILL loses no acknowledged write and the survivors answer every new request; a
//! register under concurrent SET/NX/VDEL/GET through every replica is linearizable.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::json;
use tokio::sync::oneshot;

use crate::support::{Mosquitto, WAIT, free_port, now_ts, unique_id};

use crate::redis::server;

const INVOKE: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// One replica: the binary, killed on drop.
struct Replica {
    child: std::process::Child,
    http: String,
}

impl Replica {
    async fn start(redis: u16, mqtt: u16, n: usize, dir: &std::path::Path) -> Replica {
        let port = free_port();
        let log = dir.join(format!("replica-{n}.log"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
            .args(["--storage", &format!("redis://127.0.0.1:{redis}")])
            .args(["--redis-timeout-ms", "500"])
            .args(["--mqtt-url", &format!("mqtt://127.0.0.1:{mqtt}")])
            .args(["--mqtt-share-group", "stategate"])
            .args([
                "--node-id",
                &format!("node-{n}"),
                "--mqtt-client-id",
                &format!("stategate-{n}"),
            ])
            .args(["--http-listen", &format!("127.0.0.1:{port}"), "--grpc-listen", "off"])
            .env("RUST_LOG", "stategate=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn stategate");
        let http = format!("http://127.0.0.1:{port}");
        let c = reqwest::Client::new();
        let give_up = Instant::now() + WAIT;
        // Serving HTTP comes after the MQTT door subscribed (or gave up waiting).
        while c.get(format!("{http}/v1.0/healthz")).send().await.is_err() {
            if child.try_wait().unwrap().is_some() || Instant::now() > give_up {
                let _ = child.kill();
                panic!(
                    "replica {n} did not start: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            // Polling a child process: no event to await.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Replica { child, http }
    }

    fn state(&self) -> String {
        format!("{}/v1.0/state/statestore", self.http)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `(status, payload, __ts)` of an answer.
type Answer = (u16, Bytes, Option<String>);
/// Requests waiting for their answer, by correlation data.
type Pending = Arc<Mutex<HashMap<Bytes, oneshot::Sender<Answer>>>>;

/// A state store client over MQTT whose requests may go unanswered (a replica died).
struct Client {
    mqtt: AsyncClient,
    id: String,
    pending: Pending,
    notes: tokio::sync::mpsc::UnboundedReceiver<(String, Option<String>)>,
    next: std::sync::atomic::AtomicU64,
    _task: tokio::task::JoinHandle<()>,
}

impl Client {
    async fn connect(port: u16) -> Client {
        let id = unique_id("scaleout");
        let mut o = MqttOptions::new(id.clone(), "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(30));
        let (mqtt, mut events) = AsyncClient::new(o, 256);
        let pending: Pending = Default::default();
        let (note_tx, notes) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready) = oneshot::channel();
        let mut ready_tx = Some(ready_tx);
        let table = pending.clone();
        let task = tokio::spawn(async move {
            while let Ok(event) = events.poll().await {
                match event {
                    Event::Incoming(Packet::SubAck(_)) => {
                        if let Some(r) = ready_tx.take() {
                            let _ = r.send(());
                        }
                    }
                    Event::Incoming(Packet::Publish(p)) => {
                        let props = p.properties.unwrap_or_default();
                        let prop = |n: &str| {
                            props
                                .user_properties
                                .iter()
                                .find(|(k, _)| k == n)
                                .map(|(_, v)| v.clone())
                        };
                        let topic = String::from_utf8_lossy(&p.topic).into_owned();
                        if topic.contains("/command/notify/") {
                            let _ = note_tx.send((topic, prop("__ts")));
                        } else if let Some(c) = props.correlation_data.clone()
                            && let Some(tx) = table.lock().unwrap().remove(&c)
                        {
                            let stat = prop("__stat").and_then(|s| s.parse().ok()).unwrap_or(0);
                            let _ = tx.send((stat, p.payload.clone(), prop("__ts")));
                        }
                    }
                    _ => {}
                }
            }
        });
        mqtt.subscribe(format!("clients/{id}/#"), QoS::AtLeastOnce)
            .await
            .unwrap();
        mqtt.subscribe(
            format!(
                "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/{}/command/notify/#",
                hex::encode_upper(&id)
            ),
            QoS::AtLeastOnce,
        )
        .await
        .unwrap();
        tokio::time::timeout(WAIT, ready).await.unwrap().unwrap();
        Client {
            mqtt,
            id,
            pending,
            notes,
            next: Default::default(),
            _task: task,
        }
    }

    /// `(status, payload, __ts)`, or `None` when no answer came within `patience`.
    async fn request(&self, args: &[&[u8]], patience: Duration) -> Option<Answer> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let corr = Bytes::from(format!("{}-{n}", self.id));
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(corr.clone(), tx);
        let props = PublishProperties {
            response_topic: Some(format!("clients/{}/response", self.id)),
            correlation_data: Some(corr.clone()),
            user_properties: vec![
                ("__srcId".into(), self.id.clone()),
                ("__protVer".into(), "1.0".into()),
                ("__ts".into(), now_ts()),
            ],
            message_expiry_interval: Some(10),
            ..Default::default()
        };
        let payload = stategate::resp3::encode_request(args);
        self.mqtt
            .publish_with_properties(INVOKE, QoS::AtLeastOnce, false, payload, props)
            .await
            .unwrap();
        let answer = tokio::time::timeout(patience, rx).await.ok().and_then(Result::ok);
        self.pending.lock().unwrap().remove(&corr);
        answer
    }

    async fn ok(&self, args: &[&[u8]]) -> (Bytes, Option<String>) {
        let (stat, payload, ts) = self.request(args, WAIT).await.expect("an answer");
        assert_eq!(stat, 200, "{args:?}");
        (payload, ts)
    }

    async fn note(&mut self) -> (String, Option<String>) {
        tokio::time::timeout(WAIT, self.notes.recv())
            .await
            .expect("a notification")
            .unwrap()
    }
}

struct Cluster {
    _redis: server::TestServer,
    redis_port: u16,
    mosquitto: Mosquitto,
    replicas: Vec<Replica>,
    _dir: tempfile::TempDir,
}

async fn cluster(n: usize) -> Cluster {
    let redis = server::TestServer::start(server::Flavor::Redis);
    let mosquitto = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for i in 0..n {
        replicas.push(Replica::start(redis.port, mosquitto.port, i, dir.path()).await);
    }
    Cluster {
        redis_port: redis.port,
        _redis: redis,
        mosquitto,
        replicas,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_changes_notifications_and_survive_a_kill() {
    let mut c = cluster(3).await;
    let http = reqwest::Client::new();

    // An SSE watcher on replica 1; a write through replica 0 reaches it with its version,
    // which replica 2 serves as the ETag.
    let sse = http
        .get(format!("{}/v1.0-alpha1/state/statestore/subscribe", c.replicas[1].http))
        .send()
        .await
        .unwrap();
    let mut events = sse.bytes_stream();
    let r = http
        .post(c.replicas[0].state())
        .json(&json!([{"key": "shared", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let etag = http
        .get(format!("{}/shared", c.replicas[2].state()))
        .send()
        .await
        .unwrap()
        .headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let chunk = tokio::time::timeout(WAIT, events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains(&format!("id: {etag}")), "{seen}");
    assert!(seen.contains("event: set"), "{seen}");

    // KEYNOTIFY through the shared subscription; changes through each replica notify once,
    // in version order; a STOP (served by whichever replica) ends them.
    let mut client = Client::connect(c.mosquitto.port).await;
    client.ok(&[b"KEYNOTIFY", b"watched"]).await;
    let mut versions = Vec::new();
    for r in &c.replicas {
        let resp = http
            .post(r.state())
            .json(&json!([{"key": "watched", "value": "x"}]))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 204);
        let etag = http
            .get(format!("{}/watched", r.state()))
            .send()
            .await
            .unwrap()
            .headers()["etag"]
            .to_str()
            .unwrap()
            .to_owned();
        versions.push(etag);
    }
    for v in &versions {
        let (topic, ts) = client.note().await;
        assert!(topic.ends_with(&hex::encode_upper("watched")), "{topic}");
        assert_eq!(ts.as_deref(), Some(v.as_str()));
    }
    client.ok(&[b"KEYNOTIFY", b"watched", b"STOP"]).await;
    client.ok(&[b"KEYNOTIFY", b"marker"]).await;
    for r in &c.replicas {
        http.post(r.state())
            .json(&json!([{"key": "watched", "value": "y"}]))
            .send()
            .await
            .unwrap();
    }
    http.post(c.replicas[0].state())
        .json(&json!([{"key": "marker", "value": 1}]))
        .send()
        .await
        .unwrap();
    let (topic, _) = client.note().await;
    assert!(topic.ends_with(&hex::encode_upper("marker")), "after STOP: {topic}");

    // SIGKILL one replica while writes go through all of them.
    let writer = Arc::new(client);
    let mut acked: Vec<(String, String)> = Vec::new();
    for i in 0..60u32 {
        if i == 20 {
            c.replicas[1].kill();
        }
        let key = format!("w{i}");
        if let Some((200, _, Some(ts))) = writer
            .request(&[b"SET", key.as_bytes(), b"v"], Duration::from_secs(2))
            .await
        {
            acked.push((key, ts));
        }
    }
    // Within 10 s every new request is answered by the survivors.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut answered_in_a_row = 0;
    while answered_in_a_row < 30 {
        assert!(
            Instant::now() < deadline,
            "the survivors did not answer every request within 10 s"
        );
        match writer.request(&[b"GET", b"w0"], Duration::from_secs(1)).await {
            Some((200, _, _)) => answered_in_a_row += 1,
            _ => answered_in_a_row = 0,
        }
    }
    // Every acknowledged write is stored with its version or a later one.
    let redis = redis::Client::open(format!("redis://127.0.0.1:{}", c.redis_port)).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    assert!(acked.len() >= 40, "only {} of 60 writes acknowledged", acked.len());
    for (key, ts) in &acked {
        let stored: Option<String> = redis::cmd("HGET")
            .arg(format!("stategate:r:{key}"))
            .arg("ver")
            .query_async(&mut conn)
            .await
            .unwrap();
        let stored = stored.unwrap_or_else(|| panic!("acknowledged write of {key} lost"));
        let ts: stategate::hlc::Hlc = ts.parse().unwrap();
        // Stored as `{ms:020}:{counter:010}:{node}`.
        let mut parts = stored.splitn(3, ':');
        let (ms, counter, node) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let stored = stategate::hlc::Hlc::new(ms.parse().unwrap(), counter.parse().unwrap(), node);
        assert!(stored >= ts, "{key}: stored {stored} is before the acknowledged {ts}");
    }
}

/// One operation of the register's history: what was asked, what came back, and when.
#[derive(Debug, Clone)]
struct Op {
    call: Instant,
    ret: Instant,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Set(u32),
    /// SET NX: applied or not.
    SetNx(u32, bool),
    /// VDEL v: deleted or not.
    VDel(u32, bool),
    Get(Option<u32>),
}

/// Applies `op` to the register `state`; `None` when the outcome is impossible there.
fn step(state: Option<u32>, op: &Kind) -> Option<Option<u32>> {
    match *op {
        Kind::Set(v) => Some(Some(v)),
        Kind::SetNx(v, applied) => match (state, applied) {
            (None, true) => Some(Some(v)),
            (Some(_), false) => Some(state),
            _ => None,
        },
        Kind::VDel(v, deleted) => match (state == Some(v), deleted) {
            (true, true) => Some(None),
            (false, false) => Some(state),
            _ => None,
        },
        Kind::Get(seen) => (seen == state).then_some(state),
    }
}

/// Wing and Gong's search: is there an order of the operations, each placed between its call
/// and its return, in which every outcome is the register's? Depth-first over the operations
/// that may come next (those called before every unplaced operation returned), with the states
/// already explored at each set of placed operations remembered.
fn linearizable(history: &[Op]) -> bool {
    fn search(
        history: &[Op],
        placed: &mut Vec<bool>,
        state: Option<u32>,
        seen: &mut std::collections::HashSet<(Vec<bool>, Option<u32>)>,
    ) -> bool {
        if placed.iter().all(|p| *p) {
            return true;
        }
        if !seen.insert((placed.clone(), state)) {
            return false;
        }
        let earliest_return = history
            .iter()
            .zip(placed.iter())
            .filter(|(_, p)| !**p)
            .map(|(o, _)| o.ret)
            .min()
            .expect("an unplaced operation");
        for i in 0..history.len() {
            if placed[i] || history[i].call > earliest_return {
                continue;
            }
            if let Some(next) = step(state, &history[i].kind) {
                placed[i] = true;
                if search(history, placed, next, seen) {
                    return true;
                }
                placed[i] = false;
            }
        }
        false
    }
    search(history, &mut vec![false; history.len()], None, &mut Default::default())
}

#[test]
fn the_checker_refuses_a_stale_read() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let op = |call, ret, kind| Op {
        call: at(call),
        ret: at(ret),
        kind,
    };
    // SET 1 returned before GET started: the GET must see 1.
    assert!(!linearizable(&[op(0, 1, Kind::Set(1)), op(2, 3, Kind::Get(None))]));
    assert!(linearizable(&[op(0, 3, Kind::Set(1)), op(1, 2, Kind::Get(None))]));
    assert!(!linearizable(&[
        op(0, 1, Kind::SetNx(1, true)),
        op(2, 3, Kind::SetNx(2, true))
    ]));
    assert!(linearizable(&[
        op(0, 1, Kind::SetNx(1, true)),
        op(2, 5, Kind::VDel(1, true)),
        op(3, 4, Kind::SetNx(2, false))
    ]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_is_linearizable_across_replicas() {
    let c = cluster(2).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Arc::new(Client::connect(c.mosquitto.port).await));
    }
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (n, client) in clients.iter().enumerate() {
        let (client, history) = (client.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..12u32 {
                let v = n as u32 * 100 + i;
                let vs = v.to_string();
                let call = Instant::now();
                let (payload, _) = match i % 4 {
                    0 => client.ok(&[b"SET", b"reg", vs.as_bytes()]).await,
                    1 => client.ok(&[b"SET", b"reg", vs.as_bytes(), b"NX"]).await,
                    2 => client.ok(&[b"GET", b"reg"]).await,
                    _ => {
                        let prev = (v - 3).to_string();
                        client.ok(&[b"VDEL", b"reg", prev.as_bytes()]).await
                    }
                };
                let kind = match i % 4 {
                    0 => Kind::Set(v),
                    1 => Kind::SetNx(v, &payload[..] == b"+OK\r\n"),
                    2 => Kind::Get(match &payload[..] {
                        b"$-1\r\n" | b"_\r\n" => None,
                        p => {
                            let text = String::from_utf8_lossy(p);
                            Some(text.rsplit("\r\n").nth(1).unwrap().parse().unwrap())
                        }
                    }),
                    _ => Kind::VDel(v - 3, &payload[..] == b":1\r\n"),
                };
                history.lock().unwrap().push(Op {
                    call,
                    ret: Instant::now(),
                    kind,
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    assert!(linearizable(&history), "not linearizable: {history:#?}");
}
