//! Resource tests against the real binary, tried as hostile or broken clients would: each keeps
//! the service's resident memory under a bound derived from the configured budgets, checks
//! that other clients are served meanwhile, and that the service recovers after.
//!
//! Memory is the process's VmRSS. Bounds are budgets plus a fixed allowance for the process
//! itself, not measurements: they are loose enough for any allocator behaviour we accept and
//! far below what the unbounded designs reached (1.77 GiB for the stalled-reader case).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{RawClient, WAIT, now_ts, prop, unique_id};

const MIB: u64 = 1024 * 1024;

/// The service as a child process, with the addresses it logged.
struct Proc {
    child: tokio::process::Child,
    http: SocketAddr,
    mqtt: u16,
}

impl Proc {
    async fn start(args: &[&str]) -> Proc {
        // The tests ask it over reqwest (status, metrics), which needs the process's crypto
        // provider: installed here, so that no test depends on another having done it first.
        stategate::tls::install_provider();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
            .args([
                "--storage",
                "memory",
                "--mqtt-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
                "--grpc-listen",
                "off",
            ])
            .args(args)
            .env("RUST_LOG", "stategate=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn stategate");
        // The log is on stderr.
        let out = child.stderr.take().expect("stderr");
        let mut lines = tokio::io::BufReader::new(out).lines();
        let (mut http, mut mqtt) = (None, None);
        let ready = async {
            while let Ok(Some(line)) = lines.next_line().await {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(name))
                        .map(str::to_owned)
                };
                if line.contains("HTTP door") {
                    http = field("bound=").and_then(|a| a.parse().ok());
                }
                if line.contains("embedded MQTT broker listening") {
                    mqtt = field("addr=")
                        .and_then(|a| a.parse::<SocketAddr>().ok())
                        .map(|a| a.port());
                }
                if line.contains("stategate is serving") {
                    return;
                }
            }
        };
        tokio::time::timeout(3 * WAIT, ready).await.expect("stategate started");
        // Keep draining the log so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Proc {
            child,
            http: http.expect("the HTTP door's address"),
            mqtt: mqtt.expect("the broker's port"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// Resident memory, bytes.
    fn rss(&self) -> u64 {
        let rss = crate::support::rss(self.child.id().expect("running"));
        assert!(rss > 0, "no VmRSS for the service");
        rss
    }

    async fn status(&self) -> Value {
        reqwest::get(self.url("/v1.0-alpha1/stategate/status"))
            .await
            .expect("status")
            .json()
            .await
            .expect("status JSON")
    }
}

/// MQTT GETs the service has answered so far, from its `/metrics`.
async fn mqtt_gets_answered(p: &Proc) -> u64 {
    let text = reqwest::get(p.url("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text");
    let answered: f64 = parsed
        .samples
        .iter()
        .filter(|s| {
            s.metric == "stategate_requests_total"
                && s.labels.get("door") == Some("mqtt")
                && s.labels.get("command") == Some("get")
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum();
    answered as u64
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB as f64)
}

/// A server-sent event stream whose reader never reads: the request is sent, nothing more.
async fn stalled_sse(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /v1.0-alpha1/state/statestore/subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("request");
    s
}

/// Four SSE readers stall while 1 MiB values are written (at most 64 live keys): the history
/// keeps its byte budget whatever they do, other clients are served, and memory comes back
/// once the readers are gone and the keys deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_sse_readers_hold_nothing_beyond_the_history_budget() {
    const HISTORY: u64 = 16 * MIB;
    let p = Proc::start(&["--watch-history-bytes", &HISTORY.to_string()]).await;
    let http = reqwest::Client::new();
    let baseline = p.rss();
    let mut readers = Vec::new();
    for _ in 0..4 {
        readers.push(stalled_sse(p.http).await);
    }
    let big = "x".repeat(MIB as usize);
    let mut peak = 0;
    for i in 0..256 {
        let r = http
            .post(p.url("/v1.0/state/statestore"))
            .json(&json!([{"key": format!("big-{}", i % 64), "value": big}]))
            .send()
            .await
            .expect("save");
        assert_eq!(r.status(), 204);
        peak = peak.max(p.rss());
        if i % 64 == 0 {
            // Another client is served meanwhile.
            let r = http
                .get(p.url("/v1.0/state/statestore/big-0"))
                .send()
                .await
                .expect("get");
            assert_eq!(r.status(), 200);
        }
    }
    let held = p.status().await["watchHistory"]["bytes"].as_u64().unwrap();
    assert!(held <= HISTORY + 2 * MIB, "history holds {}", mib(held));
    // Budgets: the history, 64 live values, what four stalled connections buffer (one event
    // each plus socket buffers), one request body in flight, and the process's own working set.
    let bound = baseline + HISTORY + 64 * MIB + 4 * 8 * MIB + 8 * MIB + 96 * MIB;
    eprintln!(
        "stalled SSE: baseline {}, peak {}, bound {}",
        mib(baseline),
        mib(peak),
        mib(bound)
    );
    assert!(peak < bound, "peak {} over {}", mib(peak), mib(bound));

    drop(readers);
    for i in 0..64 {
        let r = http
            .delete(p.url(&format!("/v1.0/state/statestore/big-{i}")))
            .send()
            .await
            .expect("delete");
        assert_eq!(r.status(), 204);
    }
    // Small writes push the big values out of the history.
    for i in 0..100 {
        let r = http
            .post(p.url("/v1.0/state/statestore"))
            .json(&json!([{"key": format!("small-{i}"), "value": i}]))
            .send()
            .await
            .expect("save");
        assert_eq!(r.status(), 204);
    }
    // Back near the baseline: the history's budget (the last big values are still in it, as
    // designed) and some slack; freed values went back to the OS (see `main.rs` on malloc).
    let after = p.rss();
    eprintln!("stalled SSE: after {}", mib(after));
    assert!(
        after < baseline + HISTORY + 32 * MIB,
        "after {} (baseline {})",
        mib(after),
        mib(baseline)
    );
}

/// MQTT5 packets written by hand (shared with the connections benchmark).
pub(crate) use crate::mqtt_raw as raw;

/// The well-behaved client beside a greedy one: its GETs of the big value, each checked, and
/// the service's memory sampled after each.
struct Polite {
    client: RawClient,
    value_len: usize,
    /// GETs answered so far.
    gets: u64,
    peak: u64,
}

impl Polite {
    /// `n` GETs, each answered in full; every sample is under `bound` (an unbounded backlog
    /// fails here, as it grows, rather than at the end).
    async fn gets(&mut self, p: &Proc, n: usize, bound: u64) {
        for _ in 0..n {
            let r = self.client.request(&[b"GET", b"big"], &[]).await;
            self.gets += 1;
            assert_eq!(prop(&r, "__stat"), Some("200"), "polite request {}", self.gets);
            assert_eq!(r.payload.len(), self.value_len + 11);
            let rss = p.rss();
            assert!(rss < bound, "{} over {} while the backlog builds", mib(rss), mib(bound));
            self.peak = self.peak.max(rss);
        }
    }
}

/// A client that publishes GETs of a 256 KiB value and never reads its answers: its own
/// connection is throttled (the broker stops reading it once its answers fill the socket),
/// everyone else is served, memory stays bounded, and it all ends when the client goes.
///
/// The bound is checked once the greedy client's backlog is built, not only while it builds:
/// the test waits until a whole round of polite GETs is answered while the service answers
/// none of the greedy client's, though that client has sent more than was answered (and sends
/// no more). An unthrottled connection would be read meanwhile; from then on the service holds
/// all it will ever hold for this client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_client_that_never_reads_slows_only_itself() {
    never_reading_client(None).await
}

/// The same client announcing MQTT5 Receive Maximum 1: the broker sends it one answer at a
/// time, and the socket never fills (the client's PUBACKs are tiny), so its connection is read
/// on and on; its answers would pile up in its session (a gigabyte in seconds before the queued
/// answers were bounded). Its requests past `--mqtt-max-queued-answers` are refused instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_client_with_a_receive_window_of_one_that_never_reads_is_bounded() {
    never_reading_client(Some(1)).await
}

async fn never_reading_client(receive_maximum: Option<u16>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Polite GETs between two looks at the greedy client's progress.
    const ROUND: usize = 10;
    let p = Proc::start(&["--mqtt-max-inflight-per-client", "64"]).await;
    let mut polite = Polite {
        client: RawClient::connect(p.mqtt, &unique_id("polite")).await,
        value_len: 256 * 1024,
        gets: 0,
        peak: 0,
    };
    let value = vec![b'v'; polite.value_len];
    let set = polite
        .client
        .request(&[b"SET", b"big", &value], &[("__ts", &now_ts())])
        .await;
    assert_eq!(prop(&set, "__stat"), Some("200"));
    let baseline = p.rss();
    // The greedy client's backlog: per connection at most its in-flight limit of answers, plus
    // what its session queues (bounded by the broker), plus socket buffers.
    let bound = baseline + 64 * 256 * 1024 + 2 * 1024 * 256 * 1024 / 8 + 64 * MIB;

    let mut greedy = TcpStream::connect(("127.0.0.1", p.mqtt)).await.expect("connect");
    greedy
        .write_all(&raw::connect_with("greedy", receive_maximum))
        .await
        .unwrap();
    let mut connack = [0u8; 4];
    greedy.read_exact(&mut connack).await.unwrap();
    greedy.write_all(&raw::subscribe(1, "greedy/resp")).await.unwrap();
    // From here on it never reads: the broker's writes to it block once the socket buffers
    // between them are full.
    let get = stategate::resp3::encode_request([&b"GET"[..], b"big"]);
    let invoke = stategate::mqtt::INVOKE_TOPIC;
    let sent = Arc::new(AtomicU64::new(0));
    let flood = tokio::spawn({
        let sent = sent.clone();
        async move {
            for i in 0..20_000u32 {
                let pkt = raw::request(invoke, (i % 60_000 + 1) as u16, "greedy/resp", &i.to_be_bytes(), &get);
                // Blocks once the broker stops reading this connection: that is the point.
                if greedy.write_all(&pkt).await.is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
            greedy
        }
    });

    // (greedy GETs answered, greedy GETs sent), after each round.
    let mut seen = (0, 0);
    let built = async {
        loop {
            polite.gets(&p, ROUND, bound).await;
            let answered = mqtt_gets_answered(&p)
                .await
                .checked_sub(polite.gets)
                .expect("/metrics counts the polite GETs");
            let now = (answered, sent.load(Ordering::SeqCst));
            // Throttled: it sent more than was answered and nothing moves. With a receive
            // window of one the broker reads on (refusals answer the rest): nothing moves.
            if now == seen && now.1 > 0 && (now.0 < now.1 || receive_maximum.is_some()) {
                return;
            }
            seen = now;
        }
    };
    if tokio::time::timeout(3 * WAIT, built).await.is_err() {
        panic!(
            "the greedy client was never throttled: last seen {} of its GETs answered, {} sent",
            seen.0, seen.1
        );
    }
    // And sampled with the backlog built.
    polite.gets(&p, ROUND, bound).await;
    eprintln!(
        "never-reading client: {} of {} GETs answered; baseline {}, peak {}, bound {}",
        seen.0,
        seen.1,
        mib(baseline),
        mib(polite.peak),
        mib(bound)
    );
    assert!(polite.peak < bound, "peak {} over {}", mib(polite.peak), mib(bound));
    flood.abort();
    let after_ok = polite
        .client
        .request(&[b"SET", b"after", b"1"], &[("__ts", &now_ts())])
        .await;
    assert_eq!(prop(&after_ok, "__stat"), Some("200"));
}

/// Many clients register KEYNOTIFY until the registry is full: the rest are refused with the
/// quota error, memory stays bounded, and disconnecting frees every registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keynotify_flood_from_many_clients_is_bounded() {
    const TOTAL: u64 = 2000;
    let p = Proc::start(&[
        "--max-observers-total",
        &TOTAL.to_string(),
        "--max-observed-keys",
        "100",
    ])
    .await;
    let baseline = p.rss();
    let mut clients = Vec::new();
    let (mut accepted, mut refused) = (0u64, 0u64);
    for c in 0..30 {
        let mut client = RawClient::connect(p.mqtt, &format!("flood-{c}")).await;
        for k in 0..100 {
            let key = format!("key-{k}-with-a-longish-name-{}", "x".repeat(200));
            let r = client.request(&[b"KEYNOTIFY", key.as_bytes()], &[]).await;
            match &r.payload[..] {
                b"+OK\r\n" => accepted += 1,
                b"-ERR the quota has been exceeded\r\n" => refused += 1,
                other => panic!("unexpected answer {:?}", Bytes::copy_from_slice(other)),
            }
        }
        clients.push(client);
    }
    assert_eq!(accepted, TOTAL);
    assert_eq!(refused, 30 * 100 - TOTAL);
    assert_eq!(p.status().await["keynotifyRegistrations"], TOTAL);
    let peak = p.rss();
    eprintln!("KEYNOTIFY flood: baseline {}, peak {}", mib(baseline), mib(peak));
    assert!(
        peak < baseline + 64 * MIB,
        "peak {} (baseline {})",
        mib(peak),
        mib(baseline)
    );
    // Somebody else is served, and observes.
    let mut other = RawClient::connect(p.mqtt, &unique_id("other")).await;
    let r = other.request(&[b"SET", b"x", b"1"], &[("__ts", &now_ts())]).await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    drop(clients);
    // The broker reports each disconnect; the registry has no change event to await outside
    // the process, so poll its count, bounded.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if p.status().await["keynotifyRegistrations"] == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "registrations were not dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A burst of requests from many clients (writes, each kept for redeliveries) leaves memory
/// bounded by the redelivery cache's budget and the live data once it is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_burst_memory_comes_back() {
    const CACHE: u64 = 8 * MIB;
    let p = Proc::start(&["--mqtt-response-cache-bytes", &CACHE.to_string()]).await;
    let baseline = p.rss();
    let mut tasks = Vec::new();
    for c in 0..8 {
        let port = p.mqtt;
        tasks.push(tokio::spawn(async move {
            let mut client = RawClient::connect(port, &format!("burst-{c}")).await;
            let value = vec![b'v'; 1024];
            for i in 0..2500 {
                let key = format!("burst-{}", i % 500);
                let r = client
                    .request(&[b"SET", key.as_bytes(), &value], &[("__ts", &now_ts())])
                    .await;
                assert_eq!(prop(&r, "__stat"), Some("200"));
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let after = p.rss();
    let history = p.status().await["watchHistory"]["bytes"].as_u64().unwrap();
    eprintln!(
        "burst of 20,000 writes: baseline {}, after {}, history {}",
        mib(baseline),
        mib(after),
        mib(history)
    );
    // What the history keeps (its budget allows 64 MiB; 1 KiB values), the cache's budget,
    // 500 live keys, and slack for the allocator and the broker's per-session state.
    let bound = baseline + history + CACHE + MIB + 48 * MIB;
    assert!(after < bound, "after {} over {}", mib(after), mib(bound));
}

/// A sorted query over a large store holds one page, not the store, and does not keep others
/// waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_a_large_store_costs_a_page() {
    let p = Proc::start(&[]).await;
    let http = reqwest::Client::new();
    for batch in 0..50 {
        let items: Vec<Value> = (0..1000)
            .map(|i| {
                let n = batch * 1000 + i;
                json!({"key": format!("doc-{n:06}"), "value": {"n": (n * 7919) % 100_000, "pad": "p".repeat(64)}})
            })
            .collect();
        let r = http
            .post(p.url("/v1.0/state/statestore"))
            .json(&items)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }
    let baseline = p.rss();
    let query = json!({"sort": [{"key": "n", "order": "DESC"}], "page": {"limit": 10}});
    let queries: Vec<_> = (0..3)
        .map(|_| {
            let (http, url, query) = (
                http.clone(),
                p.url("/v1.0-alpha1/state/statestore/query"),
                query.clone(),
            );
            tokio::spawn(async move {
                http.post(url)
                    .json(&query)
                    .send()
                    .await
                    .unwrap()
                    .json::<Value>()
                    .await
                    .unwrap()
            })
        })
        .collect();
    // Others are served while the queries scan.
    for i in 0..20 {
        let r = http
            .get(p.url(&format!("/v1.0/state/statestore/doc-{:06}", i * 2000)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let top = (0..50_000u64).map(|n| (n * 7919) % 100_000).max().unwrap();
    let mut peak = p.rss();
    for q in queries {
        let page = q.await.unwrap();
        assert_eq!(page["results"].as_array().unwrap().len(), 10);
        assert_eq!(page["results"][0]["data"]["n"], top);
        peak = peak.max(p.rss());
    }
    eprintln!(
        "sorted query over 50,000 keys: baseline {}, peak {}",
        mib(baseline),
        mib(peak)
    );
    assert!(
        peak < baseline + 32 * MIB,
        "peak {} (baseline {})",
        mib(peak),
        mib(baseline)
    );
}
