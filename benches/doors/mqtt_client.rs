//! MQTT request/response clients: the echo responder (the physical limit of MQTT
//! request/response on a broker), the load generator's requester, and the `state/#` mirror
//! subscriber.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, MqttOptions};
use tokio::sync::oneshot;

pub(crate) const ECHO_TOPIC: &str = "bench/echo/request";

pub(crate) fn mqtt_opts(id: &str, host: &str, port: u16) -> MqttOptions {
    let mut m = MqttOptions::new(id, host, port);
    m.set_max_packet_size(Some(16 * 1024 * 1024));
    m.set_keep_alive(Duration::from_secs(30));
    m.set_request_channel_capacity(4096);
    m.set_outgoing_inflight_upper_limit(1024);
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    m.set_network_options(net);
    m
}

/// The physical limit: republishes each request's payload to its Response Topic. It runs on the
/// `serve` runtime: its CPU is the serving side's, with the broker's.
pub(crate) async fn echo_responder(host: &str, port: u16, n: usize) {
    let host = host.to_owned();
    super::serving(async move { echo_here(&host, port, n).await }).await
}

async fn echo_here(host: &str, port: u16, n: usize) {
    let (client, mut el) = AsyncClient::new(mqtt_opts(&format!("bench-echo-{n}"), host, port), 4096);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<rumqttc::v5::mqttbytes::v5::Publish>();
    let (ready_tx, ready_rx) = oneshot::channel();
    let c2 = client.clone();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            let props = p.properties.unwrap_or_default();
            let Some(rt) = props.response_topic else { continue };
            let out = PublishProperties {
                correlation_data: props.correlation_data,
                ..Default::default()
            };
            let _ = c2
                .publish_with_properties(rt, QoS::AtLeastOnce, false, p.payload, out)
                .await;
        }
    });
    let mut ready_tx = Some(ready_tx);
    let sub = client.clone();
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let sub = sub.clone();
                    tokio::spawn(async move { sub.subscribe(ECHO_TOPIC, QoS::AtLeastOnce).await });
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(r) = ready_tx.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send(p);
                }
                Ok(_) => {}
                Err(e) if broker_gone(&e) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(10), ready_rx).await;
}

/// The broker refuses connections: its stategate (or Mosquitto) has stopped. A client then
/// stops too, or its retries would run on into the next rows and count as their CPU.
fn broker_gone(e: &ConnectionError) -> bool {
    matches!(e, ConnectionError::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

pub(crate) type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

/// A request/response client: one MQTT connection, any number of concurrent requests.
#[derive(Clone)]
pub(crate) struct Requester {
    client: AsyncClient,
    waiters: Waiters,
    response_topic: Arc<str>,
}

impl Requester {
    pub(crate) async fn connect(id: &str, host: &str, port: u16) -> Requester {
        let (client, mut el) = AsyncClient::new(mqtt_opts(id, host, port), 4096);
        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        let response_topic: Arc<str> = Arc::from(format!("clients/{id}/bench/response"));
        let (ready_tx, ready_rx) = oneshot::channel();
        let (w, sub, topic) = (waiters.clone(), client.clone(), response_topic.to_string());
        tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let (sub, topic) = (sub.clone(), topic.clone());
                        tokio::spawn(async move { sub.subscribe(topic, QoS::AtLeastOnce).await });
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(r) = ready_tx.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let corr = p.properties.and_then(|p| p.correlation_data);
                        if let Some(c) = corr.filter(|c| c.len() == 8) {
                            let id = u64::from_be_bytes(c[..8].try_into().unwrap_or([0; 8]));
                            if let Some(tx) = w.lock().ok().and_then(|mut m| m.remove(&id)) {
                                let _ = tx.send(());
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) if broker_gone(&e) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(10), ready_rx).await;
        Requester {
            client,
            waiters,
            response_topic,
        }
    }

    pub(crate) async fn request(&self, topic: &str, id: u64, payload: Bytes, user: Vec<(String, String)>) {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.waiters.lock() {
            m.insert(id, tx);
        }
        let props = PublishProperties {
            response_topic: Some(self.response_topic.to_string()),
            correlation_data: Some(Bytes::copy_from_slice(&id.to_be_bytes())),
            user_properties: user,
            content_type: Some("application/octet-stream".into()),
            message_expiry_interval: Some(10),
            ..Default::default()
        };
        let _ = self
            .client
            .publish_with_properties(topic.to_owned(), QoS::AtLeastOnce, false, payload, props)
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
    }
}

pub(crate) fn bench_key(i: u64) -> Vec<u8> {
    format!("key-{:012}", i % 10_000).into_bytes()
}

pub(crate) fn now_ts() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{ms:015}:00000:bench")
}

/// A `state/#` subscriber that takes (and drops) every message of the state topics mirror.
pub(crate) async fn mirror_subscriber(host: &str, port: u16, n: usize) -> Arc<std::sync::atomic::AtomicU64> {
    let (client, mut el) = AsyncClient::new(mqtt_opts(&format!("bench-mirror-{n}"), host, port), 4096);
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = received.clone();
    let (ready_tx, ready_rx) = oneshot::channel();
    let mut ready_tx = Some(ready_tx);
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let c = client.clone();
                    tokio::spawn(async move { c.subscribe("state/#", QoS::AtLeastOnce).await });
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(r) = ready_tx.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(_))) => {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(e) if broker_gone(&e) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(10), ready_rx).await;
    received
}
