//! The change feed: a bounded, in-memory history of applied changes that every watcher reads.
//!
//! One ring of recent changes, trimmed by count, by bytes and by age, whatever the readers do.
//! A reader is a position in that history; a reader that falls behind the oldest change kept
//! learns how many it missed ([`Lagged`]) and is moved to the oldest one: nothing a slow or
//! stalled reader does can make the feed hold more than its budget, and the engine never waits
//! for a reader. Values in the feed are copies owned by the feed, so a change never pins the
//! network buffer its value arrived in.
//!
//! Positions are sequence numbers local to this process. A watcher that reconnects names the
//! last version it saw instead; [`Feed::position_after`] finds the change with that version in
//! the history, if it is still kept. The feed's own `origin` version names the position before
//! its first change, so a watcher that connected before any change can resume too.
//!
//! So a version must never name two positions. Versions the clock issues are unique, but an
//! import stores records with the versions they were exported with, which this history (or a
//! watcher, from before a restart or a trim) may already know at another position. Such a
//! change is pushed with [`Feed::push_imported`]: taken as an ordinary change when its version
//! is above every version this history ever held (its origin included), otherwise the history
//! starts over ([`Feed::gap`]): readers get [`Lagged`] and a resume from any earlier version
//! finds nothing, so a watcher gets a reset and a snapshot instead of skipping changes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

use super::notify::{Change, ChangeKind};
use crate::hlc::Hlc;

/// How much history the feed keeps. A change is dropped when any limit is passed; the newest
/// change is always kept, whatever its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedLimits {
    /// Most changes kept.
    pub max_events: usize,
    /// Most heap bytes kept: each change's copies of its key and value as malloc holds them,
    /// and its event and ring slot.
    pub max_bytes: usize,
    /// Changes older than this are dropped.
    pub max_age: Duration,
}

impl Default for FeedLimits {
    fn default() -> FeedLimits {
        FeedLimits {
            max_events: 65_536,
            max_bytes: 64 * 1024 * 1024,
            max_age: Duration::from_secs(600),
        }
    }
}

/// Heap bytes a change kept takes besides its key and value: the event's malloc chunk (128,
/// see [`FeedEvent`]) and its slot in the ring (16, [`Kept`]).
const EVENT_OVERHEAD: usize = 144;

/// The malloc chunk holding a copy of `n` bytes: glibc adds an 8-byte header and rounds up to
/// 16, 32 at the least; an empty copy allocates nothing. The byte budget counts what the heap
/// holds (288 bytes for a 16-byte key and a 100-byte value, as measured by
/// benches/memory_per_key.rs), not only the bytes of the key and the value (212).
fn copy_chunk(n: usize) -> usize {
    match n {
        0 => 0,
        n => (n + 8).next_multiple_of(16).max(32),
    }
}

/// One change in the history.
///
/// The change alone (104 bytes), so that with the `Arc`'s counts it takes a 128-byte malloc
/// chunk: its position is known from the ring (the oldest kept is at `next_seq - len`), and
/// its time is in the ring beside it (`Kept`). It had both, 144-byte chunks.
#[derive(Debug)]
pub struct FeedEvent {
    pub change: Change,
}

/// A change in the ring and when it was pushed (nanoseconds since [`Feed::opened`]), which
/// only trimming reads. With the event's chunk and the copies of the key and the value, 288
/// bytes of heap a change for 16-byte keys and 100-byte values: 18 MiB at the default 65,536
/// (benches/memory_per_key.rs; 320 bytes before).
#[derive(Debug)]
struct Kept {
    at_ns: u64,
    event: Arc<FeedEvent>,
}

impl FeedEvent {
    fn cost(change: &Change) -> usize {
        let value = match &change.kind {
            ChangeKind::Set(v) => v.len(),
            ChangeKind::Delete | ChangeKind::Expire => 0,
        };
        EVENT_OVERHEAD + copy_chunk(change.key.len()) + copy_chunk(value)
    }
}

/// A reader was behind the oldest change kept: `missed` changes are gone for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged {
    pub missed: u64,
}

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Kept>,
    /// The sequence number the next change gets.
    next_seq: u64,
    bytes: usize,
    /// The highest (ms, counter) of every version this history ever held, trimmed changes and
    /// the origin included: an imported version above it names no position yet. The node is
    /// left out, so an equal (ms, counter) of another node counts as held (the safe side).
    high: (u64, u32),
}

impl Ring {
    fn first_seq(&self) -> u64 {
        self.next_seq - self.events.len() as u64
    }
}

/// The history and the readers' wake-up.
#[derive(Debug)]
pub struct Feed {
    limits: FeedLimits,
    /// What [`FeedEvent`] times count from.
    opened: Instant,
    /// A version issued for the feed itself, never a change's: it names position 0.
    origin: Hlc,
    ring: Mutex<Ring>,
    wake: Notify,
    readers: AtomicUsize,
}

impl Feed {
    /// `origin` must be a version no change will ever carry (the engine issues it from its
    /// clock when it opens).
    pub fn new(limits: FeedLimits, origin: Hlc) -> Feed {
        let ring = Ring {
            high: (origin.ms, origin.counter),
            ..Ring::default()
        };
        Feed {
            limits,
            opened: Instant::now(),
            origin,
            ring: Mutex::new(ring),
            wake: Notify::new(),
            readers: AtomicUsize::new(0),
        }
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        // A poisoned lock only means a reader panicked mid-read; the ring itself is consistent.
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the feed keeps history at all (or only serves live readers).
    fn keeps_history(&self) -> bool {
        self.limits.max_events > 0
    }

    /// Appends a change (its value is copied into the feed) and wakes the readers.
    pub fn push(&self, change: Change) {
        if !self.keeps_history() && self.readers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let change = change.detached();
        let cost = FeedEvent::cost(&change);
        let now = self.nanos_since_opened();
        {
            let mut ring = self.ring();
            self.append(&mut ring, change, cost, now);
            self.trim(&mut ring, now);
        }
        if self.readers.load(Ordering::Relaxed) > 0 {
            self.wake.notify_waiters();
        }
    }

    fn nanos_since_opened(&self) -> u64 {
        // u64 nanoseconds last 584 years.
        Instant::now().duration_since(self.opened).as_nanos() as u64
    }

    /// Appends one change, first dropping the oldest if the ring holds `max_events` already:
    /// the ring then never holds more than that, and its buffer stays at that capacity
    /// (appending first and trimming after made it grow to the next power of two, 8 bytes a
    /// change more at the default). The other limits are [`Feed::trim`]'s, after appending.
    fn append(&self, ring: &mut Ring, change: Change, cost: usize, now: u64) {
        while ring.events.len() >= self.limits.max_events.max(1) {
            Self::drop_oldest(ring);
        }
        ring.next_seq += 1;
        ring.bytes += cost;
        ring.high = ring.high.max((change.version.ms, change.version.counter));
        let event = Arc::new(FeedEvent { change });
        ring.events.push_back(Kept { at_ns: now, event });
    }

    fn drop_oldest(ring: &mut Ring) {
        if let Some(front) = ring.events.pop_front() {
            ring.bytes -= FeedEvent::cost(&front.event.change);
        }
    }

    /// Appends the changes of an import (records that keep the versions they were exported
    /// with), all or none: when every version is above all this history ever held they are
    /// ordinary changes; otherwise one of them could name a position already named (a resume
    /// from it would skip what lies between), so none is appended and the history starts over
    /// ([`Feed::gap`]). Returns whether they were appended.
    pub fn push_imported(&self, changes: Vec<Change>) -> bool {
        if changes.is_empty() || (!self.keeps_history() && self.readers.load(Ordering::Relaxed) == 0) {
            return true;
        }
        let now = self.nanos_since_opened();
        {
            let mut ring = self.ring();
            let high = ring.high;
            if changes.iter().any(|c| (c.version.ms, c.version.counter) <= high) {
                drop(ring);
                self.gap();
                return false;
            }
            for change in changes {
                let change = change.detached();
                let cost = FeedEvent::cost(&change);
                self.append(&mut ring, change, cost, now);
            }
            self.trim(&mut ring, now);
        }
        if self.readers.load(Ordering::Relaxed) > 0 {
            self.wake.notify_waiters();
        }
        true
    }

    /// Changes were missed (the shared change log lost entries this replica had not read), or
    /// an import brought versions the history may already name: the history is emptied and
    /// every reader learns it lagged, so no watcher's stream goes on as if nothing was missed.
    /// What the history held still counts for [`Feed::push_imported`].
    pub fn gap(&self) {
        {
            let mut ring = self.ring();
            ring.events.clear();
            ring.bytes = 0;
            // One position nobody can read: every reader is now behind the oldest kept.
            ring.next_seq += 1;
        }
        self.wake.notify_waiters();
    }

    /// Drops what is over a limit, keeping the newest change. Without history (max_events 0)
    /// a change is kept only until the readers are woken, which is enough for live readers
    /// that keep up; one that does not is told it lagged.
    fn trim(&self, ring: &mut Ring, now: u64) {
        let max_age = self.limits.max_age.as_nanos();
        while ring.events.len() > 1 {
            let Some(front) = ring.events.front() else { break };
            let over = ring.bytes > self.limits.max_bytes || u128::from(now.saturating_sub(front.at_ns)) > max_age;
            if !over {
                break;
            }
            Self::drop_oldest(ring);
        }
    }

    /// A reader that sees every change pushed from now on.
    pub fn reader(self: &Arc<Feed>) -> FeedReader {
        let (next, resume) = {
            let ring = self.ring();
            let resume = match ring.events.back() {
                Some(newest) => Some(newest.event.change.version.clone()),
                None if ring.next_seq == 0 => Some(self.origin.clone()),
                // No history kept (max_events 0) and changes already went by: no name for here.
                None => None,
            };
            (ring.next_seq, resume)
        };
        FeedReader::new(self.clone(), next, resume)
    }

    /// A reader positioned right after the change with `version`, if the history still holds
    /// it (the watcher saw that change and wants every later one).
    pub fn reader_after(self: &Arc<Feed>, version: &Hlc) -> Option<FeedReader> {
        let next = self.position_after(version)?;
        Some(FeedReader::new(self.clone(), next, Some(version.clone())))
    }

    /// The position after the change with `version`, if kept (the origin: position 0, while
    /// nothing has been dropped yet).
    pub fn position_after(&self, version: &Hlc) -> Option<u64> {
        let ring = self.ring();
        if *version == self.origin {
            return (ring.first_seq() == 0).then_some(0);
        }
        // The newest is at position next_seq - 1, the one before it next_seq - 2, and so on.
        ring.events
            .iter()
            .rev()
            .position(|e| e.event.change.version == *version)
            .map(|back| ring.next_seq - back as u64)
    }

    /// The position the next change will get.
    pub fn head(&self) -> u64 {
        self.ring().next_seq
    }

    /// The keys of the changes at positions `from..to`, or [`Lagged`] when some of them are no
    /// longer kept.
    pub fn keys_between(&self, from: u64, to: u64) -> Result<Vec<bytes::Bytes>, Lagged> {
        let ring = self.ring();
        let first = ring.first_seq();
        if from < first {
            return Err(Lagged { missed: first - from });
        }
        let to = to.min(ring.next_seq);
        Ok((from..to)
            .map(|seq| ring.events[(seq - first) as usize].event.change.key.clone())
            .collect())
    }

    /// Changes and bytes held now (for tests and metrics).
    pub fn held(&self) -> (usize, usize) {
        let ring = self.ring();
        (ring.events.len(), ring.bytes)
    }
}

/// A position in the feed. Dropping it is all it takes to stop reading.
#[derive(Debug)]
pub struct FeedReader {
    feed: Arc<Feed>,
    next: u64,
    /// The version that names this position for a resume: the change just before it.
    resume: Option<Hlc>,
}

impl FeedReader {
    fn new(feed: Arc<Feed>, next: u64, resume: Option<Hlc>) -> FeedReader {
        feed.readers.fetch_add(1, Ordering::Relaxed);
        FeedReader { feed, next, resume }
    }

    /// The position of the next change this reader reads.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// The version a watcher passes to resume right here ([`Feed::reader_after`]): that of the
    /// last change read, or of the change before the reader's start. `None` when the feed has
    /// no name for this position (it keeps no history and changes went by before).
    pub fn resume_version(&self) -> Option<&Hlc> {
        self.resume.as_ref()
    }

    /// The next change, or [`Lagged`] when changes this reader had not read were dropped (the
    /// reader then continues from the oldest change kept).
    pub async fn recv(&mut self) -> Result<Arc<FeedEvent>, Lagged> {
        let feed = self.feed.clone();
        loop {
            let notified = feed.wake.notified();
            tokio::pin!(notified);
            // Registered before looking, so a push between the look and the wait wakes us.
            notified.as_mut().enable();
            if let Some(got) = self.try_recv() {
                return got;
            }
            notified.await;
        }
    }

    /// The next change if there is one already.
    pub fn try_recv(&mut self) -> Option<Result<Arc<FeedEvent>, Lagged>> {
        let ring = self.feed.ring();
        let first = ring.first_seq();
        if self.next < first {
            let missed = first - self.next;
            self.next = first;
            // Positions before the oldest change kept have no name any more.
            self.resume = None;
            return Some(Err(Lagged { missed }));
        }
        if self.next >= ring.next_seq {
            return None;
        }
        let event = ring.events[(self.next - first) as usize].event.clone();
        self.next += 1;
        self.resume = Some(event.change.version.clone());
        Some(Ok(event))
    }
}

impl Drop for FeedReader {
    fn drop(&mut self) {
        self.feed.readers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn set(key: &str, value: &[u8], ms: u64) -> Change {
        Change {
            key: Bytes::copy_from_slice(key.as_bytes()),
            version: Hlc::new(ms, 0, "n"),
            kind: ChangeKind::Set(Bytes::copy_from_slice(value)),
        }
    }

    fn origin() -> Hlc {
        Hlc::new(0, 0, "origin")
    }

    fn feed(max_events: usize, max_bytes: usize) -> Arc<Feed> {
        Arc::new(Feed::new(
            FeedLimits {
                max_events,
                max_bytes,
                max_age: Duration::from_secs(3600),
            },
            origin(),
        ))
    }

    /// The layout [`FeedEvent`]'s documentation counts on: with the `Arc`'s two counts, 120
    /// bytes, a 128-byte malloc chunk (glibc: 8 bytes of header, 16-byte steps).
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn an_event_takes_104_bytes() {
        assert_eq!(std::mem::size_of::<FeedEvent>(), 104);
        assert_eq!(std::mem::size_of::<Kept>(), 16);
    }

    /// The byte budget counts the heap's figure measured by benches/memory_per_key.rs: 288
    /// bytes for a 16-byte key and a 100-byte value (event 128, ring slot 16, key copy 32,
    /// value copy 112); a removal holds no value.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_change_costs_what_the_heap_holds() {
        let key = "0123456789abcdef";
        assert_eq!(FeedEvent::cost(&set(key, &[7u8; 100], 1)), 288);
        let removal = Change {
            key: Bytes::from(key),
            version: Hlc::new(1, 0, "n"),
            kind: ChangeKind::Delete,
        };
        assert_eq!(FeedEvent::cost(&removal), 176);
        assert_eq!(FeedEvent::cost(&set(key, b"", 1)), 176);
    }

    #[tokio::test]
    async fn readers_see_changes_in_order() {
        let f = feed(10, 1 << 20);
        let mut r = f.reader();
        f.push(set("a", b"1", 1));
        f.push(set("b", b"2", 2));
        assert_eq!(r.recv().await.unwrap().change, set("a", b"1", 1));
        assert_eq!(r.recv().await.unwrap().change, set("b", b"2", 2));
        assert!(r.try_recv().is_none());
    }

    #[tokio::test]
    async fn a_stalled_reader_holds_nothing_beyond_the_byte_budget() {
        let f = feed(1000, 10 * 1024);
        let mut stalled = f.reader();
        let big = vec![7u8; 4096];
        for i in 0..100 {
            f.push(set("k", &big, i));
        }
        let (events, bytes) = f.held();
        assert!(
            bytes <= 10 * 1024 + copy_chunk(4096) + copy_chunk(1) + EVENT_OVERHEAD,
            "{bytes}"
        );
        assert!(events <= 3, "{events}");
        // The stalled reader learns what it missed, then continues with what is kept.
        let missed = stalled.recv().await.unwrap_err().missed;
        assert_eq!(missed, 100 - events as u64);
        assert_eq!(stalled.recv().await.unwrap().change.version.ms, 100 - events as u64);
    }

    #[test]
    fn the_newest_change_is_kept_even_over_budget() {
        let f = feed(10, 10);
        f.push(set("k", &[0u8; 100], 1));
        assert_eq!(f.held().0, 1);
        f.push(set("k", &[0u8; 100], 2));
        assert_eq!(f.held().0, 1);
    }

    #[test]
    fn count_limit() {
        let f = feed(3, 1 << 20);
        for i in 0..10 {
            f.push(set("k", b"v", i));
        }
        assert_eq!(f.held().0, 3);
        assert_eq!(f.position_after(&Hlc::new(6, 0, "n")), None);
        assert_eq!(f.position_after(&Hlc::new(8, 0, "n")), Some(9));
    }

    #[tokio::test(start_paused = true)]
    async fn old_changes_age_out() {
        let f = Arc::new(Feed::new(
            FeedLimits {
                max_events: 100,
                max_bytes: 1 << 20,
                max_age: Duration::from_secs(10),
            },
            origin(),
        ));
        f.push(set("a", b"1", 1));
        tokio::time::advance(Duration::from_secs(11)).await;
        f.push(set("b", b"2", 2));
        assert_eq!(f.held().0, 1);
    }

    #[tokio::test]
    async fn resume_after_a_version() {
        let f = feed(100, 1 << 20);
        for i in 1..=5 {
            f.push(set("k", b"v", i));
        }
        let mut r = f.reader_after(&Hlc::new(3, 0, "n")).unwrap();
        assert_eq!(r.recv().await.unwrap().change.version.ms, 4);
        assert!(f.reader_after(&Hlc::new(42, 0, "n")).is_none());
    }

    #[test]
    fn values_are_copied_out_of_their_buffer() {
        let f = feed(10, 1 << 20);
        let buffer = Bytes::from(vec![1u8; 1024]);
        let change = Change {
            key: buffer.slice(0..4),
            version: Hlc::new(1, 0, "n"),
            kind: ChangeKind::Set(buffer.slice(4..8)),
        };
        f.push(change);
        let mut r = f.reader_after(&Hlc::new(1, 0, "n"));
        assert!(r.as_mut().unwrap().try_recv().is_none());
        // Only the copies are held: the original buffer can be freed by its owner.
        assert!(buffer.is_unique());
    }

    #[tokio::test]
    async fn without_history_live_readers_still_get_changes() {
        let f = feed(0, 1 << 20);
        f.push(set("nobody", b"listens", 1));
        assert_eq!(f.held().0, 0);
        let mut r = f.reader();
        f.push(set("a", b"1", 2));
        assert_eq!(r.recv().await.unwrap().change.version.ms, 2);
    }

    #[tokio::test]
    async fn readers_name_their_position_for_a_resume() {
        let f = feed(3, 1 << 20);
        let mut r = f.reader();
        // Before any change, the origin names the start.
        assert_eq!(r.resume_version(), Some(&origin()));
        assert_eq!(f.position_after(&origin()), Some(0));
        f.push(set("a", b"1", 1));
        assert_eq!(r.recv().await.unwrap().change.version.ms, 1);
        assert_eq!(r.resume_version().unwrap().ms, 1);
        let late = f.reader();
        assert_eq!(late.resume_version().unwrap().ms, 1, "the newest change before it");
        assert_eq!(late.position(), 1);
        for i in 2..=6 {
            f.push(set("b", b"2", i));
        }
        // The origin's position is gone with the first change dropped.
        assert_eq!(f.position_after(&origin()), None);
        assert!(r.recv().await.is_err());
        assert_eq!(r.resume_version(), None, "a lagged reader has no name until it reads");
        r.recv().await.unwrap();
        assert_eq!(r.resume_version().unwrap().ms, 4);
    }

    #[tokio::test]
    async fn imported_versions_never_name_a_second_position() {
        let f = feed(100, 1 << 20);
        let mut r = f.reader();
        f.push(set("a", b"1", 5));
        f.push(set("b", b"2", 7));
        // Above everything held: ordinary changes, a resume finds them.
        assert!(f.push_imported(vec![set("c", b"3", 9), set("d", b"4", 8)]));
        assert_eq!(f.position_after(&Hlc::new(8, 0, "n")), Some(4));
        for ms in [5, 7, 9, 8] {
            assert_eq!(r.recv().await.unwrap().change.version.ms, ms);
        }
        // One version the history held (5), or below the highest held (6 < 9): the history
        // starts over, and no version names a position any more.
        for old in [5, 6] {
            assert!(!f.push_imported(vec![set("e", b"5", 10), set("a", b"1", old)]));
            assert!(r.recv().await.is_err(), "the reader learns it missed changes");
            assert_eq!(f.held().0, 0);
            assert_eq!(f.position_after(&Hlc::new(old, 0, "n")), None);
            assert_eq!(f.position_after(&origin()), None);
        }
        // What was trimmed still counts: 9 was held once.
        assert!(!f.push_imported(vec![set("c", b"3", 9)]));
        assert!(f.push_imported(vec![set("z", b"9", 11)]));
        assert!(r.recv().await.is_err());
        assert_eq!(r.recv().await.unwrap().change.version.ms, 11);
    }

    #[test]
    fn keys_between_positions() {
        let f = feed(3, 1 << 20);
        for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
            f.push(set(k, b"v", i as u64));
        }
        assert_eq!(f.head(), 4);
        let keys = f.keys_between(1, 4).unwrap();
        assert_eq!(keys, vec![Bytes::from("b"), Bytes::from("c"), Bytes::from("d")]);
        assert_eq!(f.keys_between(2, 9).unwrap().len(), 2, "clamped to the head");
        assert_eq!(f.keys_between(0, 2), Err(Lagged { missed: 1 }));
    }
}
