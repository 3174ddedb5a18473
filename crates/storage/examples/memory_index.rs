//! The memory index alone, for changes to its layout: resident set growth per key and CPU
//! time per operation, with keys created in order and at random.
//!
//! `cargo run --release -p stategate-storage --example memory_index [-- --keys 1000000]`
//!
//! For each order, a fresh index gets every key (16 bytes, a distinct 100-byte value), then is
//! scanned in pages of 1,000, has every value replaced by one of another length (a new entry
//! each, replacing the old in both indexes), and every key deleted in random order. CPU time is
//! this thread's (`/proc/thread-self/schedstat`), so a busy machine does not count against it;
//! run it twice to see the noise. The memory figure for the whole service, next to Redis, is
//! `cargo bench --bench memory_per_key`.

use std::sync::Arc;

use bytes::Bytes;
use stategate_hlc::Hlc;
use stategate_storage::memory::MemoryBackend;
use stategate_storage::{Backend, DeadlineCheck, Record, Swap};

fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn rss_bytes() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn key(i: usize) -> Bytes {
    Bytes::from(format!("key-{i:012}"))
}

fn value(i: usize, len: usize) -> Bytes {
    let mut v = vec![b'v'; len];
    v[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Bytes::from(v)
}

fn swap(i: usize, step: u64, expected: Option<Hlc>, value_len: Option<usize>) -> Swap {
    let version = Hlc {
        ms: 1_800_000_000_000 + step / 1000,
        counter: (step % 1000) as u32,
        node: Arc::from("n"),
    };
    Swap {
        key: key(i),
        expected,
        new: value_len.map(|len| Record {
            value: value(i, len),
            version,
            fencing: None,
            expires_at_ms: None,
            slide_ms: None,
        }),
        deadline: DeadlineCheck::Any,
    }
}

/// A permutation of 0..n (xorshift Fisher-Yates), the same on every run.
fn shuffled(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

async fn run(name: &str, order: &[usize], deletes: &[usize]) {
    let n = order.len();
    let backend = MemoryBackend::default();
    let per = |ns: u64| ns as f64 / n as f64;
    let rss = rss_bytes();
    let t = cpu_ns();
    for (step, &i) in order.iter().enumerate() {
        backend
            .swap_many(&[swap(i, step as u64, None, Some(100))], None)
            .await
            .expect("insert");
    }
    let insert = per(cpu_ns() - t);
    let grown = (rss_bytes() - rss) as f64 / n as f64;
    let t = cpu_ns();
    let (mut after, mut seen) = (None::<Bytes>, 0);
    loop {
        let page = backend.scan(after.as_deref(), 1000, 0, &|_| true).await.expect("scan");
        seen += page.keys.len();
        match page.resume_after {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    assert_eq!(seen, n);
    let scan = per(cpu_ns() - t);
    // A value of another length: a new entry, replacing the old in both indexes.
    let t = cpu_ns();
    for &i in deletes {
        let cur = backend.get_head(&key(i)).await.expect("get").map(|r| r.version);
        let step = (n + i) as u64;
        backend
            .swap_many(&[swap(i, step, cur, Some(101))], None)
            .await
            .expect("replace");
    }
    let replace = per(cpu_ns() - t);
    let t = cpu_ns();
    for &i in deletes {
        let cur = backend.get_head(&key(i)).await.expect("get").map(|r| r.version);
        backend.swap_many(&[swap(i, 0, cur, None)], None).await.expect("delete");
    }
    let delete = per(cpu_ns() - t);
    assert_eq!(backend.len().await.expect("len"), 0);
    println!(
        "{name:<10} {grown:>8.1} B/key   insert {insert:>6.0}   scan {scan:>5.0}   \
         replace {replace:>6.0}   delete {delete:>6.0} ns CPU a key"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let n: usize = arg("--keys").and_then(|k| k.parse().ok()).unwrap_or(1_000_000);
    let Some(order) = arg("--order") else {
        // Each order in a process of its own: the second would start in the heap the first
        // freed, and its resident set growth would say little.
        println!("memory index, {n} keys of 16 bytes with 100-byte values (RSS growth after the inserts)");
        for order in ["ascending", "random"] {
            let exe = std::env::current_exe().expect("the example's path");
            let status = std::process::Command::new(exe)
                .args(["--keys", &n.to_string(), "--order", order])
                .status()
                .expect("a run");
            assert!(status.success());
        }
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let random = shuffled(n);
    let inserts = match order.as_str() {
        "ascending" => (0..n).collect(),
        _ => random.clone(),
    };
    rt.block_on(run(&order, &inserts, &random));
}
