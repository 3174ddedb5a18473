//! The published Dapr Go SDK (`github.com/dapr/go-sdk`) against stategate's own gRPC door
//! (`dapr.proto.runtime.v1.Dapr`, no daprd in between): the Go tests in `tests/go/daprsdk`, run
//! like the AIO Go SDK's (see `aio_go.rs`), with the door's address in `STATEGATE_GRPC_ADDR`.

use crate::aio_go::GoTest;
use crate::support::{Broker, TestEnv};

fn grpc_addr(env: &TestEnv) -> (&'static str, String) {
    let url = env.grpc();
    let addr = url.strip_prefix("http://").unwrap_or(&url).to_owned();
    ("STATEGATE_GRPC_ADDR", addr)
}

/// Save/get/delete with ETags, first-write, `ttlInSeconds` and `ttlExpireTime`; the ETag the
/// SDK got is the version the engine (and so MQTT's `__ts`) has for that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etags_first_write_and_ttl() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut go = GoTest::start("daprsdk", "TestStateETags", &[grpc_addr(&env)]);
    let line = go.hear("the shared key and its ETag").await;
    let mut parts = line.split(' ');
    let (Some("etag"), Some(key), Some(etag), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        panic!("expected etag <key> <etag>, got {line:?}");
    };
    go.passes().await;
    let entry = env
        .engine()
        .read(&bytes::Bytes::copy_from_slice(key.as_bytes()))
        .await
        .expect("read")
        .expect("the key the Go SDK saved");
    assert_eq!(entry.version.to_string(), etag, "the ETag is the key's version");
    assert_eq!(&entry.value[..], b"from-go");
    env.stop().await;
}

/// Bulk save/get/delete, a query, transactions (one with a stale ETag applies nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_query_and_transactions() {
    let env = TestEnv::start(Broker::Embedded).await;
    GoTest::start("daprsdk", "TestStateBulkAndTransactions", &[grpc_addr(&env)])
        .passes()
        .await;
    env.stop().await;
}
