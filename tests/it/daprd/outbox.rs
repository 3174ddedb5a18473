//! Dapr's transactional outbox to MQTT devices, with the component files of
//! `deploy/dapr/outbox/` (the broker URL pointed at this test's broker): a state transaction
//! through daprd reaches a device subscribed on stategate's embedded broker exactly when it
//! commits, as a CloudEvent; a transaction refused for a stale ETag applies nothing, its outbox
//! record included, and publishes nothing.
//!
//! How daprd does it: with the transaction it publishes a message on an internal topic and adds
//! a record (`outbox-<uuid>`, without the app's key prefix) to the transaction; its subscriber of that topic publishes to the
//! devices' topic only once it finds the record in the store, then deletes the record. So the
//! store's all-or-nothing transaction is what makes the outbox exact, and the test watches the
//! records come and go in stategate's own change feed. And that exactness, on every backend: a
//! transaction through daprd whose last operation fails its ETag applies none of the others.

use std::time::Duration;

use serde_json::{Value, json};

use super::sdk::stategate_for;
use super::{Daprd, DaprdOptions};
use crate::support::{RawClient, Storage, repo_path, unique_id};

const TOPIC: &str = "orders/events";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_reaches_devices_exactly_when_its_transaction_commits() {
    let app = "orders";
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(app, sockets.path(), Storage::Memory).await;
    let resources = tempfile::tempdir().expect("tempdir");
    for file in ["statestore.yaml", "pubsub.yaml"] {
        let text = std::fs::read_to_string(repo_path("deploy/dapr/outbox").join(file)).expect("deploy/dapr/outbox");
        let text = text.replace("tcp://127.0.0.1:1883", &format!("tcp://127.0.0.1:{}", env.broker_port));
        std::fs::write(resources.path().join(file), text).expect("write a component file");
    }
    let mut feed = env.engine().subscribe();
    let mut device = RawClient::connect(env.broker_port, &unique_id("device")).await;
    device.subscribe(TOPIC).await;
    let daprd = Daprd::start(&DaprdOptions {
        app_id: app.into(),
        sockets: sockets.path().to_owned(),
        resources: resources.path().to_owned(),
        placement: None,
        scheduler: None,
        app_port: None,
    })
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let transact = |operations: Value| {
        http.post(format!("{}/v1.0/state/statestore/transaction", daprd.http()))
            .json(&json!({ "operations": operations }))
            .send()
    };
    let upsert = |key: &str, n: i64| {
        json!({"operation": "upsert",
               "request": {"key": key, "value": {"n": n}, "metadata": {"contentType": "application/json"}}})
    };

    // Refused: its second operation names a stale ETag. daprd answers the store's refusal.
    let mut stale = upsert("order-0", 0);
    stale["request"]["etag"] = json!("000000000000001:00000:stategate");
    let r = transact(json!([upsert("order-1", 1), stale]))
        .await
        .expect("daprd answers");
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    assert!(
        !status.is_success() && body.contains("etag"),
        "a stale ETag refuses the transaction: {status} {body}"
    );

    // Committed: the device gets it, once the outbox record is in the store.
    let r = transact(json!([upsert("order-2", 2)])).await.expect("daprd answers");
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap_or_default());
    let msg = device.next().await;
    assert_eq!(&msg.topic[..], TOPIC.as_bytes());
    let event: Value = serde_json::from_slice(&msg.payload).expect("a CloudEvent in JSON");
    assert_eq!(event["data"], json!({"n": 2}), "{event}");
    assert_eq!(event["datacontenttype"], "application/json", "{event}");
    assert_eq!(event["specversion"], "1.0", "{event}");
    assert_eq!(event["type"], "com.dapr.event.sent", "{event}");
    assert_eq!(event["source"], app, "{event}");
    assert_eq!(event["topic"], TOPIC, "{event}");
    assert_eq!(event["pubsubname"], "devices", "{event}");
    let id = event["id"].as_str().expect("an id").to_owned();
    assert!(id.starts_with("outbox-"), "the id is the outbox record's key: {event}");

    // What stategate applied, in order: the committed transaction (its key and its record
    // together) and the record's removal after the publish; nothing of the refused one. daprd
    // writes the record under its own name, without the app's key prefix.
    let record = id.clone();
    let mut changes = Vec::new();
    loop {
        let ev = match tokio::time::timeout(Duration::from_secs(20), feed.recv()).await {
            Ok(ev) => ev.expect("the feed keeps up"),
            Err(_) => panic!("the outbox record {record} was not removed in time; changes: {changes:?}"),
        };
        let key = String::from_utf8_lossy(&ev.change.key).into_owned();
        let removed = !matches!(ev.change.kind, stategate::engine::ChangeKind::Set(_));
        changes.push((key.clone(), removed));
        if key == record && removed {
            break;
        }
    }
    assert!(
        changes
            .iter()
            .all(|(k, _)| k != &format!("{app}||order-1") && k != &format!("{app}||order-0")),
        "the refused transaction applied nothing: {changes:?}"
    );
    let records: Vec<_> = changes.iter().filter(|(k, _)| k.contains("outbox-")).collect();
    assert_eq!(
        records,
        [&(record.clone(), false), &(record.clone(), true)],
        "one record, the committed transaction's, written then removed: {changes:?}"
    );
    assert!(changes.contains(&(format!("{app}||order-2"), false)), "{changes:?}");

    // The next message a device gets is the next committed transaction's: the refused one
    // published nothing in between.
    let r = transact(json!([upsert("order-3", 3)])).await.expect("daprd answers");
    assert_eq!(r.status(), 204);
    let next: Value = serde_json::from_slice(&device.next().await.payload).expect("JSON");
    assert_eq!(next["data"], json!({"n": 3}), "{next}");

    daprd.stop().await;
    env.stop().await;
}

/// A transaction through daprd whose last operation fails its ETag applies none of its
/// operations, on every backend (what Dapr's Redis component cannot promise: it has no
/// rollback). Its first operations overwrite a key, delete another and create a third.
async fn all_or_nothing_on(storage: Storage) {
    let app = "ledger";
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(app, sockets.path(), storage).await;
    let daprd = Daprd::start(&DaprdOptions {
        app_id: app.into(),
        sockets: sockets.path().to_owned(),
        resources: super::deploy_dapr(),
        placement: None,
        scheduler: None,
        app_port: None,
    })
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let state = format!("{}/v1.0/state/statestore", daprd.http());
    let save = http
        .post(&state)
        .json(&json!([{"key": "a", "value": 1}, {"key": "b", "value": 2}, {"key": "last", "value": 3}]))
        .send()
        .await
        .expect("daprd answers");
    assert_eq!(save.status(), 204);
    let etag = |key: &'static str| {
        let http = http.clone();
        let url = format!("{state}/{key}");
        async move {
            let r = http.get(url).send().await.expect("daprd answers");
            r.headers()["etag"].to_str().unwrap().to_owned()
        }
    };
    let before = [etag("a").await, etag("b").await, etag("last").await];
    let stale = "000000000000001:00000:stategate";
    let r = http
        .post(format!("{state}/transaction"))
        .json(&json!({"operations": [
            {"operation": "upsert", "request": {"key": "a", "value": 10}},
            {"operation": "delete", "request": {"key": "b"}},
            {"operation": "upsert", "request": {"key": "new", "value": 5}},
            {"operation": "upsert", "request": {"key": "last", "value": 30, "etag": stale}},
        ]}))
        .send()
        .await
        .expect("daprd answers");
    assert!(!r.status().is_success(), "the stale ETag refuses the transaction");
    // Every key as it was, with its version: over daprd and over stategate's own MQTT door.
    let after = [etag("a").await, etag("b").await, etag("last").await];
    assert_eq!(before, after, "no operation of the refused transaction was applied");
    let r = http.get(format!("{state}/new")).send().await.expect("daprd answers");
    assert_eq!(r.status(), 204, "the key the transaction would have created is absent");
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("ledger-check")).await;
    let a = mqtt.request(&[b"GET", b"ledger||a"], &[]).await;
    assert_eq!(&a.payload[..], b"$1\r\n1\r\n", "MQTT reads the old value of a");
    let new = mqtt.request(&[b"GET", b"ledger||new"], &[]).await;
    assert_eq!(&new.payload[..], b"$-1\r\n");
    daprd.stop().await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_transaction_through_daprd_applies_nothing_on_every_backend() {
    all_or_nothing_on(Storage::Memory).await;
    all_or_nothing_on(Storage::Durable).await;
    let server = crate::redis::server::TestServer::start(crate::redis::server::Flavor::Redis);
    let store = stategate::storage::Store::open(&crate::redis::redis_storage(&server))
        .await
        .expect("open the Redis store");
    all_or_nothing_on(Storage::Shared(store)).await;
}
