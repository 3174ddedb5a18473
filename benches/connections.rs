//! Connections: what one connected MQTT client costs the broker's process, stategate's embedded
//! broker next to Mosquitto in the same run (issue 30, docs/performance.md).
//!
//! ```text
//! cargo bench --bench connections -- [--clients 10000] [--keynotify] [--idle-secs 10]
//! ```
//!
//! For each broker: start it (the stategate binary with its embedded broker and memory storage;
//! Mosquitto 2 with a minimal configuration), read its resident set (VmRSS), open `--clients`
//! MQTT 5 clients that each CONNECT (keep-alive off) and SUBSCRIBE to a topic of their own and,
//! with `--keynotify`, register one key with KEYNOTIFY through the state store (stategate only:
//! Mosquitto gets the subscription alone), wait for every answer, read the resident set again,
//! and the CPU time the process used over `--idle-secs` with every client connected and idle.
//! Prints bytes per client and idle CPU (% of one core), and stategate's ratio to Mosquitto.
//! The clients are raw sockets with hand-encoded packets, so the load generator's own memory
//! does not blur the figure; one process holds them, so `--clients` stays under the open-file
//! limit (`ulimit -n`, 20,000 here) with room for the broker's side.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// The packets, by hand (the integration tests' encoder): a few bytes each, so a client costs
// this process nothing.
#[allow(dead_code)]
#[path = "../tests/it/mqtt_raw.rs"]
mod raw;

struct Opts {
    clients: usize,
    keynotify: bool,
    idle: Duration,
}

fn opts() -> Opts {
    let mut o = Opts {
        clients: 10_000,
        keynotify: false,
        idle: Duration::from_secs(10),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--clients" => o.clients = args.next().and_then(|v| v.parse().ok()).expect("--clients N"),
            "--keynotify" => o.keynotify = true,
            "--idle-secs" => {
                o.idle = Duration::from_secs(args.next().and_then(|v| v.parse().ok()).expect("--idle-secs N"))
            }
            // cargo bench passes --bench.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A broker process, killed when dropped.
struct Broker {
    name: &'static str,
    child: Child,
    port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_accepting(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the broker on {port} did not start");
        // Polling a child process's port: there is no event to await.
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stategate(clients: usize) -> Broker {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_stategate"))
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
    }
}

fn mosquitto() -> Broker {
    let bin = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("Mosquitto is the anchor of this benchmark: install it (scripts/test does)");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_connections -1\n"),
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
    }
}

fn rss_bytes(pid: u32) -> u64 {
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
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

const INVOKE: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// Reads one packet: its first byte and body.
fn read_packet(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
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

/// One client, connected and subscribed (and registered), its answers read and acknowledged.
fn client(port: u16, n: usize, keynotify_too: bool) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let id = format!("bench-{n}");
    s.write_all(&raw::connect_keep_alive(&id, 0, None)).unwrap();
    let (t, body) = read_packet(&mut s).expect("CONNACK");
    assert!(t == 0x20 && body.get(1) == Some(&0), "CONNACK refused: {body:?}");
    let answers = format!("clients/{id}/answers");
    s.write_all(&raw::subscribe(1, &answers)).unwrap();
    let (t, _) = read_packet(&mut s).expect("SUBACK");
    assert_eq!(t, 0x90, "SUBACK");
    if keynotify_too {
        let key = format!("key-{n}");
        let keynotify = format!("*2\r\n$9\r\nKEYNOTIFY\r\n${}\r\n{key}\r\n", key.len());
        s.write_all(&raw::request(INVOKE, 2, &answers, b"kn", keynotify.as_bytes()))
            .unwrap();
        // The PUBACK of the request and the answer (QoS 1, acknowledged so that nothing waits
        // in the broker for this client), in either order.
        let mut answered = false;
        let mut acked = false;
        while !(answered && acked) {
            let (t, body) = read_packet(&mut s).expect("the KEYNOTIFY answer");
            match t >> 4 {
                4 => acked = true,
                3 => {
                    let topic_len = u16::from_be_bytes([body[0], body[1]]) as usize;
                    if t & 0x06 != 0 {
                        let pid = [body[2 + topic_len], body[3 + topic_len]];
                        s.write_all(&[0x40, 2, pid[0], pid[1]]).unwrap();
                    }
                    assert!(body.ends_with(b"+OK\r\n"), "KEYNOTIFY refused: {body:?}");
                    answered = true;
                }
                _ => {}
            }
        }
    }
    s
}

struct Row {
    name: &'static str,
    per_client: f64,
    idle_cpu: f64,
}

fn measure(b: &Broker, o: &Opts) -> Row {
    let pid = b.child.id();
    // Let the process settle after its start.
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_bytes(pid);
    let keynotify_too = o.keynotify && b.name == "stategate";
    let started = Instant::now();
    // A few threads open the clients: the connect round trips dominate, not this process.
    let threads = 4;
    let per = o.clients.div_ceil(threads);
    let port = b.port;
    let held: Vec<TcpStream> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    (t * per..((t + 1) * per).min(o.clients))
                        .map(|n| client(port, n, keynotify_too))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let opened = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let after = rss_bytes(pid);
    let t0 = cpu_ticks(pid);
    std::thread::sleep(o.idle);
    let ticks = cpu_ticks(pid) - t0;
    let idle_cpu = ticks as f64 / o.idle.as_secs_f64(); // ticks per second = % of a core
    let per_client = after.saturating_sub(before) as f64 / held.len() as f64;
    println!(
        "{:<10} {:>6} clients in {:>5.1} s  resident {:>7.1} -> {:>7.1} MiB  {:>8.0} bytes/client  idle CPU {:>5.1} % of a core",
        b.name,
        held.len(),
        opened.as_secs_f64(),
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
        per_client,
        idle_cpu
    );
    drop(held);
    Row {
        name: b.name,
        per_client,
        idle_cpu,
    }
}

fn main() {
    let o = opts();
    println!(
        "== Connections: {} idle MQTT 5 clients, each subscribed{}; resident memory per client",
        o.clients,
        if o.keynotify {
            " (and, on stategate, one KEYNOTIFY)"
        } else {
            ""
        }
    );
    let m = measure(&mosquitto(), &o);
    let s = measure(&stategate(o.clients), &o);
    println!(
        "{} / {}: {:.1}x the memory per client ({:.0} vs {:.0} bytes), idle CPU {:.1} vs {:.1} %",
        s.name,
        m.name,
        s.per_client / m.per_client.max(1.0),
        s.per_client,
        m.per_client,
        s.idle_cpu,
        m.idle_cpu
    );
}
