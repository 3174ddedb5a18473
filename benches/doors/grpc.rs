//! `--only grpc`: Dapr GetState and SaveState over gRPC next to a bare tonic handler.

use std::collections::HashMap;

use stategate::config::{BrokerChoice, Config};
use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::storage::Store;

use super::load::{Load, alternate, at_rest, op, print_against_first, print_at_rest};
use super::{Opts, serving};

type Client = rpb::dapr_client::DaprClient<tonic::transport::Channel>;

/// The baseline: every state RPC answers a constant at once.
struct Bare;

#[tonic::async_trait]
impl rpb::dapr_server::Dapr for Bare {
    async fn get_state(
        &self,
        _r: tonic::Request<rpb::GetStateRequest>,
    ) -> Result<tonic::Response<rpb::GetStateResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::GetStateResponse {
            data: b"\"constant-value\"".to_vec(),
            etag: "000000000000001:00000:bare".into(),
            metadata: HashMap::new(),
        }))
    }
    async fn get_bulk_state(
        &self,
        _r: tonic::Request<rpb::GetBulkStateRequest>,
    ) -> Result<tonic::Response<rpb::GetBulkStateResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::GetBulkStateResponse::default()))
    }
    async fn save_state(
        &self,
        _r: tonic::Request<rpb::SaveStateRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn query_state_alpha1(
        &self,
        _r: tonic::Request<rpb::QueryStateRequest>,
    ) -> Result<tonic::Response<rpb::QueryStateResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::QueryStateResponse::default()))
    }
    async fn delete_state(
        &self,
        _r: tonic::Request<rpb::DeleteStateRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn delete_bulk_state(
        &self,
        _r: tonic::Request<rpb::DeleteBulkStateRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn execute_state_transaction(
        &self,
        _r: tonic::Request<rpb::ExecuteStateTransactionRequest>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn get_metadata(
        &self,
        _r: tonic::Request<rpb::GetMetadataRequest>,
    ) -> Result<tonic::Response<rpb::GetMetadataResponse>, tonic::Status> {
        Ok(tonic::Response::new(rpb::GetMetadataResponse::default()))
    }
    // Not measured: the lock and configuration RPCs.
    async fn get_configuration_alpha1(
        &self,
        _r: tonic::Request<rpb::GetConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::GetConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn get_configuration(
        &self,
        _r: tonic::Request<rpb::GetConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::GetConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    type SubscribeConfigurationAlpha1Stream = BareStream;
    async fn subscribe_configuration_alpha1(
        &self,
        _r: tonic::Request<rpb::SubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<BareStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    type SubscribeConfigurationStream = BareStream;
    async fn subscribe_configuration(
        &self,
        _r: tonic::Request<rpb::SubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<BareStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn unsubscribe_configuration_alpha1(
        &self,
        _r: tonic::Request<rpb::UnsubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::UnsubscribeConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn unsubscribe_configuration(
        &self,
        _r: tonic::Request<rpb::UnsubscribeConfigurationRequest>,
    ) -> Result<tonic::Response<rpb::UnsubscribeConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn try_lock_alpha1(
        &self,
        _r: tonic::Request<rpb::TryLockRequest>,
    ) -> Result<tonic::Response<rpb::TryLockResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
    async fn unlock_alpha1(
        &self,
        _r: tonic::Request<rpb::UnlockRequest>,
    ) -> Result<tonic::Response<rpb::UnlockResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("bare"))
    }
}

type BareStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<rpb::SubscribeConfigurationResponse, tonic::Status>> + Send>,
>;

pub(crate) async fn run(o: &Opts) {
    println!(
        "\n== gRPC: Dapr runtime API, 16 concurrent streams at saturation, {} s per row",
        o.secs
    );
    let mut config = Config {
        http_listen: None,
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        broker: BrokerChoice::Embedded {
            listen: "127.0.0.1:0".parse().expect("addr"),
            client_path: false,
        },
        ..Config::default()
    };
    config.mqtt.client_id = "stategate-bench-grpc".into();
    let running = serving(stategate::start(config, Store::memory()))
        .await
        .expect("stategate starts");
    let sg_url = format!("http://{}", running.grpc_addr().expect("grpc"));

    let bare_url = serving(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(rpb::dapr_server::DaprServer::new(Bare))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)))
                .await
        });
        url
    })
    .await;
    let connect = |url: String| async move {
        let ch = tonic::transport::Endpoint::from_shared(url)
            .expect("url")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        rpb::dapr_client::DaprClient::new(ch)
    };
    let sg = connect(sg_url).await;
    let bare = connect(bare_url).await;
    let item = common::StateItem {
        key: "key-000000000001".into(),
        value: vec![b'v'; 100],
        ..Default::default()
    };
    sg.clone()
        .save_state(rpb::SaveStateRequest {
            store_name: "statestore".into(),
            states: vec![item.clone()],
        })
        .await
        .expect("seed");
    let get = |c: &Client| {
        let c = c.clone();
        op(move |_i: u64| {
            let mut c = c.clone();
            async move {
                let _ = c
                    .get_state(rpb::GetStateRequest {
                        store_name: "statestore".into(),
                        key: "key-000000000001".into(),
                        ..Default::default()
                    })
                    .await;
            }
        })
    };
    let save = |c: &Client| {
        let (c, item) = (c.clone(), item.clone());
        op(move |_i: u64| {
            let (mut c, item) = (c.clone(), item.clone());
            async move {
                let _ = c
                    .save_state(rpb::SaveStateRequest {
                        store_name: "statestore".into(),
                        states: vec![item],
                    })
                    .await;
            }
        })
    };
    print_at_rest(at_rest().await);
    for load in [Load::Rate(1000), Load::Inflight(16)] {
        let rows = [
            ("bare tonic GetState", get(&bare)),
            ("stategate GetState", get(&sg)),
            ("stategate SaveState", save(&sg)),
        ];
        print_against_first(&alternate(o, load, &rows).await);
    }
    println!("(Dapr sidecar published: gRPC GET p50 0.57 ms, p90 0.93 ms, p99 1.65 ms at 1,000/s)");
    serving(running.shutdown()).await;
}
