//! The processes the benchmark runs beside stategate: daprd (built by `scripts/go-peers`) and
//! redis-server, each on free loopback ports and killed when dropped, so an interrupted or
//! failed run leaves nothing behind.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// daprd loads its components and opens its ports in a few seconds; a minute means it is stuck.
const DAPRD_START: Duration = Duration::from_secs(60);
/// Lines of a child's output kept for the failure message.
const KEEP_LINES: usize = 200;

/// Ports below the ephemeral range, never handed out twice (see the file).
#[path = "../../crates/storage/src/redis/ports.rs"]
mod ports;
pub use ports::free_port;

/// A child process killed (and reaped) on drop, with the temporary folder it uses.
pub struct Child {
    child: std::process::Child,
    log: Arc<Mutex<Vec<String>>>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Child {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn output(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

/// Starts `cmd` with its output read line by line (a full pipe would stall the child), kept
/// for failure messages; sends one message on `ready` when a line contains `ready_line`.
fn spawn(cmd: &mut Command, ready_line: &'static str) -> (Child, mpsc::Receiver<()>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let out: Vec<Box<dyn std::io::Read + Send>> = vec![
        Box::new(child.stdout.take().expect("stdout")),
        Box::new(child.stderr.take().expect("stderr")),
    ];
    for stream in out {
        let (log, tx) = (log.clone(), tx.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if line.contains(ready_line) {
                    let _ = tx.send(());
                }
                if let Ok(mut l) = log.lock() {
                    if l.len() == KEEP_LINES {
                        l.remove(0);
                    }
                    l.push(line);
                }
            }
        });
    }
    (Child { child, log, _dir: None }, rx)
}

/// The folder holding daprd: `$STATEGATE_DAPR_DIR`, else where `scripts/go-peers` caches it.
pub fn daprd_binary() -> PathBuf {
    let dir = std::env::var_os("STATEGATE_DAPR_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/stategate-dapr/1.18.3")))
        .unwrap_or_default();
    let bin = dir.join("daprd");
    if !bin.is_file() {
        eprintln!(
            "daprd not found at {}: build it with ./scripts/go-peers (it caches daprd in \
             ~/.cache/stategate-dapr/<version>) or set STATEGATE_DAPR_DIR to the folder holding it",
            bin.display()
        );
        std::process::exit(2);
    }
    bin
}

/// A daprd sidecar serving its gRPC API on a free loopback port.
pub struct Daprd {
    pub grpc_port: u16,
    child: Child,
}

impl Daprd {
    /// Starts daprd for `app_id` with the components in `resources`, finding pluggable
    /// component sockets in `sockets`, and waits until it reports itself running.
    pub fn start(bin: &Path, app_id: &str, resources: &Path, sockets: &Path) -> Daprd {
        let grpc_port = free_port();
        let mut cmd = Command::new(bin);
        cmd.env("DAPR_COMPONENTS_SOCKETS_FOLDER", sockets)
            .env_remove("DAPR_API_TOKEN")
            .args(["--app-id", app_id])
            .arg("--resources-path")
            .arg(resources)
            .args(["--dapr-listen-addresses", "127.0.0.1"])
            .arg("--dapr-http-port")
            .arg(free_port().to_string())
            .arg("--dapr-grpc-port")
            .arg(grpc_port.to_string())
            .arg("--dapr-internal-grpc-port")
            .arg(free_port().to_string())
            .args(["--dapr-internal-grpc-listen-address", "127.0.0.1"])
            // Its health and metadata ports would default to fixed ones (3501, 9090).
            .arg("--dapr-public-port")
            .arg(free_port().to_string())
            .args(["--dapr-public-listen-address", "127.0.0.1"])
            .args(["--enable-metrics=false", "--log-level", "info"]);
        let (child, ready) = spawn(&mut cmd, "dapr initialized. Status: Running");
        if ready.recv_timeout(DAPRD_START).is_err() {
            panic!(
                "daprd ({app_id}) did not report \"dapr initialized\" within {DAPRD_START:?}; output:\n{}",
                child.output()
            );
        }
        Daprd { grpc_port, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Its gRPC API, for the application's requests.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }
}

/// How redis-server keeps what it is sent.
#[derive(Clone, Copy, PartialEq)]
pub enum RedisPersistence {
    /// No RDB snapshots, no append-only file: memory only.
    None,
    /// The append-only file, `fsync` before each reply (Redis groups one event loop's writes).
    AofAlways,
}

/// A redis-server on a free loopback port.
pub struct Redis {
    pub port: u16,
    child: Child,
}

impl Redis {
    pub fn start(persistence: RedisPersistence) -> Redis {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(dir.path());
        match persistence {
            RedisPersistence::None => cmd.args(["--appendonly", "no"]),
            RedisPersistence::AofAlways => cmd.args(["--appendonly", "yes", "--appendfsync", "always"]),
        };
        let (mut child, ready) = spawn(&mut cmd, "Ready to accept connections");
        child._dir = Some(dir);
        if ready.recv_timeout(Duration::from_secs(10)).is_err() {
            panic!(
                "redis-server did not start (is it installed? apt-get install redis-server); output:\n{}",
                child.output()
            );
        }
        // The log line comes just before the listener takes connections on some versions.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        Redis { port, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }
}

/// A resources folder holding one `state.redis` component named `statestore`, the name the
/// stategate component file uses, so the application's calls are the same for both.
pub fn redis_resources(redis_port: u16) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("statestore.yaml"),
        format!(
            "apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: statestore\nspec:\n  \
             type: state.redis\n  version: v1\n  metadata:\n    - name: redisHost\n      value: \
             127.0.0.1:{redis_port}\n    - name: redisPassword\n      value: \"\"\n"
        ),
    )
    .expect("write the redis component file");
    dir
}
