//! Watches: the changes a watcher asked for, read from the feed; resumed after a version it
//! saw, or started with a snapshot of the current values. Every door that streams changes (SSE,
//! gRPC Watch, Dapr configuration subscriptions) uses this; each only turns the items into its
//! wire format, so resume and snapshot rules live here once.
//!
//! # Resume
//!
//! A watcher names the last change it saw by its version ([`Start::After`]). While the feed
//! still holds that change, the watch continues right after it: every later change, none twice.
//! When it does not (the history was trimmed, the service restarted, the version is unknown),
//! the watch says [`WatchItem::Reset`] and sends a snapshot, so the watcher is consistent again
//! without another call.
//!
//! # Snapshot without gap or repeat
//!
//! The reader is placed on the feed first, then the store is read page by page (a page is one
//! bounded scan of keys; values are read one at a time, so memory holds one page of keys and
//! one value). Changes that arrive meanwhile wait in the feed; after each page they are read and
//! each is sent only if the snapshot does not already reflect it:
//!
//! - a key read in the snapshot is read under its stripe lock, and every write publishes its
//!   change before it releases that lock, so the feed position sampled during the read splits
//!   the key's changes exactly: those before it are in the value read, those after are news;
//! - a key the page's scan did not list (absent at that moment) is decided by feed positions
//!   around the scan: changes before the scan are reflected (it was absent after them), changes
//!   published after the scan and after every write in flight during it has finished
//!   ([`Engine::settle_writes`]) are news; the few keys changed in between are read again
//!   under their lock, as listed keys are;
//! - a key after the page is left to the page that will read it, which then reflects it.
//!
//! With replicas on shared storage, another replica's change reaches this history through the
//! shared log, after its write and not under this replica's lock. So the snapshot also waits
//! until the history holds every change the log had (after the scan, and after a page's reads),
//! and a key read is placed at the feed position before its read, not after: another replica's
//! change can be swapped in storage after the read and reach the feed before the read returns.
//! From that position on, the key takes every change newer than the version read. One case
//! stays loose: a key another replica deletes before (or while) it is read, then its `delete`
//! (after a `set`, if it was set again in between) can be sent though the snapshot left the key
//! out; the replayed state is still the store's.
//!
//! Changes sent during a snapshot are not resume positions (a resume from there would skip
//! keys the snapshot had not reached); [`WatchItem::Synced`] ends the snapshot and names the
//! position from which a resume is exact.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;

use super::feed::{FeedEvent, FeedReader};
use super::{Engine, EngineError, Entry, KeyFilter};
use crate::hlc::Hlc;

/// Which keys a watcher wants: any of `keys`, or any name matching one of `patterns`; every
/// key when both are empty.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    keys: Vec<Bytes>,
    patterns: Vec<glob::Pattern>,
}

impl Selector {
    /// `keys` are engine keys; `patterns` are globs (SCAN's rules) over the names the door
    /// shows. A bad pattern is an error naming it.
    pub fn new(keys: Vec<Bytes>, patterns: &[String]) -> Result<Selector, String> {
        let patterns = patterns
            .iter()
            .map(|p| glob::Pattern::new(p).map_err(|e| format!("pattern {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Selector { keys, patterns })
    }

    /// Whether the watcher wants `key`, whose shown name `name` gives (computed only when a
    /// pattern needs it).
    pub fn wants<'a>(&self, key: &[u8], name: impl FnOnce() -> Cow<'a, str>) -> bool {
        if self.keys.is_empty() && self.patterns.is_empty() {
            return true;
        }
        if self.keys.iter().any(|k| k[..] == *key) {
            return true;
        }
        if self.patterns.is_empty() {
            return false;
        }
        let name = name();
        self.patterns.iter().any(|p| p.matches(&name))
    }

    /// The keys, when the watcher named keys and no pattern (a snapshot then reads just them).
    pub fn only_keys(&self) -> Option<Vec<Bytes>> {
        (self.patterns.is_empty() && !self.keys.is_empty()).then(|| self.keys.clone())
    }
}

/// What a watch covers.
#[derive(Clone)]
pub struct WatchSpec {
    /// Whether the watcher wants an engine key (and may read it): changes and snapshot items
    /// of other keys are never sent.
    pub wanted: KeyFilter,
    /// Every wanted key starts with this (it bounds a snapshot's scan; empty: any key).
    pub prefix: Bytes,
    /// The keys, when the watcher named keys and nothing else: a snapshot reads only these.
    pub only: Option<Vec<Bytes>>,
}

impl WatchSpec {
    /// The same watch, narrowed to the keys `also` keeps too (e.g. the keys a caller may read).
    pub fn and(self, also: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> WatchSpec {
        let wanted = self.wanted;
        WatchSpec {
            wanted: KeyFilter::new(move |k| wanted.keeps(k) && also(k)),
            ..self
        }
    }
}

impl std::fmt::Debug for WatchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchSpec")
            .field("prefix", &self.prefix)
            .field("only", &self.only)
            .finish_non_exhaustive()
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Changes from now on.
    Live,
    /// The current value of every wanted key, then changes, with no gap and no repeat.
    Snapshot,
    /// Every change after the one with this version (the last one the watcher saw); when the
    /// history does not hold it: [`WatchItem::Reset`], a snapshot, then changes.
    After(Hlc),
}

impl Start {
    /// The start a door's request asks for: a version to resume after wins; otherwise a
    /// snapshot if asked; otherwise live changes. (A resume never repeats a snapshot the
    /// watcher already has; if the version is lost, the reset brings one anyway.)
    pub fn from_request(since: Option<Hlc>, snapshot: bool) -> Start {
        match (since, snapshot) {
            (Some(v), _) => Start::After(v),
            (None, true) => Start::Snapshot,
            (None, false) => Start::Live,
        }
    }
}

/// What a watch yields.
#[derive(Debug)]
pub enum WatchItem {
    /// A change. `resumable`: its version names the position right after it, from which a
    /// resume is exact (false for changes sent during a snapshot).
    Change { event: Arc<FeedEvent>, resumable: bool },
    /// A key's current value, part of a snapshot (never a resume position).
    Snapshot { key: Bytes, entry: Entry },
    /// The position asked for is not in the history: the watcher must forget what it knows of
    /// the wanted keys; a snapshot follows.
    Reset,
    /// The snapshot is complete. `resume` names this position for a later resume (`None`:
    /// the feed keeps no history and has no name for it; a reconnecting watcher starts over).
    Synced { resume: Option<Hlc> },
    /// The watcher fell behind the history kept and missed `missed` changes; the stream ends.
    Overflow { missed: u64 },
    /// Reading the store failed; the stream ends.
    Failed(EngineError),
}

impl Engine {
    /// A watch of the keys `spec` wants, from `start`. Nothing is read until it is polled; the
    /// engine never waits for it (a watcher that falls behind gets [`WatchItem::Overflow`]).
    pub fn watch(&self, spec: WatchSpec, start: Start) -> impl Stream<Item = WatchItem> + Send + use<> {
        let (reader, snapshot, pending) = match start {
            Start::Live => (self.subscribe(), None, None),
            Start::Snapshot => (self.subscribe(), Some(Snapshot::default()), None),
            Start::After(version) => match self.subscribe_after(&version) {
                Some(reader) => (reader, None, None),
                // Subscribed before the snapshot reads anything: nothing falls in between.
                None => (self.subscribe(), Some(Snapshot::default()), Some(WatchItem::Reset)),
            },
        };
        let watcher = Watcher {
            engine: self.clone(),
            spec,
            reader,
            snapshot,
            pending,
            ended: false,
        };
        futures_util::stream::unfold(watcher, |mut w| async move {
            let item = w.next().await?;
            Some((item, w))
        })
    }

    /// Reads a key under its stripe lock, with a feed position: every change to the key before
    /// the position is reflected in what was read. After it, with local storage none is; with
    /// replicas, those of the version read or older are (see [`Page::is_news`]).
    async fn read_observed(&self, key: &Bytes) -> Result<(Option<Entry>, u64), EngineError> {
        let _guard = self.lock(key).await;
        // Another replica's change takes no lock here: it can be swapped in storage after the
        // read and reach this feed before the read returns. A position taken after the read
        // would then place it before the read though the read missed it, and the snapshot
        // would drop it; taken before, it is decided by its version.
        let before = self.shared().map(|_| self.0.feed.head());
        let record = self.load_live(key).await?;
        // Local writes publish under the lock held here: for them the position after the read
        // is exact, and a removal the read itself made (an expired key) is not sent as news.
        let read_at = before.unwrap_or_else(|| self.0.feed.head());
        let entry = record.map(|r| Entry {
            value: r.value,
            version: r.version,
            expires_at_ms: r.expires_at_ms,
            fencing: r.fencing,
        });
        Ok((entry, read_at))
    }

    /// Waits until every write that was in flight when called has published its change: a
    /// write holds its stripe lock from before its storage swap until after it publishes, so
    /// taking each lock once is enough (new writes wait only while their stripe is taken).
    /// With replicas on shared storage, also until this replica's history holds every change
    /// the others had applied by then (see [`Engine::settle_replicas`]).
    async fn settle_writes(&self) -> Result<(), EngineError> {
        for stripe in &self.0.stripes {
            drop(stripe.lock().await);
        }
        self.settle_replicas().await
    }

    /// With replicas on shared storage: waits until this replica's history holds every change
    /// any replica had applied when called. Another replica's change reaches this history
    /// through the shared log, after its write, not under this replica's stripe lock.
    async fn settle_replicas(&self) -> Result<(), EngineError> {
        match self.shared() {
            Some(shared) => shared.settle().await,
            None => Ok(()),
        }
    }
}

/// The state of a watch between items.
struct Watcher {
    engine: Engine,
    spec: WatchSpec,
    reader: FeedReader,
    /// Present while a snapshot is being sent.
    snapshot: Option<Snapshot>,
    /// An item to send before anything else (the reset before a snapshot).
    pending: Option<WatchItem>,
    ended: bool,
}

#[derive(Default)]
struct Snapshot {
    /// The last key covered by the pages sent so far (the next page starts after it).
    covered: Option<Bytes>,
    page: Option<Page>,
}

/// One page of a snapshot: keys in `(lower, upper]` (unbounded when `None`).
struct Page {
    lower: Option<Bytes>,
    upper: Option<Bytes>,
    /// Feed position after the scan and the writes in flight during it had settled.
    settled: u64,
    to_read: VecDeque<Bytes>,
    /// The feed position at which each key of the page was read, and the version read.
    observed: HashMap<Bytes, (u64, Option<Hlc>)>,
    /// How far the feed is read once the page's values are sent.
    drain_to: Option<u64>,
}

impl Page {
    /// Whether a change read while this page is current is news to a watcher that has the
    /// snapshot so far (see the module documentation). `seq`: its position in the feed.
    fn is_news(&self, e: &FeedEvent, seq: u64) -> bool {
        let key = &e.change.key[..];
        if self.upper.as_deref().is_some_and(|u| key > u) {
            // A later page reads this key after the change was published: it reflects it.
            return false;
        }
        if self.lower.as_deref().is_some_and(|l| key <= l) {
            // An earlier page: every change before its end was already decided.
            return true;
        }
        match self.observed.get(key) {
            // The version check matters with replicas on shared storage only: another
            // replica's change can reach this feed after the read that reflects it.
            Some((read_at, read)) => seq >= *read_at && read.as_ref().is_none_or(|v| e.change.version > *v),
            None => seq >= self.settled,
        }
    }
}

/// What one step of a snapshot produced.
enum Step {
    Item(WatchItem),
    Continue,
    Done,
    End(WatchItem),
}

impl Watcher {
    async fn next(&mut self) -> Option<WatchItem> {
        loop {
            if let Some(item) = self.pending.take() {
                return Some(item);
            }
            if self.ended {
                return None;
            }
            if let Some(mut snap) = self.snapshot.take() {
                match self.snapshot_step(&mut snap).await {
                    Step::Item(item) => {
                        self.snapshot = Some(snap);
                        return Some(item);
                    }
                    Step::Continue => self.snapshot = Some(snap),
                    Step::Done => {
                        return Some(WatchItem::Synced {
                            resume: self.reader.resume_version().cloned(),
                        });
                    }
                    Step::End(item) => {
                        self.ended = true;
                        return Some(item);
                    }
                }
                continue;
            }
            match self.reader.recv().await {
                Ok(event) if self.spec.wanted.keeps(&event.change.key) => {
                    return Some(WatchItem::Change { event, resumable: true });
                }
                Ok(_) => {}
                Err(lag) => {
                    // Never stall the engine for a slow reader: tell it, and end.
                    self.ended = true;
                    return Some(WatchItem::Overflow { missed: lag.missed });
                }
            }
        }
    }

    async fn snapshot_step(&mut self, snap: &mut Snapshot) -> Step {
        let page = match &mut snap.page {
            Some(page) => page,
            None => match self.open_page(snap.covered.clone()).await {
                Ok(page) => snap.page.insert(page),
                Err(end) => return Step::End(end),
            },
        };
        if let Some(key) = page.to_read.pop_front() {
            return match self.engine.read_observed(&key).await {
                Ok((entry, read_at)) => {
                    let version = entry.as_ref().map(|e| e.version.clone());
                    page.observed.insert(key.clone(), (read_at, version));
                    match entry {
                        Some(entry) => Step::Item(WatchItem::Snapshot { key, entry }),
                        None => Step::Continue,
                    }
                }
                Err(e) => Step::End(WatchItem::Failed(e)),
            };
        }
        // The page's values are sent: now the changes published meanwhile, up to a fixed point
        // (later ones wait for the next page or the live phase). With replicas, first every
        // change another replica had applied before the reads, so it is decided here, where
        // the versions read are known.
        if page.drain_to.is_none()
            && let Err(e) = self.engine.settle_replicas().await
        {
            return Step::End(WatchItem::Failed(e));
        }
        let drain_to = *page.drain_to.get_or_insert_with(|| self.engine.0.feed.head());
        while self.reader.position() < drain_to {
            match self.reader.try_recv() {
                None => break,
                Some(Err(lag)) => return Step::End(WatchItem::Overflow { missed: lag.missed }),
                Some(Ok(event)) => {
                    // The reader has moved past it: it was at the position before.
                    let seq = self.reader.position() - 1;
                    if self.spec.wanted.keeps(&event.change.key) && page.is_news(&event, seq) {
                        return Step::Item(WatchItem::Change {
                            event,
                            resumable: false,
                        });
                    }
                }
            }
        }
        let upper = page.upper.clone();
        snap.page = None;
        match upper {
            None => Step::Done,
            Some(upper) => {
                snap.covered = Some(upper);
                Step::Continue
            }
        }
    }

    /// Scans the next page after `covered` (or takes the named keys), and settles the feed
    /// positions around the scan.
    async fn open_page(&self, covered: Option<Bytes>) -> Result<Page, WatchItem> {
        if let Some(keys) = &self.spec.only {
            // Every wanted key is read (and so observed): no scan, one page.
            let keys: BTreeSet<Bytes> = keys.iter().filter(|k| self.spec.wanted.keeps(k)).cloned().collect();
            return Ok(Page {
                lower: None,
                upper: None,
                settled: 0,
                to_read: keys.into_iter().collect(),
                observed: HashMap::new(),
                drain_to: None,
            });
        }
        let engine = &self.engine;
        let feed = &engine.0.feed;
        let prefix = &self.spec.prefix;
        // A prefixed range's keys all sort after the bare prefix (never a key of its own).
        let lower = covered.or_else(|| (!prefix.is_empty()).then(|| prefix.clone()));
        let before_scan = feed.head();
        let scanned = engine
            .0
            .store
            .backend()
            .scan(
                lower.as_deref(),
                engine.0.limits.scan_page.max(1),
                engine.now_ms(),
                &|k: &[u8]| self.spec.wanted.keeps(k),
            )
            .await
            .map_err(|e| WatchItem::Failed(e.into()))?;
        engine.settle_writes().await.map_err(WatchItem::Failed)?;
        let settled = feed.head();
        // Past the prefix's range there is nothing more to find.
        let upper = scanned.resume_after.filter(|r| r.starts_with(prefix));
        let in_page = |k: &[u8]| lower.as_deref().is_none_or(|l| k > l) && upper.as_deref().is_none_or(|u| k <= u);
        let mut to_read: BTreeSet<Bytes> = scanned.keys.into_iter().collect();
        // Keys changed while the scan ran: it may or may not have seen the change, so they are
        // read again under their lock.
        let changed = feed
            .keys_between(before_scan, settled)
            .map_err(|lag| WatchItem::Overflow { missed: lag.missed })?;
        for key in changed {
            if in_page(&key) && self.spec.wanted.keeps(&key) {
                to_read.insert(key);
            }
        }
        Ok(Page {
            lower,
            upper,
            settled,
            to_read: to_read.into_iter().collect(),
            observed: HashMap::new(),
            drain_to: None,
        })
    }
}

#[cfg(test)]
mod tests;
