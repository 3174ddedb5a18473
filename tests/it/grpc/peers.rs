//! The official Python Dapr SDK as a peer, cross-checked over MQTT with the official Azure IoT
//! Operations Rust SDK.

use super::*;

/// Runs a command to its end, capturing its output, within `limit`: past it the child is killed
/// (`kill_on_drop`) and the test fails. Awaits the child's exit; nothing blocks a worker.
pub(crate) async fn run_bounded(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("{what}: waiting for {cmd:?}: {e}"),
        Err(_) => panic!("{what}: still running after {limit:?}, killed ({cmd:?})"),
    }
}

pub(crate) fn describe(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A virtualenv with the Dapr SDK, created once under `$HOME/.cache/stategate-pyvenv` and
/// reused while it imports what the tests use: the clients, the actor runtime served by the
/// SDK's FastAPI extension (with uvicorn), and the workflow runtime. `dapr[fastapi]>=1.19`:
/// since 1.19 the extensions ship inside the `dapr` package (the workflow one with no extra
/// dependency), so one requirement brings them all. A venv missing only some of them is
/// completed, not rebuilt. A lock file keeps concurrent test runs from building it twice
/// (taken on a blocking thread).
pub(crate) async fn dapr_sdk_python() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let cache = Path::new(&home).join(".cache");
    std::fs::create_dir_all(&cache).expect("create ~/.cache");
    let venv = cache.join("stategate-pyvenv");
    let python = venv.join("bin").join("python");
    let lock_path = cache.join("stategate-pyvenv.lock");
    let lock = tokio::task::spawn_blocking(move || {
        let lock = std::fs::File::create(lock_path).expect("venv lock file");
        lock.lock().expect("lock the venv");
        lock
    })
    .await
    .expect("lock task");
    async fn has_sdk(python: &Path) -> bool {
        python.exists()
            && run_bounded(
                Command::new(python).args([
                    "-c",
                    "import dapr.clients, dapr.actor, dapr.ext.fastapi, dapr.ext.workflow, uvicorn",
                ]),
                Duration::from_secs(60),
                "import dapr",
            )
            .await
            .status
            .success()
    }
    if !has_sdk(&python).await {
        pip_install(&venv, "dapr[fastapi]>=1.19").await;
        assert!(
            has_sdk(&python).await,
            "the venv at {} still cannot import the Dapr SDK's clients, actors and workflows",
            venv.display()
        );
    }
    drop(lock);
    python
}

/// The official Python Dapr SDK drives the Dapr gRPC runtime API (its script asserts every
/// result); the value it saved is then read over MQTT by the official Azure IoT Operations
/// Rust SDK with the same version as the ETag the Python SDK saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_dapr_sdk_interop() {
    let python = dapr_sdk_python().await;
    let env = TestEnv::start(Broker::Embedded).await;
    let script = crate::support::repo_path("tests/python/dapr_sdk_check.py");
    let grpc = env.grpc().trim_start_matches("http://").to_owned();
    let http = env.http();
    let out = run_bounded(
        Command::new(&python)
            .arg(&script)
            .arg(&grpc)
            .arg(&http)
            .env("PYTHONUNBUFFERED", "1")
            .env("DAPR_HEALTH_TIMEOUT", "20")
            .env_remove("DAPR_API_TOKEN"),
        Duration::from_secs(60),
        "dapr_sdk_check.py",
    )
    .await;
    assert!(
        out.status.success(),
        "the Python Dapr SDK check failed: {}",
        describe(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line: {}", describe(&out)));
    let result: serde_json::Value = serde_json::from_str(result).expect("RESULT is JSON");
    let (key, etag, value) = (
        result["key"].as_str().expect("key"),
        result["etag"].as_str().expect("etag"),
        result["value"].as_str().expect("value"),
    );

    let got = aio_get(env.broker_port, key.as_bytes()).await;
    assert_eq!(
        got.response.as_deref(),
        Some(value.as_bytes()),
        "the AIO SDK reads the Dapr SDK's value"
    );
    assert_eq!(
        got.version.map(|v| v.to_string()).as_deref(),
        Some(etag),
        "the AIO SDK's version is the Dapr SDK's ETag"
    );
    env.stop().await;
}

/// One GET through the Azure IoT Operations state store client (as in `aio.rs`); a GET needs
/// no notification subscription, so the client is used as soon as its session is connected.
pub(super) async fn aio_get(
    port: u16,
    key: &[u8],
) -> azure_iot_operations_services::state_store::Response<Option<Vec<u8>>> {
    use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
    use azure_iot_operations_mqtt::session::{Session, SessionOptionsBuilder};
    use azure_iot_operations_protocol::application::ApplicationContextBuilder;
    use azure_iot_operations_services::state_store;

    let settings = MqttConnectionSettingsBuilder::default()
        .client_id(unique_id("grpc-aio"))
        .hostname("127.0.0.1")
        .tcp_port(port)
        .use_tls(false)
        .build()
        .expect("connection settings");
    let session = Session::new(
        SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()
            .expect("session options"),
    )
    .expect("session");
    let monitor = session.create_session_monitor();
    let client = state_store::Client::new(
        ApplicationContextBuilder::default()
            .build()
            .expect("application context"),
        session.create_managed_client(),
        session.create_session_monitor(),
        state_store::ClientOptionsBuilder::default()
            .build()
            .expect("client options"),
    )
    .expect("state store client");
    let exit = session.create_exit_handle();
    let session = tokio::spawn(session.run());
    within("the AIO session to connect", monitor.connected()).await;
    let got = within("an AIO GET", client.get(key.to_vec(), Duration::from_secs(5)))
        .await
        .expect("AIO GET");
    within("the AIO client to shut down", client.shutdown())
        .await
        .expect("client shutdown");
    if exit.try_exit().is_err() {
        exit.force_exit();
    }
    within("the AIO session to end", session)
        .await
        .expect("session task")
        .expect("session ends cleanly");
    got
}

/// Installs `requirement` into the virtualenv `venv` (made first when missing), bounded in
/// time; a failure fails the test that needs it (a missing prerequisite is no skip).
pub(crate) async fn pip_install(venv: &Path, requirement: &str) {
    let python = venv.join("bin").join("python");
    if !python.exists() {
        let o = run_bounded(
            Command::new("python3").args(["-m", "venv", "--clear"]).arg(venv),
            Duration::from_secs(120),
            "python3 -m venv",
        )
        .await;
        assert!(
            o.status.success(),
            "python3 -m venv {} failed (./scripts/test installs python3-venv): {}",
            venv.display(),
            describe(&o)
        );
    }
    let o = run_bounded(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-q",
                requirement,
            ])
            .env("PIP_DEFAULT_TIMEOUT", "60"),
        Duration::from_secs(600),
        "pip install",
    )
    .await;
    assert!(
        o.status.success(),
        "pip install {requirement:?} into {} failed (is PyPI reachable?): {}",
        venv.display(),
        describe(&o)
    );
}
