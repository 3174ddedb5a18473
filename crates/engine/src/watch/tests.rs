//! Watches: selectors, live changes, resume by version, and snapshots that neither miss nor
//! repeat a change, including writes that land at every point of a snapshot (between pages,
//! during a page's scan, on keys already read and keys not read yet).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;

use super::*;
use crate::hlc::ManualClock;
use crate::storage::memory::MemoryBackend;
use crate::storage::{Backend, KeyPage, Record, StorageError, Store, Swap, SwapOutcome};
use crate::{ChangeKind, Command, Del, DelCondition, FeedLimits, KeyFilter, Limits, Set, SetCondition};

const T0: u64 = 1_700_000_000_000;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn engine_with(store: Store, scan_page: usize, feed: FeedLimits) -> Engine {
    let limits = Limits {
        scan_page,
        feed,
        ..Limits::default()
    };
    Engine::open(store, "n", Arc::new(ManualClock::new(T0)), limits)
        .await
        .unwrap()
}

async fn engine(scan_page: usize) -> Engine {
    engine_with(Store::memory(), scan_page, FeedLimits::default()).await
}

async fn set(e: &Engine, key: &str, value: &str) -> Hlc {
    let cmd = Set {
        key: b(key),
        value: b(value),
        condition: SetCondition::Always,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    e.execute(Command::Set(cmd)).await.unwrap().version.unwrap()
}

async fn del(e: &Engine, key: &str) {
    let cmd = Del {
        key: b(key),
        fencing: None,
        condition: DelCondition::Always,
    };
    e.execute(Command::Del(cmd)).await.unwrap();
}

fn every_key() -> WatchSpec {
    WatchSpec {
        wanted: KeyFilter::new(|_| true),
        prefix: Bytes::new(),
        only: None,
    }
}

/// A watcher's view: key -> (value, version), built only from what the stream said.
#[derive(Default, Debug)]
struct Replica {
    map: BTreeMap<Bytes, (Bytes, Hlc)>,
    /// Every (key, version) applied, to catch a change sent twice.
    seen: HashSet<(Bytes, Hlc)>,
    synced: Option<Option<Hlc>>,
    resets: usize,
    last_resumable: Option<Hlc>,
}

impl Replica {
    /// Applies one item; panics on a repeat or on a version going backwards.
    fn apply(&mut self, item: WatchItem) {
        match item {
            WatchItem::Snapshot { key, entry } => self.put(key, entry.value, entry.version),
            WatchItem::Change { event, resumable } => {
                let c = &event.change;
                if resumable {
                    self.last_resumable = Some(c.version.clone());
                }
                match &c.kind {
                    ChangeKind::Set(v) => self.put(c.key.clone(), v.clone(), c.version.clone()),
                    ChangeKind::Delete | ChangeKind::Expire => {
                        assert!(self.seen.insert((c.key.clone(), c.version.clone())), "repeated {c:?}");
                        if let Some((_, old)) = self.map.remove(&c.key) {
                            assert!(old < c.version, "delete {c:?} older than {old}");
                        }
                    }
                }
            }
            WatchItem::Reset => {
                self.resets += 1;
                self.map.clear();
            }
            WatchItem::Synced { resume } => {
                self.last_resumable = resume.clone();
                self.synced = Some(resume);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn put(&mut self, key: Bytes, value: Bytes, version: Hlc) {
        assert!(
            self.seen.insert((key.clone(), version.clone())),
            "repeated {key:?} {version}"
        );
        if let Some((_, old)) = self.map.get(&key) {
            assert!(*old < version, "{key:?}: {version} after {old}");
        }
        self.map.insert(key, (value, version));
    }
}

/// The store's content as the watcher should see it.
async fn contents(e: &Engine) -> BTreeMap<Bytes, (Bytes, Hlc)> {
    let mut out = BTreeMap::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = e.keys_with_prefix(b"", after.as_deref(), 100).await.unwrap();
        for k in page.keys {
            if let Some(entry) = e.read(&k).await.unwrap() {
                out.insert(k, (entry.value, entry.version));
            }
        }
        match page.resume_after {
            Some(r) => after = Some(r),
            None => return out,
        }
    }
}

#[test]
fn selectors() {
    let all = Selector::default();
    assert!(all.wants(b"x", || "x".into()));
    assert_eq!(all.only_keys(), None);
    let s = Selector::new(vec![b("k1")], &["a*".into()]).unwrap();
    assert!(s.wants(b"k1", || unreachable!("a listed key needs no name")));
    assert!(s.wants(b"p||ab", || "ab".into()));
    assert!(!s.wants(b"b", || "b".into()));
    assert_eq!(s.only_keys(), None, "a pattern needs a scan");
    assert_eq!(
        Selector::new(vec![b("k")], &[]).unwrap().only_keys(),
        Some(vec![b("k")])
    );
    assert!(Selector::new(vec![], &["[".into()]).unwrap_err().contains("\"[\""));
}

#[tokio::test]
async fn live_changes_are_filtered_then_an_overflow_ends_the_stream() {
    let feed = FeedLimits {
        max_events: 2,
        ..FeedLimits::default()
    };
    let e = engine_with(Store::memory(), 10, feed).await;
    let spec = WatchSpec {
        wanted: KeyFilter::new(|k| k.starts_with(b"a")),
        ..every_key()
    };
    let s = e.watch(spec, Start::Live);
    tokio::pin!(s);
    set(&e, "b", "1").await;
    let v = set(&e, "a", "1").await;
    match s.next().await {
        Some(WatchItem::Change { event, resumable: true }) => assert_eq!(event.change.version, v),
        other => panic!("{other:?}"),
    }
    for i in 0..7 {
        set(&e, "a", &i.to_string()).await;
    }
    assert!(matches!(s.next().await, Some(WatchItem::Overflow { missed: 5 })));
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn a_resume_gets_exactly_the_changes_after_the_version_given() {
    let e = engine(10).await;
    let v1 = set(&e, "a", "1").await;
    set(&e, "b", "2").await;
    del(&e, "a").await;
    let v4 = set(&e, "c", "3").await;
    let s = e.watch(every_key(), Start::After(v1));
    tokio::pin!(s);
    let mut got = Vec::new();
    for _ in 0..3 {
        match s.next().await {
            Some(WatchItem::Change { event, resumable: true }) => got.push(event.change.clone()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got[0].key, b("b"));
    assert_eq!(got[1].kind, ChangeKind::Delete);
    assert_eq!(got[2].version, v4);
    // Then live changes.
    let v5 = set(&e, "d", "4").await;
    assert!(matches!(s.next().await, Some(WatchItem::Change { event, .. }) if event.change.version == v5));
}

#[tokio::test]
async fn a_resume_from_before_the_history_resets_and_sends_a_snapshot() {
    let feed = FeedLimits {
        max_events: 3,
        ..FeedLimits::default()
    };
    let e = engine_with(Store::memory(), 2, feed).await;
    let old = set(&e, "gone", "x").await;
    del(&e, "gone").await;
    for k in ["a", "b", "c", "d", "e"] {
        set(&e, k, k).await;
    }
    set(&e, "c", "c2").await;
    let mut replica = Replica::default();
    // The watcher knew a key that is gone meanwhile: the reset makes it forget it.
    replica.map.insert(b("gone"), (b("x"), old.clone()));
    let s = e.watch(every_key(), Start::After(old));
    tokio::pin!(s);
    while replica.synced.is_none() {
        replica.apply(s.next().await.unwrap());
    }
    assert_eq!(replica.resets, 1);
    assert_eq!(replica.map, contents(&e).await);
    // The position named at the end resumes exactly: nothing repeated, nothing missed.
    let resume = replica.synced.clone().unwrap().unwrap();
    let v = set(&e, "f", "f").await;
    let again = e.watch(every_key(), Start::After(resume));
    tokio::pin!(again);
    assert!(matches!(again.next().await, Some(WatchItem::Change { event, .. }) if event.change.version == v));
}

#[tokio::test]
async fn an_unknown_version_resets_too_and_the_origin_names_the_start() {
    let e = engine(10).await;
    // Before any change, a live watch is named by the feed's origin.
    let s = e.watch(every_key(), Start::Snapshot);
    tokio::pin!(s);
    let Some(WatchItem::Synced { resume: Some(origin) }) = s.next().await else {
        panic!("an empty store's snapshot is just the end marker");
    };
    let v = set(&e, "a", "1").await;
    let resumed = e.watch(every_key(), Start::After(origin));
    tokio::pin!(resumed);
    assert!(matches!(resumed.next().await, Some(WatchItem::Change { event, .. }) if event.change.version == v));
    let unknown = e.watch(every_key(), Start::After(Hlc::new(T0 - 5, 0, "elsewhere")));
    tokio::pin!(unknown);
    assert!(matches!(unknown.next().await, Some(WatchItem::Reset)));
    assert!(matches!(unknown.next().await, Some(WatchItem::Snapshot { key, .. }) if key == b("a")));
    assert!(matches!(unknown.next().await, Some(WatchItem::Synced { .. })));
}

/// Changes land between the items of a snapshot, on keys of every kind: already read, in the
/// current page but not read yet, in later pages, new keys inside and after the current page.
#[tokio::test]
async fn snapshot_with_changes_between_its_items_misses_and_repeats_nothing() {
    let e = engine(3).await;
    for k in ["a", "c", "e", "g", "i", "k", "m"] {
        set(&e, k, "0").await;
    }
    let s = e.watch(every_key(), Start::Snapshot);
    tokio::pin!(s);
    let mut replica = Replica::default();
    let mut step = 0;
    while replica.synced.is_none() {
        replica.apply(s.next().await.unwrap());
        step += 1;
        match step {
            // "a" read: change it (news), change "c" (not read yet: the read reflects it), a
            // later page's "k", a new key inside the page and one after it, delete "e".
            1 => {
                set(&e, "a", "1").await;
                set(&e, "c", "1").await;
                set(&e, "k", "1").await;
                set(&e, "b", "new").await;
                set(&e, "z", "new").await;
                del(&e, "e").await;
            }
            4 => {
                set(&e, "a", "2").await;
                del(&e, "g").await;
                set(&e, "g", "back").await;
                set(&e, "m", "2").await;
            }
            6 => {
                del(&e, "i").await;
                set(&e, "d", "late").await;
            }
            _ => {}
        }
    }
    assert_eq!(replica.map, contents(&e).await);
    assert!(
        replica.map.contains_key(&b("b")),
        "a key created inside the page being sent"
    );
    set(&e, "after", "x").await;
    replica.apply(s.next().await.unwrap());
    assert_eq!(replica.map, contents(&e).await);
}

/// A backend that writes through the engine while a scan runs (before or after reading the
/// index), so the change is published while the snapshot's scan is in progress.
struct MidScan {
    inner: MemoryBackend,
    engine: OnceLock<Engine>,
    /// Writes to do during the next scans: (before the inner scan?, key, value or delete).
    writes: Mutex<Vec<(bool, &'static str, Option<&'static str>)>>,
}

/// `Store::new` takes the backend by value: the test keeps another handle on it.
#[derive(Clone)]
struct Shared(Arc<MidScan>);

impl std::ops::Deref for Shared {
    type Target = MidScan;
    fn deref(&self) -> &MidScan {
        &self.0
    }
}

#[async_trait]
impl Backend for Shared {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        self.inner.get(key).await
    }
    async fn get_many(
        &self,
        keys: &[Bytes],
        max_value_bytes: usize,
    ) -> Result<Option<Vec<Option<Record>>>, StorageError> {
        self.inner.get_many(keys, max_value_bytes).await
    }
    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        self.inner.swap_many(swaps, max_keys).await
    }
    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError> {
        let writes = std::mem::take(&mut *self.writes.lock().unwrap());
        let engine = self.engine.get().cloned();
        let write = async |before: bool| {
            for (b4, key, value) in &writes {
                if *b4 == before
                    && let Some(e) = &engine
                {
                    match value {
                        Some(v) => drop(set(e, key, v).await),
                        None => del(e, key).await,
                    }
                }
            }
        };
        write(true).await;
        let page = self.inner.scan(after, examine, now_ms, keep).await;
        write(false).await;
        page
    }
    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError> {
        self.inner.expired(now_ms, limit).await
    }
    async fn next_deadline(&self) -> Result<Option<u64>, StorageError> {
        self.inner.next_deadline().await
    }
    async fn len(&self) -> Result<u64, StorageError> {
        self.inner.len().await
    }
    fn persistent(&self) -> bool {
        self.inner.persistent()
    }
    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        self.inner.max_version().await
    }
}

#[tokio::test]
async fn writes_during_a_page_scan_are_read_again_under_the_lock() {
    let backend = Shared(Arc::new(MidScan {
        inner: MemoryBackend::default(),
        engine: OnceLock::new(),
        writes: Mutex::new(Vec::new()),
    }));
    let store = Store::new(backend.clone());
    let e = engine_with(store, 3, FeedLimits::default()).await;
    let _ = backend.engine.set(e.clone());
    for k in ["a", "c", "e", "g", "i"] {
        set(&e, k, "0").await;
    }
    // First page: before its scan "c" is deleted (the scan does not list it, its change is
    // published after the scan started); after its scan "b" is created (not listed either) and
    // "a" changed (listed, with a newer value than the scan saw).
    *backend.writes.lock().unwrap() = vec![(true, "c", None), (false, "b", Some("new")), (false, "a", Some("1"))];
    let s = e.watch(every_key(), Start::Snapshot);
    tokio::pin!(s);
    let mut replica = Replica::default();
    let mut page = 0;
    while replica.synced.is_none() {
        replica.apply(s.next().await.unwrap());
        // The second page's scan: delete a key of the first page and create one in the second.
        if page == 0 {
            *backend.writes.lock().unwrap() = vec![(true, "a", None), (false, "h", Some("new"))];
            page = 1;
        }
    }
    assert_eq!(replica.map, contents(&e).await);
    assert!(replica.map.contains_key(&b("b")) && replica.map.contains_key(&b("h")));
    assert!(!replica.map.contains_key(&b("a")) && !replica.map.contains_key(&b("c")));
}

#[tokio::test]
async fn a_snapshot_of_named_keys_reads_only_them() {
    let e = engine(2).await;
    set(&e, "x", "1").await;
    set(&e, "y", "2").await;
    let spec = WatchSpec {
        wanted: KeyFilter::new(|k| k == b"y" || k == b"missing"),
        prefix: Bytes::new(),
        only: Some(vec![b("y"), b("missing")]),
    };
    let s = e.watch(spec, Start::Snapshot);
    tokio::pin!(s);
    assert!(matches!(s.next().await, Some(WatchItem::Snapshot { key, .. }) if key == b("y")));
    assert!(matches!(s.next().await, Some(WatchItem::Synced { .. })));
    set(&e, "x", "3").await;
    let v = set(&e, "missing", "now").await;
    assert!(matches!(s.next().await, Some(WatchItem::Change { event, resumable: true }) if event.change.version == v));
}

#[tokio::test]
async fn a_prefixed_snapshot_stays_in_its_range() {
    let e = engine(2).await;
    for k in ["a", "s||1", "s||2", "s||3", "t||1", "z"] {
        set(&e, k, k).await;
    }
    let spec = WatchSpec {
        wanted: KeyFilter::new(|k| k.starts_with(b"s||")),
        prefix: b("s||"),
        only: None,
    };
    let s = e.watch(spec, Start::Snapshot);
    tokio::pin!(s);
    let mut replica = Replica::default();
    while replica.synced.is_none() {
        replica.apply(s.next().await.unwrap());
    }
    let keys: Vec<_> = replica.map.keys().cloned().collect();
    assert_eq!(keys, vec![b("s||1"), b("s||2"), b("s||3")]);
}

/// Writers on several threads while snapshots run: replaying each stream gives the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_under_concurrent_writers_end_equal_to_the_store() {
    for round in 0..20u64 {
        let e = engine(4).await;
        for i in 0..30 {
            set(&e, &format!("k{i:02}"), "0").await;
        }
        let writers: Vec<_> = (0..3u64)
            .map(|w| {
                let e = e.clone();
                tokio::spawn(async move {
                    let mut x = round * 7 + w * 13 + 1;
                    for n in 0..300u64 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let key = format!("k{:02}", (x >> 33) % 40);
                        if (x >> 20).is_multiple_of(4) {
                            del(&e, &key).await;
                        } else {
                            set(&e, &key, &format!("{w}-{n}")).await;
                        }
                        if n % 16 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        let s = e.watch(every_key(), Start::Snapshot);
        tokio::pin!(s);
        let mut replica = Replica::default();
        while replica.synced.is_none() {
            replica.apply(s.next().await.unwrap());
        }
        for w in writers {
            w.await.unwrap();
        }
        // Everything written is published by now; a marker written last ends the replay.
        let end = set(&e, "zz-end", "x").await;
        while replica.map.get(&b("zz-end")).is_none_or(|(_, v)| *v != end) {
            replica.apply(s.next().await.unwrap());
        }
        assert_eq!(replica.map, contents(&e).await, "round {round}");
    }
}

/// Replicas on one Redis: a snapshot on one replica while both write. Another replica's change
/// reaches this replica's history through the shared log, after its write: the snapshot waits
/// for the log (and checks versions) so that nothing is missed or sent twice there too.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_on_a_replica_while_another_writes() {
    use crate::storage::redis::server::{Flavor, TestServer};
    use crate::storage::{RedisOptions, StorageKind};
    let server = TestServer::start(Flavor::Redis);
    let replica = |node: &'static str| {
        let url = server.url();
        async move {
            let Ok(StorageKind::Redis(url)) = url.parse() else {
                panic!("not a redis url");
            };
            let options = RedisOptions {
                prefix: "watch-test:".into(),
                timeout: std::time::Duration::from_secs(5),
                ..Default::default()
            };
            let store = Store::new(crate::storage::redis::RedisBackend::open(&url, &options).await.unwrap());
            let limits = Limits {
                scan_page: 4,
                ..Limits::default()
            };
            Engine::open(store, node, Arc::new(ManualClock::new(T0)), limits)
                .await
                .unwrap()
        }
    };
    let (a, other) = (replica("a").await, replica("b").await);
    for i in 0..30 {
        set(&other, &format!("k{i:02}"), "0").await;
    }
    for round in 0..5u64 {
        let writers: Vec<_> = [a.clone(), other.clone(), other.clone()]
            .into_iter()
            .enumerate()
            .map(|(w, e)| {
                tokio::spawn(async move {
                    let mut x = round * 31 + w as u64 * 7 + 3;
                    for n in 0..80u64 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let key = format!("k{:02}", (x >> 33) % 36);
                        if (x >> 20).is_multiple_of(4) {
                            del(&e, &key).await;
                        } else {
                            set(&e, &key, &format!("{w}-{n}")).await;
                        }
                    }
                })
            })
            .collect();
        let s = a.watch(every_key(), Start::Snapshot);
        tokio::pin!(s);
        let mut replica = Replica::default();
        while replica.synced.is_none() {
            replica.apply(s.next().await.unwrap());
        }
        for w in writers {
            w.await.unwrap();
        }
        let end = set(&other, "zz-end", &round.to_string()).await;
        while replica.map.get(&b("zz-end")).is_none_or(|(_, v)| *v != end) {
            replica.apply(s.next().await.unwrap());
        }
        assert_eq!(replica.map, contents(&a).await, "round {round}");
    }
}
