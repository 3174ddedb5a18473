//! The published Azure IoT Operations Go SDK (`github.com/Azure/iot-operations-sdks/go/services`
//! v0.4.1, `statestore` and `leasedlock`) as a peer: the Go tests in `tests/go/aio`, compiled by
//! `./scripts/go-peers` into `$STATEGATE_GO_BIN/aio.test`, run one at a time as a process
//! against the service this test started, with the broker's port in `STATEGATE_MQTT_PORT`. The
//! lease handover runs both SDKs at once, taking turns through the Go process's stdin and
//! stdout (lines starting `STATEGATE `).
//!
//! KEYNOTIFY with the Go SDK works only when the service runs inside the embedded broker: the
//! SDK never subscribes to its notification topic (it relies on the AIO broker handing
//! notifications to the observer's session, which `mqtt/inbroker.rs` does too), so through an
//! external broker or the client path its notifications have nowhere to go. The tests that need
//! notifications run in the broker; the others run every way MQTT is served.

use std::path::PathBuf;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::leased_lock;
use azure_iot_operations_services::state_store::{self, Operation, SetOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::aio::{REQUEST_TIMEOUT, Sdk, assert_later, expect_del, next_notification};
use crate::support::{Broker, Storage, TestEnv, WAIT, unique_id, within};

/// Bound on one Go test process; each of its own steps is bounded by 10 s.
const RUN: Duration = Duration::from_secs(120);

/// The test binary `./scripts/go-peers` built for Go module `module` (`tests/go/<module>`).
pub(crate) fn go_test_binary(module: &str) -> PathBuf {
    let Some(dir) = std::env::var_os("STATEGATE_GO_BIN") else {
        panic!(
            "STATEGATE_GO_BIN is not set: run ./scripts/go-peers, which builds the Go peer tests \
             and prints STATEGATE_GO_BIN=... to export (./scripts/test does both)"
        );
    };
    let path = PathBuf::from(dir).join(format!("{module}.test"));
    assert!(
        path.is_file(),
        "{} does not exist: run ./scripts/go-peers to build the Go peer tests",
        path.display()
    );
    path
}

/// One Go test running as a process: its transcript (stdout and stderr), the `STATEGATE `
/// lines it says, and its stdin.
pub(crate) struct GoTest {
    name: String,
    child: Child,
    stdin: ChildStdin,
    said: mpsc::UnboundedReceiver<String>,
    transcript: Arc<Mutex<Vec<String>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl GoTest {
    /// Starts test function `name` of Go module `module` with `env` added to its environment.
    pub(crate) fn start(module: &str, name: &str, env: &[(&str, String)]) -> GoTest {
        let mut child = Command::new(go_test_binary(module))
            .arg(format!("-test.run=^{name}$"))
            .arg("-test.v")
            .arg("-test.count=1")
            .arg(format!("-test.timeout={}s", RUN.as_secs() - 10))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start the Go test {module}.test: {e}"));
        let stdin = child.stdin.take().expect("stdin");
        let transcript = Arc::new(Mutex::new(Vec::new()));
        let (tx, said) = mpsc::unbounded_channel();
        let stdout = read_lines(child.stdout.take().expect("stdout"), transcript.clone(), Some(tx));
        let stderr = read_lines(child.stderr.take().expect("stderr"), transcript.clone(), None);
        GoTest {
            name: name.to_owned(),
            child,
            stdin,
            said,
            transcript,
            readers: vec![stdout, stderr],
        }
    }

    fn transcript(&self) -> String {
        self.transcript.lock().unwrap().join("\n")
    }

    /// The next line the Go test says (without the prefix).
    pub(crate) async fn hear(&mut self, what: &str) -> String {
        match tokio::time::timeout(WAIT, self.said.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!(
                "the Go test {} ended before saying {what}:\n{}",
                self.name,
                self.transcript()
            ),
            Err(_) => panic!(
                "the Go test {} did not say {what} within {WAIT:?}:\n{}",
                self.name,
                self.transcript()
            ),
        }
    }

    pub(crate) async fn say(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("write to the Go test {}: {e}\n{}", self.name, self.transcript()));
    }

    /// Waits for the process to end and checks that the test ran and passed.
    pub(crate) async fn passes(mut self) {
        let status = match tokio::time::timeout(RUN, self.child.wait()).await {
            Ok(status) => status.expect("wait for the Go test"),
            Err(_) => panic!(
                "the Go test {} did not end within {RUN:?}:\n{}",
                self.name,
                self.transcript()
            ),
        };
        for r in self.readers.drain(..) {
            let _ = within("the Go test's output to end", r).await;
        }
        let transcript = self.transcript();
        // Shown with --nocapture (and by libtest for a failing test).
        eprintln!("--- the Go test {}:\n{transcript}", self.name);
        // `-test.run` naming no test also exits 0: the PASS line of this test is the proof.
        let passed = transcript
            .lines()
            .any(|l| l.starts_with(&format!("--- PASS: {} ", self.name)));
        assert!(
            status.success() && passed,
            "the Go test {} failed ({status}):\n{transcript}",
            self.name
        );
    }
}

fn read_lines(
    from: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    transcript: Arc<Mutex<Vec<String>>>,
    said: Option<mpsc::UnboundedSender<String>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(from).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let (Some(tx), Some(rest)) = (&said, line.strip_prefix("STATEGATE ")) {
                let _ = tx.send(rest.to_owned());
            }
            transcript.lock().unwrap().push(line);
        }
    })
}

fn port(env: &TestEnv) -> (&'static str, String) {
    ("STATEGATE_MQTT_PORT", env.broker_port.to_string())
}

/// Runs one self-contained Go test against a fresh service.
async fn go_alone(broker: Broker, storage: Storage, name: &str, extra: &[(&str, String)]) {
    let env = TestEnv::start_on(broker, storage, |_| {}).await;
    let mut vars = vec![port(&env)];
    vars.extend(extra.iter().cloned());
    GoTest::start("aio", name, &vars).passes().await;
    env.stop().await;
}

/// SET/GET/DEL/VDEL with fencing tokens from a Go lease (`TestFencing`).
async fn fencing(broker: Broker) {
    go_alone(broker, Storage::Memory, "TestFencing", &[]).await;
}

/// The Go SDK's own checks: a 6,500-byte key, a 65,000-byte value, empty keys refused, a
/// fencing token 10 years ahead refused as skew (`TestSdkLimits`).
async fn sdk_limits(broker: Broker) {
    go_alone(broker, Storage::Memory, "TestSdkLimits", &[]).await;
}

crate::support::every_broker!(fencing, sdk_limits);

/// KEYNOTIFY to a Go observer: SET, DEL, VDEL and an expiry, each with its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keynotify_in_broker() {
    go_alone(Broker::Embedded, Storage::Memory, "TestKeyNotify", &[]).await;
}

/// `aio-persistence: true` from the Go SDK (`WithPersist`), then from the Rust SDK
/// (`SetOptions::persist`): refused with the engine's text on memory storage (nothing
/// changes), applied on durable storage (every key there persists).
async fn persistence(storage: Storage) {
    let refused = matches!(storage, Storage::Memory);
    let env = TestEnv::start_on(Broker::Embedded, storage, |_| {}).await;
    let refusal = stategate::engine::EngineError::NotPersistent.to_string();
    let expect = if refused {
        refusal.clone()
    } else {
        "accepted".to_owned()
    };
    GoTest::start(
        "aio",
        "TestPersistence",
        &[port(&env), ("STATEGATE_EXPECT_PERSISTENCE", expect)],
    )
    .passes()
    .await;

    let rust = Sdk::connect(env.broker_port, "rust-persist").await;
    let persist = SetOptions {
        persist: true,
        ..SetOptions::default()
    };
    let key = unique_id("rust-persisted");
    match rust.set_fenced(key.as_bytes(), b"v", None, persist).await {
        Err(e) if refused => match e.kind() {
            state_store::ErrorKind::ServiceError(state_store::ServiceError::Unknown(text)) => {
                assert_eq!(text, &refusal)
            }
            other => panic!("expected the refusal {refusal:?}, got {other:?}"),
        },
        Ok(r) if !refused => assert!(r.response, "a persisted SET on durable storage is applied"),
        other => panic!(
            "SET with persist on {}: {other:?}",
            if refused { "memory" } else { "durable" }
        ),
    }
    let got = rust.get(key.as_bytes()).await.response;
    assert_eq!(got, (!refused).then(|| b"v".to_vec()));
    rust.close().await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_refused_on_memory() {
    persistence(Storage::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_accepted_on_durable() {
    persistence(Storage::Durable).await;
}

/// "held-by <client id> <token>"
fn held_by(line: &str) -> (String, HybridLogicalClock) {
    let mut parts = line.split(' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("held-by"), Some(id), Some(token), None) => (
            id.to_owned(),
            HybridLogicalClock::from_str(token).unwrap_or_else(|e| panic!("{token:?} is not an HLC: {e:?}")),
        ),
        _ => panic!("expected held-by <id> <token>, got {line:?}"),
    }
}

/// A lease handed over A (Go) -> B (Go) -> Rust -> A (Go), then edited under the Go SDK's lock
/// by B: see `TestLeaseHandover` for the Go side of each turn. Tokens grow at every handover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_handover_between_go_and_rust() {
    let env = TestEnv::start(Broker::Embedded).await;
    let name = unique_id("lease/handover");
    let resource = unique_id("lease/resource");
    let rust = Sdk::connect(env.broker_port, "rust-lease").await;
    let lease = rust.lease(name.as_bytes());
    let ttl = Duration::from_secs(60);
    let mut go = GoTest::start(
        "aio",
        "TestLeaseHandover",
        &[
            port(&env),
            ("STATEGATE_LEASE", name.clone()),
            ("STATEGATE_RESOURCE", resource.clone()),
        ],
    );

    let (a, token_a) = held_by(&go.hear("that A holds the lease").await);
    match within("acquire", lease.acquire(ttl, REQUEST_TIMEOUT, None)).await {
        Err(e) => assert!(
            matches!(e.kind(), leased_lock::ErrorKind::LeaseAlreadyHeld),
            "expected LeaseAlreadyHeld, got {e:?}"
        ),
        Ok(t) => panic!("the Rust client acquired a lease A holds (token {t})"),
    }
    let holder = within("get_holder", lease.get_holder(REQUEST_TIMEOUT)).await;
    assert_eq!(holder.expect("get_holder"), Some(a.clone().into_bytes()));
    let mut observed = within("observe", lease.observe(REQUEST_TIMEOUT))
        .await
        .expect("observe the lease");
    go.say("release").await;

    let (b, token_b) = held_by(&go.hear("that B holds the lease").await);
    assert_ne!(a, b);
    assert_later(&token_b, &token_a);
    // The Rust observer saw A let go and B take it.
    expect_del(&mut observed).await;
    let n = next_notification(&mut observed).await;
    assert_eq!(n.operation, Operation::Set(b.clone().into_bytes()), "B's acquire: {n}");
    assert_eq!(n.version, token_b, "the notification carries B's token as its version");
    go.say("release").await;

    assert_eq!(go.hear("that B released").await, "released");
    let token_r = within("acquire", lease.acquire(ttl, REQUEST_TIMEOUT, None))
        .await
        .expect("the Rust client acquires after B released");
    assert_later(&token_r, &token_b);
    let set = rust
        .set_fenced(
            resource.as_bytes(),
            b"by-rust",
            Some(token_r.clone()),
            SetOptions::default(),
        )
        .await
        .expect("the Rust holder writes with its token");
    assert!(set.response);
    go.say(&format!("held-by-rust {token_r}")).await;

    assert_eq!(go.hear("that A waits for the lease").await, "waiting");
    within("release", lease.release(REQUEST_TIMEOUT))
        .await
        .expect("the Rust client releases");
    assert_eq!(go.hear("the end of the handover").await, "done by-a+b");
    go.passes().await;

    let got = rust.get(resource.as_bytes()).await;
    assert_eq!(got.response, Some(b"by-a+b".to_vec()), "the last holder's edit");
    let holder = within("get_holder", lease.get_holder(REQUEST_TIMEOUT)).await;
    assert_eq!(holder.expect("get_holder"), None, "everyone released");
    rust.close().await;
    env.stop().await;
}
