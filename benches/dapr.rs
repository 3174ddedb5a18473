//! stategate behind daprd against Redis behind daprd, measured in one run.
//!
//! ```text
//! cargo bench --bench dapr -- [--secs 3] [--warmup-secs 1] [--rounds 3] [--rate 1000]
//!                             [--inflight 64] [--loads rate,inflight] [--ops GET,SET,TX]
//!                             [--only direct-memory,direct-durable,memory,durable,redis,redis-aof]
//!                             [--only bare,socket-bare,socket-memory,direct-memory,memory]
//!                             [--no-log]
//! ```
//!
//! An application calls daprd's gRPC API (GetState, SaveState, ExecuteStateTransaction with 5
//! upserts) at a fixed rate and with N requests in flight. daprd's `statestore` is, in turn:
//! stategate's pluggable component (`deploy/dapr/statestore.yaml`, memory and durable storage),
//! `state.redis` on a redis-server without persistence, and the same with `appendfsync always`
//! (what `durable`'s default `fsync always` promises). stategate's own gRPC door, called
//! directly, is the baseline for daprd's hop; `bare`, `socket-bare` and `socket-memory` (run
//! only when named) take that hop apart: daprd in front of a component that answers constants,
//! that component's socket called directly, and stategate's component socket called directly.
//! Each row also prints the CPU time per request of daprd, the store and the load generator.
//! Targets alternate row by row for `--rounds`
//! rounds and the median round of each is printed, so a burst of noise on a shared machine
//! does not decide a ratio.
//!
//! daprd is found in `$STATEGATE_DAPR_DIR` (else `~/.cache/stategate-dapr/1.18.3`), built by
//! `scripts/go-peers`. Everything listens on loopback only; every child is killed on exit.

use std::path::Path;
use std::time::Duration;

use stategate::config::{BrokerChoice, Config};
use stategate::dapr::{KeyPrefix, StoreSpec, Stores};
use stategate::storage::durable::{DurableBackend, DurableOptions};
use stategate::storage::{StorageKind, Store};

#[path = "dapr/bare.rs"]
mod bare;
#[path = "common/cpu.rs"]
mod cpu;
#[path = "dapr/load.rs"]
mod load;
#[path = "dapr/procs.rs"]
mod procs;
#[path = "dapr/report.rs"]
mod report;
#[path = "dapr/requests.rs"]
mod requests;

use load::{Window, closed_loop, fixed_rate, median};
use procs::{Daprd, Redis, RedisPersistence};
use report::{Load, Results, TARGETS, Target};
use requests::{Client, Op};

/// daprd prefixes every key with the app id: `bench||key-...` in the store.
const APP_ID: &str = "bench";

#[derive(Clone)]
struct Opts {
    secs: u64,
    warmup: u64,
    rounds: usize,
    rate: u64,
    loads: Vec<Load>,
    ops: Vec<Op>,
    only: Vec<String>,
    /// Run stategate without the log subscriber the binary installs (to price its spans).
    no_log: bool,
}

fn opts() -> Opts {
    let mut o = Opts {
        secs: 3,
        warmup: 1,
        rounds: 3,
        rate: 1000,
        loads: vec![],
        ops: vec![Op::Get, Op::Set, Op::Tx],
        only: vec![],
        no_log: false,
    };
    let (mut inflight, mut loads) = (64, vec!["rate".to_owned(), "inflight".to_owned()]);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    let list = |v: Option<&String>| -> Vec<String> {
        v.map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
            .unwrap_or_default()
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--secs" => o.secs = it.next().and_then(|v| v.parse().ok()).unwrap_or(3).max(1),
            "--warmup-secs" => o.warmup = it.next().and_then(|v| v.parse().ok()).unwrap_or(1),
            "--rounds" => o.rounds = it.next().and_then(|v| v.parse().ok()).unwrap_or(3).max(1),
            "--rate" => o.rate = it.next().and_then(|v| v.parse().ok()).unwrap_or(1000).max(1),
            "--inflight" => inflight = it.next().and_then(|v| v.parse().ok()).unwrap_or(64).max(1),
            "--loads" => loads = list(it.next()),
            "--no-log" => o.no_log = true,
            "--ops" => o.ops = list(it.next()).iter().filter_map(|s| Op::parse(s)).collect(),
            "--only" => {
                o.only = list(it.next());
                for id in &o.only {
                    if !TARGETS.iter().any(|t| t.id() == id) {
                        let ids: Vec<_> = TARGETS.iter().map(|t| t.id()).collect();
                        eprintln!("--only {id}: not a target; targets: {}", ids.join(","));
                        std::process::exit(2);
                    }
                }
            }
            _ => {} // cargo passes --bench
        }
    }
    for l in loads {
        match l.as_str() {
            "rate" => o.loads.push(Load::Rate(o.rate)),
            "inflight" => o.loads.push(Load::Inflight(inflight)),
            _ => {
                eprintln!("--loads {l}: rate or inflight");
                std::process::exit(2);
            }
        }
    }
    o
}

impl Opts {
    fn wants(&self, t: Target) -> bool {
        if self.only.is_empty() {
            t.by_default()
        } else {
            self.only.iter().any(|id| id == t.id())
        }
    }
}

/// One stategate serving its gRPC door and the Dapr component socket, on its own runtime (as
/// its own process would be: the load generator's tasks do not share its worker threads).
struct Stategate {
    running: stategate::Running,
    grpc_url: String,
    sockets: tempfile::TempDir,
    _data: Option<tempfile::TempDir>,
}

fn start_stategate(rt: &tokio::runtime::Runtime, durable: bool) -> Stategate {
    let sockets = tempfile::tempdir().expect("tempdir");
    let mut config = Config {
        http_listen: None,
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        // An MQTT broker cannot be turned off; this one is idle.
        broker: BrokerChoice::Embedded {
            listen: "127.0.0.1:0".parse().expect("addr"),
            client_path: false,
        },
        dapr_component_socket: Some(sockets.path().join("stategate.sock")),
        ..Config::default()
    };
    // `statestore` as applications calling stategate directly see it; `bench` with daprd's key
    // prefix, to find daprd's writes (stategate's own door refuses keys holding `||`).
    config.dapr.stores = Stores::new(vec![
        StoreSpec {
            name: requests::STORE.into(),
            prefix: KeyPrefix::None,
        },
        StoreSpec {
            name: APP_ID.into(),
            prefix: KeyPrefix::Literal(APP_ID.into()),
        },
    ]);
    config.mqtt.client_id = format!("stategate-bench-dapr-{}", if durable { "durable" } else { "memory" });
    let (store, data) = if durable {
        // The default durability: acknowledged after fdatasync (group commit).
        let dir = tempfile::tempdir().expect("tempdir");
        config.storage.kind = StorageKind::Durable;
        config.storage.data_dir = dir.path().to_owned();
        let backend = DurableBackend::open(DurableOptions::new(dir.path())).expect("durable storage opens");
        (Store::new(backend), Some(dir))
    } else {
        config.storage.kind = StorageKind::Memory;
        (Store::memory(), None)
    };
    let running = rt.block_on(stategate::start(config, store)).expect("stategate starts");
    let grpc_url = format!("http://{}", running.grpc_addr().expect("the gRPC door"));
    Stategate {
        running,
        grpc_url,
        sockets,
        _data: data,
    }
}

/// One target: where its requests go, how to check it, whose CPU time it costs.
#[derive(Clone)]
struct Bench {
    target: Target,
    /// `http://...` for a runtime API, `unix:///...` for a component socket.
    url: String,
    /// For stategate behind daprd, its own gRPC door, to find daprd's writes in it.
    behind: Option<String>,
    cpu: Vec<(&'static str, cpu::Source)>,
}

/// Everything the targets need kept alive while they are measured.
#[derive(Default)]
struct Servers {
    stategates: Vec<Stategate>,
    daprds: Vec<Daprd>,
    redis: Vec<Redis>,
    dirs: Vec<tempfile::TempDir>,
    benches: Vec<Bench>,
}

/// The in-process servers' threads (the `stategate` runtime and stategate's own threads).
const SERVER: cpu::Source = cpu::Source::Threads("stategate");
const LOAD: (&str, cpu::Source) = ("load", cpu::Source::Threads("load"));

impl Servers {
    fn add(&mut self, target: Target, url: String, behind: Option<String>, cpu: Vec<(&'static str, cpu::Source)>) {
        let mut cpu = cpu;
        cpu.push(LOAD);
        self.benches.push(Bench {
            target,
            url,
            behind,
            cpu,
        });
    }
}

fn start_servers(o: &Opts, rt: &tokio::runtime::Runtime) -> Servers {
    let mut s = Servers::default();
    let needs_daprd = [
        Target::Memory,
        Target::Durable,
        Target::Bare,
        Target::Redis,
        Target::RedisAof,
    ]
    .iter()
    .any(|&t| o.wants(t));
    let daprd = needs_daprd.then(procs::daprd_binary);
    let daprd = daprd.as_deref();
    // At run time: a shared target directory can hold a build from another checkout.
    let root = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let deploy = Path::new(&root).join("deploy/dapr");
    let socket_url = |dir: &Path| format!("unix://{}", dir.join("stategate.sock").display());
    for (direct, socket, via, durable) in [
        (Target::DirectMemory, Some(Target::SocketMemory), Target::Memory, false),
        (Target::DirectDurable, None, Target::Durable, true),
    ] {
        if !o.wants(direct) && !o.wants(via) && !socket.is_some_and(|t| o.wants(t)) {
            continue;
        }
        let sg = start_stategate(rt, durable);
        if o.wants(direct) {
            s.add(direct, sg.grpc_url.clone(), None, vec![("server", SERVER)]);
        }
        if let Some(t) = socket.filter(|&t| o.wants(t)) {
            s.add(t, socket_url(sg.sockets.path()), None, vec![("server", SERVER)]);
        }
        if o.wants(via) {
            // The component file a user deploys, unchanged.
            let d = Daprd::start(daprd.expect("daprd"), APP_ID, &deploy, sg.sockets.path());
            let cpu = vec![("daprd", cpu::Source::Process(d.pid())), ("server", SERVER)];
            s.add(via, d.url(), Some(sg.grpc_url.clone()), cpu);
            s.daprds.push(d);
        }
        s.stategates.push(sg);
    }
    if o.wants(Target::Bare) || o.wants(Target::SocketBare) {
        // Under the file name the component file expects, so daprd sees `state.stategate`.
        let sockets = tempfile::tempdir().expect("tempdir");
        {
            let _in_runtime = rt.enter();
            bare::serve(&sockets.path().join("stategate.sock"));
        }
        if o.wants(Target::SocketBare) {
            s.add(
                Target::SocketBare,
                socket_url(sockets.path()),
                None,
                vec![("server", SERVER)],
            );
        }
        if o.wants(Target::Bare) {
            let d = Daprd::start(daprd.expect("daprd"), APP_ID, &deploy, sockets.path());
            let cpu = vec![("daprd", cpu::Source::Process(d.pid())), ("server", SERVER)];
            s.add(Target::Bare, d.url(), None, cpu);
            s.daprds.push(d);
        }
        s.dirs.push(sockets);
    }
    for (t, persistence) in [
        (Target::Redis, RedisPersistence::None),
        (Target::RedisAof, RedisPersistence::AofAlways),
    ] {
        if !o.wants(t) {
            continue;
        }
        let redis = Redis::start(persistence);
        let resources = procs::redis_resources(redis.port);
        // No pluggable component here: an empty sockets folder.
        let sockets = tempfile::tempdir().expect("tempdir");
        let d = Daprd::start(daprd.expect("daprd"), APP_ID, resources.path(), sockets.path());
        let cpu = vec![
            ("daprd", cpu::Source::Process(d.pid())),
            ("redis", cpu::Source::Process(redis.pid())),
        ];
        s.add(t, d.url(), None, cpu);
        s.daprds.push(d);
        s.redis.push(redis);
        s.dirs.extend([resources, sockets]);
    }
    s.benches.sort_by_key(|b| TARGETS.iter().position(|&x| x == b.target));
    s
}

/// One row of one target, with the CPU time each party spent in its measured window.
async fn row(load: Load, op: Op, w: Window, b: &Bench, c: &Client) -> load::Row {
    let requests = requests::request(c, op);
    let sampler = async {
        tokio::time::sleep(w.warmup).await;
        let before = cpu::snapshot(&b.cpu);
        tokio::time::sleep(w.measured).await;
        (before, cpu::snapshot(&b.cpu))
    };
    let (mut row, (before, after)) = match load {
        Load::Rate(r) => tokio::join!(fixed_rate(r, w, requests), sampler),
        Load::Inflight(k) => tokio::join!(closed_loop(k, w, requests), sampler),
    };
    let served = (row.ops + row.errors).max(1) as f64;
    row.cpu_us = b
        .cpu
        .iter()
        .zip(before.iter().zip(after))
        .map(|((who, _), (a, b))| (*who, b.saturating_sub(*a) as f64 / 1000.0 / served))
        .collect();
    row
}

async fn measure(o: &Opts, benches: &[(Bench, Client)]) -> Results {
    let w = Window {
        warmup: Duration::from_secs(o.warmup),
        measured: Duration::from_secs(o.secs),
    };
    let mut res = Results::new();
    for &load in &o.loads {
        println!(
            "\n== {}: median of {} rounds, {} s per row after {} s warm-up",
            match load {
                Load::Rate(r) => format!("a fixed {r} requests/s"),
                Load::Inflight(n) => format!("{n} requests in flight"),
            },
            o.rounds,
            o.secs,
            o.warmup
        );
        for &op in &o.ops {
            let mut rounds: Vec<Vec<load::Row>> = benches.iter().map(|_| Vec::new()).collect();
            for _ in 0..o.rounds {
                for (n, (b, c)) in benches.iter().enumerate() {
                    rounds[n].push(row(load, op, w, b, c).await);
                }
            }
            for ((b, _), rows) in benches.iter().zip(rounds) {
                res.insert((load, op, b.target), median(rows));
            }
            let redis = res.get(&(load, op, Target::Redis));
            for (b, _) in benches {
                report::print_row(b.target, op, load, &res[&(load, op, b.target)], redis);
            }
        }
    }
    res
}

/// Connects, checks and seeds every target, then measures them.
async fn run(o: Opts, benches: Vec<Bench>) {
    let mut clients = Vec::new();
    for b in benches {
        let c = requests::connect(&b.url).await;
        let behind = match &b.behind {
            Some(url) => match requests::connect(url).await {
                requests::Client::Runtime(r) => Some(r),
                requests::Client::Component(..) => None,
            },
            None => None,
        };
        let keeps = b.target != Target::Bare;
        requests::check(b.target.label(), &c, keeps, behind.as_ref().map(|d| (d, APP_ID))).await;
        requests::seed(&c).await;
        clients.push((b, c));
    }
    let res = measure(&o, &clients).await;
    report::summary(&res, &o.loads, &o.ops);
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let o = opts();
    // As the binary runs: its log subscriber at its default filter, so the per-request spans
    // cost what they cost a deployed stategate (nothing is logged per request at `info`).
    let _log = (!o.no_log).then(|| {
        let ops = Config::default().ops;
        stategate::telemetry::init(&ops.log_filter, ops.log_format)
    });
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .thread_name(name)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let (server_rt, load_rt) = (runtime("stategate"), runtime("load"));
    println!(
        "stategate behind daprd: {cores} cores, load average {} at the start; 16-byte keys, \
         100-byte values, {} keys; durable = fsync always (group commit); redis = no \
         persistence (--save \"\" --appendonly no); redis aof = --appendonly yes --appendfsync always",
        loadavg(),
        requests::KEYS
    );
    let servers = start_servers(&o, &server_rt);
    // Spawned, so that the load generator runs on the `load` threads alone, whose CPU is counted.
    let work = load_rt.spawn(run(o, servers.benches.clone()));
    if load_rt.block_on(work).is_err() {
        // The panic's message is already printed; stop the children first (drops below).
        drop(servers);
        std::process::exit(1);
    }
    println!("\nload average {} at the end", loadavg());
    drop(load_rt);
    let Servers {
        stategates,
        daprds,
        redis,
        ..
    } = servers;
    // daprd first, so it does not log its lost component while stategate stops.
    drop(daprds);
    for sg in stategates {
        server_rt.block_on(sg.running.shutdown());
    }
    drop(redis);
}
