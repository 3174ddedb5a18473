//! Three replicas of the real binary on one Redis and one Mosquitto, requests spread by a
//! shared subscription: a write through one is seen by an SSE stream and a gRPC Watch on the
//! others with its version; KEYNOTIFY is honoured whichever replica serves each request; a replica killed
//! with SIGKILL loses no acknowledged write and the survivors answer every new request; a
//! register under concurrent SET/NX/VDEL/GET through every replica is linearizable
//! (`scaleout_register.rs`); Redis restarted under load is 503, then heals.

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
use stategate::grpc::pb::statestore::v1 as npb;

const INVOKE: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// One replica: the binary, killed on drop.
struct Replica {
    child: std::process::Child,
    http: String,
    grpc: String,
}

impl Replica {
    async fn start(redis: u16, mqtt: u16, n: usize, dir: &std::path::Path) -> Replica {
        let (port, grpc) = (free_port(), free_port());
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
            .args(["--http-listen", &format!("127.0.0.1:{port}")])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
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
        let grpc = format!("http://127.0.0.1:{grpc}");
        Replica { child, http, grpc }
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
pub(crate) struct Client {
    mqtt: AsyncClient,
    id: String,
    pending: Pending,
    notes: tokio::sync::mpsc::UnboundedReceiver<(String, Option<String>)>,
    next: std::sync::atomic::AtomicU64,
    _task: tokio::task::JoinHandle<()>,
}

impl Client {
    pub(crate) async fn connect(port: u16) -> Client {
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

    pub(crate) async fn ok(&self, args: &[&[u8]]) -> (Bytes, Option<String>) {
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

pub(crate) struct Cluster {
    redis: server::TestServer,
    redis_port: u16,
    pub(crate) mosquitto: Mosquitto,
    replicas: Vec<Replica>,
    _dir: tempfile::TempDir,
}

pub(crate) async fn cluster(n: usize) -> Cluster {
    // reqwest's TLS takes the process's provider; no service runs in this process to install it.
    stategate::tls::install_provider();
    let redis = server::TestServer::start(server::Flavor::Redis);
    let mosquitto = Mosquitto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for i in 0..n {
        replicas.push(Replica::start(redis.port, mosquitto.port, i, dir.path()).await);
    }
    Cluster {
        redis_port: redis.port,
        redis,
        mosquitto,
        replicas,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_changes_notifications_and_survive_a_kill() {
    let mut c = cluster(3).await;
    let http = reqwest::Client::new();

    // An SSE watcher on replica 1 and a gRPC Watch on replica 2; a write through replica 0
    // reaches both with its version, which replica 2 serves as the ETag.
    let sse = http
        .get(format!("{}/v1.0-alpha1/state/statestore/subscribe", c.replicas[1].http))
        .send()
        .await
        .unwrap();
    let mut events = sse.bytes_stream();
    let mut grpc = npb::state_store_client::StateStoreClient::connect(c.replicas[2].grpc.clone())
        .await
        .expect("connect to replica 2's gRPC door");
    let mut watch = grpc
        .watch(npb::WatchRequest {
            keys: vec![b"shared".to_vec()],
            ..Default::default()
        })
        .await
        .expect("Watch")
        .into_inner();
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
    let event = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("a Watch event from replica 2")
        .expect("the Watch stream")
        .expect("an event, not the end");
    assert_eq!(
        (
            event.key.as_slice(),
            event.kind(),
            event.version.as_str(),
            event.value.as_slice()
        ),
        (&b"shared"[..], npb::watch_event::Kind::Set, etag.as_str(), &b"1"[..]),
        "{event:?}"
    );
    drop(watch);

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

/// Redis killed and started again (empty) while clients write through MQTT and HTTP on every
/// replica: while it is down every request is answered 503 (none hangs, none gets another
/// error); once it is back every replica serves again, KEYNOTIFY included, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_under_load_is_503_then_heals_on_every_replica() {
    let mut c = cluster(3).await;
    let http = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let mqtt = Arc::new(Client::connect(c.mosquitto.port).await);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Statuses seen by the load, by phase (0: up, 1: down, 2: back).
    let phase = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen: Arc<Mutex<[Vec<u16>; 3]>> = Default::default();
    let mut load = Vec::new();
    let load_tasks = 4;
    for n in 0..load_tasks {
        let (mqtt, http, stop, phase, seen) = (mqtt.clone(), http.clone(), stop.clone(), phase.clone(), seen.clone());
        let state = c.replicas[n % 3].state();
        load.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let key = format!("load-{n}-{i}");
                let at = phase.load(std::sync::atomic::Ordering::SeqCst);
                let status = if n < 2 {
                    // Within the bound: an unanswered request is a failure, not a 0 status.
                    match mqtt.request(&[b"SET", key.as_bytes(), b"v"], WAIT).await {
                        Some((stat, _, _)) => stat,
                        None => 0,
                    }
                } else {
                    http.post(&state)
                        .json(&json!([{"key": key, "value": i}]))
                        .send()
                        .await
                        .map_or(0, |r| r.status().as_u16())
                };
                seen.lock().unwrap()[at].push(status);
            }
        }));
    }
    let count = |p: usize, status: u16| seen.lock().unwrap()[p].iter().filter(|s| **s == status).count();
    until("writes while Redis is up", || count(0, 200) + count(0, 204) >= 20).await;

    c.redis.kill();
    phase.store(1, std::sync::atomic::Ordering::SeqCst);
    until("503s while Redis is down", || count(1, 503) >= 20).await;

    // Requests sent from now on may meet Redis up; those sent before it came back (at most one
    // per load task still in flight) may succeed too.
    phase.store(2, std::sync::atomic::Ordering::SeqCst);
    c.redis.restart();
    // Every replica writes again through HTTP.
    for r in &c.replicas {
        let give_up = Instant::now() + WAIT;
        loop {
            let status = http
                .post(r.state())
                .json(&json!([{"key": "after", "value": 1}]))
                .send()
                .await
                .unwrap()
                .status();
            if status == 204 {
                break;
            }
            assert_eq!(status, 503);
            assert!(Instant::now() < give_up, "{} did not recover within {WAIT:?}", r.http);
            // Polling for an outside process to come back: no event to await.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    until("writes after Redis is back", || count(2, 200) + count(2, 204) >= 20).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in load {
        t.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    for (p, statuses) in seen.iter().enumerate() {
        let odd: Vec<_> = statuses.iter().filter(|s| ![200, 204, 503].contains(*s)).collect();
        assert!(odd.is_empty(), "phase {p}: unexpected answers (0: none) {odd:?}");
    }
    // Every request sent while Redis was down got 503, except those still in flight when it
    // came back (at most one per load task).
    assert!(
        seen[1].iter().filter(|s| **s != 503).count() <= load_tasks,
        "while Redis was down: {:?}",
        seen[1]
    );

    // Registrations and the change log start again from an empty Redis: KEYNOTIFY through the
    // shared subscription, a change through each replica, one notification each.
    let mut client = Client::connect(c.mosquitto.port).await;
    client.ok(&[b"KEYNOTIFY", b"healed"]).await;
    for r in &c.replicas {
        let resp = http
            .post(r.state())
            .json(&json!([{"key": "healed", "value": 1}]))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 204);
        let (topic, _) = client.note().await;
        assert!(topic.ends_with(&hex::encode_upper("healed")), "{topic}");
    }
}

/// Waits until `done`, at most `WAIT`.
async fn until(what: &str, done: impl Fn() -> bool) {
    let give_up = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < give_up, "{what}: not within {WAIT:?}");
        // Waiting for the load tasks' answers to accumulate: no single event marks it.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
