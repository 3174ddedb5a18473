//! Writing a snapshot while writes go on.
//!
//! Segment `seq` was started before the snapshot reads the index, so every write that is not in
//! segments `seq..` is in the index already. The index is read a chunk at a time (writers are
//! held up for one chunk at most), so the snapshot may hold some keys as they were after later
//! writes. That is fine: log records hold whole records, not deltas, so replaying segments
//! `seq..` on top of the snapshot ends with every key's last state, and a multi-key write that
//! the snapshot caught half of is made whole by its replay. For that replay to be possible, the
//! snapshot is committed (renamed into place) only once every write it reflects is synced in
//! the log. Only then are the segments and snapshot it replaces removed.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use bytes::Bytes;

use crate::hlc::Clock;

use super::format::{self, Codec, Cursor, FileType};
use super::{Shared, segment_name, snapshot_name, sync_dir};
use crate::StorageError;
use crate::memory::MemoryBackend;

pub(super) const CHUNK_KEYS: usize = 512;

/// Writes `snap-<seq>.snap` and removes what it replaces. Returns its size in bytes.
pub(super) fn write(
    dir: &Path,
    seq: u64,
    index: &MemoryBackend,
    shared: &Shared,
    clock: &dyn Clock,
    codec: &Codec,
) -> Result<u64, StorageError> {
    let tmp = dir.join(format!("snap-{seq:020}.tmp"));
    let result = write_tmp(&tmp, seq, index, shared, clock, codec);
    let bytes = match result {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, dir.join(snapshot_name(seq)))?;
    sync_dir(dir)?;
    remove_replaced(dir, seq)?;
    Ok(bytes)
}

fn write_tmp(
    tmp: &Path,
    seq: u64,
    index: &MemoryBackend,
    shared: &Shared,
    clock: &dyn Clock,
    codec: &Codec,
) -> Result<u64, StorageError> {
    // Writes taken back (disk full) after this may be in the chunks: then the snapshot is
    // given up (`wait_written` fails).
    let rollbacks = shared.rollbacks.load(std::sync::atomic::Ordering::SeqCst);
    let mut out = BufWriter::with_capacity(1 << 20, File::create(tmp)?);
    let (header, mut at) = codec.start(FileType::Snapshot, seq);
    out.write_all(&header)?;
    let keys = write_chunks(&mut out, &mut at, index, codec)?;
    // Every write the chunks above reflect was queued before this point.
    let reflected = shared.last_queued();
    write_end(&mut out, &mut at, index, codec, keys, clock.now_ms())?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let bytes = file.metadata()?.len();

    shared.wait_written(reflected, rollbacks)?;
    // Any handle syncs the file; the commit thread may be appending to it meanwhile.
    File::open(tmp.with_file_name(segment_name(seq)))?.sync_data()?;
    Ok(bytes)
}

/// Writes every record of the index as snapshot chunks from `at` on, a chunk of keys at a
/// time (writers wait for one chunk at most). Returns how many keys it wrote.
pub(super) fn write_chunks(
    out: &mut impl Write,
    at: &mut Cursor,
    index: &MemoryBackend,
    codec: &Codec,
) -> std::io::Result<u64> {
    let mut after: Option<Bytes> = None;
    let mut keys = 0u64;
    let mut buf = Vec::new();
    loop {
        let chunk = index.records_after(after.as_deref(), CHUNK_KEYS);
        let Some((last, _)) = chunk.last() else {
            return Ok(keys);
        };
        after = Some(last.clone());
        keys += chunk.len() as u64;
        buf.clear();
        format::encode_chunk(codec, &mut buf, at, &chunk);
        out.write_all(&buf)?;
    }
}

/// The end record: the key count, the highest version ever stored, the wall clock.
pub(super) fn write_end(
    out: &mut impl Write,
    at: &mut Cursor,
    index: &MemoryBackend,
    codec: &Codec,
    keys: u64,
    wall_ms: u64,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    format::encode_end(codec, &mut buf, at, keys, index.max_version_now().as_ref(), wall_ms);
    out.write_all(&buf)
}

/// Removes the segments before `seq` and the snapshots before this one.
fn remove_replaced(dir: &Path, seq: u64) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let old = match super::recovery::parse_name(name) {
            Some(super::recovery::FileKind::Segment(s)) => s < seq,
            Some(super::recovery::FileKind::Snapshot(s)) => s < seq,
            _ => false,
        };
        if old {
            std::fs::remove_file(dir.join(name))?;
        }
    }
    sync_dir(dir)
}
