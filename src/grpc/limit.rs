//! The gRPC door's in-flight limit: a tower layer around every service of the TCP door. A call
//! over the limit is answered RESOURCE_EXHAUSTED at once, before any service sees it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tonic::Status;

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
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
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
        match self.inflight.try_admit(Kind::of_path(req.uri().path())) {
            Err(refused) => {
                let resp = Status::resource_exhausted(refused.to_string()).into_http();
                Box::pin(std::future::ready(Ok(resp)))
            }
            Ok(slot) => {
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let resp = fut.await?;
                    Ok(resp.map(|body| tonic::body::Body::new(SlotBody::new(body, slot))))
                })
            }
        }
    }
}
