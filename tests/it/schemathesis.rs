//! The HTTP API against its own OpenAPI document: schemathesis (PyPI, pinned) generates
//! requests for every route but the event streams from the document the service serves at
//! `/openapi.json` (bodies, headers, query and path parameters; valid ones and ones the document
//! forbids) and checks every answer: no 5xx, status, content type, headers and body as
//! documented, valid requests accepted, invalid ones refused, 405 with `Allow` for a method
//! the document does not list. Its configuration is `tests/schemathesis/schemathesis.toml`.
//!
//! Short by default (`EXAMPLES` per route and phase, a fixed seed: the same requests each run);
//! `STATEGATE_SCHEMATHESIS_EXAMPLES=500 STATEGATE_SCHEMATHESIS_SEED=random` is the long form
//! (docs/development.md). Any failure fails the test with schemathesis's report, which holds a
//! `curl` line reproducing each failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::grpc::{describe, pip_install, run_bounded};
use crate::support::{Broker, Storage, TestEnv};

/// The schemathesis release the test runs (its checks and generators change between releases).
const VERSION: &str = "4.32.5";
/// Examples per route and phase in the short form.
const EXAMPLES: u32 = 20;
/// The short form's seed: each run sends the same requests.
const SEED: u64 = 27;

/// A virtualenv with schemathesis `VERSION`, created once under
/// `$HOME/.cache/stategate-schemathesis-venv` and reused while it holds that version. A lock
/// file keeps concurrent test runs from building it twice (taken on a blocking thread).
async fn schemathesis() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let cache = Path::new(&home).join(".cache");
    std::fs::create_dir_all(&cache).expect("create ~/.cache");
    let venv = cache.join("stategate-schemathesis-venv");
    let bin = venv.join("bin").join("schemathesis");
    let lock_path = cache.join("stategate-schemathesis-venv.lock");
    let lock = tokio::task::spawn_blocking(move || {
        let lock = std::fs::File::create(lock_path).expect("venv lock file");
        lock.lock().expect("lock the venv");
        lock
    })
    .await
    .expect("lock task");
    async fn installed(bin: &Path) -> bool {
        if !bin.exists() {
            return false;
        }
        let o = run_bounded(
            Command::new(bin).arg("--version"),
            Duration::from_secs(60),
            "schemathesis --version",
        )
        .await;
        o.status.success() && String::from_utf8_lossy(&o.stdout).trim_end().ends_with(VERSION)
    }
    if !installed(&bin).await {
        pip_install(&venv, &format!("schemathesis=={VERSION}")).await;
        assert!(
            installed(&bin).await,
            "{} is not schemathesis {VERSION} after installing it",
            bin.display()
        );
    }
    drop(lock);
    bin
}

/// `STATEGATE_SCHEMATHESIS_EXAMPLES` (default [`EXAMPLES`]).
fn examples() -> u32 {
    match std::env::var("STATEGATE_SCHEMATHESIS_EXAMPLES") {
        Ok(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("STATEGATE_SCHEMATHESIS_EXAMPLES={n:?} is not a number")),
        Err(_) => EXAMPLES,
    }
}

/// `STATEGATE_SCHEMATHESIS_SEED`: a number, or `random` for a new seed each run (schemathesis
/// prints it); default [`SEED`].
fn seed() -> Option<u64> {
    match std::env::var("STATEGATE_SCHEMATHESIS_SEED").as_deref() {
        Err(_) => Some(SEED),
        Ok("random") => None,
        Ok(n) => Some(
            n.parse()
                .unwrap_or_else(|_| panic!("STATEGATE_SCHEMATHESIS_SEED={n:?} is not a number or `random`")),
        ),
    }
}

/// Every route (event streams aside) with generated requests, every phase, every check:
/// schemathesis finds no failure. The durable store, so the backup route serves its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_keeps_to_its_openapi_document() {
    let bin = schemathesis().await;
    // A campaign for a lease someone holds waits up to its `waitMs`, bounded by the request
    // timeout: a short one keeps such cases short.
    let env = TestEnv::start_on(Broker::Embedded, Storage::Durable, |c| {
        c.http.request_timeout = Duration::from_secs(5);
    })
    .await;
    let config = crate::support::repo_path("tests/schemathesis/schemathesis.toml");
    // Its working directory: whatever it leaves behind goes with the test.
    let work = tempfile::tempdir().expect("tempdir");
    let examples = examples();
    let hooks = crate::support::repo_path("tests/schemathesis/hooks.py");
    let mut cmd = Command::new(&bin);
    cmd.current_dir(work.path())
        .env("SCHEMATHESIS_HOOKS", &hooks)
        .arg("--config-file")
        .arg(&config)
        .arg("--no-color")
        .arg("run")
        .arg(format!("{}/openapi.json", env.http()))
        .args(["--max-examples", &examples.to_string()])
        .env("NO_COLOR", "1")
        .env("COLUMNS", "160");
    if let Some(seed) = seed() {
        cmd.args(["--seed", &seed.to_string()]);
    }
    // Ten minutes for the short form; a long one scales with its examples.
    let limit = Duration::from_secs(600).max(Duration::from_secs(u64::from(examples) * 6));
    let out = run_bounded(&mut cmd, limit, "schemathesis run").await;
    let report = describe(&out);
    assert!(
        out.status.success(),
        "schemathesis found failures (each with a curl line to reproduce it):\n{report}"
    );
    // Every phase ran: a phase schemathesis skipped would pass silently. Its summary lists them
    // under "Test Phases:", a skipped one marked ⏭ (with why: "not applicable", ...).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let phases: Vec<&str> = stdout
        .lines()
        .skip_while(|l| l.trim() != "Test Phases:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    for phase in ["Examples", "Coverage", "Fuzzing", "Stateful"] {
        let line = phases
            .iter()
            .find(|l| l.contains(phase))
            .unwrap_or_else(|| panic!("no {phase} phase in the summary:\n{report}"));
        assert!(!line.contains('⏭'), "the {phase} phase did not run: {line}\n{report}");
    }
    env.stop().await;
}
