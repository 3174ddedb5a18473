//! Many app pods on one key space (issue 29, section 4): what a stategate sidecar per app pod,
//! all on one shared Redis, costs while another replica takes the writes. Each sidecar serves
//! only daprd's component socket, yet reads the whole change log in Redis (the log is how a
//! replica learns of other replicas' writes: its watchers, KEYNOTIFY, expiry and record cache
//! depend on it, and its own writes are answered once read back from it).
//!
//! ```text
//! cargo bench --bench sidecars -- [--sidecars 10] [--writes 20000] [--inflight 16]
//!                                 [--value-bytes 256] [--idle-secs 5] [--sidecar-args "--flag v ..."]
//! ```
//!
//! One redis-server (no persistence), one "central" stategate replica on it taking the writes
//! (HTTP state API, `--inflight` writes in flight over 10,000 keys), and the `stategate` binary
//! of this build for every process. Three phases, in one run:
//! 1. the writes with no sidecar: the baseline, CPU time per write of the central replica and
//!    of Redis;
//! 2. `--sidecars` sidecars started (`--dapr-component-socket`, no HTTP or gRPC door) and left
//!    idle for `--idle-secs`: each one's CPU per second and resident memory when nothing happens;
//! 3. the same writes again: CPU time per write of each party, each sidecar's as a ratio to the
//!    central replica's, and Redis's against phase 1 (its cost of serving the sidecars' reads).
//!
//! CPU time is the kernel's per-thread run time (`/proc/<pid>/task/*/schedstat`); resident
//! memory is `VmRSS`. Everything listens on loopback; every child is killed on exit.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[allow(dead_code)]
#[path = "common/cpu.rs"]
mod cpu;
#[allow(dead_code)]
#[path = "dapr/procs.rs"]
mod procs;

use cpu::Source;
use procs::{Redis, RedisPersistence, free_port};

/// A stategate replica answers within seconds; a minute means it is stuck.
const START: Duration = Duration::from_secs(60);
/// Keys the writes spread over (each write replaces one).
const KEYS: usize = 10_000;

struct Opts {
    sidecars: usize,
    writes: usize,
    inflight: usize,
    value_bytes: usize,
    idle_secs: u64,
    /// Flags every sidecar gets besides its own (a sidecar configuration to compare).
    sidecar_args: Vec<String>,
}

fn opts() -> Opts {
    let mut o = Opts {
        sidecars: 10,
        writes: 20_000,
        inflight: 16,
        value_bytes: 256,
        idle_secs: 5,
        sidecar_args: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |flag: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} N"))
        };
        match a.as_str() {
            "--sidecars" => o.sidecars = num("--sidecars"),
            "--writes" => o.writes = num("--writes"),
            "--inflight" => o.inflight = num("--inflight").max(1),
            "--value-bytes" => o.value_bytes = num("--value-bytes"),
            "--idle-secs" => o.idle_secs = num("--idle-secs") as u64,
            "--sidecar-args" => {
                o.sidecar_args = args
                    .next()
                    .expect("--sidecar-args \"--flag value ...\"")
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            }
            // cargo bench passes --bench to every benchmark binary.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// A stategate process killed (and reaped) on drop, with the folder its data and socket use.
struct Stategate {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Stategate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Stategate {
    /// Starts the binary on Redis with `extra` flags and waits for `ready_line` in its log.
    fn start(redis: u16, node: &str, extra: &[String], ready_line: &'static str, dir: tempfile::TempDir) -> Stategate {
        let bin = std::env::var_os("STATEGATE_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_stategate").into());
        let mut child = Command::new(&bin)
            .arg("serve")
            .args(["--storage", &format!("redis://127.0.0.1:{redis}")])
            .args(["--node-id", node, "--mqtt-client-id", node])
            // Each has its own embedded broker (no flag turns it off), on a port nobody uses.
            .args(["--mqtt-listen", &format!("127.0.0.1:{}", free_port())])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--log-level", "info", "--no-ui"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", Path::new(&bin).display()));
        let (tx, ready) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let tx = tx.clone();
            // Read to the end: a full pipe would stall the child.
            std::thread::spawn(move || {
                let mut lines = Vec::new();
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if line.contains(ready_line) {
                        let _ = tx.send(Ok(()));
                    }
                    if lines.len() < 200 {
                        lines.push(line);
                    }
                }
                let _ = tx.send(Err(lines.join("\n")));
            });
        }
        match ready.recv_timeout(START) {
            Ok(Ok(())) => Stategate { child, _dir: dir },
            Ok(Err(log)) => panic!("{node} exited before \"{ready_line}\"; output:\n{log}"),
            Err(_) => panic!("{node}: no \"{ready_line}\" within {START:?}"),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// `writes` saves through the central replica's HTTP state API, `inflight` at a time; returns
/// the wall time they took.
fn write_load(rt: &tokio::runtime::Runtime, http: &str, o: &Opts, round: usize) -> Duration {
    let url = format!("{http}/v1.0/state/statestore");
    let value = "x".repeat(o.value_bytes);
    let client = reqwest::Client::builder().tcp_nodelay(true).build().expect("client");
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..o.inflight {
            let (client, url, value, next, writes) =
                (client.clone(), url.clone(), value.clone(), next.clone(), o.writes);
            tasks.push(tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= writes {
                        return;
                    }
                    let body =
                        serde_json::json!([{"key": format!("key-{}", n % KEYS), "value": format!("{round}:{value}")}]);
                    let r = client
                        .post(&url)
                        .json(&body)
                        .send()
                        .await
                        .expect("the central replica answers");
                    assert!(r.status().is_success(), "a save failed: {}", r.status());
                }
            }));
        }
        for t in tasks {
            t.await.expect("a writer");
        }
    });
    started.elapsed()
}

/// CPU time of each source over one write load, in µs per write.
fn measure(
    rt: &tokio::runtime::Runtime,
    http: &str,
    o: &Opts,
    round: usize,
    sources: &[(&'static str, Source)],
) -> (Vec<f64>, Duration) {
    let before = cpu::snapshot(sources);
    let took = write_load(rt, http, o, round);
    let after = cpu::snapshot(sources);
    let per_write = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 / 1000.0 / o.writes as f64)
        .collect();
    (per_write, took)
}

fn main() {
    let o = opts();
    // reqwest's rustls needs a process-wide provider even for plain HTTP.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("load")
        .enable_all()
        .build()
        .expect("runtime");
    let redis = Redis::start(RedisPersistence::None);
    let http_port = free_port();
    let central = Stategate::start(
        redis.port,
        "central",
        &[
            "--http-listen".into(),
            format!("127.0.0.1:{http_port}"),
            "--grpc-listen".into(),
            "off".into(),
        ],
        "stategate is serving the state store",
        tempfile::tempdir().expect("tempdir"),
    );
    let http = format!("http://127.0.0.1:{http_port}");
    println!(
        "sidecars: {} sidecars (extra flags: {:?}), {} writes of {} bytes over {KEYS} keys, {} in flight, through the central replica's HTTP state API",
        o.sidecars, o.sidecar_args, o.writes, o.value_bytes, o.inflight
    );

    // Warm up (connections, Redis's scripts, the key space), then the baseline.
    write_load(&rt, &http, &o, 0);
    let base_sources = [
        ("central", Source::Process(central.pid())),
        ("redis", Source::Process(redis.pid())),
    ];
    let (base, base_took) = measure(&rt, &http, &o, 1, &base_sources);

    let sidecars: Vec<Stategate> = (0..o.sidecars)
        .map(|n| {
            let dir = tempfile::tempdir().expect("tempdir");
            let socket = dir.path().join("stategate.sock");
            Stategate::start(
                redis.port,
                &format!("sidecar-{n}"),
                &[
                    "--dapr-component-socket".into(),
                    socket.display().to_string(),
                    "--http-listen".into(),
                    "off".into(),
                    "--grpc-listen".into(),
                    "off".into(),
                ]
                .into_iter()
                .chain(o.sidecar_args.iter().cloned())
                .collect::<Vec<_>>(),
                "stategate is serving the state store",
                dir,
            )
        })
        .collect();

    // Idle: nobody writes.
    let idle_sources: Vec<(&'static str, Source)> = sidecars
        .iter()
        .map(|s| ("sidecar", Source::Process(s.pid())))
        .chain([("redis", Source::Process(redis.pid()))])
        .collect();
    let before = cpu::snapshot(&idle_sources);
    std::thread::sleep(Duration::from_secs(o.idle_secs));
    let after = cpu::snapshot(&idle_sources);
    let idle_ms_per_s: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 / 1e6 / o.idle_secs as f64)
        .collect();
    let idle_rss: Vec<f64> = sidecars.iter().map(|s| rss_mib(s.pid())).collect();

    // The same writes with every sidecar tailing the log.
    let mut sources = vec![
        ("central", Source::Process(central.pid())),
        ("redis", Source::Process(redis.pid())),
    ];
    sources.extend(sidecars.iter().map(|s| ("sidecar", Source::Process(s.pid()))));
    let (with, with_took) = measure(&rt, &http, &o, 2, &sources);

    let rate = |took: Duration| o.writes as f64 / took.as_secs_f64();
    println!();
    println!(
        "{:<28} {:>12} {:>12} {:>10}",
        "", "µs CPU/write", "vs central", "RSS MiB"
    );
    println!(
        "{:<28} {:>12.1} {:>12} {:>10.1}   ({:.0} writes/s)",
        "central, no sidecars",
        base[0],
        "1.00",
        rss_mib(central.pid()),
        rate(base_took)
    );
    println!(
        "{:<28} {:>12.1} {:>12.2} {:>10.1}",
        "redis, no sidecars",
        base[1],
        base[1] / base[0],
        rss_mib(redis.pid())
    );
    println!(
        "{:<28} {:>12.1} {:>12.2} {:>10}   ({:.0} writes/s)",
        format!("central, {} sidecars", o.sidecars),
        with[0],
        1.0,
        "",
        rate(with_took)
    );
    println!(
        "{:<28} {:>12.1} {:>12.2} {:>10.1}   (x{:.2} its cost without sidecars)",
        format!("redis, {} sidecars", o.sidecars),
        with[1],
        with[1] / with[0],
        rss_mib(redis.pid()),
        with[1] / base[1]
    );
    let side = &with[2..];
    for (n, cpu) in side.iter().enumerate() {
        println!(
            "{:<28} {:>12.1} {:>12.2} {:>10.1}   (idle: {:.2} ms CPU/s)",
            format!("sidecar-{n}"),
            cpu,
            cpu / with[0],
            rss_mib(sidecars[n].pid()),
            idle_ms_per_s[n]
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (side_mean, idle_mean) = (mean(side), mean(&idle_ms_per_s[..sidecars.len()]));
    println!();
    println!(
        "sidecar mean: {:.1} µs CPU/write ({:.2} of the central replica's), {:.1} MiB idle RSS, {:.2} ms CPU/s idle; \
         all {} together: {:.1} µs/write ({:.2} of the central's); redis idle with them: {:.2} ms CPU/s",
        side_mean,
        side_mean / with[0],
        mean(&idle_rss),
        idle_mean,
        side.len(),
        side.iter().sum::<f64>(),
        side.iter().sum::<f64>() / with[0],
        idle_ms_per_s[sidecars.len()]
    );
    drop(sidecars);
    drop(central);
    drop(redis);
}
