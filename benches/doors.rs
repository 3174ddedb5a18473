//! The doors benchmark: every door next to its physical baseline, measured in one run.
//!
//! ```text
//! cargo bench --bench doors -- [--mqtt-url mqtt://host:port] [--secs 5] [--warmup-secs 1]
//!                              [--only mqtt,http,grpc,memory,replicas] [--keys 1000000]
//!                              [--inflight 1,16,64,256] [--verbs GET,SET] [--rounds 3]
//!                              [--paths inbroker,client,mirrored]
//!
//! Echo and stategate run alternately `--rounds` times per row and the run with the median
//! throughput is printed for each, so a burst of noise on a shared 2-core machine does not
//! decide the ratio.
//! ```
//!
//! - MQTT: an echo responder on the same broker (the limit of MQTT request/response here), then
//!   stategate, with the same load; on the embedded broker both ways of serving, each on its own
//!   broker with its own echo: in-broker (the default) and the client path (`--mqtt-client-path`): QoS 1 requests, 1/16/64/256 in flight, GET and SET of 16-byte
//!   keys with 100-byte values. Prints throughput, p50/p90/p99/p99.9 and stategate/echo ratios.
//!   `--paths mirrored` adds in-broker serving with `--state-topics state/` and a `state/#`
//!   subscriber taking every retained message: what the mirror costs a SET.
//! - HTTP: GET and SAVE at a fixed 1,000 requests/s and at saturation with 16 connections, next
//!   to a bare axum handler returning a constant body.
//! - gRPC: Dapr GetState and SaveState at 1,000 requests/s and at saturation with 16 concurrent
//!   streams, next to a bare tonic unary handler.
//! - Memory: resident bytes per key for 1 million keys next to redis-server's `used_memory`
//!   (when redis-server is installed).
//! - Replicas: MQTT GET/SET at 64 in flight through 1, 2 and 3 replicas on one redis-server
//!   (Mosquitto's shared subscription), next to one replica on the durable backend, with the
//!   Redis round trips per operation (`doors/replicas.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use stategate::config::{BrokerChoice, Config};
use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::storage::Store;
use tokio::sync::oneshot;

#[path = "doors/replicas.rs"]
mod replicas;

#[derive(Clone)]
struct Opts {
    mqtt_url: Option<String>,
    secs: u64,
    warmup: u64,
    only: Vec<String>,
    keys: usize,
    inflight: Vec<usize>,
    verbs: Vec<String>,
    rounds: usize,
    /// MQTT serving paths on the embedded broker: `inbroker`, `client`.
    paths: Vec<String>,
}

fn opts() -> Opts {
    let mut o = Opts {
        mqtt_url: None,
        secs: 5,
        warmup: 1,
        only: vec![],
        keys: 1_000_000,
        inflight: vec![1, 16, 64, 256],
        verbs: vec!["GET".into(), "SET".into()],
        rounds: 3,
        paths: vec!["inbroker".into(), "client".into()],
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--mqtt-url" => o.mqtt_url = it.next().cloned(),
            "--secs" => o.secs = it.next().and_then(|v| v.parse().ok()).unwrap_or(5),
            "--warmup-secs" => o.warmup = it.next().and_then(|v| v.parse().ok()).unwrap_or(1),
            "--only" => {
                o.only = it
                    .next()
                    .map(|v| v.split(',').map(str::to_owned).collect())
                    .unwrap_or_default()
            }
            "--keys" => o.keys = it.next().and_then(|v| v.parse().ok()).unwrap_or(1_000_000),
            "--inflight" => {
                o.inflight = it
                    .next()
                    .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
                    .unwrap_or_default()
            }
            "--rounds" => o.rounds = it.next().and_then(|v| v.parse().ok()).unwrap_or(3).max(1),
            "--paths" => {
                o.paths = it
                    .next()
                    .map(|v| v.split(',').map(str::to_lowercase).collect())
                    .unwrap_or_default()
            }
            "--verbs" => {
                o.verbs = it
                    .next()
                    .map(|v| v.split(',').map(str::to_uppercase).collect())
                    .unwrap_or_default()
            }
            _ => {} // cargo passes --bench
        }
    }
    o
}

impl Opts {
    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

/// One measured row.
struct Row {
    name: String,
    ops: u64,
    secs: f64,
    h: Histogram<u64>,
}

impl Row {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    fn ms(&self, q: f64) -> f64 {
        self.h.value_at_quantile(q) as f64 / 1000.0
    }
    fn print(&self, baseline: Option<&Row>) {
        let ratio = baseline
            .map(|b| {
                format!(
                    "  x{:.2} thr  x{:.2} p50",
                    self.rate() / b.rate().max(1e-9),
                    self.ms(0.5) / b.ms(0.5).max(1e-9)
                )
            })
            .unwrap_or_default();
        println!(
            "{:<34} {:>9.0}/s  p50 {:>7.3}  p90 {:>7.3}  p99 {:>7.3}  p99.9 {:>7.3} ms{}",
            self.name,
            self.rate(),
            self.ms(0.5),
            self.ms(0.9),
            self.ms(0.99),
            self.ms(0.999),
            ratio
        );
    }
}

/// The run with the median throughput.
fn median(mut rows: Vec<Row>) -> Row {
    rows.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let mid = rows.len() / 2;
    rows.swap_remove(mid)
}

/// Runs `inflight` closed-loop workers calling `op` for warmup + measured time.
async fn closed_loop<F, Fut>(name: String, inflight: usize, o: &Opts, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let warm_end = Instant::now() + Duration::from_secs(o.warmup);
    let end = warm_end + Duration::from_secs(o.secs);
    let mut tasks = Vec::new();
    for w in 0..inflight {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = hist();
            let mut n = 0u64;
            let mut i = w as u64 * 1_000_003;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                op(i).await;
                i += 1;
                if t0 >= warm_end {
                    let _ = h.record(t0.elapsed().as_micros().max(1) as u64);
                    n += 1;
                }
            }
            (h, n)
        }));
    }
    let mut h = hist();
    let mut ops = 0;
    for t in tasks {
        if let Ok((th, n)) = t.await {
            let _ = h.add(&th);
            ops += n;
        }
    }
    Row {
        name,
        ops,
        secs: o.secs as f64,
        h,
    }
}

/// Fires `op` at a fixed rate (open loop). Latency counts from the moment the request is sent:
/// tokio's timer wakes up to 1 ms late, and counting from the scheduled time measured that
/// timer (a bare handler showed p50 0.8 ms), not the server.
async fn fixed_rate<F, Fut>(name: String, per_sec: u64, o: &Opts, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let op = Arc::new(op);
    let total = per_sec * (o.secs + o.warmup);
    let warm = per_sec * o.warmup;
    let h = Arc::new(Mutex::new(hist()));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let at = start + Duration::from_micros(i * 1_000_000 / per_sec);
        tokio::time::sleep_until(at.into()).await;
        let (op, h) = (op.clone(), h.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            op(i).await;
            if i >= warm {
                let us = sent.elapsed().as_micros().max(1) as u64;
                let _ = h.lock().map(|mut h| h.record(us));
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let h = Arc::try_unwrap(h)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .unwrap_or_else(hist);
    Row {
        name,
        ops: total - warm,
        secs: o.secs as f64,
        h,
    }
}

// ---------------------------------------------------------------- MQTT

const ECHO_TOPIC: &str = "bench/echo/request";

fn mqtt_opts(id: &str, host: &str, port: u16) -> MqttOptions {
    let mut m = MqttOptions::new(id, host, port);
    m.set_max_packet_size(Some(16 * 1024 * 1024));
    m.set_keep_alive(Duration::from_secs(30));
    m.set_request_channel_capacity(4096);
    m.set_outgoing_inflight_upper_limit(1024);
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    m.set_network_options(net);
    m
}

/// The physical limit: republishes each request's payload to its Response Topic.
async fn echo_responder(host: &str, port: u16, n: usize) {
    let (client, mut el) = AsyncClient::new(mqtt_opts(&format!("bench-echo-{n}"), host, port), 4096);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<rumqttc::v5::mqttbytes::v5::Publish>();
    let (ready_tx, ready_rx) = oneshot::channel();
    let c2 = client.clone();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            let props = p.properties.unwrap_or_default();
            let Some(rt) = props.response_topic else { continue };
            let out = PublishProperties {
                correlation_data: props.correlation_data,
                ..Default::default()
            };
            let _ = c2
                .publish_with_properties(rt, QoS::AtLeastOnce, false, p.payload, out)
                .await;
        }
    });
    let mut ready_tx = Some(ready_tx);
    let sub = client.clone();
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let sub = sub.clone();
                    tokio::spawn(async move { sub.subscribe(ECHO_TOPIC, QoS::AtLeastOnce).await });
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(r) = ready_tx.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send(p);
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(10), ready_rx).await;
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

/// A request/response client: one MQTT connection, any number of concurrent requests.
#[derive(Clone)]
struct Requester {
    client: AsyncClient,
    waiters: Waiters,
    response_topic: Arc<str>,
}

impl Requester {
    async fn connect(id: &str, host: &str, port: u16) -> Requester {
        let (client, mut el) = AsyncClient::new(mqtt_opts(id, host, port), 4096);
        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        let response_topic: Arc<str> = Arc::from(format!("clients/{id}/bench/response"));
        let (ready_tx, ready_rx) = oneshot::channel();
        let (w, sub, topic) = (waiters.clone(), client.clone(), response_topic.to_string());
        tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let (sub, topic) = (sub.clone(), topic.clone());
                        tokio::spawn(async move { sub.subscribe(topic, QoS::AtLeastOnce).await });
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(r) = ready_tx.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let corr = p.properties.and_then(|p| p.correlation_data);
                        if let Some(c) = corr.filter(|c| c.len() == 8) {
                            let id = u64::from_be_bytes(c[..8].try_into().unwrap_or([0; 8]));
                            if let Some(tx) = w.lock().ok().and_then(|mut m| m.remove(&id)) {
                                let _ = tx.send(());
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(10), ready_rx).await;
        Requester {
            client,
            waiters,
            response_topic,
        }
    }

    async fn request(&self, topic: &str, id: u64, payload: Bytes, user: Vec<(String, String)>) {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.waiters.lock() {
            m.insert(id, tx);
        }
        let props = PublishProperties {
            response_topic: Some(self.response_topic.to_string()),
            correlation_data: Some(Bytes::copy_from_slice(&id.to_be_bytes())),
            user_properties: user,
            content_type: Some("application/octet-stream".into()),
            message_expiry_interval: Some(10),
            ..Default::default()
        };
        let _ = self
            .client
            .publish_with_properties(topic.to_owned(), QoS::AtLeastOnce, false, payload, props)
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
    }
}

fn bench_key(i: u64) -> Vec<u8> {
    format!("key-{:012}", i % 10_000).into_bytes()
}

fn now_ts() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{ms:015}:00000:bench")
}

/// One way of serving MQTT requests, with an echo responder on the same broker.
struct MqttTarget {
    label: &'static str,
    running: stategate::Running,
    req: Requester,
    /// Messages the `state/#` subscriber received (mirrored target only).
    mirrored: Option<Arc<std::sync::atomic::AtomicU64>>,
}

/// Starts stategate on `broker` with the echo responder and a load client beside it, and fills
/// the GET keys.
async fn mqtt_target(label: &'static str, broker: BrokerChoice, n: usize, mirrored: bool) -> MqttTarget {
    let mut config = Config {
        http_listen: None,
        grpc_listen: None,
        broker,
        ..Config::default()
    };
    if mirrored {
        config.mqtt.state_topics = Some(stategate::mqtt::mirror::StateTopics {
            prefix: "state/".into(),
            set_by_publish: false,
            external_broker: false,
        });
    }
    config.mqtt.client_id = format!("stategate-bench-{n}");
    if std::env::var_os("BENCH_CLEAN_SESSION").is_some() {
        config.mqtt.session_expiry = Duration::ZERO;
    }
    let running = stategate::start(config, Store::memory())
        .await
        .expect("stategate starts");
    let (host, port) = {
        let (h, p) = running.mqtt_broker();
        (h.to_owned(), p)
    };
    println!("{label}: broker {host}:{port}");
    echo_responder(&host, port, n).await;
    let mirrored = match mirrored {
        true => Some(mirror_subscriber(&host, port, n).await),
        false => None,
    };
    let value = vec![b'v'; 100];
    let setup = Requester::connect(&format!("bench-setup-{n}"), &host, port).await;
    for i in 0..10_000u64 {
        let payload = stategate::resp3::encode_request([&b"SET"[..], &bench_key(i), &value]);
        setup
            .request(
                stategate::mqtt::INVOKE_TOPIC,
                i,
                payload,
                vec![("__ts".into(), now_ts())],
            )
            .await;
    }
    let req = Requester::connect(&format!("bench-load-{n}"), &host, port).await;
    MqttTarget {
        label,
        running,
        req,
        mirrored,
    }
}

/// A `state/#` subscriber that takes (and drops) every message of the state topics mirror.
async fn mirror_subscriber(host: &str, port: u16, n: usize) -> Arc<std::sync::atomic::AtomicU64> {
    let (client, mut el) = AsyncClient::new(mqtt_opts(&format!("bench-mirror-{n}"), host, port), 4096);
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = received.clone();
    let (ready_tx, ready_rx) = oneshot::channel();
    let mut ready_tx = Some(ready_tx);
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let c = client.clone();
                    tokio::spawn(async move { c.subscribe("state/#", QoS::AtLeastOnce).await });
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(r) = ready_tx.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(_))) => {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(10), ready_rx).await;
    received
}

async fn mqtt(o: &Opts) {
    println!(
        "\n== MQTT: QoS 1 request/response, 16-byte keys, 100-byte values, {} s per row",
        o.secs
    );
    let mut targets = Vec::new();
    match &o.mqtt_url {
        Some(url) => {
            let a = stategate::config::ServeArgs {
                mqtt_url: Some(url.clone()),
                ..Default::default()
            };
            let broker = Config::from_args(a).expect("--mqtt-url").broker;
            targets.push(mqtt_target("client   ", broker, 0, false).await);
        }
        None => {
            let paths = [
                ("in-broker", "inbroker", false, false),
                ("client   ", "client", true, false),
                ("mirrored ", "mirrored", false, true),
            ];
            for (n, (label, wanted, client_path, mirrored)) in paths.into_iter().enumerate() {
                if !o.paths.iter().any(|p| p == wanted) {
                    continue;
                }
                let broker = BrokerChoice::Embedded {
                    listen: "127.0.0.1:0".parse().expect("addr"),
                    client_path,
                };
                targets.push(mqtt_target(label, broker, n, mirrored).await);
            }
        }
    }
    let value = vec![b'v'; 100];
    for &inflight in &o.inflight {
        for verb in ["GET", "SET"].into_iter().filter(|v| o.verbs.iter().any(|w| w == v)) {
            let mk = {
                let value = value.clone();
                move |i: u64| -> (Bytes, Vec<(String, String)>) {
                    let key = bench_key(i);
                    if verb == "GET" {
                        (stategate::resp3::encode_request([&b"GET"[..], &key]), vec![])
                    } else {
                        let p = stategate::resp3::encode_request([&b"SET"[..], &key, &value]);
                        (p, vec![("__ts".into(), now_ts())])
                    }
                }
            };
            let seq = Arc::new(std::sync::atomic::AtomicU64::new(1 << 40));
            // Per target: its echo runs and its stategate runs, alternating round by round.
            let mut runs: Vec<(Vec<Row>, Vec<Row>)> = targets.iter().map(|_| (vec![], vec![])).collect();
            for _ in 0..o.rounds {
                for (t, (echoes, sgs)) in targets.iter().zip(runs.iter_mut()) {
                    for (topic, name, out) in [
                        (ECHO_TOPIC, "echo     ", &mut *echoes),
                        (stategate::mqtt::INVOKE_TOPIC, t.label, &mut *sgs),
                    ] {
                        let (r, mk2, s2) = (t.req.clone(), mk.clone(), seq.clone());
                        let row = closed_loop(format!("{name} {verb} x{inflight:<3}"), inflight, o, move |i| {
                            let (r, (payload, user)) = (r.clone(), mk2(i));
                            let id = s2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            async move { r.request(topic, id, payload, user).await }
                        })
                        .await;
                        out.push(row);
                    }
                }
            }
            for (echoes, sgs) in runs {
                let echo = median(echoes);
                let sg = median(sgs);
                echo.print(None);
                sg.print(Some(&echo));
            }
        }
    }
    for t in targets {
        if let Some(n) = &t.mirrored {
            let n = n.load(std::sync::atomic::Ordering::Relaxed);
            println!(
                "{}: the state/# subscriber received {n} mirror messages",
                t.label.trim()
            );
        }
        t.running.shutdown().await;
    }
}

// ---------------------------------------------------------------- HTTP

async fn http(o: &Opts) {
    println!(
        "\n== HTTP: Dapr state API, 16 connections at saturation, {} s per row",
        o.secs
    );
    let mut config = Config {
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        grpc_listen: None,
        broker: BrokerChoice::Embedded {
            listen: "127.0.0.1:0".parse().expect("addr"),
            client_path: false,
        },
        ..Config::default()
    };
    config.mqtt.client_id = "stategate-bench-http".into();
    let running = stategate::start(config, Store::memory())
        .await
        .expect("stategate starts");
    let base = format!("http://{}", running.http_addr().expect("http"));

    // The baseline: a bare axum handler returning a constant body.
    let bare = axum::Router::new().route(
        "/get",
        axum::routing::get(|| async { ([("content-type", "application/json")], "\"constant-value\"") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let bare_addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, bare).await });

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    let value = serde_json::json!("v".repeat(100));
    let body = serde_json::to_vec(&serde_json::json!([{"key": "key-000000000001", "value": value}])).expect("json");
    client
        .post(format!("{base}/v1.0/state/statestore"))
        .body(body.clone())
        .send()
        .await
        .expect("seed");

    let get_url: Arc<str> = Arc::from(format!("{base}/v1.0/state/statestore/key-000000000001"));
    let bare_url: Arc<str> = Arc::from(format!("http://{bare_addr}/get"));
    let save_url: Arc<str> = Arc::from(format!("{base}/v1.0/state/statestore"));
    let body = Bytes::from(body);
    let get = |c: reqwest::Client, u: Arc<str>| {
        move |_i: u64| {
            let (c, u) = (c.clone(), u.clone());
            async move {
                if let Ok(r) = c.get(&*u).send().await {
                    let _ = r.bytes().await;
                }
            }
        }
    };
    let save = |c: reqwest::Client, u: Arc<str>, b: Bytes| {
        move |_i: u64| {
            let (c, u, b) = (c.clone(), u.clone(), b.clone());
            async move {
                if let Ok(r) = c.post(&*u).body(b).send().await {
                    let _ = r.bytes().await;
                }
            }
        }
    };
    let bare_fixed = fixed_rate(
        "bare axum GET @1000/s".into(),
        1000,
        o,
        get(client.clone(), bare_url.clone()),
    )
    .await;
    let get_fixed = fixed_rate(
        "stategate GET @1000/s".into(),
        1000,
        o,
        get(client.clone(), get_url.clone()),
    )
    .await;
    let save_fixed = fixed_rate(
        "stategate SAVE @1000/s".into(),
        1000,
        o,
        save(client.clone(), save_url.clone(), body.clone()),
    )
    .await;
    bare_fixed.print(None);
    get_fixed.print(Some(&bare_fixed));
    save_fixed.print(Some(&bare_fixed));
    let bare_sat = closed_loop("bare axum GET x16".into(), 16, o, get(client.clone(), bare_url)).await;
    let get_sat = closed_loop("stategate GET x16".into(), 16, o, get(client.clone(), get_url)).await;
    let save_sat = closed_loop("stategate SAVE x16".into(), 16, o, save(client.clone(), save_url, body)).await;
    bare_sat.print(None);
    get_sat.print(Some(&bare_sat));
    save_sat.print(Some(&bare_sat));
    println!("(Dapr sidecar published: HTTP GET p50 0.73 ms, p90 1.60 ms, p99 1.97 ms at 1,000/s)");
    running.shutdown().await;
}

// ---------------------------------------------------------------- gRPC

/// The baseline: every state RPC answers a constant at once.
struct Bare;

#[tonic::async_trait]
impl rpb::dapr_server::Dapr for Bare {
    async fn get_state(
        &self,
        _r: tonic::Request<rpb::GetStateRequest>,
    ) -> Result<tonic::Response<rpb::GetStateResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::GetStateResponse {
            data: b"\"constant-value\"".to_vec(),
            etag: "000000000000001:00000:bare".into(),
            metadata: HashMap::new(),
        }))
    }
    async fn get_bulk_state(
        &self,
        _r: tonic::Request<rpb::GetBulkStateRequest>,
    ) -> Result<tonic::Response<rpb::GetBulkStateResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::GetBulkStateResponse::default()))
    }
    async fn save_state(
        &self,
        _r: tonic::Request<rpb::SaveStateRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn query_state_alpha1(
        &self,
        _r: tonic::Request<rpb::QueryStateRequest>,
    ) -> Result<tonic::Response<rpb::QueryStateResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::QueryStateResponse::default()))
    }
    async fn delete_state(
        &self,
        _r: tonic::Request<rpb::DeleteStateRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn delete_bulk_state(
        &self,
        _r: tonic::Request<rpb::DeleteBulkStateRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn execute_state_transaction(
        &self,
        _r: tonic::Request<rpb::ExecuteStateTransactionRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn get_metadata(
        &self,
        _r: tonic::Request<rpb::GetMetadataRequest>,
    ) -> Result<tonic::Response<rpb::GetMetadataResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::GetMetadataResponse::default()))
    }
    // Not measured: the lock and configuration RPCs.
    async fn get_configuration_alpha1(
        &self,
        _r: tonic::Request<rpb::GetConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::GetConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn get_configuration(
        &self,
        _r: tonic::Request<rpb::GetConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::GetConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    type SubscribeConfigurationAlpha1Stream = BareStream;
    async fn subscribe_configuration_alpha1(
        &self,
        _r: tonic::Request<rpb::SubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<BareStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    type SubscribeConfigurationStream = BareStream;
    async fn subscribe_configuration(
        &self,
        _r: tonic::Request<rpb::SubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<BareStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn unsubscribe_configuration_alpha1(
        &self,
        _r: tonic::Request<rpb::UnsubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::UnsubscribeConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn unsubscribe_configuration(
        &self,
        _r: tonic::Request<rpb::UnsubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::UnsubscribeConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn try_lock_alpha1(
        &self,
        _r: tonic::Request<rpb::TryLockRequest>,
    ) -> Result<tonic::Response<rpb::TryLockResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn unlock_alpha1(
        &self,
        _r: tonic::Request<rpb::UnlockRequest>,
    ) -> Result<tonic::Response<rpb::UnlockResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
}

type BareStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<rpb::SubscribeConfigurationResponse, tonic::Status>> + Send>,
>;

async fn grpc(o: &Opts) {
    println!(
        "\n== gRPC: Dapr runtime API, 16 concurrent streams at saturation, {} s per row",
        o.secs
    );
    let mut config = Config {
        http_listen: None,
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        broker: BrokerChoice::Embedded {
            listen: "127.0.0.1:0".parse().expect("addr"),
            client_path: false,
        },
        ..Config::default()
    };
    config.mqtt.client_id = "stategate-bench-grpc".into();
    let running = stategate::start(config, Store::memory())
        .await
        .expect("stategate starts");
    let sg_url = format!("http://{}", running.grpc_addr().expect("grpc"));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let bare_url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(rpb::dapr_server::DaprServer::new(Bare))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)))
            .await
    });
    let connect = |url: String| async move {
        let ch = tonic::transport::Endpoint::from_shared(url)
            .expect("url")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        rpb::dapr_client::DaprClient::new(ch)
    };
    let sg = connect(sg_url).await;
    let bare = connect(bare_url).await;
    let item = common::StateItem {
        key: "key-000000000001".into(),
        value: vec![b'v'; 100],
        ..Default::default()
    };
    sg.clone()
        .save_state(rpb::SaveStateRequest {
            store_name: "statestore".into(),
            states: vec![item.clone()],
        })
        .await
        .expect("seed");
    let get = |c: rpb::dapr_client::DaprClient<tonic::transport::Channel>| {
        move |_i: u64| {
            let mut c = c.clone();
            async move {
                let _ = c
                    .get_state(rpb::GetStateRequest {
                        store_name: "statestore".into(),
                        key: "key-000000000001".into(),
                        ..Default::default()
                    })
                    .await;
            }
        }
    };
    let save = |c: rpb::dapr_client::DaprClient<tonic::transport::Channel>, item: common::StateItem| {
        move |_i: u64| {
            let (mut c, item) = (c.clone(), item.clone());
            async move {
                let _ = c
                    .save_state(rpb::SaveStateRequest {
                        store_name: "statestore".into(),
                        states: vec![item],
                    })
                    .await;
            }
        }
    };
    let bare_fixed = fixed_rate("bare tonic GetState @1000/s".into(), 1000, o, get(bare.clone())).await;
    let get_fixed = fixed_rate("stategate GetState @1000/s".into(), 1000, o, get(sg.clone())).await;
    let save_fixed = fixed_rate(
        "stategate SaveState @1000/s".into(),
        1000,
        o,
        save(sg.clone(), item.clone()),
    )
    .await;
    bare_fixed.print(None);
    get_fixed.print(Some(&bare_fixed));
    save_fixed.print(Some(&bare_fixed));
    let bare_sat = closed_loop("bare tonic GetState x16".into(), 16, o, get(bare)).await;
    let get_sat = closed_loop("stategate GetState x16".into(), 16, o, get(sg.clone())).await;
    let save_sat = closed_loop("stategate SaveState x16".into(), 16, o, save(sg, item)).await;
    bare_sat.print(None);
    get_sat.print(Some(&bare_sat));
    save_sat.print(Some(&bare_sat));
    println!("(Dapr sidecar published: gRPC GET p50 0.57 ms, p90 0.93 ms, p99 1.65 ms at 1,000/s)");
    running.shutdown().await;
}

// ---------------------------------------------------------------- memory

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Resident set growth per key for `n` keys written through the engine, with the change
/// history kept (the default) or not.
async fn engine_bytes_per_key(n: usize, history: bool) -> (f64, usize) {
    let mut limits = stategate::engine::Limits::default();
    if !history {
        limits.feed.max_events = 0;
    }
    let engine =
        stategate::engine::Engine::open(Store::memory(), "bench", Arc::new(stategate::hlc::SystemClock), limits)
            .await
            .expect("engine");
    let before = rss_bytes();
    for i in 0..n {
        // Every value its own 100 bytes, as values arriving over a door are.
        let mut value = vec![b'v'; 100];
        value[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let cmd = stategate::engine::Command::Set(stategate::engine::Set {
            key: Bytes::from(format!("key-{i:012}")),
            value: Bytes::from(value),
            condition: stategate::engine::SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        });
        engine.execute(cmd).await.expect("set");
    }
    let per_key = rss_bytes().saturating_sub(before) as f64 / n as f64;
    let held = engine.feed_held().1;
    drop(engine);
    // Hand the freed pages back, so the next measurement starts from a clean slate.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    (per_key, held)
}

async fn memory(o: &Opts) {
    let n = o.keys;
    println!("\n== Memory: {n} keys of 16 bytes with 100-byte values");
    let (index, _) = engine_bytes_per_key(n, false).await;
    let (total, held) = engine_bytes_per_key(n, true).await;
    println!("stategate (memory storage):   {index:>7.1} bytes/key (resident set growth, no change history)");
    println!(
        "  with the change history:    {total:>7.1} bytes/key (the history is a fixed budget, here {:.1} MiB held)",
        held as f64 / (1024.0 * 1024.0)
    );
    match redis_bytes_per_key(n) {
        Some(theirs) => println!(
            "redis-server used_memory:     {theirs:>7.1} bytes/key   stategate/redis x{:.2} (x{:.2} with the history)",
            index / theirs,
            total / theirs
        ),
        None => println!("redis-server: not installed (apt-get install redis-server), comparison skipped"),
    }
}

fn redis_bytes_per_key(n: usize) -> Option<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let mut child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let result = (|| {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut con = loop {
            match client.get_connection() {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => return None,
            }
        };
        let used = |con: &mut redis::Connection| -> Option<u64> {
            let info: String = redis::cmd("INFO").arg("memory").query(con).ok()?;
            info.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse().ok())
        };
        let before = used(&mut con)?;
        let value = vec![b'v'; 100];
        for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                pipe.cmd("SET").arg(format!("key-{i:012}")).arg(&value).ignore();
            }
            pipe.query::<()>(&mut con).ok()?;
        }
        let after = used(&mut con)?;
        Some(after.saturating_sub(before) as f64 / n as f64)
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "stategate doors benchmark: {} cores, {} s per row after {} s warm-up",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        o.secs,
        o.warmup
    );
    rt.block_on(async {
        if o.wants("mqtt") {
            mqtt(&o).await;
        }
        if o.wants("http") {
            http(&o).await;
        }
        if o.wants("grpc") {
            grpc(&o).await;
        }
        if o.wants("memory") {
            memory(&o).await;
        }
        if o.wants("replicas") {
            replicas::run(&o).await;
        }
    });
}
