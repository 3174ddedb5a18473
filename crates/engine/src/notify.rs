//! Change notifications: the change type, the registry of KEYNOTIFY observers (MQTT client ids
//! per key) and the bounded queue of their notifications. The history every watcher reads is
//! in [`super::feed`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};

use crate::hlc::Hlc;

mod few;
use few::{Few, Removed};

/// One applied change, in the order the engine applied changes to that key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: Bytes,
    /// The key's new version (for a delete: the version issued for the deletion).
    pub version: Hlc,
    pub kind: ChangeKind,
}

impl Change {
    /// The change with its key and value in buffers of their own: what outlives the request
    /// (history, notification queues) must not pin the network buffer they were sliced from.
    pub fn detached(&self) -> Change {
        Change {
            key: Bytes::copy_from_slice(&self.key),
            version: self.version.clone(),
            kind: match &self.kind {
                ChangeKind::Set(v) => ChangeKind::Set(Bytes::copy_from_slice(v)),
                other => other.clone(),
            },
        }
    }
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

/// The observer id of the state topics mirror (`--state-topics`), which observes every key
/// without registering: its notifications travel the KEYNOTIFY queue (and, on shared storage,
/// the same owners and handover) as any observer's, and the MQTT door publishes them on the
/// mirror's topics instead. MQTT client ids are UTF-8 strings without U+0000, so no client
/// can register under this id.
pub const EVERY_KEY_OBSERVER: &str = "\u{0}state-topics";

/// Who sends the notifications of the observer of every key on replicas that share storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EveryKey {
    /// Every replica, each to its own embedded broker: only it reaches that broker's
    /// subscribers (what a home is to a KEYNOTIFY client), and each broker needs every change.
    EachReplica,
    /// One replica per change, the owner rendezvous hashing picks for the observer's id (a
    /// client behind a shared external broker), with the handover when a member dies.
    OneReplica,
}

/// A change to a key that KEYNOTIFY observers registered for, with who they are.
#[derive(Debug, Clone)]
pub struct KeyNotification {
    pub change: Change,
    pub observers: Vec<Arc<str>>,
    /// Replicas on shared storage: the log position at which this replica took the
    /// notification on (0 otherwise). Once the door has sent it, that position is recorded as
    /// sent (see [`KeyNotifyReceiver::recv`]).
    pub(crate) at: u64,
}

impl KeyNotification {
    /// Bytes this notification holds while it waits for the door.
    fn cost(&self) -> usize {
        let value = match &self.change.kind {
            ChangeKind::Set(v) => v.len(),
            ChangeKind::Delete | ChangeKind::Expire => 0,
        };
        128 + self.change.key.len() + value + self.observers.iter().map(|o| o.len() + 16).sum::<usize>()
    }
}

/// Limits on KEYNOTIFY registrations and on the notifications waiting to be sent.
#[derive(Debug, Clone)]
pub struct ObserverLimits {
    /// Most keys one client may observe.
    pub per_client: usize,
    /// Most registrations of all clients together.
    pub total: usize,
    /// A client that sent no request for this long loses its registrations (`None`: never).
    pub idle: Option<Duration>,
    /// Most notifications waiting for the MQTT door, and their bytes; past either, new ones
    /// are dropped, counted and logged.
    pub queue_len: usize,
    pub queue_bytes: usize,
}

impl Default for ObserverLimits {
    fn default() -> ObserverLimits {
        ObserverLimits {
            per_client: 10_000,
            total: 1_000_000,
            idle: None,
            queue_len: 65_536,
            queue_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegisterError {
    ClientFull,
    RegistryFull,
}

/// Who observes which key. Registrations belong to a client's session and never touch storage.
///
/// Sized for many clients with a key or a few each (a device, its KEYNOTIFY): a client's id
/// and a key are one allocation each, shared by both maps, and a set of one is inline (`Few`).
#[derive(Debug, Default)]
pub(crate) struct Observers {
    by_client: HashMap<Arc<str>, Client>,
    by_key: HashMap<Arc<[u8]>, Few<Arc<str>>>,
    /// Registrations of all clients.
    total: usize,
}

#[derive(Debug)]
struct Client {
    keys: Few<Arc<[u8]>>,
    last_seen: Instant,
    /// The broker session the registrations were made in, when the broker says (`None`: the
    /// caller could not tell, e.g. behind an external broker).
    session: Option<u64>,
}

impl Observers {
    /// Registers `client` (in broker session `session`, when known) for `key`.
    ///
    /// A registration from a newer session of the same client id first drops what the old
    /// session registered: MQTT gives one session per client id, and the old one is gone.
    pub(crate) fn register(
        &mut self,
        client: &str,
        session: Option<u64>,
        key: &[u8],
        limits: &ObserverLimits,
    ) -> Result<(), RegisterError> {
        let now = Instant::now();
        if let Some(c) = self.by_client.get(client)
            && session.is_some()
            && c.session != session
        {
            self.drop_client(client, None);
        }
        let keys_now = match self.by_client.get_mut(client) {
            Some(c) => {
                c.last_seen = now;
                if c.keys.contains(key) {
                    return Ok(());
                }
                c.keys.len()
            }
            None => 0,
        };
        if keys_now >= limits.per_client {
            return Err(RegisterError::ClientFull);
        }
        if self.total >= limits.total {
            return Err(RegisterError::RegistryFull);
        }
        // The key is shared with the other observers of it, else copied: the caller's may be a
        // slice of a network buffer, which must not stay pinned.
        let key: Arc<[u8]> = match self.by_key.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => Arc::from(key),
        };
        let id: Arc<str> = match self.by_client.get_key_value(client) {
            Some((id, _)) => id.clone(),
            None => Arc::from(client),
        };
        match self.by_client.get_mut(client) {
            Some(c) => {
                c.keys.insert(key.clone());
            }
            None => {
                let c = Client {
                    keys: Few::One(key.clone()),
                    last_seen: now,
                    session,
                };
                self.by_client.insert(id.clone(), c);
            }
        }
        match self.by_key.get_mut(&key) {
            Some(observers) => {
                observers.insert(id);
            }
            None => {
                self.by_key.insert(key, Few::One(id));
            }
        }
        self.total += 1;
        Ok(())
    }

    /// Unregisters; `false` when it was not registered.
    pub(crate) fn unregister(&mut self, client: &str, key: &[u8]) -> bool {
        let Some(c) = self.by_client.get_mut(client) else {
            return false;
        };
        c.last_seen = Instant::now();
        match c.keys.remove(key) {
            Removed::NotThere => return false,
            Removed::Left => {}
            Removed::Emptied => {
                self.by_client.remove(client);
            }
        }
        self.total -= 1;
        self.forget_observer(key, client);
        true
    }

    /// Takes `client` out of `key`'s observers, and the key out of the map with its last one.
    fn forget_observer(&mut self, key: &[u8], client: &str) {
        if let Some(set) = self.by_key.get_mut(key)
            && set.remove(client) == Removed::Emptied
        {
            self.by_key.remove(key);
        }
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

    /// Drops every registration of `client`; returns how many there were. With `session`, only
    /// if the registrations belong to that session: a disconnect reported late, after the
    /// same client id connected again and registered anew, must not erase the new ones.
    pub(crate) fn drop_client(&mut self, client: &str, session: Option<u64>) -> usize {
        match (self.by_client.get(client), session) {
            (None, _) => return 0,
            (Some(c), Some(s)) if c.session.is_some_and(|cs| cs != s) => return 0,
            _ => {}
        }
        let Some(c) = self.by_client.remove(client) else {
            return 0;
        };
        for key in c.keys.iter() {
            self.forget_observer(key, client);
        }
        self.total -= c.keys.len();
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
            self.drop_client(id, None);
        }
        stale.len()
    }

    /// How many keys `client` observes.
    pub(crate) fn keys_of(&self, client: &str) -> usize {
        self.by_client.get(client).map_or(0, |c| c.keys.len())
    }

    /// Every client with registrations, and how long ago it was last seen here.
    pub(crate) fn last_seen(&self) -> Vec<(Arc<str>, Duration)> {
        let now = Instant::now();
        self.by_client
            .iter()
            .map(|(id, c)| (id.clone(), now.duration_since(c.last_seen)))
            .collect()
    }

    pub(crate) fn client_count(&self) -> usize {
        self.by_client.len()
    }

    /// Number of keys with at least one observer.
    pub(crate) fn key_count(&self) -> usize {
        self.by_key.len()
    }

    /// Registrations of all clients.
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

/// The engine's end of the queue of KEYNOTIFY notifications: bounded by count and by bytes,
/// never waiting; what does not fit is dropped, counted and logged.
#[derive(Debug)]
pub(crate) struct KeyNotifySender {
    tx: mpsc::Sender<KeyNotification>,
    bytes: Arc<AtomicUsize>,
    max_bytes: usize,
    dropped: AtomicU64,
    marks: Arc<Marks>,
    /// The observer of every key, when the door mirrors state (and its id, shared by every
    /// notification instead of allocated per change).
    every_key: Option<(EveryKey, Arc<str>)>,
}

/// How far the queue got, by [`KeyNotification::at`]: the last position queued, and the last
/// one the door finished sending. Both only grow: positions are queued in order.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    queued: AtomicU64,
    sent: AtomicU64,
}

impl Marks {
    /// The position up to which every notification queued was sent, given `applied`, the
    /// last position whose notifications were all queued (read before calling): `applied`
    /// when nothing waits, else the last position sent.
    pub(crate) fn sent_through(&self, applied: u64) -> u64 {
        let queued = self.queued.load(Ordering::SeqCst);
        let sent = self.sent.load(Ordering::SeqCst);
        if sent >= queued { applied } else { sent }
    }
}

/// The door's end of the KEYNOTIFY queue.
#[derive(Debug)]
pub struct KeyNotifyReceiver {
    rx: mpsc::Receiver<KeyNotification>,
    bytes: Arc<AtomicUsize>,
    marks: Arc<Marks>,
    /// The position of the notification handed out last (sent once the door asks again).
    handed: u64,
}

pub(crate) fn keynotify_queue(
    limits: &ObserverLimits,
    every_key: Option<EveryKey>,
) -> (KeyNotifySender, KeyNotifyReceiver) {
    let (tx, rx) = mpsc::channel(limits.queue_len.max(1));
    let bytes = Arc::new(AtomicUsize::new(0));
    let marks = Arc::new(Marks::default());
    (
        KeyNotifySender {
            tx,
            bytes: bytes.clone(),
            max_bytes: limits.queue_bytes,
            dropped: AtomicU64::new(0),
            marks: marks.clone(),
            every_key: every_key.map(|mode| (mode, Arc::from(EVERY_KEY_OBSERVER))),
        },
        KeyNotifyReceiver {
            rx,
            bytes,
            marks,
            handed: 0,
        },
    )
}

impl KeyNotifySender {
    /// Queues a notification, or drops it (counted, logged) when the queue is full.
    pub(crate) fn send(&self, n: KeyNotification) {
        let cost = n.cost();
        let at = n.at;
        let held = self.bytes.fetch_add(cost, Ordering::Relaxed);
        let refused = if held + cost > self.max_bytes && held > 0 {
            true
        } else {
            self.tx.try_send(n).is_err()
        };
        if !refused {
            self.marks.queued.fetch_max(at, Ordering::SeqCst);
        }
        if refused {
            self.bytes.fetch_sub(cost, Ordering::Relaxed);
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // One line per power of two keeps a flood from flooding the log too.
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped_total = dropped,
                    "KEYNOTIFY notification dropped: the MQTT door is not keeping up"
                );
            }
        }
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub(crate) fn marks(&self) -> &Marks {
        &self.marks
    }

    /// The observer of every key, if the door mirrors state: how it is routed, and its id.
    pub(crate) fn every_key(&self) -> Option<(EveryKey, Arc<str>)> {
        self.every_key.clone()
    }
}

impl KeyNotifyReceiver {
    /// The next notification, in change order per key; `None` once the engine is gone. Asking
    /// for the next one says the previous one was sent: call it only once the previous
    /// notification has been handed to the broker.
    pub async fn recv(&mut self) -> Option<KeyNotification> {
        self.marks.sent.fetch_max(self.handed, Ordering::SeqCst);
        let n = self.rx.recv().await?;
        Some(self.took(n))
    }

    /// How many notifications wait in the queue now. Each was queued when its change was
    /// applied: a reading of the store that starts after this call sees all of them.
    pub fn waiting(&self) -> usize {
        self.rx.len()
    }

    /// The next notification if one is waiting.
    pub fn try_recv(&mut self) -> Option<KeyNotification> {
        self.marks.sent.fetch_max(self.handed, Ordering::SeqCst);
        let n = self.rx.try_recv().ok()?;
        Some(self.took(n))
    }

    fn took(&mut self, n: KeyNotification) -> KeyNotification {
        self.bytes.fetch_sub(n.cost(), Ordering::Relaxed);
        self.handed = n.at;
        n
    }
}
