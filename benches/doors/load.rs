//! Load shapes and the measured row: a closed loop (N requests always in flight) and an open
//! loop at a fixed rate, each recording latency in an hdrhistogram and the CPU time per
//! request of the serving side and of the load generator over the measured window.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::{Opts, cpu};

pub(crate) fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

/// The serving side: the `serve` runtime (stategate, its embedded broker, the echo responder,
/// the bare servers), the threads stategate spawns itself (`stategate-*`) and the timer thread
/// of its rate limiter (the `governor` crate's, used by rmqtt and stategate's access limits).
const SERVING: [cpu::Source; 3] = [
    cpu::Source::Threads("serve"),
    cpu::Source::Threads("stategate"),
    cpu::Source::Threads("futures-timer"),
];
/// The load generator's runtime.
const LOAD: cpu::Source = cpu::Source::Threads("load");

/// CPU time of each side so far, ns: `(serving, load)`; and of the whole process, to tell how
/// much fell on neither (threads left unnamed, the main thread).
fn cpu_now() -> ((u64, u64), u64) {
    let whole = cpu::Source::Process(std::process::id()).ns();
    ((SERVING.iter().map(cpu::Source::ns).sum(), LOAD.ns()), whole)
}

/// Over every measured window so far: the process's CPU time and the part on neither side, ns.
static WHOLE_NS: AtomicU64 = AtomicU64::new(0);
static NEITHER_NS: AtomicU64 = AtomicU64::new(0);

fn window(before: ((u64, u64), u64), after: ((u64, u64), u64), ops: u64) -> Cpu {
    let whole = after.1.saturating_sub(before.1);
    let sides = after.0.0.saturating_sub(before.0.0) + after.0.1.saturating_sub(before.0.1);
    WHOLE_NS.fetch_add(whole, Ordering::Relaxed);
    NEITHER_NS.fetch_add(whole.saturating_sub(sides), Ordering::Relaxed);
    Cpu::per_request(before.0, after.0, ops)
}

/// The share of the measured windows' CPU time that fell on neither side, if any was measured.
pub(crate) fn neither_share() -> Option<f64> {
    let whole = WHOLE_NS.load(Ordering::Relaxed);
    (whole > 0).then(|| NEITHER_NS.load(Ordering::Relaxed) as f64 / whole as f64)
}

/// CPU time per request of each side of a row, µs.
#[derive(Clone, Copy)]
pub(crate) struct Cpu {
    pub(crate) serve: f64,
    pub(crate) load: f64,
}

impl Cpu {
    fn per_request(before: (u64, u64), after: (u64, u64), ops: u64) -> Cpu {
        let us = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1000.0 / ops.max(1) as f64;
        Cpu {
            serve: us(before.0, after.0),
            load: us(before.1, after.1),
        }
    }
}

/// The serving side's CPU time per second with no load, µs: what every row's serving figure
/// includes besides its requests (the other servers of the section sit idle beside it).
pub(crate) async fn at_rest() -> f64 {
    let before = cpu_now().0.0;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cpu_now().0.0.saturating_sub(before) as f64 / 1000.0 / t0.elapsed().as_secs_f64()
}

pub(crate) fn print_at_rest(us_per_sec: f64) {
    println!(
        "(serving side at rest: {us_per_sec:.0} µs of CPU per second, {:.2} µs/req of each @1000/s row)",
        us_per_sec / 1000.0
    );
}

/// One measured row.
pub(crate) struct Row {
    name: String,
    ops: u64,
    secs: f64,
    h: Histogram<u64>,
    /// None where the serving side does not run on the `serve` runtime (replicas).
    cpu: Option<Cpu>,
}

impl Row {
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    pub(crate) fn ms(&self, q: f64) -> f64 {
        self.h.value_at_quantile(q) as f64 / 1000.0
    }
    pub(crate) fn print(&self, baseline: Option<&Row>) {
        let cpu = self
            .cpu
            .map(|c| format!("  serve {:>6.1}  load {:>6.1} µs/req", c.serve, c.load))
            .unwrap_or_default();
        let ratio = baseline
            .map(|b| {
                let cpu = match (self.cpu, b.cpu) {
                    (Some(s), Some(b)) => format!("  x{:.2} cpu", s.serve / b.serve.max(1e-9)),
                    _ => String::new(),
                };
                format!(
                    "  x{:.2} thr  x{:.2} p50{cpu}",
                    self.rate() / b.rate().max(1e-9),
                    self.ms(0.5) / b.ms(0.5).max(1e-9)
                )
            })
            .unwrap_or_default();
        println!(
            "{:<34} {:>9.0}/s  p50 {:>7.3}  p90 {:>7.3}  p99 {:>7.3}  p99.9 {:>7.3} ms{}{}",
            self.name,
            self.rate(),
            self.ms(0.5),
            self.ms(0.9),
            self.ms(0.99),
            self.ms(0.999),
            cpu,
            ratio
        );
    }
}

/// The run with the median throughput; at a fixed rate every run has the same throughput, so
/// the median p50 decides there instead.
pub(crate) fn median(mut rows: Vec<Row>) -> Row {
    rows.sort_by(|a, b| a.rate().total_cmp(&b.rate()).then(a.ms(0.5).total_cmp(&b.ms(0.5))));
    let mid = rows.len() / 2;
    rows.swap_remove(mid)
}

/// Runs `inflight` closed-loop workers calling `op` for warmup + measured time.
pub(crate) async fn closed_loop<F, Fut>(name: String, inflight: usize, o: &Opts, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let warm_end = Instant::now() + Duration::from_secs(o.warmup);
    let end = warm_end + Duration::from_secs(o.secs);
    let mut tasks = Vec::new();
    for w in 0..inflight {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = hist();
            let mut n = 0u64;
            let mut i = w as u64 * 1_000_003;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                op(i).await;
                i += 1;
                if t0 >= warm_end {
                    let _ = h.record(t0.elapsed().as_micros().max(1) as u64);
                    n += 1;
                }
            }
            (h, n)
        }));
    }
    // The CPU window is the measured window; the requests counted are those sent in it.
    tokio::time::sleep_until(warm_end.into()).await;
    let before = cpu_now();
    tokio::time::sleep_until(end.into()).await;
    let after = cpu_now();
    let mut h = hist();
    let mut ops = 0;
    for t in tasks {
        if let Ok((th, n)) = t.await {
            let _ = h.add(&th);
            ops += n;
        }
    }
    Row {
        name,
        ops,
        secs: o.secs as f64,
        h,
        cpu: o.cpu.then(|| window(before, after, ops)),
    }
}

/// Fires `op` at a fixed rate (open loop). Latency counts from the moment the request is sent:
/// tokio's timer wakes up to 1 ms late, and counting from the scheduled time measured that
/// timer (a bare handler showed p50 0.8 ms), not the server.
pub(crate) async fn fixed_rate<F, Fut>(name: String, per_sec: u64, o: &Opts, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let op = Arc::new(op);
    let total = per_sec * (o.secs + o.warmup);
    let warm = per_sec * o.warmup;
    let h = Arc::new(Mutex::new(hist()));
    let start = Instant::now();
    let mut before = cpu_now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let at = start + Duration::from_micros(i * 1_000_000 / per_sec);
        tokio::time::sleep_until(at.into()).await;
        if i == warm {
            before = cpu_now();
        }
        let (op, h) = (op.clone(), h.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            op(i).await;
            if i >= warm {
                let us = sent.elapsed().as_micros().max(1) as u64;
                let _ = h.lock().map(|mut h| h.record(us));
            }
        }));
    }
    tokio::time::sleep_until((start + Duration::from_secs(o.warmup + o.secs)).into()).await;
    let after = cpu_now();
    for t in tasks {
        let _ = t.await;
    }
    let h = Arc::try_unwrap(h)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .unwrap_or_else(hist);
    Row {
        name,
        ops: total - warm,
        secs: o.secs as f64,
        h,
        cpu: o.cpu.then(|| window(before, after, total - warm)),
    }
}

/// One request of a row, whatever the door.
pub(crate) type Op = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |i| Box::pin(f(i)))
}

/// A fixed rate, or N requests always in flight.
#[derive(Clone, Copy)]
pub(crate) enum Load {
    Rate(u64),
    Inflight(usize),
}

impl Load {
    /// How a row's name says its load: `@1000/s`, `x16`.
    pub(crate) fn tag(self) -> String {
        match self {
            Load::Rate(r) => format!("@{r}/s"),
            Load::Inflight(n) => format!("x{n:<3}"),
        }
    }
}

async fn one(name: &str, load: Load, o: &Opts, op: &Op) -> Row {
    let op = op.clone();
    let name = format!("{name} {}", load.tag());
    match load {
        Load::Rate(r) => fixed_rate(name, r, o, move |i| op(i)).await,
        Load::Inflight(n) => closed_loop(name, n, o, move |i| op(i)).await,
    }
}

/// Runs every `(name, op)` under `load` once per round, in turn, and returns each one's
/// median round: a burst of noise on a shared machine then hits one round of each, not the
/// whole of one of them.
pub(crate) async fn alternate(o: &Opts, load: Load, rows: &[(&str, Op)]) -> Vec<Row> {
    let mut runs: Vec<Vec<Row>> = rows.iter().map(|_| Vec::new()).collect();
    for _ in 0..o.rounds {
        for ((name, op), out) in rows.iter().zip(runs.iter_mut()) {
            out.push(one(name, load, o, op).await);
        }
    }
    runs.into_iter().map(median).collect()
}

/// Prints `rows` with the first as the baseline of the others.
pub(crate) fn print_against_first(rows: &[Row]) {
    if let Some((base, rest)) = rows.split_first() {
        base.print(None);
        for r in rest {
            r.print(Some(base));
        }
    }
}
