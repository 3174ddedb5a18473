//! Load shapes and the measured row: a closed loop (N requests always in flight) and an open
//! loop at a fixed rate, each recording latency in an hdrhistogram.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::Opts;

pub(crate) fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

/// One measured row.
pub(crate) struct Row {
    name: String,
    ops: u64,
    secs: f64,
    h: Histogram<u64>,
}

impl Row {
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    pub(crate) fn ms(&self, q: f64) -> f64 {
        self.h.value_at_quantile(q) as f64 / 1000.0
    }
    pub(crate) fn print(&self, baseline: Option<&Row>) {
        let ratio = baseline
            .map(|b| {
                format!(
                    "  x{:.2} thr  x{:.2} p50",
                    self.rate() / b.rate().max(1e-9),
                    self.ms(0.5) / b.ms(0.5).max(1e-9)
                )
            })
            .unwrap_or_default();
        println!(
            "{:<34} {:>9.0}/s  p50 {:>7.3}  p90 {:>7.3}  p99 {:>7.3}  p99.9 {:>7.3} ms{}",
            self.name,
            self.rate(),
            self.ms(0.5),
            self.ms(0.9),
            self.ms(0.99),
            self.ms(0.999),
            ratio
        );
    }
}

/// The run with the median throughput.
pub(crate) fn median(mut rows: Vec<Row>) -> Row {
    rows.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let mid = rows.len() / 2;
    rows.swap_remove(mid)
}

/// Runs `inflight` closed-loop workers calling `op` for warmup + measured time.
pub(crate) async fn closed_loop<F, Fut>(name: String, inflight: usize, o: &Opts, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
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
    }
}

/// Fires `op` at a fixed rate (open loop). Latency counts from the moment the request is sent:
/// tokio's timer wakes up to 1 ms late, and counting from the scheduled time measured that
/// timer (a bare handler showed p50 0.8 ms), not the server.
pub(crate) async fn fixed_rate<F, Fut>(name: String, per_sec: u64, o: &Opts, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let op = Arc::new(op);
    let total = per_sec * (o.secs + o.warmup);
    let warm = per_sec * o.warmup;
    let h = Arc::new(Mutex::new(hist()));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let at = start + Duration::from_micros(i * 1_000_000 / per_sec);
        tokio::time::sleep_until(at.into()).await;
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
    }
}
