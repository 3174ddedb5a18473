//! Many app pods, one key space (issue 29, section 4): the production shape for Dapr in
//! Kubernetes, run as local processes. Each "pod" is a daprd and its own stategate sidecar
//! (the `stategate` binary serving only the component socket daprd finds in the pod's socket
//! folder); every sidecar, and a central stategate replica whose embedded broker the devices
//! use, keep the store in one redis-server. One app (`orders`, three replicas) shares its state:
//! - a write through pod 1's daprd is read by pods 2 and 3 with the same value and ETag;
//! - a device's KEYNOTIFY (on the central replica) is told of writes made through daprd;
//! - a device's SET is read through daprd, its version as the ETag;
//! - two pods writing with the same ETag: the second is refused.
//!
//! The manifests for the same shape are `deploy/k8s/app-pods.yaml` (docs: deploy/dapr/README.md,
//! "Many app pods").

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use stategate::mqtt::request::{notify_payload, notify_topic};
use tokio::process::Command;

use super::{Daprd, DaprdOptions, Proc, START};
use crate::redis::server::{Flavor, TestServer};
use crate::support::{RawClient, free_port, now_ts, prop, unique_id};

const APP: &str = "orders";

/// The `stategate` binary on the shared Redis, with `flags`; returns once it serves.
async fn stategate(name: &str, redis: &TestServer, data: &Path, flags: &[String]) -> Proc {
    let mut proc = Proc::spawn(
        name,
        Command::new(env!("CARGO_BIN_EXE_stategate"))
            .arg("serve")
            .args(["--storage", &redis.url()])
            .args(["--node-id", name, "--mqtt-client-id", name])
            .arg("--data-dir")
            .arg(data.join(name))
            .args(["--log-level", "info", "--no-ui"])
            .args(flags),
    );
    // Logged once storage is open and every door (the component socket included) listens.
    proc.wait_for_line("\"stategate is serving the state store\"", START, |l| {
        l.contains("stategate is serving the state store")
    })
    .await;
    proc
}

/// One app pod: its socket folder (the emptyDir volume in Kubernetes), its sidecar, its daprd.
struct Pod {
    _sockets: tempfile::TempDir,
    sidecar: Proc,
    daprd: Daprd,
}

impl Pod {
    async fn start(n: usize, redis: &TestServer, data: &Path) -> Pod {
        let sockets = tempfile::tempdir().expect("tempdir");
        let socket: PathBuf = sockets.path().join("stategate.sock");
        // The sidecar serves only daprd: no HTTP or gRPC door; its embedded broker (which no
        // flag turns off) listens on a loopback port nobody uses.
        let sidecar = stategate(
            &format!("pod-{n}"),
            redis,
            data,
            &[
                "--dapr-component-socket".into(),
                socket.display().to_string(),
                "--http-listen".into(),
                "off".into(),
                "--grpc-listen".into(),
                "off".into(),
                "--mqtt-listen".into(),
                format!("127.0.0.1:{}", free_port()),
            ],
        )
        .await;
        let daprd = Daprd::start(&DaprdOptions::state(APP, sockets.path())).await;
        Pod {
            _sockets: sockets,
            sidecar,
            daprd,
        }
    }

    fn state(&self, key: &str) -> String {
        format!("{}/v1.0/state/statestore/{key}", self.daprd.http())
    }

    fn save_url(&self) -> String {
        format!("{}/v1.0/state/statestore", self.daprd.http())
    }

    fn output(&self) -> String {
        format!(
            "--- daprd:\n{}\n--- sidecar:\n{}",
            self.daprd.output(),
            self.sidecar.output()
        )
    }
}

/// `(ETag, body)` of a key read through a pod's daprd.
async fn read(http: &reqwest::Client, pod: &Pod, key: &str) -> (String, Bytes) {
    let r = http.get(pod.state(key)).send().await.expect("GET through daprd");
    assert_eq!(r.status(), 200, "GET {key}: {}", pod.output());
    let etag = r.headers()["etag"].to_str().expect("an ETag").to_owned();
    (etag, r.bytes().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_pods_with_their_own_sidecars_share_one_key_space_on_redis() {
    // Every stategate here is a child process: reqwest's rustls needs this process's provider.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let redis = TestServer::start(Flavor::Redis);
    let data = tempfile::tempdir().expect("tempdir");
    let broker_port = free_port();
    // The central service: the devices' broker, on the same store.
    let mut central = stategate(
        "central",
        &redis,
        data.path(),
        &[
            "--mqtt-listen".into(),
            format!("127.0.0.1:{broker_port}"),
            "--http-listen".into(),
            "off".into(),
            "--grpc-listen".into(),
            "off".into(),
        ],
    )
    .await;
    let mut pods = Vec::new();
    for n in 1..=3 {
        pods.push(Pod::start(n, &redis, data.path()).await);
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");

    // A device observes the key before the app writes it (daprd stores `<app id>||<key>`).
    let stored = format!("{APP}||order-1");
    let mut device = RawClient::connect(broker_port, &unique_id("device")).await;
    let r = device.request(&[b"KEYNOTIFY", stored.as_bytes()], &[]).await;
    assert_eq!(&r.payload[..], b"+OK\r\n", "KEYNOTIFY: {}", central.output());

    // Written through pod 1, read through pods 2 and 3: the same value and ETag.
    let r = http
        .post(pods[0].save_url())
        .json(&json!([{"key": "order-1", "value": {"n": 1}}]))
        .send()
        .await
        .expect("save through pod 1");
    assert_eq!(r.status(), 204, "{}", pods[0].output());
    let (etag, body) = read(&http, &pods[0], "order-1").await;
    assert_eq!(&body[..], br#"{"n":1}"#);
    assert!(
        etag.ends_with(":pod-1"),
        "the version names the sidecar that wrote it: {etag}"
    );
    for pod in &pods[1..] {
        assert_eq!(read(&http, pod, "order-1").await, (etag.clone(), body.clone()));
    }

    // The device was told, with the version daprd gave as the ETag.
    let note = device.next().await;
    assert_eq!(
        std::str::from_utf8(&note.topic).unwrap(),
        notify_topic(&device.id, stored.as_bytes())
    );
    assert_eq!(note.payload, notify_payload(Some(&body)));
    assert_eq!(prop(&note, "__ts"), Some(etag.as_str()));

    // Pods 2 and 3 both hold that ETag: pod 2's write wins, pod 3's is refused and changes
    // nothing.
    let conditional = |n: i64| json!([{"key": "order-1", "value": {"n": n}, "etag": etag}]);
    let r = http
        .post(pods[1].save_url())
        .json(&conditional(2))
        .send()
        .await
        .expect("save through pod 2");
    assert_eq!(r.status(), 204, "{}", pods[1].output());
    let r = http
        .post(pods[2].save_url())
        .json(&conditional(3))
        .send()
        .await
        .expect("save through pod 3");
    let status = r.status();
    let text = r.text().await.unwrap_or_default();
    assert!(
        !status.is_success() && text.to_lowercase().contains("etag"),
        "a stale ETag through pod 3 is refused: {status} {text}"
    );
    let (after, body) = read(&http, &pods[2], "order-1").await;
    assert_eq!(&body[..], br#"{"n":2}"#);
    assert!(after.ends_with(":pod-2"), "{after}");
    let note = device.next().await;
    assert_eq!(
        prop(&note, "__ts"),
        Some(after.as_str()),
        "one notification for pod 2's write"
    );

    // A device writes; every pod reads it through daprd, its version as the ETag.
    let from_device = format!("{APP}||from-device");
    let set = device
        .request(
            &[b"SET", from_device.as_bytes(), b"{\"t\":21.5}"],
            &[("__ts", &now_ts())],
        )
        .await;
    assert_eq!(&set.payload[..], b"+OK\r\n");
    let version = prop(&set, "__ts").expect("SET answers its version").to_owned();
    for pod in &pods {
        let (etag, body) = read(&http, pod, "from-device").await;
        assert_eq!((etag.as_str(), &body[..]), (version.as_str(), &b"{\"t\":21.5}"[..]));
    }

    for pod in pods {
        pod.daprd.stop().await;
        let mut sidecar = pod.sidecar;
        sidecar.terminate(Duration::from_secs(10)).await;
    }
    central.terminate(Duration::from_secs(10)).await;
}
