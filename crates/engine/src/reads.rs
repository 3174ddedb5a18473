//! Reads that are not commands: a key's entry, SCAN pages, prefix listings, counts, the
//! storage's health and online backup.

use bytes::Bytes;

use super::*;

impl Engine {
    /// Reads a live key (GET with its expiry deadline). An expired key is removed and absent;
    /// a key with a sliding time to live has its deadline pushed out (see [`super::sliding`]).
    pub async fn read(&self, key: &Bytes) -> Result<Option<Entry>, EngineError> {
        let Some(r) = self.read_record(key).await? else {
            return Ok(None);
        };
        let r = match r.slide_ms {
            Some(_) => self.slide(key, r).await?,
            None => r,
        };
        Ok(Some(entry_of(r)))
    }

    /// Reads several live keys as of one moment (one `Backend::get_many`, as MGET does), so the
    /// answer never shows half of a transaction; otherwise as [`Engine::read`] of each: expired
    /// keys are absent (the expiry driver removes them), sliding deadlines move. For the Dapr
    /// bulk get, whose caller bounds the number of keys: each value is bounded by the value
    /// limit, not the whole answer by one value's (MGET's rule).
    pub async fn read_many(&self, keys: &[Bytes]) -> Result<Vec<Option<Entry>>, EngineError> {
        if keys.iter().any(|k| k.is_empty()) {
            return Err(EngineError::EmptyKey);
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let l = &self.0.limits;
        let most = keys.len().saturating_mul(l.max_value_bytes.saturating_add(1024));
        let Some(records) = self.0.store.backend().get_many(keys, most).await? else {
            return Err(EngineError::TooLarge);
        };
        let now = self.now_ms();
        let mut out = Vec::with_capacity(keys.len());
        for (key, record) in keys.iter().zip(records) {
            let entry = match record.filter(|r| !r.is_expired(now)) {
                None => None,
                Some(r) if r.slide_ms.is_some() => Some(entry_of(self.slide(key, r).await?)),
                Some(r) => Some(entry_of(r)),
            };
            out.push(entry);
        }
        Ok(out)
    }

    /// Reads a live key without counting as a read of it: a sliding deadline stays where it
    /// is (queries look at many keys they do not return).
    pub async fn peek(&self, key: &Bytes) -> Result<Option<Entry>, EngineError> {
        Ok(self.read_record(key).await?.map(entry_of))
    }

    async fn read_record(&self, key: &Bytes) -> Result<Option<Record>, EngineError> {
        if key.is_empty() {
            return Err(EngineError::EmptyKey);
        }
        let record = self.0.store.backend().get(key).await?;
        if let Some(cache) = &self.0.cache {
            cache.read(key, record.as_ref());
        }
        match record {
            None => Ok(None),
            Some(r) if self.is_expired(&r) => {
                let _guard = self.lock(key).await;
                match self.load_live(key).await {
                    // Removed (absent), or found alive after all: slid by a reader on another
                    // replica since it was read.
                    Ok(live) => Ok(live),
                    // Absent: a full disk only delays its removal (the expiry driver retries),
                    // and reads go on while writes are refused.
                    Err(EngineError::StorageFull) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            Some(r) => Ok(Some(r)),
        }
    }

    /// MGET: the keys' records from one point-in-time storage read (`Backend::get_many`:
    /// no swap, and so no transaction, is applied between its first read and its last), so
    /// the answer never shows half of a transaction, on any backend, replicas included. No
    /// stripe lock is needed for that. Expired keys read as absent (the expiry driver removes
    /// them); sliding deadlines move as for any read, after the read (they change no value).
    pub(crate) async fn mget(&self, c: MGet) -> Result<Response, EngineError> {
        let l = &self.0.limits;
        if c.keys.is_empty() {
            return Err(EngineError::WrongArity);
        }
        if c.keys.iter().any(|k| k.is_empty()) {
            return Err(EngineError::EmptyKey);
        }
        if c.keys.len() > l.mget_keys {
            return Err(EngineError::TooLarge);
        }
        if c.keys.iter().any(|k| k.len() > l.max_key_bytes) {
            return Err(EngineError::TooLarge);
        }
        // The answer (values, versions, framing) stays within what a GET of the largest value
        // takes, so it fits any packet the MQTT door may send; the storage checks the values
        // before it copies any.
        let most = l.max_value_bytes.saturating_add(1024);
        let Some(records) = self.0.store.backend().get_many(&c.keys, most).await? else {
            return Err(EngineError::TooLarge);
        };
        let now = self.now_ms();
        let mut bytes = 0usize;
        let mut newest: Option<Hlc> = None;
        let mut values = Vec::with_capacity(records.len());
        for (key, record) in c.keys.iter().zip(records) {
            let Some(r) = record.filter(|r| !r.is_expired(now)) else {
                bytes = bytes.saturating_add(8);
                values.push(None);
                continue;
            };
            bytes = bytes.saturating_add(r.value.len() + r.version.node.len() + 64);
            if bytes > most {
                return Err(EngineError::TooLarge);
            }
            let r = match r.slide_ms {
                Some(_) => self.slide(key, r).await?,
                None => r,
            };
            if newest.as_ref().is_none_or(|n| r.version > *n) {
                newest = Some(r.version.clone());
            }
            values.push(Some(entry_of(r)));
        }
        Ok(Response::new(Reply::Values(values), newest))
    }

    /// Keys removed so far because their deadline passed.
    pub fn expired_count(&self) -> u64 {
        self.0.expired.load(Ordering::Relaxed)
    }

    /// Bytes of the stored values, where the storage keeps count.
    pub async fn value_bytes(&self) -> Result<Option<u64>, EngineError> {
        Ok(self.0.store.backend().value_bytes().await?)
    }

    /// Whether the storage takes writes right now (readiness, metrics).
    pub fn storage_health(&self) -> crate::storage::StorageHealth {
        self.0.store.backend().health()
    }

    /// The storage's health as it changes (`None`: it never does).
    pub fn storage_health_changes(&self) -> Option<tokio::sync::watch::Receiver<crate::storage::StorageHealth>> {
        self.0.store.backend().health_changes()
    }

    /// Whether the storage can take an online backup ([`Engine::backup`]).
    pub fn can_backup(&self) -> bool {
        self.0.store.backend().online_backup().is_some()
    }

    /// An online backup of the storage (blocks the thread; run it on a blocking one). Fails
    /// with a storage error when the backend has none ([`Engine::can_backup`]).
    pub fn backup(&self, sink: &mut dyn crate::storage::BackupSink) -> Result<crate::storage::BackupInfo, EngineError> {
        match self.0.store.backend().online_backup() {
            Some(b) => Ok(b.backup(sink)?),
            None => Err(EngineError::Storage(crate::storage::StorageError::Backend(
                "this storage has no online backup (durable only; use export)".into(),
            ))),
        }
    }

    /// Number of keys stored, across every store (keys expired but not yet swept included).
    pub async fn key_count(&self) -> Result<u64, EngineError> {
        Ok(self.0.store.backend().len().await?)
    }

    /// Keys strictly after `after` that start with `prefix`, in byte order, examining at most
    /// `examine` keys (the Dapr query API pages over these).
    pub async fn keys_with_prefix(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        examine: usize,
    ) -> Result<crate::storage::KeyPage, EngineError> {
        let now = self.0.hlc.wall_ms();
        let keep = |k: &[u8]| k.starts_with(prefix);
        Ok(self.0.store.backend().scan(after, examine.max(1), now, &keep).await?)
    }

    pub(super) async fn scan(&self, c: Scan) -> Result<Response, EngineError> {
        let pattern = std::str::from_utf8(&c.pattern).map_err(|_| EngineError::Syntax)?;
        let pattern = glob::Pattern::new(pattern).map_err(|_| EngineError::Syntax)?;
        let after = match &c.token {
            Some(t) => Some(decode_token(t)?),
            None => None,
        };
        let now = self.0.hlc.wall_ms();
        let keep = |k: &[u8]| {
            let matches = match std::str::from_utf8(k) {
                Ok(s) => pattern.matches(s),
                Err(_) => pattern.matches(&String::from_utf8_lossy(k)),
            };
            matches && c.filter.as_ref().is_none_or(|f| f.keeps(k))
        };
        let page = self
            .0
            .store
            .backend()
            .scan(after.as_deref(), self.0.limits.scan_page.max(1), now, &keep)
            .await?;
        let token = page.resume_after.map(|k| encode_token(&k));
        Ok(Response::new(Reply::Keys { keys: page.keys, token }, None))
    }
}

/// SCAN continuation tokens: upper-case hex of the last key examined. Opaque to clients.
fn encode_token(key: &[u8]) -> Bytes {
    Bytes::from(hex::encode_upper(key))
}

fn decode_token(token: &[u8]) -> Result<Vec<u8>, EngineError> {
    match hex::decode(token) {
        Ok(key) if !key.is_empty() => Ok(key),
        _ => Err(EngineError::Syntax),
    }
}

/// What a reader is told of a record.
pub(super) fn entry_of(r: Record) -> Entry {
    Entry {
        value: r.value,
        version: r.version,
        expires_at_ms: r.expires_at_ms,
        fencing: r.fencing,
    }
}
