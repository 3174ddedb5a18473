//! The Dapr distributed lock API: the official Python SDK's try_lock/unlock, daprd's HTTP shapes,
//! the fencing token (HTTP header, gRPC metadata) stopping a stale holder, and a Dapr lock and
//! an Azure IoT Operations lease on the same name excluding each other, both ways.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};
use stategate::engine::watch::{Start, WatchItem, WatchSpec};
use stategate::engine::{ChangeKind, KeyFilter};
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::hlc::Hlc;

use crate::aio::Sdk;
use crate::pysdk::PySdk;
use crate::support::{Broker, TestEnv, within};

const STORE: &str = "lockstore";

/// Resolves when `key` expires (the service's expiry driver removed it).
fn expiry_of(env: &TestEnv, key: &'static [u8]) -> impl std::future::Future<Output = ()> + use<> {
    let spec = WatchSpec {
        wanted: KeyFilter::new(move |k| k == key),
        prefix: Bytes::new(),
        only: Some(vec![Bytes::from_static(key)]),
    };
    let mut changes = Box::pin(env.engine().watch(spec, Start::Live));
    async move {
        while let Some(item) = changes.next().await {
            if let WatchItem::Change { event, .. } = item
                && event.change.kind == ChangeKind::Expire
            {
                return;
            }
        }
        panic!("the watch ended before {key:?} expired");
    }
}

fn token_header(headers: &Value) -> Hlc {
    headers["metadata.fencingtoken"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no fencing token in {headers}"))
        .parse()
        .expect("the fencing token is a version")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_try_lock_unlock_statuses_and_expiry() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut py = PySdk::start(&env).await;
    let lock = |resource: &str, owner: &str, expiry: u32| json!({"op": "try_lock", "store": STORE, "resource": resource, "owner": owner, "expiry": expiry});
    let unlock =
        |resource: &str, owner: &str| json!({"op": "unlock", "store": STORE, "resource": resource, "owner": owner});

    let taken = py.call(lock("orders", "app-a", 60)).await;
    assert_eq!(taken["success"], true);
    let token = token_header(&taken["headers"]);
    let held = env.engine().read(&Bytes::from("orders")).await.unwrap().unwrap();
    assert_eq!(
        (&held.value[..], &held.version),
        (&b"app-a"[..], &token),
        "owner as value; token = version"
    );
    for owner in ["app-b", "app-a"] {
        let again = py.call(lock("orders", owner, 60)).await;
        assert_eq!(again["success"], false, "{owner} while held");
        assert!(again["headers"].get("metadata.fencingtoken").is_none());
    }
    assert_eq!(
        py.call(unlock("orders", "app-b")).await["status"],
        2,
        "LOCK_BELONGS_TO_OTHERS"
    );
    assert_eq!(py.call(unlock("orders", "app-a")).await["status"], 0, "SUCCESS");
    assert_eq!(
        py.call(unlock("orders", "app-a")).await["status"],
        1,
        "LOCK_DOES_NOT_EXIST"
    );
    let err = py
        .try_call(json!({"op": "try_lock", "store": "nope", "resource": "r", "owner": "o", "expiry": 5}))
        .await
        .unwrap_err();
    assert!(err.contains("lock store nope is not found"), "{err}");

    // Expiry frees the lock for the next owner, with a higher token.
    let expired = expiry_of(&env, b"short");
    assert_eq!(py.call(lock("short", "app-a", 1)).await["success"], true);
    assert_eq!(py.call(lock("short", "app-b", 30)).await["success"], false);
    within("the lock to expire", expired).await;
    let next = py.call(lock("short", "app-b", 30)).await;
    assert_eq!(next["success"], true);
    assert!(token_header(&next["headers"]) > token);
    py.quit().await;
    env.stop().await;
}

/// A Dapr lock and an AIO lease on one name: whoever holds it first keeps the other out, and the
/// release of one lets the other in, in both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dapr_lock_and_an_aio_lease_exclude_each_other() {
    use azure_iot_operations_services::leased_lock::ErrorKind;
    let env = TestEnv::start(Broker::Embedded).await;
    let mut py = PySdk::start(&env).await;
    let aio = Sdk::connect(env.broker_port, "aio-vs-dapr").await;
    let name = "shared/job";
    let lease = aio.lease(name.as_bytes());
    let timeout = Duration::from_secs(5);
    let ttl = Duration::from_secs(30);
    let dapr_lock = json!({"op": "try_lock", "store": STORE, "resource": name, "owner": "dapr-app", "expiry": 30});
    let dapr_unlock = json!({"op": "unlock", "store": STORE, "resource": name, "owner": "dapr-app"});

    // AIO first: the Dapr app is kept out, and cannot release what it does not hold.
    within("AIO acquire", lease.acquire(ttl, timeout, None))
        .await
        .expect("AIO acquires");
    assert_eq!(py.call(dapr_lock.clone()).await["success"], false);
    assert_eq!(py.call(dapr_unlock.clone()).await["status"], 2);
    within("AIO release", lease.release(timeout))
        .await
        .expect("AIO releases");
    assert_eq!(py.call(dapr_lock.clone()).await["success"], true);

    // Dapr first: the AIO lease is refused and sees the Dapr app as the holder.
    match within("AIO acquire", lease.acquire(ttl, timeout, None)).await {
        Err(e) => assert!(matches!(e.kind(), ErrorKind::LeaseAlreadyHeld), "{e:?}"),
        Ok(t) => panic!("the AIO lease was granted over a Dapr lock (token {t})"),
    }
    let holder = within("get_holder", lease.get_holder(timeout))
        .await
        .expect("get_holder");
    assert_eq!(holder.as_deref(), Some(&b"dapr-app"[..]));
    assert_eq!(py.call(dapr_unlock).await["status"], 0);
    within("AIO acquire", lease.acquire(ttl, timeout, None))
        .await
        .expect("AIO acquires once the Dapr lock is released");
    within("AIO release", lease.release(timeout))
        .await
        .expect("AIO releases");
    aio.close().await;
    py.quit().await;
    env.stop().await;
}

async fn post(c: &reqwest::Client, url: String, body: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = c.post(url).body(body.to_owned()).send().await.expect("request");
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    let text = r.text().await.expect("body");
    (status, headers, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// HTTP as daprd serves it, and the fencing token stopping a holder whose lock expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_lock_shapes_and_fencing_a_stale_holder() {
    let env = TestEnv::start(Broker::Embedded).await;
    let c = reqwest::Client::new();
    let (lock_url, unlock_url) = (
        format!("{}/v1.0-alpha1/lock/{STORE}", env.http()),
        format!("{}/v1.0-alpha1/unlock/{STORE}", env.http()),
    );
    // protojson reads proto names too, and an int32 as a string; unknown fields are ignored.
    let expired = expiry_of(&env, b"res");
    let (status, headers, body) = post(
        &c,
        lock_url.clone(),
        r#"{"resource_id":"res","lockOwner":"a","expiryInSeconds":"1","extra":null}"#,
    )
    .await;
    assert_eq!((status, body), (200, json!({"success": true})));
    let old: Hlc = headers["metadata.fencingToken"].to_str().unwrap().parse().unwrap();
    let (status, headers, body) = post(
        &c,
        lock_url.clone(),
        r#"{"resourceId":"res","lockOwner":"b","expiryInSeconds":9}"#,
    )
    .await;
    assert_eq!((status, body), (200, json!({"success": false})));
    assert!(headers.get("metadata.fencingToken").is_none());

    let save = |token: &Hlc, value: &str| {
        json!([{"key": "guarded", "value": value, "metadata": {"fencingToken": token.to_string()}}]).to_string()
    };
    let state = format!("{}/v1.0/state/statestore", env.http());
    assert_eq!(post(&c, state.clone(), &save(&old, "from a")).await.0, 204);
    within("the lock to expire", expired).await;
    let (_, headers, body) = post(
        &c,
        lock_url.clone(),
        r#"{"resourceId":"res","lockOwner":"b","expiryInSeconds":30}"#,
    )
    .await;
    assert_eq!(body, json!({"success": true}));
    let new: Hlc = headers["metadata.fencingToken"].to_str().unwrap().parse().unwrap();
    assert!(new > old);
    assert_eq!(post(&c, state.clone(), &save(&new, "from b")).await.0, 204);
    let (status, _, body) = post(&c, state.clone(), &save(&old, "stale a")).await;
    assert_eq!(
        (status, body["errorCode"].as_str()),
        (409, Some("ERR_STATE_SAVE")),
        "{body}"
    );
    let got = c
        .get(format!("{state}/guarded"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(got, "\"from b\"");

    // Unlock statuses, and daprd's errors.
    for (owner, want) in [("a", 2), ("b", 0), ("b", 1)] {
        let body = json!({"resourceId": "res", "lockOwner": owner}).to_string();
        assert_eq!(
            post(&c, unlock_url.clone(), &body).await.2,
            json!({"status": want}),
            "{owner}"
        );
    }
    let cases = [
        // daprd checks the expiry first.
        (
            lock_url.clone(),
            "",
            400,
            "ERR_MALFORMED_REQUEST",
            "ExpiryInSeconds is not positive",
        ),
        (
            lock_url.clone(),
            "null",
            400,
            "ERR_MALFORMED_REQUEST",
            "ExpiryInSeconds is not positive",
        ),
        (
            lock_url.clone(),
            r#"{"lockOwner":"o","expiryInSeconds":1}"#,
            400,
            "ERR_MALFORMED_REQUEST",
            "ResourceId is empty",
        ),
        (
            lock_url.clone(),
            r#"{"resourceId":"r","lockOwner":"o"}"#,
            400,
            "ERR_MALFORMED_REQUEST",
            "not positive",
        ),
        (
            lock_url.clone(),
            r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":1.5}"#,
            400,
            "ERR_MALFORMED_REQUEST",
            "32-bit",
        ),
        (
            lock_url.clone(),
            r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":4294967296}"#,
            400,
            "ERR_MALFORMED_REQUEST",
            "32-bit",
        ),
        (
            lock_url.clone(),
            r#"{"resourceId":"r||x","lockOwner":"o","expiryInSeconds":1}"#,
            400,
            "ERR_MALFORMED_REQUEST",
            "||",
        ),
        (
            unlock_url.clone(),
            r#"{"resourceId":"r"}"#,
            400,
            "ERR_MALFORMED_REQUEST",
            "LockOwner is empty",
        ),
        (
            format!("{}/v1.0-alpha1/lock/nope", env.http()),
            "{}",
            400,
            "ERR_LOCK_STORE_NOT_FOUND",
            "lock store nope",
        ),
        (
            format!("{}/v1.0-alpha1/unlock/statestore", env.http()),
            "{}",
            400,
            "ERR_LOCK_STORE_NOT_FOUND",
            "statestore",
        ),
    ];
    for (url, body, status, code, text) in cases {
        let (got, _, err) = post(&c, url.clone(), body).await;
        assert_eq!(
            (got, err["errorCode"].as_str()),
            (status, Some(code)),
            "{url} {body}: {err}"
        );
        assert!(
            err["message"].as_str().unwrap_or_default().contains(text),
            "{body}: {err}"
        );
    }
    env.stop().await;
}

/// gRPC: the token comes back in the response metadata, and daprd's codes for bad requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_lock_returns_the_fencing_token_in_metadata() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut d = rpb::dapr_client::DaprClient::connect(env.grpc())
        .await
        .expect("connect");
    let req = |owner: &str, secs| rpb::TryLockRequest {
        store_name: STORE.into(),
        resource_id: "g".into(),
        lock_owner: owner.into(),
        expiry_in_seconds: secs,
    };
    let resp = within("TryLockAlpha1", d.try_lock_alpha1(req("a", 30)))
        .await
        .expect("TryLock");
    let token: Hlc = resp
        .metadata()
        .get("metadata.fencingtoken")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(resp.into_inner().success);
    let held = env.engine().read(&Bytes::from("g")).await.unwrap().unwrap();
    assert_eq!(held.version, token);
    let resp = within("TryLockAlpha1", d.try_lock_alpha1(req("b", 30)))
        .await
        .expect("TryLock");
    assert!(resp.metadata().get("metadata.fencingtoken").is_none());
    assert!(!resp.into_inner().success);
    let status = within("TryLockAlpha1", d.try_lock_alpha1(req("b", 0)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let unlock = rpb::UnlockRequest {
        store_name: STORE.into(),
        resource_id: "g".into(),
        lock_owner: "a".into(),
    };
    let r = within("UnlockAlpha1", d.unlock_alpha1(unlock)).await.expect("Unlock");
    assert_eq!(r.into_inner().status, rpb::unlock_response::Status::Success as i32);
    env.stop().await;
}
