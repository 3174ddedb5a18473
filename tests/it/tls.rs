//! TLS on every door: HTTPS, gRPC over TLS and MQTTS served with one certificate and verified by
//! real clients (the command-line client, reqwest, rumqttc, the Azure IoT Operations SDK),
//! client certificates, certificate reload under live connections, refused certificates, the
//! service's own `mqtts://user:pass` connection to a Mosquitto with TLS and a password, and
//! plain listeners beyond loopback refused at startup.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use stategate::config::{CertIdentity, Config, MqttTlsListener, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::pki::{self, Ca, Pair};
use crate::support::{Broker, TestEnv, WAIT, unique_id};

const BIN: &str = env!("CARGO_BIN_EXE_stategate");

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// The configuration tweak that turns TLS on with `pair` (and client certificates from `client_ca`).
fn tls(pair: &Pair, client_ca: Option<PathBuf>) -> impl FnOnce(&mut Config) + use<> {
    let files = TlsFiles {
        cert: pair.cert.clone(),
        key: pair.key.clone(),
    };
    move |c: &mut Config| {
        c.net.tls = Some(files);
        c.net.mqtt_tls = Some(MqttTlsListener {
            listen: "127.0.0.1:0".parse().unwrap(),
            client_ca,
            identity: CertIdentity::Cn,
        });
    }
}

struct Ports {
    http: u16,
    grpc: u16,
    mqtts: u16,
}

fn ports(env: &TestEnv) -> Ports {
    let s = env.service.as_ref().unwrap();
    Ports {
        http: s.http_addr().unwrap().port(),
        grpc: s.grpc_addr().unwrap().port(),
        mqtts: s.embedded_broker().unwrap().tls_addr().unwrap().port(),
    }
}

/// Runs the command-line client; (exit code, stdout, stderr).
async fn cli(args: &[&str]) -> (i32, String, String) {
    let mut c = tokio::process::Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("STATEGATE_") {
            c.env_remove(k);
        }
    }
    // No system roots to fall back on: only --ca-file can make a certificate trusted.
    c.env("SSL_CERT_FILE", "/nonexistent")
        .env("SSL_CERT_DIR", "/nonexistent");
    c.args(args).args(["--timeout", "5s"]).kill_on_drop(true);
    let out = within("the command-line client", c.output()).await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A reqwest client that trusts `ca` only.
fn https_client(ca: &Path) -> reqwest::Client {
    let config = stategate::tls::client_config(Some(ca), &[b"http/1.1"]).unwrap();
    reqwest::Client::builder()
        .use_preconfigured_tls(Arc::unwrap_or_clone(config))
        .build()
        .unwrap()
}

/// A raw TLS connection to `port` trusting `ca`; returns the stream and the server's leaf.
async fn tls_connect(
    port: u16,
    ca: &Path,
    alpn: &[&[u8]],
) -> std::io::Result<(tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Vec<u8>)> {
    let config = stategate::tls::client_config(Some(ca), alpn).unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    Ok((tls, leaf))
}

/// One HTTP/1.1 GET of the health route on an open connection; the status code.
async fn health_on<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(s: &mut S) -> u16 {
    s.write_all(b"GET /v1.0/healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = within("a health answer", s.read(&mut buf)).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
    head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// An MQTT5 client over TLS, optionally with a client certificate; the CONNACK code or the
/// connection error.
async fn mqtts_connect(
    port: u16,
    ca: &Path,
    client: Option<&Pair>,
) -> Result<(AsyncClient, tokio::task::JoinHandle<()>), String> {
    let roots = stategate::tls::load_roots(ca).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(stategate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(p) => builder
            .with_client_auth_cert(
                stategate::tls::load_certs(&p.cert).unwrap(),
                stategate::tls::load_key(&p.key).unwrap(),
            )
            .unwrap(),
    };
    let mut o = MqttOptions::new(unique_id("mqtts"), "localhost", port);
    o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(
        Arc::new(config),
    )));
    let (client, mut events) = AsyncClient::new(o, 16);
    let connack = within("a CONNACK or an error", async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(c))) => return Ok(c.code),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await?;
    if connack != ConnectReturnCode::Success {
        return Err(format!("CONNACK {connack:?}"));
    }
    let poller = tokio::spawn(async move { while events.poll().await.is_ok() {} });
    Ok((client, poller))
}

#[tokio::test]
async fn https_grpc_tls_and_mqtts_are_served_and_verified_by_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("stategate test CA");
    let ca_file = ca.write(dir.path(), "ca");
    let env = TestEnv::start_with(Broker::Embedded, tls(&ca.server(dir.path(), "server"), None)).await;
    let p = ports(&env);
    let ca_arg = ca_file.to_str().unwrap();
    let mqtts = format!("mqtts://localhost:{}", p.mqtts);
    let https = format!("https://localhost:{}", p.http);
    let grpcs = format!("https://localhost:{}", p.grpc);

    let (code, _, err) = cli(&["set", "tls-k", "over-mqtts", "--mqtt-url", &mqtts, "--ca-file", ca_arg]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&["get", "tls-k", "--http", &https, "--ca-file", ca_arg]).await;
    assert_eq!((code, out.as_str()), (0, "over-mqtts"), "{err}");
    let (code, _, err) = cli(&["set", "tls-k", "over-grpc", "--grpc", &grpcs, "--ca-file", ca_arg]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&["get", "tls-k", "--mqtt-url", &mqtts, "--ca-file", ca_arg]).await;
    assert_eq!((code, out.as_str()), (0, "over-grpc"), "{err}");

    // Verification is on by default: without the CA, every door refuses the certificate.
    for door in [["--mqtt-url", &mqtts], ["--http", &https], ["--grpc", &grpcs]] {
        let (code, _, err) = cli(&["get", "tls-k", door[0], door[1]]).await;
        assert_eq!(code, 5, "{door:?} must fail verification: {err}");
        assert!(
            err.to_lowercase().contains("certificate") || err.contains("UnknownIssuer"),
            "{door:?}: {err}"
        );
    }
    // The TLS doors speak only TLS.
    let plain = reqwest::get(format!("http://127.0.0.1:{}/v1.0/healthz", p.http)).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
    env.stop().await;
}

#[tokio::test]
async fn the_aio_sdk_connects_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("stategate test CA");
    let ca_file = ca.write(dir.path(), "ca");
    let env = TestEnv::start_with(Broker::Embedded, tls(&ca.server(dir.path(), "server"), None)).await;
    let settings = MqttConnectionSettingsBuilder::default()
        .client_id(unique_id("aio-tls"))
        .hostname("localhost")
        .tcp_port(ports(&env).mqtts)
        .use_tls(true)
        .ca_file(Some(ca_file.display().to_string()))
        .build()
        .unwrap();
    let session = Session::new(
        SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()
            .unwrap(),
    )
    .unwrap();
    let client = state_store::Client::new(
        ApplicationContextBuilder::default().build().unwrap(),
        session.create_managed_client(),
        session.create_session_monitor(),
        state_store::ClientOptionsBuilder::default().build().unwrap(),
    )
    .unwrap();
    let monitor = session.create_session_monitor();
    let exit = session.create_exit_handle();
    let run = tokio::spawn(session.run());
    within("the SDK session to connect over TLS", monitor.connected()).await;
    let t = Duration::from_secs(5);
    let set = within(
        "SET",
        client.set(b"aio-tls".to_vec(), b"v".to_vec(), t, None, Default::default()),
    )
    .await
    .unwrap();
    assert!(set.response && set.version.is_some());
    let got = within("GET", client.get(b"aio-tls".to_vec(), t)).await.unwrap();
    assert_eq!(got.response, Some(b"v".to_vec()));
    let version = got.version.expect("a version");
    // The same key and version through the engine (the in-broker door served the SDK).
    let entry = env
        .engine()
        .read(&bytes::Bytes::from_static(b"aio-tls"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.version.to_string(), version.to_string());
    drop(client);
    let _ = exit.try_exit();
    let _ = within("the SDK session to end", run).await;
    env.stop().await;
}

#[tokio::test]
async fn client_certificates_are_required_and_their_cn_is_the_username() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("stategate test CA");
    let ca_file = ca.write(dir.path(), "ca");
    let clients_ca = Ca::new("clients CA");
    let clients_ca_file = clients_ca.write(dir.path(), "clients-ca");
    let env = TestEnv::start_with(
        Broker::Embedded,
        tls(&ca.server(dir.path(), "server"), Some(clients_ca_file)),
    )
    .await;
    let port = ports(&env).mqtts;
    let broker = env.service.as_ref().unwrap().embedded_broker().unwrap();

    let good = clients_ca.client(dir.path(), "sensor", "sensor-17");
    let (client, poller) = mqtts_connect(port, &ca_file, Some(&good))
        .await
        .expect("the right certificate is accepted");
    let clients = broker.clients().await;
    assert!(
        clients.iter().any(|(_, user)| user.as_deref() == Some("sensor-17")),
        "the certificate's CN is the MQTT username: {clients:?}"
    );
    // Missing, and from a CA the broker does not trust: refused in the handshake.
    let missing = mqtts_connect(port, &ca_file, None).await;
    assert!(missing.is_err(), "no client certificate must be refused");
    let stranger = ca.client(dir.path(), "stranger", "sensor-17");
    let wrong = mqtts_connect(port, &ca_file, Some(&stranger)).await;
    assert!(wrong.is_err(), "a certificate from another CA must be refused");
    let _ = client.disconnect().await;
    poller.abort();
    env.stop().await;

    // With a password file too: the certificate is the proof, no password needed; a client
    // without a certificate cannot get in on the MQTTS listener, nor anonymously on the plain one.
    let users = dir.path().join("users");
    let mut passwd = tokio::process::Command::new(BIN)
        .arg("passwd")
        .arg(&users)
        .arg("someone-else")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    passwd.stdin.take().unwrap().write_all(b"a-password\n").await.unwrap();
    assert!(within("stategate passwd", passwd.wait()).await.unwrap().success());
    let with_users = tls(
        &ca.server(dir.path(), "server2"),
        Some(clients_ca.write(dir.path(), "clients-ca")),
    );
    let env = TestEnv::start_with(Broker::Embedded, move |c| {
        with_users(c);
        c.access.mqtt_auth_file = Some(users);
    })
    .await;
    let port = ports(&env).mqtts;
    let (client, poller) = mqtts_connect(port, &ca_file, Some(&good))
        .await
        .expect("a verified certificate needs no password");
    assert!(mqtts_connect(port, &ca_file, None).await.is_err());
    let mut anonymous = MqttOptions::new(unique_id("anon"), "127.0.0.1", env.broker_port);
    anonymous.set_keep_alive(Duration::from_secs(5));
    let (_anon, mut events) = AsyncClient::new(anonymous, 4);
    let refused = within("the anonymous CONNACK", async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(c))) => return c.code,
                Ok(_) => {}
                Err(rumqttc::v5::ConnectionError::ConnectionRefused(code)) => return code,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    assert_ne!(refused, ConnectReturnCode::Success);
    let _ = client.disconnect().await;
    poller.abort();
    env.stop().await;
}

#[tokio::test]
async fn a_new_certificate_is_served_to_new_connections_and_old_ones_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("stategate test CA");
    let ca_file = ca.write(dir.path(), "ca");
    let first = ca.server(dir.path(), "live");
    let env = TestEnv::start_with(Broker::Embedded, tls(&first, None)).await;
    let p = ports(&env);
    let running = env.service.as_ref().unwrap();
    let mut reloads = running.cert_reloads().unwrap();
    let mut rebinds = running.embedded_broker().unwrap().tls_rebinds().unwrap();

    let (mut old_https, leaf) = tls_connect(p.http, &ca_file, &[b"http/1.1"]).await.unwrap();
    assert_eq!(leaf, pki::der_of(&first.cert_pem));
    assert_eq!(health_on(&mut old_https).await, 204);
    let (old_mqtt, old_poller) = mqtts_connect(p.mqtts, &ca_file, None).await.unwrap();

    // Replace the files in place (as a certificate manager does) and await the file watcher.
    let second = ca.server(dir.path(), "live");
    within("the certificate reload", reloads.changed()).await.unwrap();
    within("the MQTTS listener to rebind", rebinds.changed()).await.unwrap();

    for port in [p.http, p.grpc] {
        let alpn: &[&[u8]] = if port == p.http { &[b"http/1.1"] } else { &[b"h2"] };
        let (_, leaf) = tls_connect(port, &ca_file, alpn).await.unwrap();
        assert_eq!(
            leaf,
            pki::der_of(&second.cert_pem),
            "port {port} serves the new certificate"
        );
    }
    let (_, leaf) = tls_connect(p.mqtts, &ca_file, &[]).await.unwrap();
    assert_eq!(leaf, pki::der_of(&second.cert_pem), "MQTTS serves the new certificate");
    // The connections opened before the reload still work.
    assert_eq!(health_on(&mut old_https).await, 204);
    old_mqtt
        .subscribe("still/here", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await
        .expect("the old MQTTS connection is still open");
    let (code, _, err) = cli(&[
        "set",
        "after-reload",
        "1",
        "--mqtt-url",
        &format!("mqtts://localhost:{}", p.mqtts),
        "--ca-file",
        ca_file.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    old_poller.abort();
    env.stop().await;
}

#[tokio::test]
async fn expired_and_self_signed_certificates_are_refused_by_verifying_clients() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("stategate test CA");
    let ca_file = ca.write(dir.path(), "ca");
    for pair in [
        ca.expired_server(dir.path(), "expired"),
        pki::self_signed_server(dir.path(), "self"),
    ] {
        let env = TestEnv::start_with(Broker::Embedded, tls(&pair, None)).await;
        let p = ports(&env);
        let err = https_client(&ca_file)
            .get(format!("https://localhost:{}/v1.0/healthz", p.http))
            .send()
            .await
            .expect_err("the certificate must be refused");
        assert!(format!("{err:?}").contains("Certificate"), "{err:?}");
        let (code, _, err) = cli(&[
            "get",
            "k",
            "--grpc",
            &format!("https://localhost:{}", p.grpc),
            "--ca-file",
            ca_file.to_str().unwrap(),
        ])
        .await;
        assert_eq!(code, 5, "{err}");
        assert!(mqtts_connect(p.mqtts, &ca_file, None).await.is_err());
        env.stop().await;
    }
}

/// A Mosquitto with a TLS listener and a password file, stopped on drop.
struct SecureMosquitto {
    port: u16,
    child: std::process::Child,
}

impl Drop for SecureMosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn secure_mosquitto(dir: &Path, server: &Pair, ca: &Path, user: &str, password: &str) -> SecureMosquitto {
    let passwd = dir.join("passwd");
    let made = std::process::Command::new("mosquitto_passwd")
        .args(["-b", "-c"])
        .arg(&passwd)
        .args([user, password])
        .status()
        .expect("mosquitto_passwd (mosquitto-clients) runs");
    assert!(made.success());
    for _attempt in 0..5 {
        let port = crate::support::free_port();
        let conf = dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "user root\nlistener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\ncafile {}\ncertfile {}\nkeyfile {}\npersistence false\n",
                passwd.display(),
                ca.display(),
                server.cert.display(),
                server.key.display()
            ),
        )
        .unwrap();
        let mut child = std::process::Command::new("mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("mosquitto runs");
        let deadline = std::time::Instant::now() + WAIT;
        while std::time::Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return SecureMosquitto { port, child };
            }
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("mosquitto with TLS did not start");
}

#[tokio::test]
async fn the_service_reaches_an_external_broker_over_mqtts_with_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("broker CA");
    let ca_file = ca.write(dir.path(), "ca");
    let broker = secure_mosquitto(
        dir.path(),
        &ca.server(dir.path(), "broker"),
        &ca_file,
        "svc",
        "p@ss word",
    );
    let url = format!("mqtts://svc:p%40ss%20word@localhost:{}", broker.port);
    let (url_for_service, ca_for_service) = (url.clone(), ca_file.clone());
    let env = TestEnv::start_with(Broker::Embedded, move |c| {
        let defaults = stategate::config::ServeArgs::default();
        let args = stategate::config::ServeArgs {
            mqtt_url: Some(url_for_service),
            net: stategate::config::NetArgs {
                mqtt_ca_file: Some(ca_for_service),
                ..defaults.net.clone()
            },
            storage: stategate::storage::StorageKind::Memory,
            http_listen: "127.0.0.1:0".into(),
            grpc_listen: "127.0.0.1:0".into(),
            ..defaults
        };
        *c = Config::from_args(args).unwrap();
    })
    .await;
    // A client through the same broker (TLS, password) reaches the service.
    let ca_arg = ca_file.to_str().unwrap();
    let (code, _, err) = cli(&["set", "via-mosquitto", "x", "--mqtt-url", &url, "--ca-file", ca_arg]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = cli(&["get", "via-mosquitto", "--mqtt-url", &url, "--ca-file", ca_arg]).await;
    assert_eq!((code, out.as_str()), (0, "x"));
    // A wrong password is refused by the broker: the client says it is not authorized.
    let bad = format!("mqtts://svc:wrong@localhost:{}", broker.port);
    let (code, _, err) = cli(&["get", "via-mosquitto", "--mqtt-url", &bad, "--ca-file", ca_arg]).await;
    assert_ne!(code, 0, "{err}");
    env.stop().await;
}

#[tokio::test]
async fn a_plain_listener_beyond_loopback_stops_the_service_at_startup() {
    for flags in [
        &["--http-listen", "0.0.0.0:0"][..],
        &["--grpc-listen", "0.0.0.0:0"][..],
        &["--mqtt-listen", "0.0.0.0:0"][..],
    ] {
        let out = within(
            "the service to refuse its flags",
            tokio::process::Command::new(BIN)
                .args(["--storage", "memory"])
                .args(flags)
                .env_remove("STATEGATE_ALLOW_INSECURE_LISTEN")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {err}");
        assert!(
            err.contains(flags[0]) && err.contains("--allow-insecure-listen"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn sighup_reloads_the_certificate_of_the_real_binary() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("stategate test CA");
    let ca_file = ca.write(dir.path(), "ca");
    let first = ca.server(dir.path(), "live");
    let mut child = tokio::process::Command::new(BIN)
        .args([
            "--storage",
            "memory",
            "--mqtt-listen",
            "127.0.0.1:0",
            "--mqtt-tls-listen",
            "127.0.0.1:0",
        ])
        .args([
            "--grpc-listen",
            "off",
            "--http-listen",
            // Port 0, read back from the log: a port picked beforehand can be taken by
            // another test before the service binds it.
            "127.0.0.1:0",
        ])
        .arg("--tls-cert")
        .arg(&first.cert)
        .arg("--tls-key")
        .arg(&first.key)
        .env("RUST_LOG", "stategate=info")
        .env("NO_COLOR", "1")
        // The service logs to stderr.
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap() as i32;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut wait_for = async |needle: &str| {
        within(needle, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains(needle) {
                    return line;
                }
            }
            panic!("the service ended before logging {needle:?}");
        })
        .await
    };
    let bound = wait_for("HTTP door (Dapr state API) listening").await;
    let http_port: u16 = bound
        .split("bound=127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no bound port in {bound:?}"));
    wait_for("stategate is serving").await;
    let (mut old, leaf) = tls_connect(http_port, &ca_file, &[b"http/1.1"]).await.unwrap();
    assert_eq!(leaf, pki::der_of(&first.cert_pem));
    // SIGHUP with the files unchanged: a reload all the same, and the process lives on.
    // SAFETY: kill(2) on the child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let line = wait_for("TLS certificate reloaded").await;
    assert!(line.contains("SIGHUP"), "{line}");
    assert_eq!(health_on(&mut old).await, 204, "the open connection keeps working");
    let (_, leaf) = tls_connect(http_port, &ca_file, &[b"http/1.1"]).await.unwrap();
    assert_eq!(leaf, pki::der_of(&first.cert_pem));
    let _ = child.start_kill();
}
