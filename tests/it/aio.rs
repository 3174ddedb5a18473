//! Interop with the official Azure IoT Operations Rust SDK (`azure_iot_operations_services`
//! 1.5.0-beta1, features `state_store` and `leased_lock`), used unchanged: its state store
//! client and its lease and lock clients talk to stategate through Mosquitto and through the
//! embedded broker, served inside it and through the client path (see `every_broker!` at the end).
//!
//! Synchronisation: every wait is on an event (a response, a notification, a PUBLISH seen by a
//! raw spy client) and is bounded by `support::WAIT`. The one exception is `Sdk::ready`, which
//! has to retry because the SDK gives no signal when its notification subscription is in place.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionError, SessionExitHandle, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::leased_lock::{self, lease, lock};
use azure_iot_operations_services::state_store::{
    self, KeyNotification, KeyObservation, Operation, ServiceError, SetCondition, SetOptions,
};
use tokio::task::JoinHandle;

use crate::support::{self, Broker, RawClient, TestEnv, WAIT};

/// The per-request timeout given to the SDK (it becomes the Message Expiry Interval). Shorter
/// than `WAIT`, so that a lost response shows up as the SDK's timeout error, not ours.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Notification topic prefix (spec section 8).
const NOTIFY_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

/// Awaits `f`, failing the test with `what` if it takes longer than `WAIT`.
async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// One SDK client: an MQTT session (running in a task) and the state store client on it.
pub(crate) struct Sdk {
    pub(crate) id: String,
    client: Arc<state_store::Client>,
    exit: SessionExitHandle,
    session: JoinHandle<Result<(), SessionError>>,
}

impl Sdk {
    /// Connects a session as the SDK's own samples do, waits for CONNACK, and makes sure the
    /// client's notification subscription is in place.
    pub(crate) async fn connect(port: u16, prefix: &str) -> Sdk {
        let id = support::unique_id(prefix);
        let settings = MqttConnectionSettingsBuilder::default()
            .client_id(id.clone())
            .hostname("127.0.0.1")
            .tcp_port(port)
            .use_tls(false)
            .build()
            .expect("connection settings");
        let options = SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()
            .expect("session options");
        let session = Session::new(options).expect("session");
        let context = ApplicationContextBuilder::default()
            .build()
            .expect("application context");
        let monitor = session.create_session_monitor();
        let client = state_store::Client::new(
            context,
            session.create_managed_client(),
            session.create_session_monitor(),
            state_store::ClientOptionsBuilder::default()
                .build()
                .expect("client options"),
        )
        .expect("state store client");
        let exit = session.create_exit_handle();
        let session = tokio::spawn(session.run());
        within("the SDK session to connect", monitor.connected()).await;
        let sdk = Sdk {
            id,
            client: Arc::new(client),
            exit,
            session,
        };
        sdk.ready().await;
        sdk
    }

    /// The SDK subscribes to its notification topic from a background task and says nothing
    /// when the SUBACK arrives; a notification published before that is lost. Observe a probe
    /// key and SET it until its notification comes back: after that, no notification can be
    /// lost. The short per-attempt wait only bounds the latency of a retry; the total is `WAIT`.
    async fn ready(&self) {
        let probe = format!("{}/probe", self.id).into_bytes();
        let mut obs = self.observe(&probe).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut attempt = 0u32;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no KEYNOTIFY notification reached SDK client {} within {WAIT:?}",
                self.id
            );
            attempt += 1;
            self.set(&probe, attempt.to_string().as_bytes(), SetOptions::default())
                .await
                .expect("probe SET");
            if let Ok(got) = tokio::time::timeout(Duration::from_secs(1), obs.recv_notification()).await {
                got.expect("probe observation open");
                break;
            }
        }
        let stopped = within("probe unobserve", self.client.unobserve(probe.clone(), REQUEST_TIMEOUT))
            .await
            .expect("probe unobserve");
        assert!(stopped.response, "the probe key was observed, so STOP must answer +OK");
        let deleted = within("probe DEL", self.client.del(probe, None, REQUEST_TIMEOUT))
            .await
            .expect("probe DEL");
        assert_eq!(deleted.response, 1);
    }

    async fn set(
        &self,
        key: &[u8],
        value: &[u8],
        options: SetOptions,
    ) -> Result<state_store::Response<bool>, state_store::Error> {
        self.set_fenced(key, value, None, options).await
    }

    pub(crate) async fn set_fenced(
        &self,
        key: &[u8],
        value: &[u8],
        token: Option<HybridLogicalClock>,
        options: SetOptions,
    ) -> Result<state_store::Response<bool>, state_store::Error> {
        within(
            "a SET response",
            self.client
                .set(key.to_vec(), value.to_vec(), REQUEST_TIMEOUT, token, options),
        )
        .await
    }

    /// A SET that must be applied; returns the new version.
    async fn set_ok(&self, key: &[u8], value: &[u8]) -> HybridLogicalClock {
        let r = self.set(key, value, SetOptions::default()).await.expect("SET");
        assert!(r.response, "an unconditional SET is applied");
        r.version.expect("an applied SET carries the new version (__ts)")
    }

    pub(crate) async fn get(&self, key: &[u8]) -> state_store::Response<Option<Vec<u8>>> {
        within("a GET response", self.client.get(key.to_vec(), REQUEST_TIMEOUT))
            .await
            .expect("GET")
    }

    async fn del(&self, key: &[u8], token: Option<HybridLogicalClock>) -> Result<i64, state_store::Error> {
        within("a DEL response", self.client.del(key.to_vec(), token, REQUEST_TIMEOUT))
            .await
            .map(|r| r.response)
    }

    async fn vdel(
        &self,
        key: &[u8],
        value: &[u8],
        token: Option<HybridLogicalClock>,
    ) -> Result<i64, state_store::Error> {
        within(
            "a VDEL response",
            self.client.vdel(key.to_vec(), value.to_vec(), token, REQUEST_TIMEOUT),
        )
        .await
        .map(|r| r.response)
    }

    async fn observe(&self, key: &[u8]) -> KeyObservation {
        within(
            "a KEYNOTIFY response",
            self.client.observe(key.to_vec(), REQUEST_TIMEOUT),
        )
        .await
        .expect("observe")
        .response
    }

    async fn unobserve(&self, key: &[u8]) -> bool {
        within(
            "a KEYNOTIFY STOP response",
            self.client.unobserve(key.to_vec(), REQUEST_TIMEOUT),
        )
        .await
        .expect("unobserve")
        .response
    }

    pub(crate) fn lease(&self, name: &[u8]) -> lease::Client {
        lease::Client::new(self.client.clone(), name.to_vec(), self.id.clone().into_bytes()).expect("lease client")
    }

    fn lock(&self, name: &[u8]) -> lock::Client {
        lock::Client::new(self.client.clone(), name.to_vec(), self.id.clone().into_bytes()).expect("lock client")
    }

    /// Shuts the client down and ends the session gracefully (DISCONNECT, session expiry 0).
    pub(crate) async fn close(self) {
        within("the SDK client to shut down", self.client.shutdown())
            .await
            .expect("state store client shutdown");
        if self.exit.try_exit().is_err() {
            self.exit.force_exit();
        }
        within("the SDK session to end", self.session)
            .await
            .expect("session task")
            .expect("session ends cleanly");
    }
}

/// The next notification of an observation.
pub(crate) async fn next_notification(obs: &mut KeyObservation) -> KeyNotification {
    within("a key notification", obs.recv_notification())
        .await
        .expect("the observation is still open")
        .0
}

/// Asserts the next notification is a SET of `value` with version `version`.
async fn expect_set(obs: &mut KeyObservation, value: &[u8], version: &HybridLogicalClock) {
    let n = next_notification(obs).await;
    assert_eq!(n.key, obs.key, "notification for the observed key");
    assert_eq!(
        n.operation,
        Operation::Set(value.to_vec()),
        "expected SET {value:?}, got {n}"
    );
    assert_eq!(
        &n.version, version,
        "a SET notification carries the version the SET returned"
    );
}

/// Asserts the next notification is a DELETE.
pub(crate) async fn expect_del(obs: &mut KeyObservation) -> HybridLogicalClock {
    let n = next_notification(obs).await;
    assert_eq!(n.key, obs.key, "notification for the observed key");
    assert_eq!(n.operation, Operation::Del, "expected DELETE, got {n}");
    n.version
}

/// HLC order (timestamp, counter, node id): the SDK type implements only `PartialEq`.
fn hlc_order(v: &HybridLogicalClock) -> (SystemTime, u64, &str) {
    (v.timestamp, v.counter, v.node_id.as_str())
}

#[track_caller]
pub(crate) fn assert_later(later: &HybridLogicalClock, earlier: &HybridLogicalClock) {
    assert!(
        hlc_order(later) > hlc_order(earlier),
        "version {later} must be strictly later than {earlier}"
    );
}

#[track_caller]
fn assert_service_error(err: &state_store::Error, expected: &ServiceError) {
    match err.kind() {
        state_store::ErrorKind::ServiceError(e) => assert_eq!(
            std::mem::discriminant(e),
            std::mem::discriminant(expected),
            "expected service error {expected:?}, got {e:?}"
        ),
        other => panic!("expected service error {expected:?}, got {other:?}"),
    }
}

#[track_caller]
fn assert_rejected<T: std::fmt::Debug>(r: Result<T, state_store::Error>, expected: ServiceError) {
    match r {
        Ok(v) => panic!("expected service error {expected:?}, got Ok({v:?})"),
        Err(e) => assert_service_error(&e, &expected),
    }
}

fn px(ms: u64) -> SetOptions {
    SetOptions {
        expires: Some(Duration::from_millis(ms)),
        ..SetOptions::default()
    }
}

fn condition(set_condition: SetCondition) -> SetOptions {
    SetOptions {
        set_condition,
        ..SetOptions::default()
    }
}

/// A raw client subscribed to every response the service sends to SDK client `id` (the SDK's
/// response topic is `clients/<id>/services/statestore/v1/.../command/invoke/response`).
async fn response_spy(port: u16, id: &str) -> RawClient {
    let mut spy = RawClient::connect(port, &support::unique_id("spy")).await;
    spy.subscribe(&format!("clients/{id}/services/#")).await;
    spy
}

/// Waits until the spy sees a `:-1` response (a SET NEX that was not applied).
async fn await_not_applied(spy: &mut RawClient) {
    loop {
        if spy.next().await.payload.as_ref() == b":-1\r\n" {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// SET/GET/DEL/VDEL: values round-trip byte for byte, GET returns the version of the last SET,
/// versions strictly increase, DEL/VDEL return the counts the SDK maps.
pub(crate) async fn crud_versions(broker: Broker) {
    let env = TestEnv::start(broker).await;
    let a = Sdk::connect(env.broker_port, "aio-crud").await;
    let key: &[u8] = b"crud/key\r\nwith crlf \x00\xff";

    let miss = a.get(key).await;
    assert_eq!(miss.response, None, "GET of a missing key");
    assert!(
        miss.version.is_none(),
        "a GET miss carries no __ts, got {:?}",
        miss.version
    );
    assert_eq!(a.del(key, None).await.expect("DEL"), 0, "DEL of a missing key");
    assert_eq!(a.vdel(key, b"x", None).await.expect("VDEL"), 0, "VDEL of a missing key");

    let mut versions = Vec::new();
    for value in [&b"v1"[..], b"", b"bin\r\n$3\r\n\x00\xff", b"v4"] {
        let v = a.set_ok(key, value).await;
        let got = a.get(key).await;
        assert_eq!(got.response.as_deref(), Some(value), "GET returns the last SET value");
        assert_eq!(
            got.version.as_ref(),
            Some(&v),
            "GET returns the version of the last SET"
        );
        // A second GET does not mint a new version.
        assert_eq!(a.get(key).await.version.as_ref(), Some(&v));
        versions.push(v);
    }
    for w in versions.windows(2) {
        assert_later(&w[1], &w[0]);
    }

    assert_eq!(a.del(key, None).await.expect("DEL"), 1, "DEL of a present key");
    assert_eq!(a.get(key).await.response, None, "gone after DEL");
    assert_eq!(a.del(key, None).await.expect("DEL"), 0, "second DEL");

    let v5 = a.set_ok(key, b"keep").await;
    assert_later(&v5, versions.last().expect("versions"));
    assert_eq!(
        a.vdel(key, b"other", None).await.expect("VDEL"),
        -1,
        "VDEL with another value"
    );
    let still = a.get(key).await;
    assert_eq!(
        still.response.as_deref(),
        Some(&b"keep"[..]),
        "VDEL mismatch changes nothing"
    );
    assert_eq!(still.version.as_ref(), Some(&v5));
    assert_eq!(
        a.vdel(key, b"keep", None).await.expect("VDEL"),
        1,
        "VDEL with the stored value"
    );
    assert_eq!(a.get(key).await.response, None, "gone after VDEL");
    assert_eq!(a.vdel(key, b"keep", None).await.expect("VDEL"), 0, "second VDEL");

    // A new SET after deletion still gets a later version than anything before.
    let v6 = a.set_ok(key, b"again").await;
    assert_later(&v6, &v5);

    a.close().await;
    env.stop().await;
}

/// NX and NEX (SetCondition), PX, and NX/NEX over an expired key.
pub(crate) async fn set_conditions(broker: Broker) {
    let env = TestEnv::start(broker).await;
    let a = Sdk::connect(env.broker_port, "aio-cond").await;

    // NX: only if absent. A SET that is not applied carries the stored version.
    let nx = condition(SetCondition::OnlyIfDoesNotExist);
    let first = a.set(b"nx", b"one", nx.clone()).await.expect("SET NX");
    assert!(first.response, "NX on a missing key is applied");
    let v1 = first.version.expect("version");
    let second = a.set(b"nx", b"two", nx.clone()).await.expect("SET NX");
    assert!(!second.response, "NX on a present key is not applied");
    assert_eq!(
        second.version.as_ref(),
        Some(&v1),
        "a SET not applied carries the stored version"
    );
    let got = a.get(b"nx").await;
    assert_eq!(got.response.as_deref(), Some(&b"one"[..]));
    assert_eq!(got.version.as_ref(), Some(&v1));

    // NEX: if absent, or if the stored value equals the new one (a renewal: fresh version).
    let nex = condition(SetCondition::OnlyIfEqualOrDoesNotExist);
    let r = a.set(b"nex", b"mine", nex.clone()).await.expect("SET NEX");
    assert!(r.response, "NEX on a missing key is applied");
    let n1 = r.version.expect("version");
    let r = a.set(b"nex", b"mine", nex.clone()).await.expect("SET NEX");
    assert!(r.response, "NEX with the same value is applied");
    let n2 = r.version.expect("version");
    assert_later(&n2, &n1);
    let r = a.set(b"nex", b"theirs", nex.clone()).await.expect("SET NEX");
    assert!(!r.response, "NEX with another value is not applied");
    assert_eq!(
        r.version.as_ref(),
        Some(&n2),
        "a SET not applied carries the stored version"
    );
    let got = a.get(b"nex").await;
    assert_eq!(got.response.as_deref(), Some(&b"mine"[..]));
    assert_eq!(got.version.as_ref(), Some(&n2));

    // PX far in the future: the key is there.
    let r = a.set(b"px-long", b"v", px(60_000)).await.expect("SET PX");
    assert!(r.response);
    assert_eq!(a.get(b"px-long").await.response.as_deref(), Some(&b"v"[..]));

    // PX that runs out: the DELETE notification is the signal, then the key reads as absent,
    // and NX / NEX treat it as absent.
    for (key, cond) in [(&b"px-nx"[..], nx.clone()), (b"px-nex", nex.clone())] {
        let mut obs = a.observe(key).await;
        let v = a
            .set(key, b"old", px(200))
            .await
            .expect("SET PX")
            .version
            .expect("version");
        expect_set(&mut obs, b"old", &v).await;
        expect_del(&mut obs).await;
        assert_eq!(a.get(key).await.response, None, "an expired key reads as absent");
        let r = a.set(key, b"new", cond).await.expect("conditional SET");
        assert!(r.response, "NX/NEX treat an expired key as absent");
        let v_new = r.version.expect("version");
        expect_set(&mut obs, b"new", &v_new).await;
        assert_eq!(a.get(key).await.response.as_deref(), Some(&b"new"[..]));
        assert!(a.unobserve(key).await);
    }

    a.close().await;
    env.stop().await;
}

/// Fencing tokens on SET, DEL and VDEL, mapped to the SDK's `ServiceError` variants.
pub(crate) async fn fencing_tokens(broker: Broker) {
    let env = TestEnv::start(broker).await;
    let a = Sdk::connect(env.broker_port, "aio-fence").await;
    let key: &[u8] = b"fenced";
    let plain = SetOptions::default;

    let token = HybridLogicalClock::new();
    let lower = HybridLogicalClock {
        timestamp: token.timestamp - Duration::from_secs(1),
        ..token.clone()
    };
    let higher = HybridLogicalClock {
        counter: token.counter + 1,
        ..token.clone()
    };

    let r = a
        .set_fenced(key, b"v1", Some(token.clone()), plain())
        .await
        .expect("SET with a token");
    assert!(r.response);

    assert_rejected(
        a.set(key, b"no-token", plain()).await,
        ServiceError::MissingFencingToken,
    );
    assert_rejected(
        a.set_fenced(key, b"lower", Some(lower.clone()), plain()).await,
        ServiceError::FencingTokenLowerVersion,
    );
    assert_eq!(
        a.get(key).await.response.as_deref(),
        Some(&b"v1"[..]),
        "rejected SETs change nothing"
    );

    let r = a
        .set_fenced(key, b"equal", Some(token.clone()), plain())
        .await
        .expect("SET, equal token");
    assert!(r.response, "an equal token is accepted");
    let r = a
        .set_fenced(key, b"higher", Some(higher.clone()), plain())
        .await
        .expect("SET, higher token");
    assert!(r.response, "a higher token is accepted");
    // The SET kept the higher token: the first one is now too low.
    assert_rejected(
        a.set_fenced(key, b"stale", Some(token.clone()), plain()).await,
        ServiceError::FencingTokenLowerVersion,
    );
    // GET never needs a token.
    assert_eq!(a.get(key).await.response.as_deref(), Some(&b"higher"[..]));

    // DEL and VDEL need the token too; the token check comes before the value comparison.
    assert_rejected(a.del(key, None).await, ServiceError::MissingFencingToken);
    assert_rejected(
        a.del(key, Some(lower.clone())).await,
        ServiceError::FencingTokenLowerVersion,
    );
    assert_rejected(a.vdel(key, b"higher", None).await, ServiceError::MissingFencingToken);
    assert_rejected(
        a.vdel(key, b"wrong", Some(lower.clone())).await,
        ServiceError::FencingTokenLowerVersion,
    );
    assert_eq!(
        a.vdel(key, b"wrong", Some(higher.clone())).await.expect("VDEL"),
        -1,
        "valid token, wrong value"
    );
    assert_eq!(a.get(key).await.response.as_deref(), Some(&b"higher"[..]));
    assert_eq!(
        a.del(key, Some(higher.clone())).await.expect("DEL"),
        1,
        "DEL with the token"
    );

    // A deleted key loses its token.
    a.set_ok(key, b"free").await;
    assert_eq!(a.vdel(key, b"free", None).await.expect("VDEL"), 1);

    // VDEL with a valid token and the right value deletes.
    let r = a
        .set_fenced(key, b"v", Some(token.clone()), plain())
        .await
        .expect("SET with a token");
    assert!(r.response);
    assert_eq!(a.vdel(key, b"v", Some(higher)).await.expect("VDEL"), 1);
    assert_eq!(a.get(key).await.response, None);

    a.close().await;
    env.stop().await;
}

/// KEYNOTIFY: the exact notifications for SET, DEL, VDEL and expiry; none for operations not
/// applied; several observers; unobserve stops them.
pub(crate) async fn observe_notifications(broker: Broker) {
    let env = TestEnv::start(broker).await;
    let a = Sdk::connect(env.broker_port, "aio-obs-a").await;
    let b = Sdk::connect(env.broker_port, "aio-obs-b").await;
    let key: &[u8] = b"watched\r\nkey";

    let mut obs = a.observe(key).await;

    let v1 = a.set_ok(key, b"v1").await;
    expect_set(&mut obs, b"v1", &v1).await;

    // Not applied: NX on a present key, VDEL with another value, DEL/VDEL of nothing. They
    // notify nobody, which the next notification (from the next applied SET) proves, since
    // notifications of one key arrive in order.
    let r = a
        .set(key, b"nx", condition(SetCondition::OnlyIfDoesNotExist))
        .await
        .expect("SET NX");
    assert!(!r.response);
    let r = a
        .set(key, b"nex", condition(SetCondition::OnlyIfEqualOrDoesNotExist))
        .await
        .expect("SET NEX");
    assert!(!r.response);
    assert_eq!(a.vdel(key, b"other", None).await.expect("VDEL"), -1);

    let v2 = a.set_ok(key, b"v2").await;
    expect_set(&mut obs, b"v2", &v2).await;

    assert_eq!(a.vdel(key, b"v2", None).await.expect("VDEL"), 1);
    expect_del(&mut obs).await;
    assert_eq!(a.del(key, None).await.expect("DEL"), 0);
    assert_eq!(a.vdel(key, b"v2", None).await.expect("VDEL"), 0);

    // A value with CRLF and RESP-looking bytes, and an empty value.
    let tricky: &[u8] = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n";
    let v3 = a.set_ok(key, tricky).await;
    expect_set(&mut obs, tricky, &v3).await;
    let v4 = a.set_ok(key, b"").await;
    expect_set(&mut obs, b"", &v4).await;
    assert_eq!(a.del(key, None).await.expect("DEL"), 1);
    expect_del(&mut obs).await;

    // A change made by another client is notified too, and a second observer gets the same.
    let mut obs_b = b.observe(key).await;
    let v5 = b.set_ok(key, b"from-b").await;
    expect_set(&mut obs, b"from-b", &v5).await;
    expect_set(&mut obs_b, b"from-b", &v5).await;
    assert!(b.unobserve(key).await);

    // Expiry.
    let r = a.set(key, b"short", px(200)).await.expect("SET PX");
    let v6 = r.version.expect("version");
    expect_set(&mut obs, b"short", &v6).await;
    expect_del(&mut obs).await;
    assert_eq!(a.get(key).await.response, None);

    // Unobserve: +OK, then :0 when no longer observed (the SDK maps these to true / false).
    // A raw spy on A's notification topic shows that the service sends nothing more for the
    // key: a notification for a barrier key (still observed) is published after the SET of the
    // unobserved key, so anything for that key would arrive before it.
    let mut spy = RawClient::connect(env.broker_port, &support::unique_id("spy")).await;
    let a_hex = hex::encode_upper(a.id.as_bytes());
    spy.subscribe(&format!("{NOTIFY_PREFIX}/{a_hex}/command/notify/+"))
        .await;
    assert!(a.unobserve(key).await, "STOP of an observed key answers +OK");
    assert!(!a.unobserve(key).await, "STOP of a key no longer observed answers :0");
    assert!(
        within("the closed observation", obs.recv_notification())
            .await
            .is_none(),
        "the SDK closes an unobserved observation"
    );
    let barrier: &[u8] = b"barrier";
    let mut obs_barrier = a.observe(barrier).await;
    a.set_ok(key, b"unwatched").await;
    let vb = a.set_ok(barrier, b"b").await;
    expect_set(&mut obs_barrier, b"b", &vb).await;
    let key_topic = format!("{NOTIFY_PREFIX}/{a_hex}/command/notify/{}", hex::encode_upper(key));
    let barrier_topic = format!("{NOTIFY_PREFIX}/{a_hex}/command/notify/{}", hex::encode_upper(barrier));
    loop {
        let p = spy.next().await;
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        assert_ne!(topic, key_topic, "a notification after KEYNOTIFY STOP: {:?}", p.payload);
        if topic == barrier_topic {
            break;
        }
    }

    a.close().await;
    b.close().await;
    env.stop().await;
}

/// SCAN through the SDK's `list_keys` pager with a small page: every matching key exactly once,
/// several pages, deleted keys never come back.
pub(crate) async fn scan_pages(broker: Broker) {
    let env = TestEnv::start_with(broker, |cfg| cfg.limits.scan_page = 10).await;
    let a = Sdk::connect(env.broker_port, "aio-scan").await;

    let wanted: BTreeSet<Vec<u8>> = (0..35).map(|i| format!("scan/{i:02}").into_bytes()).collect();
    for k in &wanted {
        a.set_ok(k, b"v").await;
    }
    for k in ["other/1", "other/2", "scanx", "Scan/1", "xscan/1"] {
        a.set_ok(k.as_bytes(), b"v").await;
    }

    let pages = |pattern: &'static [u8]| {
        let client = a.client.clone();
        async move {
            let mut pager = client.list_keys(pattern.to_vec(), REQUEST_TIMEOUT).expect("list_keys");
            let mut pages = Vec::new();
            while let Some(page) = within("a SCAN page", pager.next()).await.expect("SCAN page") {
                pages.push(page);
                assert!(pages.len() <= 64, "SCAN did not finish within 64 pages");
            }
            pages
        }
    };

    let all = pages(b"scan/*").await;
    assert!(
        all.len() >= 2,
        "a page of 10 over 40 keys needs several pages, got {}",
        all.len()
    );
    let mut seen = BTreeSet::new();
    for k in all.iter().flatten() {
        assert!(
            seen.insert(k.clone()),
            "key {:?} returned twice",
            String::from_utf8_lossy(k)
        );
    }
    assert_eq!(seen, wanted, "every matching key exactly once");

    let tens: BTreeSet<Vec<u8>> = pages(b"scan/1?").await.into_iter().flatten().collect();
    let expected: BTreeSet<Vec<u8>> = (10..20).map(|i| format!("scan/{i}").into_bytes()).collect();
    assert_eq!(tens, expected, "pattern scan/1?");
    let classes: BTreeSet<Vec<u8>> = pages(b"scan/[!0-2][0-4]").await.into_iter().flatten().collect();
    assert_eq!(
        classes,
        [
            b"scan/30".to_vec(),
            b"scan/31".to_vec(),
            b"scan/32".to_vec(),
            b"scan/33".to_vec(),
            b"scan/34".to_vec()
        ]
        .into_iter()
        .collect()
    );

    // Delete keys the pager has not returned yet: they must not come back.
    let mut pager = a
        .client
        .list_keys(b"scan/*".to_vec(), REQUEST_TIMEOUT)
        .expect("list_keys");
    let first = within("a SCAN page", pager.next())
        .await
        .expect("SCAN page")
        .expect("a first page");
    let mut seen: BTreeSet<Vec<u8>> = first.into_iter().collect();
    let unseen: Vec<Vec<u8>> = wanted.difference(&seen).cloned().collect();
    assert!(!unseen.is_empty(), "the first page of 10 cannot hold all 35 keys");
    let deleted: BTreeSet<Vec<u8>> = unseen.iter().step_by(2).cloned().collect();
    for k in &deleted {
        assert_eq!(a.del(k, None).await.expect("DEL"), 1);
    }
    let mut pages_left = 0;
    while let Some(page) = within("a SCAN page", pager.next()).await.expect("SCAN page") {
        pages_left += 1;
        assert!(pages_left < 64, "SCAN did not finish within 64 pages");
        for k in page {
            assert!(
                !deleted.contains(&k),
                "deleted key {:?} came back",
                String::from_utf8_lossy(&k)
            );
            assert!(
                seen.insert(k.clone()),
                "key {:?} returned twice",
                String::from_utf8_lossy(&k)
            );
        }
    }
    let remaining: BTreeSet<Vec<u8>> = wanted.difference(&deleted).cloned().collect();
    assert_eq!(seen, remaining, "every key not deleted exactly once");

    a.close().await;
    env.stop().await;
}

/// Lease: acquire, renew (fresh fencing token), a second holder is refused while held, release,
/// then the second holder gets it; its token fences out the first holder's.
pub(crate) async fn lease_lifecycle(broker: Broker) {
    let env = TestEnv::start(broker).await;
    let a = Sdk::connect(env.broker_port, "aio-lease-a").await;
    let b = Sdk::connect(env.broker_port, "aio-lease-b").await;
    let name: &[u8] = b"lease/one";
    let lease_a = a.lease(name);
    let lease_b = b.lease(name);
    let ttl = Duration::from_secs(30);

    assert_eq!(
        within("get_holder", lease_a.get_holder(REQUEST_TIMEOUT))
            .await
            .expect("get_holder"),
        None
    );
    let t1 = within("acquire", lease_a.acquire(ttl, REQUEST_TIMEOUT, None))
        .await
        .expect("A acquires");
    assert_eq!(lease_a.current_lease_fencing_token().as_ref(), Some(&t1));
    assert_eq!(
        within("get_holder", lease_b.get_holder(REQUEST_TIMEOUT))
            .await
            .expect("get_holder"),
        Some(a.id.clone().into_bytes())
    );

    // Renewal: the holder acquires again and gets a fresh, later token.
    let t2 = within("renew", lease_a.acquire(ttl, REQUEST_TIMEOUT, None))
        .await
        .expect("A renews");
    assert_later(&t2, &t1);
    assert_eq!(lease_a.current_lease_fencing_token().as_ref(), Some(&t2));

    // Held: B is refused.
    let refused = within("acquire", lease_b.acquire(ttl, REQUEST_TIMEOUT, None)).await;
    match refused {
        Err(e) => assert!(
            matches!(e.kind(), leased_lock::ErrorKind::LeaseAlreadyHeld),
            "expected LeaseAlreadyHeld, got {e:?}"
        ),
        Ok(t) => panic!("B acquired a held lease (token {t})"),
    }
    assert_eq!(lease_b.current_lease_fencing_token(), None);
    // B's release is a VDEL with B's name: not applied, the lease stays with A.
    within("release", lease_b.release(REQUEST_TIMEOUT))
        .await
        .expect("B release");
    assert_eq!(
        within("get_holder", lease_b.get_holder(REQUEST_TIMEOUT))
            .await
            .expect("get_holder"),
        Some(a.id.clone().into_bytes())
    );

    // A protects a resource with its token.
    let r = a
        .set_fenced(b"resource", b"by-a", Some(t2.clone()), SetOptions::default())
        .await
        .expect("fenced SET");
    assert!(r.response);

    within("release", lease_a.release(REQUEST_TIMEOUT))
        .await
        .expect("A release");
    assert_eq!(lease_a.current_lease_fencing_token(), None);
    assert_eq!(
        within("get_holder", lease_a.get_holder(REQUEST_TIMEOUT))
            .await
            .expect("get_holder"),
        None
    );

    let t3 = within("acquire", lease_b.acquire(ttl, REQUEST_TIMEOUT, None))
        .await
        .expect("B acquires");
    assert_later(&t3, &t2);
    let r = b
        .set_fenced(b"resource", b"by-b", Some(t3.clone()), SetOptions::default())
        .await
        .expect("fenced SET");
    assert!(r.response);
    assert_rejected(
        a.set_fenced(b"resource", b"stale-a", Some(t2), SetOptions::default())
            .await,
        ServiceError::FencingTokenLowerVersion,
    );
    assert_eq!(b.get(b"resource").await.response.as_deref(), Some(&b"by-b"[..]));
    within("release", lease_b.release(REQUEST_TIMEOUT))
        .await
        .expect("B release");

    a.close().await;
    b.close().await;
    env.stop().await;
}

/// Lock: A holds it; B's `lock()` waits (its SET NEX is refused, seen by a spy); A unlocks;
/// B's wait ends with the lock.
pub(crate) async fn lock_release_handover(broker: Broker) {
    let env = TestEnv::start(broker).await;
    let a = Sdk::connect(env.broker_port, "aio-lock-a").await;
    let b = Sdk::connect(env.broker_port, "aio-lock-b").await;
    let name: &[u8] = b"lock/release";
    let lock_a = a.lock(name);
    let lock_b = b.lock(name);
    let ttl = Duration::from_secs(30);

    let ta = within("A lock", lock_a.lock(ttl, REQUEST_TIMEOUT, None))
        .await
        .expect("A locks");
    assert_eq!(lock_a.current_lock_fencing_token().as_ref(), Some(&ta));

    let mut spy = response_spy(env.broker_port, &b.id).await;
    let waiting = tokio::spawn({
        let lock_b = lock_b.clone();
        async move { lock_b.lock(ttl, REQUEST_TIMEOUT, None).await }
    });
    within("B's refused acquire", await_not_applied(&mut spy)).await;
    assert!(!waiting.is_finished(), "B must wait while A holds the lock");

    within("A unlock", lock_a.unlock(REQUEST_TIMEOUT))
        .await
        .expect("A unlocks");
    let tb = within("B to get the lock", waiting)
        .await
        .expect("B's task")
        .expect("B locks");
    assert_later(&tb, &ta);
    assert_eq!(lock_b.current_lock_fencing_token().as_ref(), Some(&tb));
    assert_eq!(b.get(name).await.response, Some(b.id.clone().into_bytes()));

    within("B unlock", lock_b.unlock(REQUEST_TIMEOUT))
        .await
        .expect("B unlocks");
    assert_eq!(a.get(name).await.response, None);

    a.close().await;
    b.close().await;
    env.stop().await;
}

/// Lock handover by expiry: A takes the lock with a short lease and never renews or unlocks;
/// B's `lock()` is refused once, then gets the lock when A's lease runs out (the service's
/// expiry DELETE notification wakes it).
pub(crate) async fn lock_expiry_handover(broker: Broker) {
    let env = TestEnv::start(broker).await;
    let a = Sdk::connect(env.broker_port, "aio-lockx-a").await;
    let b = Sdk::connect(env.broker_port, "aio-lockx-b").await;
    let name: &[u8] = b"lock/expiry";
    let lock_a = a.lock(name);
    let lock_b = b.lock(name);

    let mut spy = response_spy(env.broker_port, &b.id).await;
    // Long enough for B's first attempt to find the lock held (the spy checks that it did).
    let short = Duration::from_secs(3);
    let ta = within("A lock", lock_a.lock(short, REQUEST_TIMEOUT, None))
        .await
        .expect("A locks");

    let tb = within(
        "B to get the lock after A's lease expires",
        lock_b.lock(Duration::from_secs(30), REQUEST_TIMEOUT, None),
    )
    .await
    .expect("B locks");
    assert_later(&tb, &ta);
    // B's responses, in order: KEYNOTIFY +OK, SET NEX :-1 (A held it), SET NEX +OK, ...: a
    // real handover, not a first-try acquire after A's lease was already gone.
    within(
        "the spy to see B refused once (if this fails, B's first try came after A's lease ended)",
        await_not_applied(&mut spy),
    )
    .await;
    within("the spy to see B's SET NEX granted", async {
        while spy.next().await.payload.as_ref() != b"+OK\r\n" {}
    })
    .await;
    assert_eq!(b.get(name).await.response, Some(b.id.clone().into_bytes()));

    // A's unlock now is a VDEL of A's name: not applied, B keeps the lock.
    within("A unlock", lock_a.unlock(REQUEST_TIMEOUT))
        .await
        .expect("A unlock");
    assert_eq!(b.get(name).await.response, Some(b.id.clone().into_bytes()));
    within("B unlock", lock_b.unlock(REQUEST_TIMEOUT))
        .await
        .expect("B unlocks");

    a.close().await;
    b.close().await;
    env.stop().await;
}

crate::support::every_broker!(
    crud_versions,
    set_conditions,
    fencing_tokens,
    observe_notifications,
    scan_pages,
    lease_lifecycle,
    lock_release_handover,
    lock_expiry_handover,
);
