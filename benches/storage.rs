//! Storage benchmark (not a test): SET throughput through the engine with 64 writers in flight
//! for each storage mode, the same through the MQTT door (service in process, embedded broker,
//! median of 3 alternating rounds), and restart time of a durable store holding 1 million keys.
//!
//! ```text
//! cargo bench --bench storage
//! STATEGATE_BENCH_SECS=5 STATEGATE_BENCH_KEYS=1000000 STATEGATE_BENCH_DIR=/path cargo bench --bench storage
//! ```
//! Keys are 16 bytes, values 100 bytes. The data directory defaults to the system temp dir
//! (it must be on the disk being measured, not tmpfs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stategate::engine::{Command, Engine, Limits, Set, SetCondition};
use stategate::hlc::SystemClock;
use stategate::storage::Store;
use stategate::storage::durable::{DurableBackend, DurableOptions, FsyncMode};

#[path = "common/fill.rs"]
mod fill;

const KEY_SPACE_PER_WRITER: u64 = 10_000;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn key(writer: u64, i: u64) -> Bytes {
    Bytes::from(format!("{:016}", writer * 1_000_000_000 + i))
}

struct Run {
    ops_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

/// `writers` tasks each doing SETs back to back for `secs`.
async fn set_load(store: Store, writers: u64, secs: u64) -> Run {
    let engine = Engine::open(store, "bench", Arc::new(SystemClock), Limits::default())
        .await
        .expect("engine");
    let value = Bytes::from(vec![b'v'; 100]);
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let engine = engine.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while Instant::now() < end {
                let t = Instant::now();
                let cmd = Command::Set(Set {
                    key: key(w, i % KEY_SPACE_PER_WRITER),
                    value: value.clone(),
                    condition: SetCondition::Always,
                    ttl_ms: None,
                    timestamp: None,
                    fencing: None,
                    persist: false,
                    sliding: false,
                });
                engine.execute(cmd).await.expect("SET");
                latencies.push(t.elapsed());
                i += 1;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("writer"));
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
    };
    Run {
        ops_per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50).unwrap_or_default(),
        p99: pct(0.99).unwrap_or_default(),
    }
}

/// The same load through the MQTT door: the service in process on the embedded broker, one
/// raw MQTT5 client keeping `in_flight` QoS 1 SET requests outstanding.
async fn mqtt_load(store: Store, in_flight: usize, secs: u64) -> Run {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let mut config = stategate::config::Config::default();
    config.http_listen = None;
    config.grpc_listen = None;
    config.broker = stategate::config::BrokerChoice::Embedded {
        listen: "127.0.0.1:0".parse().expect("addr"),
        client_path: false,
    };
    let running = stategate::start(config, store).await.expect("stategate starts");
    let (host, port) = {
        let (h, p) = running.mqtt_broker();
        (h.to_owned(), p)
    };
    let mut o = MqttOptions::new("storage-bench", host, port);
    o.set_max_packet_size(Some(1024 * 1024));
    o.set_keep_alive(Duration::from_secs(30));
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    o.set_network_options(net);
    let (client, mut eventloop) = AsyncClient::new(o, 4096);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let poller = tokio::spawn(async move {
        while let Ok(event) = eventloop.poll().await {
            match event {
                Event::Incoming(Packet::Publish(p)) => {
                    let _ = tx.send(Some(p));
                }
                Event::Incoming(Packet::SubAck(_)) => {
                    let _ = tx.send(None);
                }
                _ => {}
            }
        }
    });
    let topic = "clients/storage-bench/response".to_owned();
    client.subscribe(&topic, QoS::AtLeastOnce).await.expect("subscribe");
    while let Some(Some(_)) = rx.recv().await {}
    let value = vec![b'v'; 100];
    let send = |n: u64| {
        let client = client.clone();
        let topic = topic.clone();
        let payload = stategate::resp3::encode_request([&b"SET"[..], &key(0, n % 640_000), &value]);
        async move {
            let ts = format!(
                "{:015}:00000:bench",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0)
            );
            let props = PublishProperties {
                response_topic: Some(topic),
                correlation_data: Some(Bytes::copy_from_slice(&n.to_be_bytes())),
                user_properties: vec![("__protVer".into(), "1.0".into()), ("__ts".into(), ts)],
                ..Default::default()
            };
            client
                .publish_with_properties(stategate::mqtt::INVOKE_TOPIC, QoS::AtLeastOnce, false, payload, props)
                .await
                .expect("publish");
        }
    };
    let mut started = std::collections::HashMap::new();
    let mut next = 0u64;
    for _ in 0..in_flight {
        started.insert(next, Instant::now());
        send(next).await;
        next += 1;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut latencies = Vec::new();
    while Instant::now() < end {
        let Ok(Some(Some(p))) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await else {
            panic!("no answer within 10 s");
        };
        let corr = p.properties.and_then(|p| p.correlation_data).expect("correlation data");
        let n = u64::from_be_bytes(corr.as_ref().try_into().expect("8 bytes"));
        if let Some(t) = started.remove(&n) {
            latencies.push(t.elapsed());
        }
        started.insert(next, Instant::now());
        send(next).await;
        next += 1;
    }
    let elapsed = start.elapsed();
    poller.abort();
    running.shutdown().await;
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
    };
    Run {
        ops_per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50).unwrap_or_default(),
        p99: pct(0.99).unwrap_or_default(),
    }
}

fn durable(dir: &std::path::Path, fsync: FsyncMode) -> Store {
    durable_sealed(dir, fsync, false)
}

/// With `encrypted`, under a fixed key (`--encryption-key-file`).
fn durable_sealed(dir: &std::path::Path, fsync: FsyncMode, encrypted: bool) -> Store {
    let mut o = DurableOptions::new(dir);
    o.fsync = fsync;
    if encrypted {
        o.encryption = Some(stategate::storage::durable::EncryptionKey::from_bytes(
            [7; 32],
            "bench.key",
        ));
    }
    Store::new(DurableBackend::open(o).expect("open durable store"))
}

fn dir_bytes(dir: &std::path::Path, ext: &str) -> u64 {
    std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == ext))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Loads `n` distinct keys (one log record each, 64 writers), closes the store, and times the
/// reopen. `segment_bytes` decides how much of it is in snapshots and how much in the log.
async fn restart(base: &std::path::Path, n: u64, segment_bytes: u64) -> (Duration, u64, u64) {
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let mut o = DurableOptions::new(dir.path());
    o.fsync = FsyncMode::Never;
    o.segment_bytes = segment_bytes;
    {
        let store = Store::new(DurableBackend::open(o.clone()).expect("open"));
        fill::fill(&store, n).await;
    }
    let (snap, log) = (dir_bytes(dir.path(), "snap"), dir_bytes(dir.path(), "log"));
    let start = Instant::now();
    let backend = DurableBackend::open(o).expect("reopen");
    let elapsed = start.elapsed();
    let store = Store::new(backend);
    assert_eq!(store.backend().len().await.expect("len"), n, "every key is back");
    (elapsed, snap, log)
}

fn main() {
    let secs = env_u64("STATEGATE_BENCH_SECS", 5);
    let keys = env_u64("STATEGATE_BENCH_KEYS", 1_000_000);
    let base = std::env::var_os("STATEGATE_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!(
            "stategate storage benchmark: {} cores, SET of 16-byte keys with 100-byte values, {secs} s per row, data in {}",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            base.display()
        );
        println!();
        println!("| storage | writers in flight | SET/s | vs memory | p50 | p99 |");
        println!("|---|---:|---:|---:|---:|---:|");
        let rows: [(&str, Option<FsyncMode>, u64); 7] = [
            ("memory", None, 64),
            ("durable, fsync always", Some(FsyncMode::Always), 64),
            ("durable, fsync always, encrypted", Some(FsyncMode::Always), 64),
            ("durable, fsync batch", Some(FsyncMode::Batch), 64),
            ("durable, fsync never", Some(FsyncMode::Never), 64),
            ("durable, fsync never, encrypted", Some(FsyncMode::Never), 64),
            ("durable, fsync always", Some(FsyncMode::Always), 1024),
        ];
        // STATEGATE_BENCH_ONLY=never (say) runs the rows whose name contains it (for profiling).
        let only = std::env::var("STATEGATE_BENCH_ONLY").unwrap_or_default();
        let mut memory = None;
        for (name, mode, writers) in rows {
            if !name.contains(&only) {
                continue;
            }
            let dir = tempfile::tempdir_in(&base).expect("tempdir");
            let store = match mode {
                None => Store::memory(),
                Some(m) => durable_sealed(dir.path(), m, name.contains("encrypted")),
            };
            let run = set_load(store, writers, secs).await;
            let base_rate = *memory.get_or_insert(run.ops_per_sec);
            println!(
                "| {name} | {writers} | {:.0} | {:.1}% | {:.2} ms | {:.2} ms |",
                run.ops_per_sec,
                100.0 * run.ops_per_sec / base_rate,
                run.p50.as_secs_f64() * 1e3,
                run.p99.as_secs_f64() * 1e3,
            );
        }
        println!();
        println!("Through the MQTT door (embedded broker, one client, QoS 1 requests):");
        println!();
        println!("| storage | requests in flight | SET/s | vs memory | p50 | p99 |");
        println!("|---|---:|---:|---:|---:|---:|");
        // Rows run alternately, 3 rounds; the median round of each is printed, so a burst of
        // noise on a shared machine does not decide a ratio.
        let modes = [
            ("memory", None),
            ("durable, fsync always", Some(FsyncMode::Always)),
            ("durable, fsync batch", Some(FsyncMode::Batch)),
        ];
        let mut runs: Vec<Vec<Run>> = modes.iter().map(|_| Vec::new()).collect();
        for _round in 0..3 {
            for ((name, mode), runs) in modes.iter().zip(runs.iter_mut()) {
                if !format!("mqtt {name}").contains(&only) {
                    continue;
                }
                let dir = tempfile::tempdir_in(&base).expect("tempdir");
                let store = match mode {
                    None => Store::memory(),
                    Some(m) => durable(dir.path(), *m),
                };
                runs.push(mqtt_load(store, 64, secs).await);
            }
        }
        let mut memory = None;
        for ((name, _), mut runs) in modes.into_iter().zip(runs) {
            runs.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
            let Some(run) = runs.get(runs.len() / 2) else {
                continue;
            };
            let base_rate = *memory.get_or_insert(run.ops_per_sec);
            println!(
                "| {name} | 64 | {:.0} | {:.1}% | {:.2} ms | {:.2} ms |",
                run.ops_per_sec,
                100.0 * run.ops_per_sec / base_rate,
                run.p50.as_secs_f64() * 1e3,
                run.p99.as_secs_f64() * 1e3,
            );
        }
        println!();
        println!("| restart of {keys} keys | snapshot bytes | log bytes | open (recovery) time |");
        println!("|---|---:|---:|---:|");
        if keys == 0 {
            return;
        }
        for (name, segment_bytes) in [
            ("default compaction (64 MiB segments)", 64 * 1024 * 1024),
            ("log only, no snapshot (worst case)", u64::MAX / 4),
        ] {
            let (elapsed, snap, log) = restart(&base, keys, segment_bytes).await;
            println!(
                "| {name} | {snap} | {log} | {:.2} s |",
                elapsed.as_secs_f64()
            );
        }
    });
}
