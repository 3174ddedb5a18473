//! Command line and configuration. Every flag is also an environment variable `STATEGATE_*`.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod error;
pub mod file;

use crate::access::{AccessSettings, LimitSettings};
use crate::dapr::{StoreSpec, Stores};
use crate::engine::{FeedLimits, Limits, ObserverLimits};
use crate::http::HttpSettings;
use crate::mqtt::door::DoorLimits;
use crate::mqtt::service::{MqttClientTls, MqttSettings};
use crate::storage::durable::FsyncMode;
use crate::storage::{RedisOptions, StorageConfig, StorageKind};
pub use error::ConfigError;
pub use file::{FileError, LayerError, Layered};

mod args;
mod net;
mod url;

pub use args::ServeArgs;
pub use net::{CertIdentity, MqttTlsListener, NetArgs, NetSettings, TlsFiles};
pub use url::{BrokerUrl, MqttCredentials, mask_url_password, parse_broker_url, parse_mqtt_url};

#[derive(Debug, Parser)]
#[command(
    name = "stategate",
    version,
    about = "A state store served over MQTT5, HTTP and gRPC",
    long_about = "A state store served over MQTT5, HTTP and gRPC.\n\n`stategate` alone (or `stategate serve`) runs \
                  the service; the other commands are a client of a running service.",
    after_help = crate::cli::args::EXIT_CODES,
    // `stategate --storage memory get k` is a mistake, not a get: serve flags go without a
    // client command.
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<CliCommand>,
    /// `serve` flags, accepted without the subcommand too.
    #[command(flatten)]
    pub serve: ServeArgs,
}

// Parsed once at startup: the size of the serve variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Run the service (the default).
    Serve(ServeArgs),
    /// The configuration file: `stategate config default` prints one with every setting.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Add, replace (or with --delete remove) a user in an MQTT password file
    /// (--mqtt-auth-file); the password is read from standard input.
    Passwd(crate::access::passwd::PasswdArgs),
    /// The client commands (`get`, `set`, ...).
    #[command(flatten)]
    Client(crate::cli::args::ClientCommand),
}

/// `stategate config ...`
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print a commented configuration file with every setting and its default.
    Default,
}

/// Settings a SIGHUP applies at once (the others are reported and need a restart). Parts that
/// follow the configuration ([`crate::Running::config_updates`]) add their flags here.
pub const LIVE_SETTINGS: &[&str] = &[
    "log-level",
    "rate-limit",
    "rate-limit-burst",
    "max-streams-per-principal",
];

pub use crate::telemetry::LogFormat;

/// Where the MQTT door gets its broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerChoice {
    /// The embedded broker; requests are served inside it unless `client_path`.
    Embedded {
        listen: SocketAddr,
        client_path: bool,
    },
    External {
        host: String,
        port: u16,
    },
}

/// The validated configuration of a running service.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_id: String,
    pub broker: BrokerChoice,
    pub mqtt: MqttSettings,
    pub limits: Limits,
    /// Where the HTTP door listens (`None`: off).
    pub http_listen: Option<SocketAddr>,
    pub http: HttpSettings,
    /// What the Dapr APIs of the HTTP and gRPC doors share.
    pub dapr: crate::dapr::DaprSettings,
    pub storage: StorageConfig,
    /// Where the gRPC door listens (`None`: off).
    pub grpc_listen: Option<SocketAddr>,
    /// Unix socket of the Dapr pluggable state component (`None`: off).
    pub dapr_component_socket: Option<std::path::PathBuf>,
    /// TLS and listener limits.
    pub net: NetSettings,
    /// Access files and per-principal limits (loaded by `lib::start`, with `http.api_token`).
    pub access: AccessSettings,
    pub ops: OpsSettings,
}

/// Logs, metrics and shutdown.
#[derive(Debug, Clone, PartialEq)]
pub struct OpsSettings {
    /// The log filter (`--log-level`, else env RUST_LOG, else `info`).
    pub log_filter: String,
    pub log_format: LogFormat,
    /// Record metrics and serve `/metrics`.
    pub metrics: bool,
    /// A port of its own for `/metrics` (`None`: only on the HTTP door).
    pub metrics_listen: Option<SocketAddr>,
    pub shutdown_grace: Duration,
}

impl OpsSettings {
    /// A bare level applies to stategate's own records; anything else is a filter as is.
    pub fn log_filter(level: Option<&str>, rust_log: Option<&str>) -> String {
        const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
        match level.or(rust_log).map(str::trim).filter(|l| !l.is_empty()) {
            None => "stategate=info".into(),
            Some(l) if LEVELS.contains(&l.to_ascii_lowercase().as_str()) => format!("stategate={l}"),
            Some(filter) => filter.to_owned(),
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        // Defaults are valid by construction.
        Config::from_args(ServeArgs::default()).unwrap_or_else(|e| panic!("default config is invalid: {e}"))
    }
}

impl Config {
    pub fn from_args(a: ServeArgs) -> Result<Config, ConfigError> {
        let node_ok = (1..=64).contains(&a.node_id.len())
            && a.node_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !node_ok {
            return Err(ConfigError::BadNodeId(a.node_id));
        }
        if (a.mqtt_max_packet_bytes as usize) < a.max_value_bytes + a.max_key_bytes + 1024 {
            return Err(ConfigError::PacketTooSmall {
                packet: a.mqtt_max_packet_bytes,
                value: a.max_value_bytes,
            });
        }
        let broker = match &a.mqtt_url {
            None if cfg!(feature = "embedded-broker") => BrokerChoice::Embedded {
                listen: a.mqtt_listen,
                client_path: a.mqtt_client_path,
            },
            None => return Err(ConfigError::NoEmbeddedBroker),
            Some(url) => parse_mqtt_url(url)?,
        };
        let broker_url = match &a.mqtt_url {
            Some(url) => Some(parse_broker_url(url)?),
            None => None,
        };
        let external = matches!(broker, BrokerChoice::External { .. });
        // A share-group member asks for a clean session by default: a broker keeps routing
        // part of the group's requests to an offline member's persistent session (Mosquitto
        // does), so while a replica is down a share of the requests would go unanswered.
        let session_expiry_secs =
            a.mqtt_session_expiry_secs
                .unwrap_or(if a.mqtt_share_group.is_some() { 0 } else { 3600 });
        let state_topics = state_topics(a.state_topics.clone(), a.state_topics_set, &broker)?;
        let mqtt = MqttSettings {
            state_topics,
            client_id: a.mqtt_client_id,
            share_group: a.mqtt_share_group,
            max_packet_bytes: a.mqtt_max_packet_bytes,
            session_expiry: Duration::from_secs(session_expiry_secs),
            door: DoorLimits {
                max_inflight: a.mqtt_max_inflight.max(1),
                max_inflight_bytes: a.mqtt_max_inflight_bytes.max(1),
                max_inflight_per_caller: a.mqtt_max_inflight_per_client.max(1),
                max_queued_answers: a.mqtt_max_queued_answers.max(1),
                response_cache_bytes: a.mqtt_response_cache_bytes,
                ..DoorLimits::default()
            },
            tls: match &broker_url {
                Some(u) if u.tls => Some(MqttClientTls {
                    ca_file: a.net.mqtt_ca_file.clone(),
                }),
                _ => None,
            },
            credentials: broker_url.and_then(|u| u.credentials),
            ..MqttSettings::default()
        };
        let limits = Limits {
            max_keys: a.max_keys,
            max_key_bytes: a.max_key_bytes,
            max_value_bytes: a.max_value_bytes,
            // At least 2, so a scan over 100 keys always ends within 64 pages.
            scan_page: a.scan_page.max(2),
            mget_keys: usize::try_from(a.max_mget_keys).unwrap_or(usize::MAX),
            sliding_slack_percent: a.sliding_ttl_slack_percent,
            observers: ObserverLimits {
                per_client: a.max_observed_keys.max(1),
                // The embedded broker reports disconnects; only an external one needs idle expiry.
                idle: (external && a.observer_idle_secs > 0).then(|| Duration::from_secs(a.observer_idle_secs)),
                total: a.max_observers_total.max(1),
                queue_bytes: a.keynotify_queue_bytes.max(1),
                ..ObserverLimits::default()
            },
            feed: FeedLimits {
                max_events: a.watch_history_events,
                max_bytes: a.watch_history_bytes,
                max_age: Duration::from_secs(a.watch_history_secs),
            },
            record_cache_bytes: a.redis_record_cache_bytes,
        };
        let http_listen = parse_listen("--http-listen", &a.http_listen)?;
        let grpc_listen = parse_listen("--grpc-listen", &a.grpc_listen)?;
        let stores = |given: &[String], default: &str, flag: &'static str| -> Result<Stores, ConfigError> {
            let given: Vec<&str> = if given.is_empty() {
                vec![default]
            } else {
                given.iter().map(String::as_str).collect()
            };
            let specs = given
                .into_iter()
                .map(|s| {
                    s.parse::<StoreSpec>()
                        .map_err(|e| ConfigError::BadStore { flag, reason: e })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Stores::new(specs))
        };
        let dapr = crate::dapr::DaprSettings {
            stores: stores(&a.state_stores, "statestore", "--state-store")?,
            lock_stores: stores(&a.lock_stores, "lockstore", "--lock-store")?,
            configuration_stores: stores(&a.configuration_stores, "configstore", "--configuration-store")?,
            max_bulk_keys: a.max_bulk_keys.max(1),
            max_campaign_wait: a.election_max_wait,
            max_transaction_ops: a.max_transaction_ops.max(1),
            app_id: a.node_id.clone(),
            ..crate::dapr::DaprSettings::default()
        };
        let http = HttpSettings {
            api_token: a.api_token.filter(|t| !t.is_empty()),
            body_limit: a.http_body_limit,
            backup_send_timeout: a.backup_send_timeout.max(Duration::from_millis(1)),
            ui: !a.no_ui,
            browser: crate::http::BrowserPolicy {
                allowed_origins: a.http_allowed_origins,
                loopback_hosts_only: http_listen.is_some_and(|addr| addr.ip().is_loopback()),
                allowed_hosts: a.http_allowed_hosts,
            },
            ..HttpSettings::default()
        };
        if a.encryption_key_file.is_some() && a.storage != StorageKind::Durable {
            return Err(ConfigError::EncryptionNeedsDurable);
        }
        let access = AccessSettings {
            mqtt_auth_file: a.mqtt_auth_file,
            acl_file: a.acl_file,
            acl_cache_principals: a.acl_cache_principals,
            api_token_file: a.api_token_file,
            trust_src_id: a.mqtt_trust_src_id,
            bind_client_id: a.mqtt_bind_client_id,
            limits: LimitSettings {
                rate_per_sec: NonZeroU32::new(a.rate_limit),
                burst: NonZeroU32::new(a.rate_limit_burst),
                max_streams: (a.max_streams_per_principal > 0).then_some(a.max_streams_per_principal),
            },
        };
        match &broker {
            BrokerChoice::External { .. } if access.mqtt_auth_file.is_some() => {
                return Err(ConfigError::AuthNeedsEmbeddedBroker);
            }
            BrokerChoice::Embedded { client_path: true, .. } if access.mqtt_auth_file.is_some() => {
                return Err(ConfigError::AuthWithClientPath);
            }
            BrokerChoice::Embedded { .. } if access.trust_src_id => return Err(ConfigError::TrustNeedsExternalBroker),
            BrokerChoice::External { .. } if access.bind_client_id => return Err(ConfigError::BindNeedsEmbeddedBroker),
            // Without either, every identity is whatever its client typed: binding would bind
            // ids to nothing anyone verified.
            BrokerChoice::Embedded { .. }
                if access.bind_client_id && access.mqtt_auth_file.is_none() && a.net.mqtt_tls_client_ca.is_none() =>
            {
                return Err(ConfigError::BindNeedsVerifiedIdentities);
            }
            _ => {}
        }
        // Malformed files are refused at startup (exit 64), naming the file and line.
        crate::access::Access::load(&access, http.api_token.as_deref())?;
        let storage = StorageConfig {
            kind: a.storage,
            data_dir: a.data_dir,
            fsync: a.fsync,
            encryption_key_file: a.encryption_key_file,
            segment_bytes: a.segment_bytes.max(4096),
            redis: RedisOptions {
                prefix: a.redis_prefix,
                // A zero bound would fail every call.
                timeout: Duration::from_millis(a.redis_timeout_ms.max(1)),
                wait_replicas: a.redis_wait_replicas,
                startup_wait: Duration::from_secs(a.redis_startup_wait_secs),
                change_log_len: a.redis_change_log_len.max(1),
                member_timeout: Duration::from_millis(a.redis_member_timeout_ms.max(50)),
            },
        };
        let net = NetSettings::from_args(&a.net)?;
        if net.mqtt_tls.is_none() && a.net.mqtt_tls_client_ca.is_some() {
            return Err(ConfigError::ClientCaWithoutListener);
        }
        let metrics_listen = parse_listen("--metrics-listen", &a.metrics_listen)?;
        if !a.net.allow_insecure_listen {
            let tls = net.tls.is_some();
            let mut plain: Vec<(&'static str, SocketAddr, &'static str)> = Vec::new();
            if let BrokerChoice::Embedded { listen, .. } = &broker {
                plain.push(("--mqtt-listen", *listen, "--tls-cert/--tls-key and --mqtt-tls-listen"));
            }
            if !tls {
                let hint = "--tls-cert/--tls-key";
                plain.extend(http_listen.map(|addr| ("--http-listen", addr, hint)));
                plain.extend(grpc_listen.map(|addr| ("--grpc-listen", addr, hint)));
            }
            // The metrics listener never has TLS: beyond loopback it is plain whatever is set.
            plain.extend(metrics_listen.map(|addr| {
                (
                    "--metrics-listen",
                    addr,
                    "/metrics on the HTTP door (which takes --tls-cert/--tls-key)",
                )
            }));
            if let Some((flag, addr, tls_hint)) = plain.into_iter().find(|(_, addr, _)| !addr.ip().is_loopback()) {
                return Err(ConfigError::InsecureListen { flag, addr, tls_hint });
            }
        }
        let log_filter = OpsSettings::log_filter(a.log_level.as_deref(), std::env::var("RUST_LOG").ok().as_deref());
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log_filter) {
            return Err(ConfigError::BadLogFilter(log_filter, e.to_string()));
        }
        let ops = OpsSettings {
            log_filter,
            log_format: a.log_format,
            metrics: !a.no_metrics,
            metrics_listen,
            shutdown_grace: a.shutdown_grace,
        };
        Ok(Config {
            net,
            ops,
            node_id: a.node_id,
            broker,
            mqtt,
            limits,
            http_listen,
            http,
            dapr,
            storage,
            grpc_listen,
            dapr_component_socket: a.dapr_component_socket,
            access,
        })
    }
}

/// The state topics mirror asked for: a usable prefix, and set-by-publish only where the
/// PUBACK is the service's (in-broker serving).
fn state_topics(
    prefix: Option<String>,
    set_by_publish: bool,
    broker: &BrokerChoice,
) -> Result<Option<crate::mqtt::mirror::StateTopics>, ConfigError> {
    let in_broker = matches!(broker, BrokerChoice::Embedded { client_path: false, .. });
    let Some(prefix) = prefix else {
        return match set_by_publish {
            true => Err(ConfigError::StateTopicsSetNeedsInBroker),
            false => Ok(None),
        };
    };
    if let Err(reason) = crate::mqtt::mirror::check_prefix(&prefix) {
        return Err(ConfigError::BadStateTopics { prefix, reason });
    }
    if set_by_publish && !in_broker {
        return Err(ConfigError::StateTopicsSetNeedsInBroker);
    }
    Ok(Some(crate::mqtt::mirror::StateTopics {
        prefix,
        set_by_publish,
        external_broker: matches!(broker, BrokerChoice::External { .. }),
    }))
}

fn parse_listen(flag: &'static str, value: &str) -> Result<Option<SocketAddr>, ConfigError> {
    match value {
        "off" | "" => Ok(None),
        other => other.parse().map(Some).map_err(|_| ConfigError::BadListen {
            flag,
            value: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests;
