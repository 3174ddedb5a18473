//! `--only replicas`: how many requests one Redis core carries through stategate, and what
//! that asks of stategate and the broker (scale-out sizing; docs/redis.md, "Sizing").
//!
//! First the physical limit: GET and SET of 16-byte keys with 100-byte values sent straight to
//! a redis-server, 64 in flight on one multiplexed connection, and what stategate's backend
//! sends Redis for the same requests: one HMGET of a record hash, and one EVALSHA of its swap
//! script with the change log entry and the request's mark (`replicas_direct.rs`). Then MQTT
//! GET and SET at 64 in flight through 1, 2 and 3 replicas on that redis-server, their
//! requests spread by one Mosquitto's shared subscription, each next to an echo responder on
//! the same Mosquitto (the limit of MQTT request/response there); one replica on the durable
//! backend comes first, for reference.
//!
//! Every row prints the CPU time per request of each party over its measured window
//! (`replicas_meter.rs`): `stategate` (every replica, or in an echo row the responder),
//! `redis`, `mosquitto`, `load` (the load generator); each party's median over `--rounds`, the
//! throughput and latency being the median-throughput run's. Then the Redis commands per request
//! (`INFO commandstats`, with the time spent inside them) and, for stategate, the Redis round
//! trips per operation that the requests waited for and those per second in the background
//! (change log reads, clock, membership). The run ends with the sizing table: for each row
//! the requests per second one Redis core carries (1e6 / Redis µs per request), and the
//! stategate and Mosquitto cores each Redis core needs beside it (their µs per request / Redis's).
//! On a machine whose cores every party shares, throughput is bounded by the sum of their CPU;
//! the CPU per request is what carries to a deployment where each has its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stategate::config::{BrokerChoice, Config};
use stategate::storage::{StorageConfig, StorageKind, Store};

use super::{ECHO_TOPIC, Opts, Requester, bench_key, closed_loop, echo_responder, now_ts, serving};

#[path = "replicas_direct.rs"]
mod direct;
#[path = "replicas_meter.rs"]
mod meter;
#[path = "replicas_procs.rs"]
mod procs;

use direct::{Call, Direct};
use meter::{Measured, Meter, PerRequest};

const INFLIGHT: usize = 64;

/// A row's figures for the sizing table.
struct Sized {
    row: String,
    verb: &'static str,
    /// Sent by stategate (else straight to Redis).
    stategate: bool,
    rate: f64,
    cpu: PerRequest,
}

impl Sized {
    fn new(row: String, verb: &'static str, stategate: bool, m: &Measured) -> Sized {
        Sized {
            row,
            verb,
            stategate,
            rate: m.row.rate(),
            cpu: m.cpu,
        }
    }
}

/// What the stategate rows run against.
struct Links<'a> {
    mqtt_port: u16,
    redis_port: u16,
    meter: &'a Meter,
}

pub(super) async fn run(o: &Opts) {
    println!(
        "\n== Replicas: MQTT through Mosquitto's shared subscription, {INFLIGHT} in flight, {} s per row",
        o.secs
    );
    let (Some((mosquitto, mqtt_port)), Some((redis, redis_port))) = (procs::mosquitto(), procs::redis_server()) else {
        println!("mosquitto or redis-server is not installed: skipped");
        return;
    };
    let verbs: Vec<&'static str> = ["GET", "SET"]
        .into_iter()
        .filter(|v| o.verbs.iter().any(|w| w == v))
        .collect();
    let direct = Direct::connect(redis_port).await;
    let meter = Meter::new(redis.pid(), mosquitto.pid(), direct.clone());
    let mut sized = Vec::new();
    match &direct {
        Some(d) => direct_rows(o, &meter, d, &verbs, &mut sized).await,
        None => println!("could not reach redis-server directly: no straight rows"),
    }
    let at = Links {
        mqtt_port,
        redis_port,
        meter: &meter,
    };
    stategate_rows(o, &at, &verbs, &mut sized).await;
    if let Some(d) = &direct {
        d.print_failures();
    }
    print_sizing(&sized);
}

/// The physical limit: the same operations straight to the same redis-server, alternating
/// round by round.
async fn direct_rows(o: &Opts, meter: &Meter, direct: &Direct, verbs: &[&'static str], sized: &mut Vec<Sized>) {
    println!("\n-- straight to redis-server: one multiplexed connection, {INFLIGHT} in flight");
    let value: Arc<[u8]> = Arc::from(vec![b'v'; 100]);
    for &verb in verbs {
        let calls = match verb {
            "GET" => [Call::Get, Call::Hmget],
            _ => [Call::Set, Call::Swap],
        };
        let mut runs: Vec<Vec<Measured>> = calls.iter().map(|_| Vec::new()).collect();
        for _ in 0..o.rounds {
            for (&call, out) in calls.iter().zip(runs.iter_mut()) {
                let sent = Arc::new(AtomicU64::new(0));
                let (d, s, value) = (direct.clone(), sent.clone(), value.clone());
                let row = closed_loop(format!("{} x{INFLIGHT}", call.label()), INFLIGHT, o, move |i| {
                    let (d, value) = (d.clone(), value.clone());
                    s.fetch_add(1, Ordering::Relaxed);
                    async move { d.call(call, i, &value).await }
                });
                out.push(meter.run(o, &sent, row).await);
            }
        }
        for (&call, out) in calls.iter().zip(runs) {
            let m = Measured::median(out);
            m.print("client", None);
            sized.push(Sized::new(format!("{} x{INFLIGHT}", call.label()), verb, false, &m));
        }
    }
}

/// Starts `n` replicas on the `serve` runtime, serving through `mqtt_port`'s share group on
/// `storage`.
async fn replicas(n: usize, setup: usize, mqtt_port: u16, storage: &StorageConfig) -> Vec<stategate::Running> {
    let storage = storage.clone();
    serving(async move {
        let mut out = Vec::new();
        for i in 0..n {
            let mut config = Config {
                http_listen: None,
                grpc_listen: None,
                broker: BrokerChoice::External {
                    host: "127.0.0.1".into(),
                    port: mqtt_port,
                },
                storage: storage.clone(),
                ..Config::default()
            };
            config.node_id = format!("bench-node-{i}");
            config.mqtt.client_id = format!("bench-replica-{setup}-{i}");
            config.mqtt.share_group = Some(format!("bench{setup}"));
            // A clean session, as the binary asks for a share-group member: Mosquitto keeps
            // routing a share of the group's requests to a stopped member's persistent
            // session, which would queue copies of every later row's requests.
            config.mqtt.session_expiry = Duration::ZERO;
            let store = Store::open(&config.storage).await.expect("storage opens");
            out.push(stategate::start(config, store).await.expect("stategate starts"));
        }
        out
    })
    .await
}

/// Writes the 10,000 keys the rows use, 64 at a time.
async fn fill(setup: &Requester, seq: &Arc<AtomicU64>) {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..INFLIGHT as u64 {
        let (r, seq) = (setup.clone(), seq.clone());
        tasks.spawn(async move {
            for i in (w..10_000).step_by(INFLIGHT) {
                let payload = stategate::resp3::encode_request([&b"SET"[..], &bench_key(i), &[b'v'; 100][..]]);
                let id = seq.fetch_add(1, Ordering::Relaxed);
                let ts = vec![("__ts".into(), now_ts())];
                r.request(stategate::mqtt::INVOKE_TOPIC, id, payload, ts).await;
            }
        });
    }
    tasks.join_all().await;
}

/// `(calls, background)` round trips of every replica so far.
fn round_trips(replicas: &[stategate::Running]) -> (u64, u64) {
    replicas
        .iter()
        .filter_map(|r| r.engine().storage_round_trips())
        .fold((0, 0), |(c, b), r| (c + r.calls, b + r.background))
}

/// Echo, then stategate on the durable backend and on redis with 1, 2 and 3 replicas.
async fn stategate_rows(o: &Opts, at: &Links<'_>, verbs: &[&'static str], sized: &mut Vec<Sized>) {
    echo_responder("127.0.0.1", at.mqtt_port, 100).await;
    let load = Requester::connect("bench-replicas-load", "127.0.0.1", at.mqtt_port).await;
    let setup = Requester::connect("bench-replicas-setup", "127.0.0.1", at.mqtt_port).await;
    let data = tempfile::tempdir().expect("tempdir");
    let mut setups: Vec<(String, StorageConfig, usize)> = Vec::new();
    let mut durable = Config::default().storage;
    durable.kind = StorageKind::Durable;
    durable.data_dir = data.path().to_owned();
    setups.push(("durable   x1".into(), durable, 1));
    for n in 1..=3 {
        let mut redis = Config::default().storage;
        redis.kind = format!("redis://127.0.0.1:{}", at.redis_port)
            .parse()
            .expect("a redis url");
        redis.redis.prefix = format!("bench{n}:");
        setups.push((format!("redis     x{n}"), redis, n));
    }
    let seq = Arc::new(AtomicU64::new(1 << 40));
    for (index, (label, storage, n)) in setups.into_iter().enumerate() {
        let on_redis = storage.kind != StorageKind::Durable;
        println!("\n-- {}: {n} replica(s)", label.split_whitespace().next().unwrap_or(""));
        let running = replicas(n, index, at.mqtt_port, &storage).await;
        fill(&setup, &seq).await;
        println!("(threads of this process: {})", procs::threads());
        for &verb in verbs {
            let mut runs: [Vec<Measured>; 2] = Default::default();
            let mut trips = Vec::new();
            for _ in 0..o.rounds {
                for (topic, out) in [ECHO_TOPIC, stategate::mqtt::INVOKE_TOPIC]
                    .into_iter()
                    .zip(runs.iter_mut())
                {
                    let sent = Arc::new(AtomicU64::new(0));
                    let before = round_trips(&running);
                    let started = Instant::now();
                    let (r, s2, sent2) = (load.clone(), seq.clone(), sent.clone());
                    let name = if topic == ECHO_TOPIC { "echo      " } else { &label };
                    let row = closed_loop(format!("{name} {verb} x{INFLIGHT}"), INFLIGHT, o, move |i| {
                        let key = bench_key(i);
                        let (payload, user) = if verb == "GET" {
                            (stategate::resp3::encode_request([&b"GET"[..], &key]), vec![])
                        } else {
                            let p = stategate::resp3::encode_request([&b"SET"[..], &key, &[b'v'; 100][..]]);
                            (p, vec![("__ts".into(), now_ts())])
                        };
                        let (r, id) = (r.clone(), s2.fetch_add(1, Ordering::Relaxed));
                        sent2.fetch_add(1, Ordering::Relaxed);
                        async move { r.request(topic, id, payload, user).await }
                    });
                    out.push(at.meter.run(o, &sent, row).await);
                    if topic != ECHO_TOPIC {
                        let after = round_trips(&running);
                        let ops = sent.load(Ordering::Relaxed).max(1) as f64;
                        let secs = started.elapsed().as_secs_f64();
                        trips.push(((after.0 - before.0) as f64 / ops, (after.1 - before.1) as f64 / secs));
                    }
                }
            }
            let [echo, sg] = runs.map(Measured::median);
            echo.print("responder", None);
            sg.print("stategate", Some(&echo.row));
            if !on_redis {
                continue;
            }
            trips.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (per_op, background) = trips[trips.len() / 2];
            println!(
                "{:<34} redis round trips: {per_op:.2} per {verb} (requests waited for them), {background:.0}/s in the background",
                ""
            );
            sized.push(Sized::new(format!("stategate x{n}"), verb, true, &sg));
        }
        serving(async move {
            for r in running {
                r.shutdown().await;
            }
        })
        .await;
    }
}

/// Per verb: each row's Redis CPU per request against the plain command's, the requests one
/// Redis core carries at that cost, and the stategate and Mosquitto cores each Redis core needs
/// beside it.
fn print_sizing(sized: &[Sized]) {
    println!(
        "\n== Sizing: requests per Redis core = 1e6 / redis µs per request; cores per Redis core = \
         that party's µs per request / redis's (CPU medians over the rounds)"
    );
    println!(
        "{:<4} {:<26} {:>8} {:>9} {:>8} {:>10} {:>8} {:>8} {:>8} {:>8}",
        "verb", "row", "req/s", "redis µs", "x plain", "req/s/core", "sg µs", "sg cores", "mq µs", "mq cores"
    );
    for verb in ["GET", "SET"] {
        let rows: Vec<&Sized> = sized.iter().filter(|s| s.verb == verb).collect();
        // The plain command at 64 in flight: the first straight row of the verb.
        let Some(plain) = rows.first().map(|p| p.cpu[1].max(1e-9)) else {
            continue;
        };
        for s in rows {
            let redis = s.cpu[1].max(1e-9);
            let beside = |us: f64| match s.stategate {
                true => (format!("{us:.1}"), format!("{:.2}", us / redis)),
                false => ("-".into(), "-".into()),
            };
            let ((sg, sg_cores), (mq, mq_cores)) = (beside(s.cpu[0]), beside(s.cpu[2]));
            println!(
                "{verb:<4} {:<26} {:>8.0} {:>9.1} {:>8.2} {:>10.0} {sg:>8} {sg_cores:>8} {mq:>8} {mq_cores:>8}",
                s.row,
                s.rate,
                s.cpu[1],
                s.cpu[1] / plain,
                1e6 / redis,
            );
        }
    }
}
