//! The client path: the state store's own MQTT connection to a broker (an external one, or the
//! embedded one when in-broker serving is turned off).
//!
//! Tasks, so that no task that drives `EventLoop::poll` ever awaits a publish:
//! - the poller polls, admits each request ([`Door::admit`]) and spawns one task per admitted
//!   request (at most `max_inflight` exist), answers a refused one `__stat=503` with a
//!   non-blocking publish (no task), and subscribes again on every ConnAck;
//! - each request task executes its request and publishes the answer;
//! - the notifier publishes KEYNOTIFY notifications, in change order;
//! - the janitor drops idle observers.
//!
//! Requests are acknowledged (PUBACK) by the MQTT client on receipt, in receive order, batched
//! with the reads: a request's real acknowledgement is its answer. rumqttc writes and flushes
//! every queued request separately, so manual acks would cost one more write per request (they
//! measured 0.65x of the echo limit at 64 in flight; see docs/performance.md). A request lost in a crash
//! before it ran is simply unanswered: the client times out; nothing it was told is lost.
//! Behind one client connection the service cannot tell publishers apart except by what they
//! claim (`__srcId`): the per-caller limit is keyed by that (or the response topic), and a
//! caller past it is answered `__stat=503` rather than queued in front of everyone else.

mod carried;

use std::sync::Arc;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, EventLoop, MqttOptions};
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

use self::carried::Carried;
use super::INVOKE_TOPIC;
use super::door::{self, Door, DoorLimits, Sink};
use super::request::{CONTENT_TYPE, Caller, Outgoing, Request};
use crate::access::Access;
use crate::engine::Engine;
use crate::metrics::Link;

/// How the service connects and behaves on MQTT.
#[derive(Debug, Clone)]
pub struct MqttSettings {
    pub host: String,
    pub port: u16,
    /// The service's MQTT client id (stable, so the broker keeps its session).
    pub client_id: String,
    /// Subscribe through `$share/<group>/` so several replicas split the requests.
    pub share_group: Option<String>,
    /// Largest MQTT packet the service accepts or sends.
    pub max_packet_bytes: u32,
    /// Most unacknowledged requests the broker may send at once (MQTT5 Receive Maximum).
    pub receive_maximum: u16,
    /// Most unacknowledged answers and notifications the service sends at once (the broker's
    /// Receive Maximum applies when it is lower). rumqttc allocates a slot for each when it
    /// connects, about 216 bytes a slot, whether the broker allows that many or not: its own
    /// default, 65,535, held 14 MiB.
    pub max_outgoing_inflight: u16,
    /// Admission limits and the redelivery cache, shared with in-broker serving.
    pub door: DoorLimits,
    /// Session expiry asked of the broker, so requests queue while the service reconnects.
    pub session_expiry: Duration,
    pub keep_alive: Duration,
    /// Who may do what (per-key rules, rate limits); `__srcId` is trusted only when it says so.
    pub access: Access,
    /// `mqtts://`: connect over TLS, verifying the broker.
    pub tls: Option<MqttClientTls>,
    /// Username and password for CONNECT.
    pub credentials: Option<stategate_net::url::MqttCredentials>,
    /// State as MQTT topics (`--state-topics`), published through this connection.
    pub state_topics: Option<crate::mirror::StateTopics>,
}

pub use crate::tls::MqttClientTls;

impl Default for MqttSettings {
    fn default() -> MqttSettings {
        MqttSettings {
            host: "127.0.0.1".into(),
            port: 1883,
            client_id: "stategate".into(),
            share_group: None,
            max_packet_bytes: 8 * 1024 * 1024,
            receive_maximum: 1024,
            max_outgoing_inflight: 1024,
            door: DoorLimits::default(),
            session_expiry: Duration::from_secs(3600),
            keep_alive: Duration::from_secs(30),
            tls: None,
            credentials: None,
            access: Access::open(),
            state_topics: None,
        }
    }
}

impl MqttSettings {
    fn subscription(&self) -> String {
        match &self.share_group {
            Some(g) => format!("$share/{g}/{INVOKE_TOPIC}"),
            None => INVOKE_TOPIC.to_owned(),
        }
    }

    /// The connection options; an error when the TLS files cannot be used.
    pub fn options(&self) -> Result<MqttOptions, crate::tls::TlsError> {
        let mut o = MqttOptions::new(self.client_id.clone(), self.host.clone(), self.port);
        if let Some(c) = &self.credentials {
            o.set_credentials(c.username.clone(), c.password.clone());
        }
        #[cfg(feature = "mqtt-client-tls")]
        if let Some(tls) = &self.tls {
            o.set_transport(tls.transport()?);
        }
        o.set_keep_alive(self.keep_alive);
        // A persistent session keeps requests queued at the broker while the service reconnects;
        // zero asks for a clean session.
        let expiry = self.session_expiry.as_secs().min(u64::from(u32::MAX)) as u32;
        o.set_clean_start(expiry == 0);
        o.set_session_expiry_interval((expiry > 0).then_some(expiry));
        o.set_manual_acks(false);
        o.set_max_packet_size(Some(self.max_packet_bytes));
        o.set_receive_maximum(Some(self.receive_maximum.max(1)));
        o.set_outgoing_inflight_upper_limit(self.max_outgoing_inflight.max(1));
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        net.set_connection_timeout(5);
        o.set_network_options(net);
        Ok(o)
    }
}

/// Outgoing packets queued for the connection (answers, notifications, subscriptions): a small
/// queue keeps their bytes bounded (the request tasks, holding their admission, wait instead).
const REQUEST_CHANNEL: usize = 256;

/// A running MQTT door.
#[derive(Debug)]
pub struct MqttService {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: watch::Sender<bool>,
    client: AsyncClient,
    door: Arc<Door>,
}

impl MqttService {
    /// The serving path this connection feeds.
    pub fn door(&self) -> &Arc<Door> {
        &self.door
    }

    /// Connects and subscribes; returns once the first subscription is acknowledged (or after
    /// `ready_timeout`, with a warning, so a broker that is down does not block startup forever).
    /// Fails only when the TLS files of an `mqtts://` connection cannot be used.
    pub async fn start(
        engine: Engine,
        settings: MqttSettings,
        ready_timeout: Duration,
    ) -> Result<MqttService, crate::tls::TlsError> {
        MqttService::start_observed(engine, settings, ready_timeout, crate::metrics::Metrics::disabled()).await
    }

    /// [`MqttService::start`], recording requests and the link state in `metrics`.
    pub async fn start_observed(
        engine: Engine,
        settings: MqttSettings,
        ready_timeout: Duration,
        metrics: crate::metrics::Metrics,
    ) -> Result<MqttService, crate::tls::TlsError> {
        let (client, eventloop) = AsyncClient::new(settings.options()?, REQUEST_CHANNEL);
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = oneshot::channel();
        let settings = Arc::new(settings);
        let door = Arc::new(
            Door::new(engine.clone(), settings.client_id.clone(), settings.door.clone())
                .with_access(settings.access.clone())
                .with_metrics(metrics.clone())
                .with_state_topics(settings.state_topics.clone()),
        );
        let ctx = Arc::new(Ctx {
            door: door.clone(),
            client: client.clone(),
            settings: settings.clone(),
        });
        let mut tasks = vec![tokio::spawn(poller(eventloop, ctx, ready_tx, stop_rx.clone()))];
        // An external broker may have kept retained messages from before: the mirror clears
        // those of keys that are gone (an embedded one starts empty with this process).
        let mirror = door.mirror().map(|m| match m.topics().external_broker {
            true => m.clearing_stale(settings.clone()),
            false => m,
        });
        match door.keynotify_feed() {
            Some(feed) => tasks.push(tokio::spawn(door::notifier(
                feed,
                Arc::new(ClientSink(client.clone())),
                &door,
                mirror,
                stop_rx.clone(),
            ))),
            None => warn!("mqtt: another door already takes KEYNOTIFY notifications; this one sends none"),
        }
        if engine.limits().observers.idle.is_some() {
            tasks.push(tokio::spawn(janitor(engine, stop_rx)));
        }
        match tokio::time::timeout(ready_timeout, ready_rx).await {
            Ok(Ok(())) => info!(topic = %settings.subscription(), "mqtt: subscribed"),
            _ => warn!(
                host = %settings.host,
                port = settings.port,
                "mqtt: not subscribed yet; requests are served once the broker answers"
            ),
        }
        Ok(MqttService {
            tasks,
            stop,
            client,
            door,
        })
    }

    /// Disconnects and stops every task.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.disconnect()).await;
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// What every request task shares.
struct Ctx {
    door: Arc<Door>,
    client: AsyncClient,
    settings: Arc<MqttSettings>,
}

/// Publishes through the service's own connection.
struct ClientSink(AsyncClient);

#[async_trait::async_trait]
impl Sink for ClientSink {
    async fn publish(&self, out: &Outgoing) {
        publish(&self.0, out).await
    }

    async fn publish_retained(&self, msg: &crate::mirror::Retained) {
        let props = PublishProperties {
            user_properties: msg.user_properties.clone(),
            ..Default::default()
        };
        if let Err(e) = self
            .0
            .publish_with_properties(msg.topic.clone(), QoS::AtLeastOnce, true, msg.payload.clone(), props)
            .await
        {
            warn!(cause = %e, topic = %msg.topic, "mqtt: publishing a state topic failed");
        }
    }
}

fn to_request(p: Publish) -> Request {
    let props = p.properties.unwrap_or_default();
    Request {
        topic: String::from_utf8_lossy(&p.topic).into_owned(),
        qos: p.qos as u8,
        payload: p.payload,
        response_topic: props.response_topic,
        correlation: props.correlation_data,
        user_properties: props.user_properties,
        message_expiry: props.message_expiry_interval,
    }
}

fn properties(out: &Outgoing) -> PublishProperties {
    PublishProperties {
        correlation_data: out.correlation.clone(),
        user_properties: out.user_properties.clone(),
        content_type: Some(CONTENT_TYPE.to_owned()),
        message_expiry_interval: out.message_expiry,
        ..Default::default()
    }
}

fn try_publish(client: &AsyncClient, out: &Outgoing) -> Result<(), Box<rumqttc::v5::ClientError>> {
    client
        .try_publish_with_properties(
            out.topic.clone(),
            QoS::AtLeastOnce,
            false,
            out.payload.clone(),
            properties(out),
        )
        .map_err(Box::new)
}

async fn publish(client: &AsyncClient, out: &Outgoing) {
    let props = properties(out);
    if let Err(e) = client
        .publish_with_properties(out.topic.clone(), QoS::AtLeastOnce, false, out.payload.clone(), props)
        .await
    {
        warn!(cause = %e, topic = %out.topic, "mqtt: publish failed");
    }
}

/// [`publish`] of an answer: moved into the packet, not copied, unless the redelivery cache
/// keeps it too (GET and SCAN answers are not kept).
async fn publish_answer(client: &AsyncClient, out: Arc<Outgoing>) {
    let out = match Arc::try_unwrap(out) {
        Ok(out) => out,
        Err(shared) => return publish(client, &shared).await,
    };
    let props = PublishProperties {
        correlation_data: out.correlation,
        user_properties: out.user_properties,
        content_type: Some(CONTENT_TYPE.to_owned()),
        message_expiry_interval: out.message_expiry,
        ..Default::default()
    };
    if let Err(e) = client
        .publish_with_properties(out.topic, QoS::AtLeastOnce, false, out.payload, props)
        .await
    {
        warn!(cause = %e, "mqtt: publish failed");
    }
}

/// Drives the connection. Never awaits the client's request channel.
async fn poller(mut eventloop: EventLoop, ctx: Arc<Ctx>, ready: oneshot::Sender<()>, mut stop: watch::Receiver<bool>) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(100);
    let mut carried = Carried::default();
    loop {
        let event = tokio::select! {
            _ = stop.changed() => return,
            e = eventloop.poll() => e,
        };
        match event {
            Ok(rumqttc::v5::Event::Incoming(packet)) => {
                backoff = Duration::from_millis(100);
                match packet {
                    Packet::Publish(p) => {
                        let req = to_request(p);
                        let caller = req
                            .claimed_source()
                            .or(req.response_topic.as_deref())
                            .map(str::to_owned);
                        match ctx.door.admit(&req, caller.as_deref()) {
                            Some(admitted) => {
                                let ctx = ctx.clone();
                                tokio::spawn(async move {
                                    let _admitted = admitted;
                                    if let Some(out) = ctx.door.serve(&req, &Caller::default()).await {
                                        publish_answer(&ctx.client, out).await;
                                    }
                                });
                            }
                            // Refused without a task: a non-blocking publish, dropped (and
                            // counted by the door) if the connection's queue is full.
                            None => {
                                if let Some(out) = ctx.door.busy(&req)
                                    && let Err(e) = try_publish(&ctx.client, &out)
                                {
                                    debug!(cause = %e, "mqtt: a busy answer was dropped");
                                }
                            }
                        }
                    }
                    Packet::ConnAck(ack) => {
                        ctx.door.metrics().mqtt_link(Link::Connected);
                        info!(
                            session_present = ack.session_present,
                            resending = carried.len(),
                            "mqtt: connected"
                        );
                        carried.restore(&mut eventloop, ack.session_present);
                        let client = ctx.client.clone();
                        let topic = ctx.settings.subscription();
                        tokio::spawn(async move {
                            if let Err(e) = client.subscribe(topic, QoS::AtLeastOnce).await {
                                warn!(cause = %e, "mqtt: subscribe failed");
                            }
                        });
                    }
                    Packet::SubAck(_) => {
                        ctx.door.metrics().mqtt_link(Link::Subscribed);
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Packet::Disconnect(d) => {
                        ctx.door.metrics().mqtt_link(Link::Down);
                        warn!(reason = ?d.reason_code, "mqtt: broker disconnected us")
                    }
                    _ => {}
                }
            }
            Ok(rumqttc::v5::Event::Outgoing(rumqttc::Outgoing::Publish(pkid))) => carried.sent(pkid),
            Ok(_) => {}
            Err(e) => {
                carried.take(&mut eventloop);
                ctx.door.metrics().mqtt_link(Link::Down);
                warn!(cause = %e, retry_in_ms = backoff.as_millis() as u64, "mqtt: connection error");
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Drops the registrations of clients that have been idle too long.
async fn janitor(engine: Engine, mut stop: watch::Receiver<bool>) {
    let period = engine
        .limits()
        .observers
        .idle
        .map(|d| (d / 4).max(Duration::from_secs(1)))
        .unwrap_or(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let n = engine.sweep_idle_observers().await;
        if n > 0 {
            info!(clients = n, "mqtt: dropped the registrations of idle clients");
        }
    }
}
