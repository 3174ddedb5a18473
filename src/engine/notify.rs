//! Change notifications: the in-process change feed every front end subscribes to, and the
//! registry of KEYNOTIFY observers (MQTT client ids per key).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::{Duration, Instant};

use crate::hlc::Hlc;

/// One applied change, in the order the engine applied changes to that key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: Bytes,
    /// The key's new version (for a delete: the version issued for the deletion).
    pub version: Hlc,
    pub kind: ChangeKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// A SET was applied; the new value.
    Set(Bytes),
    /// DEL or VDEL deleted the key.
    Delete,
    /// The key's deadline passed and it was removed.
    Expire,
}

/// A change to a key that KEYNOTIFY observers registered for, with who they are.
#[derive(Debug, Clone)]
pub struct KeyNotification {
    pub change: Change,
    pub observers: Vec<Arc<str>>,
}

/// Limits on KEYNOTIFY registrations.
#[derive(Debug, Clone)]
pub struct ObserverLimits {
    /// Most keys one client may observe.
    pub per_client: usize,
    /// A client that sent no request for this long loses its registrations (`None`: never).
    pub idle: Option<Duration>,
}

/// Who observes which key. Registrations belong to a client session and never touch storage.
#[derive(Debug, Default)]
pub(crate) struct Observers {
    by_client: HashMap<Arc<str>, Client>,
    by_key: HashMap<Bytes, HashSet<Arc<str>>>,
}

#[derive(Debug)]
struct Client {
    keys: HashSet<Bytes>,
    last_seen: Instant,
}

impl Observers {
    /// Registers; `false` when the client is at its cap (and the key is new to it).
    pub(crate) fn register(&mut self, client: &str, key: Bytes, cap: usize) -> bool {
        let now = Instant::now();
        let id: Arc<str> = match self.by_client.get_key_value(client) {
            Some((id, _)) => id.clone(),
            None => Arc::from(client),
        };
        let entry = self.by_client.entry(id.clone()).or_insert_with(|| Client {
            keys: HashSet::new(),
            last_seen: now,
        });
        entry.last_seen = now;
        if entry.keys.contains(&key) {
            return true;
        }
        if entry.keys.len() >= cap {
            return false;
        }
        entry.keys.insert(key.clone());
        self.by_key.entry(key).or_default().insert(id);
        true
    }

    /// Unregisters; `false` when it was not registered.
    pub(crate) fn unregister(&mut self, client: &str, key: &[u8]) -> bool {
        let Some(c) = self.by_client.get_mut(client) else {
            return false;
        };
        c.last_seen = Instant::now();
        if !c.keys.remove(key) {
            return false;
        }
        if c.keys.is_empty() {
            self.by_client.remove(client);
        }
        if let Some(set) = self.by_key.get_mut(key) {
            set.remove(client);
            if set.is_empty() {
                self.by_key.remove(key);
            }
        }
        true
    }

    pub(crate) fn of_key(&self, key: &[u8]) -> Vec<Arc<str>> {
        self.by_key
            .get(key)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn touch(&mut self, client: &str) {
        if let Some(c) = self.by_client.get_mut(client) {
            c.last_seen = Instant::now();
        }
    }

    /// Drops every registration of `client`; returns how many there were.
    pub(crate) fn drop_client(&mut self, client: &str) -> usize {
        let Some(c) = self.by_client.remove(client) else {
            return 0;
        };
        for key in &c.keys {
            if let Some(set) = self.by_key.get_mut(key) {
                set.remove(client);
                if set.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        c.keys.len()
    }

    /// Drops clients idle for longer than `idle`; returns how many clients were dropped.
    pub(crate) fn sweep_idle(&mut self, idle: Duration) -> usize {
        let now = Instant::now();
        let stale: Vec<Arc<str>> = self
            .by_client
            .iter()
            .filter(|(_, c)| now.duration_since(c.last_seen) > idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &stale {
            self.drop_client(id);
        }
        stale.len()
    }

    pub(crate) fn client_count(&self) -> usize {
        self.by_client.len()
    }

    /// Number of keys with at least one observer.
    pub(crate) fn key_count(&self) -> usize {
        self.by_key.len()
    }
}
