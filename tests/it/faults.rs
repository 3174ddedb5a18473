//! The fault test bed in its short form (issue 28, docs/faults.md): the Go test in
//! `tests/go/faults`, compiled by `scripts/go-peers`, runs the real binary as replicas on one
//! Redis and on Redis under Sentinel (with clocks 25 s apart), and as the single node, injects
//! faults at random from a printed seed (partitions from Redis, a Sentinel split brain, pauses,
//! kills of replicas and of Redis, failovers, a full disk, kills during snapshots), drives
//! clients over HTTP, gRPC and MQTT, and checks the histories: a
//! linearizable register per key, fencing, every acknowledged write kept, no MGET or bulk get
//! showing half of a transaction, SSE, gRPC Watch and KEYNOTIFY watchers complete.
//! The same replicas behind one Mosquitto as well (partitions from the broker, KEYNOTIFY
//! handed over between replicas). Long runs: `scripts/faults --minutes N --seed S`.

use std::process::Stdio;
use std::time::Duration;

use crate::aio_go::go_test_binary;
use crate::support::unique_id;

/// How long each topology is under faults in CI.
const SECONDS: u64 = 40;
/// Bound on one run: its processes' start, the faults, healing and the checks.
const RUN: Duration = Duration::from_secs(SECONDS + 150);

/// One bed at a time: each runs 3 to 6 servers and a dozen clients, and the other test thread
/// keeps running the rest of the suite beside it.
static ONE_BED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(topology: &str, skew: bool, broker: &str) {
    let _bed = ONE_BED.lock().await;
    let out = std::env::temp_dir().join(unique_id(&format!("stategate-faults-{topology}")));
    let mut child = tokio::process::Command::new(go_test_binary("faults"))
        .args(["-test.run=^TestFaults$", "-test.v", "-test.count=1"])
        .arg(format!("-test.timeout={}s", RUN.as_secs() - 10))
        .env("STATEGATE_BIN", env!("CARGO_BIN_EXE_stategate"))
        .env("FAULTS_TOPOLOGY", topology)
        .env("FAULTS_SKEW", if skew { "1" } else { "0" })
        .env("FAULTS_BROKER", broker)
        .env("FAULTS_SECONDS", SECONDS.to_string())
        .env("FAULTS_OUT", &out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the fault test bed");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let read = |mut r: Box<dyn tokio::io::AsyncRead + Unpin + Send>| {
        tokio::spawn(async move {
            let mut s = String::new();
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut r, &mut s).await;
            s
        })
    };
    let (o, e) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let status = match tokio::time::timeout(RUN, child.wait()).await {
        Ok(status) => status.expect("wait for the fault test bed"),
        Err(_) => {
            let _ = child.kill().await;
            panic!(
                "the fault test bed ({topology}) did not finish in {RUN:?}; its output is in {}",
                out.display()
            );
        }
    };
    let transcript = format!("{}{}", o.await.unwrap_or_default(), e.await.unwrap_or_default());
    // The summary (seed, schedule, counts, verdicts) goes to the test's output either way.
    println!("{transcript}");
    assert!(
        status.success(),
        "the fault test bed ({topology}, skew {skew}) found a violation or failed; histories in {}",
        out.display()
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_redis_with_skewed_clocks_hold_under_faults() {
    run("redis", true, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_behind_mosquitto_hold_under_faults() {
    run("redis", false, "mosquitto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_sentinel_with_skewed_clocks_hold_under_failovers() {
    run("sentinel", true, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_node_holds_under_faults() {
    run("single", false, "embedded").await;
}
