//! Restart: time from a process's start to ready with millions of keys on disk, stategate's
//! durable storage next to redis-server loading the same keys from its RDB and AOF files in the
//! same run (issue 30, docs/performance.md "Restart").
//!
//! ```text
//! cargo bench --bench restart -- [--keys 1000000,10000000] [--rounds 3] [--dir /path/on/disk]
//! ```
//!
//! For each key count (16-byte keys, 100-byte values):
//! - stategate: a child process (this benchmark, `--populate`) writes the keys into a durable
//!   store the way the service does (one versioned record per key, 64 writers, `fsync never` so
//!   the load is quick) and is killed with SIGKILL once it says every write returned: that data
//!   directory is the "after kill -9" state (no shutdown work, the log tail as the writes left
//!   it). A copy is then opened by the `stategate` binary and stopped with SIGTERM: the "after
//!   a clean stop" state. Each round times the binary from spawn until `GET /readyz` answers 200,
//!   on a fresh copy of the state.
//! - redis-server: `DEBUG POPULATE` the same number of keys with 100-byte values, `SAVE` (RDB),
//!   and an AOF rewrite without the RDB preamble (`aof-use-rdb-preamble no`: a log of commands,
//!   what "loading the AOF" means); each round times redis-server from spawn until `PING`
//!   answers `PONG` (not `-LOADING`).
//!
//! Ready means serving: stategate's `/readyz` answers 200 once storage is open and every door
//! listens. The data directory defaults to the system temp dir; it must be on the disk being
//! measured (not tmpfs). Page cache is not dropped (that needs root and a quiet machine), so
//! these are warm-cache figures for both.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stategate::storage::Store;
use stategate::storage::durable::{DurableBackend, DurableOptions, FsyncMode};

#[path = "common/fill.rs"]
mod fill;
#[path = "common/ready.rs"]
mod ready;

use ready::{http_ready, until};

struct Opts {
    keys: Vec<u64>,
    rounds: usize,
    dir: PathBuf,
}

fn opts() -> Opts {
    let mut o = Opts {
        keys: vec![1_000_000, 10_000_000],
        rounds: 3,
        dir: std::env::temp_dir(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--keys" => {
                o.keys = args
                    .next()
                    .map(|v| v.split(',').map(|n| n.parse().expect("--keys N,N")).collect())
                    .expect("--keys N,N")
            }
            "--rounds" => o.rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--dir" => o.dir = args.next().map(PathBuf::from).expect("--dir PATH"),
            "--populate" => {
                let dir = args.next().map(PathBuf::from).expect("--populate DIR N");
                let n = args.next().and_then(|v| v.parse().ok()).expect("--populate DIR N");
                populate(&dir, n);
                // The parent kills this process (SIGKILL) once it reads this line.
                println!("populated");
                std::io::stdout().flush().unwrap();
                loop {
                    std::thread::park();
                }
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// Writes `n` keys into a durable store at `dir`, as the service would store them.
fn populate(dir: &Path, n: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut o = DurableOptions::new(dir);
        o.fsync = FsyncMode::Never;
        let store = Store::new(DurableBackend::open(o).expect("open durable store"));
        fill::fill(&store, n).await;
    });
}

/// Ports below the ephemeral range, never handed out twice (see the file).
#[path = "../crates/storage/src/redis/ports.rs"]
mod ports;
use ports::free_port;

/// A child killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut line = String::new();
    s.write_all(b"PING\r\n").is_ok() && BufReader::new(s).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

/// A command to redis-server, its first answer line.
fn redis(port: u16, args: &[&str]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("redis");
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp").arg("-a").arg(from).arg(to).status().expect("cp");
    assert!(status.success(), "cp -a {} {}", from.display(), to.display());
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn start_stategate(dir: &Path) -> (Proc, u16) {
    let http = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args([
            "--storage",
            "durable",
            "--grpc-listen",
            "off",
            "--no-metrics",
            "--log-level",
            "info",
        ])
        .arg("--data-dir")
        .arg(dir)
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--mqtt-listen", &format!("127.0.0.1:{}", free_port())])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start stategate");
    (Proc(child), http)
}

/// Reads the service's log until its recovery line; the storage's own recovery time, in s.
fn recovery_secs(p: &mut Proc) -> f64 {
    let out = BufReader::new(p.0.stderr.take().expect("stderr"));
    for line in out.lines() {
        let line = line.expect("log");
        if line.contains("durable storage recovered")
            && let Some(ms) = line.split_whitespace().find_map(|f| f.strip_prefix("elapsed_ms="))
        {
            return ms.parse::<f64>().expect("elapsed_ms") / 1000.0;
        }
    }
    panic!("stategate did not log its recovery");
}

/// Seconds from spawn to ready of the stategate binary on a copy of `state`, and of that the
/// storage's recovery.
fn stategate_ready(state: &Path, scratch: &Path) -> (f64, f64) {
    let dir = scratch.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(state, &dir);
    let start = Instant::now();
    let (mut p, http) = start_stategate(&dir);
    until("stategate", Duration::from_secs(600), || http_ready(http));
    let secs = start.elapsed().as_secs_f64();
    let recovery = recovery_secs(&mut p);
    drop(p);
    std::fs::remove_dir_all(&dir).unwrap();
    (secs, recovery)
}

fn start_redis(dir: &Path, port: u16, aof: bool) -> Proc {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .arg("--dir")
        .arg(dir)
        .args(["--appendonly", if aof { "yes" } else { "no" }])
        .args(["--aof-use-rdb-preamble", "no", "--loglevel", "warning"])
        // DEBUG POPULATE makes the keys; Redis 7 takes DEBUG only when enabled.
        .args(["--enable-debug-command", "local"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is the anchor of this benchmark: install it (scripts/test does)");
    Proc(child)
}

/// Seconds from spawn to PONG of redis-server on a copy of `state`, from its AOF or its RDB.
fn redis_ready(state: &Path, scratch: &Path, aof: bool) -> f64 {
    let dir = scratch.join("redis-run");
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(state, &dir);
    let port = free_port();
    let start = Instant::now();
    let p = start_redis(&dir, port, aof);
    until("redis-server", Duration::from_secs(600), || redis_ping(port));
    let secs = start.elapsed().as_secs_f64();
    let keys = redis(port, &["DBSIZE"]);
    drop(p);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        keys.starts_with(':') && keys.trim() != ":0",
        "redis-server loaded nothing: {keys}"
    );
    secs
}

/// redis-server's files for `n` keys: `dump.rdb` and the AOF directory, in `dir`.
fn redis_state(dir: &Path, n: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let port = free_port();
    let _p = start_redis(dir, port, false);
    until("redis-server", Duration::from_secs(30), || redis_ping(port));
    assert!(redis(port, &["DEBUG", "POPULATE", &n.to_string(), "key", "100"]).starts_with("+OK"));
    assert!(redis(port, &["SAVE"]).starts_with("+OK"));
    // Turning the AOF on rewrites it from the data set: with the preamble off, as commands.
    assert!(redis(port, &["CONFIG", "SET", "appendonly", "yes"]).starts_with("+OK"));
    until("the AOF rewrite", Duration::from_secs(600), || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"INFO persistence\r\n").unwrap();
        let mut buf = vec![0u8; 8192];
        let n = s.read(&mut buf).unwrap_or(0);
        let info = String::from_utf8_lossy(&buf[..n]);
        info.contains("aof_rewrite_in_progress:0")
            && info.contains("aof_rewrite_scheduled:0")
            && info.contains("aof_rewrites:1")
    });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let o = opts();
    println!(
        "== Restart: start to ready, 16-byte keys with 100-byte values, median of {} rounds, data in {}",
        o.rounds,
        o.dir.display()
    );
    for &n in &o.keys {
        let base = tempfile::tempdir_in(&o.dir).expect("tempdir");
        // stategate's state after kill -9: the populating child killed.
        let killed = base.path().join("killed");
        std::fs::create_dir_all(&killed).unwrap();
        let t = Instant::now();
        let mut child = Proc(
            Command::new(std::env::current_exe().unwrap())
                .arg("--populate")
                .arg(&killed)
                .arg(n.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("populate"),
        );
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "populated");
        drop(child);
        let populate_secs = t.elapsed().as_secs_f64();
        // After a clean stop: opened by the service, then SIGTERM.
        let clean = base.path().join("clean");
        copy_dir(&killed, &clean);
        let (mut p, http) = start_stategate(&clean);
        // Read the log as it comes, so the service never blocks on a full pipe.
        let log = p.0.stderr.take().expect("stderr");
        std::thread::spawn(move || std::io::copy(&mut BufReader::new(log), &mut std::io::sink()));
        until("stategate", Duration::from_secs(600), || http_ready(http));
        let _ = Command::new("kill").arg("-TERM").arg(p.0.id().to_string()).status();
        let status = p.0.wait().unwrap();
        assert!(status.success(), "stategate's clean stop: {status}");
        let redis_dir = base.path().join("redis");
        redis_state(&redis_dir, n);
        println!(
            "{n} keys (loaded in {populate_secs:.1} s): stategate after kill -9 {} MiB, after a clean stop {} MiB; redis RDB + AOF {} MiB",
            dir_bytes(&killed) >> 20,
            dir_bytes(&clean) >> 20,
            (dir_bytes(&redis_dir) + dir_bytes(&redis_dir.join("appendonlydir"))) >> 20,
        );
        let scratch = base.path();
        let (mut k, mut c, mut rdb, mut aof) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Alternate the four, so a burst of noise does not land on one of them.
        for _ in 0..o.rounds {
            k.push(stategate_ready(&killed, scratch));
            c.push(stategate_ready(&clean, scratch));
            rdb.push(redis_ready(&redis_dir, scratch, false));
            aof.push(redis_ready(&redis_dir, scratch, true));
        }
        let recovery = |v: &[(f64, f64)]| median(v.iter().map(|r| r.1).collect());
        let (k_rec, c_rec) = (recovery(&k), recovery(&c));
        let ready = |v: &[(f64, f64)]| median(v.iter().map(|r| r.0).collect());
        let (k, c, rdb, aof) = (ready(&k), ready(&c), median(rdb), median(aof));
        for (name, secs, rec) in [
            ("stategate after kill -9", k, Some(k_rec)),
            ("stategate after a clean stop", c, Some(c_rec)),
            ("redis-server from RDB", rdb, None),
            ("redis-server from AOF", aof, None),
        ] {
            let rec = rec
                .map(|r| format!("  (storage recovery {r:.2} s)"))
                .unwrap_or_default();
            println!(
                "{n:>9} keys  {name:<30} {secs:>7.2} s   x{:.2} of Redis's AOF load  x{:.2} of its RDB load{rec}",
                secs / aof,
                secs / rdb
            );
        }
    }
}
