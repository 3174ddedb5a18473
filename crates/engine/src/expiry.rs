//! Expiry: keys whose deadline has passed are removed through the conditional swap, and their
//! observers are told (an `Expire` change). The driver ([`Engine::run_expiry`]) sleeps until the
//! earliest deadline; reads remove an expired key they meet; a write refused at `max_keys`
//! removes a bounded number of due keys inline and leaves the rest to the driver.

use bytes::Bytes;

use super::{Change, ChangeKind, Engine, EngineError};
use crate::hlc::Hlc;
use crate::storage::{DeadlineCheck, Swap, Written};

/// Due keys removed per storage write (one log record, one fsync, one script call).
const EXPIRY_BATCH: usize = 256;
/// Most due keys a write refused at `max_keys` removes itself before giving up.
const INLINE_EXPIRY: usize = 64;
/// After a sweep that failed, the driver tries again this much later.
const SWEEP_RETRY_MS: u64 = 1_000;

impl Engine {
    /// Removes up to `limit` keys whose deadline has passed, telling observers. Returns how many.
    pub async fn expire_due(&self, limit: usize) -> Result<usize, EngineError> {
        let mut removed = 0;
        while removed < limit {
            let now = self.0.hlc.wall_ms();
            let want = (limit - removed).min(EXPIRY_BATCH);
            let due = self.0.store.backend().expired(now, want).await?;
            if due.is_empty() {
                break;
            }
            let batch = due.len();
            removed += self.expire_batch(due, now).await?;
            if batch < want {
                break;
            }
        }
        Ok(removed)
    }

    /// Removes a batch of due keys in one swap, under all their stripe locks (taken in order,
    /// as transactions do). Keys changed since they were found due are left alone, and so are
    /// keys whose deadline a read moved meanwhile (on another replica: the swap checks it).
    async fn expire_batch(&self, due: Vec<(Bytes, Hlc)>, now: u64) -> Result<usize, EngineError> {
        let mut stripes: Vec<usize> = due.iter().map(|(k, _)| self.stripe(k)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for i in stripes {
            guards.push(self.0.stripes[i].lock().await);
        }
        let mut swaps = Vec::with_capacity(due.len());
        let mut changes: Vec<(Change, Option<crate::storage::Record>)> = Vec::with_capacity(due.len());
        for (key, _) in due {
            let Some(r) = self.0.store.backend().get(&key).await? else {
                continue;
            };
            let Some(deadline) = r.expires_at_ms.filter(|_| r.is_expired(now)) else {
                continue;
            };
            let change = Change {
                key: key.clone(),
                version: self.0.hlc.next_after(&[&r.version]),
                kind: ChangeKind::Expire,
            };
            changes.push((change, None));
            swaps.push(Swap {
                key,
                expected: Some(r.version),
                new: None,
                // A slide keeps the version: only the deadline tells that it moved.
                deadline: DeadlineCheck::Still(deadline),
            });
        }
        if swaps.is_empty() {
            return Ok(0);
        }
        let n = changes.len();
        match self.commit(&swaps, None, changes, None).await? {
            Written::Done { .. } => Ok(n),
            // Another node changed one of them first: remove the others one by one.
            Written::Conflict | Written::Behind(_) | Written::TooManyKeys | Written::Repeated(_) => {
                let mut n = 0;
                for swap in swaps {
                    if let Some(r) = self.0.store.backend().get(&swap.key).await?
                        && r.is_expired(now)
                        && matches!(
                            self.remove(&swap.key, &r, ChangeKind::Expire, None).await?,
                            super::Removed::Done(_)
                        )
                    {
                        n += 1;
                    }
                }
                Ok(n)
            }
        }
    }

    /// A write was refused at `max_keys`: expired keys the driver has not removed yet still
    /// count, yet read as absent everywhere. Removes a bounded number of them (the driver does
    /// the rest) and says whether any went, so the write may be tried once more.
    pub(super) async fn make_room(&self) -> Result<bool, EngineError> {
        if self.0.limits.max_keys.is_none() {
            return Ok(false);
        }
        let removed = self.expire_due(INLINE_EXPIRY).await?;
        if removed == INLINE_EXPIRY {
            self.0.deadline_added.notify_one();
        }
        Ok(removed > 0)
    }

    /// Runs expiry until `shutdown` resolves: sleeps until the earliest deadline, or until a
    /// write adds an earlier one.
    pub async fn run_expiry(&self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let swept = self.expire_due(usize::MAX).await;
            let wait = match (&swept, self.0.store.backend().next_deadline().await) {
                // Due keys that could not be removed (the disk is full, the storage is away)
                // stay due: try again in a while, not at once.
                (Err(_), _) | (Ok(_), Err(_)) => SWEEP_RETRY_MS,
                (Ok(_), Ok(Some(d))) => d.saturating_sub(self.0.hlc.wall_ms()).max(1),
                (Ok(_), Ok(None)) => 60_000,
            };
            match swept {
                Err(EngineError::StorageFull) => {
                    tracing::debug!("expiry sweep deferred: the storage is full")
                }
                Err(e) => tracing::error!(cause = %e, source = ?std::error::Error::source(&e), "expiry sweep failed"),
                Ok(_) => {}
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(std::time::Duration::from_millis(wait)) => {}
                _ = self.0.deadline_added.notified() => {}
            }
        }
    }
}
