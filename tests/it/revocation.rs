//! Revocation on reload: KEYNOTIFY registrations of a client that lost `observe` fall silent;
//! SSE, gRPC Watch and configuration streams of a token a reload removed end (`revoked`,
//! UNAUTHENTICATED) while other callers' streams go on; a configuration subscription can be
//! ended by id only by the caller that opened it.

use std::path::Path;

use serde_json::json;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::grpc::pb::statestore::v1 as npb;
use tonic::metadata::MetadataValue;

use crate::support::{Broker, RawClient, TestEnv, within};

const RULES: &str = r#"
[[rule]]
client_ids = ["dev-*"]
allow = ["read", "write", "observe"]
keys = ["devices/{clientId}/*"]

[[rule]]
tokens = ["app", "viewer"]
allow = ["read", "write"]
keys = ["app/*"]

[[rule]]
tokens = ["ops"]
allow = ["read", "write"]
keys = ["devices/*"]
"#;

const APP: &str = "app-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";
const OPS: &str = "ops-token-0123456789";

/// The KEYNOTIFY topic prefix of the state store protocol.
const NOTIFY_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

async fn start(dir: &Path) -> TestEnv {
    std::fs::write(dir.join("acl.toml"), RULES).unwrap();
    std::fs::write(dir.join("tokens"), format!("app:{APP}\nviewer:{VIEWER}\nops:{OPS}\n")).unwrap();
    TestEnv::start_with(Broker::Embedded, |c| {
        c.access.acl_file = Some(dir.join("acl.toml"));
        c.access.api_token_file = Some(dir.join("tokens"));
    })
    .await
}

fn reload(env: &TestEnv) {
    env.service
        .as_ref()
        .expect("in-process service")
        .access()
        .reload()
        .expect("reload");
}

/// A server-sent events reader: the next event's name and data (comments skipped); `None` once
/// the stream has ended.
struct Sse {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    async fn open(url: String, token: &str) -> Sse {
        let resp = within(
            "subscribe",
            reqwest::Client::new().get(url).header("dapr-api-token", token).send(),
        )
        .await
        .expect("subscribe");
        assert_eq!(resp.status(), 200);
        Sse { resp, buf: Vec::new() }
    }

    async fn next(&mut self) -> Option<(String, String)> {
        within("an SSE event or the end", async {
            loop {
                if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                    let block = String::from_utf8(self.buf.drain(..end + 2).collect()).expect("utf8");
                    let (mut name, mut data) = (String::from("message"), String::new());
                    let mut any = false;
                    for line in block.lines() {
                        match line.split_once(':') {
                            Some(("event", v)) => (name, any) = (v.trim().to_owned(), true),
                            Some(("data", v)) => (data, any) = (v.trim().to_owned(), true),
                            _ => {}
                        }
                    }
                    if any {
                        return Some((name, data));
                    }
                    continue;
                }
                match self.resp.chunk().await {
                    Ok(Some(c)) => self.buf.extend_from_slice(&c),
                    Ok(None) | Err(_) => return None,
                }
            }
        })
        .await
    }
}

async fn save(env: &TestEnv, key: &str, value: &str) {
    save_as(env, APP, key, value).await
}

async fn save_as(env: &TestEnv, token: &str, key: &str, value: &str) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1.0/state/statestore", env.http()))
        .header("dapr-api-token", token)
        .json(&json!([{"key": key, "value": value}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("dapr-api-token", MetadataValue::try_from(token).unwrap());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keynotify_falls_silent_when_a_reload_takes_observe_away() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path()).await;
    let mut dev = RawClient::connect(env.broker_port, "dev-1").await;
    dev.subscribe(&format!(
        "{NOTIFY_PREFIX}/{}/command/notify/+",
        hex::encode_upper("dev-1")
    ))
    .await;
    for key in [&b"devices/dev-1/x"[..], b"devices/dev-1/y"] {
        let r = dev.request(&[b"KEYNOTIFY", key], &[]).await;
        assert_eq!(&r.payload[..], b"+OK\r\n");
    }
    // The device keeps read and write on its keys, and observe on y only.
    let narrowed = RULES.replace(
        "allow = [\"read\", \"write\", \"observe\"]\nkeys = [\"devices/{clientId}/*\"]",
        "allow = [\"read\", \"write\"]\nkeys = [\"devices/{clientId}/*\"]\n\n[[rule]]\nclient_ids = [\"dev-*\"]\nallow = [\"observe\"]\nkeys = [\"devices/{clientId}/y\"]",
    );
    assert_ne!(narrowed, RULES);
    std::fs::write(dir.path().join("acl.toml"), narrowed).unwrap();
    reload(&env);
    // Written by another caller, so that the device receives nothing but notifications.
    save_as(&env, OPS, "devices/dev-1/x", "v").await;
    save_as(&env, OPS, "devices/dev-1/y", "v").await;
    // Notifications go out in change order: the first one the device sees is y's.
    let n = dev.next().await;
    let topic = String::from_utf8_lossy(&n.topic);
    assert!(
        topic.ends_with(&hex::encode_upper("devices/dev-1/y")),
        "x's notification was withheld: {topic}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_a_removed_token_end_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path()).await;
    let state = format!("{}/v1.0-alpha1/state/statestore/subscribe?pattern=app/*", env.http());
    let config = format!("{}/v1.0/configuration/configstore/subscribe?key=app/c", env.http());
    let mut viewer_sse = Sse::open(state.clone(), VIEWER).await;
    let mut viewer_config = Sse::open(config.clone(), VIEWER).await;
    let mut app_sse = Sse::open(state, APP).await;
    assert_eq!(viewer_config.next().await.expect("open").0, "subscribe");
    let mut watch = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap()
        .watch(authed(
            npb::WatchRequest {
                patterns: vec!["app/*".into()],
                ..Default::default()
            },
            VIEWER,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut grpc_config = rpb::dapr_client::DaprClient::connect(env.grpc())
        .await
        .unwrap()
        .subscribe_configuration(authed(
            rpb::SubscribeConfigurationRequest {
                store_name: "configstore".into(),
                keys: vec!["app/c".into()],
                metadata: Default::default(),
            },
            VIEWER,
        ))
        .await
        .unwrap()
        .into_inner();
    within("the first message", grpc_config.message())
        .await
        .unwrap()
        .expect("open");
    // Every stream is live: a change reaches each.
    save(&env, "app/c", "1").await;
    assert_eq!(viewer_sse.next().await.expect("open").0, "set");
    assert_eq!(viewer_config.next().await.expect("open").0, "update");
    assert_eq!(app_sse.next().await.expect("open").0, "set");
    assert!(within("a watch event", watch.message()).await.unwrap().is_some());
    assert!(within("an update", grpc_config.message()).await.unwrap().is_some());

    // The viewer's token is removed: its four streams end, saying why.
    std::fs::write(dir.path().join("tokens"), format!("app:{APP}\nops:{OPS}\n")).unwrap();
    reload(&env);
    assert_eq!(viewer_sse.next().await.expect("a last event").0, "revoked");
    assert_eq!(viewer_sse.next().await, None);
    assert_eq!(viewer_config.next().await.expect("a last event").0, "revoked");
    assert_eq!(viewer_config.next().await, None);
    let e = within("the watch to end", watch.message()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    let e = within("the subscription to end", grpc_config.message())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    // The app's token stays, and so does its stream.
    save(&env, "app/c", "2").await;
    let (name, data) = app_sse.next().await.expect("still open");
    assert_eq!(name, "set");
    assert!(data.contains("\"2\""), "{data}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_its_owner_ends_a_configuration_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path()).await;
    let url = format!("{}/v1.0/configuration/configstore/subscribe?key=app/c", env.http());
    let mut sub = Sse::open(url, APP).await;
    let (name, data) = sub.next().await.expect("open");
    assert_eq!(name, "subscribe");
    let id = serde_json::from_str::<serde_json::Value>(&data).unwrap()["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let unsubscribe = |token: &'static str| {
        reqwest::Client::new()
            .get(format!(
                "{}/v1.0/configuration/configstore/{id}/unsubscribe",
                env.http()
            ))
            .header("dapr-api-token", token)
            .send()
    };
    // Another caller gets what an unknown id gets, over HTTP and gRPC, and ends nothing.
    assert_eq!(unsubscribe(VIEWER).await.unwrap().status(), 404);
    let r = rpb::dapr_client::DaprClient::connect(env.grpc())
        .await
        .unwrap()
        .unsubscribe_configuration(authed(
            rpb::UnsubscribeConfigurationRequest {
                store_name: "configstore".into(),
                id: id.clone(),
            },
            VIEWER,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.ok, "{}", r.message);
    save(&env, "app/c", "still here").await;
    assert_eq!(sub.next().await.expect("still open").0, "update");
    // The owner ends it.
    assert_eq!(unsubscribe(APP).await.unwrap().status(), 200);
    assert_eq!(sub.next().await, None);
    env.stop().await;
}
