//! Dapr state API semantics shared by the HTTP and gRPC doors: named stores and their key
//! prefixes, ETags (HLC versions), request metadata (TTL, fencing), concurrency modes, value
//! encoding in JSON, and the query language. Wire formats stay in the doors; the state store
//! rules stay in the engine.

use stategate_access as access;
use stategate_engine as engine;
use stategate_hlc as hlc;
#[cfg(test)]
use stategate_storage as storage;

use std::collections::HashMap;

use bytes::Bytes;

use crate::access::{Grant, Op, Pages};
use crate::engine::watch::{Selector, WatchSpec};
use crate::engine::{Del, DelCondition, Engine, EngineError, Entry, KeyFilter, Reply, Set, SetCondition, TxOp};
use crate::hlc::Hlc;

pub mod configuration;
pub mod election;
mod json;
pub mod lock;
pub mod query;
mod stores;

pub use json::{
    base64_json, check_decodes, check_request_metadata, compact_json, content_type_of, decode_value, is_json,
    stored_value, value_to_json,
};
pub use stores::{DaprSettings, KeyPrefix, StoreSpec, Stores};

/// The separator Dapr puts between a key prefix and a key.
pub const PREFIX_SEPARATOR: &str = "||";
/// Store features advertised in metadata and by the component API.
pub const FEATURES: [&str; 4] = ["ETAG", "TRANSACTIONAL", "TTL", "QUERY_API"];
/// Item metadata naming how a non-JSON value is encoded inside a JSON document.
pub const ENCODING_METADATA: &str = "contentEncoding";

/// What went wrong with a Dapr request. Each door maps it (with the operation) to its codes.
#[derive(Debug, thiserror::Error)]
pub enum DaprError {
    /// `kind`: the building block (`state`, `lock`, `configuration`).
    #[error("{kind} store {name} is not found")]
    StoreNotFound { kind: &'static str, name: String },
    #[error("{0}")]
    Malformed(String),
    #[error("invalid etag value: {0}")]
    InvalidEtag(String),
    #[error("possible etag mismatch. error from state store: {0}")]
    EtagMismatch(String),
    #[error("unsupported operation: {0}")]
    UnsupportedOperation(String),
    #[error("the number of operations ({got}) exceeds the maximum of {max}")]
    TooManyOperations { got: usize, max: usize },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// `concurrency` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    FirstWrite,
    #[default]
    LastWrite,
}

impl Concurrency {
    /// Parses Dapr's option strings (an empty string is the default).
    pub fn parse(s: Option<&str>) -> Result<Concurrency, DaprError> {
        match s.unwrap_or("") {
            "" | "last-write" => Ok(Concurrency::LastWrite),
            "first-write" => Ok(Concurrency::FirstWrite),
            other => Err(DaprError::Malformed(format!("unknown concurrency value {other:?}"))),
        }
    }
}

/// The `StateConcurrency` enum of Dapr's protos (runtime and component copies share the
/// numbers) as the option string the Dapr layer takes.
pub fn concurrency_from_proto(v: i32) -> Result<Option<String>, DaprError> {
    match v {
        0 => Ok(None),
        1 => Ok(Some("first-write".into())),
        2 => Ok(Some("last-write".into())),
        other => Err(DaprError::Malformed(format!("unknown concurrency {other}"))),
    }
}

/// The `StateConsistency` enum of Dapr's protos as the option string the Dapr layer takes.
pub fn consistency_from_proto(v: i32) -> Result<Option<String>, DaprError> {
    match v {
        0 => Ok(None),
        1 => Ok(Some("eventual".into())),
        2 => Ok(Some("strong".into())),
        other => Err(DaprError::Malformed(format!("unknown consistency {other}"))),
    }
}

/// Both option enums of Dapr's protos as the option strings the Dapr layer takes.
pub fn options_from_proto(concurrency: i32, consistency: i32) -> Result<(Option<String>, Option<String>), DaprError> {
    Ok((
        concurrency_from_proto(concurrency)?,
        consistency_from_proto(consistency)?,
    ))
}

/// Response metadata of a read: `ttlExpireTime` when the key has a deadline.
pub fn ttl_metadata(expires_at_ms: Option<u64>) -> HashMap<String, String> {
    expires_at_ms
        .map(|ms| HashMap::from([("ttlExpireTime".to_owned(), rfc3339(ms))]))
        .unwrap_or_default()
}

/// Adds request-level metadata (the `metadata.<name>` query string, a transaction's metadata)
/// to an item's own. The request's entries win, as daprd merges URL metadata into a request;
/// every door merges this way.
pub fn merge_request_metadata(item: &mut HashMap<String, String>, request: &HashMap<String, String>) {
    for (k, v) in request {
        item.insert(k.clone(), v.clone());
    }
}

/// One key of a bulk get, in request order.
#[derive(Debug, Clone)]
pub struct BulkEntry {
    pub key: String,
    pub entry: Option<Entry>,
    /// Why the key was not read (the caller may not read it); `entry` is then `None`.
    pub error: Option<String>,
}

/// The per-item error of a bulk get for a key the caller may not read.
pub const BULK_DENIED: &str = "permission denied";

/// Bulk get, one policy for every door (as daprd answers): more than `max_keys` keys, or any
/// key that is not valid, fails the whole request before anything is read; a storage failure
/// fails it too; a missing key is an entry without a value, and a key the caller may not read
/// an entry with an error (the caller named it: nothing leaks).
pub async fn bulk_get(
    engine: &Engine,
    grant: &Grant,
    store: &StoreSpec,
    keys: Vec<String>,
    max_keys: usize,
) -> Result<Vec<BulkEntry>, DaprError> {
    if keys.len() > max_keys {
        return Err(DaprError::Malformed(format!(
            "a bulk get may name at most {max_keys} keys"
        )));
    }
    let engine_keys = keys
        .iter()
        .map(|k| store.engine_key(k))
        .collect::<Result<Vec<_>, _>>()?;
    // The keys the caller may read, read together: one snapshot, so that a bulk get never
    // shows half of a transaction (read one by one, it did: the fault test bed's x + y = 100).
    let allowed: Vec<bool> = engine_keys.iter().map(|k| grant.may(Op::Read, k)).collect();
    let readable: Vec<_> = engine_keys
        .iter()
        .zip(&allowed)
        .filter(|(_, ok)| **ok)
        .map(|(k, _)| k.clone())
        .collect();
    let mut entries = engine.read_many(&readable).await?.into_iter();
    let mut out = Vec::with_capacity(keys.len());
    for (key, ok) in keys.into_iter().zip(allowed) {
        out.push(if ok {
            BulkEntry {
                key,
                entry: entries.next().flatten(),
                error: None,
            }
        } else {
            BulkEntry {
                key,
                entry: None,
                error: Some(BULK_DENIED.into()),
            }
        });
    }
    Ok(out)
}

/// What a store reports about itself (HTTP `/v1.0/metadata`, gRPC `GetMetadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentInfo {
    pub name: String,
    pub kind: &'static str,
    pub version: &'static str,
    pub capabilities: Vec<String>,
}

/// The configured stores as the metadata answers list them: state stores (with their
/// features), then lock stores, then configuration stores.
pub fn components(state: &Stores, locks: &Stores, configuration: &Stores) -> Vec<ComponentInfo> {
    let of = |stores: &Stores, kind: &'static str, features: &[&str]| -> Vec<ComponentInfo> {
        stores
            .names()
            .map(|name| ComponentInfo {
                name: name.to_owned(),
                kind,
                version: "v1",
                capabilities: features.iter().map(|f| f.to_string()).collect(),
            })
            .collect()
    };
    let mut all = of(state, "state.stategate", &FEATURES);
    all.extend(of(locks, "lock.stategate", &[]));
    all.extend(of(configuration, "configuration.stategate", &[]));
    all
}

/// Saves every item (each its own atomic write; good items land even when another fails) and
/// returns the first failure. As daprd does, what makes the request itself malformed (a key
/// that is empty or has `||`, a value that cannot be decoded) fails it before anything is
/// written; the rest (ETags, options, metadata, the rules) is decided item by item.
pub async fn save_each(engine: &Engine, grant: &Grant, store: &StoreSpec, items: &[SaveItem]) -> Result<(), DaprError> {
    for item in items {
        store.engine_key(&item.key)?;
        decode_value(&item.value, &item.metadata)?;
    }
    let mut first = None;
    for item in items {
        if let Err(e) = save(engine, grant, store, item).await {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Deletes every item, like [`save_each`] (keys are checked before anything is deleted).
pub async fn delete_each(
    engine: &Engine,
    grant: &Grant,
    store: &StoreSpec,
    items: &[DeleteItem],
) -> Result<(), DaprError> {
    for item in items {
        store.engine_key(&item.key)?;
    }
    let mut first = None;
    for item in items {
        if let Err(e) = delete(engine, grant, store, item).await {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Checks a `consistency` option (both values behave the same here: writes are linearizable).
pub fn check_consistency(s: Option<&str>) -> Result<(), DaprError> {
    match s.unwrap_or("") {
        "" | "eventual" | "strong" => Ok(()),
        other => Err(DaprError::Malformed(format!("unknown consistency value {other:?}"))),
    }
}

/// An ETag: the HLC version string. Empty means "no ETag".
pub fn parse_etag(etag: Option<&str>) -> Result<Option<Hlc>, DaprError> {
    match etag {
        None | Some("") => Ok(None),
        Some(e) => {
            let e = e.trim_matches('"');
            e.parse::<Hlc>()
                .map(Some)
                .map_err(|_| DaprError::InvalidEtag(e.to_owned()))
        }
    }
}

/// Request metadata that changes a write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteMeta {
    /// `ttlInSeconds`: `None` or `-1` = no expiry.
    pub ttl_ms: Option<u64>,
    /// `fencingToken`: an HLC, required on keys protected by one.
    pub fencing: Option<Hlc>,
    /// `ttlSliding: true` (a stategate extension): every read pushes the deadline out by the
    /// TTL again. Needs `ttlInSeconds`.
    pub sliding: bool,
}

impl WriteMeta {
    pub fn parse(meta: &HashMap<String, String>) -> Result<WriteMeta, DaprError> {
        // Only the syntax is decided here; whether the TTL is in range is the engine's rule.
        let ttl_ms = match meta.get("ttlInSeconds").map(|s| s.trim()) {
            None | Some("") => None,
            Some(s) => match s.parse::<i64>() {
                Ok(-1) => None,
                Ok(n) if n >= 0 => Some((n as u64).saturating_mul(1000)),
                _ => {
                    return Err(DaprError::Malformed(format!(
                        "incorrect value for metadata 'ttlInSeconds': {s:?} (whole seconds, or -1 for none)"
                    )));
                }
            },
        };
        let fencing = match meta.get("fencingToken") {
            None => None,
            Some(s) => Some(
                s.parse::<Hlc>()
                    .map_err(|_| DaprError::Malformed(format!("metadata 'fencingToken' {s:?} is not a version")))?,
            ),
        };
        let sliding = match meta.get("ttlSliding").map(|s| s.trim()) {
            None | Some("") => false,
            Some(s) if s.eq_ignore_ascii_case("true") => true,
            Some(s) if s.eq_ignore_ascii_case("false") => false,
            Some(s) => {
                return Err(DaprError::Malformed(format!(
                    "incorrect value for metadata 'ttlSliding': {s:?} (true or false)"
                )));
            }
        };
        if sliding && ttl_ms.is_none() {
            return Err(DaprError::Malformed(
                "metadata 'ttlSliding' needs 'ttlInSeconds' (the time to live that slides)".into(),
            ));
        }
        Ok(WriteMeta {
            ttl_ms,
            fencing,
            sliding,
        })
    }
}

/// A save as the Dapr APIs describe it.
#[derive(Debug, Clone)]
pub struct SaveItem {
    pub key: String,
    pub value: Bytes,
    pub etag: Option<String>,
    pub metadata: HashMap<String, String>,
    pub concurrency: Option<String>,
    pub consistency: Option<String>,
}

/// A delete as the Dapr APIs describe it.
#[derive(Debug, Clone)]
pub struct DeleteItem {
    pub key: String,
    pub etag: Option<String>,
    pub metadata: HashMap<String, String>,
    pub concurrency: Option<String>,
    pub consistency: Option<String>,
}

/// A transaction operation.
#[derive(Debug, Clone)]
pub enum TxItem {
    Upsert(SaveItem),
    Delete(DeleteItem),
}

impl SaveItem {
    fn command(&self, store: &StoreSpec) -> Result<Set, DaprError> {
        let key = store.engine_key(&self.key)?;
        let meta = WriteMeta::parse(&self.metadata)?;
        check_consistency(self.consistency.as_deref())?;
        let concurrency = Concurrency::parse(self.concurrency.as_deref())?;
        let condition = match (parse_etag(self.etag.as_deref())?, concurrency) {
            (Some(v), _) => SetCondition::IfVersion(v),
            (None, Concurrency::FirstWrite) => SetCondition::IfAbsent,
            (None, Concurrency::LastWrite) => SetCondition::Always,
        };
        Ok(Set {
            key,
            value: decode_value(&self.value, &self.metadata)?,
            condition,
            ttl_ms: meta.ttl_ms,
            timestamp: None,
            fencing: meta.fencing,
            // Dapr asks for no persistence per request: the store's configuration decides.
            persist: false,
            sliding: meta.sliding,
        })
    }
}

impl DeleteItem {
    fn command(&self, store: &StoreSpec) -> Result<Del, DaprError> {
        let key = store.engine_key(&self.key)?;
        let meta = WriteMeta::parse(&self.metadata)?;
        check_consistency(self.consistency.as_deref())?;
        let concurrency = Concurrency::parse(self.concurrency.as_deref())?;
        let condition = match (parse_etag(self.etag.as_deref())?, concurrency) {
            (Some(v), _) => DelCondition::IfVersion(v),
            // First-write without an ETag may only "delete" an absent key (a no-op).
            (None, Concurrency::FirstWrite) => DelCondition::IfAbsent,
            (None, Concurrency::LastWrite) => DelCondition::Always,
        };
        Ok(Del {
            key,
            fencing: meta.fencing,
            condition,
        })
    }
}

fn mismatch(e: EngineError) -> DaprError {
    match e {
        EngineError::VersionMismatch => DaprError::EtagMismatch("the etag does not match the stored version".into()),
        other => DaprError::Engine(other),
    }
}

/// Saves one item; returns the new version.
pub async fn save(engine: &Engine, grant: &Grant, store: &StoreSpec, item: &SaveItem) -> Result<Hlc, DaprError> {
    let cmd = item.command(store)?;
    let first_write = cmd.condition == SetCondition::IfAbsent;
    let resp = access::execute(engine, grant, crate::engine::Command::Set(cmd))
        .await
        .map_err(mismatch)?;
    match (resp.reply, resp.version) {
        (Reply::Ok, Some(v)) => Ok(v),
        _ if first_write => Err(DaprError::EtagMismatch(
            "first-write: the key already exists and no etag was given".into(),
        )),
        _ => Err(DaprError::EtagMismatch("the write was not applied".into())),
    }
}

/// Deletes one item; deleting a missing key without an ETag succeeds.
pub async fn delete(engine: &Engine, grant: &Grant, store: &StoreSpec, item: &DeleteItem) -> Result<(), DaprError> {
    let cmd = item.command(store)?;
    let first_write = cmd.condition == DelCondition::IfAbsent;
    access::execute(engine, grant, crate::engine::Command::Del(cmd))
        .await
        .map_err(|e| match e {
            EngineError::VersionMismatch if first_write => {
                DaprError::EtagMismatch("first-write: the key exists and no etag was given".into())
            }
            other => mismatch(other),
        })?;
    Ok(())
}

/// Reads one key of a store.
pub async fn get(engine: &Engine, grant: &Grant, store: &StoreSpec, key: &str) -> Result<Option<Entry>, DaprError> {
    let key = store.engine_key(key)?;
    grant.check(Op::Read, &key)?;
    Ok(engine.read(&key).await?)
}

/// Most keys one page of [`list_keys`] returns.
pub const MAX_LIST_LIMIT: usize = 1000;
/// Keys returned when the caller gives no limit.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// One page of a store's key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysPage {
    pub keys: Vec<String>,
    /// Where the next page starts; `None` on the last page.
    pub token: Option<String>,
}

/// Lists the keys of a store in key order, those whose Dapr key matches `pattern` (the glob
/// rules of SCAN; all keys when `None`), at most `limit` of them. Like SCAN, one call examines a
/// bounded number of keys (`examine`), so a rare match may give a short (even empty) page with a
/// token: callers follow tokens until there is none. Only keys the caller may read are listed,
/// and a token never names a key the caller may not read (it is sealed then).
pub async fn list_keys(
    engine: &Engine,
    grant: &Grant,
    store: &StoreSpec,
    pattern: Option<&str>,
    limit: Option<usize>,
    token: Option<&str>,
    examine: usize,
) -> Result<KeysPage, DaprError> {
    let limit = limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if limit == 0 || limit > MAX_LIST_LIMIT {
        return Err(DaprError::Malformed(format!(
            "limit must be from 1 to {MAX_LIST_LIMIT}"
        )));
    }
    let pattern = pattern
        .map(|p| glob::Pattern::new(p).map_err(|e| DaprError::Malformed(format!("pattern {p:?}: {e}"))))
        .transpose()?;
    let prefix = store.key_prefix();
    let readable = grant.read_filter();
    let mut after = match token {
        Some(t) => {
            let key = grant
                .open_position(t.as_bytes(), Pages::Keys { store: &store.name })
                .filter(|k| k.starts_with(&prefix) && k.len() > prefix.len())
                .ok_or_else(|| DaprError::Malformed(format!("invalid token {t:?}")))?;
            Some(Bytes::from(key))
        }
        // A prefixed store's keys all sort after the bare prefix, which is never one of its keys.
        None => (!prefix.is_empty()).then(|| Bytes::from(prefix.clone())),
    };
    let mut keys = Vec::new();
    let mut budget = examine.max(limit);
    while keys.len() < limit && budget > 0 {
        let step = budget.min(limit - keys.len()).max(64).min(budget);
        let page = engine.keys_with_prefix(&prefix, after.as_deref(), step).await?;
        budget -= step;
        for key in page.keys {
            if !store.owns(&key) {
                continue;
            }
            let name = store.dapr_key(&key);
            let shown = readable.as_ref().is_none_or(|f| f.keeps(&key));
            if shown && pattern.as_ref().is_none_or(|p| p.matches(&name)) {
                keys.push(name);
            }
            after = Some(key);
            if keys.len() == limit {
                break;
            }
        }
        match page.resume_after {
            // Past the store's range: nothing more to find.
            Some(r) if !r.starts_with(&prefix) => return Ok(KeysPage { keys, token: None }),
            Some(r) if keys.len() < limit => after = Some(r),
            Some(_) => {}
            None if keys.len() < limit => return Ok(KeysPage { keys, token: None }),
            None => {}
        }
    }
    let token = after.map(|k| grant.position_token(readable.as_ref(), &k, Pages::Keys { store: &store.name }));
    Ok(KeysPage { keys, token })
}

/// Runs a transaction: all operations in order, or none.
/// Every key must be writable by the caller, or nothing is done.
pub async fn transact(
    engine: &Engine,
    grant: &Grant,
    store: &StoreSpec,
    items: &[TxItem],
    max_ops: usize,
) -> Result<(), DaprError> {
    if items.len() > max_ops {
        return Err(DaprError::TooManyOperations {
            got: items.len(),
            max: max_ops,
        });
    }
    let mut ops = Vec::with_capacity(items.len());
    for item in items {
        ops.push(match item {
            TxItem::Upsert(s) => TxOp::Set(s.command(store)?),
            TxItem::Delete(d) => TxOp::Del(d.command(store)?),
        });
    }
    grant.check_all(
        Op::Write,
        ops.iter().map(|op| match op {
            TxOp::Set(s) => &s.key[..],
            TxOp::Del(d) => &d.key[..],
        }),
    )?;
    engine.transact(ops).await.map_err(mismatch)?;
    Ok(())
}

/// RFC 3339 (UTC) of a deadline in ms since the epoch, for `ttlExpireTime`.
pub fn rfc3339(ms: u64) -> String {
    // humantime formats years up to 9999 only; later deadlines read as the last second of 9999.
    const MAX_MS: u64 = 253_402_300_799_000;
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.min(MAX_MS));
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests;
