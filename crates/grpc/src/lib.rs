//! The gRPC doors, on one TCP port: `statestore.v1` (native, with a streaming Watch), the Dapr
//! runtime state RPCs, health and reflection; and on a Unix socket: the Dapr pluggable state
//! component API (with reflection, which daprd uses to discover it).
//!
//! - `native.rs`, `election.rs` (statestore.v1), `runtime.rs`, `component.rs`: the services;
//!   `error.rs`: the status mapping.

use stategate_access as access;
use stategate_dapr as dapr;
use stategate_engine as engine;
use stategate_hlc as hlc;
use stategate_net::listener;
use stategate_telemetry::metrics;

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::service::Interceptor;
use tonic::transport::Server;
use tonic::{Request, Status};

use crate::access::{Access, Grant, Refusal};
use crate::dapr::DaprSettings;
use crate::dapr::StoreSpec;
use crate::engine::Engine;
use crate::listener::Listener;
use crate::listener::inflight::InFlight;

mod component;
mod election;
pub mod error;
pub mod health;
mod limit;
mod native;
mod observe;
mod runtime;

/// Generated protobuf and tonic code.
pub use stategate_proto as pb;

use pb::dapr::proto::components::v1 as cpb;
use pb::dapr::proto::runtime::v1 as rpb;
use pb::statestore::v1 as npb;

/// Largest gRPC message accepted, bytes (values up to the engine's limit fit).
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Who is calling: checks `dapr-api-token` when tokens are configured, takes one request from
/// the caller's rate, and hands the caller's [`Grant`] to the service in the request's
/// extensions (health and reflection stay open).
#[derive(Clone)]
struct Identify(Access);

impl Interceptor for Identify {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let given = req.metadata().get("dapr-api-token").and_then(|v| v.to_str().ok());
        let grant = self.0.admit_token(given).map_err(|r| match r {
            Refusal::BadToken => Status::unauthenticated("invalid api token"),
            Refusal::Limited(e) => error::from_engine(error::Surface::Native, e),
        })?;
        req.extensions_mut().insert(grant);
        Ok(req)
    }
}

/// The caller's permissions, as [`Identify`] found them.
fn grant_of<T>(req: &Request<T>) -> Result<Grant, Status> {
    req.extensions()
        .get::<Grant>()
        .cloned()
        .ok_or_else(|| Status::internal("no caller identity"))
}

/// Reflection over every descriptor (so any message can be described) that lists only the
/// services a listener really serves: `services`.
fn reflection(services: &[&str]) -> tonic_reflection::server::Builder<'static> {
    services.iter().fold(
        tonic_reflection::server::Builder::configure().register_encoded_file_descriptor_set(pb::DESCRIPTOR_SET),
        |b, s| b.with_service_name(*s),
    )
}

fn reflection_v1(
    services: &[&str],
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    tonic_reflection::server::Error,
> {
    reflection(services).build_v1()
}

fn reflection_v1alpha(
    services: &[&str],
) -> Result<
    tonic_reflection::server::v1alpha::ServerReflectionServer<impl tonic_reflection::server::v1alpha::ServerReflection>,
    tonic_reflection::server::Error,
> {
    reflection(services).build_v1alpha()
}

/// The services of the TCP door, as reflection lists them.
pub const TCP_SERVICES: &[&str] = &[
    npb::state_store_server::SERVICE_NAME,
    npb::election_server::SERVICE_NAME,
    rpb::dapr_server::SERVICE_NAME,
];
/// The services of the component socket (what daprd discovers).
const COMPONENT_SERVICES: &[&str] = &[
    cpb::state_store_server::SERVICE_NAME,
    cpb::transactional_state_store_server::SERVICE_NAME,
    cpb::queriable_state_store_server::SERVICE_NAME,
    cpb::transactional_store_multi_max_size_server::SERVICE_NAME,
];

/// Why a gRPC door failed.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("grpc reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("grpc transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("dapr component socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How the TCP gRPC door bounds its work (the listener bounds its connections).
#[derive(Debug, Clone)]
pub struct GrpcLimits {
    /// Calls and streams in flight for the whole door.
    pub inflight: InFlight,
    /// HTTP/2 streams one connection may have open.
    pub max_streams_per_connection: u32,
    /// HTTP/2 keep-alive ping interval, and how long a ping may go unanswered.
    pub keepalive: Duration,
}

impl Default for GrpcLimits {
    fn default() -> GrpcLimits {
        GrpcLimits {
            inflight: InFlight::new(1024, 1024),
            max_streams_per_connection: 256,
            keepalive: Duration::from_secs(30),
        }
    }
}

/// Aborts a task when dropped (the accept loop dies with the server that consumes it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connections handed from the listener to tonic and not yet taken by it. Small: a connection
/// waiting here already holds its listener slot, so the listener's limit still bounds them.
const HANDOFF_QUEUE: usize = 16;

/// The services of the TCP door that take requests (`statestore.v1` and the Dapr runtime),
/// each behind the caller check: what [`serve_tcp`] serves besides health and reflection.
/// Public for the fuzz target (`fuzz/fuzz_targets/grpc_message.rs`), which drives the very
/// services a client reaches: prost decoding, then the conversion into engine and Dapr terms.
pub fn tcp_routes(engine: Engine, settings: Arc<DaprSettings>, obs: crate::health::Observe) -> tonic::service::Routes {
    let check = Identify(settings.access.clone());
    let election = npb::election_server::ElectionServer::new(election::Election {
        engine: engine.clone(),
        settings: settings.clone(),
        obs: obs.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let native = npb::state_store_server::StateStoreServer::new(native::Native {
        engine: engine.clone(),
        access: settings.access.clone(),
        obs,
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let runtime = rpb::dapr_server::DaprServer::new(runtime::Runtime { engine, settings })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::service::Routes::new(tonic::service::interceptor::InterceptedService::new(
        native,
        check.clone(),
    ))
    .add_service(tonic::service::interceptor::InterceptedService::new(
        election,
        check.clone(),
    ))
    .add_service(tonic::service::interceptor::InterceptedService::new(runtime, check))
}

/// Serves the TCP gRPC door on `listener` (plain or TLS, with its connection limit) until
/// `stop` changes. `health` is the health service, whose reporter `lib::start` drives from
/// readiness ([`health::drive_grpc_health`]).
pub async fn serve_tcp<H: tonic_health::pb::health_server::Health>(
    engine: Engine,
    settings: Arc<DaprSettings>,
    listener: Listener,
    limits: GrpcLimits,
    obs: crate::health::Observe,
    health: tonic_health::pb::health_server::HealthServer<H>,
    stop: watch::Receiver<bool>,
) -> Result<(), GrpcError> {
    let layer = observe::ObserveLayer {
        metrics: obs.metrics.clone(),
        door: crate::metrics::Door::Grpc,
    };
    let routes = tcp_routes(engine, settings, obs)
        .add_service(health)
        .add_service(reflection_v1(TCP_SERVICES)?)
        .add_service(reflection_v1alpha(TCP_SERVICES)?);
    let (handoff, connections) = tokio::sync::mpsc::channel(HANDOFF_QUEUE);
    let _accept = AbortOnDrop(tokio::spawn(listener.run(stop.clone(), move |conn| {
        let handoff = handoff.clone();
        async move {
            // Fails only when the server has stopped: the connection is then dropped.
            let _ = handoff.send(conn).await;
        }
    })));
    let incoming = ReceiverStream::new(connections).map(Ok::<_, std::io::Error>);
    let mut stop = stop;
    let shutdown = async move {
        let _ = stop.changed().await;
    };
    Server::builder()
        .layer(layer)
        .layer(limit::InFlightLayer(limits.inflight))
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_keepalive_interval(Some(limits.keepalive))
        .http2_keepalive_timeout(Some(limits.keepalive))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// Binds the component socket (replacing a stale socket file left by a crash).
pub fn bind_component_socket(path: &std::path::Path) -> Result<UnixListener, GrpcError> {
    let socket_err = |source| GrpcError::Socket {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(socket_err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(socket_err(e)),
    }
    UnixListener::bind(path).map_err(socket_err)
}

/// The services of the Dapr pluggable state component API (health and reflection apart):
/// what [`serve_component`] serves. Public for the fuzz target, as [`tcp_routes`].
pub fn component_routes(engine: Engine, max_transaction_ops: usize, max_bulk_keys: usize) -> tonic::service::Routes {
    let component = component::Component {
        engine,
        store: Arc::new(StoreSpec::raw("stategate")),
        max_transaction_ops,
        max_bulk_keys,
    };
    tonic::service::Routes::new(
        cpb::state_store_server::StateStoreServer::new(component.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
    .add_service(cpb::transactional_state_store_server::TransactionalStateStoreServer::new(component.clone()))
    .add_service(cpb::queriable_state_store_server::QueriableStateStoreServer::new(
        component.clone(),
    ))
    .add_service(cpb::transactional_store_multi_max_size_server::TransactionalStoreMultiMaxSizeServer::new(component))
}

/// Serves the Dapr pluggable state component API on a bound Unix socket until `shutdown`.
pub async fn serve_component(
    engine: Engine,
    max_transaction_ops: usize,
    max_bulk_keys: usize,
    listener: UnixListener,
    metrics: crate::metrics::Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), GrpcError> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<cpb::state_store_server::StateStoreServer<component::Component>>()
        .await;
    Server::builder()
        .layer(observe::ObserveLayer {
            metrics,
            door: crate::metrics::Door::Component,
        })
        .add_routes(
            component_routes(engine, max_transaction_ops, max_bulk_keys)
                .add_service(health)
                .add_service(reflection_v1(COMPONENT_SERVICES)?)
                .add_service(reflection_v1alpha(COMPONENT_SERVICES)?),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}
