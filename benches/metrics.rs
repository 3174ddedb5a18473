//! What metrics cost: the same requests with metrics off and on, in the same run, rounds
//! interleaved (off, on, off, on, ...) so that machine noise hits both alike.
//!
//! The paths measured have no network in them (the MQTT door's `Door::serve`, the HTTP router
//! called in process), so the cost of metrics is as large a share of a request as it can be;
//! over real sockets it is smaller still.
//!
//!   cargo bench --bench metrics [-- --rounds 41 --requests 50000 --tasks 8]

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use stategate::engine::{Engine, Limits};
use stategate::metrics::Metrics;
use stategate::mqtt::door::{Door, DoorLimits};
use stategate::mqtt::request::{Caller, Request};
use stategate::storage::Store;
use tower::ServiceExt;

struct Args {
    rounds: usize,
    requests: usize,
    tasks: usize,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 41,
        requests: 50_000,
        tasks: 8,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse().ok());
        match flag.as_str() {
            "--rounds" => a.rounds = value().unwrap_or(a.rounds),
            "--requests" => a.requests = value().unwrap_or(a.requests),
            "--tasks" => a.tasks = value().unwrap_or(a.tasks),
            _ => {} // cargo bench passes `--bench`
        }
    }
    a
}

fn resp(args: &[&[u8]]) -> Bytes {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    Bytes::from(out)
}

fn request(payload: Bytes, i: usize) -> Request {
    let ts = stategate::hlc::Hlc {
        ms: 1,
        counter: 0,
        node: Arc::from("bench"),
    }
    .to_string();
    Request {
        topic: stategate::mqtt::INVOKE_TOPIC.into(),
        qos: 0,
        payload,
        response_topic: Some("bench/response".into()),
        correlation: Some(Bytes::from(i.to_be_bytes().to_vec())),
        user_properties: vec![("__ts".into(), ts)],
        message_expiry: None,
    }
}

async fn engine() -> Engine {
    let clock = Arc::new(stategate::hlc::SystemClock);
    Engine::open(Store::memory(), "bench", clock, Limits::default())
        .await
        .expect("engine")
}

/// Requests per second through `Door::serve`: half SET, half GET, over 1000 keys.
async fn mqtt_round(door: Arc<Door>, a: &Args) -> f64 {
    let per_task = a.requests / a.tasks;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..a.tasks {
        let door = door.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_task {
                let key = format!("k{}", (t * per_task + i) % 1000);
                let payload = if i % 2 == 0 {
                    resp(&[b"SET", key.as_bytes(), b"value-of-some-bytes"])
                } else {
                    resp(&[b"GET", key.as_bytes()])
                };
                let out = door.serve(&request(payload, i), &Caller::default()).await;
                std::hint::black_box(out);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    (per_task * a.tasks) as f64 / started.elapsed().as_secs_f64()
}

/// Requests per second through the HTTP router (no socket): half save, half get.
async fn http_round(router: stategate::http::Gate, a: &Args) -> f64 {
    let per_task = a.requests / a.tasks / 4;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..a.tasks {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_task {
                let key = format!("k{}", (t * per_task + i) % 1000);
                let req = if i % 2 == 0 {
                    axum::http::Request::post("/v1.0/state/statestore")
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(format!(r#"[{{"key":"{key}","value":"v"}}]"#)))
                } else {
                    axum::http::Request::get(format!("/v1.0/state/statestore/{key}")).body(axum::body::Body::empty())
                }
                .expect("request");
                let resp = router.clone().oneshot(req).await.expect("response");
                std::hint::black_box(resp.status());
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    (per_task * a.tasks) as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Rounds come in adjacent pairs (off, on), so a pair sees the same machine; the cost is the
/// median over pairs of 1 - on/off. The best round of each side is shown too (the usual
/// estimate when other work shares the machine).
fn report(name: &str, off: Vec<f64>, on: Vec<f64>) {
    let ratios: Vec<f64> = off.iter().zip(&on).map(|(f, n)| 1.0 - n / f).collect();
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (best_off, best_on) = (best(&off), best(&on));
    println!(
        "{name:<5} median off {:>9.0} req/s  on {:>9.0} req/s | best off {best_off:>9.0}  on {best_on:>9.0} ({:+.2}%) | paired cost {:+.2}%",
        median(off),
        median(on),
        (best_off - best_on) / best_off * 100.0,
        median(ratios) * 100.0,
    );
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engine = engine().await;
        let door =
            |m: Metrics| Arc::new(Door::new(engine.clone(), "bench".into(), DoorLimits::default()).with_metrics(m));
        let (off, on) = (door(Metrics::disabled()), door(Metrics::new()));
        mqtt_round(off.clone(), &a).await; // warm-up
        let (mut r_off, mut r_on) = (Vec::new(), Vec::new());
        for round in 0..a.rounds {
            // Alternate which goes first, so neither gains from what the other warmed up.
            if round % 2 == 0 {
                r_off.push(mqtt_round(off.clone(), &a).await);
                r_on.push(mqtt_round(on.clone(), &a).await);
            } else {
                r_on.push(mqtt_round(on.clone(), &a).await);
                r_off.push(mqtt_round(off.clone(), &a).await);
            }
        }
        report("mqtt", r_off, r_on);
        let (off_door, on_door) = (off, on);

        let router = |m: Metrics| {
            let obs = stategate::health::Observe {
                metrics: m,
                ..Default::default()
            };
            let settings = stategate::http::HttpSettings::default();
            let info = stategate::http::ServiceInfo::new(
                "bench",
                stategate::http::dto::StorageStatus {
                    kind: "memory".into(),
                    data_dir: None,
                    fsync: None,
                    redis: None,
                },
                "embedded",
            );
            let inflight = stategate::listener::inflight::InFlight::new(settings.max_inflight, settings.max_streams);
            stategate::http::router_observed(engine.clone(), settings, Default::default(), info, inflight, obs)
        };
        let (off, on) = (router(Metrics::disabled()), router(Metrics::new()));
        http_round(off.clone(), &a).await;
        let (mut r_off, mut r_on) = (Vec::new(), Vec::new());
        for round in 0..a.rounds {
            if round % 2 == 0 {
                r_off.push(http_round(off.clone(), &a).await);
                r_on.push(http_round(on.clone(), &a).await);
            } else {
                r_on.push(http_round(on.clone(), &a).await);
                r_off.push(http_round(off.clone(), &a).await);
            }
        }
        report("http", r_off, r_on);

        // One task at a time, best of several alternating runs: the least disturbed by other
        // work on the machine. The difference is what metrics add to one request.
        let (mut best_off, mut best_on) = (f64::MAX, f64::MAX);
        let single = Args {
            rounds: 1,
            requests: 100_000,
            tasks: 1,
        };
        for _ in 0..9 {
            best_off = best_off.min(1e9 / mqtt_round(off_door.clone(), &single).await);
            best_on = best_on.min(1e9 / mqtt_round(on_door.clone(), &single).await);
        }
        println!(
            "mqtt one task: off {best_off:.0} ns/request, on {best_on:.0} ns/request => metrics add {:.0} ns ({:+.2}%)",
            best_on - best_off,
            (best_on - best_off) / best_off * 100.0
        );
    });
}
