//! Sliding expiry: a key saved with a sliding time to live (`SET ... PX ms SLIDING`, Dapr
//! `ttlSliding`) lives until `ttl` after its last read, through any door.
//!
//! A read that finds the stored deadline nearer than the time to live stores a new one: the
//! same record (same value, same version, so ETags and watchers see nothing) with the deadline
//! at `now + ttl + slack`, through the ordinary conditional swap on the version read. That
//! swap is what makes the extension durable (the durable log's group commit, or one Redis
//! script), and it is the only write a read causes: until the stored deadline comes within
//! the time to live again, reads write nothing. With `slack` = `--sliding-ttl-slack-percent`
//! of the time to live, a key read without pause costs one write per slack, however often it
//! is read, and expires between `ttl` and `ttl + slack` after its last read: never earlier.
//!
//! A swap that loses (the key changed since it was read) writes nothing: the change that won
//! set its own deadline. The extension publishes no change: it is not one.
//!
//! A deadline only moves forward. The swap carries `DeadlineCheck::Later`: the storage
//! stores the new deadline only if it is later than the stored one, in the same atomic step as
//! the version comparison. The version cannot tell two slides apart (a slide keeps it), and
//! replicas sharing a store take no lock in common, so a reader that decided earlier may land
//! its swap last; its earlier deadline is then refused. For the same reason the expiry's
//! removal carries `DeadlineCheck::Still` (`expiry.rs`): a key a slide moved is not removed.

use bytes::Bytes;

use super::{Engine, EngineError, Written};
use crate::storage::{DeadlineCheck, Record, Swap, Write};

impl Engine {
    /// The deadline a read of `r` at `now_ms` must store, when it must store one.
    fn slid_deadline(&self, r: &Record, now_ms: u64) -> Option<u64> {
        let (Some(slide), Some(deadline)) = (r.slide_ms, r.expires_at_ms) else {
            return None;
        };
        let due = now_ms.saturating_add(slide);
        if deadline >= due {
            return None;
        }
        let slack = slide.saturating_mul(u64::from(self.0.limits.sliding_slack_percent)) / 100;
        Some(due.saturating_add(slack))
    }

    /// Pushes the deadline of `key`, just read as `r`, out as a read requires; returns the
    /// record as it now stands for the reader (its deadline moved when the swap held).
    pub(super) async fn slide(&self, key: &Bytes, mut r: Record) -> Result<Record, EngineError> {
        if self.slid_deadline(&r, self.now_ms()).is_none() {
            return Ok(r);
        }
        let _guard = self.lock(key).await;
        // Decided under the lock, from the clock as it is now: readers of this service land
        // their swaps in the order they decide them (other replicas: see `DeadlineCheck`).
        let Some(deadline) = self.slid_deadline(&r, self.now_ms()) else {
            return Ok(r);
        };
        let moved = Record {
            expires_at_ms: Some(deadline),
            ..r.clone()
        };
        let swap = Swap {
            key: key.clone(),
            expected: Some(r.version.clone()),
            new: Some(moved),
            deadline: DeadlineCheck::Later,
        };
        let write = Write {
            swaps: std::slice::from_ref(&swap),
            checks: &[],
            max_keys: None,
            changes: &[],
            request: None,
        };
        match self.0.store.backend().write(&write).await {
            Ok(Written::Done { .. }) => r.expires_at_ms = Some(deadline),
            // Changed since the read, or slid to a later deadline by another reader: the read
            // stands as of then; the stored record has its own deadline.
            Ok(Written::Conflict | Written::Behind(_) | Written::TooManyKeys | Written::Repeated(_)) => {}
            // A full disk refuses writes and serves reads: the read is answered, the deadline
            // stays (logged once per refusal by the storage's health).
            Err(crate::storage::StorageError::Full(_)) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(r)
    }
}
