//! Work on a stopped store: read it without changing anything (`stategate export --data-dir`),
//! and change its encryption key (`stategate rekey`). Both take the directory's lock, so they
//! refuse a directory a running service has open.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::format::FileType;
use super::recovery::{self, Mode};
use super::{EncryptionKey, clock_floor, codec_for, lock_dir, segment_name, snapshot, snapshot_name, sync_dir};
use crate::StorageError;
use crate::hlc::{Clock, SystemClock};
use crate::memory::MemoryBackend;

/// Loads a stopped store into memory without changing its directory: a torn tail is skipped,
/// not cut; nothing is removed or created (beyond the lock file, if it is missing).
pub fn load_read_only(dir: &Path, key: Option<&EncryptionKey>) -> Result<MemoryBackend, StorageError> {
    if !dir.is_dir() {
        return Err(StorageError::Backend(format!("{} is not a directory", dir.display())));
    }
    let _lock = lock_dir(dir)?;
    let codec = codec_for(key)?;
    let index = MemoryBackend::default();
    let recovered = recovery::recover(dir, &index, &codec, Mode::ReadOnly)?;
    if let Some(floor) = clock_floor(index.max_version_now(), recovered.wall_ms) {
        index.observe_version(&floor);
    }
    Ok(index)
}

/// What a rekey did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RekeyReport {
    pub keys: u64,
    pub snapshot_bytes: u64,
}

/// Rewrites a stopped store under another key (`new`; `None`: decrypted), reading it with
/// `old` (`None`: it is not encrypted). Under the same key twice it is the upgrade of a store
/// encrypted by an earlier release, whose files the service refuses (`recovery.rs`). Recovers it, writes one snapshot of everything under
/// the new key as the next sequence number, then removes every older file. A crash before the
/// snapshot is renamed into place leaves the store under the old key; after, under the new one
/// (recovery removes what the snapshot replaced).
pub fn rekey(
    dir: &Path,
    old: Option<&EncryptionKey>,
    new: Option<&EncryptionKey>,
) -> Result<RekeyReport, StorageError> {
    let _lock = lock_dir(dir)?;
    let (old_codec, new_codec) = (codec_for(old)?, codec_for(new)?);
    let index = MemoryBackend::default();
    // Files of the earlier encrypted format are read too: this is their upgrade.
    let recovered = recovery::recover(dir, &index, &old_codec, Mode::Upgrade)?;
    drop(recovered.file);
    if let Some(floor) = clock_floor(index.max_version_now(), recovered.wall_ms) {
        index.observe_version(&floor);
    }
    let seq = recovered.seq + 1;
    let tmp = dir.join(format!("snap-{seq:020}.tmp"));
    let written = (|| -> std::io::Result<(u64, u64)> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        let (header, mut at) = new_codec.start(FileType::Snapshot, seq);
        out.write_all(&header)?;
        let keys = snapshot::write_chunks(&mut out, &mut at, &index, &new_codec)?;
        let wall_ms = SystemClock.now_ms().max(recovered.wall_ms);
        snapshot::write_end(&mut out, &mut at, &index, &new_codec, keys, wall_ms)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok((keys, file.metadata()?.len()))
    })();
    let (keys, snapshot_bytes) = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
    };
    std::fs::rename(&tmp, dir.join(snapshot_name(seq)))?;
    sync_dir(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let old = match recovery::parse_name(name) {
            Some(recovery::FileKind::Segment(s)) | Some(recovery::FileKind::Snapshot(s)) => s < seq,
            _ => false,
        };
        if old {
            std::fs::remove_file(dir.join(name))?;
        }
    }
    sync_dir(dir)?;
    // The next open starts segment `seq` under the new key.
    debug_assert!(!dir.join(segment_name(seq)).exists());
    Ok(RekeyReport { keys, snapshot_bytes })
}
