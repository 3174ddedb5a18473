//! daprd in front of stategate, seen by its other peers and across stategate's restarts:
//! - the JavaScript Dapr SDK (`@dapr/dapr`, HTTP protocol) runs its state checks
//!   (`tests/js/dapr_sdk_check.mjs`) against daprd, and the keys it leaves are in stategate as
//!   `<app id>||<key>` over MQTT, with the ETags the SDK saw as their versions;
//! - stategate stopped and started again on the same socket and data while daprd runs: daprd's
//!   calls fail at once while it is down and work again after, without restarting daprd;
//! - daprd looks for pluggable component sockets once, at its start: without stategate's socket
//!   it exits, and with a socket file nobody listens on it waits for stategate.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use stategate::storage::Store;
use stategate::storage::durable::{DurableBackend, DurableOptions};
use tokio::process::Command;

use super::sdk::stategate_for;
use super::{Daprd, DaprdOptions, Proc, START, deploy_dapr, go_binary};
use crate::support::{RawClient, Storage, WAIT, free_port, prop, unique_id};

// ---- the JavaScript Dapr SDK ----

/// Fails the test unless Node.js 20 or later runs as `node` and `npm` is there: the SDK test
/// needs both, and a machine without them must not pass it silently.
async fn require_node_and_npm() {
    let node = Command::new("node")
        .arg("-e")
        .arg("process.exit(Number(process.versions.node.split('.')[0]) >= 20 ? 0 : 1)")
        .status()
        .await;
    match node {
        Ok(s) if s.success() => {}
        Ok(_) => panic!("the JavaScript Dapr SDK test needs Node.js 20 or later; `node` is older"),
        Err(e) => panic!("the JavaScript Dapr SDK test needs Node.js 20 or later as `node`: {e}"),
    }
    if let Err(e) = Command::new("npm").arg("--version").output().await {
        panic!("the JavaScript Dapr SDK test needs `npm` (it installs @dapr/dapr): {e}");
    }
}

/// `@dapr/dapr` as pinned in `tests/js/package-lock.json`, installed (`npm ci`) into
/// `~/.cache/stategate-npm-dapr`, never into the clone, and reused while the lock file is
/// unchanged. Returns the folder whose `node_modules` holds it. A lock file keeps concurrent
/// test runs from installing it at the same time.
async fn dapr_js_sdk() -> PathBuf {
    require_node_and_npm().await;
    let home = std::env::var_os("HOME").expect("HOME is set");
    let cache = Path::new(&home).join(".cache");
    let dir = cache.join("stategate-npm-dapr");
    std::fs::create_dir_all(&dir).expect("create ~/.cache/stategate-npm-dapr");
    let lock = std::fs::File::create(cache.join("stategate-npm-dapr.lock")).expect("npm lock file");
    // Taking the lock blocks (another run may be installing): off the async workers.
    let lock = tokio::task::spawn_blocking(move || {
        lock.lock().expect("lock the npm cache");
        lock
    })
    .await
    .expect("the lock task");
    let src = crate::support::repo_path("tests/js");
    let wanted = std::fs::read(src.join("package-lock.json")).expect("tests/js/package-lock.json");
    let installed = std::fs::read(dir.join("package-lock.json")).unwrap_or_default();
    let present = dir.join("node_modules/@dapr/dapr/package.json").exists();
    if !present || installed != wanted {
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(src.join(f), dir.join(f)).expect("copy the npm manifest");
        }
        let limit = Duration::from_secs(300);
        let out = tokio::time::timeout(
            limit,
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("npm ci of @dapr/dapr into {} took over {limit:?}", dir.display()))
        .expect("run npm ci");
        assert!(
            out.status.success(),
            "npm ci of @dapr/dapr into {} failed (is the npm registry reachable?): {}\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(lock);
    dir
}

/// The value of a RESP bulk-string answer (`$<len>\r\n<bytes>\r\n`), `None` for `$-1\r\n`.
fn bulk_string(payload: &[u8]) -> Option<&[u8]> {
    if payload == b"$-1\r\n" {
        return None;
    }
    let text = std::str::from_utf8(payload).unwrap_or("");
    let (len, rest) = text
        .strip_prefix('$')
        .and_then(|t| t.split_once("\r\n"))
        .unwrap_or_else(|| panic!("not a bulk string: {}", String::from_utf8_lossy(payload)));
    let len: usize = len.parse().expect("a bulk string length");
    Some(&rest.as_bytes()[..len])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_sdk_over_http_through_daprd_keeps_state_in_stategate() {
    // Installed before any server starts: a slow registry must not eat into their bounds.
    let sdk = dapr_js_sdk().await;
    let app = "checkout";
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(app, sockets.path(), Storage::Durable).await;
    let daprd = Daprd::start(&DaprdOptions::state(app, sockets.path())).await;

    let script = crate::support::repo_path("tests/js/dapr_sdk_check.mjs");
    let mut proc = Proc::spawn(
        "dapr_sdk_check.mjs",
        Command::new("node")
            .arg(script)
            .env("DAPR_HTTP_PORT", daprd.http_port.to_string())
            .env("DAPR_SDK_DIR", &sdk)
            .env_remove("DAPR_API_TOKEN"),
    );
    proc.wait_for_line("the SDK checks' result", Duration::from_secs(120), |l| {
        l.starts_with("RESULT ") || l.starts_with("FAIL: ")
    })
    .await;
    let out = proc.output();
    let result = out.lines().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or_else(|| {
        panic!(
            "the JavaScript SDK checks through daprd failed:\n{out}\n--- daprd:\n{}",
            daprd.output()
        )
    });
    let result: Value = serde_json::from_str(result).expect("RESULT is JSON");

    // Every key the SDK left is in stategate under daprd's prefix, holding the JSON daprd
    // wrote, at the version the SDK saw as its ETag.
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("dapr-js-peer")).await;
    let kept = result["kept"].as_array().expect("kept keys");
    assert!(kept.len() >= 10, "the script reports the keys it left: {result}");
    for item in kept {
        let (key, etag) = (item["key"].as_str().unwrap(), item["etag"].as_str().unwrap());
        let stored = format!("{app}||{key}");
        let got = mqtt.request(&[b"GET", stored.as_bytes()], &[]).await;
        let value = bulk_string(&got.payload).unwrap_or_else(|| panic!("MQTT GET {stored}: missing"));
        let value: Value = serde_json::from_slice(value).expect("daprd stores JSON");
        assert_eq!(value, item["value"], "MQTT GET {stored}");
        assert_eq!(
            prop(&got, "__ts"),
            Some(etag),
            "MQTT sees the SDK's ETag as {stored}'s version"
        );
    }
    for key in result["gone"].as_array().expect("gone keys") {
        let stored = format!("{app}||{}", key.as_str().unwrap());
        let got = mqtt.request(&[b"GET", stored.as_bytes()], &[]).await;
        assert_eq!(&got.payload[..], b"$-1\r\n", "{stored} was deleted or never written");
    }

    // The TTL daprd passed through is stategate's own deadline: its HTTP door (store `<app
    // id>`, the same prefix) reports the same ttlExpireTime, and the key is gone once the
    // service's clock passes it, for MQTT and for daprd alike.
    let ttl = &result["ttl"];
    let key = ttl["key"].as_str().unwrap();
    let http = reqwest::Client::new();
    let r = http
        .get(format!("{}/v1.0/state/{app}/{key}", env.http()))
        .send()
        .await
        .expect("GET from stategate's HTTP door");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["etag"].to_str().unwrap(), ttl["etag"].as_str().unwrap());
    assert_eq!(
        r.headers()["metadata.ttlExpireTime"].to_str().unwrap(),
        ttl["expire"].as_str().unwrap(),
        "stategate's deadline is the one daprd reported to the SDK"
    );
    env.advance(121_000);
    let stored = format!("{app}||{key}");
    let got = mqtt.request(&[b"GET", stored.as_bytes()], &[]).await;
    assert_eq!(&got.payload[..], b"$-1\r\n", "{stored} expired after its 120 s");
    let r = http
        .get(format!("{}/v1.0/state/statestore/{key}", daprd.http()))
        .send()
        .await
        .expect("GET through daprd");
    assert_eq!(r.status(), 204, "daprd reads the expired key as missing");

    daprd.stop().await;
    env.stop().await;
}

// ---- stategate restarted under daprd ----

/// Every call to daprd in these tests gives up after this: a hang is a failure, not a wait.
const CALL_BOUND: Duration = Duration::from_secs(10);
/// How soon daprd must reach stategate again after it is back. grpc-go (daprd's client)
/// redials after a backoff that grows with each failed attempt (1 s, then x1.6 up to 120 s):
/// after the few seconds of outage here it is 1-3 s.
const RECONNECT_BOUND: Duration = Duration::from_secs(30);

/// A daprd call answered with an error while stategate is down: its status, daprd's error
/// code, and how long it took.
async fn failing_call(what: &str, req: reqwest::RequestBuilder, daprd: &Daprd) -> (u16, String, Duration) {
    let t = Instant::now();
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what} through daprd while stategate is down: {e}\n{}", daprd.output()));
    let elapsed = t.elapsed();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or_default();
    let code = body["errorCode"].as_str().unwrap_or_default().to_owned();
    (status, code, elapsed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stategate_restarted_under_daprd_fails_cleanly_then_serves_again() {
    let app = "billing";
    let sockets = tempfile::tempdir().expect("tempdir");
    let env = stategate_for(app, sockets.path(), Storage::Durable).await;
    let daprd = Daprd::start(&DaprdOptions::state(app, sockets.path())).await;
    let http = reqwest::Client::builder().timeout(CALL_BOUND).build().unwrap();
    let state = format!("{}/v1.0/state/statestore", daprd.http());
    let r = http
        .post(&state)
        .json(&serde_json::json!([{"key": "invoice", "value": {"total": 42}}]))
        .send()
        .await
        .expect("save through daprd");
    assert_eq!(r.status(), 204, "{}", daprd.output());
    let r = http
        .get(format!("{state}/invoice"))
        .send()
        .await
        .expect("GET through daprd");
    assert_eq!(r.status(), 200);
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();

    // Down: stategate stops and its socket has no listener (the durable data stays).
    let data = env
        .stop_keeping_data()
        .await
        .expect("durable storage hands over its directory");
    let down = Instant::now();
    let mut measured = Vec::new();
    for round in 0..3 {
        let get = failing_call("GET", http.get(format!("{state}/invoice")), &daprd).await;
        assert_eq!((get.0, get.1.as_str()), (500, "ERR_STATE_GET"), "GET while down");
        let save = failing_call(
            "SAVE",
            http.post(&state)
                .json(&serde_json::json!([{"key": format!("down-{round}"), "value": round}])),
            &daprd,
        )
        .await;
        assert_eq!((save.0, save.1.as_str()), (500, "ERR_STATE_SAVE"), "SAVE while down");
        measured.push((get.2, save.2));
    }
    // Failing at once, not after a timeout: grpc-go fails calls on a connection in
    // TRANSIENT_FAILURE instead of queueing them.
    let slowest = measured.iter().flat_map(|(g, s)| [*g, *s]).max().unwrap();
    assert!(slowest < Duration::from_secs(2), "failing calls took up to {slowest:?}");
    // daprd itself stays up and healthy: only the component's calls fail.
    let r = http
        .get(format!("{}/v1.0/healthz", daprd.http()))
        .send()
        .await
        .expect("daprd's healthz");
    assert_eq!(r.status(), 204, "daprd stays healthy while its store is down");

    // Up again: the same socket path and the same data; daprd is not restarted.
    let data = crate::support::copy_data_dir(data.path());
    let store = Store::new(DurableBackend::open(DurableOptions::new(data.path())).expect("the data reopens"));
    let env = stategate_for(app, sockets.path(), Storage::Shared(store)).await;
    let up = Instant::now();
    let mut failed_polls = 0;
    let r = loop {
        let r = http
            .get(format!("{state}/invoice"))
            .send()
            .await
            .expect("GET through daprd after the restart");
        if r.status() != 500 {
            break r;
        }
        assert!(
            up.elapsed() < RECONNECT_BOUND,
            "daprd did not reach stategate again within {RECONNECT_BOUND:?} ({failed_polls} failed calls):\n{}",
            daprd.output()
        );
        failed_polls += 1;
        // No event says when grpc-go redials (its backoff timer runs inside daprd): poll.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let reconnected = up.elapsed();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["etag"].to_str().unwrap(),
        etag,
        "the version survived the restart"
    );
    assert_eq!(r.json::<Value>().await.unwrap(), serde_json::json!({"total": 42}));
    // Saves work again, and the ETag from before the restart is still the current one.
    let r = http
        .post(&state)
        .json(&serde_json::json!([{"key": "invoice", "value": {"total": 43}, "etag": etag}]))
        .send()
        .await
        .expect("save through daprd after the restart");
    assert_eq!(r.status(), 204, "{}", daprd.output());
    let r = http.get(format!("{state}/invoice")).send().await.unwrap();
    let new_etag = r.headers()["etag"].to_str().unwrap().to_owned();
    assert_ne!(new_etag, etag);
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("dapr-restart")).await;
    let got = mqtt.request(&[b"GET", format!("{app}||invoice").as_bytes()], &[]).await;
    assert_eq!(bulk_string(&got.payload), Some(&b"{\"total\":43}"[..]));
    assert_eq!(prop(&got, "__ts"), Some(new_etag.as_str()));
    // What the user sees, for the notes (shown with --nocapture).
    println!(
        "stategate down {:?}: daprd's failing GET/SAVE took {measured:?}; after the restart \
         daprd served again in {reconnected:?} ({failed_polls} calls failed meanwhile)",
        up - down
    );

    daprd.stop().await;
    env.stop().await;
    drop(data);
}

// ---- daprd looks for sockets only at its start ----

/// daprd as [`Daprd::start`] runs it, but without waiting for its "initialized" line: daprd
/// prints that line even when it exits right after for a component it could not load, and
/// these cases expect it to fail or to wait. grpc-go's own warnings are on (stderr): each
/// failed connection attempt of daprd's discovery dial is a line (`createTransport failed to
/// connect to ...`).
fn spawn_daprd(app: &str, sockets: &Path) -> Daprd {
    let (http_port, grpc_port) = (free_port(), free_port());
    let proc = Proc::spawn(
        "daprd",
        Command::new(go_binary("daprd"))
            .env("DAPR_COMPONENTS_SOCKETS_FOLDER", sockets)
            .env_remove("DAPR_API_TOKEN")
            .env("GRPC_GO_LOG_SEVERITY_LEVEL", "warning")
            .args(["--app-id", app])
            .arg("--resources-path")
            .arg(deploy_dapr())
            .args(["--dapr-listen-addresses", "127.0.0.1"])
            .arg("--dapr-http-port")
            .arg(http_port.to_string())
            .arg("--dapr-grpc-port")
            .arg(grpc_port.to_string())
            .arg("--dapr-internal-grpc-port")
            .arg(free_port().to_string())
            .args(["--dapr-internal-grpc-listen-address", "127.0.0.1"])
            .args(["--enable-metrics=false", "--log-level", "info"]),
    );
    Daprd {
        http_port,
        grpc_port,
        proc,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daprd_finds_stategate_only_at_its_start() {
    let app = "shipping";
    let sockets = tempfile::tempdir().expect("tempdir");

    // No socket at all: `state.stategate` is an unknown component type and daprd exits.
    let mut daprd = spawn_daprd(app, sockets.path());
    let status = tokio::time::timeout(START, daprd.proc.child.wait())
        .await
        .unwrap_or_else(|_| panic!("daprd without stategate's socket still runs:\n{}", daprd.output()))
        .expect("wait for daprd");
    // Let the log readers catch up with the last lines.
    daprd
        .proc
        .wait_for_line("daprd's fatal error", WAIT, |l| l.contains("level=fatal"))
        .await;
    assert!(!status.success(), "daprd exits with an error");
    assert!(
        daprd.output().contains("couldn't find state store state.stategate/v1"),
        "{}",
        daprd.output()
    );

    // A socket file nobody listens on (stategate stopped; it leaves the file behind).
    let env = stategate_for(app, sockets.path(), Storage::Memory).await;
    env.stop().await;
    let socket = sockets.path().join("stategate.sock");
    assert!(
        socket.exists(),
        "a stopped stategate leaves its socket file: this case needs it"
    );
    let mut daprd = spawn_daprd(app, sockets.path());
    // The line daprd logs just before it lists the sockets (pkg/runtime/runtime.go).
    daprd
        .proc
        .wait_for_line("the step before discovery", START, |l| {
            l.contains("Initialized name resolution")
        })
        .await;
    // Stategate stays down: daprd waits in its discovery (a blocking gRPC dial of the socket),
    // loading no component and opening none of its ports. Two refused connection attempts on
    // the socket show it: the dial reached the socket, failed, and daprd, still in the same
    // dial, tried again after its backoff instead of going on (components are loaded only
    // after the dial returns, and nothing makes it return while the socket stays dead).
    let socket_name = socket.display().to_string();
    daprd
        .proc
        .wait_for_lines("a second refused dial of the socket", 2, START, |l| {
            l.contains("createTransport failed to connect") && l.contains(&socket_name)
        })
        .await;
    assert!(
        !daprd.output().contains("Loading components"),
        "daprd went past discovery with no stategate:\n{}",
        daprd.output()
    );
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", daprd.http_port))
            .await
            .is_err(),
        "daprd's HTTP port is not open yet"
    );
    let env = stategate_for(app, sockets.path(), Storage::Memory).await;
    let up = Instant::now();
    daprd
        .proc
        .wait_for_line("\"dapr initialized\"", START, |l| {
            l.contains("dapr initialized. Status: Running")
        })
        .await;
    let initialized = up.elapsed();
    assert!(
        daprd
            .output()
            .contains("pluggable component 'stategate' was successfully registered"),
        "{}",
        daprd.output()
    );
    let http = reqwest::Client::builder().timeout(CALL_BOUND).build().unwrap();
    let state = format!("{}/v1.0/state/statestore", daprd.http());
    let r = http
        .post(&state)
        .json(&serde_json::json!([{"key": "parcel", "value": "sent"}]))
        .send()
        .await
        .expect("save through daprd");
    assert_eq!(r.status(), 204, "{}", daprd.output());
    let r = http
        .get(format!("{state}/parcel"))
        .send()
        .await
        .expect("GET through daprd");
    assert_eq!(r.status(), 200);
    println!("daprd, waiting on a socket file with no listener, initialized {initialized:?} after stategate was up");

    daprd.stop().await;
    env.stop().await;
}
