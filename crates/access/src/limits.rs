//! Limits per principal: a request rate (token bucket) and open change streams (SSE, Watch).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

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

/// How many of something each key holds at once (open streams per principal, MQTT requests
/// in flight per caller), each count bounded when it is taken.
#[derive(Debug, Clone, Default)]
pub struct PerKeyCounts(Arc<Mutex<HashMap<String, usize>>>);

/// One taken unit of a [`PerKeyCounts`], given back when dropped.
#[derive(Debug)]
pub struct PerKeySlot {
    counts: PerKeyCounts,
    key: String,
}

impl PerKeyCounts {
    /// Counts one more for `key`, unless it holds `max` already.
    pub fn try_take(&self, key: &str, max: usize) -> Option<PerKeySlot> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(key.to_owned()).or_insert(0);
        if *n >= max {
            if *n == 0 {
                map.remove(key);
            }
            return None;
        }
        *n += 1;
        Some(PerKeySlot {
            counts: self.clone(),
            key: key.to_owned(),
        })
    }
}

impl Drop for PerKeySlot {
    fn drop(&mut self) {
        let mut map = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// Checks between two sweeps of idle buckets.
const SWEEP_EVERY: u64 = 4096;

/// One token bucket per principal, on clock `C`.
type KeyedRate<C> = RateLimiter<String, DashMapStateStore<String>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// The limits in force; [`Limits::apply`] changes them live (SIGHUP with a new configuration).
/// The rate runs on the monotonic clock; tests give [`Limits::with_clock`] one they move by hand.
pub struct Limits<C: Clock = DefaultClock> {
    rate: ArcSwapOption<KeyedRate<C>>,
    clock: C,
    checks: AtomicU64,
    /// `usize::MAX`: unlimited.
    max_streams: AtomicUsize,
    /// What `rate` was made from (to replace it only when it changes: a new limiter starts
    /// every bucket full).
    applied: Mutex<LimitSettings>,
    streams: PerKeyCounts,
    refused: AtomicU64,
}

impl<C: Clock> std::fmt::Debug for Limits<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("applied", &*self.applied.lock().unwrap_or_else(|e| e.into_inner()))
            .finish_non_exhaustive()
    }
}

/// An open stream, counted against its principal until dropped.
pub type StreamSlot = PerKeySlot;

impl Limits {
    pub fn new(s: &LimitSettings) -> Limits {
        Limits::with_clock(s, DefaultClock::default())
    }
}

impl<C: Clock + Clone> Limits<C> {
    /// [`Limits::new`] with the rate on `clock`.
    pub fn with_clock(s: &LimitSettings, clock: C) -> Limits<C> {
        let limits = Limits {
            rate: ArcSwapOption::empty(),
            clock,
            checks: AtomicU64::new(0),
            max_streams: AtomicUsize::new(usize::MAX),
            applied: Mutex::new(LimitSettings {
                rate_per_sec: None,
                burst: None,
                max_streams: None,
            }),
            streams: PerKeyCounts::default(),
            refused: AtomicU64::new(0),
        };
        limits.apply(s);
        limits
    }

    /// Puts `s` in force. Streams already open stay open (a lower stream limit only refuses new
    /// ones until a principal is under it); a changed rate starts every bucket full.
    pub fn apply(&self, s: &LimitSettings) {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        self.max_streams
            .store(s.max_streams.unwrap_or(usize::MAX), Ordering::Relaxed);
        if (applied.rate_per_sec, applied.burst) != (s.rate_per_sec, s.burst) {
            let rate = s.rate_per_sec.map(|r| {
                let burst = s.burst.unwrap_or(r);
                Arc::new(RateLimiter::dashmap_with_clock(
                    Quota::per_second(r).allow_burst(burst),
                    self.clock.clone(),
                ))
            });
            self.rate.store(rate);
        }
        *applied = s.clone();
    }

    /// Takes one request from `key`'s bucket; `false` when it is empty.
    pub fn take(&self, key: &str) -> bool {
        let rate = self.rate.load();
        let Some(rate) = rate.as_deref() else {
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
        // Counted even when unlimited, so that a limit put in force later counts them.
        let slot = self.streams.try_take(key, self.max_streams.load(Ordering::Relaxed));
        if slot.is_none() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        slot
    }

    /// Requests and streams refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}
