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
//! - A file written in the other mode (encrypted, opened without a key, or the reverse) or
//!   under another key is [`StorageError::Encryption`], naming the file and the key file, before
//!   any record is read: a wrong key never loads garbage.
//!
//! A read-only recovery ([`Mode::ReadOnly`]: `stategate export` of a stopped directory) applies
//! the same rules but changes nothing on disk: a torn tail is skipped, not cut.
//!
//! Encrypted files of an earlier release (format 01E: records sealed without their place, so
//! they could be reordered or replayed unnoticed) are refused by the service's recovery
//! ([`Mode::ReadWrite`]) before anything is read or changed, with the command that upgrades
//! them; only `rekey` ([`Mode::Upgrade`], which rewrites the store in the current format) and
//! the read-only recovery read them. Accepting them at every start would keep that hole open
//! for good: anyone who can write the directory could put such a file back.

use std::fs::File;
use std::path::Path;

use super::format::{self, Codec, Cursor, Decoder, FileId, FileType, HeaderError, Payload};
use super::{segment_name, snapshot_name, sync_dir, writer};
use crate::StorageError;
use crate::memory::MemoryBackend;

/// Whether recovery may repair the directory (cut a torn tail, remove what a snapshot
/// replaced) and leave the newest segment open for appending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    ReadWrite,
    ReadOnly,
    /// Read-write, for `rekey`: files of the earlier encrypted format are read too.
    Upgrade,
}

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
    /// The newest segment, open for appending (`None` in a read-only recovery).
    pub file: Option<File>,
    /// Where the newest segment's next frame goes.
    pub cursor: Cursor,
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

/// A header refused: a clear error naming the file (and the key file, when one is involved).
fn header_error(path: &Path, codec: &Codec, e: HeaderError, what: &str) -> StorageError {
    let key = codec
        .cipher()
        .map(|c| c.key_path().display().to_string())
        .unwrap_or_default();
    match e {
        HeaderError::Incomplete | HeaderError::NotOurs => corrupt(path, 0, format!("not a {what} header")),
        HeaderError::Encrypted => StorageError::Encryption(format!(
            "{} is encrypted: give its key with --encryption-key-file",
            path.display()
        )),
        HeaderError::NotEncrypted => StorageError::Encryption(format!(
            "{} is not encrypted, but --encryption-key-file {key} was given: to encrypt an existing \
             store, stop the service and run `stategate rekey --new-encryption-key-file {key}`",
            path.display()
        )),
        HeaderError::WrongKey => StorageError::Encryption(format!(
            "the key in {key} does not open {}: wrong key (nothing was read)",
            path.display()
        )),
    }
}

fn check_header(path: &Path, codec: &Codec, file: FileType, data: &[u8], seq: u64) -> Result<(), StorageError> {
    let what = match file {
        FileType::Log => "log segment",
        FileType::Snapshot => "snapshot",
    };
    match codec.check_header(file, data) {
        Ok(s) if s == seq => Ok(()),
        Ok(s) => Err(corrupt(
            path,
            0,
            format!("the {what} header says {s}, not the number in its name"),
        )),
        Err(e) => Err(header_error(path, codec, e, what)),
    }
}

pub(super) fn recover(dir: &Path, index: &MemoryBackend, codec: &Codec, mode: Mode) -> Result<Recovered, StorageError> {
    let writable = mode != Mode::ReadOnly;
    let mut segments = Vec::new();
    let mut snapshots = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_at(dir))? {
        let entry = entry.map_err(io_at(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        match parse_name(name) {
            Some(FileKind::Segment(s)) => segments.push(s),
            Some(FileKind::Snapshot(s)) => snapshots.push(s),
            Some(FileKind::Temp) if writable => {
                let path = dir.join(name);
                std::fs::remove_file(&path).map_err(io_at(&path))?;
                tracing::info!(file = %path.display(), "removed an unfinished snapshot");
            }
            Some(FileKind::Temp) | None => {}
        }
    }
    segments.sort_unstable();
    snapshots.sort_unstable();

    let base = snapshots.last().copied();
    let first = base.unwrap_or(1);
    if mode == Mode::ReadWrite {
        let read = base.map(|s| dir.join(snapshot_name(s))).into_iter().chain(
            segments
                .iter()
                .filter(|&&s| s >= first)
                .map(|&s| dir.join(segment_name(s))),
        );
        for path in read {
            refuse_unbound(&path, codec)?;
        }
    }

    let mut decoder = Decoder::default();
    let mut wall_ms = 0;
    let snapshot_bytes = match base {
        Some(seq) => load_snapshot(
            &dir.join(snapshot_name(seq)),
            seq,
            index,
            codec,
            &mut decoder,
            &mut wall_ms,
        )?,
        None => 0,
    };

    // Left over by a crash between committing a snapshot and removing what it replaces.
    let mut removed = false;
    for &s in snapshots.iter().filter(|&&s| writable && Some(s) != base) {
        let path = dir.join(snapshot_name(s));
        std::fs::remove_file(&path).map_err(io_at(&path))?;
        removed = true;
    }
    for &s in segments.iter().filter(|&&s| writable && s < first) {
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
    let mut last_file = FileId::default();
    for (i, &s) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let path = dir.join(segment_name(s));
        let segment = Segment {
            path: &path,
            seq: s,
            last,
            codec,
            mode,
        };
        last_file = replay_segment(&segment, index, &mut decoder, &mut log_records, &mut wall_ms)?;
    }

    let (file, seq, file_id) = match (segments.last(), mode) {
        (Some(&s), Mode::ReadOnly) => (None, s, last_file),
        (None, Mode::ReadOnly) => (None, first, last_file),
        (Some(&s), Mode::ReadWrite | Mode::Upgrade) => {
            let path = dir.join(segment_name(s));
            let file = File::options().append(true).open(&path).map_err(io_at(&path))?;
            (Some(file), s, last_file)
        }
        (None, Mode::ReadWrite | Mode::Upgrade) => {
            let (file, cursor) =
                writer::create_segment(dir, first, codec).map_err(io_at(&dir.join(segment_name(first))))?;
            (Some(file), first, cursor.file)
        }
    };
    let seg_bytes = match &file {
        Some(f) => f.metadata().map_err(io_at(dir))?.len(),
        None => 0,
    };
    Ok(Recovered {
        file,
        cursor: Cursor {
            file: file_id,
            offset: seg_bytes,
        },
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
    codec: &Codec,
    decoder: &mut Decoder,
    wall_ms: &mut u64,
) -> Result<u64, StorageError> {
    let data = std::fs::read(path).map_err(io_at(path))?;
    check_header(path, codec, FileType::Snapshot, &data, seq)?;
    let file = codec.file_id(&data);
    let start = codec.header_len();
    let expected = expected_keys(&data[start..]);
    index
        .load_many(expected, |load| {
            let mut pos = start;
            let mut keys = 0u64;
            while pos < data.len() {
                let (payload, n) = format::read_frame(&data[pos..]).map_err(|e| corrupt(path, pos, e))?;
                let record = codec
                    .open(payload, &file, pos as u64)
                    .map_err(|e| corrupt(path, pos, e))?;
                match decoder.decode(&record).map_err(|e| corrupt(path, pos, e))? {
                    Payload::Entries {
                        kind: format::KIND_SNAP_CHUNK,
                        entries,
                        ..
                    } => {
                        keys += entries.len() as u64;
                        for (k, rec) in entries {
                            load(k, rec).map_err(|e| corrupt(path, pos, e))?;
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
                        return Ok((data.len() as u64, max_version));
                    }
                    Payload::Entries { .. } => return Err(corrupt(path, pos, "a log record in a snapshot")),
                }
                pos += n;
            }
            Err(corrupt(path, pos, "the snapshot has no end record"))
        })
        .map(|(bytes, max_version)| {
            if let Some(max) = max_version {
                index.observe_version(&max);
            }
            bytes
        })
}

/// About how many keys a snapshot's chunks hold, from the bytes per key of its first chunk
/// (chunks hold the same number of keys): what the index is sized for before loading. A
/// guess only; the table grows past it if it falls short.
fn expected_keys(chunks: &[u8]) -> usize {
    match format::read_frame(chunks) {
        // The frame's key count is not read here (that needs the codec and the decoder):
        // every chunk but the last holds the writer's chunk size.
        Ok((_, n)) => chunks.len() / (n / super::snapshot::CHUNK_KEYS).max(1),
        _ => 0,
    }
}

/// A segment to replay, and how.
struct Segment<'a> {
    path: &'a Path,
    seq: u64,
    /// The newest segment: the only one that may end in a torn tail.
    last: bool,
    codec: &'a Codec,
    mode: Mode,
}

/// Replays one segment; returns its identity (a header rewritten here gets a new one).
fn replay_segment(
    seg: &Segment<'_>,
    index: &MemoryBackend,
    decoder: &mut Decoder,
    records: &mut u64,
    wall_ms: &mut u64,
) -> Result<FileId, StorageError> {
    let (path, codec) = (seg.path, seg.codec);
    let data = std::fs::read(path).map_err(io_at(path))?;
    if data.len() < codec.header_len() {
        if !seg.last {
            return Err(corrupt(path, 0, "incomplete header in a segment that is not the last"));
        }
        // A header cut short can still show that the file was written in the other mode.
        match codec.check_header(FileType::Log, &data) {
            Err(e @ (HeaderError::Encrypted | HeaderError::NotEncrypted | HeaderError::NotOurs)) => {
                return Err(header_error(path, codec, e, "log segment"));
            }
            Ok(_) | Err(HeaderError::Incomplete | HeaderError::WrongKey) => {}
        }
        if seg.mode == Mode::ReadOnly {
            return Ok(FileId::default());
        }
        cut_torn_tail(path, 0, data.len(), "incomplete header")?;
        let mut f = File::options().write(true).open(path).map_err(io_at(path))?;
        let header = codec.header(FileType::Log, seg.seq);
        std::io::Write::write_all(&mut f, &header).map_err(io_at(path))?;
        f.sync_all().map_err(io_at(path))?;
        return Ok(codec.file_id(&header));
    }
    check_header(path, codec, FileType::Log, &data, seg.seq)?;
    let file = codec.file_id(&data);
    let mut pos = codec.header_len();
    while pos < data.len() {
        match format::read_frame(&data[pos..]) {
            Ok((payload, n)) => {
                // The CRC holds, so the bytes are as written: a seal that does not open is
                // tampering (changed, moved or replayed), not a torn write.
                let record = codec
                    .open(payload, &file, pos as u64)
                    .map_err(|e| corrupt(path, pos, e))?;
                match decoder.decode(&record) {
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
                if !seg.last {
                    return Err(corrupt(path, pos, format!("{e} in a segment that is not the last")));
                }
                // A torn tail has no valid frame after the damage; corruption does.
                if let Some(at) = (pos + 1..data.len()).find(|&o| codec.looks_like_frame(&data[o..], &file, o as u64)) {
                    return Err(corrupt(
                        path,
                        pos,
                        format!("{e}, followed by a valid record at offset {at}"),
                    ));
                }
                if seg.mode == Mode::ReadOnly {
                    tracing::warn!(file = %path.display(), offset = pos, reason = %e, "skipping a torn tail of the log (read-only)");
                    return Ok(file);
                }
                cut_torn_tail(path, pos, data.len(), &e.to_string())?;
                return Ok(file);
            }
        }
    }
    Ok(file)
}

/// The service does not run on encrypted files of the earlier format (see the module docs):
/// it stops before reading or changing anything, naming the upgrade.
fn refuse_unbound(path: &Path, codec: &Codec) -> Result<(), StorageError> {
    let Some(cipher) = codec.cipher() else {
        return Ok(());
    };
    let mut header = Vec::new();
    let file = File::open(path).map_err(io_at(path))?;
    std::io::Read::read_to_end(&mut std::io::Read::take(file, codec.header_len() as u64), &mut header)
        .map_err(io_at(path))?;
    if !codec.file_id(&header).is_unbound() {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new(".")).display();
    let key = cipher.key_path().display();
    Err(StorageError::Encryption(format!(
        "{} was encrypted by an earlier release, whose records are not bound to their place in \
         the file (they could be reordered or replayed unnoticed); nothing was read or changed. \
         Upgrade the store once, with the service stopped: `stategate rekey --data-dir {dir} \
         --encryption-key-file {key} --new-encryption-key-file {key}` rewrites it in the current \
         format under the same key (a crash midway leaves it as it was)",
        path.display()
    )))
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
