//! The web console: how its files are served (content types, CSP, caching, no token needed,
//! off with `--no-ui`), the status route, and the browser tests: Debian's Chromium driven by
//! `tests/browser/console.mjs` (playwright-core) against the service on free ports.
//!
//! The browser tests need `/usr/bin/chromium` (or `$STATEGATE_CHROMIUM`) and Node.js 20+;
//! `./scripts/test` installs Chromium when missing, and these tests install playwright-core
//! into `~/.cache/stategate-npm` (never into the clone). Without a browser they fail with a
//! message saying what is missing, unless `STATEGATE_SKIP_BROWSER=1` is set outside CI, in which
//! case they print a loud SKIPPED notice instead of passing silently (in CI, `CI` set, they fail).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::support::{Broker, RawClient, TestEnv, now_ts, prop, unique_id};

const TOKEN: &str = "console-test-token-5f1c";

async fn env_with(tweak: impl FnOnce(&mut stategate::config::Config)) -> (TestEnv, reqwest::Client, String) {
    let env = TestEnv::start_with(Broker::Embedded, tweak).await;
    let base = env.http();
    (env, reqwest::Client::new(), base)
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_files_are_served_with_types_csp_and_validators() {
    let (env, c, base) = env_with(|_| {}).await;
    for path in ["/ui", "/ui/", "/ui/index.html"] {
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8", "{path}");
        assert_eq!(header(&r, "cache-control"), "no-cache");
        assert_eq!(
            header(&r, "content-security-policy"),
            stategate::http::ui::CONTENT_SECURITY_POLICY
        );
        assert!(!header(&r, "content-security-policy").contains("unsafe"));
        assert_eq!(header(&r, "x-content-type-options"), "nosniff");
        assert!(r.text().await.unwrap().contains("<title>stategate console</title>"));
    }
    // Every file the page and its modules refer to is served, with its type.
    let html = c.get(format!("{base}/ui")).send().await.unwrap().text().await.unwrap();
    let mut files: Vec<String> = refs(&html, &["src=\"", "href=\""]);
    let mut i = 0;
    while i < files.len() {
        let r = c.get(format!("{base}{}", files[i])).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{}", files[i]);
        let ct = header(&r, "content-type");
        let want = match files[i].rsplit('.').next() {
            Some("js") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("svg") => "image/svg+xml",
            other => panic!("unexpected file type {other:?}"),
        };
        assert_eq!(ct, want, "{}", files[i]);
        let body = r.text().await.unwrap();
        if files[i].ends_with(".js") {
            for m in refs(&body, &["from './"]) {
                let f = format!("/ui/{}", m.trim_start_matches('/'));
                if !files.contains(&f) {
                    files.push(f);
                }
            }
        }
        i += 1;
    }
    assert!(files.len() >= 8, "{files:?}");

    // Validators: the same ETag answers 304 without a body.
    let r = c.get(format!("{base}/ui/app.js")).send().await.unwrap();
    let etag = header(&r, "etag");
    assert!(etag.starts_with('"') && etag.len() > 2, "{etag}");
    let r = c
        .get(format!("{base}/ui/app.js"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert!(r.bytes().await.unwrap().is_empty());
    // An unknown file is a clear 404.
    let r = c.get(format!("{base}/ui/nope.js")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body: Value = r.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("nope.js"), "{body}");
    env.stop().await;
}

/// Paths after each `prefix` up to the next quote, e.g. `src="/ui/app.js"`.
fn refs(text: &str, prefixes: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for p in prefixes {
        for part in text.split(p).skip(1) {
            if let Some(end) = part.find(['"', '\'']) {
                out.push(part[..end].to_owned());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_files_need_no_token_but_every_data_route_does() {
    let (env, c, base) = env_with(|cfg| cfg.http.api_token = Some(TOKEN.into())).await;
    for path in ["/ui", "/ui/", "/ui/app.js", "/ui/style.css", "/ui/favicon.svg"] {
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path} without a token");
    }
    for path in [
        "/v1.0/metadata",
        "/v1.0-alpha1/stategate/status",
        "/v1.0-alpha1/state/statestore/keys",
        "/v1.0/state/statestore/k",
        "/v1.0-alpha1/state/statestore/subscribe",
        "/openapi.json",
        "/ui/nope.js",
        "/ui/app.js/more",
        "/uix",
    ] {
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path} without a token");
        let r = c
            .get(format!("{base}{path}"))
            .header("dapr-api-token", "wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path} with a wrong token");
    }
    let r = c
        .post(format!("{base}/v1.0/state/statestore"))
        .json(&json!([{"key": "k", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "save without a token");
    let r = c
        .get(format!("{base}/v1.0-alpha1/stategate/status"))
        .header("dapr-api-token", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ui_turns_the_console_off() {
    let (env, c, base) = env_with(|cfg| {
        cfg.http.ui = false;
        cfg.http.api_token = Some(TOKEN.into());
    })
    .await;
    let r = c.get(format!("{base}/ui")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "no exemption once the console is off"
    );
    let r = c
        .get(format!("{base}/ui"))
        .header("dapr-api-token", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = c
        .get(format!("{base}/v1.0-alpha1/stategate/status"))
        .header("dapr-api-token", TOKEN)
        .send()
        .await
        .unwrap();
    let status: Value = r.json().await.unwrap();
    let http = status["doors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "http")
        .unwrap();
    assert!(!http["detail"].as_str().unwrap().contains("/ui"), "{http}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_version_storage_keys_doors_and_clients() {
    let (env, c, base) = env_with(|_| {}).await;
    let _client = RawClient::connect(env.broker_port, &unique_id("status")).await;
    c.post(format!("{base}/v1.0/state/statestore"))
        .json(&json!([{"key": "a", "value": 1}, {"key": "b", "value": 2}]))
        .send()
        .await
        .unwrap();
    let s: Value = c
        .get(format!("{base}/v1.0-alpha1/stategate/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["nodeId"], "stategate");
    assert!(s["uptimeSeconds"].as_u64().is_some(), "{s}");
    assert!(s["startedAt"].as_str().unwrap().ends_with('Z'), "{s}");
    assert_eq!(s["storage"], json!({"kind": "memory"}));
    assert_eq!(s["keys"], 2);
    assert_eq!(s["mqttBroker"], "embedded");
    // Only the test's connection: the service serves inside the broker, with no client of its
    // own. The broker counts a connection a moment after its CONNACK, so ask until it shows
    // (bounded): it must never show 2 (the service's own) along the way.
    let deadline = tokio::time::Instant::now() + crate::support::WAIT;
    let mut clients = s["mqttConnectedClients"].clone();
    while clients != 1 {
        assert!(clients.as_u64().is_some_and(|n| n < 1), "{s}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the test's connection is not counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let s: Value = c
            .get(format!("{base}/v1.0-alpha1/stategate/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        clients = s["mqttConnectedClients"].clone();
    }
    let doors: Vec<(&str, &str)> = s["doors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["name"].as_str().unwrap(), d["address"].as_str().unwrap()))
        .collect();
    let http = base.trim_start_matches("http://");
    let grpc = env.grpc();
    let mqtt = format!("127.0.0.1:{}", env.broker_port);
    assert_eq!(
        doors,
        vec![
            ("mqtt", mqtt.as_str()),
            ("http", http),
            ("grpc", grpc.trim_start_matches("http://"))
        ]
    );
    env.stop().await;

    // An external broker cannot say who is connected: null, never a guess.
    let env = TestEnv::start(Broker::Mosquitto).await;
    let s: Value = reqwest::get(format!("{}/v1.0-alpha1/stategate/status", env.http()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s["mqttBroker"], "external");
    assert!(s["mqttConnectedClients"].is_null(), "{s}");
    env.stop().await;
}

// ---- the browser tests ----

/// Runs `f` off the async workers; its panic (a clear message) is the test's panic.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// What the browser tests run with.
struct Browser {
    node: PathBuf,
    chromium: PathBuf,
    playwright: PathBuf,
}

/// Node.js, Chromium and playwright-core, or `None` (with a loud notice) when they are missing
/// and `STATEGATE_SKIP_BROWSER=1`. Missing otherwise: the test fails saying what to install.
fn browser() -> Option<Browser> {
    let chromium = std::env::var_os("STATEGATE_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let node_ok = Command::new("node")
        .arg("-e")
        .arg("process.exit(Number(process.versions.node.split('.')[0]) >= 20 ? 0 : 1)")
        .status()
        .is_ok_and(|s| s.success());
    let mut missing = Vec::new();
    if !chromium.exists() {
        missing.push(format!(
            "Chromium at {} (apt-get install chromium; ./scripts/test does it)",
            chromium.display()
        ));
    }
    if !node_ok {
        missing.push("Node.js 20 or later as `node`".to_owned());
    }
    if !missing.is_empty() {
        let what = missing.join(" and ");
        if std::env::var("STATEGATE_SKIP_BROWSER").as_deref() == Ok("1") && !crate::support::in_ci() {
            // Straight to the process's stderr: the test harness captures `eprintln!`, and
            // this notice must show in a normal run.
            let _ = writeln!(
                std::io::stderr(),
                "\n***************************************************************\n\
                 *** SKIPPED: the web console browser test did NOT run.\n\
                 *** Missing: {what}.\n\
                 *** (STATEGATE_SKIP_BROWSER=1 is set; unset it to make this fail.)\n\
                 ***************************************************************\n"
            );
            return None;
        }
        panic!(
            "the web console browser test cannot run: missing {what}. Install it, or set \
             STATEGATE_SKIP_BROWSER=1 to skip this test knowingly (never in CI: CI is set)"
        );
    }
    Some(Browser {
        node: PathBuf::from("node"),
        chromium,
        playwright: playwright_core(),
    })
}

/// playwright-core as pinned in `tests/browser/package-lock.json`, installed once into
/// `~/.cache/stategate-npm` (`npm ci`) and reused while the lock file is unchanged. A lock
/// file keeps concurrent test runs from installing it twice.
fn playwright_core() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let cache = Path::new(&home).join(".cache");
    let dir = cache.join("stategate-npm");
    std::fs::create_dir_all(&dir).expect("create ~/.cache/stategate-npm");
    let lock = std::fs::File::create(cache.join("stategate-npm.lock")).expect("npm lock file");
    lock.lock().expect("lock the npm cache");
    let src = crate::support::repo_path("tests/browser");
    let wanted = std::fs::read(src.join("package-lock.json")).expect("tests/browser/package-lock.json");
    let installed = std::fs::read(dir.join("package-lock.json")).unwrap_or_default();
    let present = dir.join("node_modules/playwright-core/package.json").exists();
    if !present || installed != wanted {
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(src.join(f), dir.join(f)).expect("copy the npm manifest");
        }
        let o = run_bounded(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir),
            Duration::from_secs(300),
        );
        assert!(
            o.status.success(),
            "npm ci of playwright-core into {} failed (is the npm registry reachable?): {}\n{}",
            dir.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    drop(lock);
    dir
}

fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// A TCP proxy in front of the HTTP door that can cut every open connection at once, the way
/// a network drop would, while new connections keep working; or, while `down`, refuse new
/// connections too (each is closed as soon as it is accepted), as an unreachable service.
struct DropProxy {
    addr: std::net::SocketAddr,
    cut: watch::Sender<u64>,
    down: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl DropProxy {
    async fn start(target: std::net::SocketAddr) -> DropProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, _) = watch::channel(0u64);
        let cuts = cut.clone();
        let down = Arc::new(AtomicBool::new(false));
        let refusing = down.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if refusing.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let mut cut_rx = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.changed() => {}
                    }
                });
            }
        });
        DropProxy { addr, cut, down, task }
    }

    fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Cuts every connection and refuses new ones until [`DropProxy::up`].
    fn down(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.cut_all();
    }

    fn up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for DropProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Keys the runs start from; some written over MQTT (binary, a fencing token).
async fn seed(env: &TestEnv, token: Option<&str>) {
    let c = reqwest::Client::new();
    let big: Vec<Value> = (0..3000).map(|i| json!({"i": i, "text": "lorem ipsum"})).collect();
    let mut req = c.post(format!("{}/v1.0/state/statestore", env.http())).json(&json!([
        {"key": "user:1", "value": {"name": "Ada"}},
        {"key": "user:2", "value": {"name": "Bob"}},
        {"key": "user:3", "value": {"name": "Cy"}},
        {"key": "order:1", "value": {"total": 1}},
        {"key": "session", "value": {"sid": "abc"}, "metadata": {"ttlInSeconds": "3600"}},
        {"key": "big", "value": big},
    ]));
    if let Some(t) = token {
        req = req.header("dapr-api-token", t);
    }
    assert_eq!(req.send().await.unwrap().status(), StatusCode::NO_CONTENT);
    let mut m = RawClient::connect(env.broker_port, &unique_id("seed")).await;
    let r = m
        .request(&[b"SET", b"blob", b"\xff\x00\x01binary"], &[("__ts", &now_ts())])
        .await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    let ft = now_ts();
    let r = m
        .request(&[b"SET", b"lock", b"\"held\""], &[("__ts", &now_ts()), ("__ft", &ft)])
        .await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
}

/// Changes the service keeps for resuming feeds in the browser tests (`@@churn 80` outlasts it).
const HISTORY: usize = 64;

/// One browser at a time: the machine may have only 2 cores.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs the driver in `mode` against the service behind a [`DropProxy`], answering its
/// requests for changes made by another client (over MQTT) and for dropped connections.
async fn run_driver(b: &Browser, env: &TestEnv, mode: &str, token: Option<&str>, screenshot: Option<&Path>) {
    let _one = ONE_BROWSER.lock().await;
    let http: std::net::SocketAddr = env.http().trim_start_matches("http://").parse().unwrap();
    let proxy = DropProxy::start(http).await;
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-artifacts");
    let script = crate::support::repo_path("tests/browser/console.mjs");
    let mut cmd = Command::new(&b.node);
    cmd.arg(&script)
        .env("CONSOLE_URL", format!("http://{}/ui", proxy.addr))
        .env("SERVICE_URL", env.http())
        .env("MODE", mode)
        .env("ARTIFACTS", &artifacts)
        .env("CHROMIUM", &b.chromium)
        .env("PLAYWRIGHT_DIR", &b.playwright)
        .env_remove("SCREENSHOT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("API_TOKEN", t);
    }
    if let Some(s) = screenshot {
        cmd.env("SCREENSHOT", s);
    }
    let mut child = cmd.spawn().expect("start node");
    let mut stdin = child.stdin.take().unwrap();
    let (tx, mut lines) = mpsc::unbounded_channel::<String>();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let out_tx = tx.clone();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = out_tx.send(line);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let label = mode.to_owned();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[driver {label}] {line}");
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    drop(tx);
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("other-client")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut done = false;
    loop {
        let line = match tokio::time::timeout_at(deadline, lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(_) => {
                let _ = child.kill();
                panic!("the browser driver ({mode}) did not finish within 180 s");
            }
        };
        let reply = if let Some(req) = line.strip_prefix("@@set ") {
            let req: Value = serde_json::from_str(req).expect("@@set JSON");
            let key = req["key"].as_str().unwrap();
            let value = req["value"].as_str().unwrap();
            let r = mqtt
                .request(&[b"SET", key.as_bytes(), value.as_bytes()], &[("__ts", &now_ts())])
                .await;
            match prop(&r, "__ts") {
                Some(v) if prop(&r, "__stat") == Some("200") => format!("@@ok {v}"),
                _ => format!("@@err SET {key} answered {:?}", prop(&r, "__stat")),
            }
        } else if line == "@@drop" {
            proxy.cut_all();
            "@@ok".to_owned()
        } else if line == "@@down" {
            proxy.down();
            "@@ok".to_owned()
        } else if line == "@@up" {
            proxy.up();
            "@@ok".to_owned()
        } else if let Some(n) = line.strip_prefix("@@churn ") {
            let n: usize = n.parse().expect("@@churn count");
            let mut stat = None;
            for i in 0..n {
                let key = format!("churn:{}", i % 5);
                let r = mqtt
                    .request(&[b"SET", key.as_bytes(), b"1"], &[("__ts", &now_ts())])
                    .await;
                stat = prop(&r, "__stat").map(str::to_owned).filter(|s| s != "200").or(stat);
            }
            match stat {
                None => "@@ok".to_owned(),
                Some(s) => format!("@@err a churn SET answered {s}"),
            }
        } else {
            done |= line == format!("@@done {mode}");
            println!("[driver {mode}] {line}");
            continue;
        };
        if writeln!(stdin, "{reply}").and_then(|()| stdin.flush()).is_err() {
            break;
        }
    }
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    let stderr = errors.join().unwrap_or_default();
    println!("console screenshots ({mode}): {}", artifacts.join(mode).display());
    assert!(
        status.success() && done,
        "the browser test ({mode}) failed ({status}); screenshots in {}\n{stderr}",
        artifacts.join(mode).display()
    );
}

/// The console in Chromium: filter, open, edit, conflict, live changes (pause, filter,
/// resume after an outage with the changes made meanwhile, reset after a long one), create,
/// delete, status, phone layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium() {
    let Some(b) = blocking(browser).await else {
        return;
    };
    let env = TestEnv::start_with(Broker::Embedded, |cfg| {
        // A second store, with its own key prefix, for the store picker and paging.
        cfg.dapr.stores =
            stategate::dapr::Stores::new(vec!["statestore".parse().unwrap(), "orders=name".parse().unwrap()]);
        // A short history, so the driver can outlast it (`@@churn`).
        cfg.limits.feed.max_events = HISTORY;
    })
    .await;
    seed(&env, None).await;
    // `STATEGATE_UPDATE_SCREENSHOT=1` also rewrites docs/console.png.
    let readme_shot =
        std::env::var_os("STATEGATE_UPDATE_SCREENSHOT").map(|_| crate::support::repo_path("docs/console.png"));
    run_driver(&b, &env, "open", None, readme_shot.as_deref()).await;
    env.stop().await;
}

/// With `--api-token`: the console asks for the token, refuses a wrong one, keeps the right one
/// in sessionStorage, sends it as a header (never in a URL), and the live view (fetch reader)
/// works and reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium_with_api_token() {
    let Some(b) = blocking(browser).await else {
        return;
    };
    let env = TestEnv::start_with(Broker::Embedded, |cfg| {
        cfg.http.api_token = Some(TOKEN.into());
        cfg.limits.feed.max_events = HISTORY;
    })
    .await;
    seed(&env, Some(TOKEN)).await;
    run_driver(&b, &env, "token", Some(TOKEN), None).await;
    env.stop().await;
}
