//! Operating the service: `/metrics` (parsed as Prometheus text) moving with traffic on every
//! door, readiness following the broker, and the real binary's configuration file, exit codes,
//! JSON logs and graceful shutdown.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use stategate::config::{BrokerChoice, Config};
use stategate::grpc::pb::dapr::proto::components::v1 as cpb;
use stategate::grpc::pb::statestore::v1 as npb;
use stategate::metrics::Metrics;
use stategate::storage::{StorageKind, Store};
use tonic::transport::Endpoint;

use crate::support::{Broker, Mosquitto, RawClient, TestEnv, WAIT, free_port, now_ts, prop, unique_id};

const BIN: &str = env!("CARGO_BIN_EXE_stategate");

/// Samples of a scrape by metric name: (labels, value).
type Scrape = HashMap<String, Vec<(HashMap<String, String>, f64)>>;

async fn scrape(url: &str) -> Scrape {
    let text = reqwest::get(url)
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("body");
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text format");
    let mut out: Scrape = HashMap::new();
    for s in parsed.samples {
        let value = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
            prometheus_parse::Value::Summary(_) => continue,
        };
        let labels = s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        out.entry(s.metric).or_default().push((labels, value));
    }
    out
}

/// The sum of `name`'s samples whose labels include every pair of `want`.
fn sum(s: &Scrape, name: &str, want: &[(&str, &str)]) -> f64 {
    s.get(name)
        .into_iter()
        .flatten()
        .filter(|(labels, _)| want.iter().all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_traffic_on_every_door() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("component.sock");
    let mut config = Config::default();
    config.storage.kind = StorageKind::Durable;
    config.storage.data_dir = dir.path().join("data");
    config.http_listen = Some("127.0.0.1:0".parse().unwrap());
    config.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
    config.ops.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    config.dapr_component_socket = Some(socket.clone());
    config.broker = BrokerChoice::Embedded {
        listen: "127.0.0.1:0".parse().unwrap(),
        client_path: false,
    };
    let metrics = Metrics::new();
    let clock = Arc::new(stategate::hlc::SystemClock);
    let store = Store::open_observed(&config.storage, clock.clone(), &metrics)
        .await
        .unwrap();
    let running = stategate::start_observed(config, store, clock, metrics).await.unwrap();
    let http = format!("http://{}", running.http_addr().unwrap());
    let own_port = format!("http://{}/metrics", running.metrics_addr().unwrap());
    let before = scrape(&format!("{http}/metrics")).await;
    assert_eq!(sum(&before, "stategate_requests_total", &[]), 0.0);

    // MQTT: a SET, a GET and a KEYNOTIFY registration, then a change it is told of.
    let mut mqtt = RawClient::connect(running.mqtt_broker().1, &unique_id("metrics")).await;
    let got = mqtt.request(&[b"SET", b"m1", b"v1"], &[("__ts", &now_ts())]).await;
    assert_eq!(prop(&got, "__stat"), Some("200"));
    mqtt.request(&[b"GET", b"m1"], &[("__ts", &now_ts())]).await;
    let id = mqtt.id.clone();
    mqtt.subscribe(&stategate::mqtt::request::notify_topic(&id, b"m1"))
        .await;
    mqtt.request(&[b"KEYNOTIFY", b"m1"], &[("__ts", &now_ts()), ("__srcId", &id)])
        .await;
    // HTTP: a save, a get and a get of a missing store (a client error).
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{http}/v1.0/state/statestore"))
        .json(&json!([{"key": "m1", "value": "from-http"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    mqtt.next().await; // the KEYNOTIFY notification of that change
    c.get(format!("{http}/v1.0/state/statestore/m1")).send().await.unwrap();
    let r = c.get(format!("{http}/v1.0/state/nostore/m1")).send().await.unwrap();
    assert!(r.status().is_client_error());
    // gRPC: statestore.v1 Set; the component socket: Set.
    let ch = Endpoint::from_shared(format!("http://{}", running.grpc_addr().unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    npb::state_store_client::StateStoreClient::new(ch)
        .set(npb::SetRequest {
            key: b"m2".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let uds = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    cpb::state_store_client::StateStoreClient::new(uds)
        .set(cpb::SetRequest {
            key: "m3".into(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();

    let s = scrape(&format!("{http}/metrics")).await;
    let ok = |door, command| {
        sum(
            &s,
            "stategate_requests_total",
            &[("door", door), ("command", command), ("outcome", "ok")],
        )
    };
    assert_eq!(ok("mqtt", "set"), 1.0);
    assert_eq!(ok("mqtt", "get"), 1.0);
    assert_eq!(ok("mqtt", "keynotify"), 1.0);
    assert_eq!(ok("http", "set"), 1.0);
    assert_eq!(ok("http", "get"), 1.0);
    assert_eq!(
        sum(
            &s,
            "stategate_requests_total",
            &[("door", "http"), ("outcome", "client_error")]
        ),
        1.0
    );
    assert_eq!(ok("grpc", "set"), 1.0);
    assert_eq!(ok("dapr_component", "set"), 1.0);
    assert!(
        sum(
            &s,
            "stategate_request_duration_seconds_count",
            &[("door", "mqtt"), ("command", "set")]
        ) == 1.0
    );
    assert_eq!(sum(&s, "stategate_keys", &[]), 3.0);
    assert!(sum(&s, "stategate_value_bytes", &[]) >= 3.0);
    assert_eq!(sum(&s, "stategate_keynotify_registrations", &[]), 1.0);
    assert_eq!(sum(&s, "stategate_keynotify_notifications_sent_total", &[]), 1.0);
    assert_eq!(sum(&s, "stategate_mqtt_subscribed", &[]), 1.0);
    assert!(sum(&s, "stategate_broker_connections", &[]) >= 1.0);
    assert!(sum(&s, "stategate_storage_write_duration_seconds_count", &[]) >= 4.0);
    assert!(sum(&s, "stategate_storage_commit_batch_writes_count", &[]) >= 1.0);
    assert!(sum(&s, "stategate_storage_fsync_duration_seconds_count", &[]) >= 1.0);
    // The same registry on its own port.
    let own = scrape(&own_port).await;
    assert_eq!(sum(&own, "stategate_keys", &[]), 3.0);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_metrics_means_404_and_probes_stay() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.ops.metrics = false).await;
    let r = reqwest::get(format!("{}/metrics", env.http())).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = reqwest::get(format!("{}/healthz", env.http())).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = reqwest::get(format!("{}/v1.0/healthz", env.http())).await.unwrap();
    assert!(r.status().is_success(), "Dapr's health route stays");
    env.stop().await;
}

/// GET `/readyz` until its status is `want` (the broker is an outside process: no event).
async fn readyz_until(http: &str, want: StatusCode) -> serde_json::Value {
    let give_up = Instant::now() + WAIT;
    loop {
        let r = reqwest::get(format!("{http}/readyz")).await.unwrap();
        if r.status() == want {
            return r.json().await.unwrap();
        }
        assert!(
            Instant::now() < give_up,
            "/readyz did not become {want} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks the gRPC health service until it reports `serving` (it re-checks every second).
async fn grpc_health_until(
    health: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
    serving: bool,
) {
    let want = match serving {
        true => tonic_health::pb::health_check_response::ServingStatus::Serving,
        false => tonic_health::pb::health_check_response::ServingStatus::NotServing,
    } as i32;
    let give_up = Instant::now() + WAIT;
    loop {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
            .await
            .unwrap()
            .into_inner()
            .status;
        if status == want {
            return;
        }
        assert!(Instant::now() < give_up, "gRPC health is {status}, not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_external_broker() {
    let mosquitto = Mosquitto::start().await;
    let port = mosquitto.port;
    let env = TestEnv::start_with(Broker::Embedded, move |c| {
        c.broker = BrokerChoice::External {
            host: "127.0.0.1".into(),
            port,
        }
    })
    .await;
    let body = readyz_until(&env.http(), StatusCode::OK).await;
    assert_eq!(body["ready"], true, "{body}");
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        Endpoint::from_shared(env.grpc()).unwrap().connect().await.unwrap(),
    );
    grpc_health_until(&mut health, true).await;

    drop(mosquitto);
    let body = readyz_until(&env.http(), StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(body["ready"], false, "{body}");
    assert_eq!(body["storage"], "ok", "{body}");
    assert_ne!(body["mqtt"], "ok", "{body}");
    // The gRPC health service reports the same (it re-checks every second).
    grpc_health_until(&mut health, false).await;
    env.stop().await;
}

/// While `start` waits for an external broker that does not answer (up to 10 s), the gRPC door
/// already answers: its health service must say not serving, as `/readyz` does, until a
/// readiness check passes (tonic-health's own default is serving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_is_not_serving_before_the_first_readiness_check() {
    let grpc_port = free_port();
    let nobody = free_port();
    let mut config = Config {
        http_listen: None,
        grpc_listen: Some(format!("127.0.0.1:{grpc_port}").parse().unwrap()),
        ..Default::default()
    };
    config.storage.kind = StorageKind::Memory;
    config.broker = BrokerChoice::External {
        host: "127.0.0.1".into(),
        port: nobody,
    };
    let starting = tokio::spawn(stategate::start(config, Store::memory()));
    let give_up = Instant::now() + WAIT;
    let channel = loop {
        match Endpoint::from_shared(format!("http://127.0.0.1:{grpc_port}"))
            .unwrap()
            .connect()
            .await
        {
            Ok(ch) => break ch,
            Err(e) => {
                assert!(Instant::now() < give_up, "the gRPC door never listened: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .expect("health answers")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32,
        "gRPC health while the broker has never answered"
    );
    // `start` gives up waiting after 10 s and goes on; the door keeps saying not serving.
    let running = tokio::time::timeout(Duration::from_secs(30), starting).await;
    if let Ok(Ok(Ok(r))) = running {
        grpc_health_until(&mut health, false).await;
        r.shutdown().await;
    }
}

/// The real binary, its stderr collected; killed on drop.
struct Service {
    child: Child,
    http: String,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Service {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Service {
        let http_port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .args(["--mqtt-listen", "127.0.0.1:0", "--grpc-listen", "off"])
            .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn stategate");
        let mut stderr = child.stderr.take().expect("stderr");
        let collector = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let http = format!("http://127.0.0.1:{http_port}");
        let mut service = Service {
            child,
            http,
            stderr: Some(collector),
        };
        blocking(|| service.wait_ready());
        service
    }

    /// Polls `/healthz` (an outside process: no event to await).
    fn wait_ready(&mut self) {
        let give_up = Instant::now() + WAIT;
        let addr = self.http.trim_start_matches("http://").to_owned();
        loop {
            if let Ok(mut s) = TcpStream::connect(&addr) {
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                if out.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let err = self
                    .stderr
                    .take()
                    .map(|h| h.join().unwrap_or_default())
                    .unwrap_or_default();
                panic!("stategate exited ({status}) before it was ready: {err}");
            }
            assert!(Instant::now() < give_up, "stategate not ready within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    /// Waits for the exit (bounded) and returns its code and stderr.
    fn wait(mut self) -> (Option<i32>, String) {
        let give_up = Instant::now() + WAIT;
        let status = blocking(|| {
            loop {
                if let Some(s) = self.child.try_wait().expect("try_wait") {
                    break s;
                }
                assert!(Instant::now() < give_up, "stategate did not exit within {WAIT:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (status.code(), err)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn node_id(http: &str) -> String {
    let s: serde_json::Value = reqwest::get(format!("{http}/v1.0-alpha1/stategate/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    s["nodeId"].as_str().unwrap_or_default().to_owned()
}

fn write_config(dir: &Path, text: &str) -> String {
    let path = dir.join("stategate.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_layers_flags_over_env_over_file_over_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(dir.path(), "node-id = \"from-file\"\nstorage = \"memory\"\n");
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (&[], &[], "from-file"),
        (&[], &[("STATEGATE_NODE_ID", "from-env")], "from-env"),
        (
            &["--node-id", "from-flag"],
            &[("STATEGATE_NODE_ID", "from-env")],
            "from-flag",
        ),
        // The file named by the environment instead of the flag.
        (&[], &[("STATEGATE_CONFIG", file.as_str())], "from-file"),
    ];
    for (args, env, want) in cases {
        let mut all = args.to_vec();
        if !env.iter().any(|(k, _)| *k == "STATEGATE_CONFIG") {
            all.extend(["--config", file.as_str()]);
        }
        let s = Service::start(&all, env);
        assert_eq!(node_id(&s.http).await, want, "{args:?} {env:?}");
    }
    // No file: the default.
    let s = Service::start(&["--storage", "memory"], &[]);
    assert_eq!(node_id(&s.http).await, "stategate");
}

#[test]
fn configuration_errors_exit_64_naming_the_file_and_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("bogus = 1\n", "unknown setting `bogus`"),
        ("max-keys = \"lots\"\n", "setting `max-keys`"),
        ("node-id = \"a:b\"\n", "setting `node-id`"),
        ("http-listen = \"nowhere\"\n", "setting `http-listen`"),
    ];
    for (text, want) in cases {
        let file = write_config(dir.path(), text);
        let out = Command::new(BIN)
            .args(["serve", "--config", &file, "--storage", "memory"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{text:?}: {err}");
        assert!(err.contains(&file) && err.contains(want), "{text:?}: {err}");
    }
    let out = Command::new(BIN)
        .args(["serve", "--config", "/nonexistent/stategate.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    // `config default` prints a file the binary accepts as is.
    let out = Command::new(BIN).args(["config", "default"]).output().unwrap();
    assert!(out.status.success());
    let file = write_config(dir.path(), &String::from_utf8_lossy(&out.stdout));
    let out = Command::new(BIN)
        .args(["serve", "--config", &file, "--storage", "memory", "--node-id", "a:b"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64));
    assert!(!err.contains(&file), "a flag's error is not blamed on the file: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_parse_line_by_line_and_text_logs_have_no_colour_off_a_terminal() {
    let s = Service::start(&["--storage", "memory", "--log-format", "json"], &[]);
    let r = reqwest::Client::new()
        .get(format!("{}/v1.0/state/statestore/k", s.http))
        .header("x-request-id", "req-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "req-42", "the request id is returned");
    let r = reqwest::get(format!("{}/v1.0/state/statestore/k", s.http))
        .await
        .unwrap();
    assert!(
        r.headers().contains_key("x-request-id"),
        "one is made when none is given"
    );
    s.signal("TERM");
    let (code, err) = s.wait();
    assert_eq!(code, Some(0), "{err}");
    let mut n = 0;
    for line in err.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert!(v["level"].is_string() && v["fields"]["message"].is_string(), "{line}");
        n += 1;
    }
    assert!(n >= 3, "{err}");

    let s = Service::start(&["--storage", "memory"], &[]);
    s.signal("TERM");
    let (code, err) = s.wait();
    assert_eq!(code, Some(0));
    assert!(err.contains("INFO") && !err.contains('\x1b'), "{err:?}");
}

/// Runs `f`, which blocks on an outside process or a plain socket, without holding up the
/// runtime's other tasks when called from an async test (multi-thread runtime).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Reads an HTTP/1.1 response head (status line and headers) from a raw stream.
fn read_head(r: &mut BufReader<TcpStream>) -> String {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("read");
        if line == "\r\n" || line.is_empty() {
            return head;
        }
        head.push_str(&line);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_load_answers_every_request_in_flight_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let s = Service::start(&["--data-dir", data, "--shutdown-grace", "20s"], &[]);
    let addr = s.http.trim_start_matches("http://").to_owned();

    // A change stream: it must end with a final `shutdown` event.
    let sse = reqwest::get(format!("{}/v1.0-alpha1/state/statestore/subscribe", s.http))
        .await
        .unwrap();
    assert_eq!(sse.status(), StatusCode::OK);

    // A request surely in flight: its handler is reading the body (the server said
    // `100 Continue`), and the body is sent only after SIGTERM.
    let body = br#"[{"key":"in-flight","value":"kept"}]"#;
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        raw,
        "POST /v1.0/state/statestore HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(raw.try_clone().unwrap());
    assert!(
        blocking(|| read_head(&mut reader)).starts_with("HTTP/1.1 100"),
        "no 100 Continue"
    );

    // Load on other connections while the signal arrives: each worker has been answered at
    // least once before the signal is sent.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut load = Vec::new();
    for w in 0..4 {
        let (http, stop, first) = (s.http.clone(), stop.clone(), first_tx.clone());
        load.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            let mut answered = 0u32;
            for i in 0.. {
                let sent = c
                    .post(format!("{http}/v1.0/state/statestore"))
                    .json(&json!([{"key": format!("load-{w}-{i}"), "value": i}]))
                    .send()
                    .await;
                match sent {
                    // Every request the service took is answered, and well.
                    Ok(r) => {
                        assert_eq!(r.status(), StatusCode::NO_CONTENT);
                        answered += 1;
                        if answered == 1 {
                            let _ = first.send(());
                        }
                    }
                    // Refused connections after the signal: not taken, not in flight.
                    Err(_) if stop.load(std::sync::atomic::Ordering::Relaxed) => return answered,
                    Err(e) => panic!("before the signal: {e}"),
                }
            }
            answered
        }));
    }
    for _ in 0..4 {
        tokio::time::timeout(WAIT, first_rx.recv()).await.expect("load runs");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    s.signal("TERM");

    // The stream ends with its final event.
    let text = tokio::time::timeout(WAIT, sse.text())
        .await
        .expect("the stream ends")
        .unwrap();
    assert!(text.contains("event: shutdown"), "{text}");
    // The request in flight completes after the signal.
    raw.write_all(body).unwrap();
    let head = blocking(|| read_head(&mut reader));
    assert!(head.starts_with("HTTP/1.1 204"), "{head}");
    for l in load {
        assert!(l.await.unwrap() > 0);
    }
    let (code, err) = s.wait();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("shutting down"), "{err}");

    // Flushed: a restart on the same directory has the write.
    let s = Service::start(&["--data-dir", data], &[]);
    let r = reqwest::get(format!("{}/v1.0/state/statestore/in-flight", s.http))
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "\"kept\"");
}

#[test]
fn sighup_reloads_the_file_and_names_what_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(dir.path(), "storage = \"memory\"\nlog-level = \"info\"\n");
    let s = Service::start(&["--config", &file, "--log-format", "json"], &[]);
    write_config(
        dir.path(),
        "storage = \"memory\"\nlog-level = \"warn\"\nmax-keys = 5\nrate-limit = 50\n",
    );
    s.signal("HUP");
    s.signal("TERM");
    let (code, err) = s.wait();
    assert_eq!(code, Some(0), "{err}");
    let reloaded = err
        .lines()
        .find(|l| l.contains("configuration reloaded"))
        .unwrap_or_else(|| panic!("no reload record: {err}"));
    assert!(
        reloaded.contains("log-level") && reloaded.contains("rate-limit"),
        "{reloaded}"
    );
    let restart = err
        .lines()
        .find(|l| l.contains("take effect at the next start"))
        .unwrap_or_else(|| panic!("no restart warning: {err}"));
    assert!(
        restart.contains("max-keys") && !restart.contains("log-level") && !restart.contains("rate-limit"),
        "{restart}"
    );
    // After the reload the level is warn: the shutdown's info records are gone.
    let after: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.contains("configuration reloaded"))
        .skip(1)
        .collect();
    assert!(!after.iter().any(|l| l.contains("\"level\":\"INFO\"")), "{err}");
    assert!(!err.contains("shutting down"), "the shutdown record is info: {err}");
}

#[test]
fn a_broken_file_on_sighup_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(dir.path(), "storage = \"memory\"\n");
    let s = Service::start(&["--config", &file], &[]);
    write_config(dir.path(), "storage = \"memory\"\nbogus = 1\n");
    s.signal("HUP");
    s.signal("TERM");
    let (code, err) = s.wait();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("configuration not reloaded") && err.contains("bogus"),
        "{err}"
    );
}

#[test]
fn a_second_signal_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Service::start(&["--data-dir", data.to_str().unwrap(), "--shutdown-grace", "60s"], &[]);
    // A request held in flight (body never sent) would keep a graceful shutdown waiting 60 s.
    let mut raw = TcpStream::connect(s.http.trim_start_matches("http://")).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    raw.write_all(
        b"POST /v1.0/state/statestore HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let mut reader = BufReader::new(raw.try_clone().unwrap());
    assert!(read_head(&mut reader).starts_with("HTTP/1.1 100"));
    s.signal("TERM");
    s.signal("INT");
    let (code, err) = s.wait();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("second signal"), "{err}");
}
