//! Recovery at open: the newest snapshot, then the log segments after it, in order.
//!
//! Rules (ARCHITECTURE.md repeats them):
//! - A record is applied only once its whole frame checks out (length, CRC, decoding), and a
//!   multi-key record all at once: a partly written value is never loaded.
//! - The last segment may end in a torn tail (a crash during a write): a bad frame there with
//!   no valid frame anywhere after it. The tail is cut off, with a warning naming the file, the
//!   offset and the bytes dropped, and the service starts with every record before it.
//! - Anything else is [`StorageError::Corrupt`], naming the file and offset: a bad frame with a
//!   valid one after it, a bad frame in an older segment (segments are synced before the next
//!   one starts), any damage to a snapshot (snapshots are synced before being renamed into
//!   place), a missing segment, or a header that is not ours.

use std::fs::File;
use std::path::Path;

use super::format::{self, Decoder, Payload};
use super::{segment_name, snapshot_name, sync_dir, writer};
use crate::storage::StorageError;
use crate::storage::memory::MemoryBackend;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileKind {
    Segment(u64),
    Snapshot(u64),
    /// A snapshot that was being written when the process stopped.
    Temp,
}

pub(super) fn parse_name(name: &str) -> Option<FileKind> {
    let seq = |s: &str| s.parse::<u64>().ok().filter(|_| s.len() == 20);
    if let Some(s) = name.strip_prefix("log-").and_then(|n| n.strip_suffix(".log")) {
        return seq(s).map(FileKind::Segment);
    }
    if let Some(s) = name.strip_prefix("snap-").and_then(|n| n.strip_suffix(".snap")) {
        return seq(s).map(FileKind::Snapshot);
    }
    if name.starts_with("snap-") && name.ends_with(".tmp") {
        return Some(FileKind::Temp);
    }
    None
}

/// What recovery leaves for the commit thread.
#[derive(Debug)]
pub(super) struct Recovered {
    /// The newest segment, open for appending.
    pub file: File,
    pub seq: u64,
    pub seg_bytes: u64,
    pub snapshot_bytes: u64,
    /// The latest wall clock recorded in the snapshot or log (0: none).
    pub wall_ms: u64,
    pub log_records: u64,
    pub segments_replayed: usize,
}

fn corrupt(path: &Path, offset: usize, what: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt(format!("{} at offset {offset}: {what}", path.display()))
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |e| StorageError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

pub(super) fn recover(dir: &Path, index: &MemoryBackend) -> Result<Recovered, StorageError> {
    let mut segments = Vec::new();
    let mut snapshots = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_at(dir))? {
        let entry = entry.map_err(io_at(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        match parse_name(name) {
            Some(FileKind::Segment(s)) => segments.push(s),
            Some(FileKind::Snapshot(s)) => snapshots.push(s),
            Some(FileKind::Temp) => {
                let path = dir.join(name);
                std::fs::remove_file(&path).map_err(io_at(&path))?;
                tracing::info!(file = %path.display(), "removed an unfinished snapshot");
            }
            None => {}
        }
    }
    segments.sort_unstable();
    snapshots.sort_unstable();

    let mut decoder = Decoder::default();
    let base = snapshots.last().copied();
    let mut wall_ms = 0;
    let snapshot_bytes = match base {
        Some(seq) => load_snapshot(&dir.join(snapshot_name(seq)), seq, index, &mut decoder, &mut wall_ms)?,
        None => 0,
    };

    // Left over by a crash between committing a snapshot and removing what it replaces.
    let mut removed = false;
    for &s in snapshots.iter().filter(|&&s| Some(s) != base) {
        let path = dir.join(snapshot_name(s));
        std::fs::remove_file(&path).map_err(io_at(&path))?;
        removed = true;
    }
    let first = base.unwrap_or(1);
    for &s in segments.iter().filter(|&&s| s < first) {
        let path = dir.join(segment_name(s));
        std::fs::remove_file(&path).map_err(io_at(&path))?;
        removed = true;
    }
    if removed {
        sync_dir(dir).map_err(io_at(dir))?;
    }
    segments.retain(|&s| s >= first);

    for (i, &s) in segments.iter().enumerate() {
        let expected = first + i as u64;
        if s != expected {
            let missing = dir.join(segment_name(expected));
            return Err(StorageError::Corrupt(format!(
                "{} is missing ({} exists)",
                missing.display(),
                segment_name(s)
            )));
        }
    }

    let mut log_records = 0;
    let segments_replayed = segments.len();
    for (i, &s) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let path = dir.join(segment_name(s));
        replay_segment(&path, s, last, index, &mut decoder, &mut log_records, &mut wall_ms)?;
    }

    let (file, seq) = match segments.last() {
        Some(&s) => {
            let path = dir.join(segment_name(s));
            let file = File::options().append(true).open(&path).map_err(io_at(&path))?;
            (file, s)
        }
        None => {
            let file = writer::create_segment(dir, first).map_err(io_at(&dir.join(segment_name(first))))?;
            (file, first)
        }
    };
    let seg_bytes = file.metadata().map_err(io_at(dir))?.len();
    Ok(Recovered {
        file,
        seq,
        seg_bytes,
        snapshot_bytes,
        wall_ms,
        log_records,
        segments_replayed,
    })
}

fn load_snapshot(
    path: &Path,
    seq: u64,
    index: &MemoryBackend,
    decoder: &mut Decoder,
    wall_ms: &mut u64,
) -> Result<u64, StorageError> {
    let data = std::fs::read(path).map_err(io_at(path))?;
    if format::parse_header(format::SNAP_MAGIC, &data) != Some(seq) {
        return Err(corrupt(path, 0, "not a snapshot header for this file name"));
    }
    let mut pos = format::HEADER_LEN;
    let mut keys = 0u64;
    while pos < data.len() {
        let (payload, n) = format::read_frame(&data[pos..]).map_err(|e| corrupt(path, pos, e))?;
        match decoder.decode(payload).map_err(|e| corrupt(path, pos, e))? {
            Payload::Entries {
                kind: format::KIND_SNAP_CHUNK,
                entries,
                ..
            } => {
                keys += entries.len() as u64;
                for (k, rec) in entries {
                    index.load(k, rec).map_err(|e| corrupt(path, pos, e))?;
                }
            }
            Payload::End {
                keys: expected,
                max_version,
                wall_ms: written_at,
            } => {
                *wall_ms = (*wall_ms).max(written_at);
                if expected != keys {
                    return Err(corrupt(
                        path,
                        pos,
                        format!("the end record counts {expected} keys, the snapshot holds {keys}"),
                    ));
                }
                if pos + n != data.len() {
                    return Err(corrupt(path, pos + n, "data after the end record"));
                }
                if let Some(max) = max_version {
                    index.observe_version(&max);
                }
                return Ok(data.len() as u64);
            }
            Payload::Entries { .. } => return Err(corrupt(path, pos, "a log record in a snapshot")),
        }
        pos += n;
    }
    Err(corrupt(path, pos, "the snapshot has no end record"))
}

fn replay_segment(
    path: &Path,
    seq: u64,
    last: bool,
    index: &MemoryBackend,
    decoder: &mut Decoder,
    records: &mut u64,
    wall_ms: &mut u64,
) -> Result<(), StorageError> {
    let data = std::fs::read(path).map_err(io_at(path))?;
    if data.len() < format::HEADER_LEN {
        if !last {
            return Err(corrupt(path, 0, "incomplete header in a segment that is not the last"));
        }
        cut_torn_tail(path, 0, data.len(), "incomplete header")?;
        let mut f = File::options().write(true).open(path).map_err(io_at(path))?;
        std::io::Write::write_all(&mut f, &format::header(format::LOG_MAGIC, seq)).map_err(io_at(path))?;
        f.sync_all().map_err(io_at(path))?;
        return Ok(());
    }
    if format::parse_header(format::LOG_MAGIC, &data) != Some(seq) {
        return Err(corrupt(path, 0, "not a log segment header for this file name"));
    }
    let mut pos = format::HEADER_LEN;
    while pos < data.len() {
        match format::read_frame(&data[pos..]) {
            Ok((payload, n)) => {
                match decoder.decode(payload) {
                    Ok(Payload::Entries {
                        kind: format::KIND_BATCH,
                        wall_ms: written_at,
                        entries,
                    }) => {
                        *wall_ms = (*wall_ms).max(written_at);
                        for (k, rec) in entries {
                            index.load(k, rec).map_err(|e| corrupt(path, pos, e))?;
                        }
                    }
                    Ok(_) => return Err(corrupt(path, pos, "a snapshot record in a log segment")),
                    Err(e) => return Err(corrupt(path, pos, e)),
                }
                *records += 1;
                pos += n;
            }
            Err(e) => {
                if !last {
                    return Err(corrupt(path, pos, format!("{e} in a segment that is not the last")));
                }
                // A torn tail has no valid frame after the damage; corruption does.
                if let Some(at) = (pos + 1..data.len()).find(|&o| format::looks_like_frame(&data[o..])) {
                    return Err(corrupt(
                        path,
                        pos,
                        format!("{e}, followed by a valid record at offset {at}"),
                    ));
                }
                return cut_torn_tail(path, pos, data.len(), &e.to_string());
            }
        }
    }
    Ok(())
}

fn cut_torn_tail(path: &Path, at: usize, len: usize, why: &str) -> Result<(), StorageError> {
    tracing::warn!(
        file = %path.display(),
        offset = at,
        dropped_bytes = len - at,
        reason = why,
        "dropping a torn tail of the log (a write cut short by a crash)"
    );
    let f = File::options().write(true).open(path).map_err(io_at(path))?;
    f.set_len(at as u64).map_err(io_at(path))?;
    f.sync_all().map_err(io_at(path))?;
    Ok(())
}
