//! The engine's KEYNOTIFY side: registering observers, notifying them of changes, and
//! dropping the registrations of clients that left or went idle.

use std::sync::Arc;

use super::notify::{Change, EveryKey, KeyNotifyReceiver, Observers, RegisterError};
use super::*;

impl Engine {
    /// The notifications for KEYNOTIFY observers, in change order per key: the MQTT door takes
    /// this once (`None` afterwards). Changes to keys nobody observes are never queued.
    /// On shared storage, taking it makes this replica one of those that send notifications.
    pub fn keynotify_feed(&self) -> Option<KeyNotifyReceiver> {
        self.keynotify_feed_with(None)
    }

    /// [`Engine::keynotify_feed`], with the observer of every key
    /// ([`notify::EVERY_KEY_OBSERVER`]) among the observers of each change when `every_key`
    /// says how it is routed: the door's state topics mirror, which thereby gets every change
    /// in the order (and on shared storage from the one replica) KEYNOTIFY would send it.
    pub fn keynotify_feed_with(&self, every_key: Option<EveryKey>) -> Option<KeyNotifyReceiver> {
        let (tx, rx) = notify::keynotify_queue(&self.0.limits.observers, every_key);
        self.0.keynotify.set(tx).ok()?;
        if let Some(shared) = self.shared() {
            shared.start_heartbeats(self);
        }
        Some(rx)
    }

    /// KEYNOTIFY notifications dropped so far because the door's queue was full.
    pub fn keynotify_dropped(&self) -> u64 {
        self.0.keynotify.get().map_or(0, KeyNotifySender::dropped)
    }

    /// The client ids observing `key` (KEYNOTIFY).
    pub fn observers_of(&self, key: &[u8]) -> Vec<Arc<str>> {
        self.observers().of_key(key)
    }

    /// Drops every KEYNOTIFY registration of a client (it disconnected). With `session`, only
    /// registrations made in that broker session (a late report of an old connection's end
    /// leaves a newer session's registrations alone).
    pub async fn drop_client(&self, client: &str, session: Option<u64>) -> usize {
        match self.shared() {
            Some(shared) => self.drop_client_shared(shared, client, session).await,
            None => self.with_observers(|o| o.drop_client(client, session)),
        }
    }

    /// KEYNOTIFY registrations of all clients.
    pub fn registrations(&self) -> usize {
        self.observers().total()
    }

    /// Runs a change of the registry and keeps the count of observed keys current.
    pub(super) fn with_observers<T>(&self, f: impl FnOnce(&mut Observers) -> T) -> T {
        let mut obs = self.observers();
        let out = f(&mut obs);
        self.0.observed_keys.store(obs.key_count(), Ordering::Relaxed);
        out
    }

    /// Records that a client is alive (it sent a request).
    pub fn touch_client(&self, client: &str) {
        self.observers().touch(client)
    }

    /// Drops the registrations of clients idle past the configured limit.
    pub async fn sweep_idle_observers(&self) -> usize {
        match (self.0.limits.observers.idle, self.shared()) {
            (Some(idle), Some(shared)) => self.sweep_idle_shared(shared, idle).await,
            (Some(idle), None) => self.with_observers(|o| o.sweep_idle(idle)),
            (None, _) => 0,
        }
    }

    /// Number of clients with at least one registration.
    pub fn observing_clients(&self) -> usize {
        self.observers().client_count()
    }

    pub(super) fn observers(&self) -> std::sync::MutexGuard<'_, Observers> {
        self.0.observers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the KEYNOTIFY notifications of a change, for the observers of its key.
    pub(super) fn notify_observers(&self, change: &Change) {
        let Some(tx) = self.0.keynotify.get() else { return };
        let every_key = tx.every_key();
        let observed = self.0.observed_keys.load(Ordering::Relaxed) > 0;
        if observed || every_key.is_some() {
            let mut observers = match observed {
                true => self.observers().of_key(&change.key),
                false => Vec::new(),
            };
            // One process, one broker: the mirror is this replica's to send, whatever its mode.
            observers.extend(every_key.map(|(_, id)| id));
            if !observers.is_empty() {
                // The notification may wait: it must not pin the request's buffer.
                let change = change.detached();
                tx.send(KeyNotification {
                    change,
                    observers,
                    at: 0,
                });
            }
        }
    }

    pub(super) async fn keynotify(&self, c: KeyNotify) -> Result<Response, EngineError> {
        if c.key.is_empty() {
            return Err(EngineError::EmptyKey);
        }
        if !c.stop && c.key.len() > self.0.limits.max_key_bytes {
            return Err(EngineError::TooLarge);
        }
        if let Some(shared) = self.shared() {
            return self.keynotify_shared(shared, c).await;
        }
        if c.stop {
            let reply = if self.with_observers(|o| o.unregister(&c.client, &c.key)) {
                Reply::Ok
            } else {
                Reply::Int(0)
            };
            return Ok(Response::new(reply, None));
        }
        let limits = &self.0.limits.observers;
        match self.with_observers(|o| o.register(&c.client, c.session, &c.key, limits)) {
            Ok(()) => Ok(Response::new(Reply::Ok, None)),
            Err(why) => Err(self.refused_registration(why)),
        }
    }

    pub(super) fn refused_registration(&self, why: RegisterError) -> EngineError {
        if why == RegisterError::RegistryFull {
            let limit = self.0.limits.observers.total;
            tracing::warn!(limit, "KEYNOTIFY registry full: registration refused");
        }
        EngineError::QuotaExceeded
    }
}

/// What the metrics mirror of the engine and its storage, read at each scrape.
#[async_trait::async_trait]
impl crate::metrics::GaugeSource for Engine {
    async fn gauges(&self) -> crate::metrics::GaugeReadings {
        crate::metrics::GaugeReadings {
            keys: self.key_count().await.ok(),
            value_bytes: self.value_bytes().await.ok().flatten(),
            storage_writable: Some(self.storage_health() == crate::storage::StorageHealth::Ok),
            registrations: Some(self.registrations() as u64),
            observing_clients: Some(self.observing_clients() as u64),
            feed_held: Some(self.feed_held().1 as u64),
            keynotify_dropped: Some(self.keynotify_dropped()),
            expired: Some(self.expired_count()),
            ..Default::default()
        }
    }
}
