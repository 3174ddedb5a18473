//! The embedded MQTT broker: rmqtt 0.24 used as a library, on plain TCP, MQTT 5 and 3.1.1.
//!
//! rmqtt keeps all broker state (sessions, routes, hooks, listener settings) in one
//! `ServerContext`, so several brokers can run in one process, each on its own port. Its only
//! process-wide state is a cached "system busy" flag read during handshakes when busy checking is
//! on; [`EmbeddedBroker::start`] turns busy checking off, which also keeps a loaded machine (a
//! parallel test run, a build) from refusing connections with "server unavailable".
//!
//! What is set on purpose, because rmqtt's defaults do not suit a state store:
//! - Maximum Packet Size and Receive Maximum come from [`BrokerOptions`].
//! - Message expiry for messages that carry none comes from [`BrokerOptions`] (rmqtt would add
//!   5 minutes). `None` means such messages never expire.
//! - Shared subscriptions (`$share/<group>/<filter>`) are switched on with [`RoundRobin`]; rmqtt's
//!   default strategy reports them unsupported.
//! - rmqtt resends unacknowledged QoS 1/2 messages to a connected client every 20 s. MQTT 5
//!   allows a resend only on reconnect (and a slow responder would see duplicates), so the timer
//!   is off; unacknowledged messages are resent when the session resumes.
//! - TCP_NODELAY on every accepted connection (Nagle plus delayed ACK cost 40-90 ms a round trip).
//!
//! The `ClientDisconnected` hook reports every disconnect, clean or not, to the callback given to
//! [`EmbeddedBroker::start`].

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU16;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::net::Builder;
use rmqtt::server::MqttServer;
use rmqtt::shared::Entry;
use rmqtt::subscribe::SharedSubscription;
use rmqtt::types::{
    ClientId, Id, IsOnline, NodeId, SharedGroup, SubscriptionIdentifier, SubscriptionOptions, TopicName,
};
use tokio::task::{JoinHandle, JoinSet};

use super::brokerauth::BrokerGuard;
use super::door::Door;
use super::inbroker::InBroker;
use crate::CertIdentity;

mod drain;
pub(crate) mod tls;
pub use tls::BrokerTls;

/// Session expiry for MQTT 3.1.1 clients that connect with clean_session=0 (MQTT 5 clients
/// choose their own). rmqtt's default, written down.
const V3_SESSION_EXPIRY: Duration = Duration::from_secs(2 * 60 * 60);
/// How long [`EmbeddedBroker::shutdown`] waits for connected clients to be disconnected.
const SHUTDOWN_KICK_TIMEOUT: Duration = Duration::from_secs(10);
/// Shared-subscription groups whose round-robin position is remembered; past this the positions
/// start again from zero (only fairness is lost, never a message).
const MAX_TRACKED_GROUPS: usize = 4_096;

/// How the embedded broker listens and which limits it announces.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// Address to listen on (port 0 = pick a free port).
    pub listen: SocketAddr,
    /// Largest MQTT packet accepted or sent, bytes.
    pub max_packet_bytes: u32,
    /// MQTT5 Receive Maximum the broker announces.
    pub receive_maximum: u16,
    /// Message expiry the broker applies to messages that carry none (None = never expire).
    pub default_message_expiry: Option<Duration>,
    /// A TLS (MQTTS) listener besides the plain one.
    pub tls: Option<BrokerTls>,
    /// Most sessions (connected clients and sessions kept for disconnected ones); past it a
    /// CONNECT is refused with "server unavailable".
    pub max_connections: usize,
    /// Messages queued per session (online backlog or offline queue) before the broker drops
    /// new ones for that client (rmqtt's own default is 1,000).
    pub max_queued_per_client: usize,
    /// Time a connection has for its TLS handshake and its CONNECT packet.
    pub connect_timeout: Duration,
    /// Authentication and topic ACLs (`None`: anyone may connect and use any topic).
    pub guard: Option<BrokerGuard>,
    /// What one SUBSCRIBE's retained state topics may cost (with the guard's state topics).
    pub state_topics_replay: crate::mirror::ReplayLimits,
    /// Where the retained state replays are counted.
    pub metrics: crate::metrics::Metrics,
}

impl Default for BrokerOptions {
    fn default() -> BrokerOptions {
        BrokerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_packet_bytes: 8 * 1024 * 1024,
            receive_maximum: 1024,
            default_message_expiry: None,
            tls: None,
            max_connections: 10_000,
            max_queued_per_client: 10_000,
            connect_timeout: Duration::from_secs(10),
            guard: None,
            state_topics_replay: Default::default(),
            metrics: crate::metrics::Metrics::disabled(),
        }
    }
}

/// Why the embedded broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("the maximum packet size must be at least 1 byte")]
    ZeroMaxPacketSize,
    #[error("the receive maximum must be at least 1")]
    ZeroReceiveMaximum,
    #[error("the default message expiry must be longer than zero (use none for no expiry)")]
    ZeroMessageExpiry,
    #[error("the MQTTS listener on {addr}: {reason}")]
    Tls { addr: SocketAddr, reason: String },
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A running embedded broker. Dropping it stops accepting connections; [`Self::shutdown`] also
/// disconnects the clients.
pub struct EmbeddedBroker {
    scx: ServerContext,
    local_addr: SocketAddr,
    server: JoinHandle<()>,
    tls: Option<tls::TlsListener>,
}

impl fmt::Debug for EmbeddedBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedBroker")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl EmbeddedBroker {
    /// Starts listening before returning (so a client may connect right away).
    /// `on_disconnect` is called with the MQTT client id and its session ([`session_token`])
    /// whenever a client disconnects, cleanly or not.
    ///
    /// `on_disconnect` runs on a broker task: it must return quickly and must not block. When a
    /// client connects again with the same client id while its old connection is still open, the
    /// old connection is taken over; its disconnect is reported too, possibly after the new
    /// connection has been accepted: the session token tells the two apart.
    pub async fn start(opts: BrokerOptions, on_disconnect: OnDisconnect) -> Result<EmbeddedBroker, BrokerError> {
        let receive_maximum = NonZeroU16::new(opts.receive_maximum).ok_or(BrokerError::ZeroReceiveMaximum)?;
        if opts.max_packet_bytes == 0 {
            // rmqtt reads 0 as "unlimited" but would announce a Maximum Packet Size of 0.
            return Err(BrokerError::ZeroMaxPacketSize);
        }
        let message_expiry = match opts.default_message_expiry {
            // rmqtt reads a zero listener expiry as "never expire".
            None => Duration::ZERO,
            Some(expiry) if expiry.is_zero() => return Err(BrokerError::ZeroMessageExpiry),
            Some(expiry) => expiry,
        };

        let max_sessions = isize::try_from(opts.max_connections.max(1)).unwrap_or(isize::MAX);
        let scx = ServerContext::new()
            .busy_check_enable(false)
            .mqtt_max_sessions(max_sessions)
            .build()
            .await;
        *scx.extends.shared_subscription_mut().await = Box::new(RoundRobin::default());
        let hooks = scx.extends.hook_mgr().register();
        hooks
            .add(Type::ClientDisconnected, Box::new(DisconnectHook { on_disconnect }))
            .await;
        // With a guard its authentication hook decides about every client: rmqtt would skip
        // the hook for a client without a username while anonymous clients are allowed.
        let allow_anonymous = match opts.guard {
            Some(guard) => {
                if let Some(topics) = &guard.state_topics {
                    let service_id = guard.service_id.clone();
                    let serving = (
                        guard.access.clone(),
                        opts.state_topics_replay.clone(),
                        opts.metrics.clone(),
                    );
                    crate::mirror::inbroker::install_retained_store(&scx, &*hooks, topics.clone(), service_id, serving)
                        .await;
                }
                let identity = opts.tls.as_ref().map_or(CertIdentity::Cn, |t| t.identity);
                guard.install(&*hooks, identity).await;
                false
            }
            None => true,
        };
        hooks.start().await;

        let bind_error = |source: rmqtt::Error| BrokerError::Bind {
            addr: opts.listen,
            source: into_io_error(source),
        };
        let base = Builder::new()
            .name("stategate/tcp")
            .laddr(opts.listen)
            .reuseaddr(Some(true))
            .nodelay(true)
            .allow_anonymous(allow_anonymous)
            .max_packet_size(opts.max_packet_bytes)
            .max_inflight(receive_maximum)
            .message_expiry_interval(message_expiry)
            .message_retry_interval(Duration::ZERO)
            .max_mqueue_len(opts.max_queued_per_client.max(1))
            .session_expiry_interval(V3_SESSION_EXPIRY)
            // rmqtt's `max_connections` bounds its queue of handshakes in progress; the session
            // limit above is what bounds clients.
            .max_connections(opts.max_connections.max(1))
            .handshake_timeout(opts.connect_timeout);
        let mut listener = Builder::clone(&base)
            .bind()
            .and_then(|listener| listener.tcp())
            .map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        // The listener settings carry the address asked for; record the one bound, so that
        // session ids and logs show the real port.
        listener.cfg = Arc::new(Builder::clone(&listener.cfg).laddr(local_addr));

        let server = MqttServer::new(scx.clone())
            .listener_by_id(listener, local_addr.port())
            .build();
        let server = tokio::spawn(async move {
            if let Err(err) = server.run().await {
                tracing::error!(cause = %err, "embedded broker stopped");
            }
        });
        tracing::info!(%local_addr, "embedded broker listening");
        let tls = match opts.tls {
            Some(t) => Some(tls::TlsListener::start(&scx, &base, t)?),
            None => None,
        };
        Ok(EmbeddedBroker {
            scx,
            local_addr,
            server,
            tls,
        })
    }

    /// The address actually bound (the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The MQTTS listener's address, when it runs.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().map(|t| t.local_addr)
    }

    /// Times the MQTTS listener was rebound with a reloaded certificate (changes on each).
    pub fn tls_rebinds(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.tls.as_ref().map(|t| t.rebinds.clone())
    }

    /// (client id, username) of every session the broker holds; the username is the one the
    /// broker authenticated: with client certificates, the certificate's identity.
    pub async fn clients(&self) -> Vec<(String, Option<String>)> {
        self.scx
            .extends
            .shared()
            .await
            .iter()
            .map(|e| {
                let id = e.id();
                (id.client_id.to_string(), id.username.as_ref().map(|u| u.to_string()))
            })
            .collect()
    }

    /// Starts answering state store requests inside this broker (see [`InBroker`]).
    pub async fn serve_in_broker(&self, door: Arc<Door>) -> InBroker {
        InBroker::start(&self.scx, door).await
    }

    /// The client ids of the sessions the broker holds (connected or not).
    pub async fn client_ids(&self) -> Vec<String> {
        self.scx
            .extends
            .shared()
            .await
            .iter()
            .map(|e| e.id().client_id.to_string())
            .collect()
    }

    /// Sessions the broker holds (connected or not).
    pub async fn session_count(&self) -> usize {
        self.scx.extends.shared().await.sessions_count()
    }

    /// A counter of the MQTT connections open now (with `--mqtt-client-path`, the service's own
    /// connection is one of them).
    pub fn connection_counter(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let scx = self.scx.clone();
        move || scx.connections.count().max(0) as usize
    }

    /// What the gauges read of the broker: its connections.
    pub fn gauge_source(&self) -> Arc<dyn crate::metrics::GaugeSource> {
        Arc::new(Connections(self.scx.clone()))
    }

    /// Waits until every connected client has taken (at QoS 1: acknowledged) what the broker
    /// queued for it, answers above all, or `deadline` passes (`false` then). Call it before
    /// [`Self::shutdown`], whose kick would throw the rest away; see `broker/drain.rs`.
    pub async fn deliver_queued(&self, deadline: tokio::time::Instant) -> bool {
        drain::deliver_queued(&self.scx, deadline).await
    }

    /// Stops accepting and ends the broker's tasks as far as rmqtt allows.
    ///
    /// The listening socket is closed first. Then every session is kicked: connected clients get
    /// a DISCONNECT (and `on_disconnect` fires for them), offline sessions are discarded, and
    /// with them whatever they still queue ([`Self::deliver_queued`] first, to deliver it). rmqtt
    /// has no stop call, so a few idle tasks (its task-queue runners) live on until the tokio
    /// runtime ends.
    pub async fn shutdown(mut self) {
        if let Some(t) = &self.tls {
            t.stop();
        }
        self.server.abort();
        // Awaiting the aborted task drops the server, and with it the listening socket.
        let _ = (&mut self.server).await;

        let entries: Vec<Box<dyn Entry>> = self.scx.extends.shared().await.iter().collect();
        let mut kicks = JoinSet::new();
        for entry in entries {
            kicks.spawn(async move {
                match entry.try_lock().await {
                    Ok(mut entry) => {
                        // clean start, drop subscriptions, by admin: nothing is kept.
                        if let Err(err) = entry.kick(true, true, true).await {
                            tracing::debug!(cause = %err, "kick at shutdown failed");
                        }
                    }
                    Err(err) => tracing::debug!(cause = %err, "session busy at shutdown"),
                }
            });
        }
        let all_kicked = async { while kicks.join_next().await.is_some() {} };
        if tokio::time::timeout(SHUTDOWN_KICK_TIMEOUT, all_kicked).await.is_err() {
            tracing::warn!("embedded broker shutdown: some clients were not disconnected in time");
        }
        tracing::info!(local_addr = %self.local_addr, "embedded broker stopped");
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// rmqtt returns `anyhow` errors; a bind failure is an I/O error inside one.
fn into_io_error(err: rmqtt::Error) -> std::io::Error {
    match err.downcast::<std::io::Error>() {
        Ok(io) => io,
        Err(other) => std::io::Error::other(format!("{other:#}")),
    }
}

/// Called with a client id and its session token when a client disconnects.
pub type OnDisconnect = Arc<dyn Fn(&str, u64) + Send + Sync>;

/// A number that tells one connection of a client id from another: a reconnect with the same
/// client id gets a different one (the broker's connection time and addresses go into it).
pub fn session_token(id: &Id) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one((
        id.create_time,
        id.remote_addr,
        id.local_addr,
        id.lid,
        &*id.client_id,
    ))
}

/// Calls the broker owner's callback for every disconnect.
struct DisconnectHook {
    on_disconnect: OnDisconnect,
}

#[async_trait]
impl Handler for DisconnectHook {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        if let Parameter::ClientDisconnected(session, reason) = param {
            let client_id: &str = &session.id.client_id;
            tracing::debug!(client_id, %reason, "mqtt client disconnected");
            (self.on_disconnect)(client_id, session_token(&session.id));
        }
        (true, acc)
    }
}

/// Shared-subscription strategy: each message of a group goes to the next member in client-id
/// order, preferring members that are online; if none is online, an offline member with a
/// session gets it (queued until it reconnects).
#[derive(Default)]
struct RoundRobin {
    next: Mutex<HashMap<SharedGroup, usize>>,
}

impl RoundRobin {
    fn advance(&self, group: &SharedGroup) -> usize {
        // A poisoned lock only means another thread panicked mid-update of a counter.
        let mut next = self.next.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if next.len() >= MAX_TRACKED_GROUPS && !next.contains_key(group) {
            next.clear();
        }
        let slot = next.entry(group.clone()).or_insert(0);
        let current = *slot;
        *slot = slot.wrapping_add(1);
        current
    }
}

#[async_trait]
impl SharedSubscription for RoundRobin {
    fn is_supported(&self) -> bool {
        true
    }

    async fn choice(
        &self,
        _scx: &ServerContext,
        group: &SharedGroup,
        _publisher_id: &Id,
        _topic: &TopicName,
        members: &[(
            NodeId,
            ClientId,
            SubscriptionOptions,
            Option<Vec<SubscriptionIdentifier>>,
            Option<IsOnline>,
        )],
    ) -> Option<(usize, IsOnline)> {
        let is_online = |i: usize| members[i].4.unwrap_or(true);
        let mut pool: Vec<usize> = (0..members.len()).filter(|&i| is_online(i)).collect();
        if pool.is_empty() {
            pool = (0..members.len()).collect();
        }
        if pool.is_empty() {
            return None;
        }
        // The order rmqtt lists members in is not stable; client ids are.
        pool.sort_by(|&a, &b| members[a].1.cmp(&members[b].1));
        let chosen = pool[self.advance(group) % pool.len()];
        Some((chosen, is_online(chosen)))
    }
}

#[cfg(test)]
mod tests;

/// The broker's connection count, for the metrics.
struct Connections(ServerContext);

#[async_trait::async_trait]
impl crate::metrics::GaugeSource for Connections {
    async fn gauges(&self) -> crate::metrics::GaugeReadings {
        crate::metrics::GaugeReadings {
            broker_connections: Some(self.0.connections.count().max(0) as u64),
            ..Default::default()
        }
    }
}
