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

#[path = "doors/grpc.rs"]
mod grpc;
#[path = "doors/http.rs"]
mod http;
#[path = "doors/load.rs"]
mod load;
#[path = "doors/memory.rs"]
mod memory;
#[path = "doors/mqtt.rs"]
mod mqtt;
#[path = "doors/mqtt_client.rs"]
mod mqtt_client;
#[path = "doors/replicas.rs"]
mod replicas;

// What `doors/replicas.rs` takes from here.
pub(crate) use load::{Row, closed_loop, median};
pub(crate) use mqtt_client::{ECHO_TOPIC, Requester, bench_key, echo_responder, now_ts};

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
            mqtt::run(&o).await;
        }
        if o.wants("http") {
            http::run(&o).await;
        }
        if o.wants("grpc") {
            grpc::run(&o).await;
        }
        if o.wants("memory") {
            memory::run(&o).await;
        }
        if o.wants("replicas") {
            replicas::run(&o).await;
        }
    });
}
