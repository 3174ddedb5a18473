//! Memory per key and where it goes: `cargo bench --bench memory_per_key [-- --keys 1000000]`.
//!
//! 16-byte keys with distinct 100-byte values, each row in a process of its own (in one
//! process, a row starts in the heap the previous one freed, and its resident set growth says
//! more about that than about the row), with the allocator's own figures beside the resident
//! set:
//!
//! - RSS growth: what the operating system sees;
//! - heap: the malloc chunks live at the end (each allocation's usable size plus glibc's 8-byte
//!   header), from a counting allocator around the system one;
//! - requested: the bytes the code asked for (the heap less the allocator's rounding).
//!
//! Rows: the memory backend alone (swaps straight into `MemoryBackend`), the engine with the
//! change history off and on (the default: `--watch-history-events` 65,536), and redis-server
//! filled with the same keys in the same run: its `used_memory` (its allocator's size classes,
//! without fragmentation) and its RSS growth (the same kind of figure as ours). Then the parts,
//! each built alone for the same number of keys: one entry's malloc chunk, a hash table of
//! pointers (hashbrown, as the memory backend's), and by difference the ordered index.
//!
//! Like the binary, the glibc mmap threshold is fixed at 128 KiB (`src/main.rs`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hash::BuildHasher;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use stategate::hlc::Hlc;
use stategate::storage::memory::MemoryBackend;
use stategate::storage::{Backend, DeadlineCheck, Record, Swap};

/// Live bytes the code asked for, live malloc chunk bytes, live allocations.
static REQUESTED: AtomicIsize = AtomicIsize::new(0);
static CHUNKS: AtomicIsize = AtomicIsize::new(0);
static ALLOCS: AtomicIsize = AtomicIsize::new(0);

/// glibc's per-chunk header beside the usable size (chunks below the mmap threshold).
const MALLOC_HEADER: usize = 8;

struct Counting;

fn chunk(p: *mut u8) -> isize {
    // SAFETY: `p` is a live block from the system allocator (glibc malloc).
    (unsafe { libc::malloc_usable_size(p.cast()) } + MALLOC_HEADER) as isize
}

// SAFETY: every call is passed to the system allocator unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            REQUESTED.fetch_add(l.size() as isize, Relaxed);
            CHUNKS.fetch_add(chunk(p), Relaxed);
            ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            REQUESTED.fetch_add(l.size() as isize, Relaxed);
            CHUNKS.fetch_add(chunk(p), Relaxed);
            ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        REQUESTED.fetch_sub(l.size() as isize, Relaxed);
        CHUNKS.fetch_sub(chunk(p), Relaxed);
        ALLOCS.fetch_sub(1, Relaxed);
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let before = chunk(p);
        let q = unsafe { System.realloc(p, l, new_size) };
        if !q.is_null() {
            REQUESTED.fetch_add(new_size as isize - l.size() as isize, Relaxed);
            CHUNKS.fetch_add(chunk(q) - before, Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEY_BYTES: usize = 16;
const VALUE_BYTES: usize = 100;

fn key(i: usize) -> Bytes {
    Bytes::from(format!("key-{i:012}"))
}

/// Every value its own 100 bytes, as values arriving over a door are.
fn value(i: usize) -> Bytes {
    let mut v = vec![b'v'; VALUE_BYTES];
    v[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Bytes::from(v)
}

fn rss_bytes() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as i64
}

#[derive(Clone, Copy)]
struct Sample {
    rss: i64,
    requested: isize,
    chunks: isize,
    allocs: isize,
}

fn sample() -> Sample {
    Sample {
        rss: rss_bytes(),
        requested: REQUESTED.load(Relaxed),
        chunks: CHUNKS.load(Relaxed),
        allocs: ALLOCS.load(Relaxed),
    }
}

/// Prints one result line for the parent: growth per key of each figure, then `extra`.
fn report(before: Sample, n: usize, extra: &str) {
    let after = sample();
    let per = |a: i64, b: i64| (a - b) as f64 / n as f64;
    println!(
        "RESULT {:.1} {:.1} {:.1} {:.3} {extra}",
        per(after.rss, before.rss),
        per(after.chunks as i64, before.chunks as i64),
        per(after.requested as i64, before.requested as i64),
        per(after.allocs as i64, before.allocs as i64),
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The memory backend alone: one swap per new key, versions that pack in the entry's header
/// as the engine's do (a millisecond and a counter within it).
fn child_backend(n: usize) {
    runtime().block_on(async {
        let node: Arc<str> = Arc::from("bench");
        let backend = MemoryBackend::default();
        let before = sample();
        for i in 0..n {
            let version = Hlc {
                ms: 1_800_000_000_000 + (i / 1000) as u64,
                counter: (i % 1000) as u32,
                node: node.clone(),
            };
            let swap = Swap {
                key: key(i),
                expected: None,
                new: Some(Record {
                    value: value(i),
                    version,
                    fencing: None,
                    expires_at_ms: None,
                    slide_ms: None,
                }),
                deadline: DeadlineCheck::Any,
            };
            backend.swap_many(&[swap], None).await.expect("swap");
        }
        report(before, n, "");
        drop(backend);
    });
}

/// The engine, as the doors benchmark fills it, with the change history kept or not.
fn child_engine(n: usize, history: bool) {
    use stategate::engine::{Command, Engine, Limits, Set, SetCondition};
    runtime().block_on(async {
        let mut limits = Limits::default();
        if !history {
            limits.feed.max_events = 0;
        }
        let store = stategate::storage::Store::memory();
        let engine = Engine::open(store, "bench", Arc::new(stategate::hlc::SystemClock), limits)
            .await
            .expect("engine");
        let before = sample();
        for i in 0..n {
            let cmd = Command::Set(Set {
                key: key(i),
                value: value(i),
                condition: SetCondition::Always,
                ttl_ms: None,
                timestamp: None,
                fencing: None,
                persist: false,
                sliding: false,
            });
            engine.execute(cmd).await.expect("set");
        }
        let (events, bytes) = engine.feed_held();
        report(before, n, &format!("{events} {bytes}"));
    });
}

/// The parts, each alone: one entry's chunk, then a hash table of n pointers.
fn child_parts(n: usize) {
    // The entry: 20-byte header (memory/entry.rs), key, value, in one allocation.
    let entry = 20 + KEY_BYTES + VALUE_BYTES;
    let block = vec![0u8; entry].into_boxed_slice();
    let entry_chunk = chunk(Box::into_raw(block).cast());
    let before = sample();
    let hasher = std::collections::hash_map::RandomState::new();
    let mut table: hashbrown::HashTable<usize> = hashbrown::HashTable::new();
    for i in 0..n {
        table.insert_unique(hasher.hash_one(i), i, |v| hasher.hash_one(*v));
    }
    let after = sample();
    let load = n as f64 / table.capacity() as f64 * 7.0 / 8.0;
    drop(table);
    // The same table of 4-byte handles (what entries in an arena of our own would allow).
    let before_small = sample();
    let mut small: hashbrown::HashTable<u32> = hashbrown::HashTable::new();
    for i in 0..n as u32 {
        small.insert_unique(hasher.hash_one(i), i, |v| hasher.hash_one(*v));
    }
    let after_small = sample();
    println!(
        "RESULT 0 0 0 0 {entry} {entry_chunk} {} {load:.2} {}",
        (after.chunks - before.chunks) as f64 / n as f64,
        (after_small.chunks - before_small.chunks) as f64 / n as f64,
    );
}

/// redis-server filled with the same keys: growth of `used_memory` and of `used_memory_rss`.
fn child_redis(n: usize) {
    let Some((used, rss)) = redis_per_key(n) else {
        println!("RESULT none");
        return;
    };
    println!("RESULT {rss:.1} {used:.1} 0 0");
}

fn redis_per_key(n: usize) -> Option<(f64, f64)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let result = (|| {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut con = loop {
            match client.get_connection() {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => return None,
            }
        };
        let info = |con: &mut redis::Connection| -> Option<(f64, f64)> {
            let info: String = redis::cmd("INFO").arg("memory").query(con).ok()?;
            let field = |name: &str| -> Option<f64> {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|v| v.trim().parse().ok())
            };
            Some((field("used_memory")?, field("used_memory_rss")?))
        };
        let before = info(&mut con)?;
        for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                pipe.cmd("SET").arg(&key(i)[..]).arg(&value(i)[..]).ignore();
            }
            pipe.query::<()>(&mut con).ok()?;
        }
        // redis-server reads its RSS from /proc now and then (serverCron): let it catch up.
        std::thread::sleep(Duration::from_millis(1500));
        let after = info(&mut con)?;
        Some(((after.0 - before.0) / n as f64, (after.1 - before.1) / n as f64))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// Runs one row in a fresh process; its `RESULT` fields.
fn row(mode: &str, n: usize) -> Vec<f64> {
    let exe = std::env::current_exe().expect("the benchmark's path");
    let out = Command::new(exe)
        .args(["--child", mode, "--keys", &n.to_string()])
        .output()
        .expect("a child row");
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(line) = text.lines().find_map(|l| l.strip_prefix("RESULT ")) else {
        panic!(
            "row {mode}: no result\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    line.split_whitespace().filter_map(|v| v.parse().ok()).collect()
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
    let args: Vec<String> = std::env::args().collect();
    let keys: Vec<usize> = arg(&args, "--keys")
        .unwrap_or_else(|| "1000000".into())
        .split(',')
        .map(|k| k.parse().expect("--keys N[,N...]"))
        .collect();
    if let Some(mode) = arg(&args, "--child") {
        let n = keys[0];
        match mode.as_str() {
            "backend" => child_backend(n),
            "engine" => child_engine(n, false),
            "engine-history" => child_engine(n, true),
            "parts" => child_parts(n),
            "redis" => child_redis(n),
            other => panic!("unknown row {other}"),
        }
        return;
    }
    for n in keys {
        print_rows(n);
    }
}

fn print_rows(n: usize) {
    println!("\n== {n} keys of {KEY_BYTES} bytes with distinct {VALUE_BYTES}-byte values (each row its own process)");
    println!(
        "{:<40}{:>12}{:>12}{:>12}{:>10}",
        "", "RSS growth", "heap", "requested", "allocs"
    );
    println!(
        "{:<40}{:>12}{:>12}{:>12}{:>10}",
        "", "B/key", "B/key", "B/key", "per key"
    );
    let line = |name: &str, r: &[f64]| {
        println!("{name:<40}{:>12.1}{:>12.1}{:>12.1}{:>10.2}", r[0], r[1], r[2], r[3]);
    };
    let backend = row("backend", n);
    line("memory backend alone", &backend);
    let off = row("engine", n);
    line("engine, change history off", &off);
    let on = row("engine-history", n);
    line("engine, change history on (default)", &on);
    let (events, counted) = (on[4], on[5]);
    let per_change = (on[1] - off[1]) * n as f64 / events.max(1.0);
    println!(
        "  the history: {events} changes held ({:.1} MiB counted against its budget), {per_change:.0} B of heap \
         a change",
        counted / (1024.0 * 1024.0)
    );
    let redis = row("redis", n);
    let (redis_used, redis_rss) = match redis.as_slice() {
        [rss, used, ..] => {
            println!("{:<40}{:>12.1}{:>12.1}", "redis-server (RSS, used_memory)", rss, used);
            (*used, *rss)
        }
        _ => {
            println!("redis-server: not installed (apt-get install redis-server), comparison skipped");
            (f64::NAN, f64::NAN)
        }
    };
    println!(
        "stategate RSS / redis used_memory:  x{:.2} history off, x{:.2} on",
        off[0] / redis_used,
        on[0] / redis_used
    );
    println!(
        "stategate RSS / redis RSS:          x{:.2} history off, x{:.2} on",
        off[0] / redis_rss,
        on[0] / redis_rss
    );
    let parts = row("parts", n);
    let (entry, entry_chunk, table, load, small) = (parts[4], parts[5], parts[6], parts[7], parts[8]);
    println!("where the memory backend's heap goes (B/key):");
    println!(
        "  entry: {entry} B (20 header + {KEY_BYTES} key + {VALUE_BYTES} value) in a {entry_chunk} B malloc chunk"
    );
    println!("  hash index (hashbrown, a pointer a bucket, built alone): {table:.1} (load {load:.2})");
    println!("    the same with 4-byte handles instead of pointers: {small:.1}");
    println!(
        "  ordered index and the rest (the difference): {:.1}",
        backend[1] - entry_chunk - table
    );
}
