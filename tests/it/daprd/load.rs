//! Dapr workflows and actors under a short load on stategate (durable storage, fsync always):
//! the Go load generator (`tests/go/daprload`, the published Dapr Go SDK's workflow client and
//! worker and its actor runtime, built by `scripts/go-peers`) hosts the app and drives it
//! through daprd, with placement and the scheduler. It checks every workflow's output and
//! every actor counter itself and reports one `RESULT {json}` line per job; this test asserts
//! on those counts only (the numbers are the benchmark's: `cargo bench --bench workflows`).

use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use super::sdk::stategate_for;
use super::{Daprd, DaprdOptions, DaprdPorts, Placement, Proc, Scheduler, deploy_dapr, go_binary};
use crate::support::{Storage, free_port};

const APP: &str = "loadapp";

/// 50 workflows of 5 activities started at once, one workflow fanning out to 100 activities,
/// 1,000 actor calls over 200 actor ids with 32 in flight.
const JOBS: [&str; 3] = ["chain:50:5", "fanout:100", "actors:200:32:1000"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_sdk_workflows_and_actors_under_load_on_durable_stategate() {
    let placement = Placement::start().await;
    let etcd = tempfile::tempdir().expect("tempdir");
    let scheduler = Scheduler::start(etcd.path()).await;
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(APP, sockets.path(), Storage::Durable).await;

    // The app listens before daprd starts: daprd waits for the app port, and the load
    // generator waits for daprd's health route, so they start side by side.
    let ports = DaprdPorts::free();
    let app_port = free_port();
    let mut load = Proc::spawn(
        "daprload.test",
        Command::new(go_binary("daprload.test"))
            .args(["-test.run", "^TestLoad$", "-test.timeout", "0"])
            .env("DAPR_GRPC_PORT", ports.grpc.to_string())
            .env("DAPR_HTTP_PORT", ports.http.to_string())
            .env("LOAD_APP_PORT", app_port.to_string())
            .env("LOAD_JOBS", JOBS.join(","))
            .env_remove("DAPR_API_TOKEN"),
    );
    load.wait_for_line("the actor app's \"LISTENING\"", super::START, |l| l == "LISTENING")
        .await;
    let daprd = Daprd::start_on(
        &DaprdOptions {
            app_id: APP.into(),
            sockets: sockets.path().to_owned(),
            resources: deploy_dapr(),
            placement: Some(placement.port),
            scheduler: Some(scheduler.port),
            app_port: Some(app_port),
        },
        ports,
    )
    .await;

    load.wait_for_lines("a RESULT line per job", JOBS.len(), Duration::from_secs(240), |l| {
        l.starts_with("RESULT ")
    })
    .await;
    let out = load.output();
    let results: Vec<Value> = out
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|r| serde_json::from_str(r).expect("RESULT is JSON"))
        .collect();
    let context = || {
        format!(
            "--- load generator:\n{out}\n--- daprd:\n{}\n--- scheduler:\n{}\n--- placement:\n{}",
            daprd.output(),
            scheduler.output(),
            placement.output()
        )
    };
    for (job, result) in JOBS.iter().zip(&results) {
        assert_eq!(result["job"], *job, "{}", context());
        // Every workflow completed with its expected output; every call answered and every
        // counter holds exactly its number of calls.
        assert_eq!(result["failures"], 0, "{job}: {result}\n{}", context());
        assert_eq!(result["ok"], result["units"], "{job}: {result}\n{}", context());
    }

    load.terminate(Duration::from_secs(10)).await;
    daprd.stop().await;
    env.stop().await;
}
