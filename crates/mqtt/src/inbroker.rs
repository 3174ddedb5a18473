//! In-broker serving: with the embedded broker, requests are answered inside the broker
//! process, with no MQTT client of our own and no loopback hops.
//!
//! - A `MessagePublishCheckAcl` hook recognises a PUBLISH to the invoke topic on the
//!   publisher's own connection task, admits it ([`Door::admit`]), spawns its execution and
//!   consumes the message: the publisher gets PUBACK reason 0x10 (No matching subscribers, a
//!   success-class code) and nobody else ever sees the request.
//! - Answers and KEYNOTIFY notifications are routed with `SessionState::forwards` from a system
//!   sender (our client id), exactly as if the service had published them: subscribers of the
//!   response topic get them, with every property of the client path. A notification also goes
//!   straight to its observer when none of the observer's subscriptions matches it, as the AIO
//!   broker does (the Go SDK relies on it: it never subscribes to its notification topic).
//! - Each connection has its own in-flight limit; a connection past it waits in the hook, so
//!   its packets are not read meanwhile (TCP pushes back on that client only) while every other
//!   connection is served. The global limits answer `__stat=503`, as on the client path.
//! - The hook sees the publisher's session, so the caller is known: its broker client id (a
//!   KEYNOTIFY naming another `__srcId` is refused) and its session (registrations end with it).
//! - Once the service stops (`Door::close`), a new QoS 1 request is refused with PUBACK 0x97 and
//!   a reason saying to send it again (never acknowledged as taken), a QoS 0 one answered 503;
//!   the answers of admitted requests reach their clients before the broker stops
//!   (`broker/drain.rs`).
//!
//! On the wire this differs from the client path in two ways: the PUBACK reason code (0x10
//! instead of 0x00) and the answer's message expiry, which repeats the request's interval as
//! received instead of what a broker hop would have counted down.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rmqtt::codec::v5::{PublishAckReason, PublishProperties};
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::session::SessionState;
use rmqtt::types::{ClientId, CodecPublish, From, Id, Publish, PublishAclResult, PublishResult, SubscriptionOptions};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};

use super::INVOKE_TOPIC;
use super::broker::session_token;
use super::door::{self, Door, Sink};
use super::mirror::Retained;
use super::request::{CONTENT_TYPE, Caller, Outgoing, Request};
use crate::access::{Access, Principal};

/// Publishes into the broker as the service.
struct BrokerSink {
    scx: ServerContext,
    from: From,
}

impl BrokerSink {
    fn packet(out: &Outgoing) -> CodecPublish {
        let properties = PublishProperties {
            correlation_data: out.correlation.clone(),
            message_expiry_interval: out.message_expiry.and_then(NonZeroU32::new),
            content_type: Some(CONTENT_TYPE.into()),
            user_properties: out
                .user_properties
                .iter()
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect(),
            ..PublishProperties::default()
        };
        CodecPublish {
            dup: false,
            retain: false,
            qos: rmqtt::codec::types::QoS::AtLeastOnce,
            topic: out.topic.as_str().into(),
            packet_id: None,
            payload: out.payload.clone(),
            properties: Some(properties),
        }
    }

    async fn forward(&self, publish: Publish, topic: &str) {
        if let Err(e) = SessionState::forwards(&self.scx, self.from.clone(), publish, false, None).await {
            warn!(cause = %e, %topic, "mqtt: routing an answer failed");
        }
    }

    /// Routes `packet` once: to everyone whose subscription matches it (as `forwards` would)
    /// and, when no subscription of `client_id`'s own matches, straight to `client_id` too.
    /// One trie match per notification: a fan-out to N observers is N distinct topics, so the
    /// match is most of the routing cost.
    async fn forward_and_target(&self, packet: CodecPublish, client_id: &str) {
        let topic = packet.topic.clone();
        let this_node = self.scx.node.id();
        let mut relations = {
            let router = self.scx.extends.router().await;
            match router.matches(self.from.id.clone(), &topic).await {
                Ok(mut map) => map.remove(&this_node).unwrap_or_default(),
                Err(e) => {
                    warn!(cause = %e, %topic, "mqtt: matching a notification's subscribers failed");
                    Vec::new()
                }
            }
        };
        let subscribed = relations
            .iter()
            .any(|(_, client, _, _, group)| group.is_none() && &client[..] == client_id);
        if !subscribed {
            let mut options = SubscriptionOptions::default();
            options.set_qos(packet.qos);
            relations.push((topic.clone(), ClientId::from(client_id), options, None, None));
        }
        let publish = Publish::from(packet);
        let shared = self.scx.extends.shared().await;
        if let Err((_, dropped)) = shared.forwards_to(self.from.clone(), &publish, relations, None).await {
            drop(shared);
            for (to, from, p, reason) in dropped {
                self.scx
                    .extends
                    .hook_mgr()
                    .message_dropped(Some(to), from, p, reason)
                    .await;
            }
        }
    }
}

#[async_trait]
impl Sink for BrokerSink {
    async fn publish(&self, out: &Outgoing) {
        self.forward(Self::packet(out).into(), &out.topic).await;
    }

    async fn publish_retained(&self, msg: &Retained) {
        let properties = PublishProperties {
            user_properties: msg
                .user_properties
                .iter()
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect(),
            ..PublishProperties::default()
        };
        let packet = CodecPublish {
            dup: false,
            retain: true,
            qos: rmqtt::codec::types::QoS::AtLeastOnce,
            topic: msg.topic.as_str().into(),
            packet_id: None,
            payload: msg.payload.clone(),
            properties: Some(properties),
        };
        self.forward(packet.into(), &msg.topic).await;
    }

    /// The Go SDK (v0.4.1) never subscribes to its notification topic (its client starts only
    /// the command invoker's listener), yet its KEYNOTIFY works against the AIO broker, which
    /// hands state store notifications to the observer's session. So does this: routed as
    /// usual for whoever subscribed (the Rust and .NET SDKs, spies), and sent straight to the
    /// observer when none of its subscriptions matches, so it never gets it twice.
    async fn notify(&self, out: &Outgoing, observers: &[(Arc<str>, String)]) {
        let template = Self::packet(out);
        for (client_id, topic) in observers {
            let mut packet = template.clone();
            packet.topic = topic.as_str().into();
            self.forward_and_target(packet, client_id).await;
        }
    }

    /// As the broker authenticated it: the client id, and the username of its session here
    /// (none when it is not connected to this broker: then only rules for the id apply).
    async fn observer(&self, _access: &Access, client_id: &str) -> Principal {
        let id = Id::from(self.scx.node.id(), ClientId::from(client_id));
        let session = self.scx.extends.shared().await.entry(id).session();
        Principal {
            client_id: Some(client_id.to_owned()),
            username: session.and_then(|s| s.id.username.as_ref().map(|u| u.to_string())),
            token: None,
        }
    }
}

/// Per-connection in-flight limits, keyed by broker session.
type Connections = Arc<Mutex<HashMap<u64, Arc<Semaphore>>>>;

/// The request hook. It holds the door weakly: rmqtt keeps hooks after the broker stops, and
/// the door (its engine, its storage) must go with the service.
struct ServeRequests {
    door: std::sync::Weak<Door>,
    sink: Arc<BrokerSink>,
    connections: Connections,
}

impl ServeRequests {
    fn connection(&self, token: u64, limit: usize) -> Arc<Semaphore> {
        let mut map = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(token)
            .or_insert_with(|| Arc::new(Semaphore::new(limit.clamp(1, Semaphore::MAX_PERMITS))))
            .clone()
    }

    /// A request that arrives once the service is stopping. At QoS 1 and 2 it is refused
    /// with PUBACK 0x97 (Quota exceeded: not a protocol error, so the connection stays) and a
    /// reason string saying to retry: it was not taken, so no answer is owed. At QoS 0 there is
    /// no acknowledgement to refuse with; the request is answered `__stat=503` instead (it was
    /// sent at most once).
    async fn stopping(&self, door: Option<Arc<Door>>, publish: &CodecPublish) -> ReturnType {
        if publish.qos != rmqtt::codec::types::QoS::AtMostOnce {
            return refused_stopping();
        }
        if let Some(door) = door
            && let Some(out) = door.busy(&to_request(publish))
        {
            self.sink.publish(&out).await;
        }
        consumed()
    }
}

fn to_request(p: &CodecPublish) -> Request {
    let props = p.properties.as_ref();
    Request {
        topic: p.topic.to_string(),
        qos: p.qos as u8,
        payload: p.payload.clone(),
        response_topic: props.and_then(|p| p.response_topic.as_ref()).map(|t| t.to_string()),
        correlation: props.and_then(|p| p.correlation_data.clone()),
        user_properties: props
            .map(|p| {
                p.user_properties
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        message_expiry: props.and_then(|p| p.message_expiry_interval).map(NonZeroU32::get),
    }
}

/// What a QoS 1 request gets once the service is stopping.
pub const STOPPING_REASON: &str = "the service is stopping; send the request again";

fn refused_stopping() -> ReturnType {
    let result = PublishResult::reason_code(PublishAckReason::QuotaExceeded, Some(STOPPING_REASON.into()), false);
    (false, Some(HookResult::PublishAclResult(PublishAclResult(result))))
}

/// The PUBACK a consumed request gets: success-class, nothing routed.
fn consumed() -> ReturnType {
    let result = PublishResult::reason_code(PublishAckReason::NoMatchingSubscribers, None, false);
    (false, Some(HookResult::PublishAclResult(PublishAclResult(result))))
}

#[async_trait]
impl Handler for ServeRequests {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let Parameter::MessagePublishCheckAcl(session, publish) = param else {
            return (true, acc);
        };
        if publish.topic != INVOKE_TOPIC {
            return (true, acc);
        }
        // The service stopped, or is stopping: nothing more is taken in. A QoS 1 request is
        // refused, not acknowledged, so that its client knows to send it again.
        let door = match self.door.upgrade() {
            Some(door) if !door.is_closed() => door,
            door => return self.stopping(door, publish).await,
        };
        let req = to_request(publish);
        // A client whose answers wait in its session (its receive window is full: it does not
        // take them) gets no more work done: every answer it leaves there is memory held for it.
        // The refusal is a few bytes; the broker bounds how many it queues.
        if session.deliver_queue().len() >= door.limits().max_queued_answers {
            if let Some(out) = door.busy(&req) {
                self.sink.publish(&out).await;
            }
            return consumed();
        }
        let token = session_token(&session.id);
        // Backpressure on this connection only: it waits here, unread, while others go on.
        let connection = self.connection(token, door.limits().max_inflight_per_caller);
        let Ok(slot) = connection.acquire_owned().await else {
            return consumed();
        };
        let Some(admitted) = door.admit(&req, None) else {
            // Closed while this connection waited for its slot.
            if door.is_closed() {
                return self.stopping(Some(door), publish).await;
            }
            if let Some(out) = door.busy(&req) {
                self.sink.publish(&out).await;
            }
            return consumed();
        };
        let caller = Caller {
            client_id: Some(session.id.client_id.to_string()),
            session: Some(token),
            username: session.id.username.as_ref().map(|u| u.to_string()),
        };
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let _held = (slot, admitted);
            if let Some(out) = door.serve(&req, &caller).await {
                sink.publish(&out).await;
            }
        });
        consumed()
    }
}

/// Forgets a connection's limit when it ends.
struct ForgetConnections {
    connections: Connections,
}

#[async_trait]
impl Handler for ForgetConnections {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        if let Parameter::ClientDisconnected(session, _) = param {
            let token = session_token(&session.id);
            self.connections
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&token);
        }
        (true, acc)
    }
}

/// In-broker serving, running until dropped or shut down.
#[derive(Debug)]
pub struct InBroker {
    door: Arc<Door>,
    stop: watch::Sender<bool>,
    notifier: Option<tokio::task::JoinHandle<()>>,
}

impl InBroker {
    /// Starts answering requests inside the broker of `scx`, as `service_id`.
    pub(crate) async fn start(scx: &ServerContext, door: Arc<Door>) -> InBroker {
        let from = From::from_system(Id::new(scx.node.id(), 0, None, None, door.service_id().into(), None));
        let sink = Arc::new(BrokerSink { scx: scx.clone(), from });
        let connections: Connections = Arc::default();
        let hooks = scx.extends.hook_mgr().register();
        hooks
            .add(
                Type::MessagePublishCheckAcl,
                Box::new(ServeRequests {
                    door: Arc::downgrade(&door),
                    sink: sink.clone(),
                    connections: connections.clone(),
                }),
            )
            .await;
        hooks
            .add(Type::ClientDisconnected, Box::new(ForgetConnections { connections }))
            .await;
        if let Some(topics) = door.mirror().map(|m| m.topics().clone())
            && topics.set_by_publish
        {
            let set = super::mirror::setbypublish::SetByPublish::new(&door, topics);
            hooks.add(Type::MessagePublishCheckAcl, Box::new(set)).await;
        }
        hooks.start().await;
        door.metrics().mqtt_link(crate::metrics::Link::Subscribed);
        let (stop, stop_rx) = watch::channel(false);
        let notifier = match door.keynotify_feed() {
            Some(feed) => Some(tokio::spawn(door::notifier(feed, sink, &door, door.mirror(), stop_rx))),
            None => {
                warn!("mqtt: another door already takes KEYNOTIFY notifications; in-broker serving sends none");
                None
            }
        };
        debug!(
            service_id = door.service_id(),
            "mqtt: serving requests inside the embedded broker"
        );
        InBroker { door, stop, notifier }
    }

    pub fn door(&self) -> &Arc<Door> {
        &self.door
    }

    /// Stops sending notifications (the broker's own shutdown ends the rest).
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(n) = self.notifier.take() {
            let _ = n.await;
        }
    }
}
