//! Replicas whose clocks differ, as real processes on one Redis (issue 28): one started under
//! libfaketime 25 s ahead, one 25 s behind. Before the fix a lock granted through the slow
//! replica was already expired to the fast one (two holders at once), and a lock taken through
//! the slow replica after the fast one released it got a lower fencing token, so the old
//! holder's fenced writes still went through. Now every replica takes its time from the Redis
//! server and no version is issued below one removed before it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stategate::hlc::Hlc;

use crate::redis::server::{Flavor, TestServer};
use crate::support::{WAIT, free_port, unique_id};

/// Where Debian's libfaketime puts the library (`scripts/test` installs it).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A stategate process on `server` with its clock moved by `offset` (libfaketime's syntax).
struct Replica {
    _child: tokio::process::Child,
    http: String,
    /// Kept when the test fails (the panic names it), removed when it passes.
    log: std::path::PathBuf,
}

async fn replica(server: &TestServer, node: &str, offset: &str) -> Replica {
    assert!(
        Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: scripts/test installs it (apt-get install libfaketime)"
    );
    let port = free_port();
    let log = std::env::temp_dir().join(format!("{}.log", unique_id(&format!("stategate-skew-{node}"))));
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(["--storage", &server.url(), "--node-id", node])
        .args(["--mqtt-listen", "127.0.0.1:0", "--grpc-listen", "off"])
        .args(["--http-listen", &format!("127.0.0.1:{port}")])
        .env("LD_PRELOAD", FAKETIME_LIB)
        .env("FAKETIME", offset)
        // tokio's timers run on the monotonic clock: only the wall clock is moved.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("replica log"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn stategate");
    let http = format!("http://127.0.0.1:{port}");
    let give_up = Instant::now() + 3 * WAIT;
    while !reqwest::get(format!("{http}/healthz"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < give_up,
            "replica {node} did not start; its log is {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Replica {
        _child: child,
        http,
        log,
    }
}

/// Takes the lock `resource` for `owner`: its fencing token when granted.
async fn lock(r: &Replica, resource: &str, owner: &str, seconds: u32) -> Option<Hlc> {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1.0-alpha1/lock/lockstore", r.http))
        .json(&json!({"resourceId": resource, "lockOwner": owner, "expiryInSeconds": seconds}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let token = resp
        .headers()
        .get("metadata.fencingtoken")
        .map(|v| v.to_str().unwrap().parse::<Hlc>().expect("a token"));
    let body: Value = resp.json().await.unwrap();
    (body["success"] == true).then(|| token.expect("a granted lock has a token"))
}

async fn unlock(r: &Replica, resource: &str, owner: &str) {
    let body: Value = reqwest::Client::new()
        .post(format!("{}/v1.0-alpha1/unlock/lockstore", r.http))
        .json(&json!({"resourceId": resource, "lockOwner": owner}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["status"], 0, "{body}");
}

/// Saves `key` with `token`: the HTTP status.
async fn fenced_save(r: &Replica, key: &str, value: &str, token: &Hlc) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/v1.0/state/statestore", r.http))
        .json(&json!([{"key": key, "value": value, "metadata": {"fencingToken": token.to_string()}}]))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_skewed_clocks_agree_on_leases_and_fencing_tokens() {
    stategate::tls::install_provider();
    let server = TestServer::start(Flavor::Redis);
    let fast = replica(&server, "fast", "+25s").await;
    let slow = replica(&server, "slow", "-25s").await;

    // A lease granted through one replica holds on the other.
    let granted = lock(&slow, "nightly", "a", 30).await;
    assert!(granted.is_some());
    assert_eq!(lock(&fast, "nightly", "b", 30).await, None, "two holders at once");
    let granted = lock(&fast, "hourly", "a", 30).await;
    assert!(granted.is_some());
    assert_eq!(lock(&slow, "hourly", "b", 30).await, None, "two holders at once");

    // Tokens only go up, whichever replica grants the lock after whichever released it.
    let mut last: Option<Hlc> = None;
    for (round, through) in [&fast, &slow, &fast, &slow].into_iter().enumerate() {
        let owner = format!("owner-{round}");
        let token = lock(through, "report-lock", &owner, 30)
            .await
            .expect("the lock is free");
        if let Some(last) = &last {
            assert!(token > *last, "round {round}: token {token} after {last}");
        }
        assert_eq!(fenced_save(through, "report", &owner, &token).await, 204);
        unlock(through, "report-lock", &owner).await;
        // The holder before, late: its older token is refused.
        if let Some(old) = &last {
            assert_eq!(fenced_save(through, "report", "late", old).await, 409, "round {round}");
        }
        last = Some(token);
    }
    for r in [fast, slow] {
        let _ = std::fs::remove_file(&r.log);
    }
}
