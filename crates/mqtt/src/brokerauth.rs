//! The embedded broker's authentication and topic ACLs (rmqtt hooks).
//!
//! - `ClientAuthenticate` sees every CONNECT (the listener takes no anonymous shortcut). A
//!   client certificate verified by the MQTTS listener is the proof and its configured field
//!   the identity (a certificate without it is refused); otherwise, with a password file, a
//!   client needs a username and its password (rmqtt refuses MQTT5 enhanced auth). Nobody is
//!   ever a superuser: superusers skip the ACL hooks, and in-broker serving is one of them. The
//!   service's own client id is refused to all but the service's own connection (client path),
//!   which logs in with a secret made at startup.
//! - Once access control is on (a password file or a rules file), topics the state store owns
//!   are guarded: nobody subscribes to the invoke topic (requests are private to the service),
//!   to another client's notification topics, or to another client's `clients/<id>/...`
//!   namespace (where the Azure IoT Operations SDKs put their response topics); nobody
//!   publishes on a notification topic (only the service does, from inside the broker), nor
//!   leaves a Will there or on the invoke topic.
//!   Subscription filters arrive with any `$share/<group>/` already stripped.
//! - With `--state-topics`, whether or not access control is on, everything under the prefix
//!   is the service's: no client publishes there (a set request aside, which its own hook
//!   consumes), retained or not, and no client leaves a Will there (not even on a set topic: a
//!   Will bypasses the hooks and would reach the topic's subscribers as if the service spoke).
//! - One rule ([`BrokerGuard::refusal`]) decides both a PUBLISH (the publish ACL hook) and a
//!   Will (at CONNECT: rmqtt publishes Wills without the publish hook).

use async_trait::async_trait;
use rmqtt::codec::v5::{PublishAckReason, SubscribeAckReason};
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::types::{AuthResult, ConnectInfo, LastWill, PublishAclResult, PublishResult, SubscribeAclResult};

use super::broker::tls;
use super::request::notify_topic_client_level;
use super::{INVOKE_TOPIC, NOTIFY_TOPIC_PREFIX};
use crate::CertIdentity;
use crate::access::Access;
use crate::access::identity::binds_client_ids;

/// What the broker's hooks enforce.
#[derive(Debug, Clone)]
pub struct BrokerGuard {
    pub access: Access,
    /// The service's client id: with `--mqtt-client-path` its own connection subscribes to the
    /// invoke topic and publishes notifications (never together with a password file). Refused
    /// to every other client.
    pub service_id: String,
    pub client_path: bool,
    /// The state topics mirror: only the service publishes under its prefix (set requests
    /// aside), and a subscriber receives a key's topic only if it may `read` the key.
    pub state_topics: Option<crate::mirror::StateTopics>,
}

/// How a message would reach the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// A PUBLISH, seen by the publish hooks (the set request hook among them).
    Publish,
    /// The client's Will, which rmqtt publishes after the session ends, past every hook.
    Will,
}

/// Why a client may not send to a topic: the PUBACK reason code and its reason string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refusal {
    reason: PublishAckReason,
    text: &'static str,
}

const NOT_AUTHORIZED: Refusal = Refusal {
    reason: PublishAckReason::NotAuthorized,
    text: "not authorized",
};

impl BrokerGuard {
    /// The one rule for what client `client_id` may send to `topic`, as a PUBLISH or as its
    /// Will (`None`: allowed).
    fn refusal(&self, client_id: &str, topic: &str, sent: Sent) -> Option<Refusal> {
        if self.is_service(client_id) {
            return None;
        }
        if let Some(mirror) = &self.state_topics
            && mirror.owns(topic)
        {
            return match sent {
                // The set request hook consumes it: it is answered, never routed.
                Sent::Publish if mirror.set_key_of(topic).is_some() => None,
                Sent::Publish if mirror.is_set_topic(topic) => Some(Refusal {
                    reason: PublishAckReason::TopicNameInvalid,
                    text: "the key cannot be a state topic",
                }),
                Sent::Publish | Sent::Will => Some(Refusal {
                    reason: PublishAckReason::NotAuthorized,
                    text: "the state topics are the service's",
                }),
            };
        }
        if !self.topics_guarded() {
            return None;
        }
        let allowed = match sent {
            Sent::Publish => may_publish(topic),
            Sent::Will => may_will(topic),
        };
        (!allowed).then_some(NOT_AUTHORIZED)
    }

    /// Whether topic ACLs apply (access control is configured).
    fn topics_guarded(&self) -> bool {
        self.access.mqtt_auth_required() || self.access.has_rules()
    }

    fn is_service(&self, client_id: &str) -> bool {
        self.client_path && client_id == self.service_id
    }

    /// Registers the hooks on a broker about to listen, whose MQTTS listener names clients by
    /// `cert_identity`. The broker must let the authentication hook see every CONNECT (no
    /// anonymous shortcut): it decides about anonymous clients too.
    pub(crate) async fn install(self, hooks: &dyn rmqtt::hook::Register, cert_identity: CertIdentity) {
        let guard = std::sync::Arc::new(self);
        let authenticate = Authenticate {
            guard: guard.clone(),
            cert_identity,
        };
        hooks.add(Type::ClientAuthenticate, Box::new(authenticate)).await;
        hooks
            .add(Type::ClientSubscribeCheckAcl, Box::new(SubscribeAcl(guard.clone())))
            .await;
        hooks
            .add(Type::MessagePublishCheckAcl, Box::new(PublishAcl(guard.clone())))
            .await;
        if let Some(topics) = &guard.state_topics {
            crate::mirror::inbroker::install_guards(hooks, topics.clone(), guard.access.clone()).await;
        }
    }
}

struct Authenticate {
    guard: std::sync::Arc<BrokerGuard>,
    /// Which field of a client certificate names its client (`--mqtt-tls-identity`).
    cert_identity: CertIdentity,
}

#[async_trait]
impl Handler for Authenticate {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let Parameter::ClientAuthenticate(info) = param else {
            return (true, acc);
        };
        let result = match self.admit(info).await {
            Ok(identity) => {
                tracing::debug!(
                    user = identity,
                    client_id = &**info.client_id(),
                    "mqtt client authenticated"
                );
                AuthResult::Allow(false, None)
            }
            Err(refused) => refused,
        };
        (false, Some(HookResult::AuthResult(result)))
    }
}

impl Authenticate {
    /// Who the client is (`None`: anonymous), or why it is refused. The cheap checks come
    /// before any password hash is computed.
    async fn admit<'a>(&self, info: &'a ConnectInfo) -> Result<Option<&'a str>, AuthResult> {
        let client_id: &str = info.client_id();
        if client_id == self.guard.service_id {
            return self.service(info);
        }
        self.check_will(info)?;
        let identity = self.identity(info).await?;
        // Only an identity somebody vouched for (a client certificate, a password-file user)
        // binds client ids: without a password file a username on the plain listener is
        // whatever the client typed, even when the MQTTS listener checks certificates.
        let verified = identity.filter(|_| info.cert().is_some() || self.guard.access.mqtt_auth_required());
        if !self.guard.access.may_use_client_id(client_id, verified) {
            let why = match verified {
                None if identity.is_some() => "the username is not verified (no password file, no client certificate)",
                None => "an anonymous client has no identity",
                Some(id) if !binds_client_ids(id) => {
                    "the identity contains ':', which separates an identity from the rest of its client ids"
                }
                Some(_) => "the client id is neither the identity nor starts with it and ':'",
            };
            tracing::info!(
                client_id,
                user = identity,
                why,
                "mqtt: the client id is not bound to the client's identity (--mqtt-bind-client-id); refused"
            );
            return Err(AuthResult::NotAuthorized);
        }
        Ok(identity)
    }

    /// The service's client id belongs to the service alone: a session with it is exempt from
    /// the topic ACLs (client path), and connecting with it would take over the service's
    /// session. With `--mqtt-client-path` the service's own connection proves itself with the
    /// per-process secret ([`Access::service_password`]), which no client can know; in-broker
    /// serving has no connection, so nobody may use the id.
    fn service<'a>(&self, info: &'a ConnectInfo) -> Result<Option<&'a str>, AuthResult> {
        let password = info.password();
        if self.guard.client_path && password.is_some_and(|p| self.guard.access.is_service_password(p)) {
            return Ok(info.username().map(|u| &**u));
        }
        tracing::warn!(
            client_id = &**info.client_id(),
            remote = ?info.id().remote_addr,
            "mqtt: a client used the service's own client id; refused"
        );
        Err(AuthResult::NotAuthorized)
    }

    /// rmqtt publishes a Will without calling the publish ACL hook, so its topic is checked
    /// here, once, with the PUBLISH rule ([`BrokerGuard::refusal`]). A refused Will refuses the
    /// CONNECT rather than being stripped: the hook cannot change the CONNECT, and a client
    /// whose Will would silently never be published would be misled.
    fn check_will(&self, info: &ConnectInfo) -> Result<(), AuthResult> {
        let topic = match info.last_will() {
            None => return Ok(()),
            Some(LastWill::V3(will)) => &will.topic,
            Some(LastWill::V5(will)) => &will.topic,
        };
        let Some(refusal) = self.guard.refusal(info.client_id(), topic, Sent::Will) else {
            return Ok(());
        };
        tracing::info!(
            client_id = &**info.client_id(),
            topic = &**topic,
            why = refusal.text,
            "mqtt: a Will on a topic its client may not publish to; refused"
        );
        Err(AuthResult::NotAuthorized)
    }

    /// Who the client is (`None`: anonymous), or why it is refused.
    async fn identity<'a>(&self, info: &'a ConnectInfo) -> Result<Option<&'a str>, AuthResult> {
        let user = info.username().map(|u| &**u);
        // A client certificate verified by the MQTTS listener (`--mqtt-tls-client-ca`) is the
        // proof, and the only source of the identity: rmqtt fills `cert` only from the TLS
        // session, never from the wire, but it keeps the typed username when the certificate
        // lacks the field, so that case is refused rather than trusted.
        if let Some(cert) = info.cert() {
            let named = tls::cert_identity(cert, self.cert_identity);
            return match named {
                Some(name) if user == Some(name) => Ok(Some(name)),
                _ => {
                    tracing::info!(
                        field = ?self.cert_identity,
                        remote = ?info.id().remote_addr,
                        "mqtt: the client certificate names nobody in the identity field; refused"
                    );
                    Err(AuthResult::NotAuthorized)
                }
            };
        }
        if !self.guard.access.mqtt_auth_required() {
            // Without a password file a username is whatever the client says (docs/security.md).
            return Ok(user);
        }
        match (user, info.password()) {
            (Some(user), Some(password)) if self.guard.access.verify_password(user, password).await => Ok(Some(user)),
            (Some(user), _) => {
                tracing::info!(user, remote = ?info.id().remote_addr, "mqtt: bad username or password");
                Err(AuthResult::BadUsernameOrPassword)
            }
            (None, _) => Err(AuthResult::NotAuthorized),
        }
    }
}

/// One level of a set of topics a filter is tested against.
enum Level<'a> {
    Is(&'a str),
    /// Any single level except these.
    Not(&'a [&'a str]),
    /// Any number of levels (also none).
    Rest,
}

/// Whether MQTT filter `filter` could match a topic of the set `set` describes.
fn could_match(filter: &str, set: &[Level]) -> bool {
    fn go(f: &[&str], s: &[Level]) -> bool {
        match (f.first(), s.first()) {
            (Some(&"#"), _) => true,
            (_, Some(Level::Rest)) => true,
            (None, None) => true,
            (None, Some(_)) | (Some(_), None) => false,
            (Some(&"+"), Some(_)) => go(&f[1..], &s[1..]),
            (Some(lit), Some(Level::Is(v))) => lit == v && go(&f[1..], &s[1..]),
            (Some(lit), Some(Level::Not(no))) => !no.contains(lit) && go(&f[1..], &s[1..]),
        }
    }
    let levels: Vec<&str> = filter.split('/').collect();
    go(&levels, set)
}

/// Whether client `client_id` may subscribe to `filter`.
pub fn may_subscribe(client_id: &str, filter: &str) -> bool {
    let invoke: Vec<Level> = INVOKE_TOPIC.split('/').map(Level::Is).collect();
    if could_match(filter, &invoke) {
        return false;
    }
    let own_hex = notify_topic_client_level(client_id);
    let own = [own_hex.as_str()];
    let mut notify: Vec<Level> = NOTIFY_TOPIC_PREFIX.split('/').map(Level::Is).collect();
    notify.extend([Level::Not(&own), Level::Rest]);
    if could_match(filter, &notify) {
        return false;
    }
    // `clients/<id>/...` belongs to client <id> (the notifications live under
    // `clients/statestore/...`, checked above).
    let mine = [client_id, "statestore"];
    !could_match(filter, &[Level::Is("clients"), Level::Not(&mine), Level::Rest])
}

/// Whether a client may publish to `topic` (a topic, not a filter).
pub fn may_publish(topic: &str) -> bool {
    !(topic.starts_with(NOTIFY_TOPIC_PREFIX) && topic[NOTIFY_TOPIC_PREFIX.len()..].starts_with('/'))
}

/// Whether a client's Will may go to `topic`: where the client may publish, except the invoke
/// topic. A request there is served under its publisher's identity, checked when it is
/// published; a Will is published after its client's session ended, so nobody could be held to
/// it (in-broker serving would not even see it: it bypasses the publish hook).
pub fn may_will(topic: &str) -> bool {
    // MQTT 3.1.1 Wills may carry `?name=value` user properties after the topic (rmqtt).
    let bare = topic.split('?').next().unwrap_or(topic);
    may_publish(topic) && bare != INVOKE_TOPIC
}

struct SubscribeAcl(std::sync::Arc<BrokerGuard>);

#[async_trait]
impl Handler for SubscribeAcl {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let Parameter::ClientSubscribeCheckAcl(session, sub) = param else {
            return (true, acc);
        };
        let client_id: &str = &session.id.client_id;
        if !self.0.topics_guarded() || self.0.is_service(client_id) {
            return (true, acc);
        }
        let filter: &str = &sub.topic_filter;
        if may_subscribe(client_id, filter) {
            return (true, acc);
        }
        tracing::info!(client_id, filter, "mqtt: subscription refused");
        let refused = SubscribeAclResult::new_failure(SubscribeAckReason::NotAuthorized);
        (false, Some(HookResult::SubscribeAclResult(refused)))
    }
}

struct PublishAcl(std::sync::Arc<BrokerGuard>);

#[async_trait]
impl Handler for PublishAcl {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let Parameter::MessagePublishCheckAcl(session, publish) = param else {
            return (true, acc);
        };
        let client_id: &str = &session.id.client_id;
        let Some(refusal) = self.0.refusal(client_id, &publish.topic, Sent::Publish) else {
            return (true, acc);
        };
        tracing::info!(
            client_id,
            topic = &*publish.topic,
            why = refusal.text,
            "mqtt: publish refused"
        );
        // A PUBACK with the reason code (QoS 0: dropped); the connection stays.
        let refused = PublishResult::reason_code(refusal.reason, Some(refusal.text.into()), false);
        (false, Some(HookResult::PublishAclResult(PublishAclResult(refused))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = NOTIFY_TOPIC_PREFIX;

    #[test]
    fn subscriptions() {
        let me = "dev-1";
        let mine = notify_topic_client_level(me);
        let theirs = notify_topic_client_level("dev-2");
        for ok in [
            format!("{N}/{mine}/command/notify/+"),
            format!("{N}/{mine}/#"),
            format!("clients/{me}/services/#"),
            "sensors/#".into(),
            "statestore/v1/other".into(),
        ] {
            assert!(may_subscribe(me, &ok), "{ok}");
        }
        for refused in [
            INVOKE_TOPIC.to_owned(),
            "#".into(),
            "statestore/#".into(),
            "statestore/v1/+/command/invoke".into(),
            "+/+/+/+/+".into(),
            format!("{N}/{theirs}/command/notify/+"),
            format!("{N}/+/command/notify/+"),
            format!("{N}/#"),
            "clients/#".into(),
            "clients/dev-2/services/#".into(),
            "clients/+/services/#".into(),
        ] {
            assert!(!may_subscribe(me, &refused), "{refused}");
        }
    }

    #[test]
    fn publishes() {
        assert!(!may_publish(&format!("{N}/4142/command/notify/6B")));
        assert!(may_publish(INVOKE_TOPIC));
        assert!(may_publish("clients/dev-2/services/x/response"));
    }

    /// Everything under the state topics prefix is the service's, with or without access
    /// control: a client's PUBLISH there (a set request aside) and its Will anywhere there.
    #[test]
    fn state_topics_are_the_services_alone() {
        let mirror = crate::mirror::StateTopics {
            prefix: "state/".into(),
            set_by_publish: true,
            external_broker: false,
        };
        let guard = BrokerGuard {
            access: Access::open(),
            service_id: "svc".into(),
            client_path: true,
            state_topics: Some(mirror),
        };
        let reason = |topic: &str, sent| guard.refusal("dev-1", topic, sent).map(|r| r.reason);
        for sent in [Sent::Publish, Sent::Will] {
            assert_eq!(reason("state/door/open", sent), Some(PublishAckReason::NotAuthorized));
            assert_eq!(reason("state/", sent), Some(PublishAckReason::NotAuthorized));
            assert_eq!(reason("devices/dev-1/status", sent), None);
        }
        // A set request goes to its hook; as a Will it would reach the topic's subscribers.
        assert_eq!(reason("state/door/set", Sent::Publish), None);
        assert_eq!(
            reason("state/door/set", Sent::Will),
            Some(PublishAckReason::NotAuthorized)
        );
        for bad_key in ["state/a//set", "state/x/set/set"] {
            assert_eq!(reason(bad_key, Sent::Publish), Some(PublishAckReason::TopicNameInvalid));
        }
        // The service's own connection (client path) publishes the mirror.
        assert_eq!(guard.refusal("svc", "state/door/open", Sent::Publish), None);
        // Without access control the protocol's own topics stay open, as before.
        assert_eq!(reason(INVOKE_TOPIC, Sent::Will), None);
    }

    #[test]
    fn wills() {
        assert!(!may_will(&format!("{N}/4142/command/notify/6B")));
        assert!(!may_will(INVOKE_TOPIC));
        assert!(!may_will(&format!("{INVOKE_TOPIC}?__srcId=someone")));
        assert!(may_will("clients/dev-2/services/x/response"));
        assert!(may_will("devices/dev-1/status"));
    }
}
