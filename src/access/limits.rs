//! Limits per principal: a request rate (token bucket) and open change streams (SSE, Watch).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// How much one principal may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSettings {
    /// Requests per second per principal (`None`: unlimited).
    pub rate_per_sec: Option<NonZeroU32>,
    /// Requests a principal may make at once above the rate (the bucket's size).
    pub burst: Option<NonZeroU32>,
    /// Change streams (SSE, gRPC Watch) one principal may hold open (`None`: unlimited).
    pub max_streams: Option<usize>,
}

impl Default for LimitSettings {
    fn default() -> LimitSettings {
        LimitSettings {
            rate_per_sec: None,
            burst: None,
            max_streams: Some(64),
        }
    }
}

/// Open streams per principal.
type StreamCounts = Arc<Mutex<HashMap<String, usize>>>;

/// Checks between two sweeps of idle buckets.
const SWEEP_EVERY: u64 = 4096;

pub struct Limits {
    rate: Option<DefaultKeyedRateLimiter<String>>,
    checks: AtomicU64,
    max_streams: Option<usize>,
    streams: StreamCounts,
    refused: AtomicU64,
}

impl std::fmt::Debug for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("rate", &self.rate.is_some())
            .field("max_streams", &self.max_streams)
            .finish_non_exhaustive()
    }
}

/// An open stream, counted against its principal until dropped.
#[derive(Debug)]
pub struct StreamSlot {
    streams: Option<(StreamCounts, String)>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some((map, key)) = self.streams.take() {
            let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
    }
}

impl Limits {
    pub fn new(s: &LimitSettings) -> Limits {
        let rate = s.rate_per_sec.map(|r| {
            let burst = s.burst.unwrap_or(r);
            RateLimiter::keyed(Quota::per_second(r).allow_burst(burst))
        });
        Limits {
            rate,
            checks: AtomicU64::new(0),
            max_streams: s.max_streams,
            streams: Arc::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// Takes one request from `key`'s bucket; `false` when it is empty.
    pub fn take(&self, key: &str) -> bool {
        let Some(rate) = &self.rate else {
            return true;
        };
        // Forget buckets that are full again now and then, so idle principals cost nothing.
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            rate.retain_recent();
            rate.shrink_to_fit();
        }
        let key = key.to_owned();
        let ok = rate.check_key(&key).is_ok();
        if !ok {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Counts a new stream for `key`; `None` when it holds the most it may.
    pub fn open_stream(&self, key: &str) -> Option<StreamSlot> {
        let Some(max) = self.max_streams else {
            return Some(StreamSlot { streams: None });
        };
        let mut map = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(key.to_owned()).or_insert(0);
        if *n >= max {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            streams: Some((self.streams.clone(), key.to_owned())),
        })
    }

    /// Requests and streams refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}
