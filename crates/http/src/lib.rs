//! The HTTP door: the Dapr state API (`/v1.0/state/...`), server-sent change events, health,
//! metadata, the service status, the OpenAPI document and the web console.
//!
//! - `state.rs`: the state routes; `sse.rs`: change events; `lock.rs`, `configuration.rs`:
//!   the Dapr lock and configuration APIs; `election.rs`: leader election (an extension);
//!   `status.rs`: the service status; `ui.rs`: the web console's embedded files
//!   (`crates/http/ui/`); `dto.rs`: JSON shapes (the only place that derives serde/utoipa
//!   traits); `error.rs`: Dapr's error body and the error mapping.

use stategate_access as access;
use stategate_dapr as dapr;
use stategate_engine as engine;
use stategate_engine::health;
use stategate_hlc as hlc;
use stategate_net::listener;
use stategate_storage as storage;
use stategate_storage::dump;
use stategate_telemetry::metrics;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::watch;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::access::Grant;
use crate::dapr::{DaprSettings, StoreSpec};
use crate::engine::Engine;
use crate::listener::Listener;
use crate::listener::inflight::InFlight;

mod browser;
mod conditions;
mod configuration;
pub mod dto;
mod election;
pub mod error;
mod gate;
mod lock;
pub mod observe;
mod sse;
mod state;
pub mod status;
pub mod transfer;
pub mod ui;

pub use browser::BrowserPolicy;
use error::{ApiError, Op};
pub use gate::{Gate, GateSettings, TOO_MANY_REQUESTS};
pub use status::ServiceInfo;

/// HTTP door settings (what the Dapr APIs of both doors share is [`DaprSettings`]).
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// When set, every route but health needs header `dapr-api-token` with this value (or
    /// one of the named tokens of the access files).
    pub api_token: Option<String>,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// Longest a request may take before it is answered 408 (server-sent events excepted).
    pub request_timeout: Duration,
    /// Serve the web console at `/ui`.
    pub ui: bool,
    /// Most requests executing at once (event streams excepted); past it 503.
    pub max_inflight: usize,
    /// Most server-sent event streams open at once; past it 503.
    pub max_streams: usize,
    /// How long the online backup's stream waits for its client to take the next chunk; past
    /// it the backup ends and the stream is cut short (`--backup-send-timeout`).
    pub backup_send_timeout: Duration,
    /// What the door accepts from web browsers (`Origin` and `Host` checks).
    pub browser: BrowserPolicy,
}

impl Default for HttpSettings {
    fn default() -> HttpSettings {
        HttpSettings {
            api_token: None,
            body_limit: 4 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            ui: true,
            max_inflight: 1024,
            max_streams: 1024,
            backup_send_timeout: Duration::from_secs(30),
            browser: BrowserPolicy::default(),
        }
    }
}

/// Shared state of the handlers: one `Arc`, because a handler's `State` extractor clones it
/// for every request.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What [`AppState`] shares.
pub struct Shared {
    engine: Engine,
    settings: Arc<HttpSettings>,
    dapr: Arc<DaprSettings>,
    info: Arc<ServiceInfo>,
    obs: crate::health::Observe,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    fn store(&self, name: &str, op: Op) -> Result<&StoreSpec, ApiError> {
        self.dapr.stores.get(name).map_err(|e| ApiError::from_dapr(op, e))
    }

    fn lock_store(&self, name: &str, op: Op) -> Result<&StoreSpec, ApiError> {
        self.dapr
            .lock_stores
            .get_kind(name, "lock")
            .map_err(|e| ApiError::from_dapr(op, e))
    }

    fn configuration_store(&self, name: &str, op: Op) -> Result<&StoreSpec, ApiError> {
        self.dapr
            .configuration_stores
            .get_kind(name, "configuration")
            .map_err(|e| ApiError::from_dapr(op, e))
    }
}

/// Path parameters; a segment that does not decode is a Dapr-shaped 400.
pub struct DaprPath<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for DaprPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<DaprPath<T>, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(p) => Ok(DaprPath(p.0)),
            Err(e) => Err(ApiError::malformed(e.body_text())),
        }
    }
}

/// Query parameters as pairs; a query that does not decode is a Dapr-shaped 400.
pub struct DaprQuery(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for DaprQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<DaprQuery, ApiError> {
        match axum::extract::Query::<Vec<(String, String)>>::from_request_parts(parts, state).await {
            Ok(q) => Ok(DaprQuery(q.0)),
            Err(e) => Err(ApiError::malformed(e.body_text())),
        }
    }
}

/// A request body within the configured limit; anything else is a Dapr-shaped error.
pub struct Body(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Body, ApiError> {
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(Body(b)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                error::MALFORMED,
                "the request body is larger than the configured limit",
            )),
            Err(e) => Err(ApiError::malformed(format!("cannot read the request body: {e}"))),
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "stategate HTTP API",
        description = "The Dapr state API served by stategate. ETags are the keys' HLC versions \
                       (`{ms:015}:{counter:05}:{node}`), shared with the MQTT and gRPC doors.",
        license(name = "MIT OR Apache-2.0")
    ),
    // Named by parameters as well as by bodies.
    components(schemas(dto::DaprKey, dto::Version, dto::Etag, dto::WriteMetadata)),
    tags(
        (name = "state", description = "Dapr state API"),
        (name = "lock", description = "Dapr distributed lock API (alpha), with fencing tokens"),
        (name = "configuration", description = "Dapr configuration API over the same keys"),
        (name = "health", description = "Health probes"),
        (name = "metadata", description = "Stores and features"),
        (name = "stategate", description = "stategate extensions"),
    )
)]
struct ApiDoc;

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(state::save_state))
        .routes(routes!(state::get_state, state::delete_state))
        .routes(routes!(state::bulk_get, state::get_bulk_key, state::delete_bulk_key))
        .routes(routes!(
            state::transaction,
            state::get_transaction_key,
            state::delete_transaction_key
        ))
        .routes(routes!(state::query_state))
        .routes(routes!(state::list_keys))
        .routes(routes!(sse::subscribe))
        .routes(routes!(lock::try_lock))
        .routes(routes!(lock::unlock))
        .routes(routes!(election::campaign))
        .routes(routes!(election::proclaim))
        .routes(routes!(election::resign))
        .routes(routes!(election::leader))
        .routes(routes!(election::observe))
        .routes(routes!(configuration::get_configuration))
        .routes(routes!(configuration::subscribe_configuration))
        .routes(routes!(configuration::unsubscribe_configuration))
        .routes(routes!(state::healthz))
        .routes(routes!(state::healthz_outbound))
        .routes(routes!(state::metadata))
        .routes(routes!(status::status))
        .routes(routes!(transfer::export))
        .routes(routes!(transfer::import))
        .routes(routes!(transfer::backup))
}

/// The OpenAPI document of the HTTP door.
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes().split_for_parts().1
}

/// The OpenAPI document as the committed `openapi/openapi.json` holds it: [`openapi`] with the
/// rules utoipa's types cannot hold ([`conditions`]).
pub fn openapi_json() -> String {
    let rendered = serde_json::to_value(openapi()).map(|mut doc| {
        conditions::apply(&mut doc);
        doc
    });
    let mut s = rendered
        .and_then(|doc| serde_json::to_string_pretty(&doc))
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// The HTTP door: its router behind the [`Gate`]. `info` is what the status route reports
/// about the service.
pub fn router(engine: Engine, settings: HttpSettings, dapr: DaprSettings, info: ServiceInfo) -> Gate {
    let inflight = InFlight::new(settings.max_inflight, settings.max_streams);
    router_observed(
        engine,
        settings,
        dapr,
        info,
        inflight,
        crate::health::Observe::default(),
    )
}

/// [`router`] counting requests in `inflight` (tests read it to know a request is in flight),
/// with metrics, readiness and the shutdown signal (streams end when it fires).
pub fn router_observed(
    engine: Engine,
    settings: HttpSettings,
    dapr: DaprSettings,
    info: ServiceInfo,
    inflight: InFlight,
    obs: crate::health::Observe,
) -> Gate {
    let settings = Arc::new(settings);
    let dapr = Arc::new(dapr);
    let gate = GateSettings {
        metrics: obs.metrics.clone(),
        browser: settings.browser.clone(),
        inflight,
        request_timeout: settings.request_timeout,
        access: dapr.access.clone(),
        ui: settings.ui,
    };
    let state = AppState(Arc::new(Shared {
        engine,
        settings: settings.clone(),
        dapr,
        info: Arc::new(info),
        obs,
    }));
    let (mut router, _) = routes().split_for_parts();
    router = router.merge(observe::routes());
    if settings.ui {
        router = router.merge(ui::routes());
    }
    let doc = openapi_json();
    router = configuration::alpha_routes(router);
    let router = router
        .route(
            "/openapi.json",
            axum::routing::get(move || async move { ([(header::CONTENT_TYPE, "application/json")], doc) }),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(settings.body_limit))
        .with_state(state);
    Gate::new(router, gate)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "ERR_NOT_FOUND", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "ERR_METHOD_NOT_ALLOWED",
        "the method is not allowed on this route",
    )
}

/// The caller's permissions, as the [`Gate`] found them.
pub struct Caller(pub Grant);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Caller, ApiError> {
        parts
            .extensions
            .get::<Grant>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "ERR_INTERNAL", "no caller identity"))
    }
}

/// Serves `router` over HTTP/1.1 on `listener` (plain or TLS, with its connection limit) until
/// `stop` changes; then open connections finish their current request and close.
///
/// hyper's `header_read_timeout` runs whenever a connection waits for a request head: it bounds
/// a slow client's headers and a kept-alive connection's idle time alike (not an open response,
/// so event streams are not cut).
pub async fn serve<S>(listener: Listener, router: S, header_timeout: Duration, stop: watch::Receiver<bool>)
where
    S: tower::Service<hyper::Request<hyper::body::Incoming>, Response = Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    // Dapr ignores a trailing slash; trimming must happen before routing, so it wraps the router.
    let app = tower::Layer::layer(
        &tower_http::normalize_path::NormalizePathLayer::trim_trailing_slash(),
        router,
    );
    let conn_stop = stop.clone();
    listener
        .run(stop, move |conn| {
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            let mut stop = conn_stop.clone();
            async move {
                let peer = conn.peer();
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(header_timeout);
                let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(conn), service);
                let mut conn = std::pin::pin!(conn);
                let result = tokio::select! {
                    r = conn.as_mut() => r,
                    _ = stop.changed() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = result {
                    tracing::debug!(%peer, cause = %e, "HTTP connection ended");
                }
            }
        })
        .await
}
