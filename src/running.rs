//! A running service ([`Running`]): its doors, background tasks and what changes live; built by
//! [`crate::start`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{self, Config};
use crate::engine::Engine;
use crate::mqtt::service::MqttService;
use crate::{access, dapr, health, listener, mqtt, tls};

/// How the MQTT door reaches requests.
#[derive(Debug)]
pub(crate) enum MqttDoor {
    /// Our own MQTT connection to a broker.
    Client(MqttService),
    /// Hooks inside the embedded broker.
    #[cfg(feature = "embedded-broker")]
    InBroker(mqtt::inbroker::InBroker),
}

/// A running service: its engine, its doors and their background tasks.
pub struct Running {
    pub(crate) obs: health::Observe,
    /// The configuration parts follow ([`Running::config_updates`]); SIGHUP sends a new one.
    pub(crate) config: watch::Sender<Arc<Config>>,
    pub(crate) grace: Duration,
    pub(crate) metrics_addr: Option<SocketAddr>,
    pub(crate) metrics_task: Option<tokio::task::JoinHandle<()>>,
    pub(crate) engine: Engine,
    pub(crate) access: access::Access,
    pub(crate) mqtt_addr: (String, u16),
    pub(crate) mqtt: MqttDoor,
    #[cfg(feature = "embedded-broker")]
    pub(crate) broker: Option<mqtt::broker::EmbeddedBroker>,
    pub(crate) stop: watch::Sender<bool>,
    pub(crate) expiry: tokio::task::JoinHandle<()>,
    pub(crate) http_addr: Option<SocketAddr>,
    pub(crate) http: Option<tokio::task::JoinHandle<()>>,
    pub(crate) grpc_addr: Option<SocketAddr>,
    pub(crate) grpc: Vec<tokio::task::JoinHandle<()>>,
    pub(crate) certs: Option<Arc<tls::CertReloader>>,
    pub(crate) cert_watcher: Option<tokio::task::JoinHandle<()>>,
    pub(crate) limits: DoorLimits,
    /// Dapr configuration subscriptions (both doors'), ended at shutdown.
    pub(crate) subscriptions: Arc<dapr::configuration::Subscriptions>,
}

/// What the HTTP and gRPC doors count, for tests and the status route.
#[derive(Debug, Clone)]
pub struct DoorLimits {
    pub http_inflight: listener::inflight::InFlight,
    pub grpc_inflight: listener::inflight::InFlight,
    pub http_stats: Option<Arc<listener::ListenerStats>>,
    pub grpc_stats: Option<Arc<listener::ListenerStats>>,
    pub http_connections: Option<Arc<listener::capacity::Capacity>>,
    pub grpc_connections: Option<Arc<listener::capacity::Capacity>>,
}

impl DoorLimits {
    /// Puts the door-wide limits of `net` in force (a reloaded configuration): what is open or
    /// in flight stays, new work is measured against the new limits.
    pub(crate) fn apply(&self, net: &config::NetSettings) {
        self.http_inflight.resize(net.http_max_inflight, net.http_max_streams);
        self.grpc_inflight.resize(net.grpc_max_inflight, net.grpc_max_streams);
        if let Some(c) = &self.http_connections {
            c.resize(net.http.max_connections);
        }
        if let Some(c) = &self.grpc_connections {
            c.resize(net.grpc.max_connections);
        }
    }
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("mqtt", &self.mqtt_addr).finish()
    }
}

impl Running {
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Tokens, rules and limits in force; [`access::Access::reload`] re-reads their files
    /// (what SIGHUP does).
    pub fn access(&self) -> &access::Access {
        &self.access
    }

    /// The broker the MQTT door uses (the embedded one's real address when it runs).
    pub fn mqtt_broker(&self) -> (&str, u16) {
        (&self.mqtt_addr.0, self.mqtt_addr.1)
    }

    /// The embedded broker, when it runs.
    #[cfg(feature = "embedded-broker")]
    pub fn embedded_broker(&self) -> Option<&mqtt::broker::EmbeddedBroker> {
        self.broker.as_ref()
    }

    /// Whether requests are served inside the embedded broker (not through a client).
    pub fn serves_in_broker(&self) -> bool {
        !matches!(self.mqtt, MqttDoor::Client(_))
    }

    /// Where the HTTP door listens, if it runs.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Where the gRPC door listens, if it runs.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// Whether the HTTP and gRPC doors serve TLS.
    pub fn tls(&self) -> bool {
        self.certs.is_some()
    }

    /// Successful certificate reloads so far (changes on each; `None` without TLS).
    pub fn cert_reloads(&self) -> Option<watch::Receiver<u64>> {
        self.certs.as_ref().map(|c| c.reloads())
    }

    /// Reloads the certificate files now (as SIGHUP does).
    pub fn reload_certificate(&self) -> Result<(), tls::TlsError> {
        match &self.certs {
            Some(c) => c.reload(),
            None => Ok(()),
        }
    }

    /// The HTTP and gRPC doors' counters.
    pub fn door_limits(&self) -> &DoorLimits {
        &self.limits
    }

    /// The metrics listener's address (`--metrics-listen`), if it runs.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Metrics, readiness and the shutdown signal, as the doors see them.
    pub fn observe(&self) -> &health::Observe {
        &self.obs
    }

    /// The configuration, now and after each reload: parts that can change live (rules,
    /// tokens, certificates, limits) hold a receiver and apply what `changed()` brings.
    pub fn config_updates(&self) -> watch::Receiver<Arc<Config>> {
        self.config.subscribe()
    }

    /// Puts a re-read configuration in force: the limits that can change live (per principal,
    /// and the HTTP and gRPC doors' connections, requests and streams) before this returns,
    /// then every part that follows [`Running::config_updates`].
    pub fn reload(&self, config: Config) {
        self.access.set_limits(&config.access.limits);
        self.limits.apply(&config.net);
        self.config.send_replace(Arc::new(config));
    }

    fn mqtt_door(&self) -> &Arc<mqtt::door::Door> {
        match &self.mqtt {
            MqttDoor::Client(c) => c.door(),
            #[cfg(feature = "embedded-broker")]
            MqttDoor::InBroker(i) => i.door(),
        }
    }

    /// Stops gracefully: the MQTT door admits nothing more (in the embedded broker a new
    /// QoS 1 request is refused with PUBACK 0x97 and a reason saying to retry, never
    /// acknowledged as taken; through a client, and at QoS 0, it is answered `__stat=503`);
    /// readiness turns false and the listeners stop accepting; change streams end with a final
    /// event; requests in flight on every door finish and, in the embedded broker, every
    /// connected client takes the answers queued for it, within the grace period
    /// (`--shutdown-grace`), after which what is left is cut off; then the MQTT door, the broker
    /// and the background tasks stop. Durable storage syncs and closes when the last engine
    /// handle is dropped.
    pub async fn shutdown(self) {
        let deadline = tokio::time::Instant::now() + self.grace;
        let door = self.mqtt_door().clone();
        // First, so that nothing admitted after the stop signal goes unanswered: whoever sees
        // the service stopping sees its door closed.
        door.close();
        let _ = self.stop.send(true);
        // Configuration subscriptions end like change streams do (their streams follow them).
        self.subscriptions.close_all();
        if let Some(w) = self.cert_watcher {
            let _ = w.await;
        }
        if tokio::time::timeout_at(deadline, door.drained()).await.is_err() {
            tracing::warn!("shutdown: MQTT requests still running after the grace period");
        }
        let tasks = self.grpc.into_iter().chain(self.http).chain(self.metrics_task);
        for h in tasks {
            let abort = h.abort_handle();
            if tokio::time::timeout_at(deadline, h).await.is_err() {
                tracing::warn!("shutdown: a door still had requests after the grace period");
                abort.abort();
            }
        }
        match self.mqtt {
            MqttDoor::Client(c) => c.shutdown().await,
            #[cfg(feature = "embedded-broker")]
            MqttDoor::InBroker(i) => i.shutdown().await,
        }
        // Replicas on shared storage: the others take this one's KEYNOTIFY observers over now.
        self.engine.leave().await;
        #[cfg(feature = "embedded-broker")]
        if let Some(b) = self.broker {
            // The answers routed above are in the clients' sessions, which the broker's
            // shutdown throws away: delivered first.
            if !b.deliver_queued(deadline).await {
                tracing::warn!("shutdown: MQTT clients still had answers to take after the grace period");
            }
            b.shutdown().await;
        }
        let _ = self.expiry.await;
    }
}
