//! Shared test harness: a real Mosquitto per test on a free port, the service in process, and
//! a raw MQTT5 client that sees every property byte for byte.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, Publish, PublishProperties, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use stategate::config::{BrokerChoice, Config};
use stategate::storage::Store;
use stategate::storage::durable::{DurableBackend, DurableOptions};
use tokio::sync::mpsc;

pub const INVOKE: &str = stategate::mqtt::INVOKE_TOPIC;
/// Every wait in a test is bounded by this.
pub const WAIT: Duration = Duration::from_secs(10);

/// A free loopback port for a process a test starts: below the ephemeral range, never handed
/// out twice.
pub use crate::redis::server::free_port;

/// A Mosquitto broker on a free loopback port, killed on drop.
pub struct Mosquitto {
    pub port: u16,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts Mosquitto and waits for its own word that it serves: the log line "mosquitto
    /// version ... running", written once its listener is open. A task reads its log (stderr)
    /// until it exits, so that Mosquitto never blocks on a full pipe.
    pub async fn start() -> Mosquitto {
        Mosquitto::start_with("").await
    }

    /// [`Mosquitto::start`] with `extra` lines at the end of its configuration (a plugin, an ACL).
    pub async fn start_with(extra: &str) -> Mosquitto {
        let bin = which_mosquitto();
        let mut failures = Vec::new();
        for _attempt in 0..5 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("tempdir");
            let conf = dir.path().join("mosquitto.conf");
            std::fs::write(
                &conf,
                format!(
                    "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\nmax_inflight_messages 0\nmax_queued_messages 100000\nlog_dest stderr\n{extra}"
                ),
            )
            .expect("write mosquitto.conf");
            let mut child = tokio::process::Command::new(&bin)
                .arg("-c")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn mosquitto");
            let stderr = child.stderr.take().expect("mosquitto's stderr");
            let (ready_tx, ready) = tokio::sync::oneshot::channel::<()>();
            let log = tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                let mut ready_tx = Some(ready_tx);
                let mut before_ready = Vec::new();
                while let Ok(Some(line)) = lines.next_line().await {
                    if ready_tx.is_some() && line.contains("mosquitto version") && line.ends_with(" running") {
                        let _ = ready_tx.take().map(|tx| tx.send(()));
                    } else if ready_tx.is_some() {
                        before_ready.push(line);
                    }
                }
                // Exited (or closed its log) before it was ready: most likely the port was taken.
                before_ready
            });
            match tokio::time::timeout(WAIT, ready).await {
                Ok(Ok(())) => {
                    return Mosquitto {
                        port,
                        _child: child,
                        _dir: dir,
                    };
                }
                Ok(Err(_)) => failures.push(log.await.unwrap_or_default().join("\n")),
                Err(_) => panic!("mosquitto did not log that it runs within {WAIT:?}"),
            }
        }
        panic!("mosquitto did not start; its logs:\n{}", failures.join("\n---\n"));
    }
}

fn which_mosquitto() -> PathBuf {
    for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("mosquitto is not installed: run ./scripts/test, which installs it");
}

/// Which broker a test runs against, and how stategate serves MQTT on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// An external Mosquitto: stategate's own MQTT client (the client path).
    Mosquitto,
    /// The embedded broker, serving requests inside it (the default).
    Embedded,
    /// The embedded broker with `--mqtt-client-path`: stategate's own MQTT client over loopback.
    EmbeddedClientPath,
    /// Three services on one redis-server, serving through one Mosquitto's shared subscription
    /// (see `scaleout_aio`); the [`TestEnv`]'s service is the first of them.
    RedisReplicas,
}

/// Which storage the service runs on.
#[derive(Debug, Clone)]
pub enum Storage {
    Memory,
    /// The durable backend (log and snapshots, `fsync` always) in a temporary directory that
    /// lives as long as the [`TestEnv`].
    Durable,
    /// A store opened by the test (e.g. one Redis shared by two services, as replicas do).
    Shared(Store),
}

/// A running service and the broker it uses.
pub struct TestEnv {
    pub broker_port: u16,
    pub service: Option<stategate::Running>,
    _mosquitto: Option<Mosquitto>,
    /// The durable store's directory; dropped after the service.
    data: Option<tempfile::TempDir>,
    /// The service's clock (and its durable store's): real time plus what the test added.
    clock: Arc<ShiftedClock>,
    /// With [`Broker::RedisReplicas`]: Redis and the other replicas.
    replicas: Option<crate::scaleout_aio::Replicas>,
}

/// Wall-clock time plus an offset the test moves forward: clients that stamp their requests
/// with real time stay within the clock-skew window, and a TTL passes without waiting for it.
#[derive(Debug, Default)]
pub struct ShiftedClock {
    offset_ms: std::sync::atomic::AtomicU64,
}

impl stategate::hlc::Clock for ShiftedClock {
    fn now_ms(&self) -> u64 {
        let real = stategate::hlc::Clock::now_ms(&stategate::hlc::SystemClock);
        real + self.offset_ms.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl TestEnv {
    pub async fn start(broker: Broker) -> TestEnv {
        TestEnv::start_with(broker, |_| {}).await
    }

    /// Starts with a configuration tweak (limits, page sizes, ids).
    pub async fn start_with(broker: Broker, tweak: impl FnOnce(&mut Config)) -> TestEnv {
        TestEnv::start_on(broker, Storage::Memory, tweak).await
    }

    /// Starts on the given storage, with a configuration tweak.
    pub async fn start_on(broker: Broker, storage: Storage, tweak: impl FnOnce(&mut Config)) -> TestEnv {
        let mut config = Config {
            http_listen: Some("127.0.0.1:0".parse().unwrap()),
            grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..Config::default()
        };
        let clock = Arc::new(ShiftedClock::default());
        // Say which storage runs, as the status route reports it.
        let (store, data) = match storage {
            Storage::Memory => {
                config.storage.kind = stategate::storage::StorageKind::Memory;
                (Store::memory(), None)
            }
            Storage::Durable => {
                let dir = tempfile::tempdir().expect("tempdir");
                let mut options = DurableOptions::new(dir.path());
                options.clock = clock.clone();
                let backend = DurableBackend::open(options).expect("durable storage opens");
                config.storage.kind = stategate::storage::StorageKind::Durable;
                config.storage.data_dir = dir.path().to_owned();
                (Store::new(backend), Some(dir))
            }
            Storage::Shared(store) => (store, None),
        };
        let mosquitto = match broker {
            Broker::Mosquitto | Broker::RedisReplicas => {
                let m = Mosquitto::start().await;
                config.broker = BrokerChoice::External {
                    host: "127.0.0.1".into(),
                    port: m.port,
                };
                Some(m)
            }
            Broker::Embedded | Broker::EmbeddedClientPath => {
                config.broker = BrokerChoice::Embedded {
                    listen: "127.0.0.1:0".parse().unwrap(),
                    client_path: broker == Broker::EmbeddedClientPath,
                };
                None
            }
        };
        tweak(&mut config);
        let (store, replicas) = match broker {
            Broker::RedisReplicas => {
                let (replicas, store) = crate::scaleout_aio::Replicas::start(&mut config, &clock).await;
                (store, Some(replicas))
            }
            _ => (store, None),
        };
        let running = stategate::start_with_clock(config, store, clock.clone())
            .await
            .expect("service starts");
        let broker_port = running.mqtt_broker().1;
        TestEnv {
            broker_port,
            service: Some(running),
            _mosquitto: mosquitto,
            data,
            clock,
            replicas,
        }
    }

    /// Moves the service's clock forward (TTLs pass without waiting) and wakes its expiry
    /// driver, so keys due by the new time are removed now.
    pub fn advance(&self, ms: u64) {
        self.clock.offset_ms.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
        self.engine().wake_expiry();
        if let Some(r) = &self.replicas {
            r.wake_expiry();
        }
    }

    /// Base URL of the HTTP door, e.g. `http://127.0.0.1:41234`.
    pub fn http(&self) -> String {
        let addr = self
            .service
            .as_ref()
            .and_then(|s| s.http_addr())
            .expect("http door runs");
        format!("http://{addr}")
    }

    /// URL of the gRPC door, e.g. `http://127.0.0.1:41235`.
    pub fn grpc(&self) -> String {
        let addr = self
            .service
            .as_ref()
            .and_then(|s| s.grpc_addr())
            .expect("grpc door runs");
        format!("http://{addr}")
    }

    pub fn engine(&self) -> &stategate::engine::Engine {
        self.service.as_ref().expect("running").engine()
    }

    /// Stops the service. On durable storage, then recovers a copy of the directory and checks
    /// that it holds exactly what the service served before stopping: what the doors wrote went
    /// through the log. (A copy, so the directory itself is handed over untouched by the check.)
    pub async fn stop(self) {
        let _ = self.stop_keeping_data().await;
    }

    /// [`TestEnv::stop`], handing over the durable store's directory (`None` on memory).
    pub async fn stop_keeping_data(mut self) -> Option<tempfile::TempDir> {
        if let Some(r) = self.replicas.take() {
            r.stop(self.service.as_ref().map(|s| s.engine())).await;
        }
        let Some(s) = self.service.take() else {
            return self.data.take();
        };
        let served = match &self.data {
            Some(_) => Some(live_records(s.engine()).await),
            None => None,
        };
        s.shutdown().await;
        if let (Some(dir), Some(served)) = (&self.data, served) {
            let copy = copy_data_dir(dir.path());
            let backend = DurableBackend::open(DurableOptions::new(copy.path())).expect("the copy recovers");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            let reopened = Store::new(backend);
            let all = reopened
                .backend()
                .scan(None, usize::MAX, 0, &|_| true)
                .await
                .expect("scan the reopened store");
            for key in &all.keys {
                let rec = reopened.backend().get(key).await.unwrap().expect("a scanned key");
                match served.iter().find(|(k, _)| k == key) {
                    Some((_, entry)) => {
                        let got = (&rec.value, &rec.version, &rec.fencing, rec.expires_at_ms);
                        let want = (&entry.value, &entry.version, &entry.fencing, entry.expires_at_ms);
                        assert_eq!(got, want, "{key:?} after a reopen");
                    }
                    // Expired since (expired records are loaded; the engine hides them).
                    None => assert!(rec.is_expired(now), "{key:?} was not served before stopping"),
                }
            }
            let missing: Vec<_> = served.iter().filter(|(k, _)| !all.keys.contains(k)).collect();
            assert!(missing.is_empty(), "lost by a reopen: {missing:?}");
        }
        self.data.take()
    }
}

/// Every live key and its entry, as the engine serves them.
async fn live_records(engine: &stategate::engine::Engine) -> Vec<(Bytes, stategate::engine::Entry)> {
    let mut out = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = engine
            .keys_with_prefix(b"", after.as_deref(), 4096)
            .await
            .expect("list keys");
        for key in page.keys {
            if let Some(entry) = engine.read(&key).await.expect("read") {
                out.push((key, entry));
            }
        }
        match page.resume_after {
            Some(k) => after = Some(k),
            None => return out,
        }
    }
}

/// Runs each scenario `async fn name(broker: Broker)` on every way stategate serves MQTT:
/// through Mosquitto, inside the embedded broker, and through its own client on the embedded
/// broker: `<module>::mosquitto::<name>`, `<module>::embedded::<name>` and
/// `<module>::embedded_client_path::<name>`.
macro_rules! every_broker {
    ($($name:ident),* $(,)?) => {
        mod mosquitto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::Broker::Mosquitto).await
                }
            )*
        }
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::Broker::Embedded).await
                }
            )*
        }
        mod embedded_client_path {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::Broker::EmbeddedClientPath).await
                }
            )*
        }
    };
}
pub(crate) use every_broker;
/// The former name (it ran two variants before the embedded client path was added).
#[allow(unused_imports)]
pub(crate) use every_broker as both_brokers;

/// Runs each scenario `async fn name(storage: Storage)` on memory storage and on durable
/// storage: `<module>::memory::<name>` and `<module>::durable::<name>`.
macro_rules! both_storages {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::Storage::Memory).await
                }
            )*
        }
        mod durable {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::Storage::Durable).await
                }
            )*
        }
    };
}
pub(crate) use both_storages;

/// A raw MQTT5 client: publishes requests with any properties and receives every PUBLISH.
pub struct RawClient {
    pub client: AsyncClient,
    pub id: String,
    incoming: mpsc::UnboundedReceiver<Publish>,
    subacks: mpsc::UnboundedReceiver<Vec<SubscribeReasonCode>>,
    pubacks: mpsc::UnboundedReceiver<PubAckReason>,
    subscribed: Vec<String>,
    task: tokio::task::JoinHandle<()>,
}

impl RawClient {
    pub async fn connect(port: u16, id: &str) -> RawClient {
        RawClient::connect_as(port, id, None).await.expect("connected")
    }

    /// Connects with a username and password (or none); `Err` with the CONNACK's refusal.
    pub async fn connect_as(port: u16, id: &str, credentials: Option<(&str, &str)>) -> Result<RawClient, String> {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        if let Some((user, password)) = credentials {
            o.set_credentials(user, password);
        }
        o.set_max_packet_size(Some(16 * 1024 * 1024));
        o.set_keep_alive(Duration::from_secs(30));
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        o.set_network_options(net);
        let (client, mut eventloop) = AsyncClient::new(o, 1024);
        let (tx, incoming) = mpsc::unbounded_channel();
        let (sub_tx, subacks) = mpsc::unbounded_channel();
        let (puback_tx, pubacks) = mpsc::unbounded_channel();
        let (conn_tx, mut conn_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(Event::Incoming(Packet::SubAck(a))) => {
                        let _ = sub_tx.send(a.return_codes);
                    }
                    Ok(Event::Incoming(Packet::PubAck(a))) => {
                        let _ = puback_tx.send(a.reason);
                    }
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = conn_tx.send(Ok(()));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = conn_tx.send(Err(e.to_string()));
                        return;
                    }
                }
            }
        });
        tokio::time::timeout(WAIT, conn_rx.recv())
            .await
            .expect("connack in time")
            .expect("connection attempt reported")?;
        Ok(RawClient {
            client,
            id: id.to_owned(),
            incoming,
            subacks,
            pubacks,
            subscribed: Vec::new(),
            task,
        })
    }

    /// Subscribes and waits for the SUBACK.
    pub async fn subscribe(&mut self, topic: &str) {
        let codes = self.try_subscribe(topic).await;
        assert!(
            codes.iter().all(|c| matches!(c, SubscribeReasonCode::Success(_))),
            "subscription to {topic} refused: {codes:?}"
        );
    }

    /// Subscribes and returns the SUBACK's reason codes.
    pub async fn try_subscribe(&mut self, topic: &str) -> Vec<SubscribeReasonCode> {
        self.client.subscribe(topic, QoS::AtLeastOnce).await.expect("subscribe");
        tokio::time::timeout(WAIT, self.subacks.recv())
            .await
            .expect("suback in time")
            .expect("suback")
    }

    /// The reason code of the next PUBACK this client receives.
    pub async fn next_puback(&mut self) -> PubAckReason {
        tokio::time::timeout(WAIT, self.pubacks.recv())
            .await
            .expect("a puback in time")
            .expect("connection alive")
    }

    /// The response topic this client uses.
    pub fn response_topic(&self) -> String {
        format!("clients/{}/test/response", self.id)
    }

    /// Publishes a raw request (QoS 1) with the given properties.
    pub async fn publish(&self, topic: &str, qos: QoS, payload: Bytes, props: PublishProperties) {
        self.client
            .publish_with_properties(topic, qos, false, payload, props)
            .await
            .expect("publish");
    }

    /// The next PUBLISH this client receives.
    pub async fn next(&mut self) -> Publish {
        tokio::time::timeout(WAIT, self.incoming.recv())
            .await
            .expect("a publish in time")
            .expect("connection alive")
    }

    /// Sends a request with standard properties (+ `extra` user properties) and returns the
    /// response. Subscribes to the response topic on first use.
    pub async fn request(&mut self, args: &[&[u8]], extra: &[(&str, &str)]) -> Publish {
        let topic = self.response_topic();
        self.ensure_subscribed(&topic).await;
        let corr = Bytes::from(uuid_like());
        let mut user: Vec<(String, String)> = [("__srcId", self.id.as_str()), ("__protVer", "1.0")]
            .into_iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        user.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let props = PublishProperties {
            response_topic: Some(topic),
            correlation_data: Some(corr.clone()),
            user_properties: user,
            content_type: Some("application/octet-stream".into()),
            message_expiry_interval: Some(10),
            ..Default::default()
        };
        self.publish(INVOKE, QoS::AtLeastOnce, stategate::resp3::encode_request(args), props)
            .await;
        loop {
            let p = self.next().await;
            let c = p.properties.as_ref().and_then(|p| p.correlation_data.clone());
            if c.as_ref() == Some(&corr) {
                return p;
            }
        }
    }

    async fn ensure_subscribed(&mut self, topic: &str) {
        if !self.subscribed.iter().any(|t| t == topic) {
            self.subscribe(topic).await;
            self.subscribed.push(topic.to_owned());
        }
    }
}

impl Drop for RawClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A unique 16-byte correlation id.
pub fn uuid_like() -> Vec<u8> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut v = n.to_be_bytes().to_vec();
    v.extend_from_slice(&t.to_be_bytes());
    v
}

/// A user property of a received PUBLISH.
pub fn prop<'a>(p: &'a Publish, name: &str) -> Option<&'a str> {
    p.properties
        .as_ref()?
        .user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A current HLC timestamp for `__ts`, as a client would send.
pub fn now_ts() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!("{ms:015}:00000:testclient")
}

/// A unique client id for a test.
/// The repository's root, as the running test process knows it. `cargo test` sets
/// `CARGO_MANIFEST_DIR` for the process it runs; the compile-time value can name another
/// checkout that shares the target directory (cargo reuses an artifact whose sources did not
/// change, whatever folder they were compiled from), so it is only the fallback.
pub fn repo_path(relative: &str) -> PathBuf {
    let root = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    PathBuf::from(root).join(relative)
}

pub fn unique_id(prefix: &str) -> String {
    format!("{prefix}-{}", hex::encode(&uuid_like()[..8]))
}

/// Awaits `f`, failing the test with `what` if it takes longer than [`WAIT`].
pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// Whether this run is CI's (`CI` set, as `.ci/run` is run): there a missing prerequisite is a
/// failure, never a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Resident set of a process, bytes (VmRSS in /proc/<pid>/status; 0 once it is gone).
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// A copy of a stopped service's data directory, to start another service on. Once
/// `Running::shutdown` returned the files hold every acknowledged write (`stop_keeping_data`
/// checks it), but a handle of the stopped engine may linger a moment (a broker disconnect
/// hook finishing its work) and with it the directory's lock: the copy has no lock.
pub fn copy_data_dir(dir: &std::path::Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(dir).expect("read the data dir") {
        let entry = entry.expect("a directory entry");
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("copy a data file");
    }
    copy
}
