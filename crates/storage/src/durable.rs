//! The durable backend: the in-memory index of [`MemoryBackend`] plus an append-only log of
//! CRC-checked records and periodic snapshots, in one data directory.
//!
//! A `swap_many` is checked and applied to the index under its lock, and in the same critical
//! section encoded as one log frame and queued, so the log holds swaps in the order they were
//! applied and a multi-key swap is one record (atomic on disk). The call then waits until its
//! frame is acknowledged by the commit thread ([`writer`]), which writes whatever is queued with
//! one `write` and, with [`FsyncMode::Always`], one `fdatasync`: concurrent writers share it
//! (group commit).
//!
//! Until its write is acknowledged, a change is not served: `get` of a key with a write in
//! flight waits for that write's acknowledgement, and `scan` for every write in flight. So no
//! reader sees a value that a crash could still take back. An I/O error while logging poisons
//! the backend: every later call fails, the process must restart and recover from disk.
//!
//! Files (see `format.rs` for the bytes, ARCHITECTURE.md for the rules):
//! - `log-<seq>.log`: log segments, appended in `seq` order; only the newest is written.
//! - `snap-<seq>.snap`: every key as of some moment after segment `seq` was started; recovery
//!   loads the newest snapshot and replays segments `seq..` on top of it.
//! - `LOCK`: held (advisory lock) while a process has the directory open.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::oneshot;

use super::memory::MemoryBackend;
use super::{Backend, KeyPage, Record, StorageError, StorageHealth, Swap, SwapOutcome};
use crate::hlc::{Clock, Hlc, SystemClock};

mod backup;
mod crypt;
mod format;
mod offline;
mod recovery;
mod shared;
mod snapshot;
mod writer;

pub use crypt::{Cipher, EncryptionKey, Unauthentic};
use format::Codec;
pub use offline::{RekeyReport, load_read_only, rekey};
use shared::{Refused, Shared, lock};

/// When a write is acknowledged, and what a crash can take back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncMode {
    /// After `fdatasync` (shared by every write of a group commit). Nothing acknowledged is lost,
    /// even on power loss.
    #[default]
    Always,
    /// After `write`; `fdatasync` runs every `batch_interval`. A process crash loses nothing; an
    /// OS crash or power loss loses up to the last interval of acknowledged writes.
    Batch,
    /// After `write`; the OS writes back when it likes (on Linux, typically within 30 s). A
    /// process crash loses nothing; an OS crash or power loss loses what was not written back.
    Never,
}

impl FsyncMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FsyncMode::Always => "always",
            FsyncMode::Batch => "batch",
            FsyncMode::Never => "never",
        }
    }
}

impl fmt::Display for FsyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `--fsync` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fsync mode {0:?}: expected always, batch or never")]
pub struct ParseFsyncModeError(String);

impl FromStr for FsyncMode {
    type Err = ParseFsyncModeError;
    fn from_str(s: &str) -> Result<FsyncMode, ParseFsyncModeError> {
        match s.to_ascii_lowercase().as_str() {
            "always" => Ok(FsyncMode::Always),
            "batch" => Ok(FsyncMode::Batch),
            "never" => Ok(FsyncMode::Never),
            _ => Err(ParseFsyncModeError(s.to_owned())),
        }
    }
}

/// How to open a durable store.
#[derive(Clone)]
pub struct DurableOptions {
    pub dir: PathBuf,
    pub fsync: FsyncMode,
    /// A log segment is closed and a snapshot written once the segment holds this many bytes,
    /// or half the size of the last snapshot if that is more: disk use stays below about twice
    /// the live data plus this, and a restart replays at most that much log.
    pub segment_bytes: u64,
    /// With [`FsyncMode::Batch`]: the longest time between a write and its `fdatasync`.
    pub batch_interval: Duration,
    /// The service's clock: records are stamped with its wall time (the floor for versions
    /// after a restart), so tests that move the engine's clock move this one too.
    pub clock: Arc<dyn Clock>,
    /// Group commits, fsyncs and snapshots are counted here.
    pub metrics: crate::metrics::Metrics,
    /// While the disk is full: how often the commit thread checks whether a write fits again.
    pub full_retry: Duration,
    /// Seal every record and snapshot chunk under this key (`--encryption-key-file`).
    pub encryption: Option<EncryptionKey>,
}

impl fmt::Debug for DurableOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableOptions")
            .field("dir", &self.dir)
            .field("fsync", &self.fsync)
            .field("segment_bytes", &self.segment_bytes)
            .field("batch_interval", &self.batch_interval)
            .field("full_retry", &self.full_retry)
            .field("encryption", &self.encryption)
            .finish_non_exhaustive()
    }
}

impl DurableOptions {
    pub fn new(dir: impl Into<PathBuf>) -> DurableOptions {
        DurableOptions {
            dir: dir.into(),
            fsync: FsyncMode::Always,
            segment_bytes: 64 * 1024 * 1024,
            batch_interval: Duration::from_millis(50),
            clock: Arc::new(SystemClock),
            metrics: crate::metrics::Metrics::disabled(),
            full_retry: Duration::from_secs(1),
            encryption: None,
        }
    }
}

/// Log sequence numbers: the n-th frame queued since open has lsn n (starting at 1).
type Lsn = u64;

/// Reads retried because the writes they saw were taken back (disk full) before giving up.
const READ_ATTEMPTS: usize = 16;

/// The durable backend. Opening it recovers the directory; dropping it flushes, syncs and
/// releases the directory.
pub struct DurableBackend {
    index: Arc<MemoryBackend>,
    codec: Arc<Codec>,
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    snapshot: Arc<Mutex<Option<JoinHandle<()>>>>,
    dir: PathBuf,
    clock: Arc<dyn Clock>,
    /// Holds the directory's advisory lock until the backend is dropped.
    lock_file: File,
}

impl fmt::Debug for DurableBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableBackend").field("dir", &self.dir).finish()
    }
}

impl DurableBackend {
    /// Opens (creating if needed) the store in `options.dir` and recovers it: loads the newest
    /// snapshot, replays the log after it, and cuts a torn tail off the last segment (logged).
    /// A damaged file anywhere else is [`StorageError::Corrupt`]. Blocks while it reads.
    pub fn open(options: DurableOptions) -> Result<DurableBackend, StorageError> {
        let dir = options.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| with_path(e, &dir))?;
        let lock_file = lock_dir(&dir)?;

        let codec = Arc::new(codec_for(options.encryption.as_ref())?);
        let index = Arc::new(MemoryBackend::default());
        let started = std::time::Instant::now();
        let recovered = recovery::recover(&dir, &index, &codec, recovery::Mode::ReadWrite)?;
        let Some(file) = recovered.file else {
            return Err(StorageError::Backend("recovery left no segment to append to".into()));
        };
        if let Some(floor) = clock_floor(index.max_version_now(), recovered.wall_ms) {
            index.observe_version(&floor);
        }
        tracing::info!(
            dir = %dir.display(),
            keys = index.key_count(),
            snapshot_bytes = recovered.snapshot_bytes,
            log_records = recovered.log_records,
            segments = recovered.segments_replayed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            fsync = %options.fsync,
            encrypted = options.encryption.is_some(),
            "durable storage recovered"
        );

        let shared = Arc::new(Shared::default());
        shared.live_bytes.store(recovered.snapshot_bytes, Ordering::Relaxed);
        shared.at_segment(recovered.seq, recovered.seg_bytes);
        let snapshot = Arc::new(Mutex::new(None));
        let clock = options.clock.clone();
        let writer = writer::Writer {
            shared: shared.clone(),
            index: index.clone(),
            snapshot: snapshot.clone(),
            dir: dir.clone(),
            options,
            codec: codec.clone(),
            file,
            cursor: recovered.cursor,
            seq: recovered.seq,
            seg_bytes: recovered.seg_bytes,
            written: 0,
            synced: 0,
            synced_len: recovered.seg_bytes,
            last_sync: std::time::Instant::now(),
            full: false,
            next_probe: std::time::Instant::now(),
            refused_bytes: 0,
            next_rotation: std::time::Instant::now(),
        };
        let on_panic = shared.clone();
        let writer = std::thread::Builder::new()
            .name("stategate-log".into())
            .spawn(move || {
                // A panic must not leave writers waiting forever: it fails the store like an
                // I/O error does (every call fails until a restart recovers from disk).
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run())).is_err() {
                    tracing::error!("the log thread panicked; every storage call fails until a restart");
                    on_panic.fail(&std::io::Error::other("the log thread panicked"), Vec::new());
                }
            })
            .map_err(StorageError::Io)?;
        Ok(DurableBackend {
            index,
            codec,
            shared,
            writer: Some(writer),
            snapshot,
            dir,
            clock,
            lock_file,
        })
    }

    /// Waits until every write in flight is acknowledged, so that a read that follows serves
    /// nothing a crash could take back.
    async fn settle(&self, keys: Option<&[u8]>) -> Result<(), StorageError> {
        let lsn = {
            let in_flight = lock(&self.shared.in_flight);
            match keys {
                Some(k) => in_flight.get(k).copied(),
                None if in_flight.is_empty() => None,
                None => Some(self.shared.last_queued()),
            }
        };
        match lsn {
            Some(lsn) => self.shared.wait_acked(lsn).await,
            None => Ok(()),
        }
    }

    /// After a read of the index: waits until what it read is acknowledged (`key`, or every
    /// write in flight), and says whether the read stands. It does not if writes were taken
    /// back since the count `rollbacks` was read (the disk was full): what it read may have
    /// been one of them, and the caller reads again.
    async fn settled(&self, key: Option<&[u8]>, rollbacks: u64) -> Result<bool, StorageError> {
        self.settle(key).await?;
        Ok(self.shared.rollbacks.load(Ordering::SeqCst) == rollbacks)
    }
}

fn retries_exhausted() -> StorageError {
    shared::full("writes kept being taken back during a read")
}

#[cfg(test)]
impl DurableBackend {
    /// Makes the commit thread panic at its next group (tests of the fail-stop).
    pub(crate) fn panic_next_commit(&self) {
        self.shared.panic_next.store(true, Ordering::Relaxed);
    }

    /// Waits (blocking the thread) until the compaction the writes so far started, if any, is
    /// over: the commit thread decides to rotate only after it acknowledged a group, so a test
    /// that looks at the files right after its last write could see them before a snapshot
    /// that is about to replace them. No new compaction starts until the next write.
    pub(crate) fn wait_compaction_settled(&self) {
        self.shared.wait_commit_idle();
        // The snapshot of the last rotation, if it is still running (rotation stores its handle
        // before the commit thread goes idle).
        let running = lock(&self.snapshot).take();
        if let Some(s) = running {
            let _ = s.join();
        }
    }
}

impl Drop for DurableBackend {
    fn drop(&mut self) {
        lock(&self.shared.queue).shutdown = true;
        self.shared.work.notify_all();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        // A snapshot still being written must not touch the directory once the lock is released.
        let pending = lock(&self.snapshot).take();
        if let Some(s) = pending {
            let _ = s.join();
        }
        // Released explicitly, not only by closing: a child process forked meanwhile (by any
        // thread) shares the open file until it execs, and with it the lock, so a reopen right
        // after this drop could find the directory still locked.
        let _ = self.lock_file.unlock();
    }
}

/// Takes the directory's advisory lock (held while the file stays open): one process at a time.
fn lock_dir(dir: &Path) -> Result<File, StorageError> {
    let lock_path = dir.join("LOCK");
    let lock_file = match File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
    {
        Ok(f) => f,
        // A read-only directory (a mounted backup, say): an existing lock file still locks.
        Err(e) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => {
            File::open(&lock_path).map_err(|e| with_path(e, &lock_path))?
        }
        Err(e) => return Err(with_path(e, &lock_path)),
    };
    match lock_file.try_lock() {
        Ok(()) => Ok(lock_file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StorageError::Backend(format!(
            "{} is in use by another process",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(with_path(e, &lock_path)),
    }
}

fn with_path(e: std::io::Error, path: &Path) -> StorageError {
    StorageError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

#[async_trait]
impl Backend for DurableBackend {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        self.shared.check()?;
        for _ in 0..READ_ATTEMPTS {
            let rollbacks = self.shared.rollbacks.load(Ordering::SeqCst);
            let rec = self.index.get(key).await?;
            if self.settled(Some(key), rollbacks).await? {
                return Ok(rec);
            }
        }
        Err(retries_exhausted())
    }

    async fn get_many(
        &self,
        keys: &[Bytes],
        max_value_bytes: usize,
    ) -> Result<Option<Vec<Option<Record>>>, StorageError> {
        self.shared.check()?;
        for _ in 0..READ_ATTEMPTS {
            let rollbacks = self.shared.rollbacks.load(Ordering::SeqCst);
            let records = self.index.records_now(keys, max_value_bytes);
            // Served only once every write it saw is acknowledged; it saw none past the last
            // one in flight for these keys.
            let lsn = {
                let in_flight = lock(&self.shared.in_flight);
                keys.iter().filter_map(|k| in_flight.get(&k[..]).copied()).max()
            };
            if let Some(lsn) = lsn {
                self.shared.wait_acked(lsn).await?;
            }
            if self.shared.rollbacks.load(Ordering::SeqCst) == rollbacks {
                return Ok(records);
            }
        }
        Err(retries_exhausted())
    }

    async fn get_head(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        self.shared.check()?;
        for _ in 0..READ_ATTEMPTS {
            let rollbacks = self.shared.rollbacks.load(Ordering::SeqCst);
            let rec = self.index.get_head(key).await?;
            if self.settled(Some(key), rollbacks).await? {
                return Ok(rec);
            }
        }
        Err(retries_exhausted())
    }

    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        if swaps.is_empty() {
            return Ok(SwapOutcome::Done);
        }
        // Refused up front while the disk is full; a write that races with the disk filling up
        // is queued, and taken back by the commit thread if it does not fit.
        self.shared.check_writable()?;
        // Plain here, outside any lock; the commit thread seals it for where it lands.
        let mut frame = Vec::new();
        format::encode_batch(&mut frame, swaps, self.clock.now_ms());
        if frame.len() + format::SEAL_OVERHEAD > format::MAX_PAYLOAD {
            return Err(StorageError::Backend("a write of more than 1 GiB".into()));
        }
        let (outcome, queued) = self.index.swap_then(swaps, max_keys, |undo| {
            let (tx, rx) = oneshot::channel();
            let lsn = {
                let mut q = lock(&self.shared.queue);
                if let Some(f) = &q.failed {
                    // Dropping `undo` leaves the index changed, which does not matter: the
                    // log has failed, every call fails from now on.
                    return Err(Refused::Failed(f.clone()));
                }
                q.last += 1;
                q.buf.extend_from_slice(&frame);
                q.acks.push(tx);
                q.undos.push(undo);
                if std::mem::take(&mut q.idle) {
                    self.shared.work.notify_one();
                }
                q.last
            };
            let mut in_flight = lock(&self.shared.in_flight);
            for s in swaps {
                in_flight.insert(s.key.clone(), lsn);
            }
            Ok(rx)
        })?;
        match queued {
            None => Ok(outcome),
            Some(Err(refused)) => Err(refused.into()),
            Some(Ok(ack)) => match ack.await {
                Ok(Ok(())) => Ok(outcome),
                Ok(Err(refused)) => Err(refused.into()),
                Err(_) => Err(shared::failed("the log thread stopped")),
            },
        }
    }

    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError> {
        self.shared.check()?;
        for _ in 0..READ_ATTEMPTS {
            let rollbacks = self.shared.rollbacks.load(Ordering::SeqCst);
            let page = self.index.scan(after, examine, now_ms, keep).await?;
            if self.settled(None, rollbacks).await? {
                return Ok(page);
            }
        }
        Err(retries_exhausted())
    }

    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError> {
        self.shared.check()?;
        self.index.expired(now_ms, limit).await
    }

    async fn next_deadline(&self) -> Result<Option<u64>, StorageError> {
        self.shared.check()?;
        self.index.next_deadline().await
    }

    async fn len(&self) -> Result<u64, StorageError> {
        self.shared.check()?;
        self.index.len().await
    }

    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        self.shared.check()?;
        self.index.max_version().await
    }

    async fn value_bytes(&self) -> Result<Option<u64>, StorageError> {
        self.index.value_bytes().await
    }

    fn persistent(&self) -> bool {
        true
    }

    fn health(&self) -> StorageHealth {
        self.shared.health.borrow().clone()
    }

    fn health_changes(&self) -> Option<tokio::sync::watch::Receiver<StorageHealth>> {
        Some(self.shared.health.subscribe())
    }

    fn online_backup(&self) -> Option<&dyn super::OnlineBackup> {
        Some(self)
    }
}

/// What `max_version` reports after recovery: past every version this store ever issued.
///
/// A DEL's version is not stored (a delete leaves no record), but the engine issued it as
/// `next_after(stored version)`, so its milliseconds were at most the larger of the wall clock
/// then and the highest stored version's. Every DEL that was acknowledged is in the log (or a
/// later snapshot) stamped with the wall clock when it was written; one millisecond past the
/// largest of those and of the highest stored version is above every version issued before the
/// restart, even when the wall clock has gone back since.
fn clock_floor(max_version: Option<Hlc>, wall_ms: u64) -> Option<Hlc> {
    if max_version.is_none() && wall_ms == 0 {
        return None;
    }
    let (ms, node) = match max_version {
        Some(v) => (v.ms.max(wall_ms), v.node),
        None => (wall_ms, Arc::from("stategate")),
    };
    Some(Hlc::new(ms.saturating_add(1), 0, node))
}

/// Plain, or sealed under `key`.
fn codec_for(key: Option<&EncryptionKey>) -> Result<Codec, StorageError> {
    Ok(match key {
        Some(k) => Codec::sealed(crypt::Cipher::new(k)?),
        None => Codec::plain(),
    })
}

/// The file name of log segment `seq`.
pub fn segment_name(seq: u64) -> String {
    format!("log-{seq:020}.log")
}

/// The file name of snapshot `seq`.
pub fn snapshot_name(seq: u64) -> String {
    format!("snap-{seq:020}.snap")
}

/// Makes a directory's entries (created, renamed, removed files) durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
