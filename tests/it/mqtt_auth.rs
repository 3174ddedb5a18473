//! Embedded broker authentication and topic ACLs: password file, `stategate passwd`, the AIO
//! SDK with username and password, refused subscriptions and publishes, forged identities.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store::{self, Operation, SetOptions};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{PubAckReason, PublishProperties, SubscribeReasonCode};
use stategate::mqtt::NOTIFY_TOPIC_PREFIX;

use crate::support::{Broker, INVOKE, RawClient, TestEnv, WAIT, prop, unique_id};

/// A password file with `users`, written as `stategate passwd` would.
pub fn password_file(dir: &Path, users: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("passwd");
    let lines: Vec<String> = users
        .iter()
        .map(|(u, p)| stategate::access::identity::hash_entry(u, p.as_bytes()).unwrap())
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// The embedded broker with a password file (and rules, if given).
pub async fn secured(dir: &Path, users: &[(&str, &str)], rules: Option<&str>) -> TestEnv {
    let passwd = password_file(dir, users);
    let acl = rules.map(|r| {
        let p = dir.join("acl.toml");
        std::fs::write(&p, r).unwrap();
        p
    });
    TestEnv::start_with(Broker::Embedded, |c| {
        c.access.mqtt_auth_file = Some(passwd);
        c.access.acl_file = acl;
    })
    .await
}

fn refused(r: Result<RawClient, String>) -> String {
    match r {
        Ok(c) => panic!("client {} was accepted", c.id),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_and_wrong_passwords_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let env = secured(dir.path(), &[("alice", "wonderland")], None).await;
    let port = env.broker_port;
    let e = refused(RawClient::connect_as(port, "anon", None).await);
    assert!(e.contains("NotAuthorized"), "{e}");
    let e = refused(RawClient::connect_as(port, "a1", Some(("alice", "wrong"))).await);
    assert!(e.contains("BadUserNamePassword"), "{e}");
    let e = refused(RawClient::connect_as(port, "a2", Some(("mallory", "wonderland"))).await);
    assert!(e.contains("BadUserNamePassword"), "{e}");
    let mut ok = RawClient::connect_as(port, "a3", Some(("alice", "wonderland")))
        .await
        .expect("the right password is accepted");
    let r = ok
        .request(&[b"SET", b"k", b"v"], &[("__ts", &crate::support::now_ts())])
        .await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    env.stop().await;
}

fn passwd(file: &Path, args: &[&str], stdin: &str) -> (i32, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .arg("passwd")
        .arg(file)
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwd_round_trip_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users");
    assert_eq!(passwd(&file, &["alice"], "first\n"), (0, "added alice\n".into()));
    assert_eq!(passwd(&file, &["bob"], "builder\n").0, 0);
    assert_eq!(passwd(&file, &["alice"], "second\n"), (0, "updated alice\n".into()));
    let (code, err) = passwd(&file, &["carol"], "\n");
    assert_eq!(code, 64, "{err}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        !text.contains("second") && !text.contains("builder"),
        "no plain passwords: {text}"
    );

    let env = TestEnv::start_with(Broker::Embedded, |c| c.access.mqtt_auth_file = Some(file.clone())).await;
    let port = env.broker_port;
    refused(RawClient::connect_as(port, "c1", Some(("alice", "first"))).await);
    RawClient::connect_as(port, "c2", Some(("alice", "second")))
        .await
        .unwrap();
    RawClient::connect_as(port, "c3", Some(("bob", "builder")))
        .await
        .unwrap();

    // Removing bob takes effect on reload (what SIGHUP calls), not before.
    assert_eq!(passwd(&file, &["bob", "--delete"], "").0, 0);
    let access = env.service.as_ref().unwrap().access().clone();
    let before = access.reloads();
    access.reload().expect("reload");
    assert_eq!(access.reloads(), before + 1);
    refused(RawClient::connect_as(port, "c4", Some(("bob", "builder"))).await);
    // A broken file is refused by reload, naming the line; the users in force stay.
    std::fs::write(&file, format!("{text}garbage\n")).unwrap();
    let e = access.reload().unwrap_err().to_string();
    assert!(e.contains(&format!("{}:3:", file.display())), "{e}");
    assert_eq!(access.reloads(), before + 1);
    RawClient::connect_as(port, "c5", Some(("alice", "second")))
        .await
        .unwrap();
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_connects_with_username_and_password() {
    let dir = tempfile::tempdir().unwrap();
    let rules = r#"
[[rule]]
usernames = ["sdk-user"]
allow = ["read", "write", "observe"]
keys = ["app/{clientId}/*"]
"#;
    let env = secured(dir.path(), &[("sdk-user", "s3cret-pw")], Some(rules)).await;
    let id = unique_id("sdk");
    let settings = MqttConnectionSettingsBuilder::default()
        .client_id(id.clone())
        .hostname("127.0.0.1")
        .tcp_port(env.broker_port)
        .use_tls(false)
        .username("sdk-user".to_owned())
        .password("s3cret-pw".to_owned())
        .build()
        .expect("connection settings");
    let session = Session::new(
        SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()
            .unwrap(),
    )
    .expect("session");
    let client = Arc::new(
        state_store::Client::new(
            ApplicationContextBuilder::default().build().unwrap(),
            session.create_managed_client(),
            session.create_session_monitor(),
            state_store::ClientOptionsBuilder::default().build().unwrap(),
        )
        .unwrap(),
    );
    let monitor = session.create_session_monitor();
    let exit = session.create_exit_handle();
    let run = tokio::spawn(session.run());
    tokio::time::timeout(WAIT, monitor.connected())
        .await
        .expect("the SDK connects");
    let t = std::time::Duration::from_secs(10);
    let key = format!("app/{id}/k").into_bytes();
    let set = client
        .set(key.clone(), b"v1".to_vec(), t, None, SetOptions::default())
        .await
        .expect("set own key");
    assert!(set.response);
    assert_eq!(client.get(key.clone(), t).await.unwrap().response, Some(b"v1".to_vec()));
    let other = b"app/someone-else/k".to_vec();
    let denied = client.get(other, t).await.expect_err("another client's key");
    assert!(
        format!("{denied:?}").contains("403") || format!("{denied:?}").to_lowercase().contains("authoriz"),
        "{denied:?}"
    );
    let mut obs = client.observe(key.clone(), t).await.expect("observe own key").response;
    client
        .set(key.clone(), b"v2".to_vec(), t, None, SetOptions::default())
        .await
        .unwrap();
    let (n, _) = tokio::time::timeout(WAIT, obs.recv_notification())
        .await
        .expect("notification in time")
        .expect("observation open");
    assert_eq!(n.operation, Operation::Set(b"v2".to_vec()));
    client.shutdown().await.expect("client shutdown");
    if exit.try_exit().is_err() {
        exit.force_exit();
    }
    let _ = run.await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_and_other_clients_topics_are_guarded() {
    let dir = tempfile::tempdir().unwrap();
    let users = [("a", "pw-a"), ("b", "pw-b")];
    let rules = "[[rule]]\nusernames = [\"*\"]\nallow = [\"read\", \"write\", \"observe\"]\nkeys = [\"*\"]\n";
    let env = secured(dir.path(), &users, Some(rules)).await;
    let port = env.broker_port;
    let mut a = RawClient::connect_as(port, "client-a", Some(("a", "pw-a")))
        .await
        .unwrap();
    let mut b = RawClient::connect_as(port, "client-b", Some(("b", "pw-b")))
        .await
        .unwrap();
    let b_hex = hex::encode_upper("client-b");
    let a_hex = hex::encode_upper("client-a");
    let not_authorized = vec![SubscribeReasonCode::NotAuthorized];
    for filter in [
        INVOKE.to_owned(),
        "#".into(),
        format!("$share/g/{INVOKE}"),
        format!("{NOTIFY_TOPIC_PREFIX}/{b_hex}/command/notify/+"),
        format!("{NOTIFY_TOPIC_PREFIX}/+/command/notify/+"),
        "clients/client-b/#".into(),
    ] {
        assert_eq!(a.try_subscribe(&filter).await, not_authorized, "{filter}");
    }
    a.subscribe(&format!("{NOTIFY_TOPIC_PREFIX}/{a_hex}/command/notify/+"))
        .await;
    a.subscribe("clients/client-a/#").await;

    // b observes k; a forges a notification on b's topic: refused, and b never gets it.
    let r = b.request(&[b"KEYNOTIFY", b"k"], &[]).await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    b.subscribe(&format!("{NOTIFY_TOPIC_PREFIX}/{b_hex}/command/notify/+"))
        .await;
    let mut forger = RawClient::connect_as(port, "forger", Some(("a", "pw-a")))
        .await
        .unwrap();
    let topic = format!(
        "{NOTIFY_TOPIC_PREFIX}/{b_hex}/command/notify/{}",
        hex::encode_upper("k")
    );
    let fake = stategate::resp3::encode_request([&b"NOTIFY"[..], b"SET", b"VALUE", b"forged"]);
    forger
        .publish(&topic, QoS::AtLeastOnce, fake, PublishProperties::default())
        .await;
    assert_eq!(forger.next_puback().await, PubAckReason::NotAuthorized);
    let r = a
        .request(&[b"SET", b"k", b"real"], &[("__ts", &crate::support::now_ts())])
        .await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    // b's response (KEYNOTIFY) came earlier; the next thing b sees is the real notification.
    let n = b.next().await;
    assert!(n.payload.ends_with(b"real\r\n"), "{:?}", n.payload);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_source_ids_and_properties_gain_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let users = [("dev", "pw-dev")];
    let rules = r#"
[[rule]]
client_ids = ["dev-*"]
allow = ["read", "write", "observe"]
keys = ["devices/{clientId}/*"]

[[rule]]
usernames = ["admin"]
allow = ["read", "write", "observe"]
keys = ["*"]
"#;
    let env = secured(dir.path(), &users, Some(rules)).await;
    let mut c = RawClient::connect_as(env.broker_port, "dev-1", Some(("dev", "pw-dev")))
        .await
        .unwrap();
    let ts = crate::support::now_ts();
    let ok = c.request(&[b"SET", b"devices/dev-1/t", b"1"], &[("__ts", &ts)]).await;
    assert_eq!(prop(&ok, "__stat"), Some("200"));
    let forged: &[(&str, &str)] = &[
        ("__ts", &ts),
        ("__srcId", "dev-2"),
        ("username", "admin"),
        ("__username", "admin"),
        ("x-stategate-principal", "admin"),
    ];
    for args in [
        &[&b"SET"[..], b"devices/dev-2/t", b"x"][..],
        &[b"GET", b"devices/dev-2/t"],
        &[b"DEL", b"devices/dev-2/t"],
        &[b"VDEL", b"devices/dev-2/t", b"x"],
        &[b"KEYNOTIFY", b"devices/dev-2/t"],
    ] {
        let r = c.request(args, forged).await;
        assert_eq!(prop(&r, "__stat"), Some("403"), "{args:?}");
        assert!(prop(&r, "__stMsg").is_some());
        assert!(r.payload.is_empty(), "nothing a client could take for data");
    }
    assert!(
        env.engine()
            .read(&bytes::Bytes::from_static(b"devices/dev-2/t"))
            .await
            .unwrap()
            .is_none()
    );
    env.stop().await;
}
