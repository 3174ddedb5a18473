//! The doors benchmark: every door next to its physical baseline, measured in one run.
//!
//! ```text
//! cargo bench --bench doors -- [--mqtt-url mqtt://host:port] [--secs 5] [--warmup-secs 1]
//!                              [--only mqtt,http,grpc,component,replicas]
//!                              [--inflight 1,16,64,256] [--verbs GET,SET]
//!                              [--rounds 3] [--paths inbroker,client,mirrored] [--no-log]
//!
//! The baseline and stategate run alternately `--rounds` times per row and the run with the
//! median throughput (at a fixed rate: the median p50) is printed for each, so a burst of
//! noise on a shared 2-core machine does not decide the ratio.
//! ```
//!
//! Every row prints throughput, p50/p90/p99/p99.9 latency and the CPU time per request of
//! each side over the measured window: `serve` is the serving side (stategate, its embedded
//! broker, the echo responder, the bare servers), `load` the load generator. The servers run
//! on a tokio runtime whose threads are named `serve` (stategate's own threads are
//! `stategate-*`), the load generator on one named `load`, and the kernel's run time of each
//! thread (`/proc/self/task/*/schedstat`, `common/cpu.rs`) is summed per side: CPU per request
//! is the figure that transfers to a bigger machine, where throughput here is bounded by two
//! cores shared by both sides. A stategate row then prints its ratios to the baseline row
//! above it: `thr` (throughput), `p50`, and `cpu` (serving CPU per request). stategate runs
//! with the binary's log subscriber at its default filter (`--no-log`: without it).
//!
//! - MQTT: an echo responder on the same broker (the limit of MQTT request/response here), then
//!   stategate, with the same load; on the embedded broker both ways of serving, each on its own
//!   broker with its own echo: in-broker (the default) and the client path
//!   (`--mqtt-client-path`): QoS 1 requests at a fixed 1,000/s and with 1/16/64/256 in flight,
//!   GET and SET of 16-byte keys with 100-byte values. The echo row's serving CPU is the
//!   broker's plus the responder's. `--paths mirrored` adds in-broker serving with
//!   `--state-topics state/` and a `state/#` subscriber taking every retained message: what
//!   the mirror costs a SET.
//! - HTTP: GET and SAVE at a fixed 1,000 requests/s and at saturation with 16 connections, next
//!   to a bare axum handler returning a constant body.
//! - gRPC: Dapr GetState and SaveState at 1,000 requests/s and at saturation with 16 concurrent
//!   streams, next to a bare tonic unary handler.
//! - Component: the Dapr pluggable state component on its Unix socket, Get and Set as daprd
//!   sends them, at 1,000 requests/s and with 16 in flight, next to a component answering
//!   constants (`dapr/bare.rs`).
//! - Replicas: MQTT GET/SET at 64 in flight through 1, 2 and 3 replicas on one redis-server
//!   (Mosquitto's shared subscription), next to one replica on the durable backend, with the
//!   Redis round trips per operation (`doors/replicas.rs`). Its rows print their own CPU line,
//!   one figure per party (stategate, redis-server, Mosquitto, the load generator), in place of
//!   the serve and load columns: two of its servers are other processes.

use std::future::Future;
use std::sync::OnceLock;

use stategate::config::Config;

#[path = "doors/component.rs"]
mod component;
// The dapr benchmark's named snapshots are not used here.
#[allow(dead_code)]
#[path = "common/cpu.rs"]
mod cpu;
#[path = "doors/grpc.rs"]
mod grpc;
#[path = "doors/http.rs"]
mod http;
#[path = "doors/load.rs"]
mod load;
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
    inflight: Vec<usize>,
    verbs: Vec<String>,
    rounds: usize,
    /// MQTT serving paths on the embedded broker: `inbroker`, `client`.
    paths: Vec<String>,
    /// Measure CPU per request (off where the servers are not on the `serve` runtime).
    cpu: bool,
    no_log: bool,
}

fn opts() -> Opts {
    let mut o = Opts {
        mqtt_url: None,
        secs: 5,
        warmup: 1,
        only: vec![],
        inflight: vec![1, 16, 64, 256],
        verbs: vec!["GET".into(), "SET".into()],
        rounds: 3,
        paths: vec!["inbroker".into(), "client".into()],
        cpu: true,
        no_log: false,
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
            "--no-log" => o.no_log = true,
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

/// The `serve` runtime, where every server of a row runs.
static SERVE: OnceLock<tokio::runtime::Handle> = OnceLock::new();

/// Runs `fut` on the `serve` runtime: whatever it spawns (stategate's tasks, a bare server's
/// connections) and the sockets it binds belong to the serving side, not to the load generator.
pub(crate) async fn serving<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    SERVE
        .get()
        .expect("the serve runtime")
        .spawn(fut)
        .await
        .expect("a serving task panicked")
}

fn main() {
    let o = opts();
    // As the binary runs: its log subscriber at its default filter, so the per-request spans
    // cost what they cost a deployed stategate (nothing is logged per request at `info`).
    let _log = (!o.no_log).then(|| {
        let ops = Config::default().ops;
        stategate::telemetry::init(&ops.log_filter, ops.log_format)
    });
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .thread_name(name)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let (serve_rt, load_rt) = (runtime("serve"), runtime("load"));
    SERVE.set(serve_rt.handle().clone()).expect("set once");
    println!(
        "stategate doors benchmark: {cores} cores, {} s per row after {} s warm-up, {} rounds; \
         CPU per request in µs (serve: the serving side, load: the load generator)",
        o.secs, o.warmup, o.rounds
    );
    // Spawned, so that the load generator runs on the `load` threads alone, whose CPU is counted.
    let work = load_rt.spawn(async move {
        if o.wants("mqtt") {
            mqtt::run(&o).await;
        }
        if o.wants("http") {
            http::run(&o).await;
        }
        if o.wants("grpc") {
            grpc::run(&o).await;
        }
        if o.wants("component") {
            component::run(&o).await;
        }
        if o.wants("replicas") {
            // Its rows print each party's CPU themselves (redis-server and Mosquitto too).
            replicas::run(&Opts {
                cpu: false,
                ..o.clone()
            })
            .await;
        }
    });
    let failed = load_rt.block_on(work).is_err();
    if let Some(share) = load::neither_share() {
        println!(
            "\n{:.1}% of this process's CPU time in the measured windows was on neither side (main thread, unnamed threads)",
            share * 100.0
        );
    }
    drop(load_rt);
    drop(serve_rt);
    if failed {
        std::process::exit(1);
    }
}
