//! Hybrid logical clocks: the versions of keys and the fencing tokens.
//!
//! Wire form: `{ms_since_epoch:015}:{counter:05}:{node}`, e.g. `001696374425000:00001:stategate-1`.
//! Parsing is lenient about zero padding; output is always padded. Order is by wall-clock
//! milliseconds, then counter, then node id (byte order).
//!
//! This module is pure: wall-clock time is read only through [`Clock`], so tests inject a
//! [`ManualClock`].

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Largest counter value the padded wire form holds (five digits).
pub const MAX_COUNTER: u32 = 99_999;

/// One hybrid-logical-clock timestamp.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hlc {
    /// Milliseconds since the Unix epoch.
    pub ms: u64,
    /// Logical counter within one millisecond.
    pub counter: u32,
    /// The node that issued it (no `:`).
    pub node: Arc<str>,
}

impl Hlc {
    pub fn new(ms: u64, counter: u32, node: impl Into<Arc<str>>) -> Hlc {
        Hlc {
            ms,
            counter,
            node: node.into(),
        }
    }

    /// The (ms, counter) pair, ignoring the node.
    fn tick(&self) -> (u64, u32) {
        (self.ms, self.counter)
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:015}:{:05}:{}", self.ms, self.counter, self.node)
    }
}

impl fmt::Debug for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hlc({self})")
    }
}

/// A string that is not an HLC.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed hybrid logical clock")]
pub struct ParseHlcError;

impl FromStr for Hlc {
    type Err = ParseHlcError;

    /// Parses `ms:counter:node`. The node is everything after the second `:` and must be
    /// non-empty and free of `:` and of control characters (a version travels in headers and
    /// event ids, where a line break cannot). Numbers are decimal digits only, padded or not.
    fn from_str(s: &str) -> Result<Hlc, ParseHlcError> {
        let mut parts = s.splitn(3, ':');
        let ms = parse_digits(parts.next())?;
        let counter = parse_digits(parts.next())?;
        let node = parts.next().ok_or(ParseHlcError)?;
        if node.is_empty()
            || node.contains(':')
            || node.chars().any(char::is_control)
            || counter > u64::from(MAX_COUNTER)
        {
            return Err(ParseHlcError);
        }
        Ok(Hlc::new(ms, counter as u32, node))
    }
}

fn parse_digits(part: Option<&str>) -> Result<u64, ParseHlcError> {
    let part = part.ok_or(ParseHlcError)?;
    if part.is_empty() || part.len() > 20 || !part.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseHlcError);
    }
    part.parse().map_err(|_| ParseHlcError)
}

/// The source of wall-clock milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to: for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(ms: u64) -> ManualClock {
        ManualClock(AtomicU64::new(ms))
    }
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

/// The service's one hybrid logical clock.
///
/// The last timestamp issued is one atomic word, `ms << 17 | counter` (the counter never passes
/// [`MAX_COUNTER`] < 2^17), so issuing a version is a compare-and-swap, not a lock. Should the
/// milliseconds ever reach 2^47 (the year 6429, or a stored version claiming it) the clock moves
/// for good to a mutex-guarded pair, [`HlcClock::wide`].
pub struct HlcClock {
    node: Arc<str>,
    clock: Arc<dyn Clock>,
    /// The last timestamp issued, packed; [`WIDE`] once it no longer packs.
    last: AtomicU64,
    /// The last timestamp issued once `last` is [`WIDE`].
    wide: Mutex<(u64, u32)>,
}

const COUNTER_BITS: u32 = 17;
const PACKED_MS_LIMIT: u64 = 1 << (64 - COUNTER_BITS);
/// `last` once timestamps no longer pack (never a packed value: its ms would be the limit).
const WIDE: u64 = u64::MAX;

fn pack((ms, counter): (u64, u32)) -> Option<u64> {
    (ms < PACKED_MS_LIMIT).then_some((ms << COUNTER_BITS) | u64::from(counter))
}

fn unpack(p: u64) -> (u64, u32) {
    (p >> COUNTER_BITS, (p & ((1 << COUNTER_BITS) - 1)) as u32)
}

/// A counter past [`MAX_COUNTER`] steps exactly like [`MAX_COUNTER`] (to the next millisecond),
/// so inputs are clamped to it and every tick packs.
fn clamped(t: (u64, u32)) -> (u64, u32) {
    (t.0, t.1.min(MAX_COUNTER))
}

/// The HLC step: the wall clock if it is ahead, otherwise one tick past `cur`.
fn step(cur: (u64, u32), wall: u64) -> (u64, u32) {
    if wall > cur.0 {
        (wall, 0)
    } else if cur.1 >= MAX_COUNTER {
        // The counter is full: borrow the next millisecond rather than overflow the wire form.
        (cur.0.saturating_add(1), 0)
    } else {
        (cur.0, cur.1 + 1)
    }
}

impl fmt::Debug for HlcClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HlcClock").field("node", &self.node).finish()
    }
}

impl HlcClock {
    /// `node` must not contain `:` (checked by the configuration layer).
    pub fn new(node: impl Into<Arc<str>>, clock: Arc<dyn Clock>) -> HlcClock {
        HlcClock {
            node: node.into(),
            clock,
            last: AtomicU64::new(0),
            wide: Mutex::new((0, 0)),
        }
    }

    pub fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// Wall-clock milliseconds of the underlying clock.
    pub fn wall_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Makes sure no timestamp issued from now on is at or below `floor` (used at startup
    /// with the highest version found in durable storage, so versions never go backwards).
    pub fn observe(&self, floor: &Hlc) {
        let floor = clamped(floor.tick());
        let mut last = self.last.load(Ordering::Acquire);
        while last != WIDE {
            if unpack(last) >= floor {
                return;
            }
            let Some(p) = pack(floor) else { break };
            match self
                .last
                .compare_exchange_weak(last, p, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => last = now,
            }
        }
        let mut wide = self.go_wide();
        *wide = (*wide).max(floor);
    }

    /// A fresh timestamp strictly greater than every timestamp issued before and than every
    /// timestamp in `floors` (the standard HLC receive rule, applied to several inputs).
    pub fn next_after(&self, floors: &[&Hlc]) -> Hlc {
        let wall = self.clock.now_ms();
        let floor = floors.iter().map(|f| clamped(f.tick())).max().unwrap_or((0, 0));
        let mut last = self.last.load(Ordering::Acquire);
        while last != WIDE {
            let next = step(unpack(last).max(floor), wall);
            let Some(p) = pack(next) else { break };
            match self
                .last
                .compare_exchange_weak(last, p, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return self.stamp(next),
                Err(now) => last = now,
            }
        }
        let mut wide = self.go_wide();
        let next = step((*wide).max(floor), wall);
        *wide = next;
        self.stamp(next)
    }

    /// The wide clock, with the packed word retired into it (once; a packed issuer racing with
    /// this fails its compare-and-swap and comes here too).
    fn go_wide(&self) -> std::sync::MutexGuard<'_, (u64, u32)> {
        let mut wide = self.wide.lock().unwrap_or_else(|e| e.into_inner());
        let before = self.last.swap(WIDE, Ordering::AcqRel);
        if before != WIDE {
            *wide = (*wide).max(unpack(before));
        }
        wide
    }

    fn stamp(&self, (ms, counter): (u64, u32)) -> Hlc {
        Hlc {
            ms,
            counter,
            node: self.node.clone(),
        }
    }

    /// A fresh timestamp (a local event).
    pub fn now(&self) -> Hlc {
        self.next_after(&[])
    }
}

#[cfg(test)]
mod tests;
