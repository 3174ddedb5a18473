//! The commit thread: the only writer of log segments.
//!
//! It takes everything queued at once, writes it with one `write`, syncs per the fsync mode,
//! and acknowledges every frame of the group. While it syncs, new frames queue up and become
//! the next group: concurrent writers share one `fdatasync` (group commit). When the segment
//! outgrows its budget, it syncs it, starts the next one and hands a snapshot to a thread.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::{DurableOptions, FsyncMode, Lsn, Shared, format, lock, segment_name, snapshot, sync_dir};
use crate::storage::memory::MemoryBackend;

/// How many times the commit thread yields before sleeping when the queue is empty.
const SPIN_YIELDS: usize = 32;

pub(super) struct Writer {
    pub shared: Arc<Shared>,
    pub index: Arc<MemoryBackend>,
    pub snapshot: Arc<Mutex<Option<JoinHandle<()>>>>,
    pub dir: PathBuf,
    pub options: DurableOptions,
    /// The open segment, positioned at its end.
    pub file: File,
    pub seq: u64,
    pub seg_bytes: u64,
    pub written: Lsn,
    pub synced: Lsn,
    pub last_sync: Instant,
}

impl Writer {
    pub fn run(mut self) {
        let mut buf = Vec::new();
        let mut group = Vec::new();
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
                    if self.options.fsync == FsyncMode::Batch && self.written > self.synced {
                        let due = self.last_sync + self.options.batch_interval;
                        let now = Instant::now();
                        if now >= due {
                            break;
                        }
                        q.idle = true;
                        q = self
                            .shared
                            .work
                            .wait_timeout(q, due - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    } else {
                        q.idle = true;
                        q = self.shared.work.wait(q).unwrap_or_else(|e| e.into_inner());
                    }
                    q.idle = false;
                }
                // Swap buffers: the queue keeps an allocation for the next group.
                buf.clear();
                std::mem::swap(&mut buf, &mut q.buf);
                std::mem::swap(&mut group, &mut q.acks);
                (q.last, q.shutdown)
            };
            if let Err(e) = self.commit(&buf, last, shutdown) {
                self.failed(&e, &mut group);
                return;
            }
            // `commit` acknowledged the whole group (synced or written, per the mode).
            self.options.metrics.commit(group.len());
            for ack in group.drain(..) {
                let _ = ack.send(Ok(()));
            }
            if !shutdown && let Err(e) = self.maybe_rotate() {
                self.failed(&e, &mut group);
                return;
            }
            if shutdown {
                return;
            }
        }
    }

    fn failed(&self, e: &std::io::Error, group: &mut Vec<super::Ack>) {
        tracing::error!(cause = %e, segment = %segment_name(self.seq), "writing the log failed; every storage call fails until a restart");
        self.shared.fail(e, std::mem::take(group));
    }

    fn commit(&mut self, buf: &[u8], last: Lsn, shutdown: bool) -> std::io::Result<()> {
        #[cfg(test)]
        if self.shared.panic_next.swap(false, Ordering::Relaxed) {
            panic!("injected panic in the commit thread");
        }
        if !buf.is_empty() {
            self.file.write_all(buf)?;
            self.seg_bytes += buf.len() as u64;
            self.written = last;
        }
        let due = match self.options.fsync {
            FsyncMode::Always => true,
            FsyncMode::Batch => self.last_sync.elapsed() >= self.options.batch_interval,
            FsyncMode::Never => false,
        };
        if self.written > self.synced && (due || shutdown) {
            self.sync()?;
        }
        let acked = match self.options.fsync {
            FsyncMode::Always => self.synced,
            FsyncMode::Batch | FsyncMode::Never => self.written,
        };
        self.shared.publish(self.written, acked);
        Ok(())
    }

    /// Starts the next segment and a snapshot when this one is over budget.
    fn maybe_rotate(&mut self) -> std::io::Result<()> {
        let budget = self
            .options
            .segment_bytes
            .max(self.shared.live_bytes.load(Ordering::Relaxed) / 2);
        if self.seg_bytes >= budget && !self.shared.snapshotting.load(Ordering::Acquire) {
            self.rotate()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> std::io::Result<()> {
        let started = Instant::now();
        self.file.sync_data()?;
        self.options.metrics.fsync(started);
        self.synced = self.written;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Closes the segment (synced, so that only the newest segment can ever have a torn tail),
    /// starts the next one, and snapshots the index in the background.
    fn rotate(&mut self) -> std::io::Result<()> {
        if self.written > self.synced {
            self.sync()?;
            self.shared.publish(self.written, self.written);
        }
        let seq = self.seq + 1;
        self.file = create_segment(&self.dir, seq)?;
        self.seq = seq;
        self.seg_bytes = format::HEADER_LEN as u64;
        tracing::debug!(segment = %segment_name(seq), "started a log segment");

        self.shared.snapshotting.store(true, Ordering::Release);
        let (dir, index, shared) = (self.dir.clone(), self.index.clone(), self.shared.clone());
        let (clock, metrics) = (self.options.clock.clone(), self.options.metrics.clone());
        let spawned = std::thread::Builder::new()
            .name("stategate-snapshot".into())
            .spawn(move || {
                let written = snapshot::write(&dir, seq, &index, &shared, &*clock);
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

/// Creates segment `seq` with its header, durable (file and directory entry) before use.
pub(super) fn create_segment(dir: &std::path::Path, seq: u64) -> std::io::Result<File> {
    let mut file = File::options()
        .create_new(true)
        .append(true)
        .open(dir.join(segment_name(seq)))?;
    file.write_all(&format::header(format::LOG_MAGIC, seq))?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}
