//! Dapr workflows through the faults Dapr users meet: `kill -9` of stategate (durable storage,
//! the `stategate` binary serving daprd's component socket), of daprd, and of one stategate
//! replica on shared Redis, each in the middle of many running workflows
//! (`tests/python/workflow_load_app.py`, the Python SDK's workflow runtime: 200 instances of
//! 3 sequential activities; 1,000 by hand). After the restart:
//!
//! - every instance reaches COMPLETED with its own expected output (the sum of its steps and
//!   its id), reported by the app, which polls every instance until it ends;
//! - none completes twice: in stategate, each instance's history holds exactly one event with
//!   its final output (the `ExecutionCompleted` event) and at most one event with each step's
//!   result (the `TaskCompleted` event) — a step whose result were stored twice would show two;
//! - finding 10, daprd's: in about one run in four with stategate killed (durable storage or a
//!   Redis sidecar), one instance completes with the right output while its stored history
//!   lacks its last step. daprd 1.18.3 dispatches a step's activity before it saves the step;
//!   when that save fails (the component is down), the activity still runs, its result lands
//!   in the inbox once stategate is back, and the next run completes the workflow from it,
//!   logging "discarding resolution event *protos.HistoryEvent_TaskCompleted that matches no
//!   operation scheduled in persisted history" (seen with `STATEGATE_DAPRD_LOG_LEVEL=debug`).
//!   The tests print such instances; `STATEGATE_WF_FAULTS_FULL_HISTORY=1` makes them fail on
//!   it, with daprd's lines about them;
//! - activities may run again (Dapr's activities are at least once: a crash between running one
//!   and storing its result runs it again); the app counts re-runs and the test prints them.
//!
//! daprd's gRPC client to the component socket reconnects by itself once stategate listens
//! again (grpc-go's backoff: 1 s, then 1.6 times longer, up to 120 s); meanwhile its actor
//! calls fail and daprd retries the workflow's steps (its reminders on the scheduler).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Command;

use super::{Daprd, DaprdOptions, DaprdPorts, Placement, Proc, Scheduler, deploy_dapr};
use crate::support::{RawClient, free_port, unique_id};

const APP: &str = "wf-faults";
/// Instances started at once (`STATEGATE_WF_FAULTS_WORKFLOWS` for a bigger run by hand: 1,000
/// were, see deploy/dapr/README.md, "Workflows: limits and restarts"), and sequential
/// activities in each.
const WORKFLOWS: usize = 200;
const STEPS: usize = 3;

fn workflows() -> usize {
    std::env::var("STATEGATE_WF_FAULTS_WORKFLOWS")
        .ok()
        .map(|v| v.parse().expect("STATEGATE_WF_FAULTS_WORKFLOWS is a number"))
        .unwrap_or(WORKFLOWS)
}
/// The whole run of the app, faults and restarts included.
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// The `stategate` binary serving daprd's component socket, as a process the test can kill.
pub struct StategateProc {
    args: Vec<OsString>,
    pub mqtt_port: u16,
    proc: Proc,
}

impl StategateProc {
    /// Starts stategate with `storage` (`durable` on `data`, or a Redis URL) serving the
    /// component at `socket`, its MQTT door (embedded broker) on a free port.
    pub async fn start(storage: &str, data: &Path, socket: &Path) -> StategateProc {
        let mqtt_port = free_port();
        let args: Vec<OsString> = vec![
            "--storage".into(),
            storage.into(),
            "--data-dir".into(),
            data.into(),
            "--dapr-component-socket".into(),
            socket.into(),
            "--mqtt-listen".into(),
            format!("127.0.0.1:{mqtt_port}").into(),
            "--http-listen".into(),
            "off".into(),
            "--grpc-listen".into(),
            "off".into(),
        ];
        let proc = StategateProc::spawn(&args).await;
        StategateProc { args, mqtt_port, proc }
    }

    async fn spawn(args: &[OsString]) -> Proc {
        let mut proc = Proc::spawn(
            "stategate",
            Command::new(env!("CARGO_BIN_EXE_stategate"))
                .args(args)
                .env("RUST_LOG", "stategate=info")
                .env("NO_COLOR", "1")
                .env("STATEGATE_FSYNC", "always"),
        );
        proc.wait_for_line("\"Dapr pluggable state component listening\"", super::START, |l| {
            l.contains("Dapr pluggable state component listening")
        })
        .await;
        proc
    }

    /// `kill -9`, then a new process with the same arguments (data dir, socket, ports).
    pub async fn kill_and_restart(&mut self) {
        self.proc.kill().await;
        self.proc = StategateProc::spawn(&self.args).await;
    }

    pub fn output(&self) -> String {
        self.proc.output()
    }

    pub async fn stop(mut self) {
        self.proc.terminate(Duration::from_secs(10)).await;
    }
}

/// placement, scheduler and daprd (actors and workflows on the `statestore` component, found
/// in `sockets`), restartable on the same ports.
pub struct Dapr {
    pub placement: Placement,
    pub scheduler: Scheduler,
    pub etcd: tempfile::TempDir,
    pub options: DaprdOptions,
    pub ports: DaprdPorts,
    pub daprd: Daprd,
}

impl Dapr {
    pub async fn start(app: &str, sockets: &Path) -> Dapr {
        // reqwest (daprd's health check) needs a TLS provider; the in-process service that
        // installs one elsewhere does not run here.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let placement = Placement::start().await;
        let etcd = tempfile::tempdir().expect("tempdir");
        let scheduler = Scheduler::start(etcd.path()).await;
        let options = DaprdOptions {
            app_id: app.into(),
            sockets: sockets.to_owned(),
            resources: deploy_dapr(),
            placement: Some(placement.port),
            scheduler: Some(scheduler.port),
            app_port: None,
        };
        let ports = DaprdPorts::free();
        let daprd = Daprd::start_on(&options, ports).await;
        Dapr {
            placement,
            scheduler,
            etcd,
            options,
            ports,
            daprd,
        }
    }

    fn output(&self) -> String {
        format!(
            "--- daprd:\n{}\n--- scheduler:\n{}\n--- placement:\n{}",
            self.daprd.output(),
            self.scheduler.output(),
            self.placement.output()
        )
    }

    async fn stop(self) {
        self.daprd.stop().await;
    }
}

/// The workflow app: schedules `count` instances of `steps` activities, each returning `pad`
/// bytes besides its result, then polls them all until they end (`env`: more of the app's
/// environment, e.g. `WORKFLOW_MODE=purge`).
pub fn start_app(
    ports: DaprdPorts,
    prefix: &str,
    count: usize,
    steps: usize,
    pad: usize,
    python: &Path,
    env: &[(&str, &str)],
) -> Proc {
    Proc::spawn(
        "workflow_load_app.py",
        Command::new(python)
            .arg(crate::support::repo_path("tests/python/workflow_load_app.py"))
            .arg(prefix)
            .arg(count.to_string())
            .arg(steps.to_string())
            .arg(pad.to_string())
            .env("DAPR_GRPC_PORT", ports.grpc.to_string())
            .env("DAPR_HTTP_PORT", ports.http.to_string())
            .env("DAPR_RUNTIME_HOST", "127.0.0.1")
            .env("WORKFLOW_TIMEOUT", RUN_LIMIT.as_secs().to_string())
            .env("PYTHONUNBUFFERED", "1")
            .envs(env.iter().copied())
            .env_remove("DAPR_API_TOKEN"),
    )
}

/// Waits for the app's `RESULT` line and returns it.
pub async fn app_result(app: &mut Proc, limit: Duration, context: impl Fn() -> String) -> Value {
    app.wait_for_line("the app's RESULT", limit, |l| {
        l.starts_with("RESULT ") || l.starts_with("FAIL: ")
    })
    .await;
    let out = app.output();
    let Some(result) = out.lines().find_map(|l| l.strip_prefix("RESULT ")) else {
        panic!("the workflow app failed:\n{}\n{}", tail(&out, 60), context());
    };
    serde_json::from_str(result).expect("RESULT is JSON")
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What the stored histories hold: how many events, and the instances whose history lacks a
/// step's result (`instance: step`).
pub struct Histories {
    pub events: usize,
    pub missing: Vec<String>,
}

/// Reads every history event of each instance from stategate over MQTT and checks that its
/// final output is recorded exactly once and no step's result more than once (none twice).
/// A step's result that is not there at all is returned in `missing`: see finding 10 in the
/// module docs.
pub async fn assert_recorded_once(mqtt_port: u16, app: &str, prefix: &str, count: usize, steps: usize) -> Histories {
    let mut mqtt = RawClient::connect(mqtt_port, &unique_id("wf-history")).await;
    let mut found = Histories {
        events: 0,
        missing: Vec::new(),
    };
    for n in 0..count {
        let instance = format!("{prefix}-{n}");
        let base = format!("{app}||dapr.internal.default.{app}.workflow||{instance}||history-");
        let mut history = Vec::new();
        loop {
            let key = format!("{base}{:06}", history.len());
            let got = mqtt.request(&[b"GET", key.as_bytes()], &[]).await;
            // A bulk string `$<len>` is a stored value; anything else (the null) ends the history.
            if !got.payload.starts_with(b"$") || got.payload.starts_with(b"$-1") {
                break;
            }
            history.push(got.payload.to_vec());
        }
        let carrying = |mark: &str| {
            let mark = mark.as_bytes();
            history
                .iter()
                .filter(|e| e.windows(mark.len()).any(|w| w == mark))
                .count()
        };
        assert_eq!(
            carrying(&format!("\"done:{instance}\"")),
            1,
            "{instance}: one event carries the workflow's output ({} events)",
            history.len()
        );
        for i in 0..steps {
            let times = carrying(&format!("\"r{i}:{instance}\""));
            assert!(
                times <= 1,
                "{instance}: {times} events carry step {i}'s result ({} events)",
                history.len()
            );
            if times == 0 {
                found.missing.push(format!("{instance}: step {i}"));
            }
        }
        found.events += history.len();
    }
    found
}

/// What a fault test does at the strike.
enum Fault {
    Stategate,
    Daprd,
}

/// [`workflows`] workflows through daprd on `stategate` (its socket in `sockets`, the folder
/// daprd reads); `fault` strikes once a third of the activities ran; then every instance must
/// complete once. `history_port`: the MQTT port to read the history from afterwards.
async fn workflows_survive(
    fault: Fault,
    stategate: &mut StategateProc,
    sockets: &Path,
    history_port: impl Fn(&StategateProc) -> u16,
) {
    let python = crate::grpc::dapr_sdk_python().await;
    let mut dapr = Dapr::start(APP, sockets).await;
    let prefix = unique_id("wf");
    let count = workflows();
    let mut app = start_app(dapr.ports, &prefix, count, STEPS, 0, &python, &[]);
    let started = Instant::now();
    // The fault strikes once a third of the activities ran.
    let strike_after = count * STEPS / 3;
    app.wait_for_lines("activities to strike after", strike_after, RUN_LIMIT, |l| {
        l.starts_with("RAN ")
    })
    .await;
    let struck = started.elapsed();
    match fault {
        Fault::Stategate => stategate.kill_and_restart().await,
        Fault::Daprd => {
            dapr.daprd.kill().await;
            dapr.daprd = Daprd::start_on(&dapr.options, dapr.ports).await;
        }
    }
    let result = app_result(&mut app, RUN_LIMIT, || {
        format!("{}\n--- stategate:\n{}", dapr.output(), tail(&stategate.output(), 80))
    })
    .await;
    println!(
        "{count} workflows x {STEPS} activities, struck after {struck:?}, all ended after {:?}: {result}",
        started.elapsed()
    );
    assert_eq!(result["completed"], count, "{result}\n{}", dapr.output());
    assert_eq!(result["never_ran"], 0, "{result}");
    let found = assert_recorded_once(history_port(stategate), APP, &prefix, count, STEPS).await;
    println!(
        "history: {} events, no result recorded twice; results missing from a completed workflow's history: {:?}",
        found.events, found.missing
    );
    if std::env::var_os("STATEGATE_WF_FAULTS_FULL_HISTORY").is_some() {
        let out = dapr.output();
        let about: Vec<&str> = out
            .lines()
            .filter(|l| {
                found
                    .missing
                    .iter()
                    .any(|m| l.contains(m.split(':').next().unwrap_or(m)))
            })
            .collect();
        assert!(
            found.missing.is_empty(),
            "finding 10: {:?}; daprd's lines about them:\n{}",
            found.missing,
            about.join("\n")
        );
    }
    app.terminate(Duration::from_secs(10)).await;
    dapr.stop().await;
}

fn socket_in(dir: &Path) -> PathBuf {
    dir.join("stategate.sock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_complete_once_across_kill_9_of_durable_stategate() {
    let sockets = tempfile::tempdir().expect("tempdir");
    let data = tempfile::tempdir().expect("tempdir");
    let mut stategate = StategateProc::start("durable", data.path(), &socket_in(sockets.path())).await;
    workflows_survive(Fault::Stategate, &mut stategate, sockets.path(), |s| s.mqtt_port).await;
    stategate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_complete_once_across_kill_9_of_daprd() {
    let sockets = tempfile::tempdir().expect("tempdir");
    let data = tempfile::tempdir().expect("tempdir");
    let mut stategate = StategateProc::start("durable", data.path(), &socket_in(sockets.path())).await;
    workflows_survive(Fault::Daprd, &mut stategate, sockets.path(), |s| s.mqtt_port).await;
    stategate.stop().await;
}

/// The Kubernetes shape: each app pod runs its own stategate sidecar (daprd reaches a
/// component only through a socket in its pod), all sidecars on one Redis. This pod's sidecar
/// is killed and restarted (what the kubelet does to a crashed container); another pod's
/// sidecar keeps serving the same keys, and the test reads the history through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_complete_once_across_kill_9_of_a_redis_replica() {
    let redis = crate::redis::server::TestServer::start(crate::redis::server::Flavor::Redis);
    let (pod_a, pod_b) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let mut this_pod = StategateProc::start(&redis.url(), pod_a.path(), &socket_in(pod_a.path())).await;
    let other_pod = StategateProc::start(&redis.url(), pod_b.path(), &socket_in(pod_b.path())).await;
    let other_port = other_pod.mqtt_port;
    workflows_survive(Fault::Stategate, &mut this_pod, pod_a.path(), |_| other_port).await;
    this_pod.stop().await;
    other_pod.stop().await;
}
