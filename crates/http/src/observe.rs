//! The HTTP door's operations routes (`/healthz`, `/readyz`, `/metrics`) and the middleware
//! that gives every request a span, a request id (`x-request-id`, honoured and returned) and
//! its place in the request metrics.

use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::Instrument;

use super::AppState;
use crate::health::Observe;
use crate::metrics::{Cmd, Door, Outcome};

pub use stategate_net::request_id::{MAX_REQUEST_ID, REQUEST_ID, new_request_id};

/// `/healthz`, `/readyz` and `/metrics`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// A router with only `/metrics` (and the probes), for `--metrics-listen`.
pub fn metrics_router(obs: Observe) -> Router {
    Router::new()
        .route("/metrics", get(move || render(obs.clone())))
        .fallback(|| async { StatusCode::NOT_FOUND })
}

/// Alive: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: storage reachable, MQTT subscribed, not shutting down. 503 otherwise; the body says
/// which check failed.
async fn readyz(State(st): State<AppState>) -> Response {
    let r = st.obs.readiness().await;
    let check = |c: &Result<(), String>| match c {
        Ok(()) => serde_json::Value::from("ok"),
        Err(e) => serde_json::Value::from(e.as_str()),
    };
    let body = serde_json::json!({
        "ready": r.ready(),
        "storage": check(&r.storage),
        "mqtt": check(&r.mqtt),
        "stopping": r.stopping,
    });
    let status = if r.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(st): State<AppState>) -> Response {
    render(st.obs.clone()).await
}

async fn render(obs: Observe) -> Response {
    match obs.metrics.render(&obs.sources).await {
        Some(text) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            text,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are disabled (--no-metrics)\n").into_response(),
    }
}

/// What a route does, for metrics; `None`: not a state request (probes, console, metadata).
fn route_cmd(method: &Method, route: &str) -> Option<Cmd> {
    Some(match route {
        "/v1.0/state/{store}" if method == Method::POST => Cmd::Set,
        // `bulk` and `transaction` are keys too when read or deleted.
        "/v1.0/state/{store}/{key}" | "/v1.0/state/{store}/bulk" | "/v1.0/state/{store}/transaction"
            if method == Method::GET =>
        {
            Cmd::Get
        }
        "/v1.0/state/{store}/{key}" | "/v1.0/state/{store}/bulk" | "/v1.0/state/{store}/transaction"
            if method == Method::DELETE =>
        {
            Cmd::Del
        }
        "/v1.0/state/{store}/bulk" => Cmd::BulkGet,
        "/v1.0/state/{store}/transaction" => Cmd::Transaction,
        "/v1.0-alpha1/state/{store}/query" => Cmd::Query,
        "/v1.0-alpha1/state/{store}/keys" => Cmd::ListKeys,
        "/v1.0-alpha1/state/{store}/subscribe" => Cmd::Watch,
        _ => return None,
    })
}

/// The middleware: span, request id, metrics.
pub async fn observe(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    // Read from the borrowed route: nothing is copied per request.
    let (cmd, keyed) = match req.extensions().get::<MatchedPath>().map(MatchedPath::as_str) {
        Some(r) => (route_cmd(req.method(), r), r.ends_with("{key}")),
        None => (None, false),
    };
    let given = req
        .headers()
        .get(REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID)
        .cloned();
    let id = match given {
        Some(v) => v,
        None => {
            let v = HeaderValue::from_str(&new_request_id()).unwrap_or(HeaderValue::from_static("sg"));
            req.headers_mut().insert(REQUEST_ID, v.clone());
            v
        }
    };
    let key_len = match keyed {
        true => req.uri().path().rsplit('/').next().map_or(0, str::len),
        false => 0,
    };
    let span = tracing::info_span!(
        "request",
        door = "http",
        command = cmd.map_or("none", Cmd::label),
        key_len,
        request_id = id.to_str().unwrap_or(""),
        outcome = tracing::field::Empty,
    );
    let mut resp = next.run(req).instrument(span.clone()).await;
    let outcome = Outcome::from_status(resp.status().as_u16());
    span.record("outcome", outcome.label());
    if let Some(cmd) = cmd {
        st.obs.metrics.request(Door::Http, cmd, outcome, started);
    }
    resp.headers_mut().insert(REQUEST_ID, id);
    resp
}
