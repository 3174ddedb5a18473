//! Replicas on shared storage: every change and every KEYNOTIFY registration change goes
//! through the storage's change log ([`crate::storage::log`]), in the same atomic step as its
//! swap, and each replica reads the log back (the follower below). So a replica's watch history
//! holds every replica's changes in log order (= swap order), and its copy of the registrations
//! is the same as every other replica's at the same log position.
//!
//! - Watchers: the follower pushes every change into the local history; a write returns once the
//!   follower has read it back (bounded by [`ChangeLog::patience`]), so the change is in this
//!   replica's history when the writer hears of it, as with local storage.
//! - KEYNOTIFY: the replica that applied a change (its origin) sends its notifications, to the
//!   observers registered at that log position: one notification per change per observer.
//! - Expiry: a change that sets a deadline wakes every replica's expiry driver.
//! - A gap (the log lost entries this replica had not read: trimmed while it was cut off, or a
//!   Redis that lost its tail) ends every watcher's stream with `overflow`, and the registrations
//!   are loaded again; nothing is skipped silently.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::notify::{Observers, RegisterError};
use super::{Change, ChangeKind, Engine, EngineError, Inner, KeyNotify, Reply, Response};
use crate::storage::log::{
    ChangeLog, LogBody, LogCursor, LogEntry, LogRead, ObserveOutcome, ObserverBounds, ObserverOp,
};
use crate::storage::{ChangeRecord, ChangeRecordKind};

/// Entries read per call.
const READ_BATCH: usize = 512;

/// Where the follower is: gaps seen so far, and the last entry applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Applied {
    gaps: u64,
    seq: u64,
}

/// The engine's side of a shared change log.
pub(super) struct SharedLog {
    pub(super) log: Arc<dyn ChangeLog>,
    applied: watch::Sender<Applied>,
    follower: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for SharedLog {
    fn drop(&mut self) {
        if let Some(h) = self.follower.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.abort();
        }
    }
}

impl SharedLog {
    /// Reads the starting point (and the registrations as of it) before the engine serves.
    pub(super) async fn open(log: Arc<dyn ChangeLog>) -> Result<(SharedLog, LogCursor, Observers), EngineError> {
        let start = log.start().await?;
        let observers = observers_from(start.registrations);
        let applied = watch::Sender::new(Applied {
            gaps: 0,
            seq: start.cursor.seq(),
        });
        let shared = SharedLog {
            log,
            applied,
            follower: Default::default(),
        };
        Ok((shared, start.cursor, observers))
    }

    /// Starts reading the log after `cursor`, for as long as the engine lives.
    pub(super) fn follow(&self, engine: &Engine, cursor: LogCursor) {
        let task = tokio::spawn(follow(Arc::downgrade(&engine.0), self.log.clone(), cursor));
        *self.follower.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    }

    /// Waits until the follower has applied entry `seq` (or met a gap), at most the log's
    /// patience: past it the write stands and its change reaches the history when the log
    /// can be read again.
    pub(super) async fn wait_applied(&self, seq: Option<u64>) {
        let Some(seq) = seq else { return };
        let mut rx = self.applied.subscribe();
        let gaps = rx.borrow().gaps;
        let caught_up = rx.wait_for(|a| a.seq >= seq || a.gaps != gaps);
        if tokio::time::timeout(self.log.patience(), caught_up).await.is_err() {
            tracing::warn!(seq, "the shared change log was not read back in time; answering anyway");
        }
    }
}

fn observers_from(registrations: Vec<crate::storage::log::Registration>) -> Observers {
    let mut observers = Observers::default();
    for r in registrations {
        for key in r.keys {
            let _ = observers.register(&r.client, r.session, &key, &unbounded());
        }
    }
    observers
}

/// The registrations in the log were checked against the bounds where they were applied.
fn unbounded() -> super::ObserverLimits {
    super::ObserverLimits {
        per_client: usize::MAX,
        total: usize::MAX,
        ..Default::default()
    }
}

async fn follow(engine: Weak<Inner>, log: Arc<dyn ChangeLog>, mut cursor: LogCursor) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let read = log.read(&cursor, READ_BATCH).await;
        let Some(engine) = engine.upgrade().map(Engine) else {
            return;
        };
        match read {
            Ok(LogRead::Entries(entries, next)) => {
                backoff = Duration::from_millis(50);
                for entry in entries {
                    engine.apply_entry(&log, entry);
                }
                cursor = next;
                engine.set_applied(|a| a.seq = cursor.seq());
            }
            Ok(LogRead::Gap) => {
                tracing::warn!(
                    after = cursor.seq(),
                    "the shared change log lost entries this replica had not read: watchers get overflow, registrations are reloaded"
                );
                engine.0.feed.gap();
                match log.start().await {
                    Ok(start) => {
                        let observers = observers_from(start.registrations);
                        engine.with_observers(|o| *o = observers);
                        cursor = start.cursor;
                        engine.set_applied(|a| {
                            a.gaps += 1;
                            a.seq = cursor.seq();
                        });
                    }
                    Err(e) => {
                        tracing::warn!(cause = %e, "reloading the shared registrations failed; retrying");
                        drop(engine);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                }
            }
            Err(e) => {
                // Resume from the last entry read once the log answers again.
                tracing::warn!(cause = %e, after = cursor.seq(), "reading the shared change log failed; retrying");
                drop(engine);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

impl Engine {
    pub(super) fn shared(&self) -> Option<&SharedLog> {
        self.0.shared.as_ref()
    }

    fn set_applied(&self, f: impl FnOnce(&mut Applied)) {
        if let Some(s) = self.shared() {
            s.applied.send_modify(f);
        }
    }

    /// One log entry, in log order.
    fn apply_entry(&self, log: &Arc<dyn ChangeLog>, entry: LogEntry) {
        match entry.body {
            LogBody::Change(record) => {
                let deadline = matches!(
                    record.kind,
                    ChangeRecordKind::Set {
                        expires_at_ms: Some(_),
                        ..
                    }
                );
                let change = change_of(record);
                // The replica that applied the change notifies its observers, once.
                if entry.origin == log.origin() {
                    self.notify_observers(&change);
                }
                self.0.feed.push(change);
                if deadline {
                    self.0.deadline_added.notify_one();
                }
            }
            LogBody::Observe(op) => {
                let limits = unbounded();
                self.with_observers(|o| match op {
                    ObserverOp::Register { client, session, key } => {
                        let _ = o.register(&client, session, &key, &limits);
                    }
                    ObserverOp::Unregister { client, key } => {
                        o.unregister(&client, &key);
                    }
                    ObserverOp::DropClient { client, session } => {
                        o.drop_client(&client, session);
                    }
                });
            }
        }
    }

    /// KEYNOTIFY through the shared registrations.
    pub(super) async fn keynotify_shared(&self, shared: &SharedLog, c: KeyNotify) -> Result<Response, EngineError> {
        let limits = &self.0.limits.observers;
        let bounds = ObserverBounds {
            per_client: limits.per_client,
            total: limits.total,
        };
        let op = if c.stop {
            ObserverOp::Unregister {
                client: c.client,
                key: c.key,
            }
        } else {
            ObserverOp::Register {
                client: c.client,
                session: c.session,
                key: c.key,
            }
        };
        let (outcome, logged) = shared.log.observe(&op, bounds).await?;
        shared.wait_applied(logged).await;
        let refused = match outcome {
            ObserveOutcome::Applied => None,
            ObserveOutcome::Unchanged if c.stop => return Ok(Response::new(Reply::Int(0), None)),
            ObserveOutcome::Unchanged => None,
            ObserveOutcome::ClientFull => Some(RegisterError::ClientFull),
            ObserveOutcome::RegistryFull => Some(RegisterError::RegistryFull),
        };
        match refused {
            None => Ok(Response::new(Reply::Ok, None)),
            Some(why) => Err(self.refused_registration(why)),
        }
    }

    /// Drops a client's registrations on every replica.
    pub(super) async fn drop_client_shared(&self, shared: &SharedLog, client: &str, session: Option<u64>) -> usize {
        let held = self.observers().keys_of(client);
        let op = ObserverOp::DropClient {
            client: client.to_owned(),
            session,
        };
        match shared
            .log
            .observe(
                &op,
                ObserverBounds {
                    per_client: 0,
                    total: 0,
                },
            )
            .await
        {
            Ok((ObserveOutcome::Applied, logged)) => {
                shared.wait_applied(logged).await;
                held
            }
            Ok(_) => 0,
            Err(e) => {
                tracing::warn!(client, cause = %e, "dropping the KEYNOTIFY registrations of a client failed");
                0
            }
        }
    }

    /// Drops the registrations of clients that no replica saw for `idle`.
    pub(super) async fn sweep_idle_shared(&self, shared: &SharedLog, idle: Duration) -> usize {
        let now = self.0.hlc.wall_ms();
        let seen: Vec<(String, u64)> = self
            .observers()
            .last_seen()
            .into_iter()
            .map(|(client, ago)| (client.to_string(), now.saturating_sub(ago.as_millis() as u64)))
            .collect();
        let latest = match shared.log.seen(&seen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(cause = %e, "the KEYNOTIFY idle sweep could not reach the shared registrations");
                return 0;
            }
        };
        let mut dropped = 0;
        for ((client, _), latest) in seen.iter().zip(latest) {
            if now.saturating_sub(latest) > idle.as_millis() as u64
                && self.drop_client_shared(shared, client, None).await > 0
            {
                dropped += 1;
            }
        }
        dropped
    }
}

/// The engine's change for a log record.
fn change_of(r: ChangeRecord) -> Change {
    Change {
        key: r.key,
        version: r.version,
        kind: match r.kind {
            ChangeRecordKind::Set { value, .. } => ChangeKind::Set(value),
            ChangeRecordKind::Delete => ChangeKind::Delete,
            ChangeRecordKind::Expire => ChangeKind::Expire,
        },
    }
}

/// The log record of an engine change; `expires_at_ms` of a SET's new record.
pub(super) fn record_of(change: &Change, expires_at_ms: Option<u64>) -> ChangeRecord {
    ChangeRecord {
        key: change.key.clone(),
        version: change.version.clone(),
        kind: match &change.kind {
            ChangeKind::Set(v) => ChangeRecordKind::Set {
                value: v.clone(),
                expires_at_ms,
            },
            ChangeKind::Delete => ChangeRecordKind::Delete,
            ChangeKind::Expire => ChangeRecordKind::Expire,
        },
    }
}

/// A request's stored outcome: only applied writes are marked (a write that changed nothing
/// may simply run again). `S<version>` a SET applied, `D<version>` a key deleted.
pub(super) fn encode_outcome(r: &Response) -> Option<Bytes> {
    let version = r.version.as_ref()?;
    let tag = match r.reply {
        Reply::Ok => 'S',
        Reply::Int(1) => 'D',
        _ => return None,
    };
    Some(Bytes::from(format!("{tag}{version}")))
}

pub(super) fn decode_outcome(b: &[u8]) -> Result<Response, EngineError> {
    let bad = || EngineError::Storage(crate::storage::StorageError::Corrupt("a stored request outcome".into()));
    let text = std::str::from_utf8(b).map_err(|_| bad())?;
    let (reply, version) = match text.split_at_checked(1) {
        Some(("S", v)) => (Reply::Ok, v),
        Some(("D", v)) => (Reply::Int(1), v),
        _ => return Err(bad()),
    };
    Ok(Response::new(reply, Some(version.parse().map_err(|_| bad())?)))
}
