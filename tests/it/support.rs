//! Shared test harness: a real Mosquitto per test on a free port, the service in process, and
//! a raw MQTT5 client that sees every property byte for byte.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use stategate::config::{BrokerChoice, Config};
use stategate::storage::Store;
use tokio::sync::mpsc;

pub const INVOKE: &str = stategate::mqtt::INVOKE_TOPIC;
/// Every wait in a test is bounded by this.
pub const WAIT: Duration = Duration::from_secs(10);

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// A Mosquitto broker on a free loopback port, stopped on drop.
pub struct Mosquitto {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    pub fn start() -> Mosquitto {
        let bin = which_mosquitto();
        for _attempt in 0..5 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("tempdir");
            let conf = dir.path().join("mosquitto.conf");
            std::fs::write(
                &conf,
                format!(
                    "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\nmax_inflight_messages 0\nmax_queued_messages 100000\n"
                ),
            )
            .expect("write mosquitto.conf");
            let mut child = Command::new(&bin)
                .arg("-c")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn mosquitto");
            // Readiness: the port accepts connections (bounded), or the process died (port taken).
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let deadline = std::time::Instant::now() + WAIT;
            while std::time::Instant::now() < deadline {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                    return Mosquitto { port, child, _dir: dir };
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("mosquitto did not start");
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// Which broker a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    Mosquitto,
    Embedded,
}

/// A running service and the broker it uses.
pub struct TestEnv {
    pub broker_port: u16,
    pub service: Option<stategate::Running>,
    _mosquitto: Option<Mosquitto>,
}

impl TestEnv {
    pub async fn start(broker: Broker) -> TestEnv {
        TestEnv::start_with(broker, |_| {}).await
    }

    /// Starts with a configuration tweak (limits, page sizes, ids).
    pub async fn start_with(broker: Broker, tweak: impl FnOnce(&mut Config)) -> TestEnv {
        TestEnv::start_on(broker, Store::memory(), tweak).await
    }

    /// Starts on a given store (e.g. one shared with another service, as replicas do).
    pub async fn start_on(broker: Broker, store: Store, tweak: impl FnOnce(&mut Config)) -> TestEnv {
        let mut config = Config::default();
        // The service runs on `Store::memory()`: say so, as the status route reports it.
        config.storage.kind = stategate::storage::StorageKind::Memory;
        config.http_listen = Some("127.0.0.1:0".parse().unwrap());
        config.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
        let mosquitto = match broker {
            Broker::Mosquitto => {
                let m = Mosquitto::start();
                config.broker = BrokerChoice::External {
                    host: "127.0.0.1".into(),
                    port: m.port,
                };
                Some(m)
            }
            Broker::Embedded => {
                config.broker = BrokerChoice::Embedded {
                    listen: "127.0.0.1:0".parse().unwrap(),
                    client_path: false,
                };
                None
            }
        };
        tweak(&mut config);
        let running = stategate::start(config, store).await.expect("service starts");
        let broker_port = running.mqtt_broker().1;
        TestEnv {
            broker_port,
            service: Some(running),
            _mosquitto: mosquitto,
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

    pub async fn stop(mut self) {
        if let Some(s) = self.service.take() {
            s.shutdown().await;
        }
    }
}

/// A raw MQTT5 client: publishes requests with any properties and receives every PUBLISH.
pub struct RawClient {
    pub client: AsyncClient,
    pub id: String,
    incoming: mpsc::UnboundedReceiver<Publish>,
    subacks: mpsc::UnboundedReceiver<()>,
    subscribed: Vec<String>,
    task: tokio::task::JoinHandle<()>,
}

impl RawClient {
    pub async fn connect(port: u16, id: &str) -> RawClient {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        o.set_max_packet_size(Some(16 * 1024 * 1024));
        o.set_keep_alive(Duration::from_secs(30));
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        o.set_network_options(net);
        let (client, mut eventloop) = AsyncClient::new(o, 1024);
        let (tx, incoming) = mpsc::unbounded_channel();
        let (sub_tx, subacks) = mpsc::unbounded_channel();
        let (conn_tx, mut conn_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(());
                    }
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = conn_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        tokio::time::timeout(WAIT, conn_rx.recv())
            .await
            .expect("connack in time")
            .expect("connected");
        RawClient {
            client,
            id: id.to_owned(),
            incoming,
            subacks,
            subscribed: Vec::new(),
            task,
        }
    }

    /// Subscribes and waits for the SUBACK.
    pub async fn subscribe(&mut self, topic: &str) {
        self.client.subscribe(topic, QoS::AtLeastOnce).await.expect("subscribe");
        tokio::time::timeout(WAIT, self.subacks.recv())
            .await
            .expect("suback in time")
            .expect("suback");
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

    /// The next PUBLISH, or `None` if nothing arrives within `d` (to assert absence only).
    pub async fn next_within(&mut self, d: Duration) -> Option<Publish> {
        tokio::time::timeout(d, self.incoming.recv()).await.ok().flatten()
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
