//! The HTTP door (Dapr state API) over real HTTP on a bound port.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Broker, RawClient, Storage, TestEnv, now_ts, prop, unique_id};

// Save/get/delete, transactions, and server-sent events with KEYNOTIFY beside them, over
// memory and durable storage.
crate::support::both_storages!(
    save_get_delete_with_etags,
    transactions_apply_in_order_or_not_at_all,
    cross_door_versions_and_notifications,
);

async fn env() -> (TestEnv, reqwest::Client, String) {
    env_on(Storage::Memory).await
}

async fn env_on(storage: Storage) -> (TestEnv, reqwest::Client, String) {
    let env = TestEnv::start_on(Broker::Embedded, storage, |_| {}).await;
    let base = env.http();
    (env, reqwest::Client::new(), base)
}

/// The whole answer to a save whose Content-Length says 5 MiB, of which only the first 4 MiB
/// (the default limit) and 64 KiB are sent: the service answers once it has read past the
/// limit, and closes the connection.
async fn too_large_save(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1.0/state/statestore HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        5 * 1024 * 1024
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // The answer may already be on its way: a refused write is the close, not a failure.
    let _ = s.write_all(&vec![b'['; (4 * 1024 + 64) * 1024]).await;
    // Read up to the end of the answer's body (its Content-Length), not to the close.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if len.is_some_and(|len| body.len() >= len) {
                return text;
            }
        }
        match crate::support::within("the 413 answer", s.read(&mut buf)).await {
            Ok(0) | Err(_) => return text,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
}

async fn error_of(resp: reqwest::Response) -> (StatusCode, String, String) {
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body: Value = resp.json().await.expect("error body is JSON");
    assert!(ct.starts_with("application/json"), "{ct}");
    (
        status,
        body["errorCode"].as_str().expect("errorCode").to_owned(),
        body["message"].as_str().expect("message").to_owned(),
    )
}

async fn save_get_delete_with_etags(storage: Storage) {
    let (env, c, base) = env_on(storage).await;
    let url = format!("{base}/v1.0/state/statestore");
    let r = c
        .post(&url)
        .json(&json!([{"key": "k1", "value": {"b": 2, "a": 1}}, {"key": "k2", "value": "hello"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(r.bytes().await.unwrap().is_empty());

    let r = c.get(format!("{url}/k1")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/json");
    let etag1 = r.headers()["etag"].to_str().unwrap().to_owned();
    assert!(etag1.parse::<stategate::hlc::Hlc>().is_ok(), "{etag1}");
    assert_eq!(&r.bytes().await.unwrap()[..], br#"{"a":1,"b":2}"#);
    let r = c.get(format!("{url}/k2")).send().await.unwrap();
    assert_eq!(
        &r.bytes().await.unwrap()[..],
        br#""hello""#,
        "strings are stored as JSON text"
    );

    // Missing key: 204, never 404.
    let r = c.get(format!("{url}/nope")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);

    // Write with the current etag, then the stale one conflicts.
    let r = c
        .put(&url)
        .json(&json!([{"key": "k1", "value": 3, "etag": etag1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c
        .post(&url)
        .json(&json!([{"key": "k1", "value": 4, "etag": etag1}]))
        .send()
        .await
        .unwrap();
    let (status, code, _) = error_of(r).await;
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "ERR_STATE_SAVE"));
    let r = c
        .post(&url)
        .json(&json!([{"key": "k1", "value": 4, "etag": "not-a-version"}]))
        .send()
        .await
        .unwrap();
    let (status, code, _) = error_of(r).await;
    assert_eq!((status, code.as_str()), (StatusCode::BAD_REQUEST, "ERR_STATE_SAVE"));

    // Delete: stale If-Match conflicts, invalid is 400, current deletes, missing is 204.
    let r = c
        .delete(format!("{url}/k1"))
        .header("If-Match", &etag1)
        .send()
        .await
        .unwrap();
    let (status, code, _) = error_of(r).await;
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "ERR_STATE_DELETE"));
    let r = c
        .delete(format!("{url}/k1"))
        .header("If-Match", "garbage")
        .send()
        .await
        .unwrap();
    let (status, code, _) = error_of(r).await;
    assert_eq!((status, code.as_str()), (StatusCode::BAD_REQUEST, "ERR_STATE_DELETE"));
    let etag2 = c.get(format!("{url}/k1")).send().await.unwrap().headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let r = c
        .delete(format!("{url}/k1"))
        .header("If-Match", &etag2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c.delete(format!("{url}/k1")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_get_keeps_order_and_marks_missing_keys() {
    let (env, c, base) = env().await;
    let url = format!("{base}/v1.0/state/statestore");
    c.post(&url)
        .json(&json!([{"key": "a", "value": 1}, {"key": "b", "value": {"x": true}}]))
        .send()
        .await
        .unwrap();
    let r = c
        .post(format!("{url}/bulk"))
        .json(&json!({"keys": ["b", "missing", "a"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let items: Value = r.json().await.unwrap();
    assert_eq!(items[0]["key"], "b");
    assert_eq!(items[0]["data"], json!({"x": true}));
    assert!(
        items[0]["etag"]
            .as_str()
            .unwrap()
            .parse::<stategate::hlc::Hlc>()
            .is_ok()
    );
    assert_eq!(items[1], json!({"key": "missing"}));
    assert_eq!(items[2]["data"], json!(1));
    // One invalid key fails the whole request, as daprd answers (not a per-item error).
    for keys in [json!(["a", "bad||key"]), json!(["", "a"])] {
        let r = c
            .post(format!("{url}/bulk"))
            .json(&json!({ "keys": keys }))
            .send()
            .await
            .unwrap();
        let (status, code, _) = error_of(r).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST"),
            "{keys}"
        );
    }
    env.stop().await;
}

async fn transactions_apply_in_order_or_not_at_all(storage: Storage) {
    let (env, c, base) = env_on(storage).await;
    let url = format!("{base}/v1.0/state/statestore");
    c.post(&url)
        .json(&json!([{"key": "t1", "value": 1}, {"key": "t2", "value": 2}]))
        .send()
        .await
        .unwrap();
    let ops = json!({"operations": [
        {"operation": "delete", "request": {"key": "t1"}},
        {"operation": "upsert", "request": {"key": "t2", "value": 22}},
        {"operation": "delete", "request": {"key": "t2"}},
        {"operation": "upsert", "request": {"key": "t3", "value": 3}},
    ]});
    let r = c.post(format!("{url}/transaction")).json(&ops).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    for (k, status) in [("t1", 204), ("t2", 204), ("t3", 200)] {
        assert_eq!(
            c.get(format!("{url}/{k}")).send().await.unwrap().status().as_u16(),
            status,
            "{k}"
        );
    }
    // A conflict anywhere: nothing applied, 500 ERR_STATE_TRANSACTION.
    let ops = json!({"operations": [
        {"operation": "upsert", "request": {"key": "t4", "value": 4}},
        {"operation": "upsert", "request": {"key": "t3", "value": 5, "etag": "000000000000001:00000:x"}},
    ]});
    let (status, code, _) = error_of(c.post(format!("{url}/transaction")).json(&ops).send().await.unwrap()).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "ERR_STATE_TRANSACTION")
    );
    assert_eq!(
        c.get(format!("{url}/t4")).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    // Unknown operation.
    let ops = json!({"operations": [{"operation": "merge", "request": {"key": "x", "value": 1}}]});
    let (status, code, _) = error_of(c.post(format!("{url}/transaction")).json(&ops).send().await.unwrap()).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::BAD_REQUEST, "ERR_NOT_SUPPORTED_STATE_OPERATION")
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_sets_expiry_and_reports_it() {
    let (env, c, base) = env().await;
    let url = format!("{base}/v1.0/state/statestore");
    let r = c
        .post(&url)
        .json(&json!([{"key": "ttl", "value": 1, "metadata": {"ttlInSeconds": "100"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c.get(format!("{url}/ttl")).send().await.unwrap();
    let exp = r.headers()["metadata.ttlExpireTime"].to_str().unwrap().to_owned();
    assert!(humantime::parse_rfc3339(&exp).is_ok(), "{exp}");
    // A write without TTL clears it.
    c.post(&url)
        .json(&json!([{"key": "ttl", "value": 2}]))
        .send()
        .await
        .unwrap();
    let r = c.get(format!("{url}/ttl")).send().await.unwrap();
    assert!(r.headers().get("metadata.ttlExpireTime").is_none());
    // Non-integer TTL: 400 and nothing written.
    let r = c
        .post(&url)
        .json(&json!([{"key": "bad", "value": 1, "metadata": {"ttlInSeconds": "soon"}}]))
        .send()
        .await
        .unwrap();
    let (status, code, _) = error_of(r).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST")
    );
    assert_eq!(
        c.get(format!("{url}/bad")).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_filters_sorts_and_pages() {
    let (env, c, base) = env().await;
    let url = format!("{base}/v1.0/state/statestore");
    let people: Vec<Value> = (0..5)
        .map(|i| json!({"key": format!("p{i}"), "value": {"id": i, "state": if i % 2 == 0 {"WA"} else {"CA"}}}))
        .collect();
    c.post(&url).json(&people).send().await.unwrap();
    let q = json!({"filter": {"EQ": {"state": "WA"}}, "sort": [{"key": "id", "order": "DESC"}], "page": {"limit": 2}});
    let r = c
        .post(format!("{base}/v1.0-alpha1/state/statestore/query"))
        .json(&q)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let page: Value = r.json().await.unwrap();
    let keys: Vec<&str> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["p4", "p2"]);
    let token = page["token"].as_str().unwrap().to_owned();
    let q = json!({"filter": {"EQ": {"state": "WA"}}, "sort": [{"key": "id", "order": "DESC"}], "page": {"limit": 2, "token": token}});
    let page: Value = c
        .post(format!("{base}/v1.0-alpha1/state/statestore/query"))
        .json(&q)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["results"][0]["key"], "p0");
    assert!(page.get("token").is_none());
    let q = json!({"filter": {"EQ": {"state": "TX"}}});
    let r = c
        .post(format!("{base}/v1.0-alpha1/state/statestore/query"))
        .json(&q)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_daprs_shape() {
    let (env, c, base) = env().await;
    let cases: Vec<(reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            c.get(format!("{base}/v1.0/state/nostore/k")),
            StatusCode::BAD_REQUEST,
            "ERR_STATE_STORE_NOT_FOUND",
        ),
        (
            c.post(format!("{base}/v1.0/state/statestore")).body("{not json"),
            StatusCode::BAD_REQUEST,
            "ERR_MALFORMED_REQUEST",
        ),
        (
            c.post(format!("{base}/v1.0/state/statestore"))
                .json(&json!([{"value": 1}])),
            StatusCode::BAD_REQUEST,
            "ERR_MALFORMED_REQUEST",
        ),
        (
            c.post(format!("{base}/v1.0/state/statestore"))
                .json(&json!([{"key": "", "value": 1}])),
            StatusCode::BAD_REQUEST,
            "ERR_MALFORMED_REQUEST",
        ),
        (
            c.post(format!("{base}/v1.0/state/statestore"))
                .json(&json!([{"key": "a||b", "value": 1}])),
            StatusCode::BAD_REQUEST,
            "ERR_MALFORMED_REQUEST",
        ),
        (
            c.post(format!("{base}/v1.0/state/statestore"))
                .json(&json!([{"key": "a", "value": 1, "options": {"concurrency": "often"}}])),
            StatusCode::BAD_REQUEST,
            "ERR_MALFORMED_REQUEST",
        ),
        (c.get(format!("{base}/v2/none")), StatusCode::NOT_FOUND, "ERR_NOT_FOUND"),
        (
            c.patch(format!("{base}/v1.0/state/statestore")),
            StatusCode::METHOD_NOT_ALLOWED,
            "ERR_METHOD_NOT_ALLOWED",
        ),
    ];
    for (req, status, code) in cases {
        let (s, c, _) = error_of(req.send().await.unwrap()).await;
        assert_eq!((s, c.as_str()), (status, code));
    }
    // A body past the limit is answered before it is read, and the connection closed: sent
    // over a raw connection that writes only the start of it, so that a slow client does not
    // meet the close as a broken pipe halfway through 5 MiB.
    let answer = too_large_save(base.trim_start_matches("http://")).await;
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("content-type: application/json"),
        "{head}"
    );
    let body: Value = serde_json::from_str(body).expect("error body is JSON");
    assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST", "{body}");
    // First-write conflicts.
    let url = format!("{base}/v1.0/state/statestore");
    c.post(&url)
        .json(&json!([{"key": "fw", "value": 1}]))
        .send()
        .await
        .unwrap();
    let r = c
        .post(&url)
        .json(&json!([{"key": "fw", "value": 2, "options": {"concurrency": "first-write"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, StatusCode::CONFLICT);
    let r = c
        .delete(format!("{url}/fw?concurrency=first-write"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, StatusCode::CONFLICT);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_token_is_required_when_configured() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.http.api_token = Some("s3cret".into())).await;
    let c = reqwest::Client::new();
    let base = env.http();
    let r = c.get(format!("{base}/v1.0/state/statestore/k")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.text().await.unwrap(), "invalid api token");
    let r = c
        .get(format!("{base}/v1.0/state/statestore/k"))
        .header("dapr-api-token", "wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = c
        .get(format!("{base}/v1.0/state/statestore/k"))
        .header("dapr-api-token", "s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    for h in ["/v1.0/healthz", "/v1.0/healthz/outbound"] {
        assert_eq!(
            c.get(format!("{base}{h}")).send().await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_lists_stores_and_features() {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.dapr.stores =
            stategate::dapr::Stores::new(vec!["statestore".parse().unwrap(), "orders=name".parse().unwrap()])
    })
    .await;
    let c = reqwest::Client::new();
    let m: Value = c
        .get(format!("{}/v1.0/metadata", env.http()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let comps = m["components"].as_array().unwrap();
    assert_eq!(
        comps.len(),
        4,
        "two state stores, the lock store, the configuration store"
    );
    assert_eq!(comps[2]["type"], "lock.stategate");
    assert_eq!(comps[3]["type"], "configuration.stategate");
    assert_eq!(comps[1]["name"], "orders");
    assert_eq!(
        comps[1]["capabilities"],
        json!(["ETAG", "TRANSACTIONAL", "TTL", "QUERY_API"])
    );
    // The `name` prefix keeps orders' keys apart from the default store's.
    let base = env.http();
    c.post(format!("{base}/v1.0/state/orders"))
        .json(&json!([{"key": "k", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(
        c.get(format!("{base}/v1.0/state/statestore/k"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        c.get(format!("{base}/v1.0/state/orders/k"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let doc: Value = c
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["paths"].get("/v1.0/state/{store}").is_some());
    env.stop().await;
}

/// A key set over MQTT reads over HTTP with the same version as ETag, raw bytes included;
/// an HTTP save notifies MQTT observers and SSE subscribers with the same version.
async fn cross_door_versions_and_notifications(storage: Storage) {
    let (env, c, base) = env_on(storage).await;
    let mut m = RawClient::connect(env.broker_port, &unique_id("x")).await;
    let r = m
        .request(&[b"SET", b"shared", b"\xffraw"], &[("__ts", &now_ts())])
        .await;
    let v = prop(&r, "__ts").unwrap().to_owned();
    let r = c
        .get(format!("{base}/v1.0/state/statestore/shared"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["etag"].to_str().unwrap(), v);
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert_eq!(&r.bytes().await.unwrap()[..], b"\xffraw");
    let items: Value = c
        .post(format!("{base}/v1.0/state/statestore/bulk"))
        .json(&json!({"keys": ["shared"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(items[0]["data"], "/3Jhdw==");
    assert_eq!(items[0]["metadata"]["contentEncoding"], "base64");

    // Observers: an MQTT KEYNOTIFY and an SSE subscriber.
    let mut obs = RawClient::connect(env.broker_port, "observer-x").await;
    obs.request(&[b"KEYNOTIFY", b"shared"], &[]).await;
    obs.subscribe("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/+/command/notify/+")
        .await;
    let mut sse = c
        .get(format!("{base}/v1.0-alpha1/state/statestore/subscribe?key=shared"))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.headers()["content-type"], "text/event-stream");
    // The subscription is live once the response headers arrived.
    c.post(format!("{base}/v1.0/state/statestore"))
        .json(&json!([{"key": "shared", "value": {"n": 1}}]))
        .send()
        .await
        .unwrap();
    let etag = c
        .get(format!("{base}/v1.0/state/statestore/shared"))
        .send()
        .await
        .unwrap()
        .headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let n = obs.next().await;
    assert_eq!(
        &n.payload[..],
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$7\r\n{\"n\":1}\r\n"
    );
    assert_eq!(prop(&n, "__ts"), Some(etag.as_str()));
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(crate::support::WAIT, sse.chunk())
            .await
            .expect("an event in time")
            .unwrap()
            .expect("stream open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.contains("event: set"), "{text}");
    assert!(text.contains(&format!("id: {etag}")), "{text}");
    assert!(text.contains(r#""data":{"n":1}"#), "{text}");
    env.stop().await;
}

/// `GET .../keys`: key order, glob filter, paging until no token, stores kept apart, bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_keys_pages_in_key_order_within_a_store() {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.dapr.stores =
            stategate::dapr::Stores::new(vec!["statestore".parse().unwrap(), "orders=name".parse().unwrap()]);
        c.limits.scan_page = 7;
    })
    .await;
    let (c, base) = (reqwest::Client::new(), env.http());
    let mut items: Vec<Value> = (0..50)
        .map(|i| json!({"key": format!("k{i:02}"), "value": i}))
        .collect();
    items.push(json!({"key": "other", "value": 0}));
    let resp = c
        .post(format!("{base}/v1.0/state/statestore"))
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = c
        .post(format!("{base}/v1.0/state/orders"))
        .json(&json!([{"key": "k99", "value": 1}, {"key": "a", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);

    let list = |store: &'static str, query: String| {
        let (c, base) = (c.clone(), base.clone());
        async move {
            let resp = c
                .get(format!("{base}/v1.0-alpha1/state/{store}/keys?{query}"))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            resp.json::<Value>().await.unwrap()
        }
    };
    let all = |store: &'static str, query: &'static str, limit: usize| {
        let list = &list;
        async move {
            let mut keys = Vec::new();
            let mut token: Option<String> = None;
            for _ in 0..200 {
                let mut q = format!("limit={limit}&{query}");
                if let Some(t) = &token {
                    q.push_str(&format!("&token={t}"));
                }
                let page = list(store, q).await;
                assert!(page["keys"].as_array().unwrap().len() <= limit, "{page}");
                keys.extend(
                    page["keys"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|k| k.as_str().unwrap().to_owned()),
                );
                match page["token"].as_str() {
                    Some(t) => token = Some(t.to_owned()),
                    None => return keys,
                }
            }
            panic!("paging did not end");
        }
    };
    let mut want: Vec<String> = (0..50).map(|i| format!("k{i:02}")).collect();
    want.push("other".into());
    assert_eq!(all("statestore", "", 8).await, want);
    assert_eq!(
        all("statestore", "pattern=k1*", 3).await,
        (10..20).map(|i| format!("k{i:02}")).collect::<Vec<_>>()
    );
    assert_eq!(
        all("statestore", "pattern=o%3Fher", 1000).await,
        vec!["other".to_owned()]
    );
    // A prefixed store lists its own keys, without the prefix; the default store never sees them.
    assert_eq!(all("orders", "", 1).await, vec!["a".to_owned(), "k99".to_owned()]);
    assert!(
        !all("statestore", "pattern=*99", 100)
            .await
            .iter()
            .any(|k| k.contains("99"))
    );

    for bad in ["limit=0", "limit=1001", "limit=x", "pattern=%5B", "token=zz", "bogus=1"] {
        let resp = c
            .get(format!("{base}/v1.0-alpha1/state/statestore/keys?{bad}"))
            .send()
            .await
            .unwrap();
        let (status, code, _) = error_of(resp).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST"),
            "{bad}"
        );
    }
    // A token from another store's range is refused rather than leaking its keys.
    let foreign = hex::encode_upper("k00");
    let resp = c
        .get(format!("{base}/v1.0-alpha1/state/orders/keys?token={foreign}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    env.stop().await;
}

/// GET shows the fencing token protecting a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reports_the_fencing_token() {
    let (env, c, base) = env().await;
    let token = "001700000000000:00001:lock";
    let resp = c
        .post(format!("{base}/v1.0/state/statestore"))
        .json(&json!([{"key": "fenced", "value": 1, "metadata": {"fencingToken": token}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = c
        .get(format!("{base}/v1.0/state/statestore/fenced"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["metadata.fencingToken"], token);
    env.stop().await;
}

/// stategate extensions for exact bytes over the Dapr API: a save item with metadata
/// `contentEncoding: base64` stores the decoded bytes (anything else there is a 400), a save of
/// one item answers its new version as `ETag`, and `subscribe?contentEncoding=base64` carries
/// every value as base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base64_saves_store_exact_bytes_and_one_item_saves_answer_the_version() {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let (env, c, base) = env().await;
    let url = format!("{base}/v1.0/state/statestore");
    let mut sse = c
        .get(format!(
            "{base}/v1.0-alpha1/state/statestore/subscribe?key=bin&contentEncoding=base64"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), StatusCode::OK);
    let all: Vec<u8> = (0..=255).collect();
    let r = c
        .post(&url)
        .json(&json!([{"key": "bin", "value": b64(&all), "metadata": {"contentEncoding": "base64"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    assert!(etag.parse::<stategate::hlc::Hlc>().is_ok(), "{etag}");
    let g = c.get(format!("{url}/bin")).send().await.unwrap();
    assert_eq!(g.headers()["etag"].to_str().unwrap(), etag);
    assert_eq!(g.headers()["content-type"], "application/octet-stream");
    assert_eq!(&g.bytes().await.unwrap()[..], &all[..]);

    // The event carries the same bytes, as base64.
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(crate::support::WAIT, sse.chunk())
            .await
            .expect("an event in time")
            .unwrap()
            .expect("stream open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let data = text.lines().find_map(|l| l.strip_prefix("data: ")).expect("data line");
    let event: Value = serde_json::from_str(data).unwrap();
    assert_eq!(event["data"], b64(&all));
    assert_eq!(event["metadata"]["contentEncoding"], "base64");
    assert_eq!(event["etag"], etag.as_str());

    // JSON text saved as base64 is stored as those bytes, not re-serialized.
    let r = c
        .post(&url)
        .json(&json!([{"key": "doc", "value": b64(b"{ \"b\": 1, \"a\": 2 }"), "metadata": {"contentEncoding": "base64"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let g = c.get(format!("{url}/doc")).send().await.unwrap();
    assert_eq!(&g.bytes().await.unwrap()[..], b"{ \"b\": 1, \"a\": 2 }");

    // Not base64, not a string, an unknown encoding: 400, and nothing changes.
    for (value, encoding) in [
        (json!("not base64!"), "base64"),
        (json!(42), "base64"),
        (json!({"a": 1}), "base64"),
        (json!("AP8="), "gzip"),
    ] {
        let r = c
            .post(&url)
            .json(&json!([{"key": "bin", "value": value, "metadata": {"contentEncoding": encoding}}]))
            .send()
            .await
            .unwrap();
        let (status, code, message) = error_of(r).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST"),
            "{message}"
        );
        assert!(message.contains("contentEncoding"), "{message}");
    }
    let g = c.get(format!("{url}/bin")).send().await.unwrap();
    assert_eq!(g.headers()["etag"].to_str().unwrap(), etag);

    // Several items: no single version to answer.
    let r = c
        .post(&url)
        .json(&json!([{"key": "a", "value": 1}, {"key": "b", "value": 2}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(r.headers().get("etag").is_none());
    let r = c
        .get(format!(
            "{base}/v1.0-alpha1/state/statestore/subscribe?key=bin&contentEncoding=gzip"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    env.stop().await;
}
