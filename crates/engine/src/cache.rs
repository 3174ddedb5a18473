//! Records recently seen, for replicas on shared storage: a write can start from one of these
//! instead of reading the key first, which saves a round trip to the storage.
//!
//! Nothing here is trusted. A write decided from a cached record swaps with the cached version
//! as the expected one, so the storage refuses it when the record changed meanwhile; a decision
//! that writes nothing (NX not met, a fencing or ETag refusal, VDEL of another value, DEL of a
//! missing key) is confirmed by the storage against the same version before it is answered
//! (`Engine::confirm`). A stale entry therefore costs a retry from a fresh read, never a wrong
//! answer.
//!
//! Kept fresh by the shared change log (every replica's changes, in swap order), by this
//! replica's own writes, and by what reads bring back. An entry only moves forward: a record or
//! a removal replaces an entry only if its version is later, so a slow read cannot undo what
//! the log said. Bounded by bytes (`--redis-record-cache-bytes`); the oldest entries go first.
//! Emptied when the log lost entries (a gap), since the changes missed are unknown.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bytes::Bytes;

use super::{Engine, EngineError, Loaded, RequestId, Response, shared};
use crate::hlc::Hlc;
use crate::storage::{Check, Record, RequestMark, Write, Written};

/// Bookkeeping bytes counted per entry besides its key and value.
const ENTRY_OVERHEAD: usize = 128;

/// What the cache knows of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Known {
    Present(Record),
    /// Removed by the change with this version (`None`: read as absent, version unknown).
    Absent(Option<Hlc>),
}

impl Known {
    /// The version this knowledge is as of, for ordering (`None`: older than anything).
    fn as_of(&self) -> Option<&Hlc> {
        match self {
            Known::Present(r) => Some(&r.version),
            Known::Absent(v) => v.as_ref(),
        }
    }

    fn cost(&self, key: &[u8]) -> usize {
        let value = match self {
            Known::Present(r) => r.value.len(),
            Known::Absent(_) => 0,
        };
        ENTRY_OVERHEAD + key.len() + value
    }

    /// The record a write starts from.
    pub(crate) fn record(self) -> Option<Record> {
        match self {
            Known::Present(r) => Some(r),
            Known::Absent(_) => None,
        }
    }
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Bytes, Known>,
    /// Keys in the order they entered (each once while it is in `map`): eviction order.
    order: VecDeque<Bytes>,
    bytes: usize,
}

/// The bounded cache.
#[derive(Debug)]
pub(crate) struct RecordCache {
    entries: Mutex<Entries>,
    max_bytes: usize,
}

impl RecordCache {
    pub(crate) fn new(max_bytes: usize) -> RecordCache {
        RecordCache {
            entries: Mutex::new(Entries::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known of `key`, if anything.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Known> {
        self.lock().map.get(key).cloned()
    }

    /// A change that was applied (read from the log, or this replica's own): the record it
    /// stored, or `None` for a removal with version `version`.
    pub(crate) fn changed(&self, key: &Bytes, version: &Hlc, record: Option<&Record>) {
        let known = match record {
            Some(r) => Known::Present(r.clone()),
            None => Known::Absent(Some(version.clone())),
        };
        self.offer(key, known);
    }

    /// What a read of storage returned. An absence read carries no version: it only fills a
    /// key the cache knows nothing of.
    pub(crate) fn read(&self, key: &Bytes, record: Option<&Record>) {
        match record {
            Some(r) => self.offer(key, Known::Present(r.clone())),
            None => {
                let mut e = self.lock();
                if !e.map.contains_key(key) {
                    self.insert(&mut e, key, Known::Absent(None));
                }
            }
        }
    }

    /// Forgets everything (the log lost entries: changes are missing).
    pub(crate) fn clear(&self) {
        *self.lock() = Entries::default();
    }

    /// Keys and bytes held.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let e = self.lock();
        (e.map.len(), e.bytes)
    }

    /// Keeps `known` unless the cache knows something later.
    fn offer(&self, key: &Bytes, known: Known) {
        let mut e = self.lock();
        if let Some(current) = e.map.get(key)
            && current.as_of() >= known.as_of()
        {
            return;
        }
        self.insert(&mut e, key, known);
    }

    fn insert(&self, e: &mut Entries, key: &Bytes, known: Known) {
        let cost = known.cost(key);
        if cost > self.max_bytes {
            // Too big to keep: forget what was known rather than keep it stale.
            if let Some(old) = e.map.remove(&key[..]) {
                e.bytes -= old.cost(key);
                e.order.retain(|k| k != key);
            }
            return;
        }
        // A copy: the key may be a slice of a request buffer that must not stay pinned.
        match e.map.insert(Bytes::copy_from_slice(key), known) {
            Some(old) => e.bytes -= old.cost(key),
            None => e.order.push_back(Bytes::copy_from_slice(key)),
        }
        e.bytes += cost;
        while e.bytes > self.max_bytes {
            let Some(oldest) = e.order.pop_front() else { break };
            if let Some(old) = e.map.remove(&oldest) {
                e.bytes -= old.cost(&oldest);
            }
        }
    }
}

/// The record a write starts from.
pub(super) enum Start {
    /// The key's live record; `cached`: taken from the cache, so a decision that swaps nothing
    /// must be confirmed ([`Engine::confirm`]).
    Record { record: Option<Record>, cached: bool },
    /// The request was applied before: its first outcome.
    Repeated(Response),
    /// The cached record was stale: read storage.
    Stale,
}

/// What storage said of a decision taken from a cached record.
pub(super) enum Confirmed {
    /// The record it was decided on is still the stored one, and the request is new.
    Holds,
    /// It changed: read storage and decide again.
    Stale,
    /// The request was applied before: its first outcome.
    Repeated(Response),
}

impl Engine {
    /// The record a write to `key` starts from: the cached one when there is one (and `fresh`
    /// is not asked for), else storage's (with the request's mark, in one round trip; the
    /// value only if `value`, see [`Engine::load_live_marked`]). A
    /// cached record that looks expired is read again from storage.
    /// Caller holds the key's stripe lock.
    pub(super) async fn start_write(
        &self,
        key: &Bytes,
        request: Option<&RequestId>,
        value: bool,
        fresh: bool,
    ) -> Result<Start, EngineError> {
        let known = match &self.0.cache {
            Some(cache) if !fresh => cache.get(key),
            _ => None,
        };
        if let Some(known) = known {
            return Ok(match known.record() {
                // A read may have pushed a sliding deadline out without a new version (see
                // `sliding.rs`), which neither the cache nor the change log hears of: only
                // storage's record says that a key expired.
                Some(r) if self.is_expired(&r) => Start::Stale,
                record => Start::Record { record, cached: true },
            });
        }
        Ok(match self.load_live_marked(key, request, value).await? {
            Loaded::Record(record) => Start::Record { record, cached: false },
            Loaded::Repeated(first) => Start::Repeated(first),
        })
    }

    /// Asks storage, in one round trip, whether `key` still holds `cur` (by version) and
    /// whether `request` is new: an answer decided from the cache that writes nothing (NX not
    /// met, a refusal, nothing to delete) is only given once this says it holds.
    pub(super) async fn confirm(
        &self,
        key: &Bytes,
        cur: Option<&Record>,
        request: Option<&RequestId>,
    ) -> Result<Confirmed, EngineError> {
        let checks = [Check {
            key: key.clone(),
            expected: cur.map(|r| r.version.clone()),
        }];
        // An empty outcome: look for the request's mark, store none.
        let mark = request.map(|r| RequestMark {
            id: r.id.clone(),
            outcome: Bytes::new(),
            ttl_ms: 0,
        });
        let write = Write {
            swaps: &[],
            checks: &checks,
            max_keys: None,
            changes: &[],
            request: mark.as_ref(),
        };
        Ok(match self.0.store.backend().write(&write).await? {
            Written::Done { .. } => Confirmed::Holds,
            Written::Conflict | Written::Behind(_) | Written::TooManyKeys => Confirmed::Stale,
            Written::Repeated(first) => Confirmed::Repeated(shared::decode_outcome(&first)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value: &str, ms: u64) -> Record {
        Record {
            value: Bytes::copy_from_slice(value.as_bytes()),
            version: Hlc::new(ms, 0, "n"),
            fencing: None,
            expires_at_ms: None,
            slide_ms: None,
        }
    }

    fn key(k: &str) -> Bytes {
        Bytes::copy_from_slice(k.as_bytes())
    }

    #[test]
    fn entries_only_move_forward() {
        let c = RecordCache::new(1 << 20);
        let k = key("k");
        c.changed(&k, &Hlc::new(5, 0, "n"), Some(&rec("new", 5)));
        // A read that started before the change comes back late: ignored.
        c.read(&k, Some(&rec("old", 3)));
        assert_eq!(c.get(b"k"), Some(Known::Present(rec("new", 5))));
        c.read(&k, None);
        assert_eq!(c.get(b"k"), Some(Known::Present(rec("new", 5))));
        // A removal after it wins; a record older than the removal does not come back.
        c.changed(&k, &Hlc::new(6, 0, "n"), None);
        c.changed(&k, &Hlc::new(5, 0, "n"), Some(&rec("new", 5)));
        assert_eq!(c.get(b"k"), Some(Known::Absent(Some(Hlc::new(6, 0, "n")))));
        c.read(&k, Some(&rec("again", 7)));
        assert_eq!(c.get(b"k"), Some(Known::Present(rec("again", 7))));
        // An absence read fills only an unknown key.
        c.read(&key("other"), None);
        assert_eq!(c.get(b"other"), Some(Known::Absent(None)));
        c.read(&key("other"), Some(&rec("x", 1)));
        assert_eq!(c.get(b"other"), Some(Known::Present(rec("x", 1))));
        c.clear();
        assert_eq!(c.get(b"k"), None);
        assert_eq!(c.held(), (0, 0));
    }

    #[test]
    fn bytes_are_bounded_oldest_first() {
        let per = ENTRY_OVERHEAD + 2 + 10;
        let c = RecordCache::new(3 * per);
        for i in 0..5u64 {
            c.read(&key(&format!("k{i}")), Some(&rec("0123456789", i + 1)));
        }
        assert_eq!(c.held(), (3, 3 * per));
        assert_eq!(c.get(b"k0"), None);
        assert_eq!(c.get(b"k1"), None);
        assert!(c.get(b"k4").is_some());
        // Updating a kept key changes its cost, not its place.
        c.read(&key("k2"), Some(&rec("0", 9)));
        assert_eq!(c.held(), (3, 3 * per - 9));
        // A record larger than the whole budget is not kept, and what was known goes.
        let big = "x".repeat(4 * per);
        c.read(&key("k3"), Some(&rec(&big, 20)));
        assert_eq!(c.get(b"k3"), None);
        assert_eq!(c.held(), (2, 2 * per - 9));
    }
}
