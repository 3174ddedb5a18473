//! Leader election (`docs/election.md`) against the real service and the real `stategate`
//! binary: an HTTP campaigner and an MQTT leased lock on the same name, a killed holder's lease
//! expiring into the other's hands with a higher fencing token, `stategate elect` stopping its
//! command when the lease is taken, observe over gRPC and SSE, and access rules.
//!
//! Synchronisation: every wait is on an event (a child's line or exit, a campaign's answer, an
//! observe stream's next item), bounded by `support::WAIT`; no sleeps.

use std::process::Stdio;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};
use stategate::grpc::pb::statestore::v1 as npb;
use stategate::hlc::Hlc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::support::{Broker, TestEnv, within};

const BIN: &str = env!("CARGO_BIN_EXE_stategate");
const STORE: &str = "lockstore";

/// The client binary with `args`, the door flags before a `--`, no inherited `STATEGATE_*`.
fn client(args: &[&str], door: &[String]) -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("STATEGATE_") {
            c.env_remove(k);
        }
    }
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    c.args(&args[..split])
        .args(door)
        .args(["--timeout", "5s"])
        .args(&args[split..]);
    c.kill_on_drop(true);
    c
}

/// A running client: its stdout read line by line.
struct Live {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Option<ChildStderr>,
}

impl Live {
    fn spawn(args: &[&str], door: &[String]) -> Live {
        let mut child = client(args, door)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the stategate binary");
        Live {
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            stderr: child.stderr.take(),
            child,
        }
    }

    async fn line(&mut self) -> String {
        within("a line from the client", self.stdout.next_line())
            .await
            .unwrap()
            .expect("stdout still open")
    }

    /// The exit code and what the client said on stderr (up to its end, or to the client's
    /// exit when a child it left behind keeps the pipe open).
    async fn exit(&mut self) -> (i32, String) {
        let status = within("the client to exit", self.child.wait()).await.unwrap();
        let mut err = Vec::new();
        if let Some(mut e) = self.stderr.take() {
            use tokio::io::AsyncReadExt;
            let _ = tokio::time::timeout(std::time::Duration::from_millis(500), e.read_to_end(&mut err)).await;
        }
        (status.code().unwrap_or(-1), String::from_utf8_lossy(&err).into_owned())
    }
}

/// Runs a client to its end: exit code and stdout.
async fn run(args: &[&str], door: &[String]) -> (i32, String) {
    let out = within("the client to finish", client(args, door).stdin(Stdio::null()).output())
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The command a holder runs: prints `<who> <fencing token>`, waits for a line, exits `code`.
fn holder_command(who: &str, code: u8) -> String {
    format!("echo \"{who} $STATEGATE_FENCING_TOKEN\"; read line; exit {code}")
}

fn token_of(line: &str, who: &str) -> Hlc {
    let t = line
        .strip_prefix(&format!("{who} "))
        .unwrap_or_else(|| panic!("{line:?} is not {who}'s"));
    t.parse().unwrap_or_else(|_| panic!("{t:?} is not a fencing token"))
}

fn mqtt(env: &TestEnv) -> Vec<String> {
    vec!["--mqtt-url".into(), format!("mqtt://127.0.0.1:{}", env.broker_port)]
}

async fn post(env: &TestEnv, route: &str, body: Value, token: Option<&str>) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1.0-alpha1/election/{STORE}/{route}", env.http()))
        .json(&body);
    if let Some(t) = token {
        r = r.header("dapr-api-token", t);
    }
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get_leader(env: &TestEnv, name: &str, token: Option<&str>) -> (u16, Value) {
    let mut r = reqwest::Client::new().get(format!(
        "{}/v1.0-alpha1/election/{STORE}/leader?name={name}",
        env.http()
    ));
    if let Some(t) = token {
        r = r.header("dapr-api-token", t);
    }
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn hlc(v: &Value) -> Hlc {
    v.as_str()
        .unwrap_or_else(|| panic!("{v} is not a token"))
        .parse()
        .expect("a version")
}

/// The next leader an observe stream reports (`None`: nobody).
async fn next_observed(s: &mut tonic::Streaming<npb::LeaderResponse>) -> Option<npb::ElectionLeader> {
    within("the next leader", s.next())
        .await
        .expect("the stream goes on")
        .expect("a leader")
        .leader
}

/// Reads observed leaders until `holder` shows elected by campaign (before its proclamation is
/// written, it may show without; an expired lease shows as nobody).
async fn observe_until_campaigned(s: &mut tonic::Streaming<npb::LeaderResponse>, holder: &str) -> npb::ElectionLeader {
    loop {
        match next_observed(s).await {
            Some(l) if l.holder == holder.as_bytes() && l.campaigned => return l,
            Some(l) if l.holder == holder.as_bytes() => {}
            None => {}
            Some(other) => panic!("unexpected leader {other:?}"),
        }
    }
}

/// An MQTT leased lock (`stategate lock` over MQTT: the AIO algorithm) and an HTTP campaigner
/// on one name: the campaigner is kept out while the lock is held; the lock's holder is killed,
/// its lease expires, and the waiting campaign wins with a higher fencing token, which the
/// leased lock then respects. gRPC observe reports each leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_campaigner_wins_when_an_mqtt_lease_holder_dies() {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut grpc = npb::election_client::ElectionClient::connect(env.grpc()).await.unwrap();
    let mut observed = grpc
        .observe(npb::LeaderRequest { name: b"job".to_vec() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_observed(&mut observed).await, None);

    let cmd = holder_command("device", 0);
    let mut device = Live::spawn(
        &[
            "lock", "job", "--ttl", "1s", "--holder", "device", "--", "sh", "-c", &cmd,
        ],
        &mqtt(&env),
    );
    let device_token = token_of(&device.line().await, "device");
    let seen = next_observed(&mut observed).await.expect("the device leads");
    assert_eq!((&seen.holder[..], seen.campaigned), (&b"device"[..], false));

    let campaign = json!({"name": "job", "holder": "svc", "value": "http://svc:8080", "ttlMs": 30_000});
    let (status, kept_out) = post(&env, "campaign", campaign.clone(), None).await;
    assert_eq!(status, 200, "{kept_out}");
    assert_eq!(kept_out["elected"], false);
    assert_eq!(kept_out["leader"]["holder"], "device");
    assert_eq!(kept_out["leader"]["campaigned"], false);

    // The holder dies without releasing; the campaign waits for the lease's expiry.
    let waiting = {
        let env_http = env.http();
        let mut body = campaign.clone();
        body["waitMs"] = json!(25_000);
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{env_http}/v1.0-alpha1/election/{STORE}/campaign"))
                .json(&body)
                .send()
                .await
                .expect("campaign");
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    device.child.start_kill().unwrap();
    within("the lock to die", device.child.wait()).await.unwrap();
    // Its command, left behind, ends at the end of its input.
    drop(device.stdin.take());
    let (status, won) = within("the campaign to win", waiting).await.unwrap();
    assert_eq!(status, 200, "{won}");
    assert_eq!(won["elected"], true, "{won}");
    let svc_token = hlc(&won["leader"]["token"]);
    assert!(svc_token > device_token, "{svc_token} after {device_token}");
    let seen = observe_until_campaigned(&mut observed, "svc").await;
    assert_eq!(seen.token, svc_token.to_string());
    assert_eq!(seen.value.as_deref(), Some(&b"http://svc:8080"[..]));

    // The leased lock over MQTT now finds the name held; `elect --leader` over MQTT sees svc.
    let (code, _) = run(
        &["lock", "job", "--ttl", "1s", "--holder", "device", "--wait", "0s"],
        &mqtt(&env),
    )
    .await;
    assert_eq!(code, 1, "held by svc");
    let (code, out) = run(&["elect", "job", "--leader", "--json"], &mqtt(&env)).await;
    assert_eq!(code, 0, "{out}");
    let printed: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (&printed["leader"], &printed["value"]),
        (&json!("svc"), &json!("http://svc:8080"))
    );

    let (_, resigned) = post(&env, "resign", json!({"name": "job", "holder": "svc"}), None).await;
    assert_eq!(resigned["status"], "SUCCESS");
    assert_eq!(next_observed(&mut observed).await, None);
    assert_eq!(get_leader(&env, "job", None).await.1, json!({"leader": null}));
    env.stop().await;
}

/// `stategate elect` runs its command while leading; when another client takes the lease (a
/// plain SET over gRPC overwrites the holder), the next renewal finds it lost: the command is
/// stopped and elect exits 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_stops_its_command_when_the_lease_is_taken() {
    let env = TestEnv::start(Broker::Embedded).await;
    let http = vec!["--http".to_owned(), env.http()];
    let cmd = holder_command("a", 0);
    let mut a = Live::spawn(
        &[
            "elect", "job", "--holder", "a", "--ttl", "1s", "--value", "hello", "--", "sh", "-c", &cmd,
        ],
        &http,
    );
    let ta = token_of(&a.line().await, "a");
    let mut grpc = npb::election_client::ElectionClient::connect(env.grpc()).await.unwrap();
    let lead = grpc
        .leader(npb::LeaderRequest { name: b"job".to_vec() })
        .await
        .unwrap()
        .into_inner()
        .leader
        .expect("a leads");
    assert_eq!(
        (
            &lead.holder[..],
            lead.value.as_deref(),
            lead.token.clone(),
            lead.campaigned
        ),
        (&b"a"[..], Some(&b"hello"[..]), ta.to_string(), true)
    );

    let mut native = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap();
    native
        .set(npb::SetRequest {
            key: b"job".to_vec(),
            value: b"b".to_vec(),
            ttl_ms: 60_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let (code, stderr) = a.exit().await;
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    // b took the lease some other way: it leads, and a's proclamation is not b's.
    let (_, now) = get_leader(&env, "job", None).await;
    assert_eq!(now["leader"]["holder"], "b");
    assert!(now["leader"].get("value").is_none(), "{now}");
    env.stop().await;
}

/// Reads server-sent events until one named `name`; returns its data.
async fn sse_event(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<Bytes>> + Unpin),
    buf: &mut String,
    name: &str,
) -> Value {
    loop {
        if let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if event.lines().any(|l| l == format!("event: {name}")) {
                let data = event.lines().find_map(|l| l.strip_prefix("data: ")).expect("data");
                return serde_json::from_str(data).unwrap();
            }
            continue;
        }
        let chunk = within("an event", body.next())
            .await
            .expect("the stream goes on")
            .unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

/// `elect` over MQTT with a value; proclaim over HTTP by the leader only; observe over SSE; the
/// command's exit status is elect's, and elect resigns (lease and proclamation gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_resigns_when_its_command_ends_and_sse_observes_it() {
    let env = TestEnv::start(Broker::Embedded).await;
    let sse = reqwest::Client::new()
        .get(format!("{}/v1.0-alpha1/election/{STORE}/observe?name=cron", env.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let mut events = sse.bytes_stream();
    let mut buf = String::new();
    assert_eq!(
        sse_event(&mut events, &mut buf, "leader").await,
        json!({"leader": null})
    );

    let cmd = holder_command("a", 5);
    let mut a = Live::spawn(
        &[
            "elect", "cron", "--holder", "a", "--value", "v1", "--", "sh", "-c", &cmd,
        ],
        &mqtt(&env),
    );
    let ta = token_of(&a.line().await, "a");
    let lead = loop {
        let e = sse_event(&mut events, &mut buf, "leader").await;
        if e["leader"]["campaigned"] == true {
            break e["leader"].clone();
        }
    };
    assert_eq!((&lead["holder"], &lead["value"]), (&json!("a"), &json!("v1")));
    assert_eq!(hlc(&lead["token"]), ta);

    let proclaim = |holder: &str| json!({"name": "cron", "holder": holder, "token": ta.to_string(), "value": "v2"});
    assert_eq!(
        post(&env, "proclaim", proclaim("b"), None).await.1["status"],
        "NOT_LEADER"
    );
    assert_eq!(post(&env, "proclaim", proclaim("a"), None).await.1["status"], "SUCCESS");
    let e = sse_event(&mut events, &mut buf, "leader").await;
    assert_eq!(e["leader"]["value"], "v2");
    let grpc = vec!["--grpc".to_owned(), env.grpc()];
    let (code, out) = run(&["elect", "cron", "--leader"], &grpc).await;
    assert_eq!((code, out.as_str()), (0, "a\nvalue: v2\n"));

    a.stdin.take().unwrap().write_all(b"done\n").await.unwrap();
    assert_eq!(a.exit().await.0, 5);
    assert_eq!(
        sse_event(&mut events, &mut buf, "leader").await,
        json!({"leader": null})
    );
    assert_eq!(get_leader(&env, "cron", None).await.1, json!({"leader": null}));
    let companion = Bytes::from_static(b"cron.proclaimed");
    assert_eq!(
        env.engine().read(&companion).await.unwrap(),
        None,
        "the proclamation went too"
    );
    let (code, _) = run(&["elect", "cron", "--leader"], &grpc).await;
    assert_eq!(code, 1, "nobody leads");
    env.stop().await;
}

const RULES: &str = r#"
[[rule]]
tokens = ["app"]
allow = ["read", "write"]
keys = ["app/*"]

[[rule]]
tokens = ["viewer"]
allow = ["read"]
keys = ["app/*"]
"#;
const APP: &str = "app-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";

/// Campaign, proclaim and resign need `write` on the election's key; leader and observe need
/// `read`: on both doors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_needs_the_rights_on_its_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("acl.toml"), RULES).unwrap();
    std::fs::write(dir.path().join("tokens"), format!("app:{APP}\nviewer:{VIEWER}\n")).unwrap();
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.access.acl_file = Some(dir.path().join("acl.toml"));
        c.access.api_token_file = Some(dir.path().join("tokens"));
    })
    .await;
    let campaign = |name: &str| json!({"name": name, "holder": "h", "ttlMs": 60_000});
    assert_eq!(
        post(&env, "campaign", campaign("app/leader"), Some(VIEWER)).await.0,
        403
    );
    assert_eq!(post(&env, "campaign", campaign("other/leader"), Some(APP)).await.0, 403);
    let resign = json!({"name": "app/leader", "holder": "h"});
    assert_eq!(post(&env, "resign", resign.clone(), Some(VIEWER)).await.0, 403);
    let (status, won) = post(&env, "campaign", campaign("app/leader"), Some(APP)).await;
    assert_eq!((status, &won["elected"]), (200, &json!(true)));
    let proclaim = json!({"name": "app/leader", "holder": "h", "token": won["leader"]["token"], "value": "x"});
    assert_eq!(post(&env, "proclaim", proclaim, Some(VIEWER)).await.0, 403);
    // The viewer may see who leads, on either door; nobody may look at another name.
    let (status, seen) = get_leader(&env, "app/leader", Some(VIEWER)).await;
    assert_eq!((status, &seen["leader"]["holder"]), (200, &json!("h")));
    assert_eq!(get_leader(&env, "other/leader", Some(APP)).await.0, 403);
    let observe = reqwest::Client::new()
        .get(format!(
            "{}/v1.0-alpha1/election/{STORE}/observe?name=other/x",
            env.http()
        ))
        .header("dapr-api-token", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(observe.status(), 403);

    let mut grpc = npb::election_client::ElectionClient::connect(env.grpc()).await.unwrap();
    let with = |token: &str, mut r: tonic::Request<npb::CampaignRequest>| {
        r.metadata_mut()
            .insert("dapr-api-token", MetadataValue::try_from(token).unwrap());
        r
    };
    let req = || {
        tonic::Request::new(npb::CampaignRequest {
            name: b"app/leader".to_vec(),
            holder: b"g".to_vec(),
            ttl_ms: 60_000,
            ..Default::default()
        })
    };
    let denied = grpc.campaign(with(VIEWER, req())).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    let held = grpc.campaign(with(APP, req())).await.unwrap().into_inner();
    assert!(!held.elected);
    let mut observe = tonic::Request::new(npb::LeaderRequest {
        name: b"other/x".to_vec(),
    });
    observe
        .metadata_mut()
        .insert("dapr-api-token", MetadataValue::try_from(VIEWER).unwrap());
    assert_eq!(grpc.observe(observe).await.unwrap_err().code(), Code::PermissionDenied);
    let (_, resigned) = post(&env, "resign", resign, Some(APP)).await;
    assert_eq!(resigned["status"], "SUCCESS");
    env.stop().await;
}

/// The value a key of `env`'s store holds now.
async fn stored(env: &TestEnv, key: &str) -> Option<Bytes> {
    let key = Bytes::copy_from_slice(key.as_bytes());
    env.engine().read(&key).await.unwrap().map(|e| e.value)
}

/// A key named like an election's companion but holding no proclamation (someone's own key):
/// `stategate elect --leader` reads it as the service does, through the same parser (no value
/// for the lease); resign leaves it; neither `stategate elect` nor an HTTP campaign overwrites
/// it (they give the lease back and say why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinary_key_named_like_the_companion_is_no_proclamation() {
    use stategate::engine::{Command as EngineCommand, Set, SetCondition};
    let env = TestEnv::start(Broker::Embedded).await;
    let set = |key: &str, value: &str, condition, ttl_ms| {
        EngineCommand::Set(Set {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            condition,
            ttl_ms,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        })
    };
    let own = "a\nnotes";
    env.engine()
        .execute(set("cron.proclaimed", own, SetCondition::Always, None))
        .await
        .unwrap();
    // "a" holds the lease as a leased lock: it proclaimed nothing.
    env.engine()
        .execute(set("cron", "a", SetCondition::IfAbsentOrEqual, Some(60_000)))
        .await
        .unwrap();
    let (status, body) = get_leader(&env, "cron", None).await;
    assert_eq!((status, &body["leader"]["value"]), (200, &Value::Null));
    for door in [mqtt(&env), vec!["--grpc".to_owned(), env.grpc()]] {
        let (code, out) = run(&["elect", "cron", "--leader"], &door).await;
        assert_eq!((code, out.as_str()), (0, "a\n"), "no value, as the service says");
    }
    let resign = |holder: &str| json!({"name": "cron", "holder": holder});
    assert_eq!(post(&env, "resign", resign("a"), None).await.1["status"], "SUCCESS");
    assert_eq!(stored(&env, "cron.proclaimed").await.as_deref(), Some(own.as_bytes()));
    assert_eq!(post(&env, "resign", resign("a"), None).await.1["status"], "NO_LEADER");
    assert_eq!(stored(&env, "cron.proclaimed").await.as_deref(), Some(own.as_bytes()));

    let out = client(
        &["elect", "cron", "--holder", "b", "--value", "v", "--", "true"],
        &mqtt(&env),
    )
    .stdin(Stdio::null())
    .output();
    let out = within("elect to finish", out).await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("not this election's proclamation"), "{err}");
    assert_eq!(stored(&env, "cron.proclaimed").await.as_deref(), Some(own.as_bytes()));
    assert_eq!(stored(&env, "cron").await, None, "elect gave the lease back");

    let campaign = json!({"name": "cron", "holder": "c", "value": "v", "ttlMs": 10000});
    let (status, body) = post(&env, "campaign", campaign, None).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(stored(&env, "cron.proclaimed").await.as_deref(), Some(own.as_bytes()));
    assert_eq!(stored(&env, "cron").await, None, "the campaign gave the lease back");
    env.stop().await;
}

/// Observers are streams on both doors: with 4 request slots per door, 6 SSE and 6 gRPC
/// observers all open and get their first event, and ordinary requests are still served (an
/// observer in a request slot would hold it for its life: the fifth got 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_take_stream_slots_not_request_slots() {
    const OBSERVERS: usize = 6;
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.net.http_max_inflight = 4;
        c.net.grpc_max_inflight = 4;
    })
    .await;
    let http = reqwest::Client::new();
    let mut sse = Vec::new();
    for i in 0..OBSERVERS {
        let r = http
            .get(format!(
                "{}/v1.0-alpha1/election/{STORE}/observe?name=crowd",
                env.http()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "SSE observer {i}");
        let mut events = r.bytes_stream();
        let mut buf = String::new();
        assert_eq!(
            sse_event(&mut events, &mut buf, "leader").await,
            json!({"leader": null})
        );
        sse.push(events);
    }
    let mut grpc = npb::election_client::ElectionClient::connect(env.grpc()).await.unwrap();
    let mut observers = Vec::new();
    for i in 0..OBSERVERS {
        let request = npb::LeaderRequest {
            name: b"crowd".to_vec(),
        };
        let mut s = match grpc.observe(request).await {
            Ok(s) => s.into_inner(),
            Err(e) => panic!("gRPC observer {i}: {e}"),
        };
        assert_eq!(next_observed(&mut s).await, None, "gRPC observer {i}");
        observers.push(s);
    }
    // Every observer is open; requests still have their slots.
    assert_eq!(get_leader(&env, "crowd", None).await, (200, json!({"leader": null})));
    let campaign = npb::CampaignRequest {
        name: b"crowd".to_vec(),
        holder: b"h".to_vec(),
        ttl_ms: 60_000,
        ..Default::default()
    };
    assert!(grpc.campaign(campaign).await.unwrap().into_inner().elected);
    for s in &mut observers {
        assert_eq!(next_observed(s).await.map(|l| l.holder), Some(b"h".to_vec()));
    }
    env.stop().await;
}

/// A gRPC campaign asking to wait an hour (or longer than a clock can count) answers at the
/// shared cap (`--election-max-wait`), not elected, with who leads: the cap is the shared
/// layer's, as HTTP's request timeout already bounded its own campaigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_campaign_waits_no_longer_than_the_cap() {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.dapr.max_campaign_wait = std::time::Duration::from_millis(300);
    })
    .await;
    let mut grpc = npb::election_client::ElectionClient::connect(env.grpc()).await.unwrap();
    let campaign = |holder: &str, wait_ms: u64| npb::CampaignRequest {
        name: b"capped".to_vec(),
        holder: holder.as_bytes().to_vec(),
        ttl_ms: 60_000,
        wait_ms,
        ..Default::default()
    };
    assert!(grpc.campaign(campaign("a", 0)).await.unwrap().into_inner().elected);
    for wait_ms in [3_600_000, u64::MAX] {
        let answer = within("the capped campaign", grpc.campaign(campaign("b", wait_ms)))
            .await
            .unwrap_or_else(|e| panic!("wait_ms {wait_ms}: {e}"))
            .into_inner();
        assert!(!answer.elected, "wait_ms {wait_ms}");
        assert_eq!(answer.leader.map(|l| l.holder), Some(b"a".to_vec()));
    }
    env.stop().await;
}
