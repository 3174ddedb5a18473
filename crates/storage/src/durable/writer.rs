//! The commit thread: the only writer of log segments.
//!
//! It takes everything queued at once, seals it when the store is encrypted (only here is it
//! known which segment and offset each frame lands at, and a sealed frame is bound to both:
//! `format.rs`), writes it with one `write`, syncs per the fsync mode, and acknowledges every
//! frame of the group. While it syncs, new frames queue up and become
//! the next group: concurrent writers share one `fdatasync` (group commit). When the segment
//! outgrows its budget, it syncs it, starts the next one and hands a snapshot to a thread.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::format::{Codec, Cursor, FileType};
use super::shared::{Ack, Refused, Shared, lock};
use super::{DurableOptions, FsyncMode, Lsn, segment_name, snapshot, sync_dir};
use crate::memory::{MemoryBackend, Undo};

/// How many times the commit thread yields before sleeping when the queue is empty.
const SPIN_YIELDS: usize = 32;
/// While the disk is full, writes resume once this much (or the refused group, if larger) can
/// be written again: some headroom, so that writes do not flap between refused and accepted.
const PROBE_BYTES: usize = 1 << 20;

/// Why a group was not committed.
enum Fault {
    /// No space (or quota) left before anything of the group was acknowledged: the group can
    /// be taken back and the segment cut back to `good` bytes.
    Full { err: std::io::Error, good: u64 },
    /// Anything else: the store fails until a restart (see ARCHITECTURE.md, Storage).
    Fatal(std::io::Error),
}

/// ENOSPC or EDQUOT.
pub(super) fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

pub(super) struct Writer {
    pub shared: Arc<Shared>,
    pub index: Arc<MemoryBackend>,
    pub snapshot: Arc<Mutex<Option<JoinHandle<()>>>>,
    pub dir: PathBuf,
    pub options: DurableOptions,
    pub codec: Arc<Codec>,
    /// The open segment, positioned at its end.
    pub file: File,
    /// The open segment's identity, for sealing its frames in place (the offset is set to
    /// `seg_bytes` before each group).
    pub cursor: Cursor,
    pub seq: u64,
    pub seg_bytes: u64,
    pub written: Lsn,
    pub synced: Lsn,
    /// The segment's length at the last successful sync.
    pub synced_len: u64,
    pub last_sync: Instant,
    /// The disk is full: writes are refused, and probed every `options.full_retry`.
    pub full: bool,
    pub next_probe: Instant,
    /// Bytes of the last group refused for lack of space (the probe must fit at least that).
    pub refused_bytes: usize,
    /// A rotation that failed for lack of space is tried again only after this.
    pub next_rotation: Instant,
}

impl Writer {
    pub fn run(mut self) {
        let mut buf = Vec::new();
        // The group as written: `buf` sealed for its places, when encrypted.
        let mut sealed = Vec::new();
        let mut group: Vec<Ack> = Vec::new();
        let mut undos: Vec<Undo> = Vec::new();
        // A log recovered over budget (written during a snapshot that a crash interrupted, say)
        // is compacted right away, so restarts stay fast.
        if let Err(e) = self.maybe_rotate() {
            self.failed(&e, &mut group);
            return;
        }
        loop {
            let (last, shutdown) = {
                let mut q = lock(&self.shared.queue);
                // Writers usually come back within microseconds (their task runs again and
                // queues its next write): give them the CPU a few times before sleeping, which
                // saves a futex wake-up and two context switches per group.
                for _ in 0..SPIN_YIELDS {
                    if !q.buf.is_empty() || q.shutdown {
                        break;
                    }
                    drop(q);
                    std::thread::yield_now();
                    q = lock(&self.shared.queue);
                }
                loop {
                    if !q.buf.is_empty() || q.shutdown {
                        break;
                    }
                    let wake_at = match (self.sync_due_at(), self.full.then_some(self.next_probe)) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    match wake_at {
                        Some(at) => {
                            let now = Instant::now();
                            if now >= at {
                                break;
                            }
                            q.idle = true;
                            #[cfg(test)]
                            self.shared.note_commit_idle();
                            q = self
                                .shared
                                .work
                                .wait_timeout(q, at - now)
                                .unwrap_or_else(|e| e.into_inner())
                                .0;
                        }
                        None => {
                            q.idle = true;
                            #[cfg(test)]
                            self.shared.note_commit_idle();
                            q = self.shared.work.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    }
                    q.idle = false;
                }
                // Swap buffers: the queue keeps an allocation for the next group.
                buf.clear();
                std::mem::swap(&mut buf, &mut q.buf);
                std::mem::swap(&mut group, &mut q.acks);
                std::mem::swap(&mut undos, &mut q.undos);
                (q.last, q.shutdown)
            };
            let out = match self.codec.cipher() {
                Some(_) => {
                    sealed.clear();
                    self.cursor.offset = self.seg_bytes;
                    self.codec.seal_frames(&buf, &mut self.cursor, &mut sealed);
                    &sealed
                }
                None => &buf,
            };
            match self.commit(out, last, shutdown) {
                Ok(()) => {
                    // `commit` acknowledged the whole group (synced or written, per the mode).
                    self.options.metrics.commit(group.len());
                    for ack in group.drain(..) {
                        let _ = ack.send(Ok(()));
                    }
                    // The records the group replaced are freed here, off the writers' path.
                    undos.clear();
                    if self.full && !buf.is_empty() {
                        self.resume("a write fitted again");
                    }
                }
                Err(Fault::Full { err, good }) => {
                    self.refused_bytes = out.len();
                    if let Err(e) = self.refuse(&err, good, &mut group, &mut undos) {
                        self.failed(&e, &mut group);
                        return;
                    }
                }
                Err(Fault::Fatal(e)) => {
                    self.failed(&e, &mut group);
                    return;
                }
            }
            if shutdown {
                return;
            }
            if self.full && buf.is_empty() && Instant::now() >= self.next_probe {
                match self.probe() {
                    Ok(true) => self.resume("space was freed"),
                    Ok(false) => {}
                    Err(e) => {
                        self.failed(&e, &mut group);
                        return;
                    }
                }
            }
            if let Err(e) = self.maybe_rotate() {
                self.failed(&e, &mut group);
                return;
            }
        }
    }

    /// With `--fsync batch`: when the writes not yet synced must be.
    fn sync_due_at(&self) -> Option<Instant> {
        (self.options.fsync == FsyncMode::Batch && self.written > self.synced)
            .then(|| self.last_sync + self.options.batch_interval)
    }

    fn failed(&self, e: &std::io::Error, group: &mut Vec<Ack>) {
        tracing::error!(cause = %e, segment = %segment_name(self.seq), "writing the log failed; every storage call fails until a restart");
        self.shared.fail(e, std::mem::take(group));
    }

    /// Writes to the segment (tests can make it run out of space halfway).
    fn write_file(&mut self, buf: &[u8]) -> std::io::Result<()> {
        #[cfg(test)]
        if self.shared.disk_full.load(Ordering::Relaxed) {
            self.file.write_all(&buf[..buf.len() / 2])?;
            return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
        }
        self.file.write_all(buf)
    }

    fn commit(&mut self, buf: &[u8], last: Lsn, shutdown: bool) -> Result<(), Fault> {
        #[cfg(test)]
        if self.shared.panic_next.swap(false, Ordering::Relaxed) {
            panic!("injected panic in the commit thread");
        }
        if !buf.is_empty() {
            let good = self.seg_bytes;
            match self.write_file(buf) {
                Ok(()) => {}
                // Nothing of this group is acknowledged yet, in any mode.
                Err(err) if is_full(&err) => return Err(Fault::Full { err, good }),
                Err(err) => return Err(Fault::Fatal(err)),
            }
            self.seg_bytes += buf.len() as u64;
            self.written = last;
        }
        let due = match self.options.fsync {
            FsyncMode::Always => true,
            FsyncMode::Batch => self.last_sync.elapsed() >= self.options.batch_interval,
            FsyncMode::Never => false,
        };
        if self.written > self.synced && (due || shutdown) {
            match self.sync() {
                Ok(()) => {}
                // With `always`, everything before this group was synced and acknowledged, and
                // nothing of it: it can be taken back. With `batch` or `never`, writes that were
                // acknowledged (after `write`) may have been lost with the failed writeback.
                Err(err) if is_full(&err) && self.options.fsync == FsyncMode::Always && !buf.is_empty() => {
                    let good = self.synced_len;
                    return Err(Fault::Full { err, good });
                }
                Err(err) => return Err(Fault::Fatal(err)),
            }
        }
        let acked = match self.options.fsync {
            FsyncMode::Always => self.synced,
            FsyncMode::Batch | FsyncMode::Never => self.written,
        };
        self.shared
            .publish_at(self.written, acked, Some((self.seq, self.seg_bytes)));
        Ok(())
    }

    /// The disk is full: cuts what was written of the group, takes the group and everything
    /// queued after it back out of the index, and refuses them all. Writes are refused from
    /// now on until a probe or a write fits again.
    fn refuse(
        &mut self,
        err: &std::io::Error,
        good: u64,
        group: &mut Vec<Ack>,
        undos: &mut Vec<Undo>,
    ) -> std::io::Result<()> {
        // A torn partial write must not stay before the next append.
        self.file.set_len(good)?;
        self.seg_bytes = good;
        let cause: Arc<str> = err.to_string().into();
        // New writes are refused from here on; one that got past the check already is either
        // queued now (and taken back below) or queued after (and tried: a retry).
        self.shared.set_full(Some(cause.clone()));
        let shared = self.shared.clone();
        let mut taken = std::mem::take(undos);
        let (queued, last) = self.index.rollback(|| {
            let (acks, queued_undos, last) = {
                let mut q = lock(&shared.queue);
                q.buf.clear();
                (std::mem::take(&mut q.acks), std::mem::take(&mut q.undos), q.last)
            };
            taken.extend(queued_undos);
            // Under the index's lock: a reader that read the index before this sees the count
            // change after it (see `DurableBackend::read_settled`).
            shared.rollbacks.fetch_add(1, Ordering::SeqCst);
            (taken, (acks, last))
        });
        // Every lsn up to `last` is settled: written, or taken back.
        self.written = last;
        if self.options.fsync == FsyncMode::Always {
            self.synced = last;
        }
        self.shared.publish_at(last, last, Some((self.seq, self.seg_bytes)));
        let refused = group.len() + queued.len();
        for ack in group.drain(..).chain(queued) {
            let _ = ack.send(Err(Refused::Full(cause.clone())));
        }
        if !self.full {
            tracing::error!(
                cause = %err,
                segment = %segment_name(self.seq),
                refused,
                "the disk is full: writes are refused (reads go on) until space is freed"
            );
        }
        self.full = true;
        self.next_probe = Instant::now() + self.options.full_retry;
        Ok(())
    }

    /// While the disk is full: whether a write of some headroom fits now. The bytes written are
    /// cut off again (zeros after the last record: a crash meanwhile leaves a torn tail).
    fn probe(&mut self) -> std::io::Result<bool> {
        self.next_probe = Instant::now() + self.options.full_retry;
        let zeros = vec![0u8; PROBE_BYTES.max(self.refused_bytes)];
        let outcome = self.write_file(&zeros);
        self.file.set_len(self.seg_bytes)?;
        match outcome {
            Ok(()) => Ok(true),
            Err(e) if is_full(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn resume(&mut self, why: &str) {
        self.full = false;
        self.shared.set_full(None);
        tracing::info!(reason = why, "the disk has space again: writes resume");
    }

    /// Starts the next segment and a snapshot when this one is over budget.
    fn maybe_rotate(&mut self) -> std::io::Result<()> {
        let budget = self
            .options
            .segment_bytes
            .max(self.shared.live_bytes.load(Ordering::Relaxed) / 2);
        if self.seg_bytes >= budget
            && !self.full
            && Instant::now() >= self.next_rotation
            && self
                .shared
                .snapshotting
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            && let Err(e) = self.rotate()
        {
            self.shared.snapshotting.store(false, Ordering::Release);
            return Err(e);
        }
        Ok(())
    }

    fn sync(&mut self) -> std::io::Result<()> {
        let started = Instant::now();
        self.file.sync_data()?;
        self.options.metrics.fsync(started);
        self.synced = self.written;
        self.synced_len = self.seg_bytes;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Closes the segment (synced, so that only the newest segment can ever have a torn tail),
    /// starts the next one, and snapshots the index in the background. The caller holds the
    /// `snapshotting` flag; the snapshot thread releases it.
    fn rotate(&mut self) -> std::io::Result<()> {
        if self.written > self.synced {
            self.sync()?;
            self.shared.publish(self.written, self.written);
        }
        let seq = self.seq + 1;
        let (file, cursor) = match create_segment(&self.dir, seq, &self.codec) {
            Ok(f) => f,
            Err(e) if is_full(&e) => {
                // Not fatal: the current segment goes on; the rotation is tried again later.
                let _ = std::fs::remove_file(self.dir.join(segment_name(seq)));
                sync_dir(&self.dir)?;
                self.next_rotation = Instant::now() + self.options.full_retry;
                self.shared.snapshotting.store(false, Ordering::Release);
                tracing::warn!(cause = %e, segment = %segment_name(seq), "no space to start a log segment; compaction waits");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.file = file;
        self.cursor = cursor;
        self.seq = seq;
        self.seg_bytes = self.codec.header_len() as u64;
        self.synced_len = self.seg_bytes;
        self.shared.at_segment(seq, self.seg_bytes);
        tracing::debug!(segment = %segment_name(seq), "started a log segment");

        let (dir, index, shared) = (self.dir.clone(), self.index.clone(), self.shared.clone());
        let (clock, codec, metrics) = (
            self.options.clock.clone(),
            self.codec.clone(),
            self.options.metrics.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("stategate-snapshot".into())
            .spawn(move || {
                let written = snapshot::write(&dir, seq, &index, &shared, &*clock, &codec);
                metrics.snapshot(written.is_ok());
                match written {
                    Ok(bytes) => {
                        shared.live_bytes.store(bytes, Ordering::Relaxed);
                        tracing::debug!(seq, bytes, "snapshot written");
                    }
                    // Not fatal: the log is intact; the next rotation tries again.
                    Err(e) => tracing::warn!(cause = %e, seq, "writing a snapshot failed"),
                }
                shared.snapshotting.store(false, Ordering::Release);
            });
        match spawned {
            Ok(handle) => {
                let previous = lock(&self.snapshot).replace(handle);
                if let Some(p) = previous {
                    // Already finished: `snapshotting` was false.
                    let _ = p.join();
                }
            }
            Err(e) => {
                self.shared.snapshotting.store(false, Ordering::Release);
                tracing::warn!(cause = %e, "cannot start the snapshot thread");
            }
        }
        Ok(())
    }
}

/// Creates segment `seq` with its header, durable (file and directory entry) before use;
/// returns it with where its first frame goes.
pub(super) fn create_segment(dir: &std::path::Path, seq: u64, codec: &Codec) -> std::io::Result<(File, Cursor)> {
    let mut file = File::options()
        .create_new(true)
        .append(true)
        .open(dir.join(segment_name(seq)))?;
    let (header, cursor) = codec.start(FileType::Log, seq);
    file.write_all(&header)?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok((file, cursor))
}
