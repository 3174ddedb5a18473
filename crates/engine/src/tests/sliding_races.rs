//! Sliding expiry against replicas that share a store, on every backend: replicas take no lock
//! in common, so a swap decided earlier can land later. A deadline only moves forward, and an
//! expiry never removes a key whose deadline a slide moved (the storage swap decides both:
//! `storage::DeadlineCheck`). The interleavings are forced by holding one replica's next
//! storage write until the test lets it go, never by timing.

use std::sync::Mutex;

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::*;
use crate::storage::{Backend, KeyPage, RoundTrips, StorageError, StorageHealth, SwapOutcome, Write, Written};

/// A backend that passes everything through, except that the next write, once armed, waits
/// until the test releases it (after telling the test it arrived).
#[derive(Clone)]
struct Gate {
    inner: Store,
    held: Arc<Mutex<Option<Held>>>,
}

struct Held {
    arrived: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

/// The test's side of an armed gate.
struct Armed {
    arrived: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
}

impl Gate {
    fn new(inner: Store) -> Gate {
        Gate {
            inner,
            held: Arc::new(Mutex::new(None)),
        }
    }

    /// Holds the next write.
    fn arm(&self) -> Armed {
        let (arrived_tx, arrived) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        *self.held.lock().unwrap() = Some(Held {
            arrived: arrived_tx,
            release: release_rx,
        });
        Armed { arrived, release }
    }
}

impl Armed {
    /// Waits until the held write arrived (the caller decided it and is waiting to land it).
    async fn arrived(&mut self) {
        (&mut self.arrived).await.expect("the write arrives");
    }

    fn release(self) {
        let _ = self.release.send(());
    }
}

#[async_trait]
impl Backend for Gate {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        self.inner.backend().get(key).await
    }
    async fn get_head(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        self.inner.backend().get_head(key).await
    }
    async fn get_many(
        &self,
        keys: &[Bytes],
        max_value_bytes: usize,
    ) -> Result<Option<Vec<Option<Record>>>, StorageError> {
        self.inner.backend().get_many(keys, max_value_bytes).await
    }
    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        self.inner.backend().swap_many(swaps, max_keys).await
    }
    async fn write(&self, w: &Write<'_>) -> Result<Written, StorageError> {
        let held = self.held.lock().unwrap().take();
        if let Some(held) = held {
            let _ = held.arrived.send(());
            let _ = held.release.await;
        }
        self.inner.backend().write(w).await
    }
    async fn get_marked(
        &self,
        key: &[u8],
        request: Option<&[u8]>,
    ) -> Result<(Option<Record>, Option<Bytes>), StorageError> {
        self.inner.backend().get_marked(key, request).await
    }
    fn change_log(&self) -> Option<Arc<dyn crate::storage::log::ChangeLog>> {
        self.inner.backend().change_log()
    }
    fn round_trips(&self) -> Option<RoundTrips> {
        self.inner.backend().round_trips()
    }
    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError> {
        self.inner.backend().scan(after, examine, now_ms, keep).await
    }
    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError> {
        self.inner.backend().expired(now_ms, limit).await
    }
    async fn next_deadline(&self) -> Result<Option<u64>, StorageError> {
        self.inner.backend().next_deadline().await
    }
    async fn len(&self) -> Result<u64, StorageError> {
        self.inner.backend().len().await
    }
    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        self.inner.backend().max_version().await
    }
    async fn value_bytes(&self) -> Result<Option<u64>, StorageError> {
        self.inner.backend().value_bytes().await
    }
    fn persistent(&self) -> bool {
        self.inner.backend().persistent()
    }
    fn health(&self) -> StorageHealth {
        self.inner.backend().health()
    }
    fn health_changes(&self) -> Option<tokio::sync::watch::Receiver<StorageHealth>> {
        self.inner.backend().health_changes()
    }
}

/// Two replicas on one fresh store: the first writes through a [`Gate`].
async fn two_replicas() -> (Gate, Fx, Fx) {
    let mut stores = test_replica_stores(2).await;
    let plain = stores.pop().unwrap();
    let gate = Gate::new(stores.pop().unwrap());
    let gated = fx_on(Store::new(gate.clone()), Limits::default()).await;
    let other = fx_on(plain, Limits::default()).await;
    (gate, gated, other)
}

fn set_sliding(key: &str, ttl_ms: u64) -> Command {
    Command::Set(Set {
        key: b(key),
        value: b("v"),
        condition: SetCondition::Always,
        ttl_ms: Some(ttl_ms),
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: true,
    })
}

/// Replica A reads at 900 ms and decides the deadline 900 + 1000 + 100 (slack 10 %); replica
/// B reads at 950 ms and lands 950 + 1100 first; A's swap lands last. Today's swap compared
/// the version only (a slide keeps it), so A moved the deadline back by 50 ms.
async fn an_earlier_slide_landing_last_keeps_the_later_deadline() {
    let (gate, a, b_) = two_replicas().await;
    let version = a.engine.execute(set_sliding("s", 1000)).await.unwrap().version.unwrap();
    for f in [&a, &b_] {
        f.clock.advance(900);
    }
    let mut armed = gate.arm();
    let engine = a.engine.clone();
    let reader = tokio::spawn(async move { engine.read(&b("s")).await });
    armed.arrived().await;
    for f in [&a, &b_] {
        f.clock.advance(50);
    }
    let seen = b_.engine.read(&b("s")).await.unwrap().unwrap();
    assert_eq!(seen.expires_at_ms, Some(T0 + 950 + 1100));
    armed.release();
    let first = reader.await.unwrap().unwrap().unwrap();
    assert_eq!(first.version, version);
    let stored = a.record("s").await.unwrap();
    assert_eq!(stored.version, version, "a slide keeps the version");
    assert_eq!(
        stored.expires_at_ms,
        Some(T0 + 950 + 1100),
        "the later deadline stands, whichever swap landed last"
    );
}

/// Replica A's expiry driver finds the key due at its deadline and decides to remove it;
/// meanwhile replica B (whose clock is 1 ms behind) reads it, alive, and slides it. A's removal
/// expected the same version, which the slide kept: today it deleted a key whose reader had
/// just been told it lives on.
async fn an_expiry_never_removes_a_key_a_slide_moved() {
    let (gate, mut a, b_) = two_replicas().await;
    b_.engine.execute(set_sliding("s", 1000)).await.unwrap();
    a.changes();
    a.clock.advance(1000);
    b_.clock.advance(999);
    let mut armed = gate.arm();
    let engine = a.engine.clone();
    let sweep = tokio::spawn(async move { engine.expire_due(10).await });
    armed.arrived().await;
    assert_eq!(b_.get("s").await.reply, value("v"), "alive for B's reader");
    let slid = b_.record("s").await.unwrap().expires_at_ms;
    assert_eq!(slid, Some(T0 + 999 + 1100));
    armed.release();
    assert_eq!(sweep.await.unwrap().unwrap(), 0, "nothing was removed");
    let stored = a.record("s").await.expect("the slid key lives on");
    assert_eq!(stored.expires_at_ms, slid);
    assert_eq!(a.get("s").await.reply, value("v"));
    assert!(
        !a.changes().iter().any(|c| c.kind == ChangeKind::Expire),
        "no expiry was published"
    );
}

/// The same race through a read: replica A's GET finds the key expired and removes it, while
/// replica B's reader slides it first. A's removal loses, and A reads the key again: alive.
async fn a_read_whose_removal_lost_to_a_slide_answers_the_key() {
    let (gate, a, b_) = two_replicas().await;
    b_.engine.execute(set_sliding("s", 1000)).await.unwrap();
    a.clock.advance(1000);
    b_.clock.advance(999);
    let mut armed = gate.arm();
    let engine = a.engine.clone();
    let reader = tokio::spawn(async move { engine.read(&b("s")).await });
    armed.arrived().await;
    assert_eq!(b_.get("s").await.reply, value("v"));
    armed.release();
    let seen = reader.await.unwrap().unwrap().expect("A's reader sees the slid key");
    assert_eq!(seen.value, b("v"));
    assert_eq!(seen.expires_at_ms, Some(T0 + 999 + 1100));
    assert!(b_.record("s").await.is_some(), "the key lives on");
}

on_every_backend!(
    an_earlier_slide_landing_last_keeps_the_later_deadline,
    an_expiry_never_removes_a_key_a_slide_moved,
    a_read_whose_removal_lost_to_a_slide_answers_the_key,
);
