//! A pluggable state component that does nothing: every call answers a constant at once. Behind
//! daprd it is the floor of any pluggable component (daprd's own work plus one gRPC call over
//! a Unix socket); what stategate's component costs beyond it is stategate's share of the hop.

use std::collections::HashMap;
use std::path::Path;

use stategate::grpc::pb::DESCRIPTOR_SET;
use stategate::grpc::pb::dapr::proto::components::v1 as cpb;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::requests::VALUE_LEN;

#[derive(Clone, Copy)]
pub struct Bare;

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl cpb::state_store_server::StateStore for Bare {
    async fn init(&self, _r: Request<cpb::InitRequest>) -> Answer<cpb::InitResponse> {
        Ok(Response::new(cpb::InitResponse {}))
    }
    async fn features(&self, _r: Request<cpb::FeaturesRequest>) -> Answer<cpb::FeaturesResponse> {
        // What daprd needs to accept transactions and ETags, as for stategate.
        let features = ["ETAG", "TRANSACTIONAL"].map(String::from).to_vec();
        Ok(Response::new(cpb::FeaturesResponse { features }))
    }
    async fn delete(&self, _r: Request<cpb::DeleteRequest>) -> Answer<cpb::DeleteResponse> {
        Ok(Response::new(cpb::DeleteResponse {}))
    }
    async fn get(&self, _r: Request<cpb::GetRequest>) -> Answer<cpb::GetResponse> {
        Ok(Response::new(cpb::GetResponse {
            data: vec![b'v'; VALUE_LEN],
            etag: Some(cpb::Etag {
                value: "000000000000001:00000:bare".into(),
            }),
            metadata: HashMap::new(),
            content_type: String::new(),
        }))
    }
    async fn set(&self, _r: Request<cpb::SetRequest>) -> Answer<cpb::SetResponse> {
        Ok(Response::new(cpb::SetResponse {}))
    }
    async fn ping(&self, _r: Request<cpb::PingRequest>) -> Answer<cpb::PingResponse> {
        Ok(Response::new(cpb::PingResponse {}))
    }
    async fn bulk_delete(&self, _r: Request<cpb::BulkDeleteRequest>) -> Answer<cpb::BulkDeleteResponse> {
        Ok(Response::new(cpb::BulkDeleteResponse {}))
    }
    async fn bulk_get(&self, _r: Request<cpb::BulkGetRequest>) -> Answer<cpb::BulkGetResponse> {
        Ok(Response::new(cpb::BulkGetResponse::default()))
    }
    async fn bulk_set(&self, _r: Request<cpb::BulkSetRequest>) -> Answer<cpb::BulkSetResponse> {
        Ok(Response::new(cpb::BulkSetResponse {}))
    }
}

#[tonic::async_trait]
impl cpb::transactional_state_store_server::TransactionalStateStore for Bare {
    async fn transact(&self, _r: Request<cpb::TransactionalStateRequest>) -> Answer<cpb::TransactionalStateResponse> {
        Ok(Response::new(cpb::TransactionalStateResponse {}))
    }
}

/// Serves the bare component on `socket` (spawned on the current runtime). daprd discovers a
/// socket's component types through gRPC reflection, so that is served too.
pub fn serve(socket: &Path) {
    let listener = tokio::net::UnixListener::bind(socket).expect("bind the bare component's socket");
    let services = [
        cpb::state_store_server::SERVICE_NAME,
        cpb::transactional_state_store_server::SERVICE_NAME,
    ];
    let reflection = || {
        services.iter().fold(
            tonic_reflection::server::Builder::configure().register_encoded_file_descriptor_set(DESCRIPTOR_SET),
            |b, s| b.with_service_name(*s),
        )
    };
    let v1 = reflection().build_v1().expect("reflection");
    let v1alpha = reflection().build_v1alpha().expect("reflection");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(cpb::state_store_server::StateStoreServer::new(Bare))
            .add_service(cpb::transactional_state_store_server::TransactionalStateStoreServer::new(Bare))
            .add_service(v1)
            .add_service(v1alpha)
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
}
