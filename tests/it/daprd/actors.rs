//! Dapr actors on stategate: placement, stategate (durable storage) serving the component
//! socket, a Python actor app (`tests/python/actor_app.py`, the SDK's actor runtime) and daprd
//! with `--placement-host-address` and `--app-port`, whose `statestore` (deploy/dapr) is the
//! actor state store. The actor's state is stategate's keys `<app id>||<actor type>||<actor
//! id>||<key>`: MQTT clients read and watch them, a device's write is read by the actor, and the
//! state is there for a new app and daprd, and again after stategate itself restarts on its
//! data directory.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use stategate::storage::Store;
use stategate::storage::durable::{DurableBackend, DurableOptions};
use tokio::process::Command;

use super::sdk::stategate_for;
use super::{Daprd, DaprdOptions, DaprdPorts, Placement, Proc, START};
use crate::support::{RawClient, Storage, free_port, now_ts, prop, unique_id};

const APP: &str = "counters";
const ACTOR_TYPE: &str = "Counter";

/// stategate's key for one state of one actor, as daprd writes it.
pub fn actor_key(app: &str, actor_type: &str, id: &str, name: &str) -> String {
    format!("{app}||{actor_type}||{id}||{name}")
}

/// The actor app and its daprd, started together: the SDK's actor runtime waits (in the app's
/// startup) for daprd's health endpoint before the app listens, and daprd waits for the app's
/// port before it reports itself initialized, so neither can be awaited alone.
struct ActorStack {
    app: Proc,
    daprd: Daprd,
    http: reqwest::Client,
}

impl ActorStack {
    async fn start(placement: &Placement, sockets: &Path) -> ActorStack {
        let python = crate::grpc::dapr_sdk_python().await;
        let script = crate::support::repo_path("tests/python/actor_app.py");
        let ports = DaprdPorts::free();
        let app_port = free_port();
        let mut app = Proc::spawn(
            "actor_app.py",
            Command::new(python)
                .arg(script)
                .arg(app_port.to_string())
                .env("DAPR_HTTP_PORT", ports.http.to_string())
                .env("DAPR_GRPC_PORT", ports.grpc.to_string())
                .env("DAPR_RUNTIME_HOST", "127.0.0.1")
                .env("DAPR_HEALTH_TIMEOUT", START.as_secs().to_string())
                .env("PYTHONUNBUFFERED", "1")
                .env_remove("DAPR_API_TOKEN"),
        );
        let mut daprd = Daprd::start_on(
            &DaprdOptions {
                app_id: APP.into(),
                sockets: sockets.to_owned(),
                resources: super::deploy_dapr(),
                placement: Some(placement.port),
                scheduler: None,
                app_port: Some(app_port),
            },
            ports,
        )
        .await;
        app.wait_for_line("uvicorn's \"running\"", START, |l| l.contains("Uvicorn running on"))
            .await;
        // Calls to an actor type are placed only once placement has handed daprd a table with
        // this host's types in it.
        daprd
            .wait_for_line("placement's table with the actor type", START, |l| {
                l.contains("Dissemination complete") && l.contains(ACTOR_TYPE)
            })
            .await;
        ActorStack {
            app,
            daprd,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("http client"),
        }
    }

    /// Invokes an actor method through daprd's HTTP API and returns its JSON answer.
    async fn call(&self, id: &str, method: &str, body: &str) -> Value {
        let url = format!("{}/v1.0/actors/{ACTOR_TYPE}/{id}/method/{method}", self.daprd.http());
        let r = self
            .http
            .post(&url)
            .body(body.to_owned())
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}\n--- daprd:\n{}", self.daprd.output()));
        let status = r.status();
        let text = r.text().await.expect("actor answer");
        assert!(
            status.is_success(),
            "{method} on {id}: {status} {text}\n--- daprd:\n{}\n--- app:\n{}",
            self.daprd.output(),
            self.app.output()
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} answered {text:?}: {e}"))
    }

    /// daprd first (it deactivates its actors), then the app.
    async fn stop(mut self) {
        self.daprd.stop().await;
        self.app.kill().await;
    }
}

/// The notification topic a KEYNOTIFY observer `client` gets for `key` (Azure IoT Operations'
/// state store protocol: client id and key in upper-case hex).
fn notify_topic(client: &str, key: &str) -> String {
    format!(
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/{}/command/notify/{}",
        hex::encode_upper(client),
        hex::encode_upper(key)
    )
}

/// The RESP bulk string an MQTT GET answers for `value`.
fn bulk(value: &str) -> Vec<u8> {
    format!("${}\r\n{value}\r\n", value.len()).into_bytes()
}

/// Expects the next notification to be a SET of `key` to `value`; returns its version.
async fn expect_set_notification(obs: &mut RawClient, key: &str, value: &str) -> String {
    let n = obs.next().await;
    assert_eq!(
        std::str::from_utf8(&n.topic).unwrap(),
        notify_topic(&obs.id, key),
        "a notification for {key}"
    );
    let expected = format!(
        "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n{}",
        String::from_utf8(bulk(value)).unwrap()
    );
    assert_eq!(
        String::from_utf8_lossy(&n.payload),
        expected,
        "the notification of {key}"
    );
    prop(&n, "__ts").expect("a notification carries the version").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_actor_state_lives_in_stategate_across_restarts() {
    let placement = Placement::start().await;
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(APP, sockets.path(), Storage::Durable).await;
    let id = "thermostat-7";
    let count_key = actor_key(APP, ACTOR_TYPE, id, "count");
    let last_key = actor_key(APP, ACTOR_TYPE, id, "last");
    let note_key = actor_key(APP, ACTOR_TYPE, id, "note");

    // An MQTT client watches the actor's `count` before the actor exists.
    let obs_id = unique_id("actor-watch");
    let mut obs = RawClient::connect(env.broker_port, &obs_id).await;
    let r = obs.request(&[b"KEYNOTIFY", count_key.as_bytes()], &[]).await;
    assert_eq!(&r.payload[..], b"+OK\r\n", "KEYNOTIFY {count_key}");
    obs.subscribe(&notify_topic(&obs_id, &count_key)).await;
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("actor-peer")).await;

    // Round 1: the actor adds 5, then 3. Each method's state is saved (one transaction
    // through daprd) before the method answers, so MQTT sees it once the call returns.
    let stack = ActorStack::start(&placement, sockets.path()).await;
    assert_eq!(
        stack.call(id, "Add", "5").await,
        json!({"count": 5, "last": 5, "note": null})
    );
    expect_set_notification(&mut obs, &count_key, "5").await;
    assert_eq!(
        stack.call(id, "Add", "3").await,
        json!({"count": 8, "last": 3, "note": null})
    );
    let version = expect_set_notification(&mut obs, &count_key, "8").await;
    let got = mqtt.request(&[b"GET", count_key.as_bytes()], &[]).await;
    assert_eq!(&got.payload[..], &bulk("8")[..], "MQTT GET {count_key}");
    assert_eq!(
        prop(&got, "__ts"),
        Some(version.as_str()),
        "GET and the notification agree on the version"
    );
    let got = mqtt.request(&[b"GET", last_key.as_bytes()], &[]).await;
    assert_eq!(&got.payload[..], &bulk("3")[..], "MQTT GET {last_key}");
    stack.stop().await;

    // While the app and its daprd are down, a device leaves the actor a note (JSON, as the
    // SDK's state serializer reads it).
    let set = mqtt
        .request(&[b"SET", note_key.as_bytes(), b"\"calibrate\""], &[("__ts", &now_ts())])
        .await;
    assert_eq!(&set.payload[..], b"+OK\r\n", "MQTT SET {note_key}");

    // Round 2: a new app and daprd (stategate kept running) find the actor's state, and the
    // device's note.
    let stack = ActorStack::start(&placement, sockets.path()).await;
    assert_eq!(
        stack.call(id, "Get", "").await,
        json!({"count": 8, "last": 3, "note": "calibrate"})
    );
    assert_eq!(
        stack.call(id, "Add", "2").await,
        json!({"count": 10, "last": 2, "note": "calibrate"})
    );
    expect_set_notification(&mut obs, &count_key, "10").await;
    stack.stop().await;

    // Round 3: stategate itself restarts on its data directory (the same socket path), then a
    // new app and daprd: the state came back from disk.
    drop((obs, mqtt));
    let data = env.stop_keeping_data().await.expect("a durable data dir");
    let data = crate::support::copy_data_dir(data.path());
    let backend = DurableBackend::open(DurableOptions::new(data.path())).expect("the data dir reopens");
    let env = stategate_for(APP, sockets.path(), Storage::Shared(Store::new(backend))).await;
    let stack = ActorStack::start(&placement, sockets.path()).await;
    assert_eq!(
        stack.call(id, "Get", "").await,
        json!({"count": 10, "last": 2, "note": "calibrate"})
    );
    stack.stop().await;

    // What stategate holds for the app: exactly the actor's three states.
    let mut keys = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = env
            .engine()
            .keys_with_prefix(format!("{APP}||").as_bytes(), after.as_deref(), 4096)
            .await
            .expect("list keys");
        keys.extend(page.keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()));
        match page.resume_after {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    keys.sort();
    assert_eq!(keys, vec![count_key, last_key, note_key]);
    env.stop().await;
    drop(data);
}
