//! Named stores (state, lock, configuration) and how each maps Dapr keys to engine keys.

use bytes::Bytes;

use super::*;

/// How a store maps Dapr keys to engine keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPrefix {
    /// The key as given (shared with MQTT clients).
    None,
    /// `<store name>||key`.
    Name,
    /// `<literal>||key`.
    Literal(String),
    /// Keys arrive already prefixed (daprd applies its own `appid||` prefix before calling a
    /// pluggable component), so `||` is allowed and nothing is added.
    Raw,
}

/// One named store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSpec {
    pub name: String,
    pub prefix: KeyPrefix,
}

impl std::str::FromStr for StoreSpec {
    type Err = String;

    /// `name` or `name=none|name|<literal prefix>`.
    fn from_str(s: &str) -> Result<StoreSpec, String> {
        let (name, prefix) = match s.split_once('=') {
            None => (s, KeyPrefix::None),
            Some((n, "none")) => (n, KeyPrefix::None),
            Some((n, "name")) => (n, KeyPrefix::Name),
            Some((n, lit)) if !lit.is_empty() && !lit.contains(PREFIX_SEPARATOR) => {
                (n, KeyPrefix::Literal(lit.to_owned()))
            }
            Some(_) => {
                return Err(format!(
                    "store {s:?}: prefix must be none, name or a literal without ||"
                ));
            }
        };
        if name.is_empty() || name.contains('/') {
            return Err(format!("store {s:?}: the name must be non-empty and have no '/'"));
        }
        Ok(StoreSpec {
            name: name.to_owned(),
            prefix,
        })
    }
}

/// The configured stores.
#[derive(Debug, Clone)]
pub struct Stores(Vec<StoreSpec>);

impl Default for Stores {
    fn default() -> Stores {
        Stores(vec![StoreSpec {
            name: "statestore".into(),
            prefix: KeyPrefix::None,
        }])
    }
}

impl Stores {
    pub fn new(specs: Vec<StoreSpec>) -> Stores {
        Stores(specs)
    }

    /// One store without a key prefix.
    pub fn named(name: &str) -> Stores {
        Stores(vec![StoreSpec {
            name: name.to_owned(),
            prefix: KeyPrefix::None,
        }])
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|s| s.name.as_str())
    }

    /// A state store by name.
    pub fn get(&self, name: &str) -> Result<&StoreSpec, DaprError> {
        self.get_kind(name, "state")
    }

    /// A store of building block `kind` (`lock`, `configuration`, ...) by name.
    pub fn get_kind(&self, name: &str, kind: &'static str) -> Result<&StoreSpec, DaprError> {
        self.0
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| DaprError::StoreNotFound {
                kind,
                name: name.to_owned(),
            })
    }
}

impl StoreSpec {
    /// The store the pluggable component API serves: keys as daprd sends them.
    pub fn raw(name: &str) -> StoreSpec {
        StoreSpec {
            name: name.to_owned(),
            prefix: KeyPrefix::Raw,
        }
    }

    fn prefix_str(&self) -> Option<String> {
        match &self.prefix {
            KeyPrefix::None | KeyPrefix::Raw => None,
            KeyPrefix::Name => Some(format!("{}{PREFIX_SEPARATOR}", self.name)),
            KeyPrefix::Literal(l) => Some(format!("{l}{PREFIX_SEPARATOR}")),
        }
    }

    /// The engine key for a Dapr key. Empty keys and keys containing `||` are malformed.
    pub fn engine_key(&self, key: &str) -> Result<Bytes, DaprError> {
        if key.is_empty() {
            return Err(DaprError::Malformed("the key is missing or empty".into()));
        }
        if self.prefix != KeyPrefix::Raw && key.contains(PREFIX_SEPARATOR) {
            return Err(DaprError::Malformed(format!(
                "input key/keyPrefix '{key}' can't contain '||'"
            )));
        }
        Ok(match self.prefix_str() {
            None => Bytes::copy_from_slice(key.as_bytes()),
            Some(p) => Bytes::from(format!("{p}{key}")),
        })
    }

    /// The engine-key prefix of every key of this store (empty for `none`).
    pub fn key_prefix(&self) -> Vec<u8> {
        self.prefix_str().map(String::into_bytes).unwrap_or_default()
    }

    /// Whether an engine key belongs to this store: a store without a prefix does not see the
    /// keys of prefixed stores (they contain `||`, which it cannot address).
    pub fn owns(&self, engine_key: &[u8]) -> bool {
        match &self.prefix {
            KeyPrefix::Raw => true,
            KeyPrefix::None => !engine_key.windows(2).any(|w| w == PREFIX_SEPARATOR.as_bytes()),
            KeyPrefix::Name | KeyPrefix::Literal(_) => engine_key.starts_with(&self.key_prefix()),
        }
    }

    /// The Dapr key of an engine key of this store (lossy for non-UTF-8 keys).
    pub fn dapr_key(&self, engine_key: &[u8]) -> String {
        let p = self.key_prefix();
        String::from_utf8_lossy(engine_key.strip_prefix(&p[..]).unwrap_or(engine_key)).into_owned()
    }

    /// A watch of this store's keys: `keys` (engine keys) and keys whose Dapr name matches one
    /// of `patterns`; every key of the store when both are empty.
    pub fn watch(&self, keys: Vec<Bytes>, patterns: &[String]) -> Result<WatchSpec, DaprError> {
        let selector = Selector::new(keys, patterns).map_err(DaprError::Malformed)?;
        let only = selector.only_keys();
        let store = self.clone();
        Ok(WatchSpec {
            wanted: KeyFilter::new(move |k| store.owns(k) && selector.wants(k, || store.dapr_key(k).into())),
            prefix: Bytes::from(self.key_prefix()),
            only,
        })
    }
}

/// What the Dapr APIs of every door share: the stores, who may do what, the limits of a
/// request, the live configuration subscriptions.
#[derive(Debug, Clone)]
pub struct DaprSettings {
    pub stores: Stores,
    /// Dapr lock stores (`/v1.0-alpha1/lock/{store}`, gRPC TryLockAlpha1).
    pub lock_stores: Stores,
    /// Dapr configuration stores (`/v1.0/configuration/{store}`, gRPC GetConfiguration).
    pub configuration_stores: Stores,
    /// Who may do what: tokens, rules, limits (`lib::start` loads it).
    pub access: crate::access::Access,
    /// Most operations in one transaction.
    pub max_transaction_ops: usize,
    /// Most keys in one bulk get or configuration get.
    pub max_bulk_keys: usize,
    /// Longest an election campaign waits for the lease, whatever the client asked for
    /// ([`super::election::campaign`] caps it, for every door).
    pub max_campaign_wait: std::time::Duration,
    /// The id reported by the metadata APIs.
    pub app_id: String,
    /// Live configuration subscriptions: clones share it, so the HTTP and gRPC doors end each
    /// other's subscriptions by id.
    pub subscriptions: std::sync::Arc<super::configuration::Subscriptions>,
}

impl Default for DaprSettings {
    fn default() -> DaprSettings {
        DaprSettings {
            stores: Stores::default(),
            lock_stores: Stores::named("lockstore"),
            configuration_stores: Stores::named("configstore"),
            access: crate::access::Access::open(),
            max_transaction_ops: 100_000,
            max_bulk_keys: 10_000,
            max_campaign_wait: super::election::DEFAULT_MAX_CAMPAIGN_WAIT,
            app_id: "stategate".into(),
            subscriptions: std::sync::Arc::default(),
        }
    }
}
