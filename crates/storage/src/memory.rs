//! The volatile backend: the records in a hash index for point reads and writes, with an
//! ordered index beside it for scans, plus an expiry index. The durable backend uses it as its
//! in-memory index.
//!
//! Memory per key is a target (at most Redis's for small keys), so a key is one allocation
//! (`entry.rs`: a 20-byte header, the key, the value; expiry and fencing boxed aside, since most
//! keys have neither). The hash index owns the entries; the ordered index (`order.rs`) holds a
//! pointer to each, 64 to a leaf. GET and overwrites go through the hash index only (a B-tree
//! descent cost more than half of GET); only creating or deleting a key, or an overwrite that
//! moves the entry, touches the ordered index. An overwrite with a value of the same length is
//! done in place. Reads copy the value out (one small copy; the doors copy it into their wire
//! format anyway).

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::Bytes;
use hashbrown::HashTable;

use super::{Backend, KeyPage, Record, StorageError, Swap, SwapOutcome};
use crate::hlc::Hlc;

mod entry;
mod order;

use entry::{Entry, KeyRef};
use order::Order;

#[derive(Debug, Default)]
pub struct MemoryBackend {
    inner: RwLock<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Every key in byte order: pointers into the entries `table` owns. Declared first so it
    /// is dropped before the entries (it never reads them when dropped, but this keeps it honest).
    order: Order,
    /// Owns every entry; found by key hash (a keyed SipHash, so keys from the network cannot
    /// be chosen to collide).
    table: HashTable<Entry>,
    hasher: std::collections::hash_map::RandomState,
    deadlines: BTreeSet<(u64, Bytes)>,
    max_version: Option<Hlc>,
    /// Node ids seen in versions (a handful: one per service node that ever wrote).
    nodes: Vec<Arc<str>>,
    /// Bytes of the values held (for metrics).
    value_bytes: u64,
}

/// What one swap displaced, key by key in swap order: enough to take the swap back. Holds the
/// old entries themselves (no copy); dropping it frees them.
#[derive(Debug)]
pub(crate) struct Undo(Vec<(Bytes, Option<Entry>)>);

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("keys", &self.table.len())
            .finish_non_exhaustive()
    }
}

fn too_long() -> StorageError {
    StorageError::Backend("a key or value of 4 GiB or more does not fit the memory index".into())
}

/// The entry that stores `rec` under `key` (`node` and `deadline` from [`Inner::note_version`]).
fn new_entry(key: &[u8], rec: &Record, node: usize, deadline: u64) -> Result<Entry, StorageError> {
    Entry::new(
        key,
        &rec.value,
        &rec.version,
        node,
        deadline,
        rec.fencing.as_ref(),
        rec.slide_ms.unwrap_or(0),
    )
    .map_err(|_| too_long())
}

fn fits(s: &Swap) -> bool {
    let small = |n: usize| u32::try_from(n).is_ok();
    small(s.key.len()) && s.new.as_ref().is_none_or(|r| small(r.value.len()))
}

impl Inner {
    fn intern(&mut self, node: &Arc<str>) -> usize {
        match self.nodes.iter().position(|n| Arc::ptr_eq(n, node) || **n == **node) {
            Some(i) => i,
            None => {
                self.nodes.push(node.clone());
                self.nodes.len() - 1
            }
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.get_hashed(self.hash(key), key)
    }

    fn get_hashed(&self, hash: u64, key: &[u8]) -> Option<&Entry> {
        self.table.find(hash, |e| e.key() == key)
    }

    fn version(&self, e: &Entry) -> Hlc {
        if let Some(v) = e.extra().and_then(|x| x.version.clone()) {
            return v;
        }
        let node = self.nodes.get(e.node()).cloned().unwrap_or_else(|| Arc::from("?"));
        Hlc {
            ms: e.ms(),
            counter: e.counter(),
            node,
        }
    }

    fn version_is(&self, e: &Entry, v: &Hlc) -> bool {
        match e.extra().and_then(|x| x.version.as_ref()) {
            Some(full) => full == v,
            None => {
                e.ms() == v.ms && e.counter() == v.counter && self.nodes.get(e.node()).is_some_and(|n| **n == *v.node)
            }
        }
    }

    fn record(&self, e: &Entry) -> Record {
        Record {
            value: Bytes::copy_from_slice(e.value()),
            ..self.head(e)
        }
    }

    /// The record without its value.
    fn head(&self, e: &Entry) -> Record {
        let extra = e.extra();
        Record {
            value: Bytes::new(),
            version: self.version(e),
            fencing: extra.and_then(|x| x.fencing.clone()),
            expires_at_ms: extra.map(|x| x.expires_at_ms).filter(|d| *d != 0),
            slide_ms: extra.map(|x| x.slide_ms).filter(|s| *s != 0),
        }
    }

    /// Applies one change. The caller checked that the key and value fit ([`fits`]).
    fn put(&mut self, key: &[u8], new: Option<&Record>) -> Result<(), StorageError> {
        self.put_hashed(self.hash(key), key, new, true).map(drop)
    }

    /// [`Inner::put`] with the key's hash already computed; returns the entry it displaced.
    /// With `in_place`, an overwrite that fits the entry is done in it (nothing is displaced:
    /// the old contents are gone, so a caller that may take the swap back passes `false`).
    fn put_hashed(
        &mut self,
        hash: u64,
        key: &[u8],
        new: Option<&Record>,
        in_place: bool,
    ) -> Result<Option<Entry>, StorageError> {
        let Some(rec) = new else {
            return Ok(self.place(hash, key, None));
        };
        let (node, deadline) = self.note_version(rec);
        if in_place
            && deadline == 0
            && rec.fencing.is_none()
            && rec.slide_ms.is_none()
            && let Some(cur) = self.table.find_mut(hash, |e| e.key() == key)
            && cur.expires_at_ms() == 0
        {
            let before = cur.value().len() as u64;
            if cur.overwrite(&rec.value, rec.version.ms, rec.version.counter, node) {
                self.value_bytes = self.value_bytes - before + rec.value.len() as u64;
                return Ok(None);
            }
        }
        let fresh = new_entry(key, rec, node, deadline)?;
        Ok(self.place(hash, key, Some(fresh)))
    }

    /// Raises the highest version to `rec`'s; returns its node's number and its deadline (0:
    /// none) as an entry stores them.
    fn note_version(&mut self, rec: &Record) -> (usize, u64) {
        if self.max_version.as_ref().is_none_or(|m| rec.version > *m) {
            self.max_version = Some(rec.version.clone());
        }
        let node = self.intern(&rec.version.node);
        (node, rec.expires_at_ms.map(|d| d.max(1)).unwrap_or(0))
    }

    /// Loads one record (see [`MemoryBackend::load_many`]). While `ascending` holds the keys
    /// loaded so far (all in the hash table, none yet in the ordered index) and this key comes
    /// after them, it joins them; otherwise the ordered index is built from them and this
    /// record is put as usual.
    fn load_one(
        &mut self,
        ascending: &mut Option<Vec<KeyRef>>,
        key: Bytes,
        rec: Option<Record>,
    ) -> Result<(), StorageError> {
        if let (Some(refs), Some(rec)) = (ascending.as_mut(), rec.as_ref())
            && refs.last().is_none_or(|last| last.key() < &key[..])
        {
            let (node, deadline) = self.note_version(rec);
            let fresh = new_entry(&key, rec, node, deadline)?;
            refs.push(fresh.key_ref());
            self.value_bytes += rec.value.len() as u64;
            if deadline != 0 {
                self.deadlines.insert((deadline, Bytes::copy_from_slice(&key)));
            }
            let hash = self.hash(&key);
            let Inner { table, hasher, .. } = self;
            table.insert_unique(hash, fresh, |e| hasher.hash_one(e.key()));
            return Ok(());
        }
        self.end_ascending(ascending);
        self.put(&key, rec.as_ref())
    }

    /// Builds the ordered index from the keys [`Inner::load_one`] gathered, in one pass (they
    /// are sorted and unique, and the ordered index was empty when they began).
    fn end_ascending(&mut self, ascending: &mut Option<Vec<KeyRef>>) {
        if let Some(refs) = ascending.take() {
            self.order = Order::from_sorted(refs);
        }
    }

    /// Puts `entry` in the key's place in both indexes (or removes the key), keeping the
    /// deadline index right; returns the entry it displaced.
    fn place(&mut self, hash: u64, key: &[u8], entry: Option<Entry>) -> Option<Entry> {
        let Inner {
            order, table, hasher, ..
        } = self;
        let new_deadline = entry.as_ref().map_or(0, Entry::expires_at_ms);
        let new_bytes = entry.as_ref().map_or(0, |e| e.value().len() as u64);
        let old = match (table.find_entry(hash, |e| e.key() == key), entry) {
            (Ok(mut found), Some(fresh)) => {
                // The ordered index points at the new allocation before the old one is freed.
                order.replace(found.get().key_ref(), fresh.key_ref());
                Some(std::mem::replace(found.get_mut(), fresh))
            }
            (Ok(found), None) => {
                order.remove(found.get().key_ref());
                Some(found.remove().0)
            }
            (Err(_), Some(fresh)) => {
                order.insert(fresh.key_ref());
                table.insert_unique(hash, fresh, |e| hasher.hash_one(e.key()));
                None
            }
            (Err(_), None) => None,
        };
        self.value_bytes = self.value_bytes + new_bytes - old.as_ref().map_or(0, |e| e.value().len() as u64);
        let old_deadline = old.as_ref().map_or(0, Entry::expires_at_ms);
        if new_deadline != old_deadline {
            if new_deadline != 0 {
                // A compact copy: the caller's key may be a slice of a network buffer.
                self.deadlines.insert((new_deadline, Bytes::copy_from_slice(key)));
            }
            self.forget_deadline(key, old_deadline);
        }
        old
    }

    fn forget_deadline(&mut self, key: &[u8], deadline: u64) {
        if deadline != 0 {
            self.deadlines.remove(&(deadline, Bytes::copy_from_slice(key)));
        }
    }

    fn range_after<'a>(&'a self, after: Option<&'a [u8]>) -> impl Iterator<Item = &'a KeyRef> + 'a {
        self.order.range_after(after)
    }
}

impl MemoryBackend {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The records of `keys` under one hold of the index's lock: every swap is applied under
    /// the write lock, so they are all as of one moment. `None` (nothing copied) when their
    /// values together exceed `max_value_bytes`.
    pub(crate) fn records_now(&self, keys: &[Bytes], max_value_bytes: usize) -> Option<Vec<Option<Record>>> {
        let inner = self.read();
        let entries: Vec<Option<&Entry>> = keys.iter().map(|k| inner.get(k)).collect();
        let bytes = entries
            .iter()
            .flatten()
            .fold(0usize, |n, e| n.saturating_add(e.value().len()));
        (bytes <= max_value_bytes).then(|| entries.into_iter().map(|e| e.map(|e| inner.record(e))).collect())
    }

    /// Loads records without checks (durable backends replay into this).
    pub fn load(&self, key: Bytes, rec: Option<Record>) -> Result<(), StorageError> {
        self.write().put(&key, rec.as_ref())
    }

    /// Loads many records without checks under one hold of the lock: `fill` calls the loader
    /// it is given once per record. Into an empty index, while keys come in strictly
    /// ascending order (a snapshot is written in key order), each goes into the hash table
    /// alone, sized once for `expected_keys`, and the ordered index is built in one pass at
    /// the end: growing both a key at a time was most of a restart's time (perf: the B-tree
    /// inserts and the table's rehashes). A key out of order ends that; it and the rest are
    /// put one at a time. The ordered index is complete when this returns, error or not.
    pub fn load_many<T>(
        &self,
        expected_keys: usize,
        fill: impl FnOnce(&mut dyn FnMut(Bytes, Option<Record>) -> Result<(), StorageError>) -> T,
    ) -> T {
        let mut guard = self.write();
        let inner = &mut *guard;
        let mut ascending = (inner.table.is_empty() && inner.order.is_empty()).then(|| {
            let Inner { table, hasher, .. } = &mut *inner;
            table.reserve(expected_keys, |e| hasher.hash_one(e.key()));
            Vec::with_capacity(expected_keys)
        });
        let out = fill(&mut |key, rec| inner.load_one(&mut ascending, key, rec));
        inner.end_ascending(&mut ascending);
        out
    }

    /// Raises the highest version ever stored (a durable backend restores it from a snapshot:
    /// the key that held it may have been deleted since).
    pub(crate) fn observe_version(&self, v: &Hlc) {
        let mut inner = self.write();
        if inner.max_version.as_ref().is_none_or(|m| v > m) {
            inner.max_version = Some(v.clone());
        }
    }

    /// Takes back swaps that were applied but could not be made durable (the disk was full):
    /// `collect` runs under the index's write lock (so no swap is applied meanwhile) and returns
    /// the [`Undo`]s of every swap to take back, oldest first, plus what the caller needs; they
    /// are undone newest first, which leaves each key as it was before the oldest of them.
    pub(crate) fn rollback<R>(&self, collect: impl FnOnce() -> (Vec<Undo>, R)) -> R {
        let mut inner = self.write();
        let (undos, out) = collect();
        for undo in undos.into_iter().rev() {
            for (key, old) in undo.0.into_iter().rev() {
                let hash = inner.hash(&key);
                inner.place(hash, &key, old);
            }
        }
        out
    }

    /// [`Backend::swap_many`], running `then` under the same lock once the swaps are applied, so
    /// that what `then` records (a log append) comes in the order the swaps were applied. `then`
    /// gets what the swaps displaced, to take them back with [`MemoryBackend::rollback`].
    pub(crate) fn swap_then<R>(
        &self,
        swaps: &[Swap],
        max_keys: Option<u64>,
        then: impl FnOnce(Undo) -> R,
    ) -> Result<(SwapOutcome, Option<R>), StorageError> {
        self.swap_with(swaps, max_keys, true, then)
    }

    /// The swap itself; `undo` keeps what the swaps displaced (no overwrite in place then).
    fn swap_with<R>(
        &self,
        swaps: &[Swap],
        max_keys: Option<u64>,
        undo: bool,
        then: impl FnOnce(Undo) -> R,
    ) -> Result<(SwapOutcome, Option<R>), StorageError> {
        if !swaps.iter().all(fits) {
            return Err(too_long());
        }
        let mut inner = self.write();
        // Each key is hashed once, for the check and the write (SipHash is a visible part of SET).
        let one;
        let many: Vec<u64>;
        let hashes: &[u64] = match swaps {
            [s] => {
                one = [inner.hash(&s.key)];
                &one
            }
            _ => {
                many = swaps.iter().map(|s| inner.hash(&s.key)).collect();
                &many
            }
        };
        let outcome = check_swaps(&inner, swaps, hashes, max_keys);
        if outcome != SwapOutcome::Done {
            return Ok((outcome, None));
        }
        let mut displaced = Vec::with_capacity(if undo { swaps.len() } else { 0 });
        for (s, hash) in swaps.iter().zip(hashes) {
            // Cannot fail: every key and value fits (checked above).
            let old = inner.put_hashed(*hash, &s.key, s.new.as_ref(), !undo)?;
            if undo {
                displaced.push((s.key.clone(), old));
            }
        }
        Ok((outcome, Some(then(Undo(displaced)))))
    }

    /// Up to `n` records strictly after `after`, in key order (for snapshots, a chunk at a time).
    pub(crate) fn records_after(&self, after: Option<&[u8]>, n: usize) -> Vec<(Bytes, Record)> {
        let inner = self.read();
        inner
            .range_after(after)
            .take(n)
            .map(|k| (Bytes::copy_from_slice(k.key()), k.with_entry(|e| inner.record(e))))
            .collect()
    }

    pub(crate) fn max_version_now(&self) -> Option<Hlc> {
        self.read().max_version.clone()
    }

    pub(crate) fn key_count(&self) -> u64 {
        self.read().table.len() as u64
    }
}

/// Checks swaps against the index: every expected version must be the stored one, every
/// stored deadline as its swap's [`super::DeadlineCheck`] asks.
fn check_swaps(inner: &Inner, swaps: &[Swap], hashes: &[u64], max_keys: Option<u64>) -> SwapOutcome {
    let mut added: i64 = 0;
    for (s, hash) in swaps.iter().zip(hashes) {
        let cur = inner.get_hashed(*hash, &s.key);
        let matches = match (cur, &s.expected) {
            (None, None) => true,
            (Some(e), Some(v)) => inner.version_is(e, v),
            _ => false,
        };
        if !matches {
            return SwapOutcome::Conflict;
        }
        let deadline = cur.map(Entry::expires_at_ms).filter(|d| *d != 0);
        if !s.deadline.holds(deadline, s.new.as_ref()) {
            return SwapOutcome::Conflict;
        }
        added += i64::from(s.new.is_some()) - i64::from(cur.is_some());
    }
    if let Some(max) = max_keys
        && added > 0
        && inner.table.len() as i64 + added > max as i64
    {
        return SwapOutcome::TooManyKeys;
    }
    SwapOutcome::Done
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        let inner = self.read();
        Ok(inner.get(key).map(|e| inner.record(e)))
    }

    async fn get_many(
        &self,
        keys: &[Bytes],
        max_value_bytes: usize,
    ) -> Result<Option<Vec<Option<Record>>>, StorageError> {
        Ok(self.records_now(keys, max_value_bytes))
    }

    async fn get_head(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        let inner = self.read();
        Ok(inner.get(key).map(|e| inner.head(e)))
    }

    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        Ok(self.swap_with(swaps, max_keys, false, drop)?.0)
    }

    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError> {
        let inner = self.read();
        let mut page = KeyPage::default();
        let mut last: Option<&KeyRef> = None;
        for (seen, k) in inner.range_after(after).enumerate() {
            if seen == examine {
                page.resume_after = last.map(|l| Bytes::copy_from_slice(l.key()));
                return Ok(page);
            }
            let deadline = k.with_entry(Entry::expires_at_ms);
            let expired = deadline != 0 && deadline <= now_ms;
            if !expired && keep(k.key()) {
                page.keys.push(Bytes::copy_from_slice(k.key()));
            }
            last = Some(k);
        }
        Ok(page)
    }

    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError> {
        let inner = self.read();
        Ok(inner
            .deadlines
            .iter()
            .take_while(|(d, _)| *d <= now_ms)
            .filter_map(|(_, k)| inner.get(k).map(|e| (k.clone(), inner.version(e))))
            .take(limit)
            .collect())
    }

    async fn next_deadline(&self) -> Result<Option<u64>, StorageError> {
        Ok(self.read().deadlines.first().map(|(d, _)| *d))
    }

    async fn len(&self) -> Result<u64, StorageError> {
        Ok(self.read().table.len() as u64)
    }

    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        Ok(self.read().max_version.clone())
    }

    async fn value_bytes(&self) -> Result<Option<u64>, StorageError> {
        Ok(Some(self.read().value_bytes))
    }

    /// Volatile on its own (the durable backend uses it as its index and says `true`).
    fn persistent(&self) -> bool {
        false
    }
}
