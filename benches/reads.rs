//! Read benchmark (not a test): what sliding expiry costs a GET, and what MGET saves.
//!
//! GET throughput through the engine, 16 readers in flight over 10,000 keys, on memory and on
//! durable storage (fsync always), for plain keys (the baseline, measured in the same run),
//! sliding keys with the default slack (10 %: a key read without pause is written once per
//! 10 % of its TTL) and sliding keys with no slack (a write on every read that finds time
//! moved). Then MGET of 10 keys against 10 GETs. Ratios are against the baseline of the same
//! storage; median of 3 alternating rounds.
//!
//! ```text
//! cargo bench --bench reads
//! STATEGATE_BENCH_SECS=3 cargo bench --bench reads
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stategate::engine::{Command, Engine, Get, Limits, MGet, Set, SetCondition};
use stategate::hlc::SystemClock;
use stategate::storage::Store;
use stategate::storage::durable::{DurableBackend, DurableOptions, FsyncMode};

const KEYS: usize = 10_000;
const READERS: usize = 16;
/// Long enough that nothing expires during a run; the slack decides how often reads write.
const TTL_MS: u64 = 600_000;

fn key(i: usize) -> Bytes {
    Bytes::from(format!("key-{i:08}"))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keys {
    Plain,
    Sliding { slack_percent: u32 },
}

async fn engine(durable: Option<&std::path::Path>, keys: Keys) -> Engine {
    let store = match durable {
        None => Store::memory(),
        Some(dir) => {
            let mut o = DurableOptions::new(dir);
            o.fsync = FsyncMode::Always;
            Store::new(DurableBackend::open(o).expect("durable store"))
        }
    };
    let limits = Limits {
        sliding_slack_percent: match keys {
            Keys::Sliding { slack_percent } => slack_percent,
            Keys::Plain => 10,
        },
        ..Limits::default()
    };
    let e = Engine::open(store, "bench", Arc::new(SystemClock), limits)
        .await
        .expect("engine");
    for i in 0..KEYS {
        let cmd = Command::Set(Set {
            key: key(i),
            value: Bytes::from(vec![b'v'; 100]),
            condition: SetCondition::Always,
            ttl_ms: Some(TTL_MS),
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: keys != Keys::Plain,
        });
        e.execute(cmd).await.expect("set");
    }
    e
}

/// Keys read per second by `READERS` tasks for `secs`; `batch` keys per request (1: GET,
/// more: MGET of that many).
async fn read_load(e: &Engine, secs: u64, batch: usize) -> f64 {
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for r in 0..READERS {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let mut read = 0u64;
            let mut i = r * 613;
            while Instant::now() < end {
                let cmd = if batch == 1 {
                    Command::Get(Get { key: key(i % KEYS) })
                } else {
                    Command::MGet(MGet {
                        keys: (0..batch).map(|j| key((i + j) % KEYS)).collect(),
                    })
                };
                e.execute(cmd).await.expect("read");
                read += batch as u64;
                i += batch * 7919;
            }
            read
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("reader");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::var("STATEGATE_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let cases = [
        Keys::Plain,
        Keys::Sliding { slack_percent: 10 },
        Keys::Sliding { slack_percent: 0 },
    ];
    println!("GET throughput, {READERS} readers, {KEYS} keys, {secs} s per round, median of 3");
    for durable in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        let mut engines = Vec::new();
        for (n, keys) in cases.iter().enumerate() {
            let sub = dir.path().join(format!("case-{n}"));
            std::fs::create_dir_all(&sub).expect("case dir");
            engines.push(engine(durable.then_some(sub.as_path()), *keys).await);
        }
        for _ in 0..3 {
            for (n, e) in engines.iter().enumerate() {
                rounds[n].push(read_load(e, secs, 1).await);
            }
        }
        let results: Vec<f64> = rounds.into_iter().map(median).collect();
        let storage = if durable { "durable (fsync always)" } else { "memory" };
        for (keys, rate) in cases.iter().zip(&results) {
            println!(
                "  {storage:<24} {:<26} {:>10.0} GET/s  {:.2}x of plain",
                format!("{keys:?}"),
                rate,
                rate / results[0]
            );
        }
        if !durable {
            let e = &engines[0];
            let (mut single, mut many) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                single.push(read_load(e, secs, 1).await);
                many.push(read_load(e, secs, 10).await);
            }
            let (single, many) = (median(single), median(many));
            println!(
                "  {storage:<24} {:<26} {:>10.0} keys/s  {:.2}x of GET",
                "MGET of 10 keys",
                many,
                many / single
            );
        }
    }
}
