//! The processes of one row of the workflows benchmark, each on free loopback ports and killed
//! when dropped: placement, the scheduler, daprd with an app port, the Go load generator (the
//! app), and the store behind daprd (stategate's binary, redis-server, PostgreSQL, the floor
//! component).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::procs::{Redis, RedisPersistence, free_port};

/// Placement, the scheduler and daprd start in seconds; a minute means one is stuck.
const START: Duration = Duration::from_secs(60);
/// Lines of a child's output kept for the failure message.
const KEEP_LINES: usize = 300;

/// A child process whose output lines arrive on a channel (and are kept for failure
/// messages); killed and reaped on drop.
pub struct Proc {
    name: String,
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    kept: Vec<String>,
    stdin: Option<ChildStdin>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, piped_stdin: bool) -> Proc {
        let mut child = cmd
            .stdin(if piped_stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {cmd:?}: {e}"));
        let (tx, lines) = mpsc::channel();
        let out: Vec<Box<dyn std::io::Read + Send>> = vec![
            Box::new(child.stdout.take().expect("stdout")),
            Box::new(child.stderr.take().expect("stderr")),
        ];
        for stream in out {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        let stdin = child.stdin.take();
        Proc {
            name: name.to_owned(),
            child,
            lines,
            kept: Vec::new(),
            stdin,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Takes the lines printed so far without waiting (a chatty child's pipe must not fill).
    pub fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.keep(line);
        }
    }

    fn keep(&mut self, line: String) {
        if self.kept.len() == KEEP_LINES {
            self.kept.remove(0);
        }
        self.kept.push(line);
    }

    /// Waits for a line satisfying `pred` and returns it; panics with the output when `limit`
    /// passes or the process ends first.
    pub fn wait_for(&mut self, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.min(Duration::from_secs(1))) {
                Ok(line) => {
                    let hit = pred(&line);
                    self.keep(line.clone());
                    if hit {
                        return line;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{}: ended before {what}; output:\n{}", self.name, self.output())
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        self.drain();
                        panic!(
                            "{}: exited ({status}) before {what}; output:\n{}",
                            self.name,
                            self.output()
                        );
                    }
                    if left.is_zero() {
                        panic!("{}: no {what} within {limit:?}; output:\n{}", self.name, self.output());
                    }
                }
            }
        }
    }

    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("a piped stdin");
        writeln!(stdin, "{line}").unwrap_or_else(|e| panic!("{}: write {line:?}: {e}", self.name));
        stdin.flush().expect("flush stdin");
    }

    pub fn output(&self) -> String {
        self.kept.join("\n")
    }
}

fn dapr_dir() -> PathBuf {
    super::procs::daprd_binary()
        .parent()
        .expect("daprd's folder")
        .to_owned()
}

/// Dapr's placement service (in-memory raft).
pub fn placement() -> (Proc, u16) {
    let port = free_port();
    let mut p = Proc::spawn(
        "placement",
        Command::new(dapr_dir().join("placement"))
            .arg("--port")
            .arg(port.to_string())
            .args(["--listen-address", "127.0.0.1"])
            .arg("--healthz-port")
            .arg(free_port().to_string())
            .args(["--healthz-listen-address", "127.0.0.1"])
            .arg("--initial-cluster")
            .arg(format!("dapr-placement-0=127.0.0.1:{}", free_port()))
            .args(["--enable-metrics=false", "--log-level", "info"]),
        false,
    );
    p.wait_for("placement's leadership", START, |l| {
        l.contains("has acquired leadership")
    });
    (p, port)
}

/// Dapr's scheduler (workflow timers and reminders) with its embedded etcd in `data`.
pub fn scheduler(data: &Path) -> (Proc, u16) {
    let port = free_port();
    let mut p = Proc::spawn(
        "scheduler",
        Command::new(dapr_dir().join("scheduler"))
            .arg("--port")
            .arg(port.to_string())
            .args(["--listen-address", "127.0.0.1"])
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
        false,
    );
    p.wait_for("the scheduler's \"Cron is ready\"", START, |l| {
        l.contains("Cron is ready")
    });
    (p, port)
}

/// The Go load generator (`daprload.test`, built by `scripts/go-peers`), which is also the
/// app daprd serves: it listens on `app_port` at once and reads its jobs from stdin.
pub fn load_generator(grpc: u16, http: u16, app_port: u16, job_timeout: u64) -> Proc {
    let dir = std::env::var_os("STATEGATE_GO_BIN")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/stategate-go/bin")))
        .unwrap_or_default();
    let bin = dir.join("daprload.test");
    if !bin.is_file() {
        eprintln!(
            "{} is missing: build it with ./scripts/go-peers (or set STATEGATE_GO_BIN)",
            bin.display()
        );
        std::process::exit(2);
    }
    let mut p = Proc::spawn(
        "daprload",
        Command::new(bin)
            .args(["-test.run", "^TestLoad$", "-test.timeout", "0"])
            .env("DAPR_GRPC_PORT", grpc.to_string())
            .env("DAPR_HTTP_PORT", http.to_string())
            .env("LOAD_APP_PORT", app_port.to_string())
            .env("LOAD_JOBS", "-")
            .env("LOAD_JOB_TIMEOUT", job_timeout.to_string())
            .env_remove("DAPR_API_TOKEN"),
        true,
    );
    p.wait_for("the app's \"LISTENING\"", START, |l| l == "LISTENING");
    p
}

/// daprd for the app `app_id` with its actors' and workflows' state in the `statestore` of
/// `resources`, on the given API ports.
pub fn daprd(
    app_id: &str,
    resources: &Path,
    sockets: &Path,
    ports: (u16, u16),
    placement: u16,
    scheduler: u16,
    app_port: u16,
) -> Proc {
    let (grpc, http) = ports;
    let mut p = Proc::spawn(
        "daprd",
        Command::new(super::procs::daprd_binary())
            .env("DAPR_COMPONENTS_SOCKETS_FOLDER", sockets)
            .env_remove("DAPR_API_TOKEN")
            .args(["--app-id", app_id])
            .arg("--resources-path")
            .arg(resources)
            .args(["--dapr-listen-addresses", "127.0.0.1"])
            .arg("--dapr-http-port")
            .arg(http.to_string())
            .arg("--dapr-grpc-port")
            .arg(grpc.to_string())
            .arg("--dapr-internal-grpc-port")
            .arg(free_port().to_string())
            .args(["--dapr-internal-grpc-listen-address", "127.0.0.1"])
            .arg("--dapr-public-port")
            .arg(free_port().to_string())
            .args(["--dapr-public-listen-address", "127.0.0.1"])
            .arg("--placement-host-address")
            .arg(format!("127.0.0.1:{placement}"))
            .arg("--scheduler-host-address")
            .arg(format!("127.0.0.1:{scheduler}"))
            .arg("--app-port")
            .arg(app_port.to_string())
            .args(["--app-channel-address", "127.0.0.1"])
            .args(["--enable-metrics=false", "--log-level", "warn"]),
        false,
    );
    p.drain();
    p
}

/// The store behind daprd, with the resources folder daprd reads its `statestore` from.
pub struct Store {
    pub pid: u32,
    /// The process's children count too (PostgreSQL's backends).
    pub tree: bool,
    pub resources: tempfile::TempDir,
    pub sockets: tempfile::TempDir,
    /// stategate's HTTP door, for its `/metrics`.
    pub metrics: Option<u16>,
    _keep: Keep,
}

/// What keeps the store running: held, never read (dropping it ends the processes).
#[allow(dead_code)]
enum Keep {
    Proc(Proc, Option<tempfile::TempDir>),
    Redis(Redis),
}

/// A component file naming `statestore` as the actor state store.
fn component(kind: &str, version: &str, metadata: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut yaml = format!(
        "apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: statestore\nspec:\n  type: {kind}\n  \
         version: {version}\n  metadata:\n    - name: actorStateStore\n      value: \"true\"\n"
    );
    for (k, v) in metadata {
        yaml.push_str(&format!("    - name: {k}\n      value: \"{v}\"\n"));
    }
    std::fs::write(dir.path().join("statestore.yaml"), yaml).expect("write the component file");
    dir
}

/// stategate's binary of this build serving the component socket (memory, or durable storage
/// with fsync always), as its own process.
pub fn stategate(durable: bool) -> Store {
    let sockets = tempfile::tempdir().expect("tempdir");
    let http = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stategate"));
    cmd.arg("--dapr-component-socket")
        .arg(sockets.path().join("stategate.sock"))
        .arg("--http-listen")
        .arg(format!("127.0.0.1:{http}"))
        .arg("--mqtt-listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .args(["--grpc-listen", "off", "--no-ui", "--log-level", "warn"]);
    let data = durable.then(|| tempfile::tempdir().expect("tempdir"));
    match &data {
        Some(d) => cmd
            .args(["--storage", "durable", "--fsync", "always", "--data-dir"])
            .arg(d.path()),
        None => cmd.args(["--storage", "memory"]),
    };
    let mut p = Proc::spawn("stategate", &mut cmd, false);
    wait_for_socket(&mut p, &sockets.path().join("stategate.sock"));
    Store {
        pid: p.pid(),
        tree: false,
        resources: deploy_copy(),
        sockets,
        metrics: Some(http),
        _keep: Keep::Proc(p, data),
    }
}

/// The floor component (`floor.rs`): this bench's own executable re-run with `--serve-floor`,
/// as a process of its own, behind a component file of type `state.floor`.
pub fn floor() -> Store {
    let sockets = tempfile::tempdir().expect("tempdir");
    let socket = sockets.path().join("floor.sock");
    let exe = std::env::current_exe().expect("the bench's own executable");
    let mut p = Proc::spawn("floor", Command::new(exe).arg("--serve-floor").arg(&socket), false);
    wait_for_socket(&mut p, &socket);
    Store {
        pid: p.pid(),
        tree: false,
        resources: component("state.floor", "v1", &[]),
        sockets,
        metrics: None,
        _keep: Keep::Proc(p, None),
    }
}

/// Waits for a component process's socket to appear (nothing to await: the file is the event).
fn wait_for_socket(p: &mut Proc, socket: &Path) {
    let deadline = Instant::now() + START;
    while !socket.exists() {
        p.drain();
        assert!(
            Instant::now() < deadline,
            "{} did not appear:\n{}",
            socket.display(),
            p.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// deploy/dapr's component file, as a user deploys it, in a folder of its own.
fn deploy_copy() -> tempfile::TempDir {
    let root = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        Path::new(&root).join("deploy/dapr/statestore.yaml"),
        dir.path().join("statestore.yaml"),
    )
    .expect("copy deploy/dapr/statestore.yaml");
    dir
}

/// redis-server behind Dapr's `state.redis`.
pub fn redis(persistence: RedisPersistence) -> Store {
    let r = Redis::start(persistence);
    Store {
        pid: r.pid(),
        tree: false,
        resources: component(
            "state.redis",
            "v1",
            &[
                ("redisHost", format!("127.0.0.1:{}", r.port)),
                ("redisPassword", String::new()),
            ],
        ),
        sockets: tempfile::tempdir().expect("tempdir"),
        metrics: None,
        _keep: Keep::Redis(r),
    }
}

/// PostgreSQL 15 (its defaults: fsync on, synchronous_commit on) run as `nobody` (initdb and
/// postgres refuse root) behind Dapr's `state.postgresql` v2.
pub fn postgres() -> Store {
    let bin = ["/usr/lib/postgresql/15/bin", "/usr/local/bin"]
        .iter()
        .map(Path::new)
        .find(|d| d.join("postgres").is_file())
        .unwrap_or_else(|| {
            eprintln!("PostgreSQL 15 not found in /usr/lib/postgresql/15/bin: apt-get install postgresql-15");
            std::process::exit(2);
        });
    let dir = tempfile::tempdir().expect("tempdir");
    // `nobody` owns the folder; setpriv execs (runuser would stay between us and postgres).
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).expect("chown the data folder");
    let as_nobody = |prog: &Path| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(prog);
        c
    };
    let data = dir.path().join("data");
    let out = as_nobody(&bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .output()
        .expect("run initdb");
    assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
    let port = free_port();
    let mut p = Proc::spawn(
        "postgres",
        as_nobody(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args(["-c", "max_connections=200"]),
        false,
    );
    p.wait_for("\"ready to accept connections\"", START, |l| {
        l.contains("ready to accept connections")
    });
    Store {
        pid: p.pid(),
        tree: true,
        resources: component(
            "state.postgresql",
            "v2",
            &[(
                "connectionString",
                format!("host=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=disable"),
            )],
        ),
        sockets: tempfile::tempdir().expect("tempdir"),
        metrics: None,
        _keep: Keep::Proc(p, Some(dir)),
    }
}

/// CPU time in ns of `pid` and, with `tree`, of every process under it.
pub fn cpu_ns(pid: u32, tree: bool) -> u64 {
    use super::cpu::Source;
    let mut total = Source::Process(pid).ns();
    if tree {
        for child in descendants(pid) {
            total += Source::Process(child).ns();
        }
    }
    total
}

fn descendants(root: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.filter_map(Result::ok) {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            // The parent is the second field after the parenthesized command name.
            if let Ok(stat) = std::fs::read_to_string(e.path().join("stat"))
                && let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r)
                && let Some(ppid) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok())
            {
                parents.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// stategate's `/metrics` (Prometheus text) from its HTTP door.
pub fn metrics(port: u16) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("stategate's HTTP door");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("send");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read /metrics");
    body
}
