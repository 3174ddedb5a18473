//! `--only replicas`: MQTT GET and SET at 64 in flight through 1, 2 and 3 replicas on one
//! redis-server, their requests spread by one Mosquitto's shared subscription, next to one
//! replica on the durable backend and an echo responder on the same Mosquitto; with the Redis
//! round trips per operation (the backend counts them per purpose: those a request waited for,
//! and the background ones, such as change log reads and heartbeats, per second).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stategate::config::{BrokerChoice, Config};
use stategate::storage::{StorageKind, Store};

use super::{ECHO_TOPIC, Opts, Requester, Row, bench_key, closed_loop, echo_responder, median, now_ts};

const INFLIGHT: usize = 64;

/// A child process killed on drop, and the directory it uses (removed after).
struct Child(std::process::Child, #[allow(dead_code)] Option<tempfile::TempDir>);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits until `port` accepts connections (a child process starting: nothing to await).
fn accepts(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn mosquitto() -> Option<(Child, u16)> {
    let bin = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let dir = tempfile::tempdir().ok()?;
    let port = free_port();
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\nmax_inflight_messages 0\nmax_queued_messages 100000\n"
        ),
    )
    .ok()?;
    let child = std::process::Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let child = Child(child, Some(dir));
    accepts(port).then_some((child, port))
}

fn redis_server() -> Option<(Child, u16)> {
    let port = free_port();
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let child = Child(child, None);
    accepts(port).then_some((child, port))
}

/// Starts `n` replicas serving through `mqtt_port`'s share group on `storage`, and fills the
/// GET keys through them.
async fn replicas(n: usize, mqtt_port: u16, storage: &stategate::storage::StorageConfig) -> Vec<stategate::Running> {
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
        config.mqtt.client_id = format!("bench-replica-{n}-{i}");
        config.mqtt.share_group = Some(format!("bench{n}"));
        let store = Store::open(&config.storage).await.expect("storage opens");
        out.push(stategate::start(config, store).await.expect("stategate starts"));
    }
    out
}

/// `(calls, background)` round trips of every replica so far.
fn round_trips(replicas: &[stategate::Running]) -> (u64, u64) {
    replicas
        .iter()
        .filter_map(|r| r.engine().storage_round_trips())
        .fold((0, 0), |(c, b), r| (c + r.calls, b + r.background))
}

pub(super) async fn run(o: &Opts) {
    println!(
        "\n== Replicas: MQTT through Mosquitto's shared subscription, {INFLIGHT} in flight, {} s per row",
        o.secs
    );
    let (Some((_mosquitto, mqtt_port)), Some((_redis, redis_port))) = (mosquitto(), redis_server()) else {
        println!("mosquitto or redis-server is not installed: skipped");
        return;
    };
    let value = vec![b'v'; 100];
    echo_responder("127.0.0.1", mqtt_port, 100).await;
    let load = Requester::connect("bench-replicas-load", "127.0.0.1", mqtt_port).await;
    let setup = Requester::connect("bench-replicas-setup", "127.0.0.1", mqtt_port).await;
    let data = tempfile::tempdir().expect("tempdir");
    let mut setups: Vec<(String, stategate::storage::StorageConfig, usize)> = Vec::new();
    let mut durable = Config::default().storage;
    durable.kind = StorageKind::Durable;
    durable.data_dir = data.path().to_owned();
    setups.push(("durable   x1".into(), durable, 1));
    for n in 1..=3 {
        let mut redis = Config::default().storage;
        redis.kind = format!("redis://127.0.0.1:{redis_port}").parse().expect("a redis url");
        redis.redis.prefix = format!("bench{n}:");
        setups.push((format!("redis     x{n}"), redis, n));
    }
    let seq = Arc::new(AtomicU64::new(1 << 40));
    for (label, storage, n) in setups {
        let running = replicas(n, mqtt_port, &storage).await;
        for i in 0..10_000u64 {
            let payload = stategate::resp3::encode_request([&b"SET"[..], &bench_key(i), &value]);
            let id = seq.fetch_add(1, Ordering::Relaxed);
            setup
                .request(
                    stategate::mqtt::INVOKE_TOPIC,
                    id,
                    payload,
                    vec![("__ts".into(), now_ts())],
                )
                .await;
        }
        for verb in ["GET", "SET"].into_iter().filter(|v| o.verbs.iter().any(|w| w == v)) {
            let (mut echoes, mut sgs, mut trips) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..o.rounds {
                for topic in [ECHO_TOPIC, stategate::mqtt::INVOKE_TOPIC] {
                    let sent = Arc::new(AtomicU64::new(0));
                    let before = round_trips(&running);
                    let started = Instant::now();
                    let (r, s2, sent2, value) = (load.clone(), seq.clone(), sent.clone(), value.clone());
                    let name = if topic == ECHO_TOPIC { "echo      " } else { &label };
                    let row = closed_loop(format!("{name} {verb} x{INFLIGHT}"), INFLIGHT, o, move |i| {
                        let key = bench_key(i);
                        let (payload, user) = if verb == "GET" {
                            (stategate::resp3::encode_request([&b"GET"[..], &key]), vec![])
                        } else {
                            let p = stategate::resp3::encode_request([&b"SET"[..], &key, &value]);
                            (p, vec![("__ts".into(), now_ts())])
                        };
                        let (r, id) = (r.clone(), s2.fetch_add(1, Ordering::Relaxed));
                        sent2.fetch_add(1, Ordering::Relaxed);
                        async move { r.request(topic, id, payload, user).await }
                    })
                    .await;
                    let after = round_trips(&running);
                    if topic == ECHO_TOPIC {
                        echoes.push(row);
                    } else {
                        let ops = sent.load(Ordering::Relaxed).max(1) as f64;
                        let secs = started.elapsed().as_secs_f64();
                        trips.push(((after.0 - before.0) as f64 / ops, (after.1 - before.1) as f64 / secs));
                        sgs.push(row);
                    }
                }
            }
            let (echo, sg): (Row, Row) = (median(echoes), median(sgs));
            echo.print(None);
            sg.print(Some(&echo));
            if storage.kind != StorageKind::Durable {
                trips.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (per_op, background) = trips[trips.len() / 2];
                println!(
                    "{:<34} redis round trips: {per_op:.2} per {verb} (requests waited for them), {background:.0}/s in the background",
                    ""
                );
            }
        }
        for r in running {
            r.shutdown().await;
        }
    }
}
