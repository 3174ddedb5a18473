//! stategate behind daprd against Redis behind daprd, measured in one run.
//!
//! ```text
//! cargo bench --bench dapr -- [--secs 3] [--warmup-secs 1] [--rounds 3] [--rate 1000]
//!                             [--inflight 64] [--ops GET,SET,TX]
//!                             [--only direct-memory,direct-durable,memory,durable,redis,redis-aof]
//! ```
//!
//! An application calls daprd's gRPC API (GetState, SaveState, ExecuteStateTransaction with 5
//! upserts) at a fixed rate and with N requests in flight. daprd's `statestore` is, in turn:
//! stategate's pluggable component (`deploy/dapr/statestore.yaml`, memory and durable storage),
//! `state.redis` on a redis-server without persistence, and the same with `appendfsync always`
//! (what `durable`'s default `fsync always` promises). stategate's own gRPC door, called
//! directly, is the baseline for daprd's hop. Targets alternate row by row for `--rounds`
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

struct Opts {
    secs: u64,
    warmup: u64,
    rounds: usize,
    rate: u64,
    inflight: usize,
    ops: Vec<Op>,
    only: Vec<String>,
}

fn opts() -> Opts {
    let mut o = Opts {
        secs: 3,
        warmup: 1,
        rounds: 3,
        rate: 1000,
        inflight: 64,
        ops: vec![Op::Get, Op::Set, Op::Tx],
        only: vec![],
    };
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
            "--inflight" => o.inflight = it.next().and_then(|v| v.parse().ok()).unwrap_or(64).max(1),
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
    o
}

impl Opts {
    fn wants(&self, t: Target) -> bool {
        self.only.is_empty() || self.only.iter().any(|id| id == t.id())
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
    config.http.stores = Stores::new(vec![
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

/// Everything a target needs kept alive while it is measured.
#[derive(Default)]
struct Servers {
    stategates: Vec<Stategate>,
    daprds: Vec<Daprd>,
    redis: Vec<Redis>,
    dirs: Vec<tempfile::TempDir>,
    /// The URL each target's requests go to.
    urls: Vec<(Target, String)>,
    /// For a target behind daprd, the gRPC door of the stategate behind it.
    behind: Vec<(Target, String)>,
}

fn start_servers(o: &Opts, rt: &tokio::runtime::Runtime) -> Servers {
    let mut s = Servers::default();
    let needs_daprd = [Target::Memory, Target::Durable, Target::Redis, Target::RedisAof]
        .iter()
        .any(|&t| o.wants(t));
    let daprd = needs_daprd.then(procs::daprd_binary);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dapr");
    for (direct, via, durable) in [
        (Target::DirectMemory, Target::Memory, false),
        (Target::DirectDurable, Target::Durable, true),
    ] {
        if !o.wants(direct) && !o.wants(via) {
            continue;
        }
        let sg = start_stategate(rt, durable);
        if o.wants(direct) {
            s.urls.push((direct, sg.grpc_url.clone()));
        }
        if o.wants(via) {
            // The component file a user deploys, unchanged.
            let bin = daprd.as_deref().expect("daprd");
            let d = Daprd::start(bin, APP_ID, &deploy, sg.sockets.path());
            s.urls.push((via, format!("http://127.0.0.1:{}", d.grpc_port)));
            s.behind.push((via, sg.grpc_url.clone()));
            s.daprds.push(d);
        }
        s.stategates.push(sg);
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
        let bin = daprd.as_deref().expect("daprd");
        let d = Daprd::start(bin, APP_ID, resources.path(), sockets.path());
        s.urls.push((t, format!("http://127.0.0.1:{}", d.grpc_port)));
        s.daprds.push(d);
        s.redis.push(redis);
        s.dirs.extend([resources, sockets]);
    }
    s.urls.sort_by_key(|(t, _)| TARGETS.iter().position(|x| x == t));
    s
}

async fn measure(o: &Opts, targets: &[(Target, Client)]) -> (Results, Vec<Load>) {
    let w = Window {
        warmup: Duration::from_secs(o.warmup),
        measured: Duration::from_secs(o.secs),
    };
    let loads = vec![Load::Rate(o.rate), Load::Inflight(o.inflight)];
    let mut res = Results::new();
    for &load in &loads {
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
            let mut rounds: Vec<Vec<load::Row>> = targets.iter().map(|_| Vec::new()).collect();
            for _ in 0..o.rounds {
                for (n, (_, c)) in targets.iter().enumerate() {
                    let row = match load {
                        Load::Rate(r) => fixed_rate(r, w, requests::request(c, op)).await,
                        Load::Inflight(k) => closed_loop(k, w, requests::request(c, op)).await,
                    };
                    rounds[n].push(row);
                }
            }
            for ((t, _), rows) in targets.iter().zip(rounds) {
                res.insert((load, op, *t), median(rows));
            }
            let redis = res.get(&(load, op, Target::Redis));
            for (t, _) in targets {
                report::print_row(*t, op, load, &res[&(load, op, *t)], redis);
            }
        }
    }
    (res, loads)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let o = opts();
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
    load_rt.block_on(async {
        let mut targets = Vec::new();
        for (t, url) in &servers.urls {
            targets.push((*t, requests::connect(url.clone()).await));
        }
        for (t, c) in &targets {
            // For stategate behind daprd: its own door, to find daprd's writes in it.
            let behind = servers.behind.iter().find(|(b, _)| b == t).map(|(_, url)| url.clone());
            let direct = match behind {
                Some(url) => Some(requests::connect(url).await),
                None => None,
            };
            requests::check(t.label(), c, direct.as_ref().map(|d| (d, APP_ID))).await;
            requests::seed(c).await;
        }
        let (res, loads) = measure(&o, &targets).await;
        report::summary(&res, &loads, &o.ops);
    });
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
