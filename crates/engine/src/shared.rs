//! Replicas on shared storage: every change and every KEYNOTIFY registration change goes
//! through the storage's change log ([`crate::storage::log`]), in the same atomic step as its
//! swap, and each replica reads the log back (the follower below). So a replica's watch history
//! holds every replica's changes in log order (= swap order), and its copy of the registrations
//! is the same as every other replica's at the same log position.
//!
//! - Watchers: the follower pushes every change into the local history; a write returns once the
//!   follower has read it back (bounded by [`ChangeLog::patience`]), so the change is in this
//!   replica's history when the writer hears of it, as with local storage.
//! - KEYNOTIFY: each observing client has one owner at each log position, the same on every
//!   replica, which sends its notifications in log order ([`super::owners`]).
//! - Records: every change refreshes the replica's record cache ([`super::cache`]).
//! - Expiry: a change that sets a deadline wakes every replica's expiry driver.
//! - A gap (the log lost entries this replica had not read: trimmed while it was cut off, or a
//!   Redis that lost its tail) ends every watcher's stream with `overflow`, empties the record
//!   cache, and the registrations and members are loaded again; nothing is skipped silently.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::notify::{EveryKey, KeyNotification, Observers, RegisterError};
use super::owners::Routing;
use super::{Change, ChangeKind, Engine, EngineError, Inner, KeyNotify, Reply, Response};
use crate::storage::log::{
    ChangeLog, LogBody, LogCursor, LogEntry, LogRead, MemberOp, ObserveOutcome, ObserverBounds, ObserverOp,
};
use crate::storage::{ChangeRecord, ChangeRecordKind, Record};

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
    /// Membership and who owes which notification ([`super::owners`]).
    routing: std::sync::Mutex<Routing>,
    /// The heartbeat task, once this replica sends notifications; `Some(None)` once it left.
    heartbeat: std::sync::Mutex<Option<Option<tokio::task::AbortHandle>>>,
    /// The progress last recorded in storage.
    recorded: std::sync::atomic::AtomicU64,
}

impl Drop for SharedLog {
    fn drop(&mut self) {
        if let Some(h) = self.follower.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.abort();
        }
        self.stop_heartbeats();
    }
}

impl SharedLog {
    /// Reads the starting point (and the registrations and members as of it) before the
    /// engine serves.
    pub(super) async fn open(log: Arc<dyn ChangeLog>) -> Result<(SharedLog, LogCursor, Observers), EngineError> {
        let start = log.start().await?;
        let (observers, routing) = registry_from(start.registrations, start.members);
        let applied = watch::Sender::new(Applied {
            gaps: 0,
            seq: start.cursor.seq(),
        });
        let shared = SharedLog {
            log,
            applied,
            follower: Default::default(),
            routing: std::sync::Mutex::new(routing),
            heartbeat: Default::default(),
            recorded: Default::default(),
        };
        Ok((shared, start.cursor, observers))
    }

    /// Starts reading the log after `cursor`, for as long as the engine lives.
    pub(super) fn follow(&self, engine: &Engine, cursor: LogCursor) {
        let task = tokio::spawn(follow(Arc::downgrade(&engine.0), self.log.clone(), cursor));
        *self.follower.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    }

    pub(super) fn routing(&self) -> std::sync::MutexGuard<'_, Routing> {
        self.routing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last log position applied.
    pub(super) fn applied_seq(&self) -> u64 {
        self.applied.borrow().seq
    }

    pub(super) fn set_recorded(&self, progress: u64) {
        self.recorded.store(progress, std::sync::atomic::Ordering::SeqCst);
    }

    pub(super) fn recorded_progress(&self) -> u64 {
        self.recorded.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Starts renewing this replica's membership (once).
    pub(super) fn start_heartbeats(&self, engine: &Engine) {
        let mut slot = self.heartbeat.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            let task = tokio::spawn(Engine::heartbeats(engine.downgrade()));
            *slot = Some(Some(task.abort_handle()));
        }
    }

    /// Whether this replica renews a membership (it sends notifications and has not left).
    pub(super) fn heartbeats_running(&self) -> bool {
        matches!(*self.heartbeat.lock().unwrap_or_else(|e| e.into_inner()), Some(Some(_)))
    }

    /// Stops renewing the membership; true if it was running.
    pub(super) fn stop_heartbeats(&self) -> bool {
        let mut slot = self.heartbeat.lock().unwrap_or_else(|e| e.into_inner());
        match slot.replace(None) {
            Some(Some(h)) => {
                h.abort();
                true
            }
            _ => false,
        }
    }

    /// Waits until this replica's history holds every change any replica had applied when
    /// called (a watch snapshot's counterpart of waiting for local writes in flight), at most
    /// the log's patience.
    pub(super) async fn settle(&self) -> Result<(), EngineError> {
        let head = self.log.head().await?;
        self.wait_applied(Some(head)).await;
        Ok(())
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

fn registry_from(registrations: Vec<crate::storage::log::Registration>, members: Vec<u64>) -> (Observers, Routing) {
    let mut observers = Observers::default();
    let mut routing = Routing::new(members);
    for r in registrations {
        routing.set_home(&r.client, r.home);
        for key in r.keys {
            let _ = observers.register(&r.client, r.session, &key, &unbounded());
        }
    }
    (observers, routing)
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
                if let Some(cache) = &engine.0.cache {
                    cache.clear();
                }
                match log.start().await {
                    Ok(start) => {
                        let member = start.members.contains(&log.origin());
                        let (observers, routing) = registry_from(start.registrations, start.members);
                        engine.with_observers(|o| *o = observers);
                        if let Some(s) = engine.shared() {
                            *s.routing() = routing;
                        }
                        // What it sent of the log it read, unless Redis lost that log (an empty
                        // restart numbers entries from 1 again): then nothing of the new one.
                        let sent = match start.cursor.seq() < cursor.seq() {
                            true => 0,
                            false => engine.notified_through(),
                        };
                        cursor = start.cursor;
                        engine.set_applied(|a| {
                            a.gaps += 1;
                            a.seq = cursor.seq();
                        });
                        if engine.shared().is_some_and(SharedLog::heartbeats_running) {
                            rejoin(&engine, &log, member.then_some(sent), cursor.seq()).await;
                        }
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

/// After a gap, this replica owned observers for changes it will never read (those between the
/// gap and its reload): if the membership still names it (`sent`: its heartbeat renewed it
/// before the follower noticed), it leaves, saying it sent up to `sent`, so that the others send
/// what it owed past that (see `owners.rs`); then it joins again at once, not at the next
/// heartbeat (until then no member would own observers registered meanwhile). A write through
/// this replica is answered only once the follower applied it, so after this.
async fn rejoin(engine: &Engine, log: &Arc<dyn ChangeLog>, sent: Option<u64>, at: u64) {
    if let Some(sent) = sent
        && let Err(e) = log.leave(sent).await
    {
        tracing::warn!(cause = %e, "leaving the members after a gap failed; the member timeout hands over");
    }
    match log.heartbeat(engine.0.hlc.node(), at).await {
        Ok(progress) => {
            if let Some(s) = engine.shared() {
                s.routing().recorded(&progress);
            }
        }
        Err(e) => tracing::warn!(cause = %e, "joining the members again failed; the next heartbeat retries"),
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
                if let Some(cache) = &self.0.cache {
                    cache.changed(&record.key, &record.version, stored_record(&record).as_ref());
                }
                // Every replica's clock passes every version it reads: the next version it
                // issues, for this key or a key created after this one's removal, is later.
                self.0.hlc.observe(&record.version);
                let imported = record.imported();
                let change = change_of(record);
                self.route_notifications(log.origin(), entry.seq, &change);
                if imported {
                    self.0.feed.push_imported(vec![change]);
                } else {
                    self.0.feed.push(change);
                }
                if deadline {
                    self.0.deadline_added.notify_one();
                }
            }
            LogBody::Observe(op) => {
                let limits = unbounded();
                let (client, home) = self.with_observers(|o| match op {
                    ObserverOp::Register {
                        client,
                        session,
                        key,
                        home,
                    } => {
                        let _ = o.register(&client, session, &key, &limits);
                        (client, Some(home))
                    }
                    ObserverOp::Unregister { client, key } => {
                        o.unregister(&client, &key);
                        (client, None)
                    }
                    ObserverOp::DropClient { client, session } => {
                        o.drop_client(&client, session);
                        (client, None)
                    }
                });
                // A client's home is that of its latest registration, and goes with the last.
                if let Some(s) = self.shared() {
                    match home {
                        Some(home) => s.routing().set_home(&client, home),
                        None if self.observers().keys_of(&client) == 0 => s.routing().set_home(&client, None),
                        None => {}
                    }
                }
            }
            LogBody::Member(MemberOp::Join { member }) => {
                if let Some(s) = self.shared() {
                    s.routing().joined(member, entry.seq);
                }
            }
            LogBody::Member(MemberOp::Leave { member, progress }) => {
                let Some(s) = self.shared() else { return };
                let mine = s.routing().left(member, progress, entry.seq, log.origin());
                if !mine.is_empty() {
                    tracing::info!(
                        member,
                        notifications = mine.len(),
                        "a replica left: sending the KEYNOTIFY notifications it may not have sent"
                    );
                }
                for (client, change) in mine {
                    self.queue_notification(entry.seq, &change, vec![client]);
                }
            }
        }
    }

    /// The notifications of a change at log position `at`: this replica queues those it owns,
    /// and keeps those other members owe in case they die.
    fn route_notifications(&self, me: u64, at: u64, change: &Change) {
        // The state topics mirror observes every key without registering (`EveryKey`).
        let every_key = self.0.keynotify.get().and_then(|tx| tx.every_key());
        let observed = self.0.observed_keys.load(std::sync::atomic::Ordering::Relaxed) > 0;
        if !observed && every_key.is_none() {
            return;
        }
        let mut observers = match observed {
            true => self.observers().of_key(&change.key),
            false => Vec::new(),
        };
        let mut mine = Vec::new();
        match every_key.clone() {
            // Each replica feeds its own embedded broker: no other replica can, so nobody owes
            // this replica's mirror anything and it owes nobody else's.
            Some((EveryKey::EachReplica, id)) => mine.push(id),
            // Behind a shared broker the mirror is one more client without a home: one owner
            // per log position, the others keep what it owes in case it dies.
            Some((EveryKey::OneReplica, id)) => observers.push(id),
            None => {}
        }
        if observers.is_empty() && mine.is_empty() {
            return;
        }
        let Some(shared) = self.shared() else { return };
        let limits = &self.0.limits.observers;
        {
            let mut routing = shared.routing();
            for client in observers {
                match routing.owner(&client) {
                    Some(owner) if owner == me => mine.push(client),
                    Some(owner) if !routing.is_home_bound(&client) => routing.owe_within(
                        at,
                        owner,
                        client,
                        change.clone(),
                        (limits.queue_len, limits.queue_bytes),
                    ),
                    // No member yet (replicas starting): the mirror is sent by each replica
                    // that has one rather than by none (a repeated retained value is harmless,
                    // a lost one stays stale).
                    None if every_key.as_ref().is_some_and(|(_, id)| *id == client) => mine.push(client),
                    // Only its home reaches it, or no replica sends notifications yet.
                    _ => {}
                }
            }
        }
        if !mine.is_empty() {
            self.queue_notification(at, change, mine);
        }
    }

    /// Queues notifications for the door (copies: they may wait, and must not pin buffers).
    fn queue_notification(&self, at: u64, change: &Change, observers: Vec<Arc<str>>) {
        let Some(tx) = self.0.keynotify.get() else { return };
        tx.send(KeyNotification {
            change: change.detached(),
            observers,
            at,
        });
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
            // A broker session is known only for clients of this replica's embedded broker,
            // and only this replica can reach those.
            let home = c.session.map(|_| shared.log.origin());
            ObserverOp::Register {
                client: c.client,
                session: c.session,
                key: c.key,
                home,
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
        // Most disconnects are of clients that observe nothing: no Redis call for them. The
        // local copy follows the shared log; a registration another replica made that is not
        // applied here yet is left to the idle sweep (on when clients can reach any replica).
        if held == 0 {
            return 0;
        }
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

/// The log record of an engine change; `stored` is a SET's new record; `imported`: see
/// [`ChangeRecordKind::Set`].
pub(super) fn record_of(change: &Change, stored: Option<&Record>, imported: bool) -> ChangeRecord {
    ChangeRecord {
        key: change.key.clone(),
        version: change.version.clone(),
        kind: match &change.kind {
            ChangeKind::Set(v) => ChangeRecordKind::Set {
                value: v.clone(),
                expires_at_ms: stored.and_then(|r| r.expires_at_ms),
                fencing: stored.and_then(|r| r.fencing.clone()),
                imported,
            },
            ChangeKind::Delete => ChangeRecordKind::Delete,
            ChangeKind::Expire => ChangeRecordKind::Expire,
        },
    }
}

/// The record a logged change left stored (`None`: a removal).
fn stored_record(r: &ChangeRecord) -> Option<Record> {
    match &r.kind {
        ChangeRecordKind::Set {
            value,
            expires_at_ms,
            fencing,
            ..
        } => Some(Record {
            value: value.clone(),
            version: r.version.clone(),
            fencing: fencing.clone(),
            expires_at_ms: *expires_at_ms,
            // The log does not carry it: a cached record only starts writes, which set their
            // own, and one that looks expired is read again (`Engine::start_write`).
            slide_ms: None,
        }),
        ChangeRecordKind::Delete | ChangeRecordKind::Expire => None,
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
