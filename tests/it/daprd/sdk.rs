//! Applications talk to daprd, daprd keeps their state in stategate: the Python Dapr SDK's
//! state scenarios (`tests/python/dapr_sdk_check.py`, the same script that checks stategate's
//! own Dapr doors) run against a real daprd whose `statestore` is `deploy/dapr/statestore.yaml`,
//! and the keys daprd writes (`<app id>||<key>`) are what MQTT and SSE clients of stategate see,
//! with the same versions; an MQTT write reads back through daprd with its version as ETag.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use stategate::dapr::{KeyPrefix, StoreSpec, Stores};
use tokio::process::Command;

use super::{Daprd, DaprdOptions, Proc};
use crate::support::{Broker, RawClient, Storage, TestEnv, WAIT, now_ts, prop, unique_id};

/// stategate serving the component socket in `sockets`, with its HTTP door also showing the
/// app's keys as the store `<app id>` (key prefix `<app id>||`, the one daprd applies).
pub async fn stategate_for(app_id: &str, sockets: &Path, storage: Storage) -> TestEnv {
    let socket = sockets.join("stategate.sock");
    let app = app_id.to_owned();
    TestEnv::start_on(Broker::Embedded, storage, move |c| {
        c.dapr_component_socket = Some(socket);
        c.dapr.stores = Stores::new(vec![
            StoreSpec {
                name: "statestore".into(),
                prefix: KeyPrefix::None,
            },
            StoreSpec {
                name: app.clone(),
                prefix: KeyPrefix::Literal(app),
            },
        ]);
    })
    .await
}

/// The Python Dapr SDK's state checks against `daprd`; returns the key, ETag and value of
/// the key the script leaves behind.
async fn python_sdk_checks(daprd: &Daprd) -> (String, String, String) {
    let python = crate::grpc::dapr_sdk_python().await;
    let script = crate::support::repo_path("tests/python/dapr_sdk_check.py");
    let mut proc = Proc::spawn(
        "dapr_sdk_check.py",
        Command::new(python)
            .arg(script)
            .arg(format!("127.0.0.1:{}", daprd.grpc_port))
            .arg(daprd.http())
            .env("PYTHONUNBUFFERED", "1")
            .env("DAPR_HEALTH_TIMEOUT", "20")
            .env("DAPR_SDK_CHECK_THROUGH_DAPRD", "1")
            .env_remove("DAPR_API_TOKEN"),
    );
    proc.wait_for_line("the SDK checks' result", Duration::from_secs(120), |l| {
        l.starts_with("RESULT ") || l.starts_with("FAIL: ")
    })
    .await;
    let out = proc.output();
    let result = out.lines().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or_else(|| {
        panic!(
            "the Python SDK checks through daprd failed:\n{out}\n--- daprd:\n{}",
            daprd.output()
        )
    });
    let v: Value = serde_json::from_str(result).expect("RESULT is JSON");
    let s = |f: &str| v[f].as_str().expect("a string field").to_owned();
    (s("key"), s("etag"), s("value"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_through_daprd_keeps_state_in_stategate() {
    let app = "orders";
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(app, sockets.path(), Storage::Durable).await;
    let daprd = Daprd::start(&DaprdOptions::state(app, sockets.path())).await;

    // Every change of the app's keys, as stategate's own SSE clients see them.
    let http = reqwest::Client::new();
    let mut sse = http
        .get(format!("{}/v1.0-alpha1/state/{app}/subscribe", env.http()))
        .send()
        .await
        .expect("SSE subscribe");
    assert_eq!(sse.status(), 200);

    let (key, etag, value) = python_sdk_checks(&daprd).await;

    // The same key over MQTT, under daprd's prefix, with daprd's ETag as its version.
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("dapr-peer")).await;
    let stored = format!("{app}||{key}");
    let got = mqtt.request(&[b"GET", stored.as_bytes()], &[]).await;
    assert_eq!(
        &got.payload[..],
        format!("${}\r\n{value}\r\n", value.len()).as_bytes(),
        "MQTT GET {stored}"
    );
    assert_eq!(
        prop(&got, "__ts"),
        Some(etag.as_str()),
        "MQTT sees daprd's ETag as the version"
    );

    // ... and over SSE (store `orders`: the app's own key names, the same version).
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if buf
            .split("\n\n")
            .any(|ev| ev.contains(&format!("\"key\":\"{key}\"")) && ev.contains(&format!("id: {etag}")))
        {
            break;
        }
        let chunk = tokio::time::timeout_at(deadline, sse.chunk())
            .await
            .unwrap_or_else(|_| panic!("no SSE event for {key} at {etag}; got:\n{buf}"))
            .expect("SSE stream")
            .expect("SSE open");
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }

    // A device writes over MQTT; the app reads it through daprd, the version as its ETag.
    let device_key = format!("{app}||from-device");
    let set = mqtt
        .request(
            &[b"SET", device_key.as_bytes(), b"{\"t\":21.5}"],
            &[("__ts", &now_ts())],
        )
        .await;
    assert_eq!(&set.payload[..], b"+OK\r\n");
    let version = prop(&set, "__ts").expect("SET answers its version").to_owned();
    let r = http
        .get(format!("{}/v1.0/state/statestore/from-device", daprd.http()))
        .send()
        .await
        .expect("GET through daprd");
    assert_eq!(r.status(), 200, "{}", daprd.output());
    assert_eq!(r.headers()["etag"].to_str().unwrap(), version);
    assert_eq!(&r.bytes().await.unwrap()[..], b"{\"t\":21.5}");

    daprd.stop().await;
    env.stop().await;
}
