//! What the gauges read of the parts of the service (keys, bytes, registrations,
//! connections), which report it through [`GaugeSource`]: the metrics know no engine or door.

use std::sync::{Arc, Mutex};

/// What the gauges show, as one part of the service knows it; `None`: not this part's.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GaugeReadings {
    pub keys: Option<u64>,
    pub value_bytes: Option<u64>,
    pub storage_writable: Option<bool>,
    pub registrations: Option<u64>,
    pub observing_clients: Option<u64>,
    pub feed_held: Option<u64>,
    /// Cumulative: KEYNOTIFY notifications dropped so far.
    pub keynotify_dropped: Option<u64>,
    /// Cumulative: keys expired so far.
    pub expired: Option<u64>,
    pub response_cache_bytes: Option<u64>,
    pub broker_connections: Option<u64>,
}

impl GaugeReadings {
    /// `self` with what `other` knows on top.
    fn and(self, other: GaugeReadings) -> GaugeReadings {
        GaugeReadings {
            keys: other.keys.or(self.keys),
            value_bytes: other.value_bytes.or(self.value_bytes),
            storage_writable: other.storage_writable.or(self.storage_writable),
            registrations: other.registrations.or(self.registrations),
            observing_clients: other.observing_clients.or(self.observing_clients),
            feed_held: other.feed_held.or(self.feed_held),
            keynotify_dropped: other.keynotify_dropped.or(self.keynotify_dropped),
            expired: other.expired.or(self.expired),
            response_cache_bytes: other.response_cache_bytes.or(self.response_cache_bytes),
            broker_connections: other.broker_connections.or(self.broker_connections),
        }
    }
}

/// A part of the service whose state the gauges show (the engine, the MQTT door, the
/// broker): the metrics know these parts only through this.
#[async_trait::async_trait]
pub trait GaugeSource: Send + Sync + 'static {
    /// What this part knows now; read when `/metrics` is scraped.
    async fn gauges(&self) -> GaugeReadings;
}

/// Where `/metrics` reads the state its gauges show. Shared, and filled in as the parts start.
#[derive(Default)]
pub struct Sources {
    parts: Mutex<Vec<Arc<dyn GaugeSource>>>,
}

impl Sources {
    /// Adds a part whose state the gauges show from now on.
    pub fn add(&self, part: Arc<dyn GaugeSource>) {
        self.parts.lock().unwrap_or_else(|e| e.into_inner()).push(part);
    }

    pub(super) async fn read(&self) -> GaugeReadings {
        let parts = self.parts.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out = GaugeReadings::default();
        for p in parts {
            out = out.and(p.gauges().await);
        }
        out
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources").finish_non_exhaustive()
    }
}
