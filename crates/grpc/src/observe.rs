//! A tower layer on the gRPC servers: one span per call (door, method, request id from
//! metadata `x-request-id` or our own, outcome) and the request metrics. Health and
//! reflection calls are not counted.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tracing::Instrument;

use crate::metrics::{Cmd, Door, Metrics, Outcome};

#[derive(Clone, Debug)]
pub struct ObserveLayer {
    pub metrics: Metrics,
    pub door: Door,
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observed<S>;
    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            metrics: self.metrics.clone(),
            door: self.door,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Observed<S> {
    inner: S,
    metrics: Metrics,
    door: Door,
}

/// The gRPC status of a response whose headers carry it (a call that failed before its first
/// message); a call whose status comes in trailers started well and counts as ok.
fn outcome<B>(resp: &axum::http::Response<B>) -> Outcome {
    let code = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0);
    Outcome::from_grpc(code)
}

impl<S, B, R> tower::Service<axum::http::Request<B>> for Observed<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let started = Instant::now();
        let path = req.uri().path();
        let counted = !path.starts_with("/grpc.");
        let cmd = Cmd::from_grpc_method(path.rsplit('/').next().unwrap_or_default());
        let span = tracing::debug_span!(
            target: stategate_telemetry::REQUEST_SPANS,
            "request",
            door = self.door.label(),
            command = cmd.label(),
            method = path,
            request_id = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if !span.is_disabled() {
            match req
                .headers()
                .get(stategate_net::request_id::REQUEST_ID)
                .and_then(|v| v.to_str().ok())
            {
                Some(id) => span.record("request_id", id),
                None => span.record("request_id", stategate_net::request_id::new_request_id()),
            };
        }
        let fut = self.inner.call(req);
        let (metrics, door) = (self.metrics.clone(), self.door);
        Box::pin(
            async move {
                let resp = fut.await;
                let o = match &resp {
                    Ok(r) => outcome(r),
                    Err(_) => Outcome::Error,
                };
                tracing::Span::current().record("outcome", o.label());
                if counted {
                    metrics.request(door, cmd, o, started);
                }
                resp
            }
            .instrument(span),
        )
    }
}
