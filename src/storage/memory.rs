//! The volatile backend: one ordered map behind a lock, plus an expiry index.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::RwLock;

use async_trait::async_trait;
use bytes::Bytes;

use super::{Backend, KeyPage, Record, StorageError, Swap, SwapOutcome};
use crate::hlc::Hlc;

#[derive(Debug, Default)]
pub struct MemoryBackend {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    map: BTreeMap<Bytes, Record>,
    deadlines: BTreeSet<(u64, Bytes)>,
    max_version: Option<Hlc>,
}

impl Inner {
    fn put(&mut self, key: Bytes, new: Option<Record>) {
        let old = match new {
            Some(rec) => {
                if let Some(d) = rec.expires_at_ms {
                    self.deadlines.insert((d, key.clone()));
                }
                if self.max_version.as_ref().is_none_or(|m| rec.version > *m) {
                    self.max_version = Some(rec.version.clone());
                }
                self.map.insert(key.clone(), rec)
            }
            None => self.map.remove(&key),
        };
        if let Some(d) = old.and_then(|o| o.expires_at_ms) {
            // The same (deadline, key) may have just been inserted again for the new record.
            let still = self.map.get(&key).and_then(|r| r.expires_at_ms) == Some(d);
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
        let outcome = check_swaps(&inner.map, swaps, max_keys);
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
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect()
    }

    pub(crate) fn max_version_now(&self) -> Option<Hlc> {
        self.read().max_version.clone()
    }

    pub(crate) fn key_count(&self) -> u64 {
        self.read().map.len() as u64
    }
}

/// Checks and applies swaps on an in-memory map; shared by backends that keep an index in memory.
pub(crate) fn check_swaps(map: &BTreeMap<Bytes, Record>, swaps: &[Swap], max_keys: Option<u64>) -> SwapOutcome {
    let mut added: i64 = 0;
    for s in swaps {
        let cur = map.get(&s.key);
        if cur.map(|r| &r.version) != s.expected.as_ref() {
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
        Ok(self.read().map.get(key).cloned())
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
            .filter_map(|(_, k)| inner.map.get(k).map(|r| (k.clone(), r.version.clone())))
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
