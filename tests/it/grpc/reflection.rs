//! Health and reflection on the TCP door.

use super::*;

pub(super) async fn list_services_v1(ch: Channel) -> BTreeSet<String> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};
    let mut client = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = within("reflection", client.server_reflection_info(tokio_stream::iter([req])))
        .await
        .expect("reflection v1")
        .into_inner();
    let resp: ServerReflectionResponse = within("a reflection answer", stream.message())
        .await
        .expect("reflection answer")
        .expect("one answer");
    match resp.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("expected a service list, got {other:?}"),
    }
}

pub(super) async fn list_services_v1alpha(ch: Channel) -> BTreeSet<String> {
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha::{ServerReflectionRequest, ServerReflectionResponse};
    let mut client = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = within("reflection", client.server_reflection_info(tokio_stream::iter([req])))
        .await
        .expect("reflection v1alpha")
        .into_inner();
    let resp: ServerReflectionResponse = within("a reflection answer", stream.message())
        .await
        .expect("reflection answer")
        .expect("one answer");
    match resp.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("expected a service list, got {other:?}"),
    }
}

/// The symbol's file descriptor is served by reflection v1 (what grpcurl `describe` needs).
pub(super) async fn reflection_describes(ch: Channel, symbol: &str) -> bool {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut client = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())),
    };
    let mut stream = within("reflection", client.server_reflection_info(tokio_stream::iter([req])))
        .await
        .expect("reflection v1")
        .into_inner();
    let resp = within("a reflection answer", stream.message())
        .await
        .expect("reflection answer")
        .expect("one answer");
    matches!(resp.message_response, Some(MessageResponse::FileDescriptorResponse(f)) if !f.file_descriptor_proto.is_empty())
}

const TCP_SERVICES: [&str; 3] = [
    "dapr.proto.runtime.v1.Dapr",
    "statestore.v1.StateStore",
    "statestore.v1.Election",
];
pub(super) const COMPONENT_SERVICES: [&str; 4] = [
    "dapr.proto.components.v1.QueriableStateStore",
    "dapr.proto.components.v1.StateStore",
    "dapr.proto.components.v1.TransactionalStateStore",
    "dapr.proto.components.v1.TransactionalStoreMultiMaxSize",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_on_tcp() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let env = TestEnv::start(Broker::Embedded).await;
    let ch = channel(&env).await;
    let mut health = HealthClient::new(ch.clone());
    for service in ["", "statestore.v1.StateStore", "dapr.proto.runtime.v1.Dapr"] {
        let h = within(
            "health Check",
            health.check(HealthCheckRequest {
                service: service.into(),
            }),
        )
        .await
        .unwrap_or_else(|s| panic!("health of {service:?}: {s:?}"))
        .into_inner();
        assert_eq!(h.status(), ServingStatus::Serving, "{service:?}");
    }
    expect_status(
        within(
            "health Check",
            health.check(HealthCheckRequest {
                service: "no.such.Service".into(),
            }),
        )
        .await,
        Code::NotFound,
        "",
    );

    let v1 = list_services_v1(ch.clone()).await;
    for s in TCP_SERVICES {
        assert!(v1.contains(s), "reflection v1 lists {s}: {v1:?}");
    }
    let v1alpha = list_services_v1alpha(ch.clone()).await;
    for s in TCP_SERVICES {
        assert!(v1alpha.contains(s), "reflection v1alpha lists {s}: {v1alpha:?}");
    }
    assert!(reflection_describes(ch.clone(), "dapr.proto.runtime.v1.Dapr").await);
    assert!(reflection_describes(ch, "statestore.v1.WatchEvent").await);
    env.stop().await;
}

/// Reflection advertises what each door serves and nothing else: a client (grpcurl, daprd)
/// that trusts the list must not find services that answer UNIMPLEMENTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_only_served_services() {
    let (env, _dir, socket) = component_env(|_| {}).await;
    let tcp = list_services_v1(channel(&env).await).await;
    let served_tcp: BTreeSet<String> = TCP_SERVICES
        .iter()
        .chain(["grpc.reflection.v1.ServerReflection"].iter())
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        tcp.difference(&served_tcp).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "the TCP door advertises services it does not serve"
    );
    let sock = list_services_v1alpha(socket).await;
    let served_sock: BTreeSet<String> = COMPONENT_SERVICES
        .iter()
        .chain(["grpc.reflection.v1alpha.ServerReflection"].iter())
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        sock.difference(&served_sock).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "the component socket advertises services it does not serve"
    );
    env.stop().await;
}
