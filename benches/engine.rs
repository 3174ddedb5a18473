//! Engine micro-benchmarks (in process, memory storage, one core): GET, SET (with and without
//! the change history), SET NX, VDEL and notification fan-out to 1,000 observers.
//! `cargo bench --bench engine`.
//!
//! Each benchmark drives the engine from a current-thread runtime, so the numbers are per core,
//! and times the operations in CPU time of that thread (not wall time): on a shared machine a
//! preempted benchmark would otherwise count other processes' time as ours.
//!
//! `cargo bench --bench engine -- --profile SET 200000` runs one operation that many times
//! without criterion, for a profiler (`valgrind --tool=callgrind`, `perf record`).

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group};
use stategate::engine::{Command, Engine, Get, KeyNotify, Limits, Set, SetCondition, VDel};
use stategate::hlc::SystemClock;
use stategate::storage::Store;

const KEYS: usize = 100_000;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn key(i: usize) -> Bytes {
    Bytes::from(format!("key-{i:012}"))
}

fn engine(rt: &tokio::runtime::Runtime) -> Engine {
    engine_with(rt, Limits::default())
}

fn engine_with(rt: &tokio::runtime::Runtime, limits: Limits) -> Engine {
    rt.block_on(async {
        let e = Engine::open(Store::memory(), "bench", Arc::new(SystemClock), limits)
            .await
            .expect("engine");
        for i in 0..KEYS {
            e.execute(set(key(i), SetCondition::Always)).await.expect("set");
        }
        e
    })
}

fn set(key: Bytes, condition: SetCondition) -> Command {
    Command::Set(Set {
        key,
        value: Bytes::from_static(&[b'v'; 100]),
        condition,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    })
}

/// CPU time this thread has used.
fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `iters` operations inside one `block_on`, so the runtime's entry cost is not counted
/// per operation; keys are prepared beforehand. Returns the thread's CPU time for them.
fn timed<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, mut op: F) -> std::time::Duration
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    rt.block_on(async {
        let start = thread_cpu();
        for i in 0..iters {
            op(i).await;
        }
        thread_cpu() - start
    })
}

/// `--profile VERB N`: N operations of one kind, no criterion (for a profiler). `SET-NO-HISTORY`
/// is SET with the change history off (what keeping it costs).
fn profile(verb: &str, n: u64) {
    let rt = rt();
    let mut limits = Limits::default();
    if verb == "SET-NO-HISTORY" {
        limits.feed.max_events = 0;
    }
    let e = engine_with(&rt, limits);
    let keys: Vec<Bytes> = (0..KEYS).map(key).collect();
    let pick = |i: u64| keys[(i as usize * 7919) % KEYS].clone();
    let spent = timed(&rt, n, |i| {
        let cmd = match verb {
            "GET" => Command::Get(Get { key: pick(i) }),
            _ => set(pick(i), SetCondition::Always),
        };
        let e = &e;
        async move {
            black_box(e.execute(cmd).await.expect("execute"));
        }
    });
    println!("{verb}: {n} in {spent:?} CPU, {:.0}/s", n as f64 / spent.as_secs_f64());
}

fn bench(c: &mut Criterion) {
    let rt = rt();
    let e = engine(&rt);
    let keys: Vec<Bytes> = (0..KEYS).map(key).collect();
    let pick = |i: u64| keys[(i as usize * 7919) % KEYS].clone();
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));

    g.bench_function("GET", |b| {
        b.iter_custom(|n| {
            timed(&rt, n, |i| {
                let cmd = Command::Get(Get { key: pick(i) });
                let e = &e;
                async move {
                    black_box(e.execute(cmd).await.expect("get"));
                }
            })
        })
    });
    g.bench_function("SET", |b| {
        b.iter_custom(|n| {
            timed(&rt, n, |i| {
                let cmd = set(pick(i), SetCondition::Always);
                let e = &e;
                async move {
                    black_box(e.execute(cmd).await.expect("set"));
                }
            })
        })
    });
    let quiet = engine_with(&rt, {
        let mut l = Limits::default();
        l.feed.max_events = 0;
        l
    });
    g.bench_function("SET (no change history)", |b| {
        b.iter_custom(|n| {
            timed(&rt, n, |i| {
                let cmd = set(pick(i), SetCondition::Always);
                let e = &quiet;
                async move {
                    black_box(e.execute(cmd).await.expect("set"));
                }
            })
        })
    });
    drop(quiet);
    g.bench_function("SET NX (exists)", |b| {
        b.iter_custom(|n| {
            timed(&rt, n, |i| {
                let cmd = set(pick(i), SetCondition::IfAbsent);
                let e = &e;
                async move {
                    black_box(e.execute(cmd).await.expect("set nx"));
                }
            })
        })
    });
    g.bench_function("VDEL (value differs)", |b| {
        b.iter_custom(|n| {
            timed(&rt, n, |i| {
                let cmd = Command::VDel(VDel {
                    key: pick(i),
                    value: Bytes::from_static(b"other"),
                    fencing: None,
                });
                let e = &e;
                async move {
                    black_box(e.execute(cmd).await.expect("vdel"));
                }
            })
        })
    });
    g.finish();

    // Fan-out: one SET observed by 1,000 clients; the MQTT notifier looks up the observers
    // of every change, so the cost is SET + one observer lookup returning 1,000 ids.
    let hot = Bytes::from_static(b"hot-key-00000001");
    for n in 0..1000 {
        let cmd = Command::KeyNotify(KeyNotify {
            key: hot.clone(),
            client: format!("client-{n}"),
            session: None,
            stop: false,
        });
        rt.block_on(e.execute(cmd)).expect("keynotify");
    }
    let mut feed = e.subscribe();
    let mut g = c.benchmark_group("fan-out");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("SET observed by 1000", |b| {
        b.iter(|| {
            rt.block_on(e.execute(set(hot.clone(), SetCondition::Always)))
                .expect("set");
            let event = feed.try_recv().expect("change published").expect("not lagged");
            black_box(e.observers_of(&event.change.key).len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--profile") {
        let verb = args.get(i + 1).map_or("GET", String::as_str);
        let n = args.get(i + 2).and_then(|n| n.parse().ok()).unwrap_or(1_000_000);
        return profile(verb, n);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
