//! The real Dapr runtime in front of stategate: daprd, placement and scheduler built from
//! dapr's published Go module by `scripts/go-peers` (into `$STATEGATE_DAPR_DIR`), Dapr's own
//! state conformance suite compiled into `$STATEGATE_GO_BIN`, each started here on free
//! loopback ports. A missing binary is a failure that says how to build it, never a skip.

mod actors;
mod conformance;
mod load;
mod outbox;
mod peers;
mod pods;
mod sdk;
mod workflow;
mod workflow_faults;
mod workflow_limits;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::support::free_port;

/// daprd's start (components, actors, placement) is slower than our own servers'.
pub const START: Duration = Duration::from_secs(60);

fn env_dir(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(d) => PathBuf::from(d),
        None => panic!(
            "{var} is not set: run the tests with ./scripts/test, which builds daprd and the Go peers \
             (scripts/go-peers) and exports it"
        ),
    }
}

/// A binary built by `scripts/go-peers`: daprd, placement, scheduler (in `STATEGATE_DAPR_DIR`)
/// or a Go test binary such as `conformance.test` (in `STATEGATE_GO_BIN`).
pub fn go_binary(name: &str) -> PathBuf {
    let var = if name.ends_with(".test") {
        "STATEGATE_GO_BIN"
    } else {
        "STATEGATE_DAPR_DIR"
    };
    let path = env_dir(var).join(name);
    assert!(
        path.is_file(),
        "{} is missing: run ./scripts/go-peers (./scripts/test runs it)",
        path.display()
    );
    path
}

/// The deploy folder whose component file the tests use, as a user would.
pub fn deploy_dapr() -> PathBuf {
    crate::support::repo_path("deploy/dapr")
}

/// A child process whose output (stdout and stderr, interleaved by line) is kept for the
/// failure message and watched for a readiness line.
pub struct Proc {
    name: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    lines: watch::Receiver<usize>,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {cmd:?}: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (count_tx, lines) = watch::channel(0usize);
        let count_tx = Arc::new(count_tx);
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let log = log.clone();
            let count_tx = count_tx.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let n = {
                        let mut log = log.lock().unwrap();
                        log.push(line);
                        log.len()
                    };
                    count_tx.send_replace(n);
                }
            });
        }
        Proc {
            name: name.to_owned(),
            child,
            log,
            lines,
        }
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits until a line of output satisfies `pred` (searching from the start), or fails with
    /// the output when `limit` passes or the process exits first.
    pub async fn wait_for_line(&mut self, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) {
        self.wait_for_lines(what, 1, limit, pred).await;
    }

    /// Waits until `count` lines of output satisfy `pred` (counting from the start), or fails
    /// with the output when `limit` passes, the process exits first, or it closes both its
    /// output pipes (no line can come any more).
    pub async fn wait_for_lines(&mut self, what: &str, count: usize, limit: Duration, pred: impl Fn(&str) -> bool) {
        let deadline = tokio::time::Instant::now() + limit;
        let mut seen = 0;
        let mut found = 0;
        let mut look = |log: &[String], seen: &mut usize| {
            found += log[*seen..].iter().filter(|l| pred(l)).count();
            *seen = log.len();
            found >= count
        };
        loop {
            if look(&self.log.lock().unwrap(), &mut seen) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // The process may have printed the line just before it exited: read what is
                // left, until both readers reach the end of their pipes (every sender gone),
                // bounded in case a grandchild keeps a pipe open, then look once more.
                while let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), self.lines.changed()).await {}
                if look(&self.log.lock().unwrap(), &mut seen) {
                    return;
                }
                panic!(
                    "{}: exited ({status}) before {what}; output:\n{}",
                    self.name,
                    self.output()
                );
            }
            match tokio::time::timeout_at(deadline, self.lines.changed()).await {
                Ok(Ok(())) => {}
                // Both readers reached the end of their pipes (the counter's senders are gone):
                // no line can come any more, and `changed` would answer at once from now on.
                // Look at the last lines, then give the process until the deadline to exit.
                Ok(Err(_)) => {
                    if look(&self.log.lock().unwrap(), &mut seen) {
                        return;
                    }
                    let exit = match tokio::time::timeout_at(deadline, self.child.wait()).await {
                        Ok(status) => format!("then exited ({status:?})"),
                        Err(_) => format!("and still runs after {limit:?}"),
                    };
                    panic!(
                        "{}: closed its output before {what} {exit}; output:\n{}",
                        self.name,
                        self.output()
                    );
                }
                Err(_) => panic!("{}: no {what} within {limit:?}; output:\n{}", self.name, self.output()),
            }
        }
    }

    /// Ends the process (SIGKILL) and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Asks the process to stop (SIGTERM) and waits for it up to `limit`, then kills it.
    pub async fn terminate(&mut self, limit: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
        if tokio::time::timeout(limit, self.child.wait()).await.is_err() {
            self.kill().await;
        }
    }
}

/// Dapr's actor placement service on free ports (in-memory raft, no TLS, no metrics).
pub struct Placement {
    pub port: u16,
    proc: Proc,
}

impl Placement {
    pub async fn start() -> Placement {
        let port = free_port();
        let raft = free_port();
        let healthz = free_port();
        let mut proc = Proc::spawn(
            "placement",
            Command::new(go_binary("placement"))
                .arg("--port")
                .arg(port.to_string())
                .args(["--listen-address", "127.0.0.1"])
                .arg("--healthz-port")
                .arg(healthz.to_string())
                .args(["--healthz-listen-address", "127.0.0.1"])
                .arg("--initial-cluster")
                .arg(format!("dapr-placement-0=127.0.0.1:{raft}"))
                .args(["--enable-metrics=false", "--log-level", "info"]),
        );
        // 1.18 says "Node id=dapr-placement-0 has acquired leadership"; older releases said
        // "cluster leadership acquired".
        proc.wait_for_line("placement's leadership", START, |l| {
            l.contains("has acquired leadership") || l.contains("cluster leadership acquired")
        })
        .await;
        Placement { port, proc }
    }

    pub fn output(&self) -> String {
        self.proc.output()
    }
}

/// Dapr's scheduler service (reminders, and the timers workflows run on) with its embedded
/// etcd in `data`, every port free: its defaults (50006, 8080, 2379, 2380, 9090) are fixed.
pub struct Scheduler {
    pub port: u16,
    proc: Proc,
}

impl Scheduler {
    pub async fn start(data: &Path) -> Scheduler {
        let port = free_port();
        let mut proc = Proc::spawn(
            "scheduler",
            Command::new(go_binary("scheduler"))
                .arg("--port")
                .arg(port.to_string())
                .args(["--listen-address", "127.0.0.1"])
                // What the scheduler tells daprd to dial (its own guess is the host name).
                .arg("--override-broadcast-host-port")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--healthz-port")
                .arg(free_port().to_string())
                .args(["--healthz-listen-address", "127.0.0.1"])
                .arg("--etcd-client-port")
                .arg(free_port().to_string())
                .args(["--etcd-client-listen-address", "127.0.0.1"])
                .arg("--etcd-initial-cluster")
                .arg(format!("dapr-scheduler-server-0=http://127.0.0.1:{}", free_port()))
                .arg("--etcd-data-dir")
                .arg(data)
                .args(["--enable-metrics=false", "--log-level", "info"]),
        );
        // The cron engine answers once etcd is up and this node leads its partitions.
        proc.wait_for_line("the scheduler's \"Cron is ready\"", START, |l| {
            l.contains("Cron is ready")
        })
        .await;
        Scheduler { port, proc }
    }

    pub fn output(&self) -> String {
        self.proc.output()
    }
}

/// What a daprd is started with.
pub struct DaprdOptions {
    pub app_id: String,
    /// The folder daprd finds pluggable component sockets in (`DAPR_COMPONENTS_SOCKETS_FOLDER`).
    pub sockets: PathBuf,
    /// The resources path holding the component files (`--resources-path`).
    pub resources: PathBuf,
    pub placement: Option<u16>,
    pub scheduler: Option<u16>,
    /// The application's port, for actors (and workflows).
    pub app_port: Option<u16>,
}

impl DaprdOptions {
    /// daprd for the state API alone: the component files of deploy/dapr, no placement,
    /// scheduler or app.
    pub fn state(app_id: &str, sockets: &Path) -> DaprdOptions {
        DaprdOptions {
            app_id: app_id.into(),
            sockets: sockets.to_owned(),
            resources: deploy_dapr(),
            placement: None,
            scheduler: None,
            app_port: None,
        }
    }
}

/// daprd's API ports, chosen before it starts when the app must know them first (an actor
/// app calls back into daprd's HTTP port, and daprd waits for the app's port at its start).
#[derive(Debug, Clone, Copy)]
pub struct DaprdPorts {
    pub http: u16,
    pub grpc: u16,
}

impl DaprdPorts {
    pub fn free() -> DaprdPorts {
        DaprdPorts {
            http: free_port(),
            grpc: free_port(),
        }
    }
}

/// A daprd sidecar on free loopback ports.
pub struct Daprd {
    pub http_port: u16,
    pub grpc_port: u16,
    proc: Proc,
}

impl Daprd {
    pub async fn start(o: &DaprdOptions) -> Daprd {
        Daprd::start_on(o, DaprdPorts::free()).await
    }

    pub async fn start_on(o: &DaprdOptions, ports: DaprdPorts) -> Daprd {
        let DaprdPorts {
            http: http_port,
            grpc: grpc_port,
        } = ports;
        let internal = free_port();
        let mut cmd = Command::new(go_binary("daprd"));
        cmd.env("DAPR_COMPONENTS_SOCKETS_FOLDER", &o.sockets)
            .env_remove("DAPR_API_TOKEN")
            .args(["--app-id", &o.app_id])
            .arg("--resources-path")
            .arg(&o.resources)
            .args(["--dapr-listen-addresses", "127.0.0.1"])
            .arg("--dapr-http-port")
            .arg(http_port.to_string())
            .arg("--dapr-grpc-port")
            .arg(grpc_port.to_string())
            .arg("--dapr-internal-grpc-port")
            .arg(internal.to_string())
            .args(["--dapr-internal-grpc-listen-address", "127.0.0.1"])
            .arg("--enable-metrics=false")
            // STATEGATE_DAPRD_LOG_LEVEL=debug: daprd's own account, for an investigation.
            .arg("--log-level")
            .arg(std::env::var("STATEGATE_DAPRD_LOG_LEVEL").unwrap_or_else(|_| "info".into()));
        if let Some(p) = o.placement {
            cmd.arg("--placement-host-address").arg(format!("127.0.0.1:{p}"));
        }
        if let Some(p) = o.scheduler {
            cmd.arg("--scheduler-host-address").arg(format!("127.0.0.1:{p}"));
        }
        if let Some(p) = o.app_port {
            cmd.arg("--app-port").arg(p.to_string());
            cmd.args(["--app-channel-address", "127.0.0.1"]);
        }
        let mut proc = Proc::spawn("daprd", &mut cmd);
        proc.wait_for_line("\"dapr initialized\"", START, |l| {
            l.contains("dapr initialized. Status: Running")
        })
        .await;
        let mut daprd = Daprd {
            http_port,
            grpc_port,
            proc,
        };
        // daprd logs "initialized" just before a fatal exit too (a component it cannot load):
        // its health route answering 204 is the proof it serves.
        daprd.wait_healthy().await;
        daprd
    }

    /// Polls `/v1.0/healthz` until 204 (daprd has no event for it), failing if daprd exits.
    async fn wait_healthy(&mut self) {
        let url = format!("{}/v1.0/healthz", self.http());
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + START;
        loop {
            if let Ok(r) = client.get(&url).timeout(Duration::from_secs(2)).send().await
                && r.status() == reqwest::StatusCode::NO_CONTENT
            {
                return;
            }
            if let Ok(Some(status)) = self.proc.child.try_wait() {
                panic!("daprd exited ({status}) after starting; output:\n{}", self.output());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "daprd's health route did not answer 204 within {START:?}; output:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn http(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Waits for a line of daprd's log (from its start), as [`Proc::wait_for_line`].
    pub async fn wait_for_line(&mut self, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) {
        self.proc.wait_for_line(what, limit, pred).await
    }

    pub async fn stop(mut self) {
        self.proc.terminate(Duration::from_secs(10)).await;
    }

    /// `kill -9`: none of daprd's shutdown code runs.
    pub async fn kill(&mut self) {
        self.proc.kill().await;
    }
}

/// A process that closes both its output pipes and lives on: waiting for a line ends at its
/// limit, saying so (the wait once spun on the closed pipes, never yielding, until the process
/// exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_line_ends_when_both_pipes_close() {
    let mut proc = Proc::spawn(
        "sh",
        Command::new("sh").args(["-c", "echo started; exec >&- 2>&-; exec sleep 30"]),
    );
    let waiting = tokio::spawn(async move {
        proc.wait_for_line("a line that never comes", Duration::from_millis(500), |l| l == "never")
            .await;
    });
    let ended = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the wait ended at its limit, not when the process exits");
    let panic = ended.expect_err("no such line: the wait fails").into_panic();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("closed its output") && message.contains("still runs") && message.contains("started"),
        "{message}"
    );
}
