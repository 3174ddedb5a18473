//! TLS and listener flags of `stategate serve`, and the settings they make.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{ConfigError, parse_listen};
use crate::listener::ListenerLimits;

/// TLS and listener limits of `stategate serve`.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// PEM certificate chain (leaf first) of every TLS listener: with --tls-key, the HTTP and
    /// gRPC doors serve only TLS, and the embedded broker opens --mqtt-tls-listen. Reloaded on
    /// SIGHUP and when the file changes.
    #[arg(long, env = "STATEGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "STATEGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Where the embedded broker's TLS (MQTTS) listener listens, with --tls-cert; `off`
    /// disables it.
    #[arg(long, env = "STATEGATE_MQTT_TLS_LISTEN", default_value = "127.0.0.1:8883")]
    pub mqtt_tls_listen: String,
    /// PEM CA certificates: the MQTTS listener then requires a client certificate signed by
    /// one of them, and the certificate's identity becomes the client's MQTT username.
    #[arg(long, env = "STATEGATE_MQTT_TLS_CLIENT_CA", requires = "tls_cert")]
    pub mqtt_tls_client_ca: Option<PathBuf>,
    /// Which part of a client certificate is the MQTT username: `cn` (the subject's common
    /// name) or `subject` (the whole subject, e.g. `CN=sensor-1, O=Plant`).
    #[arg(long, env = "STATEGATE_MQTT_TLS_IDENTITY", default_value = "cn")]
    pub mqtt_tls_identity: CertIdentity,
    /// PEM CA certificates that verify the external broker of an `mqtts://` --mqtt-url
    /// (default: the system's trusted roots).
    #[arg(long, env = "STATEGATE_MQTT_CA_FILE")]
    pub mqtt_ca_file: Option<PathBuf>,
    /// Allow plain (non-TLS) MQTT, HTTP or gRPC listeners on addresses other than loopback.
    /// Without it such a listener stops the service at startup (exit status 64).
    #[arg(long, env = "STATEGATE_ALLOW_INSECURE_LISTEN")]
    pub allow_insecure_listen: bool,
    /// Most MQTT sessions of the embedded broker (connected clients plus sessions kept for
    /// disconnected ones); past it a CONNECT is refused with CONNACK "server unavailable".
    #[arg(long, env = "STATEGATE_MQTT_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub mqtt_max_connections: usize,
    /// Messages the embedded broker queues for one session (a client that reads slowly, or is
    /// disconnected with a kept session); past it new messages for that session are dropped.
    #[arg(long, env = "STATEGATE_MQTT_MAX_QUEUED_PER_CLIENT", default_value_t = 10_000)]
    pub mqtt_max_queued_per_client: usize,
    /// With --state-topics on the embedded broker: most retained messages one SUBSCRIBE
    /// delivers (only keys its client may read count); past it the rest are not sent and the
    /// cut is counted (docs/state-topics.md).
    #[arg(long, env = "STATEGATE_STATE_TOPICS_REPLAY_MAX", default_value_t = 100_000)]
    pub state_topics_replay_max: usize,
    /// With --state-topics on the embedded broker: SUBSCRIBEs of one client whose retained
    /// messages are being sent at once; a SUBSCRIBE past it gets none (counted, logged); a
    /// repeated SUBSCRIBE of the same filter restarts its own instead.
    #[arg(long, env = "STATEGATE_STATE_TOPICS_REPLAYS_PER_CLIENT", default_value_t = 4)]
    pub state_topics_replays_per_client: usize,
    /// With --state-topics on the embedded broker: replays reading the retained store at once
    /// across all clients; a SUBSCRIBE past it waits for one to end.
    #[arg(long, env = "STATEGATE_STATE_TOPICS_REPLAYS_TOTAL", default_value_t = 64)]
    pub state_topics_replays_total: usize,
    /// With --state-topics on the embedded broker: replayed messages one client may have
    /// waiting in its session at once (also at most half of --mqtt-max-queued-per-client); the
    /// client's acknowledgements pace the rest.
    #[arg(long, env = "STATEGATE_STATE_TOPICS_REPLAY_WINDOW", default_value_t = 256)]
    pub state_topics_replay_window: usize,
    /// Seconds an MQTT connection to the embedded broker has for its TLS handshake and its
    /// CONNECT packet; past it the connection is closed.
    #[arg(long, env = "STATEGATE_MQTT_CONNECT_TIMEOUT_SECS", default_value_t = 10)]
    pub mqtt_connect_timeout_secs: u64,
    /// Most HTTP connections open at once; past it a new connection is closed right away.
    #[arg(long, env = "STATEGATE_HTTP_MAX_CONNECTIONS", default_value_t = 4096)]
    pub http_max_connections: usize,
    /// Most HTTP requests executing at once (event streams excepted); past it a request is
    /// answered 503 `ERR_TOO_MANY_REQUESTS`.
    #[arg(long, env = "STATEGATE_HTTP_MAX_INFLIGHT", default_value_t = 1024)]
    pub http_max_inflight: usize,
    /// Most server-sent event streams open at once; past it a subscribe is answered 503
    /// `ERR_TOO_MANY_REQUESTS`.
    #[arg(long, env = "STATEGATE_HTTP_MAX_STREAMS", default_value_t = 1024)]
    pub http_max_streams: usize,
    /// Most bytes of HTTP request bodies held at once, counted as bodies arrive (a known
    /// Content-Length is reserved whole); past it a request is answered 503
    /// `ERR_TOO_MANY_REQUESTS`.
    #[arg(long, env = "STATEGATE_HTTP_MAX_INFLIGHT_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub http_max_inflight_bytes: usize,
    /// Seconds an HTTP connection has to send a request's headers, counted from when it is
    /// ready for a request: for a kept-alive connection this is also its idle timeout.
    #[arg(long, env = "STATEGATE_HTTP_HEADER_TIMEOUT_SECS", default_value_t = 10)]
    pub http_header_timeout_secs: u64,
    /// Most gRPC connections open at once; past it a new connection is closed right away.
    #[arg(long, env = "STATEGATE_GRPC_MAX_CONNECTIONS", default_value_t = 4096)]
    pub grpc_max_connections: usize,
    /// Most gRPC calls executing at once (streams excepted); past it RESOURCE_EXHAUSTED.
    #[arg(long, env = "STATEGATE_GRPC_MAX_INFLIGHT", default_value_t = 1024)]
    pub grpc_max_inflight: usize,
    /// Most gRPC streams (Watch, health Watch, reflection) open at once; past it
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "STATEGATE_GRPC_MAX_STREAMS", default_value_t = 1024)]
    pub grpc_max_streams: usize,
    /// Most bytes of gRPC request messages held at once, counted as they arrive; a call whose
    /// message does not fit fails with RESOURCE_EXHAUSTED.
    #[arg(long, env = "STATEGATE_GRPC_MAX_INFLIGHT_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub grpc_max_inflight_bytes: usize,
    /// HTTP/2 streams one gRPC connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, env = "STATEGATE_GRPC_MAX_STREAMS_PER_CONNECTION", default_value_t = 256)]
    pub grpc_max_streams_per_connection: u32,
    /// Seconds between HTTP/2 keep-alive pings on a gRPC connection; a peer that does not
    /// answer one within as many seconds again is disconnected. A new connection must send
    /// its first bytes within this time too.
    #[arg(long, env = "STATEGATE_GRPC_KEEPALIVE_SECS", default_value_t = 30)]
    pub grpc_keepalive_secs: u64,
    /// Seconds a TLS handshake may take on the HTTP and gRPC doors; past it the connection is
    /// closed.
    #[arg(long, env = "STATEGATE_TLS_HANDSHAKE_TIMEOUT_SECS", default_value_t = 10)]
    pub tls_handshake_timeout_secs: u64,
}

pub use crate::mqtt::CertIdentity;

/// The embedded broker's TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttTlsListener {
    pub listen: SocketAddr,
    /// Client certificates required, verified against these CAs.
    pub client_ca: Option<PathBuf>,
    pub identity: CertIdentity,
}

/// The TLS and connection settings of the listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetSettings {
    /// Certificate and key of every TLS listener (`None`: no TLS listener).
    pub tls: Option<TlsFiles>,
    /// The embedded broker's TLS listener (needs `tls`).
    pub mqtt_tls: Option<MqttTlsListener>,
    pub mqtt_max_connections: usize,
    pub mqtt_max_queued_per_client: usize,
    /// What one SUBSCRIBE's retained state topics may cost (embedded broker).
    pub state_topics_replay: crate::mqtt::mirror::ReplayLimits,
    pub mqtt_connect_timeout: Duration,
    pub http: ListenerLimits,
    pub http_max_inflight: usize,
    pub http_max_streams: usize,
    pub http_max_inflight_bytes: usize,
    pub http_header_timeout: Duration,
    pub grpc: ListenerLimits,
    pub grpc_max_inflight: usize,
    pub grpc_max_streams: usize,
    pub grpc_max_inflight_bytes: usize,
    pub grpc_max_streams_per_connection: u32,
    pub grpc_keepalive: Duration,
}

/// A certificate chain and its key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl NetSettings {
    pub(super) fn from_args(n: &NetArgs) -> Result<NetSettings, ConfigError> {
        let tls = match (&n.tls_cert, &n.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        let mqtt_tls = match (&tls, parse_listen("--mqtt-tls-listen", &n.mqtt_tls_listen)?) {
            (Some(_), Some(listen)) => Some(MqttTlsListener {
                listen,
                client_ca: n.mqtt_tls_client_ca.clone(),
                identity: n.mqtt_tls_identity,
            }),
            _ => None,
        };
        let handshake_timeout = Duration::from_secs(n.tls_handshake_timeout_secs.max(1));
        let grpc_keepalive = Duration::from_secs(n.grpc_keepalive_secs.max(1));
        Ok(NetSettings {
            tls,
            mqtt_tls,
            mqtt_max_connections: n.mqtt_max_connections.max(1),
            mqtt_max_queued_per_client: n.mqtt_max_queued_per_client.max(1),
            state_topics_replay: crate::mqtt::mirror::ReplayLimits {
                max_per_subscribe: n.state_topics_replay_max.max(1),
                per_client: n.state_topics_replays_per_client.max(1),
                total: n.state_topics_replays_total.max(1),
                window: n.state_topics_replay_window.max(1),
            },
            mqtt_connect_timeout: Duration::from_secs(n.mqtt_connect_timeout_secs.max(1)),
            http: ListenerLimits {
                max_connections: n.http_max_connections.max(1),
                handshake_timeout,
                first_byte_timeout: None,
            },
            http_max_inflight: n.http_max_inflight.max(1),
            http_max_streams: n.http_max_streams.max(1),
            http_max_inflight_bytes: n.http_max_inflight_bytes.max(1),
            http_header_timeout: Duration::from_secs(n.http_header_timeout_secs.max(1)),
            grpc: ListenerLimits {
                max_connections: n.grpc_max_connections.max(1),
                handshake_timeout,
                first_byte_timeout: Some(grpc_keepalive),
            },
            grpc_max_inflight: n.grpc_max_inflight.max(1),
            grpc_max_streams: n.grpc_max_streams.max(1),
            grpc_max_inflight_bytes: n.grpc_max_inflight_bytes.max(1),
            grpc_max_streams_per_connection: n.grpc_max_streams_per_connection.max(1),
            grpc_keepalive,
        })
    }
}
