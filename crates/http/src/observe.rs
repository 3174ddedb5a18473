//! The HTTP door's operations routes (`/healthz`, `/readyz`, `/metrics`). Every request's
//! span, request id (`x-request-id`, honoured and returned) and place in the request metrics
//! are the [`Gate`](crate::Gate)'s.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::AppState;
use crate::health::Observe;

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
