//! The volatile backend: one ordered map behind a lock, plus an expiry index.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::Bytes;

use super::{Backend, KeyPage, Record, StorageError, Swap, SwapOutcome};
use crate::hlc::Hlc;

#[derive(Debug, Default)]
pub struct MemoryBackend {
    inner: RwLock<Inner>,
}

/// A record as the index keeps it: 64 bytes where [`Record`] takes 112 (node ids are interned,
/// the rare fencing token is boxed, "no deadline" is 0). Memory per key is a target.
#[derive(Debug, Clone)]
struct Slot {
    value: Bytes,
    ms: u64,
    counter: u32,
    /// Index into [`Inner::nodes`].
    node: u32,
    /// 0 = no deadline.
    expires_at_ms: u64,
    fencing: Option<Box<Hlc>>,
}

impl Slot {
    fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= now_ms
    }
    fn deadline(&self) -> Option<u64> {
        (self.expires_at_ms != 0).then_some(self.expires_at_ms)
    }
}

#[derive(Debug, Default)]
struct Inner {
    map: BTreeMap<Bytes, Slot>,
    deadlines: BTreeSet<(u64, Bytes)>,
    max_version: Option<Hlc>,
    /// Node ids seen in versions (a handful: one per service node that ever wrote).
    nodes: Vec<Arc<str>>,
}

impl Inner {
    fn intern(&mut self, node: &Arc<str>) -> u32 {
        match self.nodes.iter().position(|n| **n == **node) {
            Some(i) => i as u32,
            None => {
                self.nodes.push(node.clone());
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn version(&self, slot: &Slot) -> Hlc {
        let node = self
            .nodes
            .get(slot.node as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from("?"));
        Hlc {
            ms: slot.ms,
            counter: slot.counter,
            node,
        }
    }

    fn version_is(&self, slot: &Slot, v: &Hlc) -> bool {
        slot.ms == v.ms
            && slot.counter == v.counter
            && self.nodes.get(slot.node as usize).is_some_and(|n| **n == *v.node)
    }

    fn record(&self, slot: &Slot) -> Record {
        Record {
            value: slot.value.clone(),
            version: self.version(slot),
            fencing: slot.fencing.as_deref().cloned(),
            expires_at_ms: slot.deadline(),
        }
    }

    fn slot(&mut self, rec: Record) -> Slot {
        Slot {
            // A compact copy: the caller's bytes may be a slice of a large network buffer.
            value: Bytes::copy_from_slice(&rec.value),
            ms: rec.version.ms,
            counter: rec.version.counter,
            node: self.intern(&rec.version.node),
            expires_at_ms: rec.expires_at_ms.map(|d| d.max(1)).unwrap_or(0),
            fencing: rec.fencing.map(Box::new),
        }
    }

    fn put(&mut self, key: Bytes, new: Option<Record>) {
        let old = match new {
            Some(rec) => {
                if self.max_version.as_ref().is_none_or(|m| rec.version > *m) {
                    self.max_version = Some(rec.version.clone());
                }
                let slot = self.slot(rec);
                if let Some(d) = slot.deadline() {
                    self.deadlines.insert((d, key.clone()));
                }
                match self.map.get_mut(&key) {
                    Some(cur) => Some(std::mem::replace(cur, slot)),
                    None => {
                        // A new key: store a compact copy of it too.
                        self.map.insert(Bytes::copy_from_slice(&key), slot);
                        None
                    }
                }
            }
            None => self.map.remove(&key),
        };
        if let Some(d) = old.and_then(|o| o.deadline()) {
            // The same (deadline, key) may have just been inserted again for the new record.
            let still = self.map.get(&key).and_then(Slot::deadline) == Some(d);
            if !still {
                self.deadlines.remove(&(d, key));
            }
        }
    }
}

impl MemoryBackend {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Loads records without checks (durable backends replay into this).
    pub fn load(&self, key: Bytes, rec: Option<Record>) {
        self.write().put(key, rec);
    }

    /// Raises the highest version ever stored (a durable backend restores it from a snapshot:
    /// the key that held it may have been deleted since).
    pub(crate) fn observe_version(&self, v: &Hlc) {
        let mut inner = self.write();
        if inner.max_version.as_ref().is_none_or(|m| v > m) {
            inner.max_version = Some(v.clone());
        }
    }

    /// [`Backend::swap_many`], running `then` under the same lock once the swaps are applied, so
    /// that what `then` records (a log append) comes in the order the swaps were applied.
    pub(crate) fn swap_then<R>(
        &self,
        swaps: &[Swap],
        max_keys: Option<u64>,
        then: impl FnOnce() -> R,
    ) -> (SwapOutcome, Option<R>) {
        let mut inner = self.write();
        let outcome = check_swaps(&inner, swaps, max_keys);
        if outcome != SwapOutcome::Done {
            return (outcome, None);
        }
        for s in swaps {
            inner.put(s.key.clone(), s.new.clone());
        }
        (outcome, Some(then()))
    }

    /// Up to `n` records strictly after `after`, in key order (for snapshots, a chunk at a time).
    pub(crate) fn records_after(&self, after: Option<&[u8]>, n: usize) -> Vec<(Bytes, Record)> {
        let inner = self.read();
        let lower = match after {
            Some(a) => Bound::Excluded(Bytes::copy_from_slice(a)),
            None => Bound::Unbounded,
        };
        inner
            .map
            .range((lower, Bound::Unbounded))
            .take(n)
            .map(|(k, slot)| (k.clone(), inner.record(slot)))
            .collect()
    }

    pub(crate) fn max_version_now(&self) -> Option<Hlc> {
        self.read().max_version.clone()
    }

    pub(crate) fn key_count(&self) -> u64 {
        self.read().map.len() as u64
    }
}

/// Checks swaps against the index: every expected version must be the stored one.
fn check_swaps(inner: &Inner, swaps: &[Swap], max_keys: Option<u64>) -> SwapOutcome {
    let map = &inner.map;
    let mut added: i64 = 0;
    for s in swaps {
        let cur = map.get(&s.key);
        let matches = match (cur, &s.expected) {
            (None, None) => true,
            (Some(slot), Some(v)) => inner.version_is(slot, v),
            _ => false,
        };
        if !matches {
            return SwapOutcome::Conflict;
        }
        added += i64::from(s.new.is_some()) - i64::from(cur.is_some());
    }
    if let Some(max) = max_keys {
        if added > 0 && map.len() as i64 + added > max as i64 {
            return SwapOutcome::TooManyKeys;
        }
    }
    SwapOutcome::Done
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        let inner = self.read();
        Ok(inner.map.get(key).map(|slot| inner.record(slot)))
    }

    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        Ok(self.swap_then(swaps, max_keys, || ()).0)
    }

    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError> {
        let inner = self.read();
        let lower = match after {
            Some(a) => Bound::Excluded(Bytes::copy_from_slice(a)),
            None => Bound::Unbounded,
        };
        let mut page = KeyPage::default();
        let mut seen = 0;
        let mut last = None;
        for (k, rec) in inner.map.range((lower, Bound::Unbounded)) {
            if seen == examine {
                page.resume_after = last;
                return Ok(page);
            }
            seen += 1;
            if !rec.is_expired(now_ms) && keep(k) {
                page.keys.push(k.clone());
            }
            last = Some(k.clone());
        }
        Ok(page)
    }

    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError> {
        let inner = self.read();
        Ok(inner
            .deadlines
            .iter()
            .take_while(|(d, _)| *d <= now_ms)
            .filter_map(|(_, k)| inner.map.get(k).map(|slot| (k.clone(), inner.version(slot))))
            .take(limit)
            .collect())
    }

    async fn next_deadline(&self) -> Result<Option<u64>, StorageError> {
        Ok(self.read().deadlines.first().map(|(d, _)| *d))
    }

    async fn len(&self) -> Result<u64, StorageError> {
        Ok(self.read().map.len() as u64)
    }

    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        Ok(self.read().max_version.clone())
    }
}
