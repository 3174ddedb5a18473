//! The Dapr configuration API over a store's keys, for the HTTP and gRPC doors: get (named keys,
//! or every key of the store up to a bound), subscribe (the engine's watch of those keys) and
//! unsubscribe (by the id the subscription's first message carries).
//!
//! An item's `value` is the stored bytes as text (a value stored as JSON over HTTP keeps its
//! quotes, as the state API stores it); bytes that are not UTF-8 are base64 with item metadata
//! `contentEncoding: base64`. `version` is the key's HLC version. A deleted key comes as an item
//! with an empty value, the deletion's version and metadata `deleted: true` (plus `expired:
//! true` when its deadline passed), so a subscriber learns of deletes and expiries too.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use tokio::sync::Notify;

use super::{DaprError, ENCODING_METADATA, MAX_LIST_LIMIT, StoreSpec, list_keys, ttl_metadata};
use crate::access::{Grant, Op, Principal};
use crate::engine::{Change, ChangeKind, Engine, Entry};
use crate::hlc::Hlc;

/// One configuration item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigItem {
    pub value: String,
    pub version: String,
    pub metadata: HashMap<String, String>,
}

fn item(value: &[u8], version: &Hlc, mut metadata: HashMap<String, String>) -> ConfigItem {
    let value = match std::str::from_utf8(value) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            metadata.insert(ENCODING_METADATA.into(), "base64".into());
            base64::engine::general_purpose::STANDARD.encode(value)
        }
    };
    ConfigItem {
        value,
        version: version.to_string(),
        metadata,
    }
}

/// A key's current value as an item (`ttlExpireTime` in metadata when it has a deadline).
pub fn item_of_entry(entry: &Entry) -> ConfigItem {
    item(&entry.value, &entry.version, ttl_metadata(entry.expires_at_ms))
}

/// A change as an item: the new value, or a deletion.
pub fn item_of_change(change: &Change) -> ConfigItem {
    let deleted = |expired: bool| {
        let mut metadata = HashMap::from([("deleted".to_owned(), "true".to_owned())]);
        if expired {
            metadata.insert("expired".into(), "true".into());
        }
        ConfigItem {
            value: String::new(),
            version: change.version.to_string(),
            metadata,
        }
    };
    match &change.kind {
        ChangeKind::Set(v) => item(v, &change.version, HashMap::new()),
        ChangeKind::Delete => deleted(false),
        ChangeKind::Expire => deleted(true),
    }
}

/// The items of `keys` (missing keys are left out), or of every key of the store the caller may
/// read when `keys` is empty. More than `max_keys` keys, named or in the store, is refused
/// before any value is read; so is any key that is not valid, and a named key the caller may
/// not read (a configuration item has no per-item error; the caller named it, nothing leaks).
pub async fn get(
    engine: &Engine,
    grant: &Grant,
    store: &StoreSpec,
    keys: Vec<String>,
    max_keys: usize,
    examine: usize,
) -> Result<Vec<(String, ConfigItem)>, DaprError> {
    let named = !keys.is_empty();
    let keys = if named {
        if keys.len() > max_keys {
            return Err(DaprError::Malformed(format!(
                "a configuration get may name at most {max_keys} keys"
            )));
        }
        keys
    } else {
        all_keys(engine, grant, store, max_keys, examine).await?
    };
    let engine_keys = keys
        .iter()
        .map(|k| store.engine_key(k))
        .collect::<Result<Vec<_>, _>>()?;
    if named {
        grant.check_all(Op::Read, engine_keys.iter().map(|k| &k[..]))?;
    }
    let mut out = Vec::with_capacity(keys.len());
    for (key, engine_key) in keys.into_iter().zip(engine_keys) {
        if let Some(entry) = engine.read(&engine_key).await? {
            out.push((key, item_of_entry(&entry)));
        }
    }
    Ok(out)
}

/// How many keys a configuration get of every key may examine, per key it may return: a caller
/// who may read few keys of a large store is refused (name the keys) instead of walking it all.
pub const EXAMINED_PER_KEY: usize = 10;

/// Every key of the store, page by page, refusing once there are more than `max_keys`, or once
/// more than [`EXAMINED_PER_KEY`] x `max_keys` keys were examined.
async fn all_keys(
    engine: &Engine,
    grant: &Grant,
    store: &StoreSpec,
    max_keys: usize,
    examine: usize,
) -> Result<Vec<String>, DaprError> {
    let mut keys = Vec::new();
    let mut token: Option<String> = None;
    let most_examined = max_keys.saturating_mul(EXAMINED_PER_KEY);
    let per_page = examine.max(MAX_LIST_LIMIT);
    let mut examined = 0usize;
    loop {
        if examined >= most_examined {
            return Err(DaprError::Malformed(format!(
                "a configuration get of every key examines at most {most_examined} keys of the store {}: \
                 name the keys to get, or page through /v1.0-alpha1/state/{}/keys",
                store.name, store.name
            )));
        }
        examined = examined.saturating_add(per_page);
        let page = list_keys(
            engine,
            grant,
            store,
            None,
            Some(MAX_LIST_LIMIT),
            token.as_deref(),
            examine,
        )
        .await?;
        keys.extend(page.keys);
        if keys.len() > max_keys {
            return Err(DaprError::Malformed(format!(
                "the store {} has more than {max_keys} keys: name the keys to get, or page through \
                 /v1.0-alpha1/state/{}/keys",
                store.name, store.name
            )));
        }
        match page.token {
            Some(t) => token = Some(t),
            None => return Ok(keys),
        }
    }
}

/// The live configuration subscriptions, so Unsubscribe can end one by id. The HTTP and gRPC
/// doors share one registry.
#[derive(Debug, Default)]
pub struct Subscriptions {
    live: Mutex<HashMap<String, Live>>,
    opened: AtomicU64,
}

/// A live subscription: who opened it (only they may end it by id) and how to end it.
#[derive(Debug)]
struct Live {
    owner: Principal,
    stop: Arc<Notify>,
}

/// One subscription; dropping it (the stream ended) removes it from the registry.
#[derive(Debug)]
pub struct Subscription {
    id: String,
    stop: Arc<Notify>,
    registry: Arc<Subscriptions>,
}

impl Subscriptions {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a subscription under a new id (128 random-looking bits: ids are not guessable
    /// in practice, though the api token, not the id, is what protects them).
    pub fn open(self: &Arc<Subscriptions>, owner: &Principal) -> Subscription {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let a = std::collections::hash_map::RandomState::new().hash_one(n);
        let b = std::collections::hash_map::RandomState::new().hash_one(!n);
        let id = format!("{a:016x}{b:016x}");
        let stop = Arc::new(Notify::new());
        self.live().insert(
            id.clone(),
            Live {
                owner: owner.clone(),
                stop: stop.clone(),
            },
        );
        Subscription {
            id,
            stop,
            registry: self.clone(),
        }
    }

    /// Ends the subscription `id` if `caller` opened it; false when there is none (ended
    /// already, never existed, or someone else's: the same answer, so an id found elsewhere
    /// tells nothing and ends nothing).
    pub fn close(&self, id: &str, caller: &Principal) -> bool {
        let mut live = self.live();
        if live.get(id).is_none_or(|l| l.owner != *caller) {
            return false;
        }
        match live.remove(id) {
            Some(l) => {
                // A stored permit: the stream ends even if it is not waiting right now.
                l.stop.notify_one();
                true
            }
            None => false,
        }
    }

    /// Ends every subscription (the service is stopping); returns how many there were.
    pub fn close_all(&self) -> usize {
        let all: Vec<_> = self.live().drain().collect();
        for (_, l) in &all {
            l.stop.notify_one();
        }
        all.len()
    }

    /// Subscriptions open now.
    pub fn len(&self) -> usize {
        self.live().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Subscription {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Resolves once [`Subscriptions::close`] ended this subscription.
    pub async fn stopped(&self) {
        self.stop.notified().await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.registry.live().remove(&self.id);
    }
}

/// The keys a subscription names, as engine keys (none: every key of the store).
pub fn subscription_keys(store: &StoreSpec, keys: &[String]) -> Result<Vec<Bytes>, DaprError> {
    keys.iter().map(|k| store.engine_key(k)).collect()
}

#[cfg(test)]
mod tests;
