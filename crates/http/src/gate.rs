//! What every HTTP request passes before the router, as one service around it: the request
//! span, request id and metrics; the browser guard; the in-flight limit and body budget; the
//! request timeout; and the caller's identity (token and rate).
//!
//! Why one hand-written service instead of a stack of `axum::middleware::from_fn` layers on the
//! router: a layer added with `Router::layer` wraps every route in its own boxed service, and
//! axum clones a route's whole stack (each layer's state included) for every request. With six
//! layers that was six boxed clones and about twenty reference-count updates per request, a
//! fifth of the door's CPU at saturation (perf, 2026-11-28). Here a request costs one clone of
//! an `Arc` and one boxed future, and the steps run in the order the layers did.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;
use tracing::Instrument;

use crate::access::{Access, Refusal};
use crate::browser::{self, BrowserPolicy};
use crate::error::{ApiError, Op};
use crate::listener::body_budget::BudgetedBody;
use crate::listener::inflight::{InFlight, Kind, SlotBody};
use crate::metrics::{Cmd, Door, Metrics, Outcome};
use crate::observe::{MAX_REQUEST_ID, REQUEST_ID, new_request_id};
use crate::ui;

/// The Dapr error code of a request refused because the door is at its in-flight limit.
pub const TOO_MANY_REQUESTS: &str = "ERR_TOO_MANY_REQUESTS";

/// The router behind the steps every request takes first (see the module's comment).
#[derive(Clone)]
pub struct Gate(Arc<Steps>);

struct Steps {
    router: Router,
    metrics: Metrics,
    browser: BrowserPolicy,
    inflight: InFlight,
    request_timeout: Duration,
    access: Access,
    /// Whether the console's own files are served (and so exempt from the token).
    ui: bool,
}

/// What the gate needs besides the router.
pub struct GateSettings {
    pub metrics: Metrics,
    pub browser: BrowserPolicy,
    pub inflight: InFlight,
    pub request_timeout: Duration,
    pub access: Access,
    pub ui: bool,
}

impl Gate {
    pub fn new(router: Router, s: GateSettings) -> Gate {
        Gate(Arc::new(Steps {
            router,
            metrics: s.metrics,
            browser: s.browser,
            inflight: s.inflight,
            request_timeout: s.request_timeout,
            access: s.access,
            ui: s.ui,
        }))
    }
}

impl<B> tower::Service<axum::http::Request<B>> for Gate
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let steps = self.0.clone();
        Box::pin(async move { Ok(steps.observe(req.map(Body::new)).await) })
    }
}

type Request = axum::http::Request<Body>;

impl Steps {
    /// The span, the request id (`x-request-id`, honoured and returned) and the request's place
    /// in the metrics; then the rest.
    async fn observe(&self, mut req: Request) -> Response {
        let started = Instant::now();
        let (cmd, key_len) = classify(req.method(), req.uri().path());
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
        let span = tracing::debug_span!(
            target: stategate_telemetry::REQUEST_SPANS,
            "request",
            door = "http",
            command = cmd.map_or("none", Cmd::label),
            key_len,
            request_id = id.to_str().unwrap_or(""),
            outcome = tracing::field::Empty,
        );
        let mut resp = self.guard(req).instrument(span.clone()).await;
        let outcome = Outcome::from_status(resp.status().as_u16());
        span.record("outcome", outcome.label());
        if let Some(cmd) = cmd {
            self.metrics.request(Door::Http, cmd, outcome, started);
        }
        resp.headers_mut().insert(REQUEST_ID, id);
        resp
    }

    /// A cross-site or rebinding browser request is refused before it takes a slot.
    async fn guard(&self, req: Request) -> Response {
        let exempt = browser::is_probe(req.uri().path()) && req.headers().get(header::ORIGIN).is_none();
        if !exempt && let Err((code, message)) = self.browser.check(req.headers()) {
            return ApiError::new(StatusCode::FORBIDDEN, code, message).into_response();
        }
        self.limit_in_flight(req).await
    }

    /// Takes a request or stream slot for the whole response (held by its body), or answers
    /// 503 with Dapr's error body and `Retry-After: 1` at once.
    /// The body is read within the door's byte budget (`--http-max-inflight-bytes`): a known
    /// `Content-Length` is reserved at once (503 when it does not fit), a chunked body takes
    /// its bytes as they arrive (503 once it does not fit, whatever the handler made of the cut
    /// body).
    async fn limit_in_flight(&self, req: Request) -> Response {
        let too_many = |why: String| {
            let mut resp = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, TOO_MANY_REQUESTS, why).into_response();
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            resp
        };
        let slot = match self.inflight.try_admit(Kind::of_path(req.uri().path())) {
            Ok(slot) => slot,
            Err(refused) => return too_many(refused.to_string()),
        };
        let known_len = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let held = match self.inflight.bodies().admit(known_len) {
            Ok(held) => held,
            Err(exhausted) => return too_many(exhausted.to_string()),
        };
        let req = req.map(|body| Body::new(BudgetedBody::new(body, held.clone(), known_len, |e| Box::new(e))));
        let resp = self.timed(req).await;
        if let Some(exhausted) = held.exhausted() {
            return too_many(exhausted.to_string());
        }
        resp.map(|body| Body::new(SlotBody::new(body, slot).holding(held)))
    }

    /// 408 when the response has not begun within the request timeout (an event stream's
    /// response begins at once, so streams are not cut).
    async fn timed(&self, req: Request) -> Response {
        match tokio::time::timeout(self.request_timeout, self.identify(req)).await {
            Ok(resp) => resp,
            Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
        }
    }

    /// Who is calling. `dapr-api-token` is checked as Dapr does it (401 with a plain-text
    /// body) when tokens are configured; then one request is taken from the caller's rate
    /// (429 past it) and the caller's grant goes to the handlers in the request's extensions.
    /// Health is exempt (`/healthz`, `/readyz`, Dapr's `/v1.0/healthz`), and so are the web
    /// console's own files (they hold no data; the console sends the token on every data call
    /// it makes).
    async fn identify(&self, mut req: Request) -> Response {
        let path = req.uri().path();
        let probe = path == "/healthz" || path == "/readyz" || path.starts_with("/v1.0/healthz");
        if !(probe || (self.ui && ui::is_public(path))) {
            let given = req.headers().get("dapr-api-token").and_then(|v| v.to_str().ok());
            match self.access.admit_token(given) {
                Ok(grant) => {
                    req.extensions_mut().insert(grant);
                }
                Err(Refusal::BadToken) => return (StatusCode::UNAUTHORIZED, "invalid api token").into_response(),
                Err(Refusal::Limited(e)) => return ApiError::from_engine(Op::Get, e).into_response(),
            }
        }
        match self.router.clone().oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        }
    }
}

/// What a request does, for metrics (`None`: not a state request: probes, console, metadata,
/// unknown routes), and the length of the key it names (0 when none), read from the path's
/// segments as the router matches them (a segment is one route parameter; `%2F` stays in it).
fn classify(method: &Method, path: &str) -> (Option<Cmd>, usize) {
    let mut seg = path.strip_prefix('/').unwrap_or(path).split('/');
    let (api, state, store) = (seg.next(), seg.next(), seg.next());
    let (last, extra) = (seg.next(), seg.next());
    if state != Some("state") || store.is_none_or(str::is_empty) || extra.is_some() {
        return (None, 0);
    }
    let cmd = match (api, last) {
        (Some("v1.0"), None) if method == Method::POST => Cmd::Set,
        (Some("v1.0"), Some(k)) if !k.is_empty() && method == Method::GET => return (Some(Cmd::Get), k.len()),
        (Some("v1.0"), Some(k)) if !k.is_empty() && method == Method::DELETE => return (Some(Cmd::Del), k.len()),
        (Some("v1.0"), Some("bulk")) => Cmd::BulkGet,
        (Some("v1.0"), Some("transaction")) => Cmd::Transaction,
        (Some("v1.0-alpha1"), Some("query")) => Cmd::Query,
        (Some("v1.0-alpha1"), Some("keys")) => Cmd::ListKeys,
        (Some("v1.0-alpha1"), Some("subscribe")) => Cmd::Watch,
        _ => return (None, 0),
    };
    (Some(cmd), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_names_the_state_routes_as_the_router_matches_them() {
        let c = |m: Method, p: &str| classify(&m, p);
        assert_eq!(c(Method::POST, "/v1.0/state/s"), (Some(Cmd::Set), 0));
        assert_eq!(c(Method::GET, "/v1.0/state/s"), (None, 0));
        assert_eq!(c(Method::GET, "/v1.0/state/s/key-1"), (Some(Cmd::Get), 5));
        assert_eq!(c(Method::GET, "/v1.0/state/s/a%2Fb"), (Some(Cmd::Get), 5));
        assert_eq!(c(Method::DELETE, "/v1.0/state/s/k"), (Some(Cmd::Del), 1));
        // `bulk` and `transaction` are keys too when read or deleted.
        assert_eq!(c(Method::GET, "/v1.0/state/s/bulk"), (Some(Cmd::Get), 4));
        assert_eq!(c(Method::POST, "/v1.0/state/s/bulk"), (Some(Cmd::BulkGet), 0));
        assert_eq!(
            c(Method::POST, "/v1.0/state/s/transaction"),
            (Some(Cmd::Transaction), 0)
        );
        assert_eq!(c(Method::POST, "/v1.0/state/s/k"), (None, 0));
        assert_eq!(c(Method::POST, "/v1.0-alpha1/state/s/query"), (Some(Cmd::Query), 0));
        assert_eq!(c(Method::GET, "/v1.0-alpha1/state/s/keys"), (Some(Cmd::ListKeys), 0));
        assert_eq!(c(Method::GET, "/v1.0-alpha1/state/s/subscribe"), (Some(Cmd::Watch), 0));
        assert_eq!(c(Method::GET, "/v1.0-alpha1/state/s/k"), (None, 0));
        // Not routes: an empty store or key, a segment too many, other APIs.
        assert_eq!(c(Method::GET, "/v1.0/state//k"), (None, 0));
        assert_eq!(c(Method::GET, "/v1.0/state/s/"), (None, 0));
        assert_eq!(c(Method::GET, "/v1.0/state/s/k/x"), (None, 0));
        assert_eq!(c(Method::GET, "/v1.0/metadata"), (None, 0));
        assert_eq!(c(Method::GET, "/healthz"), (None, 0));
        assert_eq!(c(Method::POST, "/v1.0-alpha1/lock/s"), (None, 0));
    }
}
