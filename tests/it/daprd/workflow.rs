//! A Dapr workflow on stategate: daprd runs workflows on its internal actors, so their state
//! goes to the actor state store (stategate, deploy/dapr's `statestore`), and in 1.18 their
//! reminders to the scheduler service. The workflow app (`tests/python/workflow_app.py`, the
//! Python SDK's workflow runtime) needs no app port: it pulls work items from daprd over gRPC.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::process::Command;

use super::sdk::stategate_for;
use super::{Daprd, DaprdOptions, DaprdPorts, Placement, Proc, Scheduler, deploy_dapr};
use crate::support::{RawClient, Storage, TestEnv, unique_id};

const APP: &str = "orders-wf";

/// The keys stategate holds under `prefix`.
async fn keys_under(env: &TestEnv, prefix: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = env
            .engine()
            .keys_with_prefix(prefix.as_bytes(), after.as_deref(), 4096)
            .await
            .expect("list keys");
        keys.extend(page.keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()));
        match page.resume_after {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    keys.sort();
    keys
}

/// Runs the workflow app against `daprd` and returns its `RESULT` (the workflow's final status
/// and output).
async fn run_workflow(daprd: &Daprd, ports: DaprdPorts, instance: &str, order: &Value) -> Value {
    let python = crate::grpc::dapr_sdk_python().await;
    let script = crate::support::repo_path("tests/python/workflow_app.py");
    let mut proc = Proc::spawn(
        "workflow_app.py",
        Command::new(python)
            .arg(script)
            .arg(instance)
            .arg(order.to_string())
            .env("DAPR_GRPC_PORT", ports.grpc.to_string())
            .env("DAPR_HTTP_PORT", ports.http.to_string())
            .env("DAPR_RUNTIME_HOST", "127.0.0.1")
            .env("WORKFLOW_TIMEOUT", "60")
            .env("PYTHONUNBUFFERED", "1")
            .env_remove("DAPR_API_TOKEN"),
    );
    proc.wait_for_line("the workflow's result", Duration::from_secs(120), |l| {
        l.starts_with("RESULT ") || l.starts_with("FAIL: ")
    })
    .await;
    let out = proc.output();
    let result = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("the workflow did not complete:\n{out}\n--- daprd:\n{}", daprd.output()));
    proc.terminate(Duration::from_secs(10)).await;
    serde_json::from_str(result).expect("RESULT is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_workflow_runs_on_stategate() {
    let placement = Placement::start().await;
    let etcd = tempfile::tempdir().expect("tempdir");
    let scheduler = Scheduler::start(etcd.path()).await;
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(APP, sockets.path(), Storage::Durable).await;
    let options = DaprdOptions {
        app_id: APP.into(),
        sockets: sockets.path().to_owned(),
        resources: deploy_dapr(),
        placement: Some(placement.port),
        scheduler: Some(scheduler.port),
        app_port: None,
    };
    let ports = DaprdPorts::free();
    let daprd = Daprd::start_on(&options, ports).await;

    let instance = "order-1001";
    let order = json!({"item": "widget", "qty": 3});
    let result = run_workflow(&daprd, ports, instance, &order).await;
    let reservation = json!({"item": "widget", "reserved": 3});
    let receipt = json!({"item": "widget", "charged": 30});
    assert_eq!(
        result,
        json!({"status": "COMPLETED", "output": {"reservation": reservation, "receipt": receipt}}),
        "--- daprd:\n{}\n--- placement:\n{}\n--- scheduler:\n{}",
        daprd.output(),
        placement.output(),
        scheduler.output()
    );

    // The workflow's state is the workflow actor's state in stategate: its metadata, custom
    // status and one key per history event. The activities' actors and the inbox leave nothing
    // behind once the workflow completes.
    let prefix = format!("{APP}||dapr.internal.default.{APP}.workflow||{instance}||");
    let keys = keys_under(&env, &format!("{APP}||")).await;
    assert!(
        keys.iter().all(|k| k.starts_with(&prefix)),
        "only the workflow's keys remain: {keys:#?}"
    );
    let names: Vec<&str> = keys.iter().map(|k| &k[prefix.len()..]).collect();
    assert!(names.contains(&"metadata"), "{names:?}");
    let history: Vec<&&str> = names.iter().filter(|n| n.starts_with("history-")).collect();
    // Started, two activities scheduled and completed, completed: six events at least (1.18.3
    // writes nine, with the orchestrator's own start events).
    assert!(history.len() >= 6, "{names:?}");
    for (i, name) in history.iter().enumerate() {
        assert_eq!(**name, format!("history-{i:06}"), "history keys are numbered in order");
    }

    // An MQTT client reads the same history: the first events carry the workflow's input, the
    // last its output (protobuf around the JSON the SDK serialized).
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("wf-peer")).await;
    let mut events = Vec::new();
    for name in &history {
        let key = format!("{prefix}{name}");
        let got = mqtt.request(&[b"GET", key.as_bytes()], &[]).await;
        assert!(got.payload.starts_with(b"$"), "MQTT GET {key}: {:?}", got.payload);
        events.push(String::from_utf8_lossy(&got.payload).into_owned());
    }
    assert!(
        events.iter().any(|e| e.contains(r#""qty": 3"#)),
        "the input in the history: {events:#?}"
    );
    assert!(
        events.last().unwrap().contains(r#""charged": 30"#),
        "the output in the last event: {events:#?}"
    );

    // A new daprd (stategate kept running) answers the workflow's status from that state.
    daprd.stop().await;
    let daprd = Daprd::start(&options).await;
    let url = format!("{}/v1.0/workflows/dapr/{instance}", daprd.http());
    let r = reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = r.status();
    let body = r.text().await.expect("workflow status");
    assert_eq!(status, 200, "{body}\n--- daprd:\n{}", daprd.output());
    let v: Value = serde_json::from_str(&body).expect("JSON status");
    assert_eq!(v["runtimeStatus"], "COMPLETED", "{body}");
    assert_eq!(v["workflowName"], "order_flow", "{body}");

    daprd.stop().await;
    env.stop().await;
}
