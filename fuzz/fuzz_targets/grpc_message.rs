//! One gRPC call to the services a client reaches (`statestore.v1`, the Dapr runtime API, the
//! Dapr pluggable component API): the method's path on the first line (`/package.Service/Method`),
//! then the protobuf message. The generated service decodes it (prost) and the door converts it
//! into engine and Dapr terms, on a fresh engine.
//!
//! Whatever comes in: no panic, and never `UNKNOWN`, nor `INTERNAL` but where Dapr answers a
//! refused transaction with it (the memory store has no fault to report: anything else is a
//! conversion that failed where it should have refused).

#![no_main]

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use stategate::dapr::DaprSettings;
use stategate::grpc::{component_routes, tcp_routes};
use stategate::health::Observe;
use stategate_fuzz::{engine, first_line, run};
use tower::ServiceExt;

/// How long a response is read (paused time: a stream ends here, nothing waits).
const READ_FOR: Duration = Duration::from_secs(5);

/// Whether a `grpc-status` (and `grpc-message`, percent-encoded) says the service failed
/// rather than refused.
fn is_fault(path: &str, code: &str, message: &str) -> bool {
    // Dapr's transactions answer INTERNAL for what they refuse (an etag mismatch, say); and a
    // message that does not decode is INTERNAL in every gRPC library (tonic, grpc-go), as
    // gRPC's status code table has it: what a client expects, so not a fault here.
    let transaction = path.ends_with("/ExecuteStateTransaction") || path.ends_with("/Transact");
    let undecodable = message.starts_with("failed%20to%20decode%20Protobuf%20message");
    match code {
        "2" => true,
        "13" => !(undecodable || transaction && message != "storage%20failure"),
        _ => false,
    }
}

fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

fuzz_target!(|data: &[u8]| {
    let (path, message) = first_line(data);
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let Ok(req) = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::from(
            frame(message),
        ))))
    else {
        return;
    };
    run(async {
        let engine = engine().await;
        let routes = if path.starts_with("/dapr.proto.components.") {
            component_routes(engine, 1000, 10_000)
        } else {
            tcp_routes(engine, Arc::new(DaprSettings::default()), Observe::default())
        };
        let resp = routes.oneshot(req).await.expect("routes are infallible");
        let head = resp.headers().clone();
        let body = tokio::time::timeout(READ_FOR, resp.into_body().collect()).await;
        let trailers = match &body {
            Ok(Ok(b)) => b.trailers().cloned(),
            _ => None,
        };
        for map in [Some(head), trailers].into_iter().flatten() {
            let get = |name| {
                map.get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            let (code, message) = (get("grpc-status"), get("grpc-message"));
            assert!(
                !is_fault(path, &code, &message),
                "grpc-status {code} ({message}) for {path}"
            );
        }
    });
});
