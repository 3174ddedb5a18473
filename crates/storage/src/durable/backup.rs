//! Online backup: a consistent copy of the store as of one point in the log, taken while
//! writes go on, and sent at the reader's pace without holding compaction up.
//!
//! The copy is the store's own files as of one moment, the ones recovery reads: the newest
//! snapshot `snap-S.snap` and the log segments from S on (every segment when there is no
//! snapshot yet), the open one cut where its last written frame ends (lsn L). Recovery of the
//! copy replays those segments over the snapshot, as after a clean stop at L: the state after
//! write L, one point of the log. Every write acknowledged before the backup started is in it
//! (acknowledged implies written, in every fsync mode).
//!
//! - The files are chosen and opened under the `snapshotting` flag (a compaction in progress
//!   is waited for, and none starts meanwhile), which is released before the first byte is
//!   sent: rotation and compaction go on while a client reads the copy, however slowly. A file
//!   that compaction removes meanwhile stays readable through its open handle; its space
//!   returns when the backup ends. A reader that stops reading is cut off by the sink (over
//!   HTTP after `--backup-send-timeout`), which ends the backup.
//! - Bytes before the published end of a segment never change: the commit thread publishes a
//!   length after writing the frames before it, and cuts a segment back (disk full) only to a
//!   length it has not published.
//! - Frames are copied as they are on disk, each checked on the way (length, checksum). The
//!   copy keeps every file's name, header and offsets, so an encrypted frame, sealed for its
//!   file and offset, opens in the copy as it does in the store (with the same key).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::format::{self, Codec, FileType};
use super::recovery::{FileKind, parse_name};
use super::shared::lock;
use super::{DurableBackend, segment_name, snapshot_name};
use crate::{BackupFile, BackupInfo, BackupSink, OnlineBackup, StorageError};

/// How often a backup looks again whether a compaction it waits for has finished.
const FLAG_POLL: Duration = Duration::from_millis(20);
/// Bytes handed to the sink at once.
const SEND_BYTES: usize = 256 * 1024;

/// Holds the `snapshotting` flag; releases it when dropped.
struct Held<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// One file of the copy, open, and where its copy ends.
struct Source {
    file: BackupFile,
    path: PathBuf,
    handle: File,
    end: u64,
}

/// Gathers what goes to a sink into pieces of [`SEND_BYTES`].
struct ToSink<'a> {
    sink: &'a mut dyn BackupSink,
    file: BackupFile,
    pending: Vec<u8>,
}

impl ToSink<'_> {
    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.pending.len() + bytes.len() < SEND_BYTES {
            self.pending.extend_from_slice(bytes);
            return Ok(());
        }
        self.flush()?;
        if bytes.len() < SEND_BYTES {
            self.pending.extend_from_slice(bytes);
            return Ok(());
        }
        // A large frame goes as it is (the sink splits what it must), not copied again.
        self.sink.write(self.file, bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            self.sink.write(self.file, &self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }
}

impl OnlineBackup for DurableBackend {
    fn backup(&self, sink: &mut dyn BackupSink) -> Result<BackupInfo, StorageError> {
        let (sources, keys) = self.open_copy()?;
        let seq = match sources.first().map(|s| s.file) {
            Some(BackupFile::Snapshot { seq } | BackupFile::Log { seq }) => seq,
            None => return Err(StorageError::Backend("backup: the store has no log segment".into())),
        };
        let mut info = BackupInfo {
            seq,
            keys,
            log_records: 0,
            snapshot_bytes: 0,
            log_bytes: 0,
        };
        for source in &sources {
            let (bytes, frames) = copy(&self.codec, source, sink)?;
            match source.file {
                BackupFile::Snapshot { .. } => info.snapshot_bytes += bytes,
                BackupFile::Log { .. } => {
                    info.log_bytes += bytes;
                    info.log_records += frames;
                }
            }
        }
        Ok(info)
    }
}

impl DurableBackend {
    /// The files of the copy, open, and the keys stored at its point of the log. Holds the
    /// `snapshotting` flag only while it lists and opens them.
    fn open_copy(&self) -> Result<(Vec<Source>, u64), StorageError> {
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
        // Every frame before `end` in segment `open` is written, and stays as it is.
        let (open, end) = {
            let p = lock(&shared.progress);
            (p.segment, p.segment_len)
        };
        let keys = self.index.key_count();
        let mut snapshots = Vec::new();
        let mut segments = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            match name.to_str().and_then(parse_name) {
                Some(FileKind::Snapshot(s)) => snapshots.push(s),
                Some(FileKind::Segment(s)) => segments.push(s),
                Some(FileKind::Temp) | None => {}
            }
        }
        // What recovery reads: the newest snapshot and the segments from it on.
        let base = snapshots.iter().max().copied();
        let first = base.unwrap_or(1);
        segments.retain(|&s| s >= first && s <= open);
        segments.sort_unstable();
        if segments.last() != Some(&open) {
            return Err(StorageError::Backend(format!(
                "backup: {} is not in {}",
                segment_name(open),
                self.dir.display()
            )));
        }
        let mut sources = Vec::with_capacity(segments.len() + 1);
        let files = base
            .map(|seq| BackupFile::Snapshot { seq })
            .into_iter()
            .chain(segments.into_iter().map(|seq| BackupFile::Log { seq }));
        for file in files {
            let path = self.dir.join(match file {
                BackupFile::Snapshot { seq } => snapshot_name(seq),
                BackupFile::Log { seq } => segment_name(seq),
            });
            let handle = File::open(&path)?;
            let end = match file {
                BackupFile::Log { seq } if seq == open => end,
                _ => handle.metadata()?.len(),
            };
            sources.push(Source {
                file,
                path,
                handle,
                end,
            });
        }
        Ok((sources, keys))
    }
}

/// Sends one file of the copy: its header, then its frames up to `source.end`, each checked.
/// Returns the bytes and frames sent.
fn copy(codec: &Codec, source: &Source, sink: &mut dyn BackupSink) -> Result<(u64, u64), StorageError> {
    let (kind, seq) = match source.file {
        BackupFile::Snapshot { seq } => (FileType::Snapshot, seq),
        BackupFile::Log { seq } => (FileType::Log, seq),
    };
    let path = source.path.display();
    let corrupt = |offset: u64, what: &dyn std::fmt::Display| {
        StorageError::Corrupt(format!("{path}: backup: at offset {offset}: {what}"))
    };
    // Read to the end or to a partial frame: a frame cut off is damage, not the end.
    let short = |offset: u64, e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => corrupt(offset, &"the file ends inside a frame"),
        _ => StorageError::Io(e),
    };
    let mut reader = BufReader::with_capacity(1 << 20, (&source.handle).take(source.end));
    let mut out = ToSink {
        sink,
        file: source.file,
        pending: Vec::with_capacity(SEND_BYTES),
    };
    let mut frame = vec![0u8; codec.header_len()];
    reader.read_exact(&mut frame).map_err(|e| short(0, e))?;
    match codec.check_header(kind, &frame) {
        Ok(s) if s == seq => {}
        Ok(s) => return Err(corrupt(0, &format!("the header says {s}, not the number in its name"))),
        Err(e) => return Err(corrupt(0, &format!("not a header of this store ({e:?})"))),
    }
    out.send(&frame)?;
    let mut offset = frame.len() as u64;
    let mut frames = 0u64;
    while offset < source.end {
        frame.resize(format::FRAME_HEADER_LEN, 0);
        reader.read_exact(&mut frame).map_err(|e| short(offset, e))?;
        let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        if len == 0 || len > format::MAX_PAYLOAD {
            return Err(corrupt(offset, &format!("a frame of length {len}")));
        }
        frame.resize(format::FRAME_HEADER_LEN + len, 0);
        reader
            .read_exact(&mut frame[format::FRAME_HEADER_LEN..])
            .map_err(|e| short(offset, e))?;
        format::read_frame(&frame).map_err(|e| corrupt(offset, &e))?;
        out.send(&frame)?;
        offset += frame.len() as u64;
        frames += 1;
    }
    out.flush()?;
    Ok((offset, frames))
}
