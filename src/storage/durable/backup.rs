//! Online backup: a consistent copy of the store as of one point in the log, taken while
//! writes go on.
//!
//! The copy is a data directory of two files: `snap-S.snap`, a fuzzy snapshot of the index
//! (written like a compaction snapshot, a chunk of keys at a time), and `log-S.log`, the frames
//! of segment S from the moment the snapshot started reading up to the last write it may
//! reflect (lsn L). Records are whole, so replaying those frames over the snapshot ends in
//! exactly the state after write L: the state at one point of the log, as recovery builds it.
//!
//! - Segment rotation is held off while the backup runs (it shares the `snapshotting` flag with
//!   compaction), so every frame after the starting point is in segment S.
//! - The log is read from the segment file after the commit thread has written frame L; the
//!   frames are copied as they are on disk, or, when encrypted, opened and sealed again for
//!   their place in the copy (a sealed frame is bound to its file and offset, and the copy's
//!   log is a file of its own that starts at the first frame copied; it needs the same key).
//! - If writes are taken back meanwhile (the disk was full), the snapshot may hold some of them
//!   and frames no longer map to lsns: the backup fails instead, and can be taken again.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::format::{self, FileType};
use super::shared::lock;
use super::{DurableBackend, segment_name, snapshot};
use crate::storage::{BackupFile, BackupInfo, BackupSink, OnlineBackup, StorageError};

/// How often a backup looks again whether a compaction it waits for has finished.
const FLAG_POLL: Duration = Duration::from_millis(20);

/// Holds the `snapshotting` flag; releases it when dropped.
struct Held<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Sends what is written to a sink as one of the backup's files.
struct ToSink<'a> {
    sink: &'a mut dyn BackupSink,
    file: BackupFile,
    bytes: u64,
}

impl Write for ToSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sink.write(self.file, buf)?;
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl OnlineBackup for DurableBackend {
    fn backup(&self, sink: &mut dyn BackupSink) -> Result<BackupInfo, StorageError> {
        let shared = &self.shared;
        // Wait for a compaction in progress to finish, then keep rotation off.
        let _held = loop {
            shared.check()?;
            if shared
                .snapshotting
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break Held(&shared.snapshotting);
            }
            std::thread::sleep(FLAG_POLL);
        };
        let rollbacks = shared.rollbacks.load(Ordering::SeqCst);
        // Every write up to `start` is in the index already; every later one is written to
        // segment `seq` from offset `from` on.
        let (start, seq, from) = {
            let p = lock(&shared.progress);
            (p.written, p.segment, p.segment_len)
        };
        let codec = &self.codec;

        let mut snap = ToSink {
            sink: &mut *sink,
            file: BackupFile::Snapshot { seq },
            bytes: 0,
        };
        let (header, mut at) = codec.start(FileType::Snapshot, seq);
        snap.write_all(&header)?;
        let keys = snapshot::write_chunks(&mut snap, &mut at, &self.index, codec)?;
        let last = shared.last_queued();
        snapshot::write_end(&mut snap, &mut at, &self.index, codec, keys, self.clock.now_ms())?;
        let snapshot_bytes = snap.bytes;

        shared.wait_written(last, rollbacks)?;
        let path = self.dir.join(segment_name(seq));
        let mut segment = File::open(&path)?;
        let mut log = ToSink {
            sink,
            file: BackupFile::Log { seq },
            bytes: 0,
        };
        let mut header = vec![0u8; codec.header_len()];
        segment.read_exact(&mut header)?;
        let original = codec.file_id(&header);
        let (header, mut at) = codec.start(FileType::Log, seq);
        log.write_all(&header)?;
        segment.seek(SeekFrom::Start(from))?;
        let mut reader = BufReader::with_capacity(1 << 20, segment);
        let records = last - start;
        let mut frame = Vec::new();
        let mut copy = Vec::new();
        let mut offset = from;
        for n in 0..records {
            frame.resize(format::FRAME_HEADER_LEN, 0);
            reader.read_exact(&mut frame)?;
            let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
            if len == 0 || len > format::MAX_PAYLOAD {
                return Err(StorageError::Corrupt(format!(
                    "{}: backup: record {n} after offset {from} has length {len}",
                    path.display()
                )));
            }
            frame.resize(format::FRAME_HEADER_LEN + len, 0);
            reader.read_exact(&mut frame[format::FRAME_HEADER_LEN..])?;
            let bad = |e: format::FormatError| {
                StorageError::Corrupt(format!(
                    "{}: backup: record {n} after offset {from}: {e}",
                    path.display()
                ))
            };
            let (payload, _) = format::read_frame(&frame).map_err(bad)?;
            copy.clear();
            codec
                .rebind(payload, &original, offset, &mut at, &mut copy)
                .map_err(bad)?;
            log.write_all(&copy)?;
            offset += frame.len() as u64;
        }
        // A rollback after the frames were read would mean they included taken-back writes.
        if shared.rollbacks.load(Ordering::SeqCst) != rollbacks {
            return Err(super::shared::full("writes were taken back during the backup"));
        }
        Ok(BackupInfo {
            seq,
            keys,
            log_records: records,
            snapshot_bytes,
            log_bytes: log.bytes,
        })
    }
}
