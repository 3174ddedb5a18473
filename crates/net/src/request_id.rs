//! Request ids (`x-request-id`), shared by the HTTP and gRPC doors: a caller's own id is kept
//! (within [`MAX_REQUEST_ID`] bytes), a request without one gets [`new_request_id`].

use std::sync::atomic::{AtomicU64, Ordering};

/// The header (HTTP) and metadata key (gRPC) of a request id.
pub const REQUEST_ID: &str = "x-request-id";

/// Longest request id taken from a client; a longer one is replaced by our own.
pub const MAX_REQUEST_ID: usize = 128;

/// Ids for requests that come without one: unique within the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub fn new_request_id() -> String {
    format!(
        "sg-{:x}-{:x}",
        std::process::id(),
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    )
}
