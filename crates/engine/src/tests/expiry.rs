//! `Engine::run_expiry`, the driver: it sleeps until the earliest deadline and is woken by a
//! write that adds an earlier one. Deadlines are read on the manual clock; the driver sleeps on
//! tokio's clock, paused here: both move only together, when a test advances them. A test
//! waits for the `Expire` change on the feed (an event), bounded by a timeout on the paused
//! clock, so a driver that does not wake fails in no real time.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;

/// Far beyond the driver's longest sleep without a deadline (60 s): a driver that is not woken
/// by a new deadline sleeps through this and the wait for the change fails.
const FAR: u64 = 3_600_000;

struct Driver {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Fx {
    fn start_driver(&self) -> Driver {
        let (stop, stopped) = oneshot::channel::<()>();
        let engine = self.engine.clone();
        let task = tokio::spawn(async move {
            engine
                .run_expiry(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Driver { stop, task }
    }

    /// Moves the manual clock and tokio's paused clock together.
    async fn advance(&self, ms: u64) {
        self.clock.advance(ms);
        tokio::time::advance(Duration::from_millis(ms)).await;
    }

    /// The next change, within `WAIT_MS` of paused time.
    async fn next_change(&mut self) -> Change {
        tokio::time::timeout(Duration::from_millis(WAIT_MS), self.feed.recv())
            .await
            .expect("a change in time")
            .expect("the change feed")
            .change
            .clone()
    }
}

/// Shorter than [`FAR`] and than the driver's 60 s sleep without deadlines.
const WAIT_MS: u64 = 10_000;

impl Driver {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_millis(WAIT_MS), self.task)
            .await
            .expect("the driver stops on shutdown")
            .expect("the driver did not panic");
    }
}

/// The driver's tests run on tokio's paused clock, which a networked backend's timeouts cannot
/// follow: memory storage only (the backends' expiry contract is in the storage suite).
async fn fx() -> Fx {
    fx_on(Store::memory(), Limits::default()).await
}

/// Lets the spawned driver run until it waits (its sleep or the deadline notification): with
/// tokio's clock paused, a sleep of paused time completes only once every task is idle.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn expiry_driver_removes_keys_at_their_deadlines() {
    let mut f = fx().await;
    let a = f.ok(&["SET", "a", "1", "PX", "100"]).await.version.unwrap();
    f.ok(&["SET", "b", "1", "PX", "300"]).await;
    f.changes();
    let driver = f.start_driver();
    settle().await;
    f.no_changes();

    f.advance(99).await;
    settle().await;
    f.no_changes();
    assert!(f.record("a").await.is_some(), "not before its deadline");

    f.advance(1).await;
    let c = f.next_change().await;
    assert_eq!((c.key.clone(), c.kind.clone()), (b("a"), ChangeKind::Expire));
    assert!(c.version > a);
    assert!(f.record("a").await.is_none(), "removed from storage, not only hidden");
    assert!(f.record("b").await.is_some());

    f.advance(200).await;
    let c = f.next_change().await;
    assert_eq!((c.key, c.kind), (b("b"), ChangeKind::Expire));
    assert!(f.record("b").await.is_none());
    driver.stop().await;
}

/// A SET that adds a deadline earlier than the one the driver sleeps towards (or the first
/// deadline at all) wakes it.
#[tokio::test(start_paused = true)]
async fn expiry_driver_is_woken_by_an_earlier_deadline() {
    for first in [Some(FAR), None] {
        let mut f = fx().await;
        if let Some(ms) = first {
            f.ok(&["SET", "late", "1", "PX", &ms.to_string()]).await;
        }
        let driver = f.start_driver();
        settle().await;
        f.changes();

        f.ok(&["SET", "early", "1", "PX", "100"]).await;
        assert_eq!(f.changes().len(), 1);
        settle().await;
        f.advance(100).await;
        let c = f.next_change().await;
        assert_eq!((c.key, c.kind), (b("early"), ChangeKind::Expire), "{first:?}");
        assert_eq!(f.record("late").await.is_some(), first.is_some());
        driver.stop().await;
    }
}

/// A transaction that adds a deadline wakes the driver too.
#[tokio::test(start_paused = true)]
async fn expiry_driver_is_woken_by_a_transaction_deadline() {
    let mut f = fx().await;
    let driver = f.start_driver();
    settle().await;
    let op = TxOp::Set(Set {
        key: b("tx"),
        value: b("1"),
        condition: SetCondition::Always,
        ttl_ms: Some(100),
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    });
    f.engine.transact(vec![op]).await.unwrap();
    f.changes();
    settle().await;
    f.advance(100).await;
    let c = f.next_change().await;
    assert_eq!((c.key, c.kind), (b("tx"), ChangeKind::Expire));
    driver.stop().await;
}

/// Keys that expired while nothing ran (a restart, say) go at the driver's first pass.
#[tokio::test(start_paused = true)]
async fn expiry_driver_sweeps_what_is_overdue_when_it_starts() {
    let mut f = fx().await;
    for k in ["x", "y", "z"] {
        f.ok(&["SET", k, "1", "PX", "10"]).await;
    }
    f.ok(&["SET", "stays", "1"]).await;
    f.clock.advance(50);
    f.changes();
    let driver = f.start_driver();
    let mut gone = Vec::new();
    for _ in 0..3 {
        let c = f.next_change().await;
        assert_eq!(c.kind, ChangeKind::Expire);
        gone.push(c.key);
    }
    gone.sort();
    assert_eq!(gone, [b("x"), b("y"), b("z")]);
    assert_eq!(f.store.backend().len().await.unwrap(), 1);
    driver.stop().await;
}
