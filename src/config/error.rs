//! What a bad setting is called, and which setting it is about.

use std::net::SocketAddr;

/// A bad flag value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A broker URL that does not parse, or names TLS this build lacks (the password masked).
    #[error(transparent)]
    MqttUrl(#[from] stategate_net::url::BadUrl),
    #[error(
        "{flag} {addr} is a plain (non-TLS) listener beyond loopback: anyone who can reach it could read and \
         write every key. Use TLS ({tls_hint}), bind it to 127.0.0.1, or pass --allow-insecure-listen"
    )]
    InsecureListen {
        flag: &'static str,
        addr: SocketAddr,
        tls_hint: &'static str,
    },
    #[error("--mqtt-tls-client-ca needs the embedded broker's TLS listener (--tls-cert, --mqtt-tls-listen)")]
    ClientCaWithoutListener,
    #[error(
        "--node-id must be 1 to 64 ASCII letters, digits, '-', '_' or '.' (it is part of every version, event id and log line; got {0:?})"
    )]
    BadNodeId(String),
    #[error("--mqtt-max-packet-bytes ({packet}) must exceed --max-value-bytes ({value}) plus the key and envelope")]
    PacketTooSmall { packet: u32, value: usize },
    #[error("the embedded broker is not built in (cargo feature `embedded-broker`): give --mqtt-url")]
    NoEmbeddedBroker,
    #[error("{flag} must be an address like 127.0.0.1:3500, or off (got {value:?})")]
    BadListen { flag: &'static str, value: String },
    #[error("{flag}: {reason}")]
    BadStore { flag: &'static str, reason: String },
    #[error("--log-level {0:?} is not a level or a filter: {1}")]
    BadLogFilter(String, String),
    #[error(
        "--encryption-key-file applies to --storage durable only (Redis keeps its own data: use its TLS and disk encryption)"
    )]
    EncryptionNeedsDurable,
    #[error("{0}")]
    Access(#[from] crate::access::FileError),
    #[error("--mqtt-auth-file needs the embedded broker (an external broker authenticates its own clients)")]
    AuthNeedsEmbeddedBroker,
    #[error(
        "--mqtt-auth-file cannot be combined with --mqtt-client-path (the service would need a password of its own)"
    )]
    AuthWithClientPath,
    #[error("--mqtt-trust-src-id is for an external broker (the embedded one knows every client's id)")]
    TrustNeedsExternalBroker,
    #[error("--mqtt-bind-client-id needs the embedded broker (an external broker checks its own client ids)")]
    BindNeedsEmbeddedBroker,
    #[error(
        "--mqtt-bind-client-id needs identities someone verified: --mqtt-auth-file (passwords) or --mqtt-tls-client-ca (client certificates); without either a client's identity is whatever it types"
    )]
    BindNeedsVerifiedIdentities,
    #[error("--state-topics {prefix:?} {reason}")]
    BadStateTopics { prefix: String, reason: &'static str },
    #[error(
        "--state-topics-set needs --state-topics and the embedded broker serving in-broker (no --mqtt-url, no --mqtt-client-path): only there does the PUBACK carry the service's answer"
    )]
    StateTopicsSetNeedsInBroker,
}

impl ConfigError {
    /// The setting (flag long name, configuration file key) the error is about; `None` for an
    /// access file's own error (its message names that file and line).
    pub fn setting(&self) -> Option<&'static str> {
        Some(match self {
            ConfigError::MqttUrl(_) | ConfigError::NoEmbeddedBroker => "mqtt-url",
            ConfigError::BadNodeId(_) => "node-id",
            ConfigError::PacketTooSmall { .. } => "mqtt-max-packet-bytes",
            ConfigError::BadListen { flag, .. } => flag.trim_start_matches("--"),
            ConfigError::BadStore { flag, .. } | ConfigError::InsecureListen { flag, .. } => {
                flag.trim_start_matches("--")
            }
            ConfigError::ClientCaWithoutListener => "mqtt-tls-client-ca",
            ConfigError::BadLogFilter(..) => "log-level",
            ConfigError::Access(_) => return None,
            ConfigError::AuthNeedsEmbeddedBroker | ConfigError::AuthWithClientPath => "mqtt-auth-file",
            ConfigError::TrustNeedsExternalBroker => "mqtt-trust-src-id",
            ConfigError::BindNeedsEmbeddedBroker | ConfigError::BindNeedsVerifiedIdentities => "mqtt-bind-client-id",
            ConfigError::BadStateTopics { .. } => "state-topics",
            ConfigError::StateTopicsSetNeedsInBroker => "state-topics-set",
            ConfigError::EncryptionNeedsDurable => "encryption-key-file",
        })
    }
}
