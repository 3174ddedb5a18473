//! One HTTP request to the HTTP door's router, as a client can send it: `METHOD TARGET` on the
//! first line, `name: value` header lines, an empty line, then the body. Every route parses
//! its own part: the Dapr state, bulk, transaction, query, lock, configuration and election
//! bodies (`crates/http/src/dto.rs`, `crates/dapr`), query strings, `If-Match`, the import.
//!
//! Whatever comes in: no panic, and no 500 but where Dapr answers a refused transaction with it
//! (`ERR_STATE_TRANSACTION`): the memory store has no fault to report, so any other 500 is a
//! parser or a conversion that failed where it should have refused.

#![no_main]

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use stategate::dapr::DaprSettings;
use stategate::http::{HttpSettings, ServiceInfo, router};
use stategate_fuzz::{engine, first_line, head_and_body, run};
use tower::ServiceExt;

/// How long a response body is read (paused time: a stream ends here, nothing waits).
const READ_FOR: Duration = Duration::from_secs(5);

fn request(data: &[u8]) -> Option<http::Request<axum::body::Body>> {
    let (line, rest) = first_line(data);
    let line = std::str::from_utf8(line).ok()?;
    let (method, target) = line.split_once(' ')?;
    let (headers, body) = head_and_body(rest, b':');
    let mut req = http::Request::builder().method(method).uri(target);
    for (name, value) in headers {
        req = req.header(name, value.trim_start());
    }
    req.body(axum::body::Body::from(Bytes::copy_from_slice(body))).ok()
}

fuzz_target!(|data: &[u8]| {
    // What hyper would refuse before the router sees it (a bad method, target or header).
    let Some(req) = request(data) else {
        return;
    };
    run(async {
        let engine = engine().await;
        let app = router(
            engine,
            HttpSettings::default(),
            DaprSettings::default(),
            ServiceInfo::default(),
        );
        let resp = app.oneshot(req).await.expect("the router is infallible");
        let status = resp.status();
        let body = tokio::time::timeout(READ_FOR, resp.into_body().collect()).await;
        if status == http::StatusCode::INTERNAL_SERVER_ERROR {
            let body = body.ok().and_then(|b| b.ok()).map(|b| b.to_bytes()).unwrap_or_default();
            let error: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            assert!(
                error["errorCode"] == "ERR_STATE_TRANSACTION" && error["message"] != "the state store failed",
                "500 {}",
                String::from_utf8_lossy(&body)
            );
        }
    });
});
