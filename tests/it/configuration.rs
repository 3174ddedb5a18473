//! The Dapr configuration API on the same keys: the official Python SDK's get_configuration,
//! subscribe_configuration and unsubscribe_configuration seeing MQTT, HTTP and gRPC writes
//! (deletes and expiries too), daprd's HTTP shapes, and the server-sent events subscription.

use serde_json::{Value, json};

use crate::pysdk::PySdk;
use crate::support::{Broker, TestEnv, now_ts, within};
use crate::watch::Doors;

const STORE: &str = "configstore";

/// The single item of a subscription event, with the subscription id.
fn only_item(event: &Value) -> (&str, &str, &Value) {
    let items = event["items"].as_object().expect("items");
    assert_eq!(items.len(), 1, "one change per message: {event}");
    let (key, item) = items.iter().next().expect("an item");
    (event["id"].as_str().expect("id"), key.as_str(), item)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_get_subscribe_unsubscribe_see_every_door() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut py = PySdk::start(&env).await;
    let mut doors = Doors::connect(&env).await;
    let keys = json!(["cfg/a", "cfg/b", "cfg/c"]);
    let id = py
        .call(json!({"op": "subscribe_configuration", "store": STORE, "keys": keys}))
        .await["id"]
        .as_str()
        .expect("subscription id")
        .to_owned();
    assert!(!id.is_empty());

    // A write through each door reaches the SDK's handler with the writer's version.
    let mqtt = doors.set(0, "cfg/a", "on").await;
    let http = doors.set(1, "cfg/b", "blue").await;
    let grpc = doors.set(2, "cfg/c", "42").await;
    doors.set(0, "cfg/other", "not subscribed").await;
    for (key, value, version) in [
        ("cfg/a", "on", &mqtt),
        ("cfg/b", "\"blue\"", &http),
        ("cfg/c", "42", &grpc),
    ] {
        let ev = py.event().await;
        let (got_id, got_key, item) = only_item(&ev);
        assert_eq!((got_id, got_key), (id.as_str(), key));
        assert_eq!(item["value"], value, "{key}: the stored text (HTTP stores JSON)");
        assert_eq!(item["version"].as_str(), Some(version.as_str()));
    }
    // A delete, and an expiry, come as items with metadata `deleted`.
    doors.del(0, "cfg/a").await;
    let ev = py.event().await;
    let (_, key, item) = only_item(&ev);
    assert_eq!((key, item["value"].as_str()), ("cfg/a", Some("")));
    assert_eq!(item["metadata"], json!({"deleted": "true"}));
    let r = reqwest::Client::new()
        .post(format!("{}/v1.0/state/statestore?metadata.ttlInSeconds=1", env.http()))
        .json(&json!([{"key": "cfg/b", "value": "short"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(only_item(&py.event().await).2["value"], "\"short\"");
    let ev = py.event().await;
    assert_eq!(
        only_item(&ev).2["metadata"],
        json!({"deleted": "true", "expired": "true"})
    );

    // Get: named keys (missing ones left out), and every key of the store.
    let got = py
        .call(json!({"op": "get_configuration", "store": STORE, "keys": ["cfg/c", "cfg/a"]}))
        .await;
    assert_eq!(
        got["items"],
        json!({"cfg/c": {"value": "42", "version": grpc, "metadata": {}}})
    );
    let all = py
        .call(json!({"op": "get_configuration", "store": STORE, "keys": []}))
        .await;
    let names: Vec<_> = all["items"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(names, ["cfg/c", "cfg/other"]);

    // Unsubscribe ends it: a change after it reaches only a newer subscription.
    let ok = py
        .call(json!({"op": "unsubscribe_configuration", "store": STORE, "id": id}))
        .await;
    assert_eq!(ok["ok"], true);
    let again = py
        .call(json!({"op": "unsubscribe_configuration", "store": STORE, "id": id}))
        .await;
    assert_eq!(again["ok"], false, "already ended");
    doors.set(2, "cfg/c", "after unsubscribe").await;
    let newer = py
        .call(json!({"op": "subscribe_configuration", "store": STORE, "keys": ["cfg/a"]}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    doors.set(2, "cfg/a", "to the newer one").await;
    let ev = py.event().await;
    assert_eq!(only_item(&ev).0, newer, "the ended subscription sent nothing more");
    assert_eq!(only_item(&ev).1, "cfg/a");
    py.quit().await;
    env.stop().await;
}

/// The SSE subscription: `subscribe` with the id, `update` per change, ended by an
/// unsubscribe from the other door (one registry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_get_and_the_sse_subscription() {
    use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
    let env = TestEnv::start_with(Broker::Embedded, |c| c.dapr.max_bulk_keys = 3).await;
    let c = reqwest::Client::new();
    let base = format!("{}/v1.0/configuration/{STORE}", env.http());
    assert_eq!(c.get(&base).send().await.unwrap().status(), 204, "no items");
    let mut sse = c.get(format!("{base}/subscribe?key=k1&key=k2")).send().await.unwrap();
    assert_eq!(sse.status(), 200);
    let mut doors = Doors::connect(&env).await;
    let v1 = doors.set(0, "k1", "one").await;
    doors.set(0, "k3", "three").await;
    let mut text = String::new();
    let (mut id, mut seen) = (String::new(), None);
    while seen.is_none() {
        let chunk = within("SSE", sse.chunk()).await.unwrap().expect("open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        for block in text.split("\n\n") {
            let data = block.lines().find_map(|l| l.strip_prefix("data:")).map(str::trim);
            if block.contains("event: subscribe") || block.contains("event:subscribe") {
                id = serde_json::from_str::<Value>(data.unwrap()).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned();
            }
            if block.contains("update") && block.contains(&format!("id: {v1}")) {
                seen = Some(serde_json::from_str::<Value>(data.unwrap()).unwrap());
            }
        }
    }
    assert!(!id.is_empty(), "the first event carries the subscription id");
    assert_eq!(
        seen.unwrap(),
        json!({"id": id, "items": {"k1": {"value": "one", "version": v1}}})
    );
    // GET: a map of items; unknown stores and too many keys are 400s.
    let m: Value = c
        .get(format!("{base}?key=k1&key=nope"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m, json!({"k1": {"value": "one", "version": v1}}));
    let alpha: Value = c
        .get(format!("{}/v1.0-alpha1/configuration/{STORE}?key=k1", env.http()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(alpha, m, "also under v1.0-alpha1");
    let all: Value = c.get(&base).send().await.unwrap().json().await.unwrap();
    assert_eq!(all.as_object().unwrap().len(), 2);
    doors.set(0, "k4", "x").await;
    doors.set(0, "k5", &now_ts()).await;
    let r = c.get(&base).send().await.unwrap();
    assert_eq!(r.status(), 400, "four keys, more than --max-bulk-keys 3");
    let err: Value = r.json().await.unwrap();
    assert!(err["message"].as_str().unwrap().contains("more than 3 keys"), "{err}");
    let r = c
        .get(format!("{}/v1.0/configuration/nope", env.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["errorCode"],
        "ERR_CONFIGURATION_STORE_NOT_FOUND"
    );

    // Unsubscribed over gRPC, the HTTP stream ends.
    let mut d = rpb::dapr_client::DaprClient::connect(env.grpc()).await.unwrap();
    let r = d
        .unsubscribe_configuration(rpb::UnsubscribeConfigurationRequest {
            store_name: STORE.into(),
            id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.ok);
    while within("the SSE stream to end", sse.chunk()).await.unwrap().is_some() {}
    let gone = c.get(format!("{base}/{id}/unsubscribe")).send().await.unwrap();
    assert_eq!(gone.status(), 404);
    assert_eq!(
        gone.json::<Value>().await.unwrap()["errorCode"],
        "ERR_CONFIGURATION_UNSUBSCRIBE"
    );
    env.stop().await;
}

/// Stopping the service ends configuration subscriptions on both doors (as it ends change
/// streams), so shutdown does not wait out its grace period for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_end_when_the_service_stops() {
    use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
    // A grace period far longer than the test waits: only ended streams let `stop` return.
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.ops.shutdown_grace = std::time::Duration::from_secs(600)
    })
    .await;
    let mut sse = reqwest::get(format!("{}/v1.0/configuration/{STORE}/subscribe?key=k1", env.http()))
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let first = within("the subscribe event", sse.chunk()).await.unwrap().expect("open");
    assert!(String::from_utf8_lossy(&first).contains("subscribe"));
    let mut d = rpb::dapr_client::DaprClient::connect(env.grpc()).await.unwrap();
    let mut grpc = d
        .subscribe_configuration(rpb::SubscribeConfigurationRequest {
            store_name: STORE.into(),
            keys: vec!["k1".into()],
            metadata: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    let id = within("the first message", grpc.message())
        .await
        .unwrap()
        .expect("open")
        .id;
    assert!(!id.is_empty());
    within("the service to stop", env.stop()).await;
    while within("the SSE stream to end", sse.chunk())
        .await
        .unwrap_or(None)
        .is_some()
    {}
    assert!(
        !matches!(within("the gRPC stream to end", grpc.message()).await, Ok(Some(_))),
        "no message after the stop"
    );
}
