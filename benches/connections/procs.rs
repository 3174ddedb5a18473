//! The connections benchmark's processes and clients: the two brokers, their resident memory
//! and CPU time, and raw MQTT 5 clients.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::raw;

/// Ports below the ephemeral range, never handed out twice (see the file).
#[path = "../../crates/storage/src/redis/ports.rs"]
mod ports;
pub use ports::free_port;
#[path = "../common/ready.rs"]
mod ready;
use ready::{http_ready, until};

/// A broker process, killed when dropped; with `service`, stategate serving the state store
/// through it as a client (`--mqtt-url`), the deployment that puts another broker in front.
pub struct Broker {
    pub name: &'static str,
    pub child: Child,
    pub port: u16,
    _dir: Option<tempfile::TempDir>,
    service: Option<Child>,
}

impl Broker {
    /// The processes whose memory and CPU time the rows count: the broker and, behind it,
    /// stategate.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.child.id())
            .chain(self.service.as_ref().map(Child::id))
            .collect()
    }

    /// Whether its clients reach a state store (stategate, embedded or behind).
    pub fn serves_state_store(&self) -> bool {
        self.name == "stategate" || self.service.is_some()
    }

    /// Resident memory of its processes, summed.
    pub fn rss(&self) -> u64 {
        self.pids().into_iter().map(rss_bytes).sum()
    }

    /// CPU time of its processes, summed, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.pids().into_iter().map(cpu_ticks).sum()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        for child in std::iter::once(&mut self.child).chain(self.service.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn wait_accepting(port: u16) {
    until(&format!("the broker on {port}"), Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// The service binary: STATEGATE_BENCH_BIN names another build (a `--profile profiling` one
/// for perf).
fn stategate_bin() -> std::ffi::OsString {
    std::env::var_os("STATEGATE_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_stategate").into())
}

pub fn stategate(clients: usize) -> Broker {
    let port = free_port();
    let child = Command::new(stategate_bin())
        .args(["--storage", "memory", "--http-listen", "off", "--grpc-listen", "off"])
        .args(["--mqtt-listen", &format!("127.0.0.1:{port}")])
        .args(["--mqtt-max-connections", &(clients + 100).to_string()])
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start stategate");
    wait_accepting(port);
    Broker {
        name: "stategate",
        child,
        port,
        _dir: None,
        service: None,
    }
}

pub fn mosquitto() -> Broker {
    let bin = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("Mosquitto is the anchor of this benchmark: install it (scripts/test does)");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_connections -1\nset_tcp_nodelay true\n"),
    )
    .unwrap();
    let child = Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mosquitto");
    wait_accepting(port);
    Broker {
        name: "mosquitto",
        child,
        port,
        _dir: Some(dir),
        service: None,
    }
}

/// Mosquitto with stategate behind it on the client path (`--mqtt-url`): the devices connect
/// to Mosquitto, and their state store requests and notifications pass through it. Ready once
/// stategate's `/readyz` answers 200, which it does only after it has subscribed.
pub fn mosquitto_with_stategate() -> Broker {
    let mut broker = mosquitto();
    broker.name = "mosquitto+stategate";
    let http = free_port();
    let service = Command::new(stategate_bin())
        .args(["--storage", "memory", "--grpc-listen", "off"])
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--mqtt-url", &format!("mqtt://127.0.0.1:{}", broker.port)])
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start stategate");
    broker.service = Some(service);
    until("stategate behind Mosquitto", Duration::from_secs(30), || {
        http_ready(http)
    });
    broker
}

pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// User plus system CPU time of a process, in clock ticks (100 per second on Linux).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

pub const INVOKE: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// Reads one packet: its first byte and body.
pub fn read_packet(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut first = [0u8; 1];
    s.read_exact(&mut first)?;
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let mut b = [0u8; 1];
        s.read_exact(&mut b)?;
        len |= ((b[0] & 0x7f) as usize) << shift;
        shift += 7;
        if b[0] & 0x80 == 0 {
            break;
        }
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok((first[0], body))
}

/// One client: CONNECT (keep-alive off), SUBSCRIBE to each of `topics` (QoS 1) and, with
/// `keynotify`, register that key with KEYNOTIFY through the state store (its answer to
/// `topics[0]`), every answer read and acknowledged.
pub fn client(port: u16, id: &str, topics: &[String], keynotify: Option<&str>) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&raw::connect_keep_alive(id, 0, None)).unwrap();
    let (t, body) = read_packet(&mut s).expect("CONNACK");
    assert!(t == 0x20 && body.get(1) == Some(&0), "CONNACK refused: {body:?}");
    for (n, topic) in topics.iter().enumerate() {
        s.write_all(&raw::subscribe(n as u16 + 1, topic)).unwrap();
        let (t, body) = read_packet(&mut s).expect("SUBACK");
        assert!(
            t == 0x90 && body.last().is_some_and(|&r| r < 0x80),
            "SUBACK refused: {body:?}"
        );
    }
    if let Some(key) = keynotify {
        let keynotify = format!("*2\r\n$9\r\nKEYNOTIFY\r\n${}\r\n{key}\r\n", key.len());
        // The client id as the AIO SDKs send it (`__srcId`): behind another broker it is how
        // stategate knows whose notification topic to use.
        let request = raw::request_with(INVOKE, 100, &topics[0], b"kn", &[("__srcId", id)], keynotify.as_bytes());
        s.write_all(&request).unwrap();
        let answer = answer(&mut s);
        assert!(answer.ends_with(b"+OK\r\n"), "KEYNOTIFY refused: {answer:?}");
    }
    s
}

/// Reads the PUBACK of a request and its answer (QoS 1, acknowledged so that nothing waits in
/// the broker for this client), in either order; returns the answer's PUBLISH body.
pub fn answer(s: &mut TcpStream) -> Vec<u8> {
    let mut answer = None;
    let mut acked = false;
    while !(answer.is_some() && acked) {
        let (t, body) = read_packet(s).expect("an answer");
        match t >> 4 {
            4 => acked = true,
            3 => {
                let topic_len = u16::from_be_bytes([body[0], body[1]]) as usize;
                if t & 0x06 != 0 {
                    let pid = [body[2 + topic_len], body[3 + topic_len]];
                    s.write_all(&[0x40, 2, pid[0], pid[1]]).unwrap();
                }
                answer = Some(body);
            }
            _ => {}
        }
    }
    answer.unwrap()
}
