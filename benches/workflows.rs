//! Dapr workflows and actors on stategate against the stores Dapr users pick for them, through
//! the same daprd 1.18.3, placement and scheduler, measured in one run (issue 29).
//!
//! ```text
//! cargo bench --bench workflows -- [--only memory,durable,redis,redis-aof,postgres,floor]
//!                                  [--workflows 100,1000] [--steps 5] [--fanout 100]
//!                                  [--actors 10000] [--actor-calls 20000] [--inflight 64]
//!                                  [--rounds 2] [--job-timeout 180]
//! ```
//!
//! The app is the Go load generator (`tests/go/daprload`, the published Dapr Go SDK: the
//! workflow client and worker, the actor runtime), built by `scripts/go-peers`. Rows:
//! - `chain:N:S`: N workflow instances started at once, each S sequential activities;
//! - `fanout:A`: one workflow of A activities in parallel;
//! - `actors:I:C:K`: K actor calls over I actor ids, C in flight, each call reading the actor's
//!   counter from the state store and saving the new one in a transaction.
//!
//! The load generator checks every workflow's output and every counter. daprd's `statestore`
//! (the actor state store) is, in turn: stategate's binary of this build as its own process on
//! the component socket (deploy/dapr/statestore.yaml; memory, and durable storage with fsync
//! always), `state.redis` on redis-server without persistence and with `appendfsync always`,
//! and `state.postgresql` v2 on PostgreSQL 15 (its defaults: fsync and synchronous_commit on).
//! Each store gets fresh processes (placement, scheduler, daprd, app); stores alternate round
//! by round and the median round of each row is printed, with ratios against Redis (always)
//! and PostgreSQL, and the CPU time per workflow (or call, the check reads counted as calls)
//! of each party, from
//! `/proc/<pid>/task/*/schedstat` (PostgreSQL's: the postmaster and its backends). For
//! stategate it also prints what daprd asked of it per workflow, from its `/metrics`.
//!
//! A row's workflows or calls still running after `--job-timeout` seconds are counted as not
//! ended (the `ok` column), and its throughput counts those that ended, up to the last one.
//!
//! A do-nothing component (benches/dapr/bare.rs) cannot be a baseline here: daprd reads a
//! workflow's history and an actor's state back from the store to take the next step. The
//! `floor` row is the baseline instead: a pluggable component keeping its state in a `HashMap`
//! and nothing more (`workflows/floor.rs`), the least any component behind daprd costs.

use std::collections::BTreeMap;
use std::time::Duration;

#[allow(dead_code)]
#[path = "common/cpu.rs"]
mod cpu;
#[path = "workflows/floor.rs"]
mod floor;
#[allow(dead_code)]
#[path = "dapr/procs.rs"]
mod procs;
#[path = "workflows/stack.rs"]
mod stack;

use procs::{RedisPersistence, free_port};
use serde_json::Value;

/// The stores, in the order rows print them.
const TARGETS: [(&str, &str); 6] = [
    ("memory", "stategate memory"),
    ("durable", "stategate durable (fsync always)"),
    ("redis", "Redis (no persistence)"),
    ("redis-aof", "Redis (appendfsync always)"),
    ("postgres", "PostgreSQL 15 (state.postgresql v2)"),
    ("floor", "floor: a HashMap component"),
];
/// A row taking longer than this is stuck.
const JOB_LIMIT: Duration = Duration::from_secs(1800);
/// The parties whose CPU time is counted, in print order.
const PARTIES: [&str; 5] = ["daprd", "scheduler", "placement", "store", "load"];

struct Opts {
    only: Vec<String>,
    jobs: Vec<String>,
    rounds: usize,
    job_timeout: u64,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    let (mut workflows, mut steps, mut fanout) = ("100,1000".to_owned(), 5, 100);
    let (mut actors, mut calls, mut inflight) = (10_000, 20_000, 64);
    let mut o = Opts {
        only: vec![],
        jobs: vec![],
        rounds: 2,
        job_timeout: 180,
    };
    let num = |v: Option<&String>, d: usize| v.and_then(|v| v.parse().ok()).unwrap_or(d);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--only" => {
                o.only = it
                    .next()
                    .map(|v| v.split(',').map(str::to_owned).collect())
                    .unwrap_or_default()
            }
            "--workflows" => workflows = it.next().cloned().unwrap_or_default(),
            "--steps" => steps = num(it.next(), 5),
            "--fanout" => fanout = num(it.next(), 100),
            "--actors" => actors = num(it.next(), 10_000),
            "--actor-calls" => calls = num(it.next(), 20_000),
            "--inflight" => inflight = num(it.next(), 64),
            "--rounds" => o.rounds = num(it.next(), 2).max(1),
            "--job-timeout" => o.job_timeout = num(it.next(), 180).max(1) as u64,
            _ => {} // cargo passes --bench
        }
    }
    for id in &o.only {
        if !TARGETS.iter().any(|(t, _)| t == id) {
            let ids: Vec<_> = TARGETS.iter().map(|(t, _)| *t).collect();
            eprintln!("--only {id}: not a store; stores: {}", ids.join(","));
            std::process::exit(2);
        }
    }
    for n in workflows.split(',').filter(|s| !s.is_empty()) {
        o.jobs.push(format!("chain:{n}:{steps}"));
    }
    if fanout > 0 {
        o.jobs.push(format!("fanout:{fanout}"));
    }
    if calls > 0 {
        o.jobs.push(format!("actors:{actors}:{inflight}:{calls}"));
    }
    o
}

/// One row of one round.
struct Row {
    result: Value,
    /// CPU ns of each party over the row.
    cpu: Vec<u64>,
    /// stategate's counters' growth over the row (name, delta).
    metrics: Vec<(String, f64)>,
}

impl Row {
    fn f(&self, field: &str) -> f64 {
        self.result[field].as_f64().unwrap_or(0.0)
    }

    /// What the row's CPU time and counters are divided by: its units and the calls that
    /// checked them (an actor row reads every counter back, through daprd like the others).
    fn cpu_units(&self) -> f64 {
        (self.f("units") + self.f("checks")).max(1.0)
    }
}

/// Starts one store with its own placement, scheduler, daprd and app, and runs every job.
fn run_store(target: &str, jobs: &[String], job_timeout: u64) -> Vec<Row> {
    let store = match target {
        "memory" => stack::stategate(false),
        "durable" => stack::stategate(true),
        "redis" => stack::redis(RedisPersistence::None),
        "redis-aof" => stack::redis(RedisPersistence::AofAlways),
        "postgres" => stack::postgres(),
        "floor" => stack::floor(),
        _ => unreachable!("checked in opts"),
    };
    let etcd = tempfile::tempdir().expect("tempdir");
    let (mut scheduler, scheduler_port) = stack::scheduler(etcd.path());
    let (mut placement, placement_port) = stack::placement();
    let ports = (free_port(), free_port());
    let app_port = free_port();
    let mut load = stack::load_generator(ports.0, ports.1, app_port, job_timeout);
    let mut daprd = stack::daprd(
        "bench",
        store.resources.path(),
        store.sockets.path(),
        ports,
        placement_port,
        scheduler_port,
        app_port,
    );
    load.wait_for(
        "the app's \"READY\" (daprd ran a workflow and an actor)",
        JOB_LIMIT,
        |l| l == "READY",
    );
    let pids = [
        (daprd.pid(), false),
        (scheduler.pid(), false),
        (placement.pid(), false),
        (store.pid, store.tree),
        (load.pid(), false),
    ];
    let cpu = || pids.iter().map(|&(p, tree)| stack::cpu_ns(p, tree)).collect::<Vec<_>>();
    let mut rows = Vec::new();
    for job in jobs {
        for p in [&mut daprd, &mut scheduler, &mut placement] {
            p.drain();
        }
        let m0 = store.metrics.map(stack::metrics);
        let c0 = cpu();
        load.send_line(job);
        let line = load.wait_for(&format!("the RESULT of {job}"), JOB_LIMIT, |l| l.starts_with("RESULT "));
        let c1 = cpu();
        let m1 = store.metrics.map(stack::metrics);
        let result: Value = serde_json::from_str(&line["RESULT ".len()..]).expect("RESULT is JSON");
        if result["failures"].as_u64() != Some(0) {
            eprintln!("{target} {job}: not every unit ended right: {result}");
            report_stuck(&mut daprd);
        }
        let metrics = match (m0, m1) {
            (Some(a), Some(b)) => metric_deltas(&a, &b),
            _ => vec![],
        };
        rows.push(Row {
            result,
            cpu: c1.iter().zip(&c0).map(|(b, a)| b.saturating_sub(*a)).collect(),
            metrics,
        });
    }
    rows
}

/// daprd's last warnings and errors, to say why workflows did not end.
fn report_stuck(daprd: &mut stack::Proc) {
    daprd.drain();
    let out = daprd.output();
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("level=error") || l.contains("level=warn"))
        .collect();
    for l in &lines[lines.len().saturating_sub(8)..] {
        eprintln!("  daprd: {l}");
    }
}

/// The counters that say what daprd asks of stategate: component calls by command, storage
/// writes, group commits and the writes they held, fsyncs, keys and value bytes.
fn interesting(name: &str) -> Option<String> {
    let (base, labels) = name.split_once('{').map_or((name, ""), |(b, l)| (b, l));
    match base {
        "stategate_requests_total" if labels.contains("door=\"dapr_component\"") => {
            let cmd = labels.split("command=\"").nth(1)?.split('"').next()?;
            let outcome = labels.split("outcome=\"").nth(1)?.split('"').next()?;
            Some(if outcome == "ok" {
                format!("calls {cmd}")
            } else {
                format!("calls {cmd} {outcome}")
            })
        }
        "stategate_storage_write_duration_seconds_count" => Some("storage writes".into()),
        "stategate_storage_commit_batch_writes_count" => Some("group commits".into()),
        "stategate_storage_commit_batch_writes_sum" => Some("writes in group commits".into()),
        "stategate_storage_fsync_duration_seconds_count" => Some("fsyncs".into()),
        "stategate_keys" => Some("keys (net)".into()),
        "stategate_value_bytes" => Some("value bytes (net)".into()),
        _ => None,
    }
}

fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, v)) = line.rsplit_once(' ')
            && let (Some(k), Ok(v)) = (interesting(name), v.parse::<f64>())
        {
            *m.entry(k).or_default() += v;
        }
    }
    m
}

fn metric_deltas(before: &str, after: &str) -> Vec<(String, f64)> {
    let (a, b) = (parse_metrics(before), parse_metrics(after));
    b.iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d != 0.0)
        .collect()
}

/// The round whose throughput is the median of the rounds'.
fn median(rounds: &[&Row]) -> usize {
    let mut idx: Vec<usize> = (0..rounds.len()).collect();
    idx.sort_by(|&a, &b| rounds[a].f("per_second").total_cmp(&rounds[b].f("per_second")));
    idx[idx.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve-floor") {
        let socket = args.get(i + 1).expect("--serve-floor SOCKET");
        floor::serve(std::path::Path::new(socket));
    }
    let o = opts();
    let targets: Vec<(&str, &str)> = TARGETS
        .iter()
        .copied()
        .filter(|(t, _)| o.only.is_empty() || o.only.iter().any(|x| x == t))
        .collect();
    println!(
        "workflows bench: {} round(s), rows {}; stores {}",
        o.rounds,
        o.jobs.join(" "),
        targets.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(",")
    );
    // results[target][round][job]
    let mut results: Vec<Vec<Vec<Row>>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..o.rounds {
        for (i, (t, _)) in targets.iter().enumerate() {
            let started = std::time::Instant::now();
            let rows = run_store(t, &o.jobs, o.job_timeout);
            eprintln!(
                "round {} {t}: {} ({:.0} s)",
                round + 1,
                rows.iter()
                    .map(|r| format!("{} {:.1}/s", r.result["job"].as_str().unwrap_or("?"), r.f("per_second")))
                    .collect::<Vec<_>>()
                    .join(", "),
                started.elapsed().as_secs_f64()
            );
            results[i].push(rows);
        }
    }
    for (j, job) in o.jobs.iter().enumerate() {
        let unit = if job.starts_with("actors") { "call" } else { "workflow" };
        println!("\n== {job} (median of {} rounds; CPU ms per {unit}) ==", o.rounds);
        let picked: Vec<&Row> = results
            .iter()
            .map(|rounds| {
                let rows: Vec<&Row> = rounds.iter().map(|r| &r[j]).collect();
                rows[median(&rows)]
            })
            .collect();
        let anchor = |id: &str| targets.iter().position(|(t, _)| *t == id).map(|i| picked[i]);
        let (aof, pg, floor) = (anchor("redis-aof"), anchor("postgres"), anchor("floor"));
        println!(
            "{:<36} {:>10} {:>9} {:>9} {:>9}  {:>15} {:>15} {:>15}  {}",
            "store",
            format!("{unit}s/s"),
            "p50 ms",
            "p99 ms",
            "ok",
            "vs redis-aof",
            "vs postgres",
            "vs floor",
            PARTIES.join(" / ")
        );
        for ((_, name), row) in targets.iter().zip(&picked) {
            let units = row.cpu_units();
            let vs = |a: Option<&Row>| {
                a.map(|a| {
                    format!(
                        "x{:.2} p99 x{:.2}",
                        row.f("per_second") / a.f("per_second").max(f64::MIN_POSITIVE),
                        row.f("p99_ms") / a.f("p99_ms").max(f64::MIN_POSITIVE)
                    )
                })
                .unwrap_or_else(|| "-".into())
            };
            let cpu: Vec<String> = row
                .cpu
                .iter()
                .map(|ns| format!("{:.2}", *ns as f64 / 1e6 / units))
                .collect();
            println!(
                "{:<36} {:>10.1} {:>9.1} {:>9.1} {:>9}  {:>15} {:>15} {:>15}  {}",
                name,
                row.f("per_second"),
                row.f("p50_ms"),
                row.f("p99_ms"),
                format!("{}/{}", row.f("ok"), row.f("units")),
                vs(aof),
                vs(pg),
                vs(floor),
                cpu.join(" / ")
            );
        }
        for ((_, name), row) in targets.iter().zip(&picked) {
            if row.metrics.is_empty() {
                continue;
            }
            let units = row.cpu_units();
            let per: Vec<String> = row
                .metrics
                .iter()
                .map(|(k, d)| format!("{k} {:.1}", d / units))
                .collect();
            println!("  {name}, per {unit}: {}", per.join(", "));
        }
    }
}
