//! The change log that replicas on shared storage (Redis) share: every change, in the order the
//! swaps were applied, every KEYNOTIFY registration change and every change of the replicas
//! that send notifications, in the same order. Each replica reads it back to fill its own
//! watch history, its copy of the registrations and of the membership, so all replicas see one
//! sequence and agree, at every position, on who notifies whom. Storage types only: the
//! engine converts.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::{ChangeRecord, StorageError};

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Position: consecutive numbers, one per entry.
    pub seq: u64,
    /// The [`ChangeLog::origin`] of the replica that appended it.
    pub origin: u64,
    pub body: LogBody,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogBody {
    Change(ChangeRecord),
    Observe(ObserverOp),
    Member(MemberOp),
}

/// A change of the replicas that send KEYNOTIFY notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberOp {
    /// The replica with this origin sends notifications from here on.
    Join { member: u64 },
    /// It stopped, or its membership lapsed (no renewal within the member timeout); `progress`
    /// is the last position up to which it recorded every notification it owed as sent.
    Leave { member: u64, progress: u64 },
}

/// A change of the KEYNOTIFY registrations, as applied (already checked against the bounds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObserverOp {
    /// `client` (in broker session `session`, when known) observes `key`. A registration from
    /// another session of the same client first drops what the old session registered.
    /// `home`: the only replica that can reach the client (the one whose embedded broker it is
    /// connected to); `None`: any replica can (a shared external broker).
    Register {
        client: String,
        session: Option<u64>,
        key: Bytes,
        home: Option<u64>,
    },
    Unregister {
        client: String,
        key: Bytes,
    },
    /// Every registration of `client` (only those of `session`, when given).
    DropClient {
        client: String,
        session: Option<u64>,
    },
}

/// The registrations of one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub client: String,
    pub session: Option<u64>,
    /// See [`ObserverOp::Register`].
    pub home: Option<u64>,
    pub keys: Vec<Bytes>,
}

/// Where a reader is: opaque to the engine, which only hands it back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogCursor {
    /// The backend's own id of the last entry read (empty: none yet).
    pub(crate) id: Bytes,
    /// Its sequence number (0: none yet).
    pub(crate) seq: u64,
    /// Its unique tag, to tell it from a different entry given the same number after the
    /// storage lost its tail (a restart without persistence).
    pub(crate) tag: Bytes,
}

impl LogCursor {
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// A consistent starting point: the newest entry, and the registrations and the members as of
/// it.
#[derive(Debug, Clone)]
pub struct LogStart {
    pub cursor: LogCursor,
    pub registrations: Vec<Registration>,
    /// The origins of the replicas that send notifications.
    pub members: Vec<u64>,
}

/// What a read found.
#[derive(Debug, Clone)]
pub enum LogRead {
    /// Entries right after the cursor, in order (possibly none), and the cursor after them.
    Entries(Vec<LogEntry>, LogCursor),
    /// Entries after the cursor are gone (trimmed, or lost by the storage): start again.
    Gap,
}

/// The bounds of the registrations, checked where the registration is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObserverBounds {
    pub per_client: usize,
    pub total: usize,
}

/// What [`ChangeLog::observe`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObserveOutcome {
    Applied,
    /// Nothing to do (registered already, or nothing to remove).
    Unchanged,
    ClientFull,
    RegistryFull,
}

#[async_trait]
pub trait ChangeLog: Send + Sync + 'static {
    /// This process's id in the entries it appends (random per process).
    fn origin(&self) -> u64;

    /// How long a writer waits to read back its own change before answering anyway.
    fn patience(&self) -> Duration;

    /// The newest entry and the registrations as of it, read atomically.
    async fn start(&self) -> Result<LogStart, StorageError>;

    /// The sequence number of the newest entry (0: none yet): every change applied before the
    /// call is at or below it (a watch snapshot waits until it has read that far).
    async fn head(&self) -> Result<u64, StorageError>;

    /// Up to `max` entries after `after`, waiting a while (about a second) for one.
    async fn read(&self, after: &LogCursor, max: usize) -> Result<LogRead, StorageError>;

    /// Applies a registration change to the shared registrations within `bounds`, and logs
    /// it. Also returns the sequence number of the last entry it logged, if any (a refused
    /// registration from a new session still logs the drop of the old session's).
    async fn observe(
        &self,
        op: &ObserverOp,
        bounds: ObserverBounds,
    ) -> Result<(ObserveOutcome, Option<u64>), StorageError>;

    /// How often [`ChangeLog::heartbeat`] runs: well within the member timeout.
    fn heartbeat_every(&self) -> Duration;

    /// Renews this replica's membership (joining, logged, when it is not a member), records
    /// `progress` (every notification it owes up to that position was sent), drops the members
    /// whose membership lapsed (logged, with their last recorded progress), and returns the
    /// recorded progress of every member. This process's first join also drops (logged, before
    /// it joins) the member of an earlier process of the same `node`: that one died, and its
    /// notifications go to the others before any moves to the new process.
    async fn heartbeat(&self, node: &str, progress: u64) -> Result<Vec<(u64, u64)>, StorageError>;

    /// Leaves the membership (logged, with `progress`).
    async fn leave(&self, progress: u64) -> Result<(), StorageError>;

    /// Records when clients were last seen (ms since the epoch; 0: only asking) and returns,
    /// for each, about the latest time any replica recorded (0: none), so that the KEYNOTIFY
    /// idle timeout counts requests to every replica.
    async fn seen(&self, clients: &[(String, u64)]) -> Result<Vec<u64>, StorageError>;
}
