//! The MQTT door, speaking the state store protocol as the Azure IoT Operations SDK clients do:
//! QoS 1 requests to the invoke topic with a response topic under `clients/<client id>/`, 16
//! bytes of correlation data, `__srcId`, `__ts` (the client's own HLC), `__protVer=1.0`, `__ft`
//! for fencing, a message expiry of the timeout; KEYNOTIFY notifications for `watch`.
//!
//! One task polls the rumqttc event loop and only routes what arrives (responses by correlation
//! data, notifications to the watch); requests are published from the caller's task, never from
//! the poller (rumqtt issue 1025).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet, Publish, PublishProperties, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, ConnectionError, Event as MqttEvent, EventLoop, MqttOptions};
use tokio::sync::{mpsc, oneshot};

use super::args::ConnectArgs;
use super::{
    CliError, Condition, DelOutcome, Door, Event, Exit, Found, MAX_MESSAGE_BYTES, ScanPage, SetOutcome, WATCH_BUFFER,
    Watch, Write, ttl_ms,
};
use crate::hlc::{HlcClock, SystemClock};
use crate::resp3::envelope::{
    CONTENT_TYPE, INVOKE_TOPIC, NOTIFY_TOPIC_PREFIX, PROP_FENCING_TOKEN, PROP_PROTOCOL_VERSION, PROP_SOURCE_ID,
    PROP_STATUS, PROP_STATUS_MESSAGE, PROP_TIMESTAMP, PROTOCOL_VERSION,
};
use crate::resp3::{self, Frame};
use stategate_net::url::parse_broker_url;

/// Notifications that may wait for the printer; past this the watch ends with an overflow.
const NOTIFY_BUFFER: usize = 65_536;

/// Per-process randomness for the client id and correlation data, without a dependency: the
/// standard library seeds `RandomState` from the OS.
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

struct Shared {
    /// Requests waiting for their response, by correlation data.
    pending: Mutex<HashMap<Bytes, oneshot::Sender<Publish>>>,
    /// Where notifications go while a watch runs.
    notify: Mutex<Option<mpsc::Sender<Publish>>>,
    /// A notification was dropped because the watch's buffer was full.
    overflowed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct MqttDoor {
    client: AsyncClient,
    client_id: String,
    response_topic: String,
    shared: Arc<Shared>,
    hlc: HlcClock,
    timeout: Duration,
    correlation_seed: u64,
    counter: AtomicU64,
    subacks: tokio::sync::Mutex<mpsc::UnboundedReceiver<Result<(), CliError>>>,
    poller: Mutex<Option<tokio::task::JoinHandle<()>>>,
    broker: String,
}

impl MqttDoor {
    /// Connects, then subscribes to the response topic; bounded by the timeout.
    pub async fn connect(c: &ConnectArgs) -> Result<MqttDoor, CliError> {
        let url = parse_broker_url(&c.mqtt_url).map_err(|e| CliError::usage(e.to_string()))?;
        let (host, port) = (url.host.clone(), url.port);
        let seed = random_u64();
        let client_id = c
            .client_id
            .clone()
            .unwrap_or_else(|| format!("stategate-cli-{:016x}", seed));
        // The id is a topic level of the response and notification topics.
        if client_id.is_empty() || client_id.contains(['/', '+', '#']) {
            return Err(CliError::usage(format!(
                "--client-id must be non-empty, without '/', '+' or '#' (got {client_id:?})"
            )));
        }
        let mut o = MqttOptions::new(client_id.clone(), host.clone(), port);
        if let Some(cred) = &url.credentials {
            o.set_credentials(cred.username.clone(), cred.password.clone());
        }
        if url.tls {
            #[cfg(feature = "mqtt-client-tls")]
            {
                let tls = crate::tls::MqttClientTls {
                    ca_file: c.ca_file.clone(),
                };
                o.set_transport(
                    tls.transport()
                        .map_err(|e| CliError::usage(format!("--ca-file: {e}")))?,
                );
            }
        }
        o.set_keep_alive(Duration::from_secs(30));
        // A clean session: KEYNOTIFY registrations end with this connection.
        o.set_clean_start(true);
        o.set_max_packet_size(Some(MAX_MESSAGE_BYTES as u32));
        // rumqttc allocates a slot per request it may have in flight when it connects (its
        // default of 65,535 held 14 MiB); the service uses the same bound.
        o.set_outgoing_inflight_upper_limit(1024);
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        net.set_connection_timeout(c.timeout.as_secs().max(1));
        o.set_network_options(net);
        let (client, events) = AsyncClient::new(o, 64);
        let response_topic = format!("clients/{client_id}/services/{INVOKE_TOPIC}/response");
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            notify: Mutex::new(None),
            overflowed: AtomicBool::new(false),
        });
        let broker = format!("{host}:{port}");
        let (connected_tx, connected) = oneshot::channel();
        let (suback_tx, subacks) = mpsc::unbounded_channel();
        let poller = tokio::spawn(poll(events, shared.clone(), connected_tx, suback_tx, broker.clone()));
        let node = client_id.replace(':', "_");
        let door = MqttDoor {
            client,
            client_id,
            response_topic,
            shared,
            hlc: HlcClock::new(node, Arc::new(SystemClock)),
            timeout: c.timeout,
            correlation_seed: seed,
            counter: AtomicU64::new(0),
            subacks: tokio::sync::Mutex::new(subacks),
            poller: Mutex::new(Some(poller)),
            broker,
        };
        match tokio::time::timeout(c.timeout, connected).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(_)) => return Err(door.lost()),
            Err(_) => return Err(door.timed_out("connecting")),
        }
        door.subscribe(&door.response_topic.clone()).await?;
        Ok(door)
    }

    fn lost(&self) -> CliError {
        CliError::unavailable(format!("the connection to the MQTT broker at {} was lost", self.broker))
    }

    fn timed_out(&self, what: &str) -> CliError {
        CliError::unavailable(format!(
            "timed out after {} {what} (is stategate serving the state store on the broker at {}?)",
            humantime::format_duration(self.timeout),
            self.broker
        ))
    }

    async fn subscribe(&self, topic: &str) -> Result<(), CliError> {
        let mut subacks = self.subacks.lock().await;
        self.client
            .subscribe(topic, QoS::AtLeastOnce)
            .await
            .map_err(|_| self.lost())?;
        match tokio::time::timeout(self.timeout, subacks.recv()).await {
            Ok(Some(r)) => r,
            Ok(None) => Err(self.lost()),
            Err(_) => Err(self.timed_out("subscribing")),
        }
    }

    fn correlation(&self) -> Bytes {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut c = Vec::with_capacity(16);
        c.extend_from_slice(&self.correlation_seed.to_be_bytes());
        c.extend_from_slice(&n.to_be_bytes());
        Bytes::from(c)
    }

    /// Sends one request and returns the reply frame and its `__ts`.
    async fn request(&self, args: &[&[u8]], fencing: Option<&str>) -> Result<(Frame, Option<String>), CliError> {
        let correlation = self.correlation();
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(correlation.clone(), tx);
        let mut user = vec![
            (PROP_SOURCE_ID.to_owned(), self.client_id.clone()),
            (PROP_TIMESTAMP.to_owned(), self.hlc.now().to_string()),
            (PROP_PROTOCOL_VERSION.to_owned(), PROTOCOL_VERSION.to_owned()),
        ];
        if let Some(ft) = fencing {
            user.push((PROP_FENCING_TOKEN.to_owned(), ft.to_owned()));
        }
        let props = PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(correlation.clone()),
            user_properties: user,
            content_type: Some(CONTENT_TYPE.to_owned()),
            // Whole seconds, rounded up: the service need not answer once we stopped waiting.
            message_expiry_interval: Some(self.timeout.as_secs_f64().ceil().clamp(1.0, f64::from(u32::MAX)) as u32),
            ..PublishProperties::default()
        };
        let payload = resp3::encode_request(args);
        let exchange = async {
            self.client
                .publish_with_properties(INVOKE_TOPIC, QoS::AtLeastOnce, false, payload, props)
                .await
                .map_err(|_| self.lost())?;
            rx.await.map_err(|_| self.lost())
        };
        let response = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(self.timed_out("waiting for the state store")),
        };
        lock(&self.shared.pending).remove(&correlation);
        let response = response?;
        let version = property(&response, PROP_TIMESTAMP).map(str::to_owned);
        if let Some(v) = version.as_deref().and_then(|v| v.parse().ok()) {
            // The HLC receive rule: our next timestamp is later than anything we have seen.
            self.hlc.observe(&v);
        }
        check_status(&response)?;
        let frame = resp3::decode(&response.payload)
            .map_err(|e| CliError::unavailable(format!("the state store sent a malformed reply: {e}")))?;
        if let Frame::Error(text) = &frame {
            return Err(refusal(text));
        }
        Ok((frame, version))
    }

    fn notify_filter(&self) -> String {
        format!(
            "{NOTIFY_TOPIC_PREFIX}/{}/command/notify/+",
            hex::encode_upper(self.client_id.as_bytes())
        )
    }
}

fn property<'a>(p: &'a Publish, name: &str) -> Option<&'a str> {
    p.properties
        .as_ref()?
        .user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `__stat` other than 200: the request itself was refused or the service failed.
fn check_status(p: &Publish) -> Result<(), CliError> {
    let status = property(p, PROP_STATUS).unwrap_or("");
    if status == "200" {
        return Ok(());
    }
    let msg = property(p, PROP_STATUS_MESSAGE).unwrap_or("no message");
    let exit = match status {
        "400" => Exit::Usage,
        "401" | "403" => Exit::NotAuthorized,
        _ => Exit::Unavailable,
    };
    Err(CliError::new(
        exit,
        format!("the state store answered status {status:?}: {msg}"),
    ))
}

/// A `-ERR` reply: the exact texts of the protocol, mapped to exit codes.
fn refusal(text: &str) -> CliError {
    let msg = text.strip_prefix("ERR ").unwrap_or(text);
    let exit = match msg {
        "a fencing token is required for this request"
        | "the request fencing token is a lower version than the fencing token protecting the resource"
        | "the stored version does not match the requested version" => Exit::Conflict,
        "not authorized" => Exit::NotAuthorized,
        "the quota has been exceeded" => Exit::Unavailable,
        // syntax, arity, empty key, timestamps, unknown command: what was sent is wrong.
        _ => Exit::Usage,
    };
    CliError::new(exit, format!("the state store refused: {msg}"))
}

fn unexpected(what: &str, frame: &Frame) -> CliError {
    CliError::unavailable(format!("unexpected reply to {what}: {frame:?}"))
}

fn connection_error(e: &ConnectionError, broker: &str) -> CliError {
    match e {
        ConnectionError::ConnectionRefused(
            ConnectReturnCode::NotAuthorized | ConnectReturnCode::BadUserNamePassword,
        ) => CliError::new(
            Exit::NotAuthorized,
            format!("the MQTT broker at {broker} refused the connection: not authorized"),
        ),
        ConnectionError::ConnectionRefused(code) => {
            CliError::unavailable(format!("the MQTT broker at {broker} refused the connection: {code:?}"))
        }
        other => CliError::unavailable(format!("cannot reach the MQTT broker at {broker}: {other}")),
    }
}

/// Drives the connection and routes what arrives; ends at the first connection error (the
/// client does not reconnect: a command is short, and a watch must not silently miss changes).
async fn poll(
    mut events: EventLoop,
    shared: Arc<Shared>,
    connected: oneshot::Sender<Result<(), CliError>>,
    subacks: mpsc::UnboundedSender<Result<(), CliError>>,
    broker: String,
) {
    let mut connected = Some(connected);
    loop {
        match events.poll().await {
            Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                if let Some(tx) = connected.take() {
                    let _ = tx.send(Ok(()));
                }
            }
            Ok(MqttEvent::Incoming(Packet::SubAck(ack))) => {
                let ok = ack
                    .return_codes
                    .iter()
                    .all(|c| matches!(c, SubscribeReasonCode::Success(_)));
                let _ = subacks.send(if ok {
                    Ok(())
                } else {
                    Err(CliError::unavailable(format!(
                        "the MQTT broker at {broker} refused a subscription: {:?}",
                        ack.return_codes
                    )))
                });
            }
            Ok(MqttEvent::Incoming(Packet::Publish(p))) => route(&shared, p),
            // Written and flushed: nothing more to do (waiting for the broker to close the
            // socket could take a while).
            Ok(MqttEvent::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
            Ok(MqttEvent::Incoming(Packet::Disconnect(_))) => break,
            Ok(_) => {}
            Err(e) => {
                if let Some(tx) = connected.take() {
                    let _ = tx.send(Err(connection_error(&e, &broker)));
                }
                break;
            }
        }
    }
    // Waiters see their channels close: the connection is gone.
    lock(&shared.pending).clear();
    lock(&shared.notify).take();
}

fn route(shared: &Shared, p: Publish) {
    let correlation = p.properties.as_ref().and_then(|pr| pr.correlation_data.clone());
    if let Some(c) = correlation
        && let Some(tx) = lock(&shared.pending).remove(&c)
    {
        let _ = tx.send(p);
        return;
    }
    if p.topic.starts_with(NOTIFY_TOPIC_PREFIX.as_bytes()) {
        let mut notify = lock(&shared.notify);
        if let Some(tx) = notify.as_ref()
            && tx.try_send(p).is_err()
        {
            // Never block the poller on a slow printer: end the watch as the other doors do.
            shared.overflowed.store(true, Ordering::SeqCst);
            notify.take();
        }
    }
}

/// A notification as an event: the key is the last topic level (upper-case hex).
fn notification(p: &Publish) -> Option<Event> {
    let topic = std::str::from_utf8(&p.topic).ok()?;
    let key = Bytes::from(hex::decode(topic.rsplit('/').next()?).ok()?);
    let version = property(p, PROP_TIMESTAMP)?.to_owned();
    let Frame::Array(items) = resp3::decode(&p.payload).ok()? else {
        return None;
    };
    let bulk = |i: usize| match items.get(i) {
        Some(Frame::Bulk(b)) => Some(b.clone()),
        _ => None,
    };
    if bulk(0)?.as_ref() != b"NOTIFY" {
        return None;
    }
    match (bulk(1)?.as_ref(), items.len()) {
        (b"SET", 4) if bulk(2)?.as_ref() == b"VALUE" => Some(Event::Set {
            key,
            value: bulk(3)?,
            version,
        }),
        (b"DELETE", 2) => Some(Event::Delete { key, version }),
        _ => None,
    }
}

#[async_trait::async_trait]
impl Door for MqttDoor {
    async fn get(&self, key: &Bytes) -> Result<Option<Found>, CliError> {
        match self.request(&[b"GET", key], None).await? {
            (Frame::Bulk(value), version) => Ok(Some(Found { value, version })),
            (Frame::Null, _) => Ok(None),
            (other, _) => Err(unexpected("GET", &other)),
        }
    }

    async fn mget(&self, keys: &[Bytes]) -> Result<Vec<Option<Found>>, CliError> {
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.iter().map(|k| &k[..]));
        let (frame, _) = self.request(&args, None).await?;
        let Frame::Array(items) = frame else {
            return Err(unexpected("MGET", &frame));
        };
        if items.len() != keys.len() {
            return Err(unexpected("MGET", &Frame::Array(items)));
        }
        items
            .into_iter()
            .map(|item| match item {
                Frame::Null => Ok(None),
                Frame::Array(pair) => match <[Frame; 2]>::try_from(pair) {
                    Ok([Frame::Bulk(value), Frame::Bulk(version)]) => Ok(Some(Found {
                        value,
                        version: Some(String::from_utf8_lossy(&version).into_owned()),
                    })),
                    Ok(other) => Err(unexpected("MGET", &Frame::Array(other.into()))),
                    Err(other) => Err(unexpected("MGET", &Frame::Array(other))),
                },
                other => Err(unexpected("MGET", &other)),
            })
            .collect()
    }

    async fn set(&self, w: &Write) -> Result<SetOutcome, CliError> {
        let mut args: Vec<&[u8]> = vec![b"SET", &w.key, &w.value];
        match &w.condition {
            Condition::Always => {}
            Condition::Nx => args.push(b"NX"),
            Condition::Nex => args.push(b"NEX"),
            Condition::IfVersion(_) => return Err(super::no_version_condition_over_mqtt()),
        }
        let px = w.ttl.map(|t| ttl_ms(t).to_string());
        if let Some(px) = &px {
            args.push(b"PX");
            args.push(px.as_bytes());
            if w.sliding {
                args.push(b"SLIDING");
            }
        }
        match self.request(&args, w.fencing.as_deref()).await? {
            (Frame::Simple(s), version) if s == "OK" => Ok(SetOutcome::Applied { version }),
            (Frame::Integer(-1), _) => Ok(SetOutcome::NotApplied),
            (other, _) => Err(unexpected("SET", &other)),
        }
    }

    async fn del(&self, key: &Bytes, if_version: Option<&str>, fencing: Option<&str>) -> Result<DelOutcome, CliError> {
        if if_version.is_some() {
            return Err(super::no_version_condition_over_mqtt());
        }
        match self.request(&[b"DEL", key], fencing).await? {
            (Frame::Integer(1), _) => Ok(DelOutcome::Deleted),
            (Frame::Integer(0), _) => Ok(DelOutcome::Absent),
            (other, _) => Err(unexpected("DEL", &other)),
        }
    }

    async fn vdel(&self, key: &Bytes, value: &Bytes, fencing: Option<&str>) -> Result<DelOutcome, CliError> {
        match self.request(&[b"VDEL", key, value], fencing).await? {
            (Frame::Integer(1), _) => Ok(DelOutcome::Deleted),
            (Frame::Integer(0), _) => Ok(DelOutcome::Absent),
            (Frame::Integer(-1), _) => Ok(DelOutcome::Mismatch),
            (other, _) => Err(unexpected("VDEL", &other)),
        }
    }

    async fn scan_page(&self, pattern: &str, token: Option<Bytes>) -> Result<ScanPage, CliError> {
        let mut args: Vec<&[u8]> = vec![b"SCAN", pattern.as_bytes()];
        if let Some(t) = &token {
            args.push(t);
        }
        let (frame, _) = self.request(&args, None).await?;
        let Frame::Array(parts) = &frame else {
            return Err(unexpected("SCAN", &frame));
        };
        let keys = match parts.first() {
            Some(Frame::Array(keys)) => keys
                .iter()
                .map(|k| match k {
                    Frame::Bulk(b) => Ok(b.clone()),
                    _ => Err(unexpected("SCAN", &frame)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(unexpected("SCAN", &frame)),
        };
        let token = match parts.get(1) {
            None => None,
            Some(Frame::Bulk(t)) => Some(t.clone()),
            Some(_) => return Err(unexpected("SCAN", &frame)),
        };
        Ok(ScanPage { keys, token })
    }

    async fn watch(&self, keys: &[Bytes], patterns: &[String], since: Option<&str>) -> Result<Watch, CliError> {
        if keys.is_empty() || !patterns.is_empty() {
            return Err(CliError::usage("over MQTT only named keys can be watched"));
        }
        if since.is_some() {
            return Err(CliError::usage(
                "over MQTT a watch cannot resume: KEYNOTIFY keeps no history",
            ));
        }
        let (raw_tx, mut raw_rx) = mpsc::channel::<Publish>(NOTIFY_BUFFER);
        self.shared.overflowed.store(false, Ordering::SeqCst);
        *lock(&self.shared.notify) = Some(raw_tx);
        // Subscribed before registering, so no notification can come before we listen.
        self.subscribe(&self.notify_filter()).await?;
        for key in keys {
            match self.request(&[b"KEYNOTIFY", key], None).await? {
                (Frame::Simple(s), _) if s == "OK" => {}
                (other, _) => return Err(unexpected("KEYNOTIFY", &other)),
            }
        }
        let (tx, events) = mpsc::channel(WATCH_BUFFER);
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            while let Some(p) = raw_rx.recv().await {
                match notification(&p) {
                    Some(ev) => {
                        if tx.send(Ok(ev)).await.is_err() {
                            return;
                        }
                    }
                    None => eprintln!("stategate: ignored a malformed notification on {:?}", p.topic),
                }
            }
            let end = if shared.overflowed.load(Ordering::SeqCst) {
                Ok(Event::Overflow)
            } else {
                Err(CliError::unavailable("the connection to the MQTT broker was lost"))
            };
            let _ = tx.send(end).await;
        });
        Ok(Watch {
            events,
            keys: keys.to_vec(),
            task: Some(task),
        })
    }

    async fn unwatch(&self, watch: Watch) {
        lock(&self.shared.notify).take();
        if let Some(t) = watch.task {
            t.abort();
        }
        // The embedded broker tells the service when we leave; an external one does not, so
        // unregister explicitly (best effort, each bounded by the timeout).
        for key in &watch.keys {
            let _ = self.request(&[b"KEYNOTIFY", key, b"STOP"], None).await;
        }
    }

    async fn close(&self) {
        let _ = self.client.disconnect().await;
        // Let the poller send the DISCONNECT, but never hang on the way out.
        let Some(poller) = lock(&self.poller).take() else {
            return;
        };
        let abort = poller.abort_handle();
        if tokio::time::timeout(Duration::from_secs(1), poller).await.is_err() {
            abort.abort();
        }
    }
}

#[cfg(test)]
mod tests;
