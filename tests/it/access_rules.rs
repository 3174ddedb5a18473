//! Per-key rules on every door (MQTT, HTTP, gRPC): allowed and denied read/write/observe,
//! `{clientId}`, filtering of SCAN, key lists, queries, bulk get, SSE and Watch (no key name
//! leaks through paging tokens), reload, rate and stream limits, malformed files at startup.

use std::path::Path;
use std::process::Command;

use bytes::Bytes;
use serde_json::{Value, json};
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::grpc::pb::statestore::v1 as npb;
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::support::{Broker, RawClient, TestEnv, WAIT, now_ts, prop};

const RULES: &str = r#"
[[rule]]
client_ids = ["dev-*"]
allow = ["read", "write", "observe"]
keys = ["devices/{clientId}/*"]

[[rule]]
tokens = ["app"]
allow = ["read", "write"]
keys = ["app/*"]

[[rule]]
tokens = ["viewer"]
allow = ["read"]
keys = ["app/*"]

[[rule]]
tokens = ["admin"]
allow = ["read", "write"]
keys = ["*"]

[[rule]]
anonymous = true
allow = ["read"]
keys = ["public/*"]
"#;

const APP: &str = "app-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";

async fn start(dir: &Path, tweak: impl FnOnce(&mut stategate::config::Config)) -> TestEnv {
    std::fs::write(dir.join("acl.toml"), RULES).unwrap();
    std::fs::write(
        dir.join("tokens"),
        format!("app:{APP}\nviewer:{VIEWER}\nadmin:{ADMIN}\n"),
    )
    .unwrap();
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.access.acl_file = Some(dir.join("acl.toml"));
        c.access.api_token_file = Some(dir.join("tokens"));
        c.limits.scan_page = 2;
        tweak(c);
    })
    .await;
    let c = reqwest::Client::new();
    let mut items: Vec<Value> = ["app/1", "app/2", "devices/dev-1/a", "devices/dev-2/a", "public/p"]
        .iter()
        .map(|k| json!({"key": k, "value": k}))
        .collect();
    items.extend((0..30).map(|i| json!({"key": format!("secret/{i:02}"), "value": i})));
    let r = c
        .post(format!("{}/v1.0/state/statestore", env.http()))
        .header("dapr-api-token", ADMIN)
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    env
}

/// No paging token may name a key the caller cannot read: plain tokens are the hex of a
/// readable key, every other one is sealed.
#[track_caller]
fn assert_token_hides(token: &str, readable: &[&str]) {
    if let Ok(key) = hex::decode(token) {
        let key = String::from_utf8_lossy(&key).into_owned();
        assert!(
            readable.iter().any(|p| key.starts_with(p)),
            "token {token} names {key:?}"
        );
    } else {
        assert!(token.starts_with('S'), "{token}");
        assert!(!token.contains(&hex::encode_upper("secret")), "{token}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_rules() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path(), |_| {}).await;
    let (c, base) = (reqwest::Client::new(), format!("{}/v1.0/state/statestore", env.http()));
    let get = |key: &str, token: &str| {
        c.get(format!("{base}/{}", key.replace('/', "%2F")))
            .header("dapr-api-token", token.to_owned())
            .send()
    };
    assert_eq!(get("app/1", APP).await.unwrap().status(), 200);
    let denied = get("secret/01", APP).await.unwrap();
    assert_eq!(denied.status(), 403);
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_PERMISSION_DENIED");
    assert_eq!(get("app/1", "wrong-token-0123456789").await.unwrap().status(), 401);

    let save = |token: &str, items: Value| {
        c.post(&base)
            .header("dapr-api-token", token.to_owned())
            .json(&items)
            .send()
    };
    assert_eq!(
        save(APP, json!([{"key": "app/3", "value": 3}])).await.unwrap().status(),
        204
    );
    assert_eq!(
        save(VIEWER, json!([{"key": "app/3", "value": 4}]))
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        save(APP, json!([{"key": "secret/x", "value": 1}]))
            .await
            .unwrap()
            .status(),
        403
    );
    assert!(
        env.engine()
            .read(&Bytes::from_static(b"secret/x"))
            .await
            .unwrap()
            .is_none()
    );
    let del = c
        .delete(format!("{base}/secret%2F01"))
        .header("dapr-api-token", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 403);
    assert!(
        env.engine()
            .read(&Bytes::from_static(b"secret/01"))
            .await
            .unwrap()
            .is_some()
    );

    // A transaction with one key outside the rules does nothing at all.
    let tx = c
        .post(format!("{base}/transaction"))
        .header("dapr-api-token", APP)
        .json(&json!({"operations": [
            {"operation": "upsert", "request": {"key": "app/4", "value": 1}},
            {"operation": "upsert", "request": {"key": "secret/02", "value": 1}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(tx.status(), 403);
    assert!(
        env.engine()
            .read(&Bytes::from_static(b"app/4"))
            .await
            .unwrap()
            .is_none()
    );

    // Bulk get: the denied key is an item with an error and no data.
    let bulk: Value = c
        .post(format!("{base}/bulk"))
        .header("dapr-api-token", APP)
        .json(&json!({"keys": ["app/1", "secret/03"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(bulk[0]["data"], "app/1");
    assert_eq!(bulk[1]["error"], "permission denied");
    assert!(bulk[1].get("data").is_none_or(Value::is_null), "{bulk}");

    // Key lists: only readable keys, paging tokens that name no hidden key.
    let mut keys = Vec::new();
    let mut token = String::new();
    let keys_url = format!("{}/v1.0-alpha1/state/statestore/keys", env.http());
    for _ in 0..100 {
        let page: Value = c
            .get(&keys_url)
            .header("dapr-api-token", APP)
            .query(&[("limit", "1"), ("token", token.as_str())])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        keys.extend(
            page["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap().to_owned()),
        );
        match page["token"].as_str() {
            Some(t) => {
                assert_token_hides(t, &["app/"]);
                token = t.to_owned();
            }
            None => break,
        }
    }
    assert_eq!(keys, ["app/1", "app/2", "app/3"]);

    let q: Value = c
        .post(format!("{}/v1.0-alpha1/state/statestore/query", env.http()))
        .header("dapr-api-token", APP)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let found: Vec<&str> = q["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(found, ["app/1", "app/2", "app/3"]);

    // SSE: a change the caller may not read never arrives; the next readable one does.
    let mut sse = c
        .get(format!("{}/v1.0-alpha1/state/statestore/subscribe", env.http()))
        .header("dapr-api-token", VIEWER)
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    save(ADMIN, json!([{"key": "secret/new", "value": 1}])).await.unwrap();
    save(ADMIN, json!([{"key": "app/9", "value": 9}])).await.unwrap();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(WAIT, sse.chunk())
            .await
            .expect("event")
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.contains("\"key\":\"app/9\""), "{text}");
    assert!(!text.contains("secret"), "{text}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_http_caller_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("acl.toml"), RULES).unwrap();
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.access.acl_file = Some(dir.path().join("acl.toml"))
    })
    .await;
    let c = reqwest::Client::new();
    let base = format!("{}/v1.0/state/statestore", env.http());
    let r = c
        .post(&base)
        .json(&json!([{"key": "public/p", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "anonymous may only read public/*");
    assert_eq!(c.get(format!("{base}/public%2Fp")).send().await.unwrap().status(), 204);
    assert_eq!(c.get(format!("{base}/app%2F1")).send().await.unwrap().status(), 403);
    env.stop().await;
}

fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("dapr-api-token", MetadataValue::try_from(token).unwrap());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_rules() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path(), |_| {}).await;
    let mut native = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap();
    let mut dapr = rpb::dapr_client::DaprClient::connect(env.grpc()).await.unwrap();
    let get = |key: &str| npb::GetRequest { key: key.into() };
    assert!(native.get(authed(get("app/1"), APP)).await.unwrap().into_inner().found);
    let e = native.get(authed(get("secret/01"), APP)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let set = |key: &str| npb::SetRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    assert!(
        native
            .set(authed(set("app/5"), APP))
            .await
            .unwrap()
            .into_inner()
            .applied
    );
    assert_eq!(
        native.set(authed(set("secret/x"), APP)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let e = native
        .del(authed(
            npb::DelRequest {
                key: b"secret/01".to_vec(),
                ..Default::default()
            },
            APP,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = dapr
        .get_state(authed(
            rpb::GetStateRequest {
                store_name: "statestore".into(),
                key: "secret/01".into(),
                ..Default::default()
            },
            APP,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(
        native.get(get("app/1")).await.unwrap_err().code(),
        Code::Unauthenticated
    );

    // SCAN: only readable keys; pages examine 2 keys, so most tokens sit on hidden keys.
    let mut keys = Vec::new();
    let mut token = String::new();
    loop {
        let page = native
            .scan(authed(
                npb::ScanRequest {
                    pattern: "*".into(),
                    continuation_token: token.clone(),
                },
                APP,
            ))
            .await
            .unwrap()
            .into_inner();
        keys.extend(page.keys.into_iter().map(|k| String::from_utf8(k).unwrap()));
        if page.continuation_token.is_empty() {
            break;
        }
        assert_token_hides(&page.continuation_token, &["app/"]);
        token = page.continuation_token;
    }
    assert_eq!(keys, ["app/1", "app/2", "app/5"]);

    // Watch: the hidden change first, then a readable one; only the readable one arrives.
    let mut w = native
        .watch(authed(npb::WatchRequest::default(), VIEWER))
        .await
        .unwrap()
        .into_inner();
    native.set(authed(set("secret/w"), ADMIN)).await.unwrap();
    native.set(authed(set("app/w"), ADMIN)).await.unwrap();
    let e = tokio::time::timeout(WAIT, w.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(e.key, b"app/w");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_rules() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path(), |_| {}).await;
    let mut dev = RawClient::connect(env.broker_port, "dev-1").await;
    let ts = now_ts();
    let r = dev.request(&[b"SET", b"devices/dev-1/b", b"x"], &[("__ts", &ts)]).await;
    assert_eq!(prop(&r, "__stat"), Some("200"));
    for args in [
        &[&b"GET"[..], b"devices/dev-2/a"][..],
        &[b"SET", b"devices/dev-2/a", b"x"],
        &[b"DEL", b"app/1"],
        &[b"VDEL", b"app/1", b"app/1"],
        &[b"SET", b"app/1", b"x", b"NEX"],
        &[b"KEYNOTIFY", b"devices/dev-2/a"],
    ] {
        let r = dev.request(args, &[("__ts", &ts)]).await;
        assert_eq!(prop(&r, "__stat"), Some("403"), "{args:?}");
        assert_eq!(prop(&r, "__stMsg"), Some("not authorized"));
        assert!(r.payload.is_empty());
    }
    let r = dev.request(&[b"KEYNOTIFY", b"devices/dev-1/b"], &[]).await;
    assert_eq!(&r.payload[..], b"+OK\r\n");
    // SCAN pages of 2 examined keys: only the caller's keys, no hidden name in any token.
    let mut keys = Vec::new();
    let mut token: Option<Vec<u8>> = None;
    loop {
        let mut args: Vec<&[u8]> = vec![b"SCAN", b"*"];
        if let Some(t) = &token {
            args.push(t);
        }
        let r = dev.request(&args, &[]).await;
        let frame = stategate::resp3::decode(&r.payload).unwrap();
        let stategate::resp3::Frame::Array(parts) = frame else {
            panic!("{frame:?}")
        };
        let stategate::resp3::Frame::Array(page) = &parts[0] else {
            panic!("{parts:?}")
        };
        for k in page {
            if let stategate::resp3::Frame::Bulk(k) = k {
                keys.push(String::from_utf8(k.to_vec()).unwrap());
            }
        }
        let Some(stategate::resp3::Frame::Bulk(next)) = parts.get(1) else {
            break;
        };
        // dev-1 has no username or token: it is also anonymous, which may read public/*.
        assert_token_hides(std::str::from_utf8(next).unwrap(), &["devices/dev-1/", "public/"]);
        token = Some(next.to_vec());
    }
    assert_eq!(keys, ["devices/dev-1/a", "devices/dev-1/b", "public/p"]);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_reload() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path(), |_| {}).await;
    let c = reqwest::Client::new();
    let save = || {
        c.post(format!("{}/v1.0/state/statestore", env.http()))
            .header("dapr-api-token", VIEWER)
            .json(&json!([{"key": "app/r", "value": 1}]))
            .send()
    };
    assert_eq!(save().await.unwrap().status(), 403);
    let access = env.service.as_ref().unwrap().access().clone();
    let before = access.reloads();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        RULES.replace(
            "allow = [\"read\"]\nkeys = [\"app/*\"]",
            "allow = [\"read\", \"write\"]\nkeys = [\"app/*\"]",
        ),
    )
    .unwrap();
    access.reload().expect("reload");
    assert_eq!(access.reloads(), before + 1);
    assert_eq!(save().await.unwrap().status(), 204);
    // A broken file names its line and changes nothing.
    std::fs::write(
        &acl,
        "[[rule]]\ntokens = [\"viewer\"]\nallow = [\"fly\"]\nkeys = [\"*\"]\n",
    )
    .unwrap();
    let e = access.reload().unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}:1:", acl.display())), "{e}");
    assert_eq!(access.reloads(), before + 1);
    assert_eq!(save().await.unwrap().status(), 204, "the rules in force stay");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_and_stream_limits_per_principal() {
    let dir = tempfile::tempdir().unwrap();
    let env = start(dir.path(), |c| {
        c.access.limits.rate_per_sec = std::num::NonZeroU32::new(1);
        c.access.limits.burst = std::num::NonZeroU32::new(3);
        c.access.limits.max_streams = Some(1);
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1.0/state/statestore/app%2F1", env.http());
    // At most 3 + one per elapsed second of 20 back-to-back requests get through.
    let mut limited = 0;
    for _ in 0..20 {
        let r = c.get(&url).header("dapr-api-token", APP).send().await.unwrap();
        if r.status() == 429 {
            limited += 1;
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["errorCode"], "ERR_TOO_MANY_REQUESTS");
        }
    }
    assert!(limited >= 10, "{limited} of 20 refused");
    assert_eq!(
        c.get(&url)
            .header("dapr-api-token", VIEWER)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let mut native = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap();
    let e = native
        .get(authed(npb::GetRequest { key: b"app/1".to_vec() }, APP))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);

    let mut flood = RawClient::connect(env.broker_port, "dev-1").await;
    let mut mqtt_limited = 0;
    for _ in 0..20 {
        let r = flood.request(&[b"GET", b"devices/dev-1/a"], &[]).await;
        if prop(&r, "__stat") == Some("429") {
            mqtt_limited += 1;
            assert!(r.payload.is_empty());
        }
    }
    assert!(mqtt_limited >= 10, "{mqtt_limited}");
    let mut other = RawClient::connect(env.broker_port, "dev-2").await;
    let r = other.request(&[b"GET", b"devices/dev-2/a"], &[]).await;
    assert_eq!(prop(&r, "__stat"), Some("200"));

    // One open stream per principal: the second SSE of the admin is refused.
    let sse = format!("{}/v1.0-alpha1/state/statestore/subscribe", env.http());
    let first = c.get(&sse).header("dapr-api-token", ADMIN).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let second = c.get(&sse).header("dapr-api-token", ADMIN).send().await.unwrap();
    assert_eq!(second.status(), 429);
    env.stop().await;
}

#[test]
fn malformed_access_files_stop_startup() {
    let dir = tempfile::tempdir().unwrap();
    let bad_rules = dir.path().join("acl.toml");
    std::fs::write(
        &bad_rules,
        "[[rule]]\nanonymous = true\nallow = [\"read\"]\nkeys = [\"[\"]\n",
    )
    .unwrap();
    let bad_tokens = dir.path().join("tokens");
    std::fs::write(&bad_tokens, "ok:0123456789abcdef0\nnocolon\n").unwrap();
    let bad_users = dir.path().join("users");
    std::fs::write(&bad_users, "# users\nalice:plain\n").unwrap();
    for (flag, file, line) in [
        ("--acl-file", &bad_rules, 1),
        ("--api-token-file", &bad_tokens, 2),
        ("--mqtt-auth-file", &bad_users, 2),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_stategate"))
            .args(["--storage", "memory", "--mqtt-listen", "127.0.0.1:0"])
            .args(["--http-listen", "off", "--grpc-listen", "off"])
            .arg(flag)
            .arg(file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flag}: {err}");
        assert!(err.contains(&format!("{}:{line}:", file.display())), "{flag}: {err}");
    }
}
