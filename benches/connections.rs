//! Connections: what one connected MQTT client costs the broker's process, stategate's embedded
//! broker next to Mosquitto in the same run (issue 30, docs/performance.md).
//!
//! ```text
//! cargo bench --bench connections -- [--clients 10000] [--keynotify] [--idle-secs 10]
//! cargo bench --bench connections -- --fanout 1,100,1000,10000,19000 [--rounds 20]
//! ```
//!
//! With `--fanout`, it measures how long one change takes to reach N observers instead
//! (`connections/fanout.rs`).
//!
//! Three rows, each with processes of its own: Mosquitto 2 with a minimal configuration (the
//! anchor), the stategate binary with its embedded broker and memory storage, and Mosquitto
//! with stategate behind it on the client path (`--mqtt-url`, the deployment that puts another
//! broker in front of the devices; both processes counted). For each: read the resident set
//! (VmRSS), open `--clients` MQTT 5 clients that each CONNECT (keep-alive off) and SUBSCRIBE to
//! a topic of their own and, with `--keynotify`, register one key with KEYNOTIFY through the
//! state store (Mosquitto alone gets the subscription only), wait for every answer, read the
//! resident set again, then the CPU time used over `--idle-secs` with every client connected
//! and idle. Prints bytes per client and idle CPU (% of one core), and each row's ratio to
//! Mosquitto.
//! The clients are raw sockets with hand-encoded packets, so the load generator's own memory
//! does not blur the figure; one process holds them, so `--clients` stays under the open-file
//! limit (`ulimit -n`, 20,000 here) with room for the broker's side.

use std::net::TcpStream;
use std::time::{Duration, Instant};

// The packets, by hand (the integration tests' encoder): a few bytes each, so a client costs
// this process nothing.
#[path = "connections/fanout.rs"]
mod fanout;
#[path = "connections/procs.rs"]
mod procs;
#[allow(dead_code)]
#[path = "../tests/it/mqtt_raw.rs"]
mod raw;

use procs::{Broker, client, mosquitto, mosquitto_with_stategate, stategate};

struct Opts {
    clients: usize,
    keynotify: bool,
    idle: Duration,
    /// Observer counts of the fan-out rows; empty: measure memory per connection instead.
    fanout: Vec<usize>,
    rounds: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        clients: 10_000,
        keynotify: false,
        idle: Duration::from_secs(10),
        fanout: Vec::new(),
        rounds: 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--clients" => o.clients = args.next().and_then(|v| v.parse().ok()).expect("--clients N"),
            "--keynotify" => o.keynotify = true,
            "--idle-secs" => {
                o.idle = Duration::from_secs(args.next().and_then(|v| v.parse().ok()).expect("--idle-secs N"))
            }
            "--fanout" => {
                o.fanout = args
                    .next()
                    .map(|v| v.split(',').map(|n| n.parse().expect("--fanout N,N,...")).collect())
                    .expect("--fanout N,N,...");
                o.fanout.sort_unstable();
            }
            "--rounds" => o.rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            // cargo bench passes --bench.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

struct Row {
    name: &'static str,
    per_client: f64,
    idle_cpu: f64,
}

fn measure(b: &Broker, o: &Opts) -> Row {
    // Let the processes settle after their start.
    std::thread::sleep(Duration::from_millis(500));
    let before = b.rss();
    let keynotify_too = o.keynotify && b.serves_state_store();
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
                        .map(|n| {
                            let id = format!("bench-{n}");
                            let key = format!("key-{n}");
                            let answers = [format!("clients/{id}/answers")];
                            client(port, &id, &answers, keynotify_too.then_some(key.as_str()))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let opened = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let after = b.rss();
    let t0 = b.cpu_ticks();
    std::thread::sleep(o.idle);
    let ticks = b.cpu_ticks() - t0;
    let idle_cpu = ticks as f64 / o.idle.as_secs_f64(); // ticks per second = % of a core
    let per_client = after.saturating_sub(before) as f64 / held.len() as f64;
    println!(
        "{:<19} {:>6} clients in {:>5.1} s  resident {:>7.1} -> {:>7.1} MiB  {:>8.0} bytes/client  idle CPU {:>5.1} % of a core",
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
    if !o.fanout.is_empty() {
        fanout::run(&o.fanout, o.rounds);
        return;
    }
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
    let embedded = measure(&stategate(o.clients), &o);
    let behind = measure(&mosquitto_with_stategate(), &o);
    for s in [embedded, behind] {
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
}
