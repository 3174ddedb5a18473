//! `--only memory`: resident bytes per key next to redis-server's `used_memory`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stategate::storage::Store;

use super::Opts;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Resident set growth per key for `n` keys written through the engine, with the change
/// history kept (the default) or not.
async fn engine_bytes_per_key(n: usize, history: bool) -> (f64, usize) {
    let mut limits = stategate::engine::Limits::default();
    if !history {
        limits.feed.max_events = 0;
    }
    let engine =
        stategate::engine::Engine::open(Store::memory(), "bench", Arc::new(stategate::hlc::SystemClock), limits)
            .await
            .expect("engine");
    let before = rss_bytes();
    for i in 0..n {
        // Every value its own 100 bytes, as values arriving over a door are.
        let mut value = vec![b'v'; 100];
        value[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let cmd = stategate::engine::Command::Set(stategate::engine::Set {
            key: Bytes::from(format!("key-{i:012}")),
            value: Bytes::from(value),
            condition: stategate::engine::SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        });
        engine.execute(cmd).await.expect("set");
    }
    let per_key = rss_bytes().saturating_sub(before) as f64 / n as f64;
    let held = engine.feed_held().1;
    drop(engine);
    // Hand the freed pages back, so the next measurement starts from a clean slate.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    (per_key, held)
}

pub(crate) async fn run(o: &Opts) {
    let n = o.keys;
    println!("\n== Memory: {n} keys of 16 bytes with 100-byte values");
    let (index, _) = engine_bytes_per_key(n, false).await;
    let (total, held) = engine_bytes_per_key(n, true).await;
    println!("stategate (memory storage):   {index:>7.1} bytes/key (resident set growth, no change history)");
    println!(
        "  with the change history:    {total:>7.1} bytes/key (the history is a fixed budget, here {:.1} MiB held)",
        held as f64 / (1024.0 * 1024.0)
    );
    match redis_bytes_per_key(n) {
        Some(theirs) => println!(
            "redis-server used_memory:     {theirs:>7.1} bytes/key   stategate/redis x{:.2} (x{:.2} with the history)",
            index / theirs,
            total / theirs
        ),
        None => println!("redis-server: not installed (apt-get install redis-server), comparison skipped"),
    }
}

fn redis_bytes_per_key(n: usize) -> Option<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let mut child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
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
        let used = |con: &mut redis::Connection| -> Option<u64> {
            let info: String = redis::cmd("INFO").arg("memory").query(con).ok()?;
            info.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse().ok())
        };
        let before = used(&mut con)?;
        let value = vec![b'v'; 100];
        for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                pipe.cmd("SET").arg(format!("key-{i:012}")).arg(&value).ignore();
            }
            pipe.query::<()>(&mut con).ok()?;
        }
        let after = used(&mut con)?;
        Some(after.saturating_sub(before) as f64 / n as f64)
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}
