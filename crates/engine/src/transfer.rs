//! Moving records in and out whole (`stategate export` / `import`): a page of live records with
//! every field, and the import path that stores records with their own versions and deadlines.
//!
//! Import is the one way into the store that does not issue a version: the record keeps the
//! version, fencing token and deadline it was exported with. It still goes through the
//! conditional swap under the keys' stripe locks like every write, with the engine's own input
//! checks (sizes, clock skew, TTL range), and the clock is raised past every imported version,
//! so versions issued afterwards are higher. Per key:
//!
//! - absent (or expired): stored;
//! - stored with the same version: left alone (importing a file twice changes nothing);
//! - stored with a newer version: kept, and counted, unless `overwrite` (then replaced, and the
//!   key's version goes back to the imported one);
//! - protected by a fencing token: replaced only by a record whose token is equal or higher
//!   (the fencing rule of a SET), or with `overwrite_fenced`; otherwise kept, and counted;
//! - otherwise (an older version stored): replaced.
//!
//! A record already expired when it arrives is skipped. Observers (KEYNOTIFY) are told of each
//! stored record as a SET with its imported version. The change history takes them as changes
//! only when their versions are above every version it ever held; otherwise it starts over
//! (open watches get `overflow`, a resume gets a reset and a snapshot): an imported version may
//! be one the history, or a watcher, already knows at another position (export, delete,
//! import), and a resume from it would skip every change in between (`feed.rs`).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{Change, ChangeKind, Engine, EngineError, MAX_TTL_MS, contended};
use crate::storage::{DeadlineCheck, Record, Swap, Written};

/// Keys per storage swap (one log record, one stripe-lock set) during an import.
const IMPORT_BATCH: usize = 256;
/// Conflicts are only possible when another process shares the storage.
const IMPORT_ATTEMPTS: usize = 64;

/// How an import treats keys that hold something else.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Also replace keys that hold a newer version.
    pub overwrite: bool,
    /// Also replace keys protected by a fencing token the record does not match (an admin's
    /// explicit choice: it takes a lock's protection away from its holder).
    pub overwrite_fenced: bool,
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Stored (new keys, or replacing an older or, with `overwrite`, a newer version).
    pub imported: u64,
    /// Already stored with exactly this version.
    pub unchanged: u64,
    /// Not stored: the store holds a newer version (and `overwrite` was not given).
    pub kept_newer: u64,
    /// Not stored: the key is protected by a fencing token the record does not match (and
    /// `overwrite_fenced` was not given).
    pub fenced: u64,
    /// Not stored: expired already.
    pub expired: u64,
}

impl ImportReport {
    fn add(&mut self, other: ImportReport) {
        self.imported += other.imported;
        self.unchanged += other.unchanged;
        self.kept_newer += other.kept_newer;
        self.fenced += other.fenced;
        self.expired += other.expired;
    }
}

impl Engine {
    /// Up to `n` live records strictly after `after` in key order, with every field, and the
    /// key to continue after (`None`: the end). Each record is as it was when read: a page is
    /// not a snapshot of one moment (the online backup is).
    pub async fn export_page(
        &self,
        after: Option<&[u8]>,
        n: usize,
    ) -> Result<(Vec<(Bytes, Record)>, Option<Bytes>), EngineError> {
        let now = self.0.hlc.wall_ms();
        let page = self.0.store.backend().scan(after, n.max(1), now, &|_| true).await?;
        let mut records = Vec::with_capacity(page.keys.len());
        for key in page.keys {
            // Deleted or expired since the scan: not exported.
            if let Some(r) = self.0.store.backend().get(&key).await?
                && !r.is_expired(now)
            {
                records.push((key, r));
            }
        }
        Ok((records, page.resume_after))
    }

    /// Checks records for an import before any is stored: the same input rules as a SET
    /// (non-empty key, sizes, a version or token not too far in the future, a deadline within
    /// the TTL range). The error names the record (0-based).
    pub fn check_import(&self, records: &[(Bytes, Record)]) -> Result<(), (usize, EngineError)> {
        let l = &self.0.limits;
        let now = self.0.hlc.wall_ms();
        for (i, (key, r)) in records.iter().enumerate() {
            let check = || {
                if key.is_empty() {
                    return Err(EngineError::EmptyKey);
                }
                if key.len() > l.max_key_bytes || r.value.len() > l.max_value_bytes {
                    return Err(EngineError::TooLarge);
                }
                self.check_skew(Some(&r.version), || EngineError::TimestampSkew)?;
                self.check_skew(r.fencing.as_ref(), || EngineError::FencingTokenSkew)?;
                if r.expires_at_ms.is_some_and(|d| d > now.saturating_add(MAX_TTL_MS)) {
                    return Err(EngineError::TtlOutOfRange);
                }
                Ok(())
            };
            check().map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Stores records with their own versions, fencing tokens and deadlines (see the module
    /// docs for what happens per key). Checks every record first ([`Engine::check_import`]):
    /// one that fails changes nothing. Records are stored in batches; an error in a later
    /// batch (the storage failed, `max_keys`) leaves the earlier ones stored.
    pub async fn import(
        &self,
        records: Vec<(Bytes, Record)>,
        options: ImportOptions,
    ) -> Result<ImportReport, EngineError> {
        self.check_import(&records).map_err(|(_, e)| e)?;
        // One record per key: the highest version wins within an import.
        let mut latest: BTreeMap<Bytes, Record> = BTreeMap::new();
        for (key, r) in records {
            match latest.get(&key) {
                Some(have) if have.version >= r.version => {}
                _ => {
                    latest.insert(key, r);
                }
            }
        }
        let mut report = ImportReport::default();
        let all: Vec<(Bytes, Record)> = latest.into_iter().collect();
        for batch in all.chunks(IMPORT_BATCH) {
            report.add(self.import_batch(batch, options).await?);
        }
        Ok(report)
    }

    async fn import_batch(
        &self,
        batch: &[(Bytes, Record)],
        options: ImportOptions,
    ) -> Result<ImportReport, EngineError> {
        let mut stripes: Vec<usize> = batch.iter().map(|(k, _)| self.stripe(k)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut _guards = Vec::with_capacity(stripes.len());
        for i in stripes {
            _guards.push(self.0.stripes[i].lock().await);
        }
        for _ in 0..IMPORT_ATTEMPTS {
            let now = self.0.hlc.wall_ms();
            let mut report = ImportReport::default();
            let mut swaps = Vec::new();
            for (key, r) in batch {
                if r.is_expired(now) {
                    report.expired += 1;
                    continue;
                }
                let cur = self.0.store.backend().get(key).await?;
                let live = cur.as_ref().filter(|c| !c.is_expired(now));
                match live {
                    Some(c) if c.version == r.version => {
                        report.unchanged += 1;
                        continue;
                    }
                    Some(c) if c.version > r.version && !options.overwrite => {
                        report.kept_newer += 1;
                        continue;
                    }
                    // The fencing rule of a SET, with the record's token as the request's.
                    Some(c)
                        if !options.overwrite_fenced
                            && Engine::check_fencing(c.fencing.as_ref(), r.fencing.as_ref()).is_err() =>
                    {
                        report.fenced += 1;
                        continue;
                    }
                    _ => {}
                }
                swaps.push(Swap {
                    key: key.clone(),
                    expected: cur.map(|c| c.version),
                    new: Some(r.clone()),
                    deadline: DeadlineCheck::Any,
                });
            }
            report.imported = swaps.len() as u64;
            if swaps.is_empty() {
                return Ok(report);
            }
            // Versions issued from now on are above every imported one.
            for s in &swaps {
                if let Some(r) = &s.new {
                    self.0.hlc.observe(&r.version);
                }
            }
            // Published once applied: here, or through the shared log of replicas on Redis.
            let changes = swaps
                .iter()
                .filter_map(|s| {
                    let r = s.new.as_ref()?;
                    let change = Change {
                        key: s.key.clone(),
                        version: r.version.clone(),
                        kind: ChangeKind::Set(r.value.clone()),
                    };
                    Some((change, Some(r.clone())))
                })
                .collect();
            match self
                .commit_as(&swaps, self.0.limits.max_keys, changes, None, true)
                .await?
            {
                Written::Done { .. } => return Ok(report),
                Written::TooManyKeys => return Err(EngineError::QuotaExceeded),
                Written::Conflict | Written::Behind(_) => continue,
                // Only a write that carries a request mark can be a repeat.
                Written::Repeated(_) => return Err(contended()),
            }
        }
        Err(contended())
    }
}
