//! The service on Redis storage (`--storage redis://...`): two services in this process share
//! one real redis-server, as replicas do; a Redis outage is a 503 on every door and heals by
//! itself; the real binary reaches Redis over TLS.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use stategate::config::Config;
use stategate::storage::{StorageKind, Store};

use crate::support::{Broker, RawClient, Storage, TestEnv, WAIT, free_port, now_ts, prop, unique_id};

#[path = "../../crates/storage/src/redis/server.rs"]
pub(crate) mod server;

use server::{Flavor, TestServer};

/// The storage part of a configuration that points at `server`.
pub(crate) fn redis_storage(server: &TestServer) -> stategate::storage::StorageConfig {
    let mut storage = Config::default().storage;
    storage.kind = server.url().parse::<StorageKind>().expect("a redis url");
    storage.redis.timeout = Duration::from_millis(500);
    storage
}

/// A service (embedded broker, HTTP, gRPC) whose store is on `server`.
async fn replica(server: &TestServer, node: &str, max_keys: Option<u64>) -> TestEnv {
    let store = Store::open(&redis_storage(server)).await.expect("open redis storage");
    let node = node.to_owned();
    TestEnv::start_on(Broker::Embedded, Storage::Shared(store), move |c| {
        c.node_id = node.clone();
        c.dapr.app_id = node;
        c.limits.max_keys = max_keys;
    })
    .await
}

fn state(env: &TestEnv) -> String {
    format!("{}/v1.0/state/statestore", env.http())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_keys_versions_and_conditions() {
    let server = TestServer::start(Flavor::Redis);
    let (a, b) = (
        replica(&server, "node-a", None).await,
        replica(&server, "node-b", None).await,
    );
    let c = reqwest::Client::new();

    // Saved through A, read through B with the same ETag.
    let r = c
        .post(state(&a))
        .json(&json!([{"key": "k", "value": {"n": 1}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c.get(format!("{}/k", state(&a))).send().await.unwrap();
    let etag_a = r.headers()["etag"].to_str().unwrap().to_owned();
    assert!(etag_a.ends_with(":node-a"), "{etag_a}");
    let r = c.get(format!("{}/k", state(&b))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag_a);
    assert_eq!(&r.bytes().await.unwrap()[..], br#"{"n":1}"#);

    // B writes with A's ETag; A's ETag is stale afterwards, on both replicas.
    let r = c
        .post(state(&b))
        .json(&json!([{"key": "k", "value": 2, "etag": etag_a}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    for env in [&a, &b] {
        let r = c
            .post(state(env))
            .json(&json!([{"key": "k", "value": 3, "etag": etag_a}]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CONFLICT);
    }

    // MQTT on A sees B's value; its version is after A's first one.
    let mut client = RawClient::connect(a.broker_port, &unique_id("redis-it")).await;
    let got = client.request(&[b"GET", b"k"], &[("__ts", &now_ts())]).await;
    assert_eq!(prop(&got, "__stat"), Some("200"));
    assert_eq!(&got.payload[..], b"$1\r\n2\r\n");
    let ts: stategate::hlc::Hlc = prop(&got, "__ts").unwrap().parse().unwrap();
    assert!(ts > etag_a.parse().unwrap());
    assert!(ts.node.as_ref() == "node-b", "{ts}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_keys_counts_the_keys_of_every_replica() {
    let server = TestServer::start(Flavor::Valkey);
    let (a, b) = (
        replica(&server, "a", Some(3)).await,
        replica(&server, "b", Some(3)).await,
    );
    let c = reqwest::Client::new();
    for (i, env) in [&a, &b, &a].into_iter().enumerate() {
        let r = c
            .post(state(env))
            .json(&json!([{"key": format!("k{i}"), "value": i}]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    for env in [&a, &b] {
        let r = c
            .post(state(env))
            .json(&json!([{"key": "one-too-many", "value": 0}]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::INSUFFICIENT_STORAGE);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_503_on_every_door_and_heals_by_itself() {
    let mut server = TestServer::start(Flavor::Redis);
    let env = replica(&server, "solo", None).await;
    let c = reqwest::Client::new();
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("redis-outage")).await;
    let r = c
        .post(state(&env))
        .json(&json!([{"key": "k", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);

    server.kill();
    let r = c.get(format!("{}/k", state(&env))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = c
        .post(state(&env))
        .json(&json!([{"key": "k", "value": 2}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let got = mqtt.request(&[b"SET", b"k", b"3"], &[("__ts", &now_ts())]).await;
    assert_eq!(prop(&got, "__stat"), Some("503"));
    // Not ready while Redis is down (probes share a check made at most every 500 ms): the
    // body names the storage with a word, never the cause (it may carry addresses; the log has it).
    let give_up = Instant::now() + WAIT;
    let body: serde_json::Value = loop {
        let r = c.get(format!("{}/readyz", env.http())).send().await.unwrap();
        if r.status() == StatusCode::SERVICE_UNAVAILABLE {
            break r.json().await.unwrap();
        }
        assert!(
            Instant::now() < give_up,
            "/readyz stayed {} with Redis down",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        body["storage"] == "unavailable" || body["storage"] == "timeout",
        "{body}"
    );

    // Redis comes back (empty: it kept nothing); the same service serves again.
    server.restart();
    let give_up = Instant::now() + WAIT;
    loop {
        let r = c
            .post(state(&env))
            .json(&json!([{"key": "k", "value": 4}]))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::NO_CONTENT {
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < give_up, "the service did not recover within {WAIT:?}");
        // Polling an outside process: no event to await.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = mqtt.request(&[b"GET", b"k"], &[("__ts", &now_ts())]).await;
    assert_eq!(prop(&got, "__stat"), Some("200"));
    assert_eq!(&got.payload[..], b"$1\r\n4\r\n");
    // Ready again once a probe's check is newer than the recovery (checks are shared for 500 ms).
    let give_up = Instant::now() + WAIT;
    loop {
        let r = c.get(format!("{}/readyz", env.http())).send().await.unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "/readyz did not say ready again within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_is_503_not_a_hang() {
    let server = TestServer::start(Flavor::Valkey);
    let env = replica(&server, "solo", None).await;
    let c = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    server.pause();
    // The reqwest timeout (10 s) would fail the test long before a hang could pass it; the
    // storage bound is 500 ms.
    let r = c
        .get(format!("{}/k", state(&env)))
        .send()
        .await
        .expect("an answer, not a hang");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    server.resume();
    let give_up = Instant::now() + WAIT;
    while c.get(format!("{}/k", state(&env))).send().await.unwrap().status() != StatusCode::NO_CONTENT {
        assert!(Instant::now() < give_up, "the service did not recover within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.stop().await;
}

/// A test CA and a certificate it signed for `localhost` and 127.0.0.1 (with `openssl`, which
/// ./scripts/test installs): `(ca.pem, cert.pem, key.pem)` in `dir`. (A self-signed leaf will
/// not do: webpki refuses a CA certificate as the server's.)
fn test_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let path = |name: &str| dir.join(name);
    let ext = path("san.ext");
    std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl is not installed: run ./scripts/test, which installs it");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let days = ["-days", "1"];
    openssl(
        &[
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=stategate test CA",
            ][..],
            &days,
            &["-keyout", "ca.key", "-out", "ca.pem"],
        ]
        .concat(),
    );
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "key.pem",
        "-out",
        "req.csr",
    ]);
    openssl(
        &[
            &[
                "x509",
                "-req",
                "-in",
                "req.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
            ][..],
            &days,
            &["-extfile", "san.ext", "-out", "cert.pem"],
        ]
        .concat(),
    );
    (path("ca.pem"), path("cert.pem"), path("key.pem"))
}

/// The real binary on `rediss://`: TLS verified against the trust store (`SSL_CERT_FILE`
/// points rustls-native-certs at the test CA); the service starts once Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_from_redis_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = test_certificates(dir.path());
    let server = TestServer::start_tls(Flavor::Redis, &cert, &key);
    let http = free_port();
    let log = dir.path().join("stategate.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(["--storage", &format!("rediss://localhost:{}", server.port)])
        .args(["--http-listen", &format!("127.0.0.1:{http}"), "--grpc-listen", "off"])
        .args(["--mqtt-listen", "127.0.0.1:0"])
        .env("SSL_CERT_FILE", &ca)
        .env("RUST_LOG", "stategate=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn stategate");
    let c = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{http}/v1.0");
    let give_up = Instant::now() + WAIT;
    loop {
        if c.get(format!("{base}/healthz")).send().await.is_ok() {
            break;
        }
        let exited = child.try_wait().unwrap();
        if exited.is_some() || Instant::now() > give_up {
            let _ = child.kill();
            panic!(
                "stategate did not serve ({exited:?}); its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        // Polling a child process: no event to await.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = c
        .post(format!("{base}/state/statestore"))
        .json(&json!([{"key": "over-tls", "value": "yes"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c.get(format!("{base}/state/statestore/over-tls")).send().await.unwrap();
    assert_eq!(&r.bytes().await.unwrap()[..], br#""yes""#);
    let _ = child.kill();
    let _ = child.wait();
}
