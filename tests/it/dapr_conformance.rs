//! Dapr's own state conformance scenarios (spec section 4), ported as black-box tests against the
//! HTTP door: typed values, delete, bulk, transactions, ETags, first-write, TTL (expiry observed
//! through the change stream, never by sleeping), query, the `metadata.<name>` query form,
//! PUT = POST, percent-encoded keys and stores with key prefixes.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Broker, TestEnv, WAIT};

/// A Dapr HTTP client for one store.
struct Dapr {
    c: reqwest::Client,
    base: String,
    store: String,
}

/// A GET answer.
struct Got {
    status: StatusCode,
    etag: Option<String>,
    ttl_expire: Option<String>,
    content_type: Option<String>,
    body: Bytes,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
}

/// A key as one percent-encoded path segment (everything but RFC 3986 unreserved bytes).
fn seg(key: &str) -> String {
    let mut s = String::new();
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            s.push(b as char);
        } else {
            let _ = write!(s, "%{b:02X}");
        }
    }
    s
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().expect("text header").to_owned())
}

impl Dapr {
    fn new(env: &TestEnv, store: &str) -> Dapr {
        Dapr {
            c: reqwest::Client::new(),
            base: env.http(),
            store: store.to_owned(),
        }
    }

    fn state(&self) -> String {
        format!("{}/v1.0/state/{}", self.base, self.store)
    }

    fn key_url(&self, key: &str) -> String {
        format!("{}/{}", self.state(), seg(key))
    }

    fn query_url(&self) -> String {
        format!("{}/v1.0-alpha1/state/{}/query", self.base, self.store)
    }

    async fn save(&self, items: Value) -> reqwest::Response {
        self.c.post(self.state()).json(&items).send().await.expect("save")
    }

    async fn save_ok(&self, items: Value) {
        let r = self.save(items.clone()).await;
        let status = r.status();
        assert_eq!(status, StatusCode::NO_CONTENT, "{items}: {}", r.text().await.unwrap());
    }

    async fn get_url(&self, url: &str) -> Got {
        let r = self.c.get(url).send().await.expect("get");
        Got {
            status: r.status(),
            etag: header(&r, "etag"),
            ttl_expire: header(&r, "metadata.ttlExpireTime"),
            content_type: header(&r, "content-type"),
            body: r.bytes().await.expect("body"),
        }
    }

    async fn get(&self, key: &str) -> Got {
        self.get_url(&self.key_url(key)).await
    }

    /// The current ETag of an existing key.
    async fn etag(&self, key: &str) -> String {
        let g = self.get(key).await;
        assert_eq!(g.status, StatusCode::OK, "{key}");
        g.etag.expect("an ETag on every read of an existing key")
    }

    /// Whether a key exists: 200 or 204, nothing else.
    async fn exists(&self, key: &str) -> bool {
        let g = self.get(key).await;
        match g.status {
            StatusCode::OK => true,
            StatusCode::NO_CONTENT => {
                assert!(g.body.is_empty(), "{key}: a 204 has no body");
                false
            }
            s => panic!("GET {key}: {s} {:?}", g.body),
        }
    }

    async fn bulk(&self, keys: &[&str]) -> Vec<Value> {
        let r = self
            .c
            .post(format!("{}/bulk", self.state()))
            .json(&json!({ "keys": keys }))
            .send()
            .await
            .expect("bulk");
        assert_eq!(r.status(), StatusCode::OK);
        let items: Vec<Value> = r.json().await.expect("bulk items");
        assert_eq!(items.len(), keys.len());
        for (item, key) in items.iter().zip(keys) {
            assert_eq!(item["key"], *key, "bulk items come in request order");
        }
        items
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> reqwest::Response {
        let mut req = self.c.delete(self.key_url(key));
        if let Some(e) = if_match {
            req = req.header("If-Match", e);
        }
        req.send().await.expect("delete")
    }

    async fn tx(&self, body: Value) -> reqwest::Response {
        self.c
            .post(format!("{}/transaction", self.state()))
            .json(&body)
            .send()
            .await
            .expect("transaction")
    }

    async fn tx_ok(&self, body: Value) {
        let r = self.tx(body.clone()).await;
        let status = r.status();
        assert_eq!(status, StatusCode::NO_CONTENT, "{body}: {}", r.text().await.unwrap());
    }

    /// A query: `(status, body)`; the body is `Null` on 204.
    async fn query(&self, q: &Value) -> (StatusCode, Value) {
        let r = self.c.post(self.query_url()).json(q).send().await.expect("query");
        let status = r.status();
        let bytes = r.bytes().await.expect("query body");
        if status == StatusCode::NO_CONTENT {
            assert!(bytes.is_empty());
            return (status, Value::Null);
        }
        (status, serde_json::from_slice(&bytes).expect("query answer is JSON"))
    }
}

/// Asserts Dapr's error shape, status and code; returns the message.
async fn expect_error(r: reqwest::Response, status: StatusCode, code: &str) -> String {
    let got = r.status();
    let ct = header(&r, "content-type").unwrap_or_default();
    let text = r.text().await.expect("error body");
    assert_eq!(got, status, "{text}");
    assert!(ct.starts_with("application/json"), "{ct}: {text}");
    let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(body["errorCode"], code, "{text}");
    body["message"].as_str().expect("message").to_owned()
}

/// The values of `keys` through bulk get (`None` for a missing key, which must be `{key}` alone).
async fn bulk_data(d: &Dapr, keys: &[&str]) -> Vec<Option<Value>> {
    d.bulk(keys)
        .await
        .into_iter()
        .map(|item| match item.get("data") {
            Some(v) => {
                assert!(item["etag"].is_string(), "{item}");
                Some(v.clone())
            }
            None => {
                assert_eq!(item, json!({ "key": item["key"] }), "a missing key is {{key}} alone");
                None
            }
        })
        .collect()
}

/// Server-sent events of the change stream.
struct Events {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Ev {
    event: String,
    id: String,
    data: Value,
}

impl Events {
    /// Subscribes; the subscription is live once the response headers arrived.
    async fn open(d: &Dapr, query: &str) -> Events {
        let url = format!("{}/v1.0-alpha1/state/{}/subscribe?{query}", d.base, d.store);
        let resp = d.c.get(url).send().await.expect("subscribe");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Events { resp, buf: Vec::new() }
    }

    /// The next event (keep-alive comments skipped). The caller bounds the wait.
    async fn next(&mut self) -> Ev {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..i + 2).collect();
                let block = String::from_utf8(block).expect("events are UTF-8");
                let (mut event, mut id, mut data) = (String::from("message"), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim_start().to_owned();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim_start().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
                return Ev { event, id, data };
            }
            let chunk = self.resp.chunk().await.expect("stream").expect("stream open");
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// The next event within [`WAIT`].
    async fn next_in_time(&mut self) -> Ev {
        tokio::time::timeout(WAIT, self.next()).await.expect("an event in time")
    }
}

async fn env() -> (TestEnv, Dapr) {
    let env = TestEnv::start(Broker::Embedded).await;
    let d = Dapr::new(&env, "statestore");
    (env, d)
}

/// Dapr's conformance "set/get" over typed values: what goes in as JSON comes back as the
/// same JSON text (compact), through GET and bulk get; then delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_values_round_trip() {
    let (env, d) = env().await;
    let raw: &[u8] = &[0, 1, 2, 0xfe, 0xff];
    let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
    let cases: Vec<(&str, Value)> = vec![
        ("int", json!(42)),
        ("negative-int", json!(-7)),
        ("large-int", json!(9_007_199_254_740_993_i64)),
        ("float", json!(3.25)),
        ("bool-true", json!(true)),
        ("bool-false", json!(false)),
        ("bytes", json!(b64)),
        ("string", json!("hello world")),
        ("empty-string", json!("")),
        ("unicode-string", json!("ünïcødé ключ 鍵 \u{1F600}")),
        ("escapes", json!("quote \" backslash \\ newline \n tab \t")),
        (
            "object",
            json!({"name": "Dapr", "nested": {"list": [1, "two", null, {"x": false}]}, "n": 1.5}),
        ),
        ("empty-object", json!({})),
        ("array", json!([1, 2, 3])),
    ];
    let items: Vec<Value> = cases.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
    d.save_ok(Value::Array(items)).await;

    for (key, value) in &cases {
        let g = d.get(key).await;
        assert_eq!(g.status, StatusCode::OK, "{key}");
        assert_eq!(g.content_type.as_deref(), Some("application/json"), "{key}");
        assert!(g.etag.is_some(), "{key}");
        assert_eq!(&g.json(), value, "{key}");
        if !value.is_object() {
            // Scalars and arrays are stored as their compact JSON text, byte for byte.
            assert_eq!(&g.body[..], serde_json::to_vec(value).unwrap(), "{key}");
        }
    }
    // Bytes travel as a base64 JSON string and decode back to the same bytes.
    let g = d.get("bytes").await;
    let s: String = serde_json::from_slice(&g.body).unwrap();
    assert_eq!(base64::engine::general_purpose::STANDARD.decode(s).unwrap(), raw);
    // The empty string is a value (`""`), not a missing key.
    assert_eq!(&d.get("empty-string").await.body[..], b"\"\"");

    let keys: Vec<&str> = cases.iter().map(|(k, _)| *k).collect();
    let got = bulk_data(&d, &keys).await;
    for ((key, value), got) in cases.iter().zip(got) {
        assert_eq!(got.as_ref(), Some(value), "bulk {key}");
    }

    // Overwrite with another type, then delete.
    d.save_ok(json!([{"key": "int", "value": "now a string"}])).await;
    assert_eq!(d.get("int").await.json(), json!("now a string"));
    for (key, _) in &cases {
        let r = d.delete(key, None).await;
        assert_eq!(r.status(), StatusCode::NO_CONTENT, "{key}");
        assert!(!d.exists(key).await, "{key} deleted");
    }
    assert!(bulk_data(&d, &keys).await.iter().all(Option::is_none));
    env.stop().await;
}

/// Bulk set, bulk get with a missing key in the middle, bulk delete (Dapr's HTTP API has no
/// bulk delete: several DELETEs), and a partial bulk delete whose stale item is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_set_get_and_delete() {
    let (env, d) = env().await;
    let keys = ["bulk-1", "bulk-2", "bulk-3", "bulk-4", "bulk-5"];
    let items: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"key": k, "value": {"n": i, "tag": format!("v{i}")}}))
        .collect();
    d.save_ok(Value::Array(items)).await;

    let asked = ["bulk-3", "bulk-missing", "bulk-1", "bulk-5", "bulk-2", "bulk-4"];
    let items = d.bulk(&asked).await;
    assert_eq!(items[1], json!({"key": "bulk-missing"}));
    for item in items.iter().filter(|i| i["key"] != "bulk-missing") {
        let key = item["key"].as_str().unwrap();
        let n: usize = key.trim_start_matches("bulk-").parse::<usize>().unwrap() - 1;
        assert_eq!(item["data"], json!({"n": n, "tag": format!("v{n}")}), "{key}");
        assert_eq!(item["etag"].as_str(), Some(d.etag(key).await.as_str()), "{key}");
    }
    // `parallelism` and `metadata` are accepted.
    let r =
        d.c.post(format!("{}/bulk", d.state()))
            .json(&json!({"keys": ["bulk-1"], "parallelism": 10, "metadata": {"partitionKey": "p"}}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // Bulk delete: the first two.
    for key in &keys[..2] {
        assert_eq!(d.delete(key, None).await.status(), StatusCode::NO_CONTENT, "{key}");
    }
    assert_eq!(
        bulk_data(&d, &keys)
            .await
            .iter()
            .map(Option::is_some)
            .collect::<Vec<_>>(),
        [false, false, true, true, true]
    );

    // Partial bulk delete: bulk-4 with a stale ETag is refused (409), the others go.
    let stale = d.etag("bulk-4").await;
    d.save_ok(json!([{"key": "bulk-4", "value": "changed"}])).await;
    let current3 = d.etag("bulk-3").await;
    let r = d.delete("bulk-3", Some(&current3)).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    expect_error(
        d.delete("bulk-4", Some(&stale)).await,
        StatusCode::CONFLICT,
        "ERR_STATE_DELETE",
    )
    .await;
    assert_eq!(d.delete("bulk-5", None).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        bulk_data(&d, &keys).await,
        [None, None, None, Some(json!("changed")), None]
    );
    // Deleting missing keys is fine.
    for key in ["bulk-1", "never-existed"] {
        assert_eq!(d.delete(key, None).await.status(), StatusCode::NO_CONTENT, "{key}");
    }
    env.stop().await;
}

/// Transactions in groups (each group visible after its commit), a transaction that deletes a
/// missing key, and the order scenario (sent with PUT, keys not all pre-existing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_in_groups_and_in_order() {
    let (env, d) = env().await;
    let up = |k: &str, v: Value| json!({"operation": "upsert", "request": {"key": k, "value": v}});
    let del = |k: &str| json!({"operation": "delete", "request": {"key": k}});
    let all = ["tx-a", "tx-b", "tx-c", "tx-d", "tx-e"];

    // Group 1: upserts only.
    d.tx_ok(json!({"operations": [up("tx-a", json!(1)), up("tx-b", json!("two")), up("tx-c", json!({"c": 3}))]}))
        .await;
    assert_eq!(
        bulk_data(&d, &all).await,
        [Some(json!(1)), Some(json!("two")), Some(json!({"c": 3})), None, None]
    );
    // Group 2: upserts and deletes mixed.
    d.tx_ok(json!({"operations": [del("tx-a"), up("tx-d", json!(true)), up("tx-b", json!("deux")), del("tx-c")]}))
        .await;
    assert_eq!(
        bulk_data(&d, &all).await,
        [None, Some(json!("deux")), None, Some(json!(true)), None]
    );
    // Group 3: deletes only, one of a key that never existed.
    d.tx_ok(json!({"operations": [del("tx-b"), del("tx-d"), del("tx-never")]}))
        .await;
    assert!(bulk_data(&d, &all).await.iter().all(Option::is_none));

    // A transaction deleting a missing key succeeds on its own too, and changes nothing.
    d.tx_ok(json!({"operations": [del("tx-missing")]})).await;
    assert!(!d.exists("tx-missing").await);

    // Order: delete k1, upsert k2, delete k2, upsert k3 -> k1 and k2 gone, k3 present.
    d.save_ok(json!([{"key": "ord-1", "value": "old"}])).await;
    let ops = json!({"operations": [del("ord-1"), up("ord-2", json!(2)), del("ord-2"), up("ord-3", json!(3))]});
    let r =
        d.c.put(format!("{}/transaction", d.state()))
            .json(&ops)
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        bulk_data(&d, &["ord-1", "ord-2", "ord-3"]).await,
        [None, None, Some(json!(3))]
    );
    // And the other way round: upsert then delete then upsert of one key leaves the last value.
    d.tx_ok(json!({"operations": [up("ord-4", json!("a")), del("ord-4"), up("ord-4", json!("b"))]}))
        .await;
    assert_eq!(d.get("ord-4").await.json(), json!("b"));
    // Every transaction upsert gets an ETag like any write.
    let e = d.etag("ord-4").await;
    assert!(e.parse::<stategate::hlc::Hlc>().is_ok(), "{e}");
    env.stop().await;
}

/// ETags: malformed ones are refused (400) at every door of the store, every write makes a new
/// one, and a multi-item save applies its good items while reporting the bad one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etag_rules() {
    let (env, d) = env().await;
    d.save_ok(json!([{"key": "e", "value": 0}])).await;
    let first = d.etag("e").await;

    for bad in ["not-a-version", "1", "123:45", "abc:def:node", "000000000000001:00000:"] {
        let r = d.save(json!([{"key": "e", "value": 1, "etag": bad}])).await;
        expect_error(r, StatusCode::BAD_REQUEST, "ERR_STATE_SAVE").await;
        let r = d.delete("e", Some(bad)).await;
        expect_error(r, StatusCode::BAD_REQUEST, "ERR_STATE_DELETE").await;
        let r = d
            .tx(json!({"operations": [{"operation": "upsert", "request": {"key": "e", "value": 1, "etag": bad}}]}))
            .await;
        assert_eq!(
            r.status(),
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            r.text().await.unwrap()
        );
    }
    assert_eq!(d.etag("e").await, first, "refused writes change nothing");

    // A new ETag on every write, whatever the route.
    let mut seen = vec![first.clone()];
    let mut etag = first;
    for i in 1..=4 {
        d.save_ok(json!([{"key": "e", "value": i, "etag": etag}])).await;
        etag = d.etag("e").await;
        seen.push(etag.clone());
    }
    d.c.put(d.state())
        .json(&json!([{"key": "e", "value": "put"}]))
        .send()
        .await
        .unwrap();
    seen.push(d.etag("e").await);
    d.tx_ok(json!({"operations": [{"operation": "upsert", "request": {"key": "e", "value": "tx"}}]}))
        .await;
    seen.push(d.etag("e").await);
    // Same value again: still a new write, still a new ETag.
    d.save_ok(json!([{"key": "e", "value": "tx"}])).await;
    seen.push(d.etag("e").await);
    // Deleted and re-created: a new ETag again.
    assert_eq!(d.delete("e", None).await.status(), StatusCode::NO_CONTENT);
    d.save_ok(json!([{"key": "e", "value": "again"}])).await;
    seen.push(d.etag("e").await);
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "{seen:?}");
    // Bulk get reports the same ETag as GET.
    assert_eq!(
        d.bulk(&["e"]).await[0]["etag"].as_str(),
        seen.last().map(String::as_str)
    );

    // Partial bulk save: a stale ETag in the middle is a 409, the good items still land.
    d.save_ok(json!([{"key": "p-mid", "value": "orig"}])).await;
    let stale = d.etag("p-mid").await;
    d.save_ok(json!([{"key": "p-mid", "value": "moved on"}])).await;
    let current = d.etag("p-mid").await;
    let r = d
        .save(json!([
            {"key": "p-first", "value": "first"},
            {"key": "p-mid", "value": "lost", "etag": stale},
            {"key": "p-last", "value": "last"},
        ]))
        .await;
    expect_error(r, StatusCode::CONFLICT, "ERR_STATE_SAVE").await;
    assert_eq!(
        bulk_data(&d, &["p-first", "p-mid", "p-last"]).await,
        [Some(json!("first")), Some(json!("moved on")), Some(json!("last"))]
    );
    assert_eq!(d.etag("p-mid").await, current, "the refused item did not write");

    // The same with a malformed ETag in the middle: 400, good items land.
    let r = d
        .save(json!([
            {"key": "q-first", "value": 1},
            {"key": "p-mid", "value": "lost", "etag": "bogus"},
            {"key": "q-last", "value": 2},
        ]))
        .await;
    expect_error(r, StatusCode::BAD_REQUEST, "ERR_STATE_SAVE").await;
    assert_eq!(
        bulk_data(&d, &["q-first", "p-mid", "q-last"]).await,
        [Some(json!(1)), Some(json!("moved on")), Some(json!(2))]
    );

    // A write with the current ETag in a multi-item save succeeds; a stale one in a
    // transaction fails the whole transaction.
    d.save_ok(json!([{"key": "p-mid", "value": "ok", "etag": current}, {"key": "p-first", "value": "f2"}]))
        .await;
    let r = d
        .tx(json!({"operations": [
            {"operation": "upsert", "request": {"key": "p-last", "value": "tx"}},
            {"operation": "delete", "request": {"key": "p-mid", "etag": current}},
        ]}))
        .await;
    expect_error(r, StatusCode::INTERNAL_SERVER_ERROR, "ERR_STATE_TRANSACTION").await;
    assert_eq!(
        bulk_data(&d, &["p-first", "p-mid", "p-last"]).await,
        [Some(json!("f2")), Some(json!("ok")), Some(json!("last"))]
    );
    env.stop().await;
}

/// First-write concurrency: the first write without ETag lands, a second one (ETag absent or
/// empty) conflicts, a stale ETag conflicts, the current ETag wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_write_concurrency() {
    let (env, d) = env().await;
    let fw = json!({"concurrency": "first-write"});
    d.save_ok(json!([{"key": "fw", "value": 1, "options": fw}])).await;
    let v1 = d.etag("fw").await;

    let r = d.save(json!([{"key": "fw", "value": 2, "options": fw}])).await;
    expect_error(r, StatusCode::CONFLICT, "ERR_STATE_SAVE").await;
    let r = d
        .save(json!([{"key": "fw", "value": 2, "etag": "", "options": fw}]))
        .await;
    expect_error(r, StatusCode::CONFLICT, "ERR_STATE_SAVE").await;
    assert_eq!(d.get("fw").await.json(), json!(1));

    d.save_ok(json!([{"key": "fw", "value": 3, "etag": v1, "options": fw}]))
        .await;
    let r = d
        .save(json!([{"key": "fw", "value": 4, "etag": v1, "options": fw}]))
        .await;
    expect_error(r, StatusCode::CONFLICT, "ERR_STATE_SAVE").await;
    assert_eq!(d.get("fw").await.json(), json!(3));

    // Last-write (explicit or default) overwrites without an ETag.
    d.save_ok(json!([{"key": "fw", "value": 5, "options": {"concurrency": "last-write"}}]))
        .await;
    d.save_ok(json!([{"key": "fw", "value": 6, "etag": ""}])).await;
    assert_eq!(d.get("fw").await.json(), json!(6));

    // First-write in a transaction on an existing key: the transaction fails, nothing lands.
    let r = d
        .tx(json!({"operations": [
            {"operation": "upsert", "request": {"key": "fw-other", "value": 1}},
            {"operation": "upsert", "request": {"key": "fw", "value": 7, "options": fw}},
        ]}))
        .await;
    expect_error(r, StatusCode::INTERNAL_SERVER_ERROR, "ERR_STATE_TRANSACTION").await;
    assert!(!d.exists("fw-other").await);
    // ... and on a new key it is an ordinary create.
    d.tx_ok(json!({"operations": [{"operation": "upsert", "request": {"key": "fw-new", "value": 1, "options": fw}}]}))
        .await;
    assert!(d.exists("fw-new").await);

    // First-write delete: refused without an ETag, accepted with the current one.
    let r =
        d.c.delete(format!("{}?concurrency=first-write", d.key_url("fw")))
            .header("If-Match", "")
            .send()
            .await
            .unwrap();
    expect_error(r, StatusCode::CONFLICT, "ERR_STATE_DELETE").await;
    let current = d.etag("fw").await;
    let r =
        d.c.delete(format!("{}?concurrency=first-write", d.key_url("fw")))
            .header("If-Match", &current)
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(!d.exists("fw").await);
    env.stop().await;
}

fn parse_expire(s: &str) -> SystemTime {
    humantime::parse_rfc3339(s).unwrap_or_else(|e| panic!("ttlExpireTime {s:?}: {e}"))
}

/// TTL: non-integers are refused (body metadata and query form), `ttlExpireTime` is reported
/// by GET and bulk get, `-1` or no TTL removes the expiry, the query form wins over the item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_metadata() {
    let (env, d) = env().await;
    for bad in [
        "soon",
        "1.5",
        "1e3",
        "0x10",
        "ten",
        "-2",
        "0",
        "99999999999999999999999",
    ] {
        let r = d
            .save(json!([{"key": "ttl-bad", "value": 1, "metadata": {"ttlInSeconds": bad}}]))
            .await;
        expect_error(r, StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST").await;
        let r =
            d.c.post(format!("{}?metadata.ttlInSeconds={}", d.state(), seg(bad)))
                .json(&json!([{"key": "ttl-bad", "value": 1}]))
                .send()
                .await
                .unwrap();
        expect_error(r, StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST").await;
        let r = d
            .tx(
                json!({"operations": [{"operation": "upsert", "request": {"key": "ttl-bad", "value": 1,
                "metadata": {"ttlInSeconds": bad}}}]}),
            )
            .await;
        expect_error(r, StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST").await;
    }
    assert!(!d.exists("ttl-bad").await, "nothing written");

    // ttlExpireTime on GET and in bulk items.
    let before = SystemTime::now();
    d.save_ok(json!([{"key": "ttl", "value": 1, "metadata": {"ttlInSeconds": "100"}}]))
        .await;
    let g = d.get("ttl").await;
    let after = SystemTime::now();
    let exp = g.ttl_expire.expect("metadata.ttlExpireTime on GET");
    let t = parse_expire(&exp);
    // RFC 3339 at second precision: at most one second below the exact deadline.
    assert!(t + Duration::from_secs(1) >= before + Duration::from_secs(100), "{exp}");
    assert!(t <= after + Duration::from_secs(100), "{exp}");
    let items = d.bulk(&["ttl"]).await;
    assert_eq!(items[0]["metadata"]["ttlExpireTime"].as_str(), Some(exp.as_str()));

    // `-1` removes it.
    d.save_ok(json!([{"key": "ttl", "value": 2, "metadata": {"ttlInSeconds": "-1"}}]))
        .await;
    let g = d.get("ttl").await;
    assert_eq!((g.status, g.ttl_expire), (StatusCode::OK, None));
    assert!(d.bulk(&["ttl"]).await[0].get("metadata").is_none());

    // No TTL removes it too (set again first).
    d.save_ok(json!([{"key": "ttl", "value": 3, "metadata": {"ttlInSeconds": "100"}}]))
        .await;
    assert!(d.get("ttl").await.ttl_expire.is_some());
    d.save_ok(json!([{"key": "ttl", "value": 4, "metadata": {}}])).await;
    assert_eq!(d.get("ttl").await.ttl_expire, None);

    // The `metadata.<name>` query form on save (PUT); query wins over item metadata.
    let r = d
        .c
        .put(format!("{}?metadata.ttlInSeconds=100", d.state()))
        .json(&json!([{"key": "ttl-q", "value": 1}, {"key": "ttl-q2", "value": 2, "metadata": {"ttlInSeconds": "-1"}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(d.get("ttl-q").await.ttl_expire.is_some());
    assert!(d.get("ttl-q2").await.ttl_expire.is_some(), "query metadata wins");
    let r =
        d.c.post(format!("{}?metadata.ttlInSeconds=-1", d.state()))
            .json(&json!([{"key": "ttl-q", "value": 1, "metadata": {"ttlInSeconds": "100"}}]))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(d.get("ttl-q").await.ttl_expire, None, "query metadata wins");

    // TTL through a transaction: per operation and as transaction metadata.
    d.tx_ok(json!({"operations": [
        {"operation": "upsert", "request": {"key": "ttl-t1", "value": 1, "metadata": {"ttlInSeconds": "100"}}},
        {"operation": "upsert", "request": {"key": "ttl-t2", "value": 2}},
    ]}))
    .await;
    assert!(d.get("ttl-t1").await.ttl_expire.is_some());
    assert!(d.get("ttl-t2").await.ttl_expire.is_none());
    d.tx_ok(
        json!({"operations": [{"operation": "upsert", "request": {"key": "ttl-t2", "value": 3}}],
        "metadata": {"ttlInSeconds": "100"}}),
    )
    .await;
    assert!(d.get("ttl-t2").await.ttl_expire.is_some());
    let r =
        d.c.post(format!("{}/transaction?metadata.ttlInSeconds=-1", d.state()))
            .json(&json!({"operations": [{"operation": "upsert", "request": {"key": "ttl-t2", "value": 4}}]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(d.get("ttl-t2").await.ttl_expire.is_none());

    // Other metadata names are accepted and ignored on every route.
    let r =
        d.c.get(format!(
            "{}?metadata.partitionKey=p&consistency=strong",
            d.key_url("ttl-t2")
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r =
        d.c.delete(format!(
            "{}?metadata.partitionKey=p&consistency=eventual",
            d.key_url("ttl-t2")
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    env.stop().await;
}

/// A key saved with `ttlInSeconds: 1` is gone after expiry: the change stream reports the
/// `set` and then a `delete` with `reason: expired`; GET and bulk get then miss it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_removes_the_key() {
    let (env, d) = env().await;
    let mut events = Events::open(&d, "key=short-lived").await;
    d.save_ok(json!([{"key": "short-lived", "value": {"v": 1}, "metadata": {"ttlInSeconds": "100"}}]))
        .await;
    let etag = d.etag("short-lived").await;
    let set = events.next_in_time().await;
    assert_eq!(set.event, "set", "{set:?}");
    assert_eq!(set.id, etag);
    assert_eq!(set.data["key"], "short-lived");
    assert_eq!(set.data["data"], json!({"v": 1}));

    // The 100 seconds pass on the service's clock, not on ours.
    env.advance(100_000);
    let expired = tokio::time::timeout(WAIT, async {
        loop {
            let ev = events.next().await;
            if ev.event == "delete" && ev.data["reason"] == "expired" {
                return ev;
            }
        }
    })
    .await
    .expect("the expiry event in time");
    assert_eq!(expired.data["key"], "short-lived");
    assert!(!d.exists("short-lived").await);
    assert_eq!(d.bulk(&["short-lived"]).await[0], json!({"key": "short-lived"}));

    // An etag of the expired key no longer matches.
    let r = d.save(json!([{"key": "short-lived", "value": 2, "etag": etag}])).await;
    expect_error(r, StatusCode::CONFLICT, "ERR_STATE_SAVE").await;
    env.stop().await;
}

fn keys_of(page: &Value) -> Vec<String> {
    page["results"]
        .as_array()
        .unwrap_or_else(|| panic!("results: {page}"))
        .iter()
        .map(|r| r["key"].as_str().expect("key").to_owned())
        .collect()
}

/// Query: EQ, IN, AND, OR filters (nested paths), sort ascending and descending on one and two
/// keys, and paging with limit and token through every page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_filters_sort_and_paging() {
    let (env, d) = env().await;
    // (key, org, id, city, state)
    let people = [
        ("q1", "Dev Ops", 1036, "Seattle", "WA"),
        ("q2", "Hardware", 1041, "Portland", "OR"),
        ("q3", "Finance", 1039, "Spokane", "WA"),
        ("q4", "Dev Ops", 1042, "San Jose", "CA"),
        ("q5", "Hardware", 1037, "Seattle", "WA"),
        ("q6", "Finance", 1040, "Los Angeles", "CA"),
        ("q7", "Dev Ops", 1038, "Eugene", "OR"),
    ];
    let items: Vec<Value> = people
        .iter()
        .map(|(k, org, id, city, st)| {
            json!({"key": k, "value": {"person": {"org": org, "id": id}, "city": city, "state": st}})
        })
        .collect();
    d.save_ok(Value::Array(items)).await;
    // Not a document that any filter below matches.
    d.save_ok(json!([{"key": "q-other", "value": "just a string"}])).await;

    type Person<'a> = (&'a str, &'a str, i32, &'a str, &'a str);
    let sorted_keys = |pred: &dyn Fn(&Person) -> bool| -> Vec<String> {
        let mut v: Vec<_> = people.iter().filter(|p| pred(p)).collect();
        v.sort_by_key(|p| p.2);
        v.into_iter().map(|p| p.0.to_owned()).collect()
    };
    let by_id = json!([{"key": "person.id", "order": "ASC"}]);
    let cases: Vec<(Value, Vec<String>)> = vec![
        (json!({"EQ": {"state": "WA"}}), sorted_keys(&|p| p.4 == "WA")),
        (
            json!({"EQ": {"person.org": "Dev Ops"}}),
            sorted_keys(&|p| p.1 == "Dev Ops"),
        ),
        (json!({"EQ": {"person.id": 1040}}), sorted_keys(&|p| p.2 == 1040)),
        (
            json!({"IN": {"state": ["CA", "OR"]}}),
            sorted_keys(&|p| p.4 == "CA" || p.4 == "OR"),
        ),
        (
            json!({"IN": {"person.id": [1036, 1042, 9999]}}),
            sorted_keys(&|p| p.2 == 1036 || p.2 == 1042),
        ),
        (
            json!({"AND": [{"EQ": {"person.org": "Dev Ops"}}, {"IN": {"state": ["WA", "CA"]}}]}),
            sorted_keys(&|p| p.1 == "Dev Ops" && (p.4 == "WA" || p.4 == "CA")),
        ),
        (
            json!({"OR": [{"EQ": {"city": "Seattle"}}, {"EQ": {"person.id": 1041}}]}),
            sorted_keys(&|p| p.3 == "Seattle" || p.2 == 1041),
        ),
        (
            json!({"OR": [{"AND": [{"EQ": {"state": "CA"}}, {"EQ": {"person.org": "Finance"}}]}, {"EQ": {"city": "Eugene"}}]}),
            sorted_keys(&|p| (p.4 == "CA" && p.1 == "Finance") || p.3 == "Eugene"),
        ),
        (json!({"EQ": {"state": "TX"}}), vec![]),
    ];
    for (filter, want) in cases {
        let (status, page) = d.query(&json!({"filter": filter, "sort": by_id})).await;
        if want.is_empty() {
            assert_eq!(status, StatusCode::NO_CONTENT, "{filter}: {page}");
            continue;
        }
        assert_eq!(status, StatusCode::OK, "{filter}");
        assert_eq!(keys_of(&page), want, "{filter}");
        assert!(page.get("token").is_none(), "{filter}: one page");
    }

    // Results carry the value as `data` and the key's ETag.
    let (_, page) = d.query(&json!({"filter": {"EQ": {"person.id": 1039}}})).await;
    assert_eq!(page["results"][0]["data"]["city"], "Spokane");
    assert_eq!(page["results"][0]["etag"].as_str(), Some(d.etag("q3").await.as_str()));

    // Sort descending; then two sort keys (state DESC, then id ASC).
    let (_, page) = d
        .query(&json!({"filter": {"EQ": {"state": "WA"}}, "sort": [{"key": "person.id", "order": "DESC"}]}))
        .await;
    let mut want = sorted_keys(&|p| p.4 == "WA");
    want.reverse();
    assert_eq!(keys_of(&page), want);
    let (_, page) = d
        .query(&json!({"filter": {}, "sort": [{"key": "state", "order": "DESC"}, {"key": "person.id"}]}))
        .await;
    let mut want: Vec<_> = people.iter().collect();
    want.sort_by(|a, b| b.4.cmp(a.4).then(a.2.cmp(&b.2)));
    let want: Vec<String> = want.into_iter().map(|p| p.0.to_owned()).collect();
    let got: Vec<String> = keys_of(&page).into_iter().filter(|k| k != "q-other").collect();
    assert_eq!(got, want);
    let (_, page) = d
        .query(&json!({"sort": [{"key": "city", "order": "ASC"}], "filter": {"IN": {"state": ["WA", "OR", "CA"]}}}))
        .await;
    let mut cities: Vec<&str> = people.iter().map(|p| p.3).collect();
    cities.sort();
    let got: Vec<String> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["data"]["city"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, cities);

    // Paging: limit 3 through every page, with and without a filter, POST and PUT.
    let documents = json!({"GT": {"person.id": 0}});
    for (filter, want) in [
        (documents.clone(), sorted_keys(&|_| true)),
        (
            json!({"AND": [documents, {"NEQ": {"state": "CA"}}]}),
            sorted_keys(&|p| p.4 != "CA"),
        ),
    ] {
        let mut got = Vec::new();
        let mut token: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut q = json!({"filter": filter, "sort": by_id, "page": {"limit": 3}});
            if let Some(t) = &token {
                q["page"]["token"] = json!(t);
            }
            let req = if pages % 2 == 0 {
                d.c.post(d.query_url())
            } else {
                d.c.put(d.query_url())
            };
            let r = req.json(&q).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{q}");
            let body: Value = r.json().await.unwrap();
            let keys = keys_of(&body);
            assert!(!keys.is_empty() && keys.len() <= 3, "{body}");
            got.extend(keys);
            pages += 1;
            assert!(pages <= 10, "paging terminates");
            match body.get("token").and_then(Value::as_str) {
                Some(t) => token = Some(t.to_owned()),
                None => break,
            }
        }
        assert_eq!(got, want, "{filter}");
        assert_eq!(pages, want.len().div_ceil(3), "{filter}");
    }
    env.stop().await;
}

/// PUT is POST on save, bulk get, transaction and query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_equals_post() {
    let (env, d) = env().await;
    let r =
        d.c.put(d.state())
            .json(&json!([{"key": "put-1", "value": {"x": 1}}, {"key": "put-2", "value": 2}]))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r =
        d.c.put(format!("{}/bulk", d.state()))
            .json(&json!({"keys": ["put-2", "put-none", "put-1"]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let items: Value = r.json().await.unwrap();
    assert_eq!(items[0]["data"], json!(2));
    assert_eq!(items[1], json!({"key": "put-none"}));
    assert_eq!(items[2]["data"], json!({"x": 1}));
    let r =
        d.c.put(format!("{}/transaction", d.state()))
            .json(&json!({"operations": [
                {"operation": "delete", "request": {"key": "put-2"}},
                {"operation": "upsert", "request": {"key": "put-3", "value": {"x": 3}}},
            ]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        bulk_data(&d, &["put-1", "put-2", "put-3"]).await,
        [Some(json!({"x": 1})), None, Some(json!({"x": 3}))]
    );
    let r =
        d.c.put(d.query_url())
            .json(&json!({"filter": {"IN": {"x": [1, 3]}}, "sort": [{"key": "x", "order": "DESC"}]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(keys_of(&r.json().await.unwrap()), ["put-3", "put-1"]);
    // PUT errors look like POST errors.
    let r = d.c.put(d.state()).body("{").send().await.unwrap();
    expect_error(r, StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST").await;
    env.stop().await;
}

/// Keys that need percent-encoding in the path round trip through save (body), GET, bulk get,
/// the change stream and DELETE (path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percent_encoded_keys_round_trip() {
    let (env, d) = env().await;
    let keys = [
        "a/b",
        "a%2Fb",
        "with space",
        "  leading and trailing  ",
        "ünïcødé ключ 鍵 \u{1F511}",
        "100%",
        "q?x=1&y=2",
        "hash#tag",
        "plus+sign",
        "semi;colon,comma=equals",
        "tab\there",
        "new\nline",
        "quote\"apostrophe'",
        "back\\slash",
        "dots...",
        "~tilde_under-dash.",
    ];
    let items: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"key": k, "value": {"i": i}}))
        .collect();
    d.save_ok(Value::Array(items)).await;
    for (i, key) in keys.iter().enumerate() {
        let g = d.get(key).await;
        assert_eq!(g.status, StatusCode::OK, "{key:?} as {}", seg(key));
        assert_eq!(g.json(), json!({"i": i}), "{key:?}");
    }
    let got = d.bulk(&keys).await;
    for (i, item) in got.iter().enumerate() {
        assert_eq!(item["data"], json!({"i": i}), "{item}");
    }
    // `+` in a path is a plus, not a space; unencoded unicode is percent-encoded by the client.
    let g = d.get_url(&format!("{}/plus+sign", d.state())).await;
    assert_eq!(g.json(), json!({"i": 8}));
    let g = d
        .get_url(&format!("{}/ünïcødé%20ключ%20鍵%20\u{1F511}", d.state()))
        .await;
    assert_eq!(g.json(), json!({"i": 4}));

    // The change stream names keys verbatim and accepts them percent-encoded.
    let mut events = Events::open(&d, &format!("key={}", seg("a/b"))).await;
    d.save_ok(json!([{"key": "a/b", "value": "changed"}])).await;
    let ev = events.next_in_time().await;
    assert_eq!((ev.event.as_str(), &ev.data["key"]), ("set", &json!("a/b")));

    for key in keys {
        assert_eq!(d.delete(key, None).await.status(), StatusCode::NO_CONTENT, "{key:?}");
        assert!(!d.exists(key).await, "{key:?}");
    }
    let ev = events.next_in_time().await;
    assert_eq!((ev.event.as_str(), &ev.data["key"]), ("delete", &json!("a/b")));
    env.stop().await;
}

/// Two stores, one with the `name` key prefix: the same Dapr key is two keys; every route and
/// the change stream see only their store's keys, named without the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_with_key_prefixes() {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.dapr.stores = stategate::dapr::Stores::new(vec!["statestore".parse().unwrap(), "s2=name".parse().unwrap()])
    })
    .await;
    let d1 = Dapr::new(&env, "statestore");
    let d2 = Dapr::new(&env, "s2");

    let mut events = Events::open(&d2, "key=k").await;
    d1.save_ok(json!([{"key": "k", "value": "one"}])).await;
    d2.save_ok(json!([{"key": "k", "value": "two"}, {"key": "only2", "value": {"n": 2}}]))
        .await;
    assert_eq!(d1.get("k").await.json(), json!("one"));
    assert_eq!(d2.get("k").await.json(), json!("two"));
    assert_ne!(d1.etag("k").await, d2.etag("k").await);
    assert!(!d1.exists("only2").await);

    // The engine holds `s2||k` next to `k`.
    let engine = env.engine();
    let raw = engine
        .read(&Bytes::from_static(b"s2||k"))
        .await
        .unwrap()
        .expect("s2||k stored");
    assert_eq!(&raw.value[..], b"\"two\"");
    assert_eq!(raw.version.to_string(), d2.etag("k").await);

    // The first change s2's subscriber sees is s2's own write, named without the prefix.
    let ev = events.next_in_time().await;
    assert_eq!((ev.event.as_str(), &ev.data["key"]), ("set", &json!("k")));
    assert_eq!(ev.data["data"], "two");

    assert_eq!(
        bulk_data(&d2, &["k", "only2", "missing"]).await,
        [Some(json!("two")), Some(json!({"n": 2})), None]
    );
    assert_eq!(bulk_data(&d1, &["k", "only2"]).await, [Some(json!("one")), None]);

    // ETags are per store.
    let e1 = d1.etag("k").await;
    let r = d2.save(json!([{"key": "k", "value": "x", "etag": e1}])).await;
    expect_error(r, StatusCode::CONFLICT, "ERR_STATE_SAVE").await;

    // Transactions and deletes stay inside the store.
    d2.tx_ok(json!({"operations": [
        {"operation": "delete", "request": {"key": "k"}},
        {"operation": "upsert", "request": {"key": "tx2", "value": {"n": 3}}},
    ]}))
    .await;
    assert!(!d2.exists("k").await);
    assert_eq!(d1.get("k").await.json(), json!("one"));
    assert!(!d1.exists("tx2").await);
    let ev = events.next_in_time().await;
    assert_eq!((ev.event.as_str(), &ev.data["key"]), ("delete", &json!("k")));
    assert_eq!(d1.delete("only2", None).await.status(), StatusCode::NO_CONTENT);
    assert!(d2.exists("only2").await);

    // A query over s2 sees s2's documents only, named without the prefix.
    let (status, page) = d2
        .query(&json!({"filter": {"GT": {"n": 0}}, "sort": [{"key": "n"}]}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys_of(&page), ["only2", "tx2"]);
    let (status, _) = d2.query(&json!({"filter": {"EQ": {"n": 99}}})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // `||` is refused as part of a key in a prefixed store, and an unknown store is a 400.
    let r = d2.save(json!([{"key": "a||b", "value": 1}])).await;
    expect_error(r, StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST").await;
    let d3 = Dapr::new(&env, "s3");
    let r = d3.save(json!([{"key": "k", "value": 1}])).await;
    expect_error(r, StatusCode::BAD_REQUEST, "ERR_STATE_STORE_NOT_FOUND").await;
    env.stop().await;
}

/// A trailing slash is ignored (spec section 1): on GET, DELETE, save, bulk get, transaction
/// and query; each answer is checked for the rows it must hold, so a route that a trailing
/// slash no longer reaches fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailing_slash_is_ignored() {
    let (env, d) = env().await;
    let r =
        d.c.post(format!("{}/", d.state()))
            .json(&json!([{"key": "slash", "value": 1}, {"key": "other", "value": 2}]))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "save: {}", r.text().await.unwrap());
    let g = d.get_url(&format!("{}/slash/", d.state())).await;
    assert_eq!(g.status, StatusCode::OK, "GET: {:?}", g.body);
    assert_eq!(g.json(), json!(1));
    let r =
        d.c.post(format!("{}/bulk/", d.state()))
            .json(&json!({"keys": ["slash"]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let items: Value = r.json().await.unwrap();
    assert_eq!(items[0]["key"], "slash", "bulk: {items}");
    assert_eq!(items[0]["data"], json!(1), "bulk: {items}");
    assert_eq!(items.as_array().map(Vec::len), Some(1), "bulk: {items}");
    // `value` alone is the whole stored document: the rows whose value is 1.
    let r =
        d.c.post(format!("{}/", d.query_url()))
            .json(&json!({"filter": {"EQ": {"value": 1}}}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let page: Value = r.json().await.unwrap();
    assert_eq!(keys_of(&page), ["slash"]);
    assert_eq!(page["results"][0]["data"], json!(1), "query: {page}");
    let r =
        d.c.post(format!("{}/transaction/", d.state()))
            .json(&json!({"operations": [{"operation": "upsert", "request": {"key": "slash", "value": 2}}]}))
            .send()
            .await
            .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NO_CONTENT,
        "transaction: {}",
        r.text().await.unwrap()
    );
    assert_eq!(d.get("slash").await.json(), json!(2), "the transaction was applied");
    let r = d.c.delete(format!("{}/slash/", d.state())).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NO_CONTENT,
        "delete: {}",
        r.text().await.unwrap()
    );
    assert!(!d.exists("slash").await);
    env.stop().await;
}
