//! The replicas section's other processes (a Mosquitto and a redis-server on free ports,
//! killed on drop), and what threads this process has.

use std::time::{Duration, Instant};

/// A child process killed on drop, and the directory it uses (removed after).
pub(super) struct Child(std::process::Child, #[allow(dead_code)] Option<tempfile::TempDir>);

impl Child {
    pub(super) fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Ports below the ephemeral range, never handed out twice (see the file).
#[path = "../../crates/storage/src/redis/ports.rs"]
mod ports;
use ports::free_port;

/// Waits until `port` accepts connections (a child process starting: nothing to await).
fn accepts(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

pub(super) fn mosquitto() -> Option<(Child, u16)> {
    let bin = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let dir = tempfile::tempdir().ok()?;
    let port = free_port();
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\nmax_inflight_messages 0\nmax_queued_messages 100000\n"
        ),
    )
    .ok()?;
    let child = std::process::Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let child = Child(child, Some(dir));
    accepts(port).then_some((child, port))
}

/// Without persistence: what a request costs Redis itself (AOF adds its writes, and with
/// `appendfsync always` an fsync per event loop turn).
pub(super) fn redis_server() -> Option<(Child, u16)> {
    let port = free_port();
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let child = Child(child, None);
    accepts(port).then_some((child, port))
}

/// This process's threads by name, `2 load, 2 serve, ...`: what the CPU columns count.
pub(super) fn threads() -> String {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim_end().to_owned())
        .collect();
    names.sort();
    names
        .chunk_by(|a, b| a == b)
        .map(|same| format!("{} {}", same.len(), same[0]))
        .collect::<Vec<_>>()
        .join(", ")
}
