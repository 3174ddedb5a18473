//! stategate: one state store engine served over MQTT5 (the Azure IoT Operations state store
//! protocol), HTTP and gRPC.
//!
//! Layout (dependencies point downwards only):
//! - [`cli`]: the command-line client (`stategate get|set|...`), a client of the doors only.
//! - [`config`]: command line and validated configuration.
//! - [`mqtt`]: the MQTT5 door (request/response envelope, notifications, embedded broker).
//! - [`resp3`]: the sans-I/O payload codec the MQTT door speaks.
//! - [`engine`]: commands, rules, versions, fencing, expiry, change feed.
//! - [`storage`]: records behind a conditional-swap interface.
//! - [`dump`]: the export format (JSON lines) shared by the HTTP door and the client.
//! - [`hlc`]: hybrid logical clocks.
//! - [`listener`]: the HTTP and gRPC doors' listeners (TLS, connection and in-flight limits).
//! - [`tls`]: the crypto provider, certificates and their reload.
//! - `running.rs`: [`Running`], a started service (shutdown, reload).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use stategate_access as access;
pub use stategate_cli as cli;
pub mod config;
pub use stategate_dapr as dapr;
pub use stategate_engine as engine;
pub use stategate_engine::health;
pub use stategate_grpc as grpc;
pub use stategate_hlc as hlc;
pub use stategate_http as http;
pub use stategate_mqtt as mqtt;
pub use stategate_net::listener;
pub use stategate_resp3 as resp3;
pub use stategate_storage::dump;
pub use stategate_telemetry::metrics;
mod running;
pub use stategate_net::tls;
pub use stategate_storage as storage;
pub use stategate_telemetry as telemetry;
pub use stategate_telemetry::secret;

use config::{BrokerChoice, Config};
use engine::{Engine, EngineError};
use mqtt::service::{MqttService, MqttSettings};
use running::MqttDoor;
pub use running::{DoorLimits, Running};
use storage::Store;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("opening the engine: {0}")]
    Engine(#[from] EngineError),
    #[cfg(feature = "embedded-broker")]
    #[error("starting the embedded MQTT broker: {0}")]
    Broker(#[from] mqtt::broker::BrokerError),
    #[error("starting the gRPC door: {0}")]
    Grpc(#[from] grpc::GrpcError),
    #[error("binding the gRPC door to {addr}: {source}")]
    GrpcBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("binding the metrics listener to {addr}: {source}")]
    MetricsBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Access(#[from] access::FileError),
    #[error("binding the HTTP door to {addr}: {source}")]
    HttpBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
}

/// Starts the service on `store`; returns once every door is ready. The clock is the store's
/// when it has one shared by every process on it (Redis), else the system's.
pub async fn start(config: Config, store: Store) -> Result<Running, StartError> {
    let clock = store.backend().clock().unwrap_or_else(|| Arc::new(hlc::SystemClock));
    start_with_clock(config, store, clock).await
}

/// [`start`] with the clock every version, deadline and log record uses (open `store` with the
/// same one: [`Store::open_with_clock`]). Tests move a manual clock instead of waiting.
pub async fn start_with_clock(config: Config, store: Store, clock: Arc<dyn hlc::Clock>) -> Result<Running, StartError> {
    let metrics = metrics::Metrics::enabled(config.ops.metrics);
    start_observed(config, store, clock, metrics).await
}

/// [`start_with_clock`] recording in `metrics` (the registry `store` was opened with:
/// [`Store::open_observed`]).
pub async fn start_observed(
    mut config: Config,
    store: Store,
    clock: Arc<dyn hlc::Clock>,
    metrics: metrics::Metrics,
) -> Result<Running, StartError> {
    // One access handle for every door: tokens, rules and limits are decided in one place.
    let access = access::Access::load(&config.access, config.http.api_token.as_deref())?;
    config.dapr.access = access.clone();
    config.mqtt.access = access.clone();
    tls::install_provider();
    let engine = Engine::open(store, &config.node_id, clock, config.limits.clone()).await?;
    let (stop, stop_rx) = watch::channel(false);
    // One certificate for every TLS listener, reloaded in place (SIGHUP, file changes).
    let certs = match &config.net.tls {
        Some(files) => Some(tls::CertReloader::load(&files.cert, &files.key)?),
        None => None,
    };
    let cert_watcher = certs.as_ref().map(|c| c.spawn_watcher(stop_rx.clone()));
    let (config_tx, _) = watch::channel(Arc::new(config.clone()));
    let obs = health::Observe {
        metrics: metrics.clone(),
        sources: Arc::default(),
        stopping: stop_rx.clone(),
        engine: Some(engine.clone()),
        readiness_cache: Arc::default(),
    };
    obs.sources.add(Arc::new(engine.clone()));

    #[cfg(feature = "embedded-broker")]
    let mut broker = None;
    // Set only by the embedded broker (a build without it, such as the fuzz targets', never does).
    #[cfg_attr(not(feature = "embedded-broker"), allow(unused_mut))]
    let mut serve_in_broker = false;
    let (host, port) = match &config.broker {
        BrokerChoice::External { host, port } => (host.clone(), *port),
        #[cfg(feature = "embedded-broker")]
        BrokerChoice::Embedded { listen, client_path } => {
            let on_disconnect: mqtt::broker::OnDisconnect = {
                // rmqtt keeps its hooks after the broker stops: a strong handle here would keep
                // the engine (and its storage, locked) alive after shutdown.
                let engine = engine.downgrade();
                Arc::new(move |client: &str, session: u64| {
                    let Some(engine) = engine.upgrade() else {
                        return;
                    };
                    // On shared storage the drop goes through the shared log: not here.
                    let client = client.to_owned();
                    tokio::spawn(async move {
                        let n = engine.drop_client(&client, Some(session)).await;
                        if n > 0 {
                            tracing::debug!(
                                client,
                                keys = n,
                                "dropped KEYNOTIFY registrations of a disconnected client"
                            );
                        }
                    });
                })
            };
            let b = mqtt::broker::EmbeddedBroker::start(
                mqtt::broker::BrokerOptions {
                    listen: *listen,
                    max_packet_bytes: config.mqtt.max_packet_bytes,
                    receive_maximum: 1024,
                    default_message_expiry: None,
                    tls: match (&config.net.mqtt_tls, &certs) {
                        (Some(t), Some(c)) => Some(mqtt::broker::BrokerTls {
                            listen: t.listen,
                            cert: c.cert_path().to_owned(),
                            key: c.key_path().to_owned(),
                            client_ca: t.client_ca.clone(),
                            identity: t.identity,
                            reloads: Some(c.reloads()),
                        }),
                        _ => None,
                    },
                    max_connections: config.net.mqtt_max_connections,
                    max_queued_per_client: config.net.mqtt_max_queued_per_client,
                    state_topics_replay: config.net.state_topics_replay.clone(),
                    metrics: metrics.clone(),
                    connect_timeout: config.net.mqtt_connect_timeout,
                    guard: Some(mqtt::brokerauth::BrokerGuard {
                        access: access.clone(),
                        service_id: config.mqtt.client_id.clone(),
                        client_path: *client_path,
                        state_topics: config.mqtt.state_topics.clone(),
                    }),
                },
                on_disconnect,
            )
            .await?;
            let addr = b.local_addr();
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, auth = access.mqtt_auth_required(), "the embedded MQTT broker listens beyond loopback without TLS (--allow-insecure-listen)");
            }
            tracing::info!(%addr, "embedded MQTT broker listening");
            if let Some(tls_addr) = b.tls_addr() {
                tracing::info!(%tls_addr, "embedded MQTT broker listening for MQTTS");
            }
            broker = Some(b);
            serve_in_broker = !client_path;
            (connect_host(addr), addr.port())
        }
        #[cfg(not(feature = "embedded-broker"))]
        BrokerChoice::Embedded { .. } => unreachable!("config refuses the embedded broker when it is not built"),
    };

    let expiry = {
        let engine = engine.clone();
        let mut stop_rx = stop_rx.clone();
        tokio::spawn(async move {
            engine
                .run_expiry(async move {
                    let _ = stop_rx.changed().await;
                })
                .await
        })
    };

    // Bind every listener first, so the status route can name every door's real address.
    let http_tls = match &certs {
        Some(c) => Some(c.server_config(&[b"http/1.1"])?),
        None => None,
    };
    let grpc_tls = match &certs {
        Some(c) => Some(c.server_config(&[b"h2"])?),
        None => None,
    };
    let http_listener = match config.http_listen {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::HttpBind { addr, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| StartError::HttpBind { addr, source })?;
            Some((
                listener::Listener::new("http", listener, http_tls, config.net.http),
                bound,
            ))
        }
    };
    let grpc_listener = match config.grpc_listen {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::GrpcBind { addr, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| StartError::GrpcBind { addr, source })?;
            Some((
                listener::Listener::new("grpc", listener, grpc_tls, config.net.grpc),
                bound,
            ))
        }
    };
    let limits = DoorLimits {
        http_inflight: listener::inflight::InFlight::new(config.net.http_max_inflight, config.net.http_max_streams)
            .with_body_budget(config.net.http_max_inflight_bytes),
        grpc_inflight: listener::inflight::InFlight::new(config.net.grpc_max_inflight, config.net.grpc_max_streams)
            .with_body_budget(config.net.grpc_max_inflight_bytes),
        http_stats: http_listener.as_ref().map(|l| l.0.stats()),
        grpc_stats: grpc_listener.as_ref().map(|l| l.0.stats()),
        http_connections: http_listener.as_ref().map(|l| l.0.connection_slots()),
        grpc_connections: grpc_listener.as_ref().map(|l| l.0.connection_slots()),
    };

    let info = {
        #[cfg(feature = "embedded-broker")]
        let counter = broker
            .as_ref()
            .map(|b| Arc::new(b.connection_counter()) as http::status::ClientCounter);
        #[cfg(not(feature = "embedded-broker"))]
        let counter: Option<http::status::ClientCounter> = None;
        service_info(
            &config,
            (&host, port),
            http_listener.as_ref().map(|l| l.1),
            grpc_listener.as_ref().map(|l| l.1),
            counter,
        )
    };

    let (http_addr, http) = match http_listener {
        None => (None, None),
        Some((listener, bound)) => {
            let tls = listener.is_tls();
            if !bound.ip().is_loopback() {
                tracing::warn!(%bound, tls, token = access.tokens_required(), "the HTTP door listens beyond loopback");
            }
            tracing::info!(%bound, tls, "HTTP door (Dapr state API) listening");
            if config.http.ui {
                let scheme = if tls { "https" } else { "http" };
                tracing::info!(url = %format!("{scheme}://{bound}{}", http::ui::BASE), "web console");
            }
            let router = http::router_observed(
                engine.clone(),
                config.http.clone(),
                config.dapr.clone(),
                info,
                limits.http_inflight.clone(),
                obs.clone(),
            );
            let task = tokio::spawn(http::serve(
                listener,
                router,
                config.net.http_header_timeout,
                stop_rx.clone(),
            ));
            (Some(bound), Some(task))
        }
    };

    let dapr_settings = Arc::new(config.dapr.clone());
    let mut grpc_tasks = Vec::new();
    let mut grpc_health = None;
    let grpc_addr = match grpc_listener {
        None => None,
        Some((listener, bound)) => {
            let tls = listener.is_tls();
            if !bound.ip().is_loopback() {
                tracing::warn!(%bound, tls, token = access.tokens_required(), "the gRPC door listens beyond loopback");
            }
            tracing::info!(%bound, tls, "gRPC door (statestore.v1, Dapr runtime) listening");
            let (engine, settings, stop_rx) = (engine.clone(), dapr_settings.clone(), stop_rx.clone());
            let grpc_limits = grpc::GrpcLimits {
                inflight: limits.grpc_inflight.clone(),
                max_streams_per_connection: config.net.grpc_max_streams_per_connection,
                keepalive: config.net.grpc_keepalive,
            };
            let obs = obs.clone();
            let (reporter, health) = tonic_health::server::health_reporter();
            // tonic-health starts with "" serving; the door answers before `start` has checked
            // anything (it waits up to 10 s for an external broker), so it says not serving
            // until the readiness driver's first check passes.
            grpc::health::report(&reporter, grpc::TCP_SERVICES, false).await;
            grpc_health = Some(reporter);
            grpc_tasks.push(tokio::spawn(async move {
                if let Err(e) = grpc::serve_tcp(engine, settings, listener, grpc_limits, obs, health, stop_rx).await {
                    tracing::error!(cause = %e, "gRPC door stopped");
                }
            }));
            Some(bound)
        }
    };
    if let Some(path) = &config.dapr_component_socket {
        let listener = grpc::bind_component_socket(path)?;
        tracing::info!(path = %path.display(), "Dapr pluggable state component listening");
        let (engine, mut stop_rx, metrics) = (engine.clone(), stop_rx.clone(), metrics.clone());
        let (max_ops, max_bulk) = (config.dapr.max_transaction_ops, config.dapr.max_bulk_keys);
        grpc_tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop_rx.changed().await;
            };
            if let Err(e) = grpc::serve_component(engine, max_ops, max_bulk, listener, metrics, shutdown).await {
                tracing::error!(cause = %e, "Dapr component socket stopped");
            }
        }));
    }

    let mqtt = if serve_in_broker {
        #[cfg(feature = "embedded-broker")]
        match &broker {
            Some(b) => {
                let door = Arc::new(
                    mqtt::door::Door::new(engine.clone(), config.mqtt.client_id.clone(), config.mqtt.door.clone())
                        .with_access(access.clone())
                        .with_metrics(metrics.clone())
                        .with_state_topics(config.mqtt.state_topics.clone()),
                );
                tracing::info!("serving the state store inside the embedded broker");
                MqttDoor::InBroker(b.serve_in_broker(door).await)
            }
            None => unreachable!("in-broker serving is chosen only with the embedded broker"),
        }
        #[cfg(not(feature = "embedded-broker"))]
        unreachable!("in-broker serving needs the embedded broker")
    } else {
        let credentials = match &config.broker {
            // The embedded broker refuses the service's client id to anyone without this
            // process's secret (`brokerauth`).
            BrokerChoice::Embedded { .. } => Some(config::MqttCredentials {
                username: config.mqtt.client_id.clone(),
                password: access.service_password().to_owned(),
            }),
            BrokerChoice::External { .. } => config.mqtt.credentials.clone(),
        };
        let settings = MqttSettings {
            host: host.clone(),
            port,
            credentials,
            ..config.mqtt.clone()
        };
        MqttDoor::Client(
            MqttService::start_observed(engine.clone(), settings, Duration::from_secs(10), metrics.clone()).await?,
        )
    };
    obs.sources.add(match &mqtt {
        MqttDoor::Client(c) => c.door().clone(),
        #[cfg(feature = "embedded-broker")]
        MqttDoor::InBroker(i) => i.door().clone(),
    });
    #[cfg(feature = "embedded-broker")]
    if let Some(b) = &broker {
        obs.sources.add(b.gauge_source());
    }
    let metrics_task = match config.ops.metrics_listen {
        Some(addr) if metrics.is_enabled() => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::MetricsBind { addr, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| StartError::MetricsBind { addr, source })?;
            tracing::info!(%bound, "metrics listening at /metrics");
            let router = http::observe::metrics_router(obs.clone());
            let listener = listener::Listener::new("metrics", listener, None, listener::ListenerLimits::default());
            Some((
                bound,
                tokio::spawn(http::serve(
                    listener,
                    router,
                    config.net.http_header_timeout,
                    stop_rx.clone(),
                )),
            ))
        }
        _ => None,
    };
    drop(stop_rx);
    // Every door is up: the gRPC health service says so before `start` returns.
    if let Some(reporter) = grpc_health {
        let driver = grpc::health::drive_grpc_health(obs.clone(), reporter, grpc::TCP_SERVICES).await;
        grpc_tasks.push(tokio::spawn(driver));
    }
    Ok(Running {
        obs,
        config: config_tx,
        grace: config.ops.shutdown_grace,
        metrics_addr: metrics_task.as_ref().map(|m| m.0),
        metrics_task: metrics_task.map(|m| m.1),
        engine,
        access,
        mqtt_addr: (host, port),
        mqtt,
        #[cfg(feature = "embedded-broker")]
        broker,
        stop,
        expiry,
        http_addr,
        http,
        grpc_addr,
        grpc: grpc_tasks,
        certs,
        cert_watcher,
        limits,
        subscriptions: config.dapr.subscriptions.clone(),
    })
}

/// What the status route reports about the service: storage, doors, MQTT connections.
fn service_info(
    config: &Config,
    mqtt: (&str, u16),
    http: Option<SocketAddr>,
    grpc: Option<SocketAddr>,
    mqtt_clients: Option<http::status::ClientCounter>,
) -> http::ServiceInfo {
    let storage = match &config.storage.kind {
        storage::StorageKind::Memory => http::dto::StorageStatus {
            kind: "memory".into(),
            data_dir: None,
            fsync: None,
            redis: None,
        },
        storage::StorageKind::Durable => http::dto::StorageStatus {
            kind: "durable".into(),
            data_dir: Some(config.storage.data_dir.display().to_string()),
            fsync: Some(config.storage.fsync.to_string()),
            redis: None,
        },
        // The URL as displayed: any password is masked.
        storage::StorageKind::Redis(url) => http::dto::StorageStatus {
            kind: "redis".into(),
            data_dir: None,
            fsync: None,
            redis: Some(url.to_string()),
        },
    };
    let embedded = matches!(config.broker, BrokerChoice::Embedded { .. });
    let broker = if embedded { "embedded" } else { "external" };
    let mut info = http::ServiceInfo::new(&config.node_id, storage, broker);
    let (host, port) = mqtt;
    let mqtt_addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mqtt_detail = if embedded {
        "Azure IoT Operations state store protocol (embedded broker)"
    } else {
        "Azure IoT Operations state store protocol (external broker)"
    };
    info.door("mqtt", mqtt_addr, mqtt_detail);
    if let Some(a) = http {
        let detail = if config.http.ui {
            "Dapr state API, server-sent events, web console at /ui"
        } else {
            "Dapr state API, server-sent events"
        };
        info.door("http", a, detail);
    }
    if let Some(a) = grpc {
        info.door("grpc", a, "statestore.v1, Dapr runtime state API, health, reflection");
    }
    if let Some(p) = &config.dapr_component_socket {
        info.door(
            "dapr-component",
            p.display(),
            "Dapr pluggable state component (Unix socket)",
        );
    }
    info.mqtt_clients = mqtt_clients;
    info
}

/// The address a client uses to reach a listener (a wildcard address is reached on loopback).
#[cfg(feature = "embedded-broker")]
fn connect_host(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        "127.0.0.1".into()
    } else {
        addr.ip().to_string()
    }
}
