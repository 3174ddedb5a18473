//! Liveness, readiness, and what every door shares for observing itself and shutting down.
//!
//! Alive: the process answers (`/healthz`). Ready (`/readyz`, the gRPC health service): the
//! storage answers within [`PROBE_TIMEOUT`] (for Redis: the server is reachable) and the MQTT
//! door receives requests (subscribed through its client connection, or served inside the
//! embedded broker), and the service is not shutting down.

use std::time::Duration;

use std::sync::Arc;

use tokio::sync::watch;

use crate::Engine;
use crate::metrics::{Metrics, Sources};

/// Longest a storage probe may take before the storage counts as unreachable.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the doors share besides the engine: metrics, readiness, the shutdown signal.
#[derive(Clone, Debug)]
pub struct Observe {
    pub metrics: Metrics,
    /// Where `/metrics` reads mirrored state.
    pub sources: Arc<Sources>,
    /// Turns `true` when the service begins shutting down: streams end with a final event.
    pub stopping: watch::Receiver<bool>,
    /// `None`: readiness is not checked (always ready), e.g. a router built alone in tests.
    pub engine: Option<Engine>,
    /// The last readiness check (shared by clones).
    pub readiness_cache: Arc<ReadinessCache>,
}

impl Default for Observe {
    fn default() -> Observe {
        // A receiver whose sender is gone never changes again: never stopping.
        let (_, stopping) = watch::channel(false);
        Observe {
            metrics: Metrics::disabled(),
            sources: Arc::default(),
            stopping,
            engine: None,
            readiness_cache: Arc::default(),
        }
    }
}

/// The answer of a readiness check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub storage: Result<(), String>,
    pub mqtt: Result<(), String>,
    pub stopping: bool,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.storage.is_ok() && self.mqtt.is_ok() && !self.stopping
    }
}

/// The last readiness check, shared by every probe: `/readyz` is open to anyone, so a flood of
/// probes costs at most one storage round trip per [`READINESS_MAX_AGE`].
#[derive(Debug, Default)]
pub struct ReadinessCache(tokio::sync::Mutex<Option<(std::time::Instant, Readiness)>>);

/// How long a readiness check answers later probes.
pub const READINESS_MAX_AGE: Duration = Duration::from_millis(500);

impl Observe {
    /// The readiness of every dependency, checked at most once per [`READINESS_MAX_AGE`]
    /// (concurrent probes wait for the one check in progress). Shutting down is always current.
    pub async fn readiness(&self) -> Readiness {
        let stopping = *self.stopping.borrow();
        let mut last = self.readiness_cache.0.lock().await;
        // The storage's answer is reused; the broker's subscription is a flag, read now: a
        // service that just subscribed is ready at once, not a cache period later.
        if let Some((at, r)) = last.as_ref()
            && at.elapsed() < READINESS_MAX_AGE
        {
            return Readiness {
                stopping,
                mqtt: self.mqtt_readiness(),
                ..r.clone()
            };
        }
        let r = self.check_readiness().await;
        if last
            .as_ref()
            .is_none_or(|(_, prev)| prev.storage != r.storage || prev.mqtt != r.mqtt)
        {
            match (&r.storage, &r.mqtt) {
                (Ok(()), Ok(())) => tracing::info!("ready"),
                (storage, mqtt) => tracing::warn!(?storage, ?mqtt, "not ready"),
            }
        }
        *last = Some((std::time::Instant::now(), r.clone()));
        Readiness { stopping, ..r }
    }

    /// Checks every dependency now. Reasons are short words anyone may see (`/readyz` needs no
    /// token); the causes behind them go to the log.
    async fn check_readiness(&self) -> Readiness {
        let stopping = *self.stopping.borrow();
        let Some(engine) = &self.engine else {
            return Readiness {
                storage: Ok(()),
                mqtt: Ok(()),
                stopping,
            };
        };
        // A full disk (writes refused) or a failed log is not ready, though reads still work.
        let storage = match engine.storage_health() {
            crate::storage::StorageHealth::Full { cause } => {
                tracing::debug!(%cause, "readiness: storage full");
                Err("full".to_owned())
            }
            crate::storage::StorageHealth::Failed { cause } => {
                tracing::debug!(%cause, "readiness: storage failed");
                Err("failed".to_owned())
            }
            crate::storage::StorageHealth::Ok => match tokio::time::timeout(PROBE_TIMEOUT, engine.key_count()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => {
                    tracing::debug!(cause = %e, "readiness: storage does not answer");
                    Err("unavailable".to_owned())
                }
                Err(_) => Err("timeout".to_owned()),
            },
        };
        Readiness {
            storage,
            mqtt: self.mqtt_readiness(),
            stopping,
        }
    }

    /// Whether the MQTT door takes requests (always, for an observer without an engine).
    fn mqtt_readiness(&self) -> Result<(), String> {
        match self.engine.is_none() || self.metrics.mqtt_subscribed() {
            true => Ok(()),
            false => Err("not subscribed".to_owned()),
        }
    }

    /// Resolves once shutdown begins.
    pub async fn stopped(&self) {
        let mut rx = self.stopping.clone();
        let _ = rx.wait_for(|s| *s).await;
    }
}
