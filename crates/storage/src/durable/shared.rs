//! State shared by the callers, the commit thread and the snapshot or backup thread: the queue
//! of frames waiting to be logged, the progress of the log, the keys with a write in flight,
//! and the health of the log (full, failed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{Notify, oneshot, watch};

use super::Lsn;
use crate::memory::Undo;
use crate::{StorageError, StorageHealth};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a frame was not acknowledged.
#[derive(Debug, Clone)]
pub(super) enum Refused {
    /// The disk was full: the write was taken back (nothing of it remains, on disk or in the
    /// index). Later writes may succeed.
    Full(Arc<str>),
    /// The log failed for good; every later call fails until a restart.
    Failed(Arc<str>),
}

impl From<Refused> for StorageError {
    fn from(r: Refused) -> StorageError {
        match r {
            Refused::Full(cause) => full(&cause),
            Refused::Failed(cause) => failed(&cause),
        }
    }
}

pub(super) fn failed(cause: &str) -> StorageError {
    StorageError::Io(std::io::Error::other(format!(
        "the log failed earlier ({cause}); restart to recover from disk"
    )))
}

pub(super) fn full(cause: &str) -> StorageError {
    StorageError::Full(format!(
        "no space left for the log ({cause}); writes resume by themselves once space is freed"
    ))
}

/// A writer's wait for its frame's acknowledgement.
pub(super) type Ack = oneshot::Sender<Result<(), Refused>>;

/// What the commit thread has done, as seen by writers and readers.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    /// Every frame up to this one has been handed to the OS (`write`), or taken back.
    pub written: Lsn,
    /// Every frame up to this one is acknowledged (per the fsync mode), or taken back.
    pub acked: Lsn,
    /// The log failed: nothing is acknowledged any more.
    pub failed: Option<Arc<str>>,
    /// The disk is full: writes are refused until the commit thread finds space again.
    pub full: Option<Arc<str>>,
    /// The segment being appended to and its length after the last frame written (an online
    /// backup copies the log up to there).
    pub segment: u64,
    pub segment_len: u64,
}

/// Frames waiting for the commit thread.
#[derive(Debug, Default)]
pub(super) struct Queue {
    pub buf: Vec<u8>,
    /// One per frame in `buf`: woken exactly when that frame's group is acknowledged (no
    /// thundering herd of every writer on every group).
    pub acks: Vec<Ack>,
    /// One per frame in `buf`: how to take the frame's swaps back out of the index if it
    /// cannot be written.
    pub undos: Vec<Undo>,
    /// The lsn of the last frame queued.
    pub last: Lsn,
    /// The log failed: nothing more is queued.
    pub failed: Option<Arc<str>>,
    /// The commit thread waits for work: the next frame queued must wake it (only that one:
    /// a busy commit thread finds the frame when it comes back for more).
    pub idle: bool,
    pub shutdown: bool,
}

/// State shared by callers, the commit thread and the snapshot thread.
#[derive(Debug)]
pub(super) struct Shared {
    pub queue: Mutex<Queue>,
    /// Wakes the commit thread.
    pub work: Condvar,
    pub progress: Mutex<Progress>,
    /// Wakes threads waiting for progress (the snapshot thread).
    pub progressed: Condvar,
    /// Wakes tasks waiting for progress.
    pub progressed_async: Notify,
    /// Keys with a write in flight, and the lsn of their latest write.
    pub in_flight: Mutex<HashMap<Bytes, Lsn>>,
    /// How many times writes were taken back (disk full). Bumped under the index's write lock
    /// before anything else is told, so a reader that read the index and then finds it
    /// unchanged knows that what it read was not taken back.
    pub rollbacks: AtomicU64,
    /// A snapshot or a backup is running (at most one; the segment is not rotated meanwhile).
    pub snapshotting: AtomicBool,
    /// Bytes of the last snapshot written or loaded: the size of the live data.
    pub live_bytes: AtomicU64,
    /// [`StorageHealth`] as it changes.
    pub health: watch::Sender<StorageHealth>,
    /// Tests: the commit thread panics at its next group.
    #[cfg(test)]
    pub panic_next: AtomicBool,
    /// Tests: while set, every write to the log stops halfway with "no space left".
    #[cfg(test)]
    pub disk_full: AtomicBool,
    /// Tests: woken (with the `queue` lock) when the commit thread starts waiting for work or
    /// the log fails, for [`Shared::wait_commit_idle`].
    #[cfg(test)]
    pub commit_idle: Condvar,
}

impl Default for Shared {
    fn default() -> Shared {
        Shared {
            queue: Mutex::default(),
            work: Condvar::new(),
            progress: Mutex::default(),
            progressed: Condvar::new(),
            progressed_async: Notify::new(),
            in_flight: Mutex::default(),
            rollbacks: AtomicU64::new(0),
            snapshotting: AtomicBool::new(false),
            live_bytes: AtomicU64::new(0),
            health: watch::Sender::new(StorageHealth::Ok),
            #[cfg(test)]
            panic_next: AtomicBool::new(false),
            #[cfg(test)]
            disk_full: AtomicBool::new(false),
            #[cfg(test)]
            commit_idle: Condvar::new(),
        }
    }
}

impl Shared {
    pub fn publish(&self, written: Lsn, acked: Lsn) {
        self.publish_at(written, acked, None);
    }

    /// [`Shared::publish`], with where the segment being appended to ends after `written`:
    /// both change under one lock, so a backup never sees a length without its lsn.
    pub fn publish_at(&self, written: Lsn, acked: Lsn, segment: Option<(u64, u64)>) {
        {
            let mut p = lock(&self.progress);
            p.written = written;
            p.acked = acked;
            if let Some((seq, len)) = segment {
                p.segment = seq;
                p.segment_len = len;
            }
        }
        lock(&self.in_flight).retain(|_, lsn| *lsn > acked);
        self.wake();
    }

    pub fn wake(&self) {
        self.progressed.notify_all();
        self.progressed_async.notify_waiters();
    }

    /// Records where the commit thread appends now.
    pub fn at_segment(&self, segment: u64, len: u64) {
        let mut p = lock(&self.progress);
        p.segment = segment;
        p.segment_len = len;
    }

    /// Fails the writers of `group` and of everything queued, and every later call.
    pub fn fail(&self, cause: &std::io::Error, group: Vec<Ack>) {
        let cause: Arc<str> = cause.to_string().into();
        lock(&self.progress).failed = Some(cause.clone());
        let queued = {
            let mut q = lock(&self.queue);
            q.failed = Some(cause.clone());
            q.undos.clear();
            std::mem::take(&mut q.acks)
        };
        for ack in group.into_iter().chain(queued) {
            let _ = ack.send(Err(Refused::Failed(cause.clone())));
        }
        #[cfg(test)]
        self.commit_idle.notify_all();
        self.health.send_replace(StorageHealth::Failed {
            cause: cause.to_string(),
        });
        self.wake();
    }

    /// Marks the disk full (writes are refused from now on) or not.
    pub fn set_full(&self, cause: Option<Arc<str>>) {
        let changed = {
            let mut p = lock(&self.progress);
            if p.failed.is_some() {
                return;
            }
            let changed = p.full.is_some() != cause.is_some();
            p.full = cause.clone();
            changed
        };
        if changed {
            self.health.send_replace(match cause {
                Some(cause) => StorageHealth::Full {
                    cause: cause.to_string(),
                },
                None => StorageHealth::Ok,
            });
        }
    }

    /// Tests: the commit thread starts waiting for work (called with the `queue` lock held).
    #[cfg(test)]
    pub fn note_commit_idle(&self) {
        self.commit_idle.notify_all();
    }

    /// Tests: waits (blocking the thread) until the commit thread has handled every frame
    /// queued so far and waits for more, or the log failed. Each group the commit thread
    /// handles ends with its decision to rotate the log (and start a compaction): once it
    /// waits, every rotation the writes so far call for has started.
    #[cfg(test)]
    pub fn wait_commit_idle(&self) {
        let mut q = lock(&self.queue);
        while !(q.idle && q.buf.is_empty()) && q.failed.is_none() {
            q = self.commit_idle.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub fn last_queued(&self) -> Lsn {
        lock(&self.queue).last
    }

    /// Waits (blocking the thread) until `lsn` has been written. Also fails when writes were
    /// taken back since `rollbacks` was read: the caller may have read some of them.
    pub fn wait_written(&self, lsn: Lsn, rollbacks: u64) -> Result<(), StorageError> {
        let mut p = lock(&self.progress);
        loop {
            if let Some(f) = &p.failed {
                return Err(failed(f));
            }
            if self.rollbacks.load(Ordering::SeqCst) != rollbacks {
                return Err(full("writes were taken back meanwhile"));
            }
            if p.written >= lsn {
                return Ok(());
            }
            p = self.progressed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until `lsn` is acknowledged or taken back (readers; writers have their own
    /// [`Ack`]).
    pub async fn wait_acked(&self, lsn: Lsn) -> Result<(), StorageError> {
        loop {
            let notified = self.progressed_async.notified();
            tokio::pin!(notified);
            // Registered before the check, so a publish between the check and the await wakes us.
            notified.as_mut().enable();
            {
                let p = lock(&self.progress);
                if let Some(f) = &p.failed {
                    return Err(failed(f));
                }
                if p.acked >= lsn {
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    /// Fails when the log has failed (every call).
    pub fn check(&self) -> Result<(), StorageError> {
        match &lock(&self.progress).failed {
            Some(f) => Err(failed(f)),
            None => Ok(()),
        }
    }

    /// Fails when the log has failed or the disk is full (writes).
    pub fn check_writable(&self) -> Result<(), StorageError> {
        let p = lock(&self.progress);
        match (&p.failed, &p.full) {
            (Some(f), _) => Err(failed(f)),
            (None, Some(cause)) => Err(full(cause)),
            (None, None) => Ok(()),
        }
    }
}
