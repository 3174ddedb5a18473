//! The gRPC door's in-flight limit: a tower layer around every service of the TCP door. A call
//! over the limit is answered RESOURCE_EXHAUSTED at once, before any service sees it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tonic::Status;

use crate::listener::body_budget::BudgetedBody;
use crate::listener::inflight::{InFlight, Kind, SlotBody};

/// Adds [`InFlightService`] around a service.
#[derive(Debug, Clone)]
pub struct InFlightLayer(pub InFlight);

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlightService<S>;

    fn layer(&self, inner: S) -> InFlightService<S> {
        InFlightService {
            inner,
            inflight: self.0.clone(),
        }
    }
}

/// Takes a slot per call, held by the response body until it ends.
#[derive(Debug, Clone)]
pub struct InFlightService<S> {
    inner: S,
    inflight: InFlight,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ResBody> tower::Service<http::Request<B>> for InFlightService<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
    ResBody: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let refuse = |why: String| {
            let resp = Status::resource_exhausted(why).into_http();
            Box::pin(std::future::ready(Ok(resp))) as Self::Future
        };
        let slot = match self.inflight.try_admit(Kind::of_path(req.uri().path())) {
            Ok(slot) => slot,
            Err(refused) => return refuse(refused.to_string()),
        };
        // gRPC clients rarely send a length: bodies take their bytes as they arrive, and a
        // message that does not fit fails the call with RESOURCE_EXHAUSTED (tonic answers a
        // body error that is a Status with that status).
        let known_len = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let held = match self.inflight.bodies().admit(known_len) {
            Ok(held) => held,
            Err(exhausted) => return refuse(exhausted.to_string()),
        };
        let req = req.map(|body| {
            tonic::body::Body::new(BudgetedBody::new(body, held.clone(), known_len, |e| {
                Box::new(Status::resource_exhausted(e.to_string()))
            }))
        });
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| tonic::body::Body::new(SlotBody::new(body, slot).holding(held))))
        })
    }
}
