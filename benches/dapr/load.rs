//! Load shapes and the measured row: a closed loop (N requests always in flight) and an open
//! loop at a fixed rate, each recording latency in an hdrhistogram and counting failures (a
//! failed request is fast, so it must never pass for a served one).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// A request that has not answered by then counts as failed, so a stuck path cannot hang the run.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

/// One measured row: requests answered in the measured window, failures, latency in µs, and
/// the CPU time per request of each party (µs), when measured.
pub struct Row {
    pub ops: u64,
    pub errors: u64,
    pub secs: f64,
    pub h: Histogram<u64>,
    pub cpu_us: Vec<(&'static str, f64)>,
}

impl Row {
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    pub fn ms(&self, q: f64) -> f64 {
        self.h.value_at_quantile(q) as f64 / 1000.0
    }
}

/// The round with the median throughput; at a fixed rate every round has the same throughput,
/// so the median p50 decides there instead (the sort is stable on throughput ties otherwise).
pub fn median(mut rows: Vec<Row>) -> Row {
    rows.sort_by(|a, b| a.rate().total_cmp(&b.rate()).then(a.ms(0.5).total_cmp(&b.ms(0.5))));
    let mid = rows.len() / 2;
    rows.swap_remove(mid)
}

/// How long a row runs: warm-up (not recorded) then the measured seconds.
#[derive(Clone, Copy)]
pub struct Window {
    pub warmup: Duration,
    pub measured: Duration,
}

async fn timed<Fut: Future<Output = bool>>(fut: Fut) -> bool {
    tokio::time::timeout(REQUEST_TIMEOUT, fut).await.unwrap_or(false)
}

/// `inflight` workers, each sending its next request when the last one answers.
pub async fn closed_loop<F, Fut>(inflight: usize, w: Window, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let warm_end = Instant::now() + w.warmup;
    let end = warm_end + w.measured;
    let mut tasks = Vec::with_capacity(inflight);
    for worker in 0..inflight {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let (mut h, mut ok, mut failed) = (hist(), 0u64, 0u64);
            // Workers start far apart in the key space, so they do not all write the same key.
            let mut i = worker as u64 * 157;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let served = timed(op(i)).await;
                i += 1;
                if t0 < warm_end {
                    continue;
                }
                if served {
                    let _ = h.record(t0.elapsed().as_micros().max(1) as u64);
                    ok += 1;
                } else {
                    failed += 1;
                }
            }
            (h, ok, failed)
        }));
    }
    let (mut h, mut ops, mut errors) = (hist(), 0, 0);
    for t in tasks {
        match t.await {
            Ok((th, ok, failed)) => {
                let _ = h.add(&th);
                ops += ok;
                errors += failed;
            }
            Err(_) => errors += 1,
        }
    }
    Row {
        ops,
        errors,
        secs: w.measured.as_secs_f64(),
        h,
        cpu_us: Vec::new(),
    }
}

/// Sends `per_sec` requests a second whatever the answers do (open loop). Latency counts from
/// the moment a request is sent, not from its slot: tokio's timer can wake up to 1 ms late,
/// and counting from the slot would measure that timer rather than the path.
pub async fn fixed_rate<F, Fut>(per_sec: u64, w: Window, op: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let op = Arc::new(op);
    let warm = per_sec * w.warmup.as_millis() as u64 / 1000;
    let total = warm + per_sec * w.measured.as_millis() as u64 / 1000;
    let h = Arc::new(Mutex::new(hist()));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let at = start + Duration::from_micros(i * 1_000_000 / per_sec);
        tokio::time::sleep_until(at.into()).await;
        let (op, h, errors) = (op.clone(), h.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let served = timed(op(i)).await;
            if i < warm {
                return;
            }
            if served {
                let us = sent.elapsed().as_micros().max(1) as u64;
                let _ = h.lock().map(|mut h| h.record(us));
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
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
    let errors = errors.load(Ordering::Relaxed);
    Row {
        ops: (total - warm).saturating_sub(errors),
        errors,
        secs: w.measured.as_secs_f64(),
        h,
        cpu_us: Vec::new(),
    }
}
