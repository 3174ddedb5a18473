//! Storage benchmark (not a test): SET throughput through the engine with 64 writers in flight
//! for each storage mode, and restart time of a durable store holding 1 million keys.
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
use stategate::hlc::{Hlc, SystemClock};
use stategate::storage::durable::{DurableBackend, DurableOptions, FsyncMode};
use stategate::storage::{Record, Store, Swap};

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

fn durable(dir: &std::path::Path, fsync: FsyncMode) -> Store {
    let mut o = DurableOptions::new(dir);
    o.fsync = fsync;
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
        let mut tasks = Vec::new();
        for w in 0..64u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = w;
                while i < n {
                    let swap = Swap {
                        key: key(0, i),
                        expected: None,
                        new: Some(Record {
                            value: Bytes::from(vec![b'v'; 100]),
                            version: Hlc::new(1_700_000_000_000 + i, 0, "bench"),
                            fencing: None,
                            expires_at_ms: None,
                        }),
                    };
                    store.backend().swap_many(&[swap], None).await.expect("swap");
                    i += 64;
                }
            }));
        }
        for t in tasks {
            t.await.expect("loader");
        }
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
        let rows: [(&str, Option<FsyncMode>, u64); 5] = [
            ("memory", None, 64),
            ("durable, fsync always", Some(FsyncMode::Always), 64),
            ("durable, fsync batch", Some(FsyncMode::Batch), 64),
            ("durable, fsync never", Some(FsyncMode::Never), 64),
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
                Some(m) => durable(dir.path(), m),
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
