//! Requests and streams in flight, per door: a request past the limit is refused at once (HTTP
//! 503, gRPC RESOURCE_EXHAUSTED, each door says how), never queued.
//!
//! A slot is taken when the request arrives and held by the response body until that body
//! ends or is dropped, so a unary request holds it until its answer is sent and a stream (SSE,
//! gRPC Watch) for as long as it is open. Streams have their own, separate limit: a crowd of
//! watchers cannot starve requests, and a burst of requests cannot close out watchers.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::body_budget::{BodyBudget, Held};
use super::capacity::{Capacity, Taken};

/// Which kind of slot a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Answered once (held until the answer's body is sent).
    Request,
    /// Stays open (server-sent events, gRPC Watch): held until the stream ends.
    Stream,
}

/// The gRPC methods that stay open, on any door.
const STREAMING_METHODS: &[&str] = &[
    "/statestore.v1.StateStore/Watch",
    "/dapr.proto.runtime.v1.Dapr/SubscribeConfiguration",
    "/dapr.proto.runtime.v1.Dapr/SubscribeConfigurationAlpha1",
    "/statestore.v1.Election/Observe",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

impl Kind {
    /// Which slot a request to `path` takes, on either door: the one definition of "a stream"
    /// (a stream in a request slot would hold it for its whole life and starve unary calls).
    /// Streams are the gRPC methods above and the HTTP event streams: state changes
    /// (`/v1.0-alpha1/state/{store}/subscribe`), configuration subscriptions
    /// (`/v1.0/configuration/{store}/subscribe`, also under `/v1.0-alpha1`) and election
    /// observers (`/v1.0-alpha1/election/{store}/observe`).
    pub fn of_path(path: &str) -> Kind {
        let http_stream = |prefix: &str, suffix: &str| {
            path.strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(suffix))
                .is_some_and(|store| !store.is_empty() && !store.contains('/'))
        };
        if STREAMING_METHODS.contains(&path)
            || http_stream("/v1.0-alpha1/state/", "/subscribe")
            || http_stream("/v1.0/configuration/", "/subscribe")
            || http_stream("/v1.0-alpha1/configuration/", "/subscribe")
            || http_stream("/v1.0-alpha1/election/", "/observe")
        {
            Kind::Stream
        } else {
            Kind::Request
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("too many requests in flight (limit {0}); retry later")]
    Requests(usize),
    #[error("too many open streams (limit {0}); retry later")]
    Streams(usize),
}

/// The slots of one door, and the bytes of request bodies it holds. Clones share them;
/// [`InFlight::resize`] changes the slot limits live.
#[derive(Debug, Clone)]
pub struct InFlight {
    requests: Arc<Capacity>,
    streams: Arc<Capacity>,
    bodies: BodyBudget,
}

/// Request body bytes a door holds at once unless told otherwise.
pub const DEFAULT_BODY_BYTES: usize = 64 * 1024 * 1024;

impl InFlight {
    pub fn new(max_requests: usize, max_streams: usize) -> InFlight {
        InFlight {
            requests: Arc::new(Capacity::new(max_requests)),
            streams: Arc::new(Capacity::new(max_streams)),
            bodies: BodyBudget::new(DEFAULT_BODY_BYTES),
        }
    }

    /// With a budget of `max_bytes` of request bodies in flight.
    pub fn with_body_budget(mut self, max_bytes: usize) -> InFlight {
        self.bodies = BodyBudget::new(max_bytes);
        self
    }

    /// The request body budget.
    pub fn bodies(&self) -> &BodyBudget {
        &self.bodies
    }

    /// Takes a slot of `kind`, or says why not.
    pub fn try_admit(&self, kind: Kind) -> Result<Slot, Refused> {
        let (capacity, refused): (_, fn(usize) -> Refused) = match kind {
            Kind::Request => (&self.requests, Refused::Requests),
            Kind::Stream => (&self.streams, Refused::Streams),
        };
        capacity.try_take().map(Slot).ok_or_else(|| refused(capacity.max()))
    }

    /// (requests, streams) in flight now.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.requests.taken(), self.streams.taken())
    }

    /// Puts new limits in force; what is in flight stays (see [`Capacity`]).
    pub fn resize(&self, max_requests: usize, max_streams: usize) {
        self.requests.resize(max_requests);
        self.streams.resize(max_streams);
    }
}

/// A taken slot; freed on drop.
#[derive(Debug)]
pub struct Slot(#[allow(dead_code)] Taken);

/// A response body that holds its request's slot (and the body bytes its request holds) until
/// the body ends.
pub struct SlotBody<B> {
    inner: B,
    slot: Option<Slot>,
    held: Option<Held>,
}

impl<B> SlotBody<B> {
    pub fn new(inner: B, slot: Slot) -> SlotBody<B> {
        SlotBody {
            inner,
            slot: Some(slot),
            held: None,
        }
    }

    /// Also holds `held` until the body ends.
    pub fn holding(mut self, held: Held) -> SlotBody<B> {
        self.held = Some(held);
        self
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for SlotBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // The body is done: free the slot now rather than when the server drops it.
            this.slot = None;
            this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn streams_are_the_same_on_both_doors() {
        use super::Kind;
        for stream in [
            "/v1.0-alpha1/state/statestore/subscribe",
            "/v1.0/configuration/configstore/subscribe",
            "/v1.0-alpha1/configuration/configstore/subscribe",
            "/statestore.v1.StateStore/Watch",
            "/dapr.proto.runtime.v1.Dapr/SubscribeConfiguration",
            "/dapr.proto.runtime.v1.Dapr/SubscribeConfigurationAlpha1",
            "/v1.0-alpha1/election/lockstore/observe",
            "/statestore.v1.Election/Observe",
        ] {
            assert_eq!(Kind::of_path(stream), Kind::Stream, "{stream}");
        }
        for request in [
            "/v1.0/state/statestore/subscribe",
            "/v1.0/configuration/configstore",
            "/v1.0/configuration/configstore/abc/unsubscribe",
            "/v1.0-alpha1/state//subscribe",
            "/dapr.proto.runtime.v1.Dapr/UnsubscribeConfiguration",
            "/statestore.v1.StateStore/Get",
            "/v1.0-alpha1/election/lockstore/campaign",
            "/v1.0-alpha1/election//observe",
            "/statestore.v1.Election/Campaign",
        ] {
            assert_eq!(Kind::of_path(request), Kind::Request, "{request}");
        }
    }

    use super::*;

    #[test]
    fn slots_are_refused_past_the_limit_and_freed_on_drop() {
        let f = InFlight::new(2, 1);
        let a = f.try_admit(Kind::Request).unwrap();
        let _b = f.try_admit(Kind::Request).unwrap();
        assert_eq!(f.try_admit(Kind::Request).unwrap_err(), Refused::Requests(2));
        // Streams are counted apart.
        let s = f.try_admit(Kind::Stream).unwrap();
        assert_eq!(f.try_admit(Kind::Stream).unwrap_err(), Refused::Streams(1));
        assert_eq!(f.in_flight(), (2, 1));
        drop(a);
        drop(s);
        assert_eq!(f.in_flight(), (1, 0));
        assert!(f.try_admit(Kind::Request).is_ok());
    }

    #[tokio::test]
    async fn a_body_holds_its_slot_until_it_ends() {
        use http_body_util::BodyExt;
        let f = InFlight::new(1, 1);
        let body = SlotBody::new(
            http_body_util::Full::new(Bytes::from_static(b"hi")),
            f.try_admit(Kind::Request).unwrap(),
        );
        assert_eq!(f.in_flight(), (1, 0));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hi");
        assert_eq!(f.in_flight(), (0, 0));
    }
}
