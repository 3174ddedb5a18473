//! The gRPC doors over a real port and a real Unix socket.

use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::grpc::pb::statestore::v1 as npb;

use crate::support::{Broker, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_and_dapr_runtime_share_versions() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut native = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap();
    let mut dapr = rpb::dapr_client::DaprClient::connect(env.grpc()).await.unwrap();
    let set = native
        .set(npb::SetRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(set.applied);
    let got = dapr
        .get_state(rpb::GetStateRequest {
            store_name: "statestore".into(),
            key: "k".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.data, b"v");
    assert_eq!(got.etag, set.version);
    let err = dapr
        .save_state(rpb::SaveStateRequest {
            store_name: "statestore".into(),
            states: vec![common::StateItem {
                key: "k".into(),
                value: b"w".to_vec(),
                etag: Some(common::Etag {
                    value: "000000000000001:00000:x".into(),
                }),
                ..Default::default()
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    env.stop().await;
}
