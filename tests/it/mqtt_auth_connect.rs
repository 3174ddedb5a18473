//! What the embedded broker checks at CONNECT, before a session exists: a certificate login's
//! identity comes from the certificate, a Will may not go where its client may not publish
//! (the state topics: `state_topics_guard`), client ids bound to identities
//! (`--mqtt-bind-client-id`), and the service's own client id.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, LastWill, Packet};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, MqttOptions};
use stategate::config::{BrokerChoice, CertIdentity, Config, MqttTlsListener, TlsFiles};
use stategate::mqtt::NOTIFY_TOPIC_PREFIX;

use crate::mqtt_auth::{password_file, secured};
use crate::pki::{Ca, Pair};
use crate::support::{Broker, INVOKE, RawClient, TestEnv, WAIT, now_ts, prop, unique_id};

/// A connected client; its event loop is polled until dropped (dropping it closes the socket
/// without a DISCONNECT, so the broker publishes its Will).
pub(crate) struct Connected {
    _client: AsyncClient,
    poller: tokio::task::JoinHandle<()>,
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

/// Connects with `o`: the client, or the refusal (the CONNACK code or the connection error).
pub(crate) async fn connect(mut o: MqttOptions) -> Result<Connected, String> {
    o.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(o, 16);
    let outcome = tokio::time::timeout(WAIT, async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(c))) if c.code == ConnectReturnCode::Success => return Ok(()),
                Ok(Event::Incoming(Packet::ConnAck(c))) => return Err(format!("{:?}", c.code)),
                Ok(_) => {}
                Err(ConnectionError::ConnectionRefused(code)) => return Err(format!("{code:?}")),
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await
    .expect("a CONNACK or an error in time");
    outcome?;
    let poller = tokio::spawn(async move { while events.poll().await.is_ok() {} });
    Ok(Connected {
        _client: client,
        poller,
    })
}

/// Options for an MQTTS connection to `port` trusting `ca`, with `cert` as client certificate.
fn mqtts(id: &str, port: u16, ca: &Path, cert: &Pair) -> MqttOptions {
    let roots = stategate::tls::load_roots(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(stategate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            stategate::tls::load_certs(&cert.cert).unwrap(),
            stategate::tls::load_key(&cert.key).unwrap(),
        )
        .unwrap();
    let mut o = MqttOptions::new(id, "localhost", port);
    o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(
        Arc::new(config),
    )));
    o
}

/// TLS on, client certificates from `clients_ca` required on MQTTS, named by `identity`.
fn mtls(server: &Pair, clients_ca: PathBuf, identity: CertIdentity) -> impl FnOnce(&mut Config) + use<> {
    let files = TlsFiles {
        cert: server.cert.clone(),
        key: server.key.clone(),
    };
    move |c: &mut Config| {
        c.net.tls = Some(files);
        c.net.mqtt_tls = Some(MqttTlsListener {
            listen: "127.0.0.1:0".parse().unwrap(),
            client_ca: Some(clients_ca),
            identity,
        });
    }
}

fn mqtts_port(env: &TestEnv) -> u16 {
    let broker = env.service.as_ref().unwrap().embedded_broker().unwrap();
    broker.tls_addr().unwrap().port()
}

fn refused(r: Result<impl Sized, String>, what: &str) -> String {
    match r {
        Ok(_) => panic!("{what} was accepted"),
        Err(e) => e,
    }
}

/// A CA-signed certificate whose subject is empty (its only name a subjectAltName) names
/// nobody: the broker used to keep the username the client typed, so it logged in as `ops`
/// without a password. Now a certificate login takes its identity from the certificate's
/// configured field, and a certificate without one is refused, with or without a password file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_without_its_identity_field_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("server CA");
    let ca_file = ca.write(dir.path(), "ca");
    let clients_ca = Ca::new("clients CA");
    let clients_ca_file = clients_ca.write(dir.path(), "clients-ca");
    let users = password_file(dir.path(), &[("ops", "ops-password")]);
    let nameless = clients_ca.client_without_subject(dir.path(), "nameless", "sensor-9.example");
    let named = clients_ca.client(dir.path(), "named", "sensor-9");
    let server = ca.server(dir.path(), "server");
    for (identity, passwords, expected) in [
        (CertIdentity::Cn, true, "sensor-9"),
        (CertIdentity::Subject, true, "CN=sensor-9"),
        (CertIdentity::Cn, false, "sensor-9"),
    ] {
        let tweak = mtls(&server, clients_ca_file.clone(), identity);
        let users = users.clone();
        let env = TestEnv::start_with(Broker::Embedded, move |c| {
            tweak(c);
            c.access.mqtt_auth_file = passwords.then_some(users);
        })
        .await;
        let port = mqtts_port(&env);
        let case = format!("{identity:?}, password file: {passwords}");
        for user in [Some("ops"), None] {
            let mut o = mqtts(&unique_id("nameless"), port, &ca_file, &nameless);
            if let Some(user) = user {
                o.set_credentials(user, "");
            }
            let e = refused(
                connect(o).await,
                &format!("a nameless certificate as {user:?} ({case})"),
            );
            assert!(e.contains("NotAuthorized"), "{case}: {e}");
        }
        // A certificate with the field gets in as the certificate says, whatever was typed.
        let mut o = mqtts(&unique_id("named"), port, &ca_file, &named);
        o.set_credentials("ops", "");
        let _named = connect(o).await.unwrap_or_else(|e| panic!("{case}: {e}"));
        let clients = env.service.as_ref().unwrap().embedded_broker().unwrap().clients().await;
        let users: Vec<_> = clients.iter().map(|(_, u)| u.as_deref()).collect();
        assert_eq!(users, vec![Some(expected)], "{case}");
        env.stop().await;
    }
}

/// rmqtt publishes a Will without the publish ACL hook: a Will on another client's
/// notification topic forged a KEYNOTIFY notification when its client dropped, and one on the
/// invoke topic a request nobody could attribute. Both are refused at CONNECT; an ordinary Will
/// is still published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_where_its_client_may_not_publish_is_refused_at_connect() {
    let dir = tempfile::tempdir().unwrap();
    let users = [("a", "pw-a"), ("b", "pw-b")];
    let rules = "[[rule]]\nusernames = [\"*\"]\nallow = [\"read\", \"write\", \"observe\"]\nkeys = [\"*\"]\n";
    let env = secured(dir.path(), &users, Some(rules)).await;
    let port = env.broker_port;
    let mut b = RawClient::connect_as(port, "client-b", Some(("b", "pw-b")))
        .await
        .unwrap();
    let b_hex = hex::encode_upper("client-b");
    let r = b.request(&[b"KEYNOTIFY", b"k"], &[]).await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    b.subscribe(&format!("{NOTIFY_TOPIC_PREFIX}/{b_hex}/command/notify/+"))
        .await;

    let notify = format!(
        "{NOTIFY_TOPIC_PREFIX}/{b_hex}/command/notify/{}",
        hex::encode_upper("k")
    );
    let fake = stategate::resp3::encode_request([&b"NOTIFY"[..], b"SET", b"VALUE", b"forged"]);
    for topic in [notify.as_str(), INVOKE] {
        let mut o = MqttOptions::new(unique_id("forger"), "127.0.0.1", port);
        o.set_credentials("a", "pw-a");
        o.set_last_will(LastWill::new(topic, fake.to_vec(), QoS::AtLeastOnce, false, None));
        let forger = connect(o).await;
        // Accepted, it would be dropped here and its Will published.
        let e = refused(forger, &format!("a Will on {topic}"));
        assert!(e.contains("NotAuthorized"), "{topic}: {e}");
    }

    // An ordinary Will is accepted and published when its client drops.
    let mut watcher = RawClient::connect_as(port, "watcher", Some(("a", "pw-a")))
        .await
        .unwrap();
    watcher.subscribe("wills/honest").await;
    let mut o = MqttOptions::new(unique_id("honest"), "127.0.0.1", port);
    o.set_credentials("a", "pw-a");
    o.set_last_will(LastWill::new("wills/honest", "gone", QoS::AtLeastOnce, false, None));
    drop(connect(o).await.expect("an ordinary Will is accepted"));
    let will = watcher.next().await;
    assert_eq!(
        (&will.topic[..], &will.payload[..]),
        (&b"wills/honest"[..], &b"gone"[..])
    );

    // The next thing b sees is the real notification.
    let r = watcher.request(&[b"SET", b"k", b"real"], &[("__ts", &now_ts())]).await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    let n = b.next().await;
    assert!(n.payload.ends_with(b"real\r\n"), "{:?}", n.payload);
    env.stop().await;
}

/// With `{clientId}` rules a client id is the key to a device's data, and without binding any
/// authenticated client may type any id: `dev-1` connecting as `dev-2` read and wrote dev-2's
/// keys and took over its session. `--mqtt-bind-client-id`: an id must be the identity, or
/// start with it and `:`; certificate identities are bound the same way, anonymous clients
/// have nothing to bind to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_binding_a_client_id_belongs_to_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let passwd = password_file(dir.path(), &[("dev-1", "pw-1"), ("dev-2", "pw-2")]);
    let acl = dir.path().join("acl.toml");
    let rules = "[[rule]]\nusernames = [\"dev-*\"]\nallow = [\"read\", \"write\", \"observe\"]\nkeys = [\"devices/{clientId}/*\"]\n";
    std::fs::write(&acl, rules).unwrap();
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.access.mqtt_auth_file = Some(passwd);
        c.access.acl_file = Some(acl);
        c.access.bind_client_id = true;
    })
    .await;
    let port = env.broker_port;
    let mut dev2 = RawClient::connect_as(port, "dev-2", Some(("dev-2", "pw-2")))
        .await
        .expect("a device's own id");
    let r = dev2
        .request(&[b"SET", b"devices/dev-2/t", b"secret"], &[("__ts", &now_ts())])
        .await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    for id in ["dev-2", "dev-2:x", "dev-1x", "dev-1-2", "x:dev-1", "dev-"] {
        let e = refused(
            RawClient::connect_as(port, id, Some(("dev-1", "pw-1"))).await,
            &format!("dev-1 as client id {id}"),
        );
        assert!(e.contains("NotAuthorized"), "{id}: {e}");
    }
    // dev-2 kept its session: nobody took it over.
    let r = dev2.request(&[b"GET", b"devices/dev-2/t"], &[]).await;
    assert_eq!(&r.payload[..], b"$6\r\nsecret\r\n");
    for id in ["dev-1", "dev-1:logger"] {
        let mut c = RawClient::connect_as(port, id, Some(("dev-1", "pw-1")))
            .await
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let key = format!("devices/{id}/t");
        let r = c.request(&[b"SET", key.as_bytes(), b"v"], &[("__ts", &now_ts())]).await;
        assert_eq!(prop(&r, "__stat"), Some("200"), "{id}");
    }
    env.stop().await;

    // A certificate's identity binds the same way; anonymous clients have none.
    let ca = Ca::new("server CA");
    let ca_file = ca.write(dir.path(), "ca");
    let clients_ca = Ca::new("clients CA");
    let tweak = mtls(
        &ca.server(dir.path(), "server"),
        clients_ca.write(dir.path(), "clients-ca"),
        CertIdentity::Cn,
    );
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        tweak(c);
        c.access.bind_client_id = true;
    })
    .await;
    let port = mqtts_port(&env);
    let sensor = clients_ca.client(dir.path(), "sensor", "sensor-9");
    let _bound = connect(mqtts("sensor-9:a", port, &ca_file, &sensor))
        .await
        .expect("an id under the certificate's identity");
    let e = refused(connect(mqtts("sensor-8", port, &ca_file, &sensor)).await, "another id");
    assert!(e.contains("NotAuthorized"), "{e}");
    let e = refused(
        RawClient::connect_as(env.broker_port, "sensor-9", None).await,
        "an anonymous client",
    );
    assert!(e.contains("NotAuthorized"), "{e}");
    env.stop().await;
}

/// Binding binds ids to identities someone verified, and to none another identity's ids can
/// look like. With client certificates but no password file, a username on the plain listener
/// was whatever the client typed, so `sensor-9` took sensor-9's ids by typing its name; and
/// certificate identities may contain the separator, so CN `sensor` owned the ids of CN
/// `sensor:1` (which owned them too). Now typed names bind nothing, and an identity with `:`
/// binds nothing (docs/security.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_needs_a_verified_identity_without_the_separator() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("server CA");
    let ca_file = ca.write(dir.path(), "ca");
    let clients_ca = Ca::new("clients CA");
    let tweak = mtls(
        &ca.server(dir.path(), "server"),
        clients_ca.write(dir.path(), "clients-ca"),
        CertIdentity::Cn,
    );
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        tweak(c);
        c.access.bind_client_id = true;
    })
    .await;
    let e = refused(
        RawClient::connect_as(env.broker_port, "sensor-9", Some(("sensor-9", "typed"))).await,
        "a typed username on the plain listener",
    );
    assert!(e.contains("NotAuthorized"), "{e}");
    let port = mqtts_port(&env);
    let colon = clients_ca.client(dir.path(), "colon", "sensor:1");
    for id in ["sensor:1", "sensor:1:a"] {
        let e = refused(
            connect(mqtts(id, port, &ca_file, &colon)).await,
            &format!("CN sensor:1 as {id}"),
        );
        assert!(e.contains("NotAuthorized"), "{id}: {e}");
    }
    let sensor = clients_ca.client(dir.path(), "sensor", "sensor");
    let _own = connect(mqtts("sensor:1", port, &ca_file, &sensor))
        .await
        .expect("CN sensor's own id space");
    env.stop().await;
}

/// With `--mqtt-client-path` the service's own connection is exempt from the topic ACLs: a
/// client connecting with the service's client id could read every request, and took over the
/// service's session (knocking it offline). In-broker serving has no session of its own, but
/// the id signs every answer. The id is refused to every client, with whatever credentials; the
/// service proves itself with a secret made at startup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_client_id_is_refused_to_every_client() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[[rule]]\nanonymous = true\nallow = [\"read\", \"write\"]\nkeys = [\"*\"]\n",
    )
    .unwrap();
    for client_path in [true, false] {
        let acl = acl.clone();
        let env = TestEnv::start_with(Broker::Embedded, |c| {
            c.broker = BrokerChoice::Embedded {
                listen: "127.0.0.1:0".parse().unwrap(),
                client_path,
            };
            c.mqtt.client_id = "the-service".into();
            c.access.acl_file = Some(acl);
        })
        .await;
        let port = env.broker_port;
        for credentials in [None, Some(("the-service", "a-guess"))] {
            let e = refused(
                RawClient::connect_as(port, "the-service", credentials).await,
                &format!("the service's id with {credentials:?} (client path: {client_path})"),
            );
            assert!(e.contains("NotAuthorized"), "{e}");
        }
        // The service was not knocked offline: requests are still answered, by it.
        let mut c = RawClient::connect(port, &unique_id("after")).await;
        let r = c.request(&[b"SET", b"k", b"v"], &[("__ts", &now_ts())]).await;
        assert_eq!(prop(&r, "__stat"), Some("200"), "client path: {client_path}");
        assert_eq!(prop(&r, "__srcId"), Some("the-service"));
        let ids = env
            .service
            .as_ref()
            .unwrap()
            .embedded_broker()
            .unwrap()
            .client_ids()
            .await;
        assert_eq!(ids.iter().any(|id| id == "the-service"), client_path, "{ids:?}");
        env.stop().await;
    }
}
