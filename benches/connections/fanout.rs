//! Fan-out: how long one change takes to reach every observer (issue 30, docs/performance.md).
//!
//! For each observer count, on each broker, `--rounds` times:
//! - Mosquitto: one QoS 1 PUBLISH to a topic every observer subscribed to (QoS 1), the anchor;
//! - stategate's embedded broker, the same plain PUBLISH (the broker's own fan-out);
//! - stategate: one SET over the state store protocol of a key every observer registered with
//!   KEYNOTIFY (one notification per observer, each to the observer's own topic);
//! - the same SET with the observers on Mosquitto and stategate behind it (`--mqtt-url`): the
//!   notifications leave stategate over its one client connection and Mosquitto routes each.
//!
//! Each figure is the time from the moment the PUBLISH or SET is written to the moment the last
//! observer has read its message, and from the publisher's acknowledgement (PUBACK, or the SET's
//! answer) to that moment. Observers acknowledge each QoS 1 message at once, so the broker never
//! waits on a slow reader. Also printed: the broker process's CPU time per round (the figure that
//! moves to another machine; both processes' when stategate is behind Mosquitto) and per
//! delivered message. Observers are added as the counts grow,
//! so one broker process serves every count.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

use super::procs::{self, Broker, INVOKE};
use super::raw;

const PLAIN_TOPIC: &str = "fanout/plain";
const KEY: &str = "fanout";

/// What one round counts: messages read, and the latest arrival (ns since `base`).
struct Round {
    base: Instant,
    arrived: AtomicUsize,
    last_ns: AtomicU64,
    target: AtomicUsize,
    done: std::sync::Mutex<Option<mpsc::Sender<()>>>,
}

impl Round {
    fn arrive(&self) {
        let now = self.base.elapsed().as_nanos() as u64;
        self.last_ns.fetch_max(now, Ordering::AcqRel);
        let n = self.arrived.fetch_add(1, Ordering::AcqRel) + 1;
        if n == self.target.load(Ordering::Acquire)
            && let Some(tx) = self.done.lock().unwrap().as_ref()
        {
            let _ = tx.send(());
        }
    }
}

/// One observer's reader: acknowledges every QoS 1 PUBLISH and counts it.
async fn observe(stream: TcpStream, round: Arc<Round>) {
    stream.set_nonblocking(true).unwrap();
    let stream = tokio::net::TcpStream::from_std(stream).unwrap();
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::with_capacity(512, read);
    loop {
        let Ok(first) = read.read_u8().await else { return };
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let Ok(b) = read.read_u8().await else { return };
            len |= ((b & 0x7f) as usize) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        if first >> 4 == 3 {
            if first & 0x06 != 0 {
                let topic_len = u16::from_be_bytes([body[0], body[1]]) as usize;
                let pid = [body[2 + topic_len], body[3 + topic_len]];
                if write.write_all(&[0x40, 2, pid[0], pid[1]]).await.is_err() {
                    return;
                }
            }
            round.arrive();
        }
    }
}

/// A SET request: response topic, correlation data and the `__ts` timestamp the state store
/// protocol asks of a write.
fn set_request(payload: &[u8]) -> Vec<u8> {
    static SETS: AtomicUsize = AtomicUsize::new(0);
    let n = SETS.fetch_add(1, Ordering::Relaxed);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // A correlation of its own per SET: a repeated one is a redelivery, answered from the
    // cache without running again.
    let ts = format!("{ms:015}:00000:fanout-publisher");
    raw::request_with(
        INVOKE,
        1,
        "fanout/answers",
        format!("set-{n}").as_bytes(),
        &[("__ts", &ts)],
        payload,
    )
}

/// p50 and p99 (nearest rank) of `v`, in ms.
fn percentiles(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    (at(0.50), at(0.99))
}

/// A row: latency from the send and from the acknowledgement, CPU per round.
struct Figures {
    from_send: (f64, f64),
    from_ack: (f64, f64),
    cpu_ms: f64,
}

/// Where the observers connect.
enum Setup {
    /// Mosquitto alone: the anchor, a plain publish.
    Mosquitto,
    /// stategate's embedded broker: a plain publish and KEYNOTIFY.
    Embedded,
    /// Mosquitto with stategate behind it on the client path: KEYNOTIFY through Mosquitto.
    Behind,
}

/// The publisher's side of one kind of round.
enum Kind {
    Publish,
    Set,
}

/// Runs `rounds` rounds of `kind` from `publisher` to `observers` observers.
fn rounds(
    broker: &Broker,
    publisher: &mut TcpStream,
    kind: &Kind,
    observers: usize,
    rounds: usize,
    round: &Round,
) -> Figures {
    let (mut sends, mut acks) = (Vec::new(), Vec::new());
    let ticks_before = broker.cpu_ticks();
    for r in 0..rounds {
        let (tx, rx) = mpsc::channel();
        round.arrived.store(0, Ordering::Release);
        round.last_ns.store(0, Ordering::Release);
        round.target.store(observers, Ordering::Release);
        *round.done.lock().unwrap() = Some(tx);
        let value = format!("value-{r:010}");
        let packet = match kind {
            Kind::Publish => raw::publish_qos1(PLAIN_TOPIC, 1, &[], value.as_bytes()),
            Kind::Set => {
                let set = format!(
                    "*3\r\n$3\r\nSET\r\n${}\r\n{KEY}\r\n${}\r\n{value}\r\n",
                    KEY.len(),
                    value.len()
                );
                set_request(set.as_bytes())
            }
        };
        let sent = round.base.elapsed().as_nanos() as u64;
        publisher.write_all(&packet).unwrap();
        match kind {
            Kind::Publish => {
                let (t, _) = procs::read_packet(publisher).expect("PUBACK");
                assert_eq!(t >> 4, 4, "PUBACK");
            }
            Kind::Set => {
                let answer = procs::answer(publisher);
                assert!(answer.ends_with(b"+OK\r\n"), "SET refused: {answer:?}");
            }
        }
        let acked = round.base.elapsed().as_nanos() as u64;
        rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
            panic!(
                "{}: {} of {observers} observers got round {r}",
                broker.name,
                round.arrived.load(Ordering::Acquire)
            )
        });
        let last = round.last_ns.load(Ordering::Acquire);
        sends.push(last.saturating_sub(sent) as f64 / 1e6);
        acks.push(last.saturating_sub(acked) as f64 / 1e6);
    }
    let ticks = broker.cpu_ticks() - ticks_before;
    Figures {
        from_send: percentiles(&mut sends),
        from_ack: percentiles(&mut acks),
        cpu_ms: ticks as f64 * 10.0 / rounds as f64,
    }
}

fn print(name: &str, observers: usize, f: &Figures, anchor: Option<&Figures>) {
    let ratio = anchor
        .map(|a| {
            format!(
                "  x{:.2} p50  x{:.2} p99",
                f.from_send.0 / a.from_send.0,
                f.from_send.1 / a.from_send.1
            )
        })
        .unwrap_or_default();
    println!(
        "{name:<22} {observers:>6} observers  from send p50 {:>8.2} p99 {:>8.2} ms  from ack p50 {:>8.2} p99 {:>8.2} ms  CPU {:>7.2} ms/round {:>6.2} us/msg{ratio}",
        f.from_send.0,
        f.from_send.1,
        f.from_ack.0,
        f.from_ack.1,
        f.cpu_ms,
        f.cpu_ms * 1000.0 / observers as f64,
    );
}

/// Runs the fan-out rows for every count in `counts` (ascending) with `n_rounds` rounds each.
pub fn run(counts: &[usize], n_rounds: usize) {
    let max = counts.iter().copied().max().unwrap_or(0);
    println!("== Fan-out: one change to N observers, {n_rounds} rounds per row; times to the last observer");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut anchors = Vec::new();
    for setup in [Setup::Mosquitto, Setup::Embedded, Setup::Behind] {
        let keynotify = !matches!(setup, Setup::Mosquitto);
        let broker = match setup {
            Setup::Mosquitto => procs::mosquitto(),
            Setup::Embedded => procs::stategate(max + 10),
            Setup::Behind => procs::mosquitto_with_stategate(),
        };
        let mut observers = tokio::task::JoinSet::new();
        let round = Arc::new(Round {
            base: Instant::now(),
            arrived: AtomicUsize::new(0),
            last_ns: AtomicU64::new(0),
            target: AtomicUsize::new(usize::MAX),
            done: std::sync::Mutex::new(None),
        });
        let mut publisher = procs::client(broker.port, "fanout-publisher", &["fanout/answers".into()], None);
        let mut connected = 0;
        for (i, &count) in counts.iter().enumerate() {
            while connected < count {
                let id = format!("observer-{connected}");
                let mut topics = vec![format!("clients/{id}/answers"), PLAIN_TOPIC.to_owned()];
                if keynotify {
                    topics.push(format!(
                        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/{}/command/notify/#",
                        hex::encode_upper(id.as_bytes())
                    ));
                }
                let s = procs::client(broker.port, &id, &topics, keynotify.then_some(KEY));
                observers.spawn_on(observe(s, round.clone()), runtime.handle());
                connected += 1;
            }
            match setup {
                Setup::Mosquitto => {
                    let plain = rounds(&broker, &mut publisher, &Kind::Publish, count, n_rounds, &round);
                    print("mosquitto publish", count, &plain, None);
                    anchors.push(plain);
                }
                Setup::Embedded => {
                    let plain = rounds(&broker, &mut publisher, &Kind::Publish, count, n_rounds, &round);
                    print("stategate publish", count, &plain, anchors.get(i));
                    let set = rounds(&broker, &mut publisher, &Kind::Set, count, n_rounds, &round);
                    print("stategate KEYNOTIFY", count, &set, anchors.get(i));
                }
                Setup::Behind => {
                    let set = rounds(&broker, &mut publisher, &Kind::Set, count, n_rounds, &round);
                    print("behind mosquitto KEYN.", count, &set, anchors.get(i));
                }
            }
        }
        // Stop this broker and wait until every observer has read the end of its connection:
        // one process holds all the observers, under the open-file limit, so the next broker's
        // observers open only when these are closed.
        drop(publisher);
        drop(broker);
        runtime.block_on(async { while observers.join_next().await.is_some() {} });
    }
    runtime.shutdown_background();
}
