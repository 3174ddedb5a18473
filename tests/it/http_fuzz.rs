//! Hostile input at every HTTP route: malformed JSON, wrong types, odd keys, bad query
//! parameters, bad `If-Match` values, oversized bodies. Whatever comes in, the answer is never
//! a 5xx (nor a dropped connection), and every 4xx is Dapr's JSON error
//! `{"errorCode": <non-empty string>, "message": <string>}`. Afterwards the service still works.
//!
//! Two tests: a fixed matrix that puts each kind of bad input on each route, and a proptest run
//! with a fixed seed (deterministic, bounded) that mixes them. Each runs its own service; the
//! proptest runner drives a runtime built here, so failing cases shrink.

use std::fmt;
use std::fmt::Write as _;

use bytes::Bytes;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Broker, TestEnv, WAIT};

/// The HTTP door's default body limit.
const BODY_LIMIT: usize = 4 * 1024 * 1024;
/// Longest key sent in a path or query string: request targets are capped just under 64 KiB
/// (`http::Uri` on the client, hyper on the server), so 64 KiB keys travel in bodies only.
const PATH_KEY_MAX: usize = 65_000;

/// One request, exactly as sent.
#[derive(Clone)]
struct Req {
    method: Method,
    /// Path as sent (already percent-encoded, or deliberately not).
    path: String,
    /// Raw query string, without `?`.
    query: String,
    if_match: Option<Vec<u8>>,
    content_type: Option<&'static str>,
    body: Bytes,
}

fn clip(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_owned();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...({} bytes)", &s[..end], s.len())
}

impl fmt::Debug for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, clip(&self.path, 160))?;
        if !self.query.is_empty() {
            write!(f, "?{}", clip(&self.query, 160))?;
        }
        if let Some(m) = &self.if_match {
            write!(f, " If-Match: {:?}", clip(&String::from_utf8_lossy(m), 80))?;
        }
        if let Some(ct) = self.content_type {
            write!(f, " Content-Type: {ct}")?;
        }
        write!(f, " body: {:?}", clip(&String::from_utf8_lossy(&self.body), 300))
    }
}

impl Req {
    fn new(method: Method, path: impl Into<String>) -> Req {
        Req {
            method,
            path: path.into(),
            query: String::new(),
            if_match: None,
            content_type: None,
            body: Bytes::new(),
        }
    }

    fn query(mut self, q: impl Into<String>) -> Req {
        self.query = q.into();
        self
    }

    fn body(mut self, b: impl Into<Bytes>) -> Req {
        self.body = b.into();
        self
    }

    fn json(self, v: &Value) -> Req {
        self.body(serde_json::to_vec(v).expect("json"))
    }

    fn if_match(mut self, m: impl Into<Vec<u8>>) -> Req {
        self.if_match = Some(m.into());
        self
    }
}

/// A key as one percent-encoded path segment, cut to [`PATH_KEY_MAX`] bytes first.
fn path_seg(key: &str) -> String {
    let mut end = key.len().min(PATH_KEY_MAX);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    seg(&key[..end])
}

/// A key as one percent-encoded path segment.
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

/// Percent-decodes like the router does (invalid sequences stay as they are).
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Bodies larger than this go only to requests whose handler reads the body. A server that
/// answers without reading a large body (404, 405, a path it refuses, GET) closes a socket with
/// unread data: whether the client sees the answer or a reset is a race, not a property.
const UNREAD_BODY_MAX: usize = 8 * 1024;

/// Whether the door reads this request's body before answering: POST/PUT on a body route
/// whose store segment decodes to UTF-8.
fn reads_body(r: &Req) -> bool {
    if !(r.method == Method::POST || r.method == Method::PUT) {
        return false;
    }
    let parts: Vec<&str> = r.path.split('/').collect();
    let store_ok = |s: &str| !s.is_empty() && String::from_utf8(percent_decode(s)).is_ok();
    match parts.as_slice() {
        ["", "v1.0", "state", store] => store_ok(store),
        ["", "v1.0", "state", store, "bulk" | "transaction"] => store_ok(store),
        ["", "v1.0-alpha1", "state", store, "query"] => store_ok(store),
        ["", "v1.0-alpha1", "lock" | "unlock", store] => store_ok(store) && r.method == Method::POST,
        _ => false,
    }
}

/// Sends `req` and checks the contract. `Err` describes the violation.
async fn check(c: &reqwest::Client, base: &str, req: &Req) -> Result<(), String> {
    let mut url = format!("{base}{}", req.path);
    if !req.query.is_empty() {
        url.push('?');
        url.push_str(&req.query);
    }
    let url = reqwest::Url::parse(&url).map_err(|e| format!("the test built a bad URL: {e}"))?;
    if req.body.len() > UNREAD_BODY_MAX && !reads_body(req) {
        return Err("the test sent a large body to a route that does not read it".into());
    }
    let mut builder = c.request(req.method.clone(), url).body(req.body.clone());
    if let Some(m) = &req.if_match {
        let v = reqwest::header::HeaderValue::from_bytes(m).map_err(|e| format!("the test built a bad header: {e}"))?;
        builder = builder.header("If-Match", v);
    }
    if let Some(ct) = req.content_type {
        builder = builder.header("Content-Type", ct);
    }
    let resp = match tokio::time::timeout(WAIT, builder.send()).await {
        Err(_) => return Err("no answer in time".into()),
        Ok(Err(e)) if e.is_builder() => return Err(clip(&format!("the test built an unsendable request: {e}"), 200)),
        Ok(Err(e)) => return Err(clip(&format!("no answer (connection dropped?): {e:?}"), 300)),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if status.is_success() && ct == "text/event-stream" {
        // A live change stream: the answer is the headers; dropping it unsubscribes.
        return Ok(());
    }
    let body = match tokio::time::timeout(WAIT, resp.bytes()).await {
        Err(_) => return Err(format!("{status}: no body in time")),
        Ok(Err(e)) => {
            return Err(clip(
                &format!("{status}: body cut short (handler panicked?): {e:?}"),
                300,
            ));
        }
        Ok(Ok(b)) => b,
    };
    let text = String::from_utf8_lossy(&body);
    if status.is_server_error() {
        return Err(format!("{status} {ct}: {}", clip(&text, 300)));
    }
    if !status.is_client_error() {
        return Ok(());
    }
    if !ct.starts_with("application/json") {
        return Err(format!("{status} with Content-Type {ct:?}: {}", clip(&text, 300)));
    }
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("{status}: body is not JSON ({e}): {text}"))?;
    let code_ok = v
        .get("errorCode")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    let message_ok = v.get("message").is_some_and(Value::is_string);
    let only_those = v.as_object().is_some_and(|o| o.len() == 2);
    if !(code_ok && message_ok && only_those) {
        return Err(format!("{status}: not Dapr's error shape: {}", clip(&text, 300)));
    }
    Ok(())
}

/// A normal save and read still work after the barrage.
async fn still_works(c: &reqwest::Client, base: &str) {
    let url = format!("{base}/v1.0/state/statestore");
    let r = c
        .post(&url)
        .json(&json!([{"key": "after-the-storm", "value": {"ok": true}}]))
        .send()
        .await
        .expect("save after the barrage");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c
        .get(format!("{url}/after-the-storm"))
        .send()
        .await
        .expect("get after the barrage");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("etag").is_some());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"ok": true}));
    let r = c.get(format!("{base}/v1.0/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// Both stores: the default one and one with the `name` key prefix (longer engine keys).
async fn fuzz_env() -> TestEnv {
    TestEnv::start_with(Broker::Embedded, |c| {
        c.http.stores = stategate::dapr::Stores::new(vec!["statestore".parse().unwrap(), "s2=name".parse().unwrap()])
    })
    .await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(WAIT).build().expect("client")
}

// ---------------------------------------------------------------------------------------------
// The matrix: every route x every kind of bad input, in a fixed order.

const STORES: [&str; 2] = ["statestore", "s2"];
/// Path segments that are not valid UTF-8 once decoded, or not valid percent-encoding.
const BAD_SEGMENTS: [&str; 8] = ["%FF", "%C3%28", "x%FEy", "%ED%A0%80", "%E2%82", "%", "%zz", "%0"];
/// Keys that are odd but decode fine.
const ODD_KEYS: [&str; 9] = [
    "a||b",
    "||",
    "a/b",
    "with space",
    "tab\tnl\n",
    "\u{0}\u{1}\u{1f}\u{7f}",
    "ünï 鍵",
    "%FF",
    "bulk",
];
const BAD_QUERIES: [&str; 17] = [
    "metadata.ttlInSeconds=x",
    "metadata.ttlInSeconds=1.5",
    "metadata.ttlInSeconds=0",
    "metadata.ttlInSeconds=-2",
    "metadata.ttlInSeconds=99999999999999999999",
    "concurrency=maybe",
    "consistency=weird",
    "metadata.fencingToken=garbage",
    "metadata.ttlInSeconds=%FF",
    "%FF=%FE",
    "key=&pattern=[",
    "&&=&metadata.=",
    "since=garbage",
    "since=000000000000001:00000:gone&snapshot=true",
    "snapshot=maybe",
    "key=a%7C%7Cb&since=",
    "since=1:0:line%0Abreak&snapshot=1",
];
const BAD_IF_MATCH: [&[u8]; 8] = [
    b"garbage",
    b"*",
    b"W/\"x\"",
    b"\"\"",
    b"123",
    b"000000000000001:00000:",
    b"\xff\xfe\x80",
    b"999999999999999:99999:node",
];

/// Malformed or wrong-typed bodies (each a JSON-ish text).
fn bad_bodies() -> Vec<Bytes> {
    let mut v: Vec<Bytes> = [
        "",
        "{",
        "[",
        "[{]",
        "nul",
        "[1,]",
        "{\"a\":1,}",
        "\u{feff}[]",
        "[{\"key\":\"k\",\"value\":1e400}]",
        "[{\"key\":\"k\",\"value\":\"\\ud800\"}]",
        "[{\"key\":\"k\",\"value\":\"\\uZZZZ\"}]",
        "{\"keys\":[\"a\"]",
        "null",
        "0",
        "-1",
        "\"string\"",
        "true",
        "{}",
        "[]",
        "[null]",
        "[[]]",
        "[1]",
        "[\"k\"]",
        "[{}]",
        "[{\"key\":null}]",
        "[{\"key\":1,\"value\":1}]",
        "[{\"key\":{},\"value\":1}]",
        "[{\"key\":[\"k\"],\"value\":1}]",
        "[{\"key\":\"k\",\"etag\":1}]",
        "[{\"key\":\"k\",\"etag\":{}}]",
        "[{\"key\":\"k\",\"metadata\":[]}]",
        "[{\"key\":\"k\",\"metadata\":{\"ttlInSeconds\":5}}]",
        "[{\"key\":\"k\",\"metadata\":{\"ttlInSeconds\":null}}]",
        "[{\"key\":\"k\",\"options\":[]}]",
        "[{\"key\":\"k\",\"options\":{\"concurrency\":1}}]",
        "[{\"key\":\"k\",\"options\":{\"unknown\":\"x\"}}]",
        "[{\"key\":\"k\",\"contentType\":7}]",
        "{\"keys\":null}",
        "{\"keys\":\"k\"}",
        "{\"keys\":{\"a\":1}}",
        "{\"keys\":[1,null,{}]}",
        "{\"keys\":[\"k\"],\"parallelism\":\"x\"}",
        "{\"keys\":[\"k\"],\"parallelism\":1e100}",
        "{\"keys\":[\"k\"],\"metadata\":[1]}",
        "{\"keys\":[\"\",\"a||b\"]}",
        "{\"operations\":null}",
        "{\"operations\":{}}",
        "{\"operations\":[null]}",
        "{\"operations\":[{\"operation\":1,\"request\":{\"key\":\"k\"}}]}",
        "{\"operations\":[{\"operation\":\"upsert\"}]}",
        "{\"operations\":[{\"operation\":\"upsert\",\"request\":null}]}",
        "{\"operations\":[{\"operation\":\"upsert\",\"request\":[]}]}",
        "{\"operations\":[{\"operation\":\"upsert\",\"request\":{\"key\":\"\"}}]}",
        "{\"operations\":[{\"operation\":\"upsert\",\"request\":{\"key\":\"a||b\"}}]}",
        "{\"operations\":[{\"operation\":\"merge\",\"request\":{\"key\":\"k\"}}]}",
        "{\"operations\":[{\"operation\":\"delete\",\"request\":{\"key\":\"k\",\"etag\":\"bad\"}}]}",
        "{\"operations\":[],\"metadata\":\"x\"}",
        "{\"filter\":null,\"sort\":null,\"page\":null}",
        "{\"filter\":[]}",
        "{\"filter\":{\"EQ\":1}}",
        "{\"filter\":{\"EQ\":{}}}",
        "{\"filter\":{\"IN\":{\"a\":{}}}}",
        "{\"filter\":{\"AND\":{}}}",
        "{\"filter\":{\"OR\":[1,2]}}",
        "{\"filter\":{\"XOR\":[]}}",
        "{\"filter\":{\"EQ\":{\"a\":1},\"IN\":{\"a\":[1]}}}",
        "{\"sort\":{}}",
        "{\"sort\":[1]}",
        "{\"sort\":[{\"key\":1}]}",
        "{\"sort\":[{\"key\":\"a\",\"order\":\"UP\"}]}",
        "{\"page\":[]}",
        "{\"page\":{\"limit\":-1}}",
        "{\"page\":{\"limit\":1.5}}",
        "{\"page\":{\"limit\":\"2\"}}",
        "{\"page\":{\"limit\":18446744073709551615,\"token\":\"18446744073709551615\"}}",
        "{\"page\":{\"token\":\"-1\"}}",
        "{\"page\":{\"token\":99}}",
        "{\"unknown\":1}",
    ]
    .iter()
    .map(|s| Bytes::from(s.as_bytes().to_vec()))
    .collect();
    v.push(Bytes::from_static(b"\xff\xfe\x00\x01"));
    v.push(Bytes::from(format!("{}{}", "[".repeat(200), "]".repeat(200))));
    v.push(Bytes::from(format!(
        "{{\"filter\":{}{{\"EQ\":{{\"a\":1}}}}{}}}",
        "{\"AND\":[{\"EQ\":{\"a\":1}},".repeat(60),
        "]}".repeat(60)
    )));
    v
}

/// Bodies over the limit: filler, and a valid-looking save whose value is too large.
fn oversized_bodies() -> Vec<Bytes> {
    let mut save = b"[{\"key\":\"big\",\"value\":\"".to_vec();
    save.resize(BODY_LIMIT + 16, b'x');
    save.extend_from_slice(b"\"}]");
    vec![Bytes::from(vec![b' '; BODY_LIMIT + 1]), Bytes::from(save)]
}

/// Every route with a store in its path, as `(method, path)` for a store and key segment.
fn store_routes(store: &str, key: &str) -> Vec<(Method, String)> {
    vec![
        (Method::POST, format!("/v1.0/state/{store}")),
        (Method::PUT, format!("/v1.0/state/{store}")),
        (Method::GET, format!("/v1.0/state/{store}/{key}")),
        (Method::DELETE, format!("/v1.0/state/{store}/{key}")),
        (Method::POST, format!("/v1.0/state/{store}/bulk")),
        (Method::PUT, format!("/v1.0/state/{store}/bulk")),
        (Method::POST, format!("/v1.0/state/{store}/transaction")),
        (Method::PUT, format!("/v1.0/state/{store}/transaction")),
        (Method::POST, format!("/v1.0-alpha1/state/{store}/query")),
        (Method::PUT, format!("/v1.0-alpha1/state/{store}/query")),
        (Method::GET, format!("/v1.0-alpha1/state/{store}/subscribe")),
    ]
}

/// The lock and configuration routes, for a store segment and a key (or subscription id).
fn block_routes(store: &str, key: &str) -> Vec<(Method, String)> {
    vec![
        (Method::POST, format!("/v1.0-alpha1/lock/{store}")),
        (Method::POST, format!("/v1.0-alpha1/unlock/{store}")),
        (Method::GET, format!("/v1.0/configuration/{store}")),
        (Method::GET, format!("/v1.0-alpha1/configuration/{store}")),
        (Method::GET, format!("/v1.0/configuration/{store}/subscribe")),
        (Method::GET, format!("/v1.0-alpha1/configuration/{store}/subscribe")),
        (Method::GET, format!("/v1.0/configuration/{store}/{key}/unsubscribe")),
    ]
}

/// Lock bodies with wrong types and values (daprd reads them with protojson).
const BAD_LOCK_BODIES: [&str; 16] = [
    "{\"resourceId\":\"r\",\"lockOwner\":\"o\",\"expiryInSeconds\":1.5}",
    "{\"resourceId\":\"r\",\"lockOwner\":\"o\",\"expiryInSeconds\":\"x\"}",
    "{\"resourceId\":\"r\",\"lockOwner\":\"o\",\"expiryInSeconds\":99999999999}",
    "{\"resourceId\":\"r\",\"lockOwner\":\"o\",\"expiryInSeconds\":-1}",
    "{\"resourceId\":\"r\",\"lockOwner\":\"o\",\"expiryInSeconds\":[]}",
    "{\"resourceId\":\"r\",\"lockOwner\":\"o\",\"expiryInSeconds\":1e400}",
    "{\"resourceId\":1,\"lockOwner\":\"o\",\"expiryInSeconds\":1}",
    "{\"resourceId\":\"r\",\"lockOwner\":{},\"expiryInSeconds\":1}",
    "{\"resourceId\":\"\",\"lockOwner\":\"o\",\"expiryInSeconds\":1}",
    "{\"resourceId\":\"a||b\",\"lockOwner\":\"o\",\"expiryInSeconds\":1}",
    "{\"resourceId\":\"r\",\"lockOwner\":\"\",\"expiryInSeconds\":1}",
    "{\"resource_id\":\"r\",\"lock_owner\":\"o\",\"expiry_in_seconds\":\"3\"}",
    "{\"resourceId\":null,\"lockOwner\":null,\"expiryInSeconds\":null}",
    "{\"resourceId\":\"r\",\"lockOwner\":\"o\",\"expiryInSeconds\":2147483647}",
    "[{\"resourceId\":\"r\"}]",
    "{\"resourceId\":\"r\",\"lockOwner\":\"\\u0000\",\"expiryInSeconds\":1}",
];

fn other_routes() -> Vec<(Method, &'static str)> {
    vec![
        (Method::GET, "/v1.0/metadata"),
        (Method::GET, "/v1.0/healthz"),
        (Method::GET, "/v1.0/healthz/outbound"),
        (Method::GET, "/openapi.json"),
    ]
}

fn matrix() -> Vec<Req> {
    let mut out = Vec::new();
    let bodies = bad_bodies();
    let big = oversized_bodies();
    let long_keys = ["x".repeat(64 * 1024), "y".repeat(64 * 1024 + 1)];

    for store in STORES
        .iter()
        .copied()
        .chain(BAD_SEGMENTS)
        .chain(["nostore", "%2F", "s2%7C%7C"])
    {
        for (m, p) in store_routes(store, "k0") {
            out.push(Req::new(m, p));
        }
    }
    for store in STORES {
        for bad in BAD_SEGMENTS {
            for (m, p) in store_routes(store, bad) {
                out.push(Req::new(m, p));
            }
        }
        for key in ODD_KEYS.iter().map(|k| k.to_string()).chain(long_keys.iter().cloned()) {
            for (m, p) in store_routes(store, &path_seg(&key)) {
                let body = match p.rsplit('/').next() {
                    Some("bulk") => json!({"keys": [key]}),
                    Some("transaction") => json!({"operations": [
                        {"operation": "upsert", "request": {"key": key, "value": 1}},
                        {"operation": "delete", "request": {"key": key}},
                    ]}),
                    Some("query") => json!({"filter": {"EQ": {key.clone(): 1}}}),
                    _ => json!([{"key": key, "value": "v"}]),
                };
                let query = if p.ends_with("subscribe") {
                    format!("key={}", path_seg(&key))
                } else {
                    String::new()
                };
                let req = Req::new(m, p).query(query);
                let req = if reads_body(&req) { req.json(&body) } else { req };
                out.push(req);
            }
        }
        for (m, p) in store_routes(store, "k0") {
            for b in &bodies {
                out.push(Req::new(m.clone(), p.clone()).body(b.clone()));
            }
            let req = Req::new(m.clone(), p.clone());
            if reads_body(&req) {
                for b in &big {
                    out.push(req.clone().body(b.clone()));
                }
            }
            for q in BAD_QUERIES {
                let body = if m == Method::GET || m == Method::DELETE {
                    Bytes::new()
                } else {
                    Bytes::from_static(b"[{\"key\":\"k0\",\"value\":1}]")
                };
                out.push(Req::new(m.clone(), p.clone()).query(q).body(body));
            }
            for im in BAD_IF_MATCH {
                out.push(Req::new(m.clone(), p.clone()).if_match(im));
            }
            for wrong in [Method::PATCH, Method::OPTIONS] {
                out.push(Req::new(wrong, p.clone()));
            }
            out.push(Req::new(m.clone(), format!("{p}/")));
        }
    }
    // Lock and configuration routes: their stores, the other kinds' stores, bad segments.
    let block_stores = ["lockstore", "configstore", "statestore", "nostore"];
    for store in block_stores.iter().copied().chain(BAD_SEGMENTS) {
        for key in ["k0", "0123456789abcdef0123456789abcdef"]
            .iter()
            .copied()
            .chain(BAD_SEGMENTS)
            .chain(["%7C%7C", "%2F"])
        {
            for (m, p) in block_routes(store, key) {
                out.push(Req::new(m, p));
            }
        }
        for (m, p) in block_routes(store, "k0") {
            let req = Req::new(m.clone(), p.clone());
            if reads_body(&req) {
                for b in BAD_LOCK_BODIES
                    .iter()
                    .map(|b| Bytes::from(b.as_bytes().to_vec()))
                    .chain(bad_bodies())
                {
                    out.push(req.clone().body(b));
                }
                for b in oversized_bodies() {
                    out.push(req.clone().body(b));
                }
            }
            for q in BAD_QUERIES {
                out.push(Req::new(m.clone(), p.clone()).query(q));
            }
            for key in ODD_KEYS {
                out.push(Req::new(m.clone(), p.clone()).query(format!("key={}", path_seg(key))));
            }
            for wrong in [Method::PUT, Method::DELETE, Method::PATCH] {
                out.push(Req::new(wrong, p.clone()));
            }
        }
    }
    for (m, p) in other_routes() {
        for q in BAD_QUERIES {
            out.push(Req::new(m.clone(), p).query(q));
        }
        out.push(Req::new(m.clone(), p).if_match(&b"\xff"[..]).body(&b"{not json"[..]));
        for wrong in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            out.push(Req::new(wrong, p));
        }
    }
    for p in [
        "/",
        "/v1.0",
        "/v1.0/state",
        "/v1.0/state/",
        "/v1.0//k",
        "/v2/state/statestore",
        "/%FF",
    ] {
        out.push(Req::new(Method::GET, p));
    }

    // Metadata values the door accepts, read back through every read route: TTLs at the edge
    // of the representable, item metadata in the query form, per transaction and per item.
    for ttl in [
        "99999999999999",
        "9223372036854775807",
        "300000000000",
        "250000000000",
        "100",
    ] {
        for store in STORES {
            let state = format!("/v1.0/state/{store}");
            out.push(Req::new(Method::POST, state.clone()).json(&json!([
                {"key": "ttl-item", "value": 1, "metadata": {"ttlInSeconds": ttl}}
            ])));
            out.push(
                Req::new(Method::PUT, state.clone())
                    .query(format!("metadata.ttlInSeconds={ttl}"))
                    .json(&json!([{"key": "ttl-query", "value": 1}])),
            );
            out.push(Req::new(Method::POST, format!("{state}/transaction")).json(&json!({
                "operations": [{"operation": "upsert", "request": {"key": "ttl-tx", "value": 1}}],
                "metadata": {"ttlInSeconds": ttl},
            })));
            for key in ["ttl-item", "ttl-query", "ttl-tx"] {
                out.push(Req::new(Method::GET, format!("{state}/{key}")));
            }
            out.push(
                Req::new(Method::POST, format!("{state}/bulk"))
                    .json(&json!({"keys": ["ttl-item", "ttl-query", "ttl-tx"]})),
            );
            out.push(Req::new(Method::POST, format!("/v1.0-alpha1/state/{store}/query")).json(&json!({})));
        }
    }
    out
}

/// Every route, every kind of bad input; all violations are reported together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_bad_input_cleanly() {
    let env = fuzz_env().await;
    let base = env.http();
    let c = client();
    let cases = matrix();
    let mut failures = Vec::new();
    for req in &cases {
        if let Err(e) = check(&c, &base, req).await {
            failures.push(format!("{req:?}\n    -> {e}"));
        }
    }
    still_works(&c, &base).await;
    assert!(
        failures.is_empty(),
        "{} of {} requests broke the contract:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    env.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The proptest run: random mixes of the same ingredients.

fn json_leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        "\\PC{0,12}".prop_map(Value::from),
        "[\\x00-\\x1f\"\\\\]{0,4}".prop_map(Value::from),
    ]
    .boxed()
}

fn json_any() -> BoxedStrategy<Value> {
    json_leaf()
        .prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                btree_map("[a-zA-Z.]{0,8}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
        .boxed()
}

/// Keys as strings: a small pool (so writes and reads meet), and every odd kind.
fn key_str() -> BoxedStrategy<String> {
    prop_oneof![
        8 => select(vec!["k0", "k1", "k2", "ttl-item"]).prop_map(String::from),
        1 => Just(String::new()),
        1 => select(vec!["a||b", "||", "k||", "a/b", "bulk", "transaction", "%FF", "a%2Fb", " "]).prop_map(String::from),
        1 => select(vec![64 * 1024, 64 * 1024 + 1, 64 * 1024 - 4]).prop_map(|n| "z".repeat(n)),
        1 => "[\\x00-\\x1f\\x7f]{1,4}",
        2 => "\\PC{1,12}",
    ]
    .boxed()
}

/// A key in a JSON field: mostly a string, sometimes the wrong type.
fn key_json() -> BoxedStrategy<Value> {
    prop_oneof![6 => key_str().prop_map(Value::String), 1 => json_leaf(), 1 => json_any()].boxed()
}

/// A path segment for a key: an encoded key, or raw bad percent-encoding.
fn key_segment() -> BoxedStrategy<String> {
    prop_oneof![
        6 => key_str().prop_map(|k| path_seg(&k)),
        2 => select(BAD_SEGMENTS.to_vec()).prop_map(String::from),
        1 => select(vec!["%7C%7C", "a%7C%7Cb", "%2F", "%00", "%0A", "%20", "+", "..%2F"]).prop_map(String::from),
    ]
    .boxed()
}

fn store_segment() -> BoxedStrategy<String> {
    prop_oneof![
        8 => select(STORES.to_vec()).prop_map(String::from),
        1 => select(vec!["nostore", "STATESTORE", "s2%7C%7C", "state%20store", "%2F"]).prop_map(String::from),
        1 => select(BAD_SEGMENTS.to_vec()).prop_map(String::from),
    ]
    .boxed()
}

/// ETags in JSON. `conflicts`: whether values that parse as versions are allowed (a stale
/// version legitimately fails a transaction with 500, so transactions never get one).
fn etag_json(conflicts: bool) -> BoxedStrategy<Value> {
    let bad = prop_oneof![
        select(vec!["", "garbage", "*", "1", "a:b:c", "000000000000001:00000:", "\"\""]).prop_map(Value::from),
        json_leaf().prop_filter("not a string", |v| !v.is_string()),
        "\\PC{0,10}".prop_filter_map("not a version", |s| {
            s.parse::<stategate::hlc::Hlc>().is_err().then_some(Value::String(s))
        }),
    ];
    if conflicts {
        prop_oneof![
            3 => bad,
            1 => select(vec!["000000000000001:00000:x", "\"000000000000001:00000:x\"", "999999999999999:00000:x"])
                .prop_map(Value::from),
        ]
        .boxed()
    } else {
        bad.boxed()
    }
}

const TTL_VALUES: [&str; 14] = [
    "x",
    "1.5",
    "-2",
    "0",
    "-1",
    "100",
    "",
    " 5 ",
    "+5",
    "1e3",
    "9223372036854775807",
    "99999999999999",
    "-9223372036854775808",
    "300000000000",
];

fn metadata_json() -> BoxedStrategy<Value> {
    let value = prop_oneof![
        3 => select(TTL_VALUES.to_vec()).prop_map(String::from),
        1 => "\\PC{0,8}",
    ];
    let name = select(vec!["ttlInSeconds", "contentType", "fencingToken", "partitionKey", ""]);
    prop_oneof![
        6 => btree_map(name, value, 0..3)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), Value::String(v))).collect())),
        1 => json_any(),
    ]
    .boxed()
}

fn options_json(first_write: bool) -> BoxedStrategy<Value> {
    let mut conc = vec!["last-write", "", "maybe", "FIRST-WRITE"];
    if first_write {
        conc.push("first-write");
    }
    let conc = prop_oneof![4 => select(conc).prop_map(Value::from), 1 => json_leaf()];
    let cons =
        prop_oneof![4 => select(vec!["strong", "eventual", "", "weird"]).prop_map(Value::from), 1 => json_leaf()];
    prop_oneof![
        6 => (proptest::option::of(conc), proptest::option::of(cons), any::<bool>()).prop_map(|(c, s, extra)| {
            let mut o = serde_json::Map::new();
            if let Some(c) = c {
                o.insert("concurrency".into(), c);
            }
            if let Some(s) = s {
                o.insert("consistency".into(), s);
            }
            if extra {
                o.insert("unknown".into(), json!(1));
            }
            Value::Object(o)
        }),
        1 => json_any(),
    ]
    .boxed()
}

/// One save item (or transaction request). `tx`: no conflicts possible (see `etag_json`).
fn item_json(tx: bool) -> BoxedStrategy<Value> {
    (
        proptest::option::of(key_json()),
        proptest::option::of(json_any()),
        proptest::option::of(etag_json(!tx)),
        proptest::option::of(metadata_json()),
        proptest::option::of(options_json(!tx)),
        proptest::option::of(prop_oneof![Just(json!("application/json")), json_leaf()]),
    )
        .prop_map(|(key, value, etag, metadata, options, content_type)| {
            let mut o = serde_json::Map::new();
            for (name, v) in [
                ("key", key),
                ("value", value),
                ("etag", etag),
                ("metadata", metadata),
                ("options", options),
                ("contentType", content_type),
            ] {
                if let Some(v) = v {
                    o.insert(name.into(), v);
                }
            }
            Value::Object(o)
        })
        .boxed()
}

fn filter_json() -> BoxedStrategy<Value> {
    let path = prop_oneof![
        select(vec!["a", "n", "value.n", "a.b.c", "", "."]).prop_map(String::from),
        "\\PC{0,6}"
    ];
    let leaf = prop_oneof![
        (
            select(vec!["EQ", "NEQ", "GT", "GTE", "LT", "LTE"]),
            path.clone(),
            json_leaf()
        )
            .prop_map(|(op, p, v)| json!({ op: { p: v } })),
        (path, vec(json_leaf(), 0..3)).prop_map(|(p, l)| json!({"IN": { p: l }})),
        (select(vec!["EQ", "IN", "AND", "OR", "XOR", ""]), json_any()).prop_map(|(op, v)| json!({ op: v })),
        json_leaf(),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        (select(vec!["AND", "OR"]), vec(inner, 0..4)).prop_map(|(op, l)| json!({ op: l }))
    })
    .boxed()
}

fn query_json() -> BoxedStrategy<Value> {
    let sort_item = (
        proptest::option::of(prop_oneof![
            select(vec!["a", "n", "value.n", ""]).prop_map(Value::from),
            json_leaf()
        ]),
        proptest::option::of(prop_oneof![
            select(vec!["ASC", "DESC", "desc", "up"]).prop_map(Value::from),
            json_leaf()
        ]),
    )
        .prop_map(|(k, o)| {
            let mut m = serde_json::Map::new();
            if let Some(k) = k {
                m.insert("key".into(), k);
            }
            if let Some(o) = o {
                m.insert("order".into(), o);
            }
            Value::Object(m)
        });
    let sort = prop_oneof![4 => vec(sort_item, 0..3).prop_map(Value::Array), 1 => json_any()];
    let limit = prop_oneof![
        select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(-1),
            json!(1.5),
            json!("2"),
            json!(u64::MAX),
            json!(null)
        ]),
        json_leaf(),
    ];
    let token = prop_oneof![
        select(vec![
            "",
            "0",
            "1",
            "3",
            "-1",
            "18446744073709551615",
            "99999999999999999999",
            "x"
        ])
        .prop_map(Value::from),
        json_leaf(),
    ];
    let page = prop_oneof![
        4 => (proptest::option::of(limit), proptest::option::of(token)).prop_map(|(l, t)| {
            let mut m = serde_json::Map::new();
            if let Some(l) = l {
                m.insert("limit".into(), l);
            }
            if let Some(t) = t {
                m.insert("token".into(), t);
            }
            Value::Object(m)
        }),
        1 => json_any(),
    ];
    (
        proptest::option::of(filter_json()),
        proptest::option::of(sort),
        proptest::option::of(page),
        any::<bool>(),
    )
        .prop_map(|(f, s, p, extra)| {
            let mut m = serde_json::Map::new();
            for (name, v) in [("filter", f), ("sort", s), ("page", p)] {
                if let Some(v) = v {
                    m.insert(name.into(), v);
                }
            }
            if extra {
                m.insert("unknown".into(), json!(true));
            }
            Value::Object(m)
        })
        .boxed()
}

fn save_body() -> BoxedStrategy<Value> {
    vec(item_json(false), 0..4).prop_map(Value::Array).boxed()
}

fn bulk_body() -> BoxedStrategy<Value> {
    let keys = prop_oneof![4 => vec(key_json(), 0..5).prop_map(Value::Array), 1 => json_any()];
    (
        keys,
        proptest::option::of(json_leaf()),
        proptest::option::of(metadata_json()),
    )
        .prop_map(|(keys, par, meta)| {
            let mut m = serde_json::Map::new();
            m.insert("keys".into(), keys);
            if let Some(p) = par {
                m.insert("parallelism".into(), p);
            }
            if let Some(meta) = meta {
                m.insert("metadata".into(), meta);
            }
            Value::Object(m)
        })
        .boxed()
}

fn tx_body() -> BoxedStrategy<Value> {
    let op = (
        prop_oneof![
            6 => select(vec!["upsert", "delete"]).prop_map(Value::from),
            1 => select(vec!["merge", "", "UPSERT"]).prop_map(Value::from),
            1 => json_leaf(),
        ],
        prop_oneof![6 => item_json(true), 1 => json_any()],
    )
        .prop_map(|(operation, request)| json!({"operation": operation, "request": request}));
    let ops = prop_oneof![6 => vec(op, 0..4).prop_map(Value::Array), 1 => json_any()];
    (ops, proptest::option::of(metadata_json()))
        .prop_map(|(ops, meta)| {
            let mut m = serde_json::Map::new();
            m.insert("operations".into(), ops);
            if let Some(meta) = meta {
                m.insert("metadata".into(), meta);
            }
            Value::Object(m)
        })
        .boxed()
}

/// A body: mostly the route's own shape (full of wrong types), else anything at all.
fn body_for(shape: BoxedStrategy<Value>) -> BoxedStrategy<Bytes> {
    prop_oneof![
        12 => shape.prop_map(|v| Bytes::from(serde_json::to_vec(&v).expect("json"))),
        2 => json_any().prop_map(|v| Bytes::from(serde_json::to_vec(&v).expect("json"))),
        2 => select(bad_bodies()),
        1 => vec(any::<u8>(), 0..48).prop_map(Bytes::from),
        1 => select(oversized_bodies()),
    ]
    .boxed()
}

fn query_string(for_subscribe: bool) -> BoxedStrategy<String> {
    let mut names = vec![
        "metadata.ttlInSeconds",
        "concurrency",
        "consistency",
        "metadata.contentType",
        "metadata.fencingToken",
        "metadata.",
        "%FF",
    ];
    if for_subscribe {
        names.extend(["key", "key", "pattern"]);
    }
    let mut values: Vec<String> = [
        "maybe",
        "weird",
        "first-write",
        "last-write",
        "strong",
        "eventual",
        "%FF",
        "%",
        "[",
        "*",
        "k*",
        "k0",
        "a%7C%7Cb",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    values.extend(TTL_VALUES.iter().map(|t| seg(t)));
    let pair = (select(names), select(values), any::<bool>())
        .prop_map(|(n, v, bare)| if bare { n.to_owned() } else { format!("{n}={v}") });
    // Long keys only where the path is short (a long key may be in the path already).
    let key = key_str().prop_map(move |k| {
        let k = if for_subscribe { k } else { k.chars().take(64).collect() };
        format!("key={}", path_seg(&k))
    });
    prop_oneof![
        2 => Just(String::new()),
        6 => vec(pair, 1..4).prop_map(|p| p.join("&")),
        1 => key,
    ]
    .boxed()
}

fn if_match() -> BoxedStrategy<Option<Vec<u8>>> {
    prop_oneof![
        6 => Just(None),
        3 => select(BAD_IF_MATCH.iter().map(|b| b.to_vec()).collect::<Vec<_>>()).prop_map(Some),
        1 => Just(Some(Vec::new())),
        1 => vec(0x80u8..=0xff, 1..8).prop_map(Some),
        1 => "[ -~]{1,40}".prop_map(|s| Some(s.into_bytes())),
    ]
    .boxed()
}

fn content_type() -> BoxedStrategy<Option<&'static str>> {
    select(vec![
        None,
        Some("application/json"),
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("garbage/;;"),
    ])
    .boxed()
}

/// A request to one route, with bad parts anywhere.
fn request() -> BoxedStrategy<Req> {
    let store = store_segment();
    let save = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(save_body()),
        query_string(false),
    )
        .prop_map(|(m, s, b, q)| Req::new(m, format!("/v1.0/state/{s}")).body(b).query(q));
    let read = (
        select(vec![Method::GET, Method::DELETE]),
        store.clone(),
        key_segment(),
        query_string(false),
        if_match(),
    )
        .prop_map(|(m, s, k, q, im)| {
            let mut r = Req::new(m, format!("/v1.0/state/{s}/{k}")).query(q);
            r.if_match = im;
            r
        });
    let bulk = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(bulk_body()),
    )
        .prop_map(|(m, s, b)| Req::new(m, format!("/v1.0/state/{s}/bulk")).body(b));
    let tx = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(tx_body()),
        query_string(false),
    )
        .prop_map(|(m, s, b, q)| Req::new(m, format!("/v1.0/state/{s}/transaction")).body(b).query(q));
    let query = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(query_json()),
    )
        .prop_map(|(m, s, b)| Req::new(m, format!("/v1.0-alpha1/state/{s}/query")).body(b));
    let subscribe = (store, query_string(true))
        .prop_map(|(s, q)| Req::new(Method::GET, format!("/v1.0-alpha1/state/{s}/subscribe")).query(q));
    let block_store = prop_oneof![
        4 => select(vec!["lockstore", "configstore"]).prop_map(String::from),
        1 => store_segment(),
    ];
    let lock_body = (
        proptest::option::of(key_json()),
        proptest::option::of(prop_oneof![key_json(), Just(json!(""))]),
        proptest::option::of(prop_oneof![
            json_leaf(),
            select(vec![json!(1), json!(30), json!("5"), json!(0)])
        ]),
    )
        .prop_map(|(r, o, e)| {
            let mut m = serde_json::Map::new();
            for (name, v) in [("resourceId", r), ("lockOwner", o), ("expiryInSeconds", e)] {
                if let Some(v) = v {
                    m.insert(name.into(), v);
                }
            }
            Value::Object(m)
        })
        .boxed();
    let blocks = (
        block_store,
        select(vec!["lock", "unlock", "configuration", "subscribe", "unsubscribe"]),
        body_for(lock_body),
        query_string(true),
        key_segment(),
    )
        .prop_map(|(s, route, b, q, k)| match route {
            "lock" | "unlock" => Req::new(Method::POST, format!("/v1.0-alpha1/{route}/{s}")).body(b),
            "configuration" => Req::new(Method::GET, format!("/v1.0/configuration/{s}")).query(q),
            "subscribe" => Req::new(Method::GET, format!("/v1.0/configuration/{s}/subscribe")).query(q),
            _ => Req::new(Method::GET, format!("/v1.0/configuration/{s}/{k}/unsubscribe")),
        });
    let other = (
        select(vec![
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ]),
        select(vec![
            "/v1.0/metadata",
            "/v1.0/healthz",
            "/v1.0/healthz/outbound",
            "/v1.0/state",
            "/v1.0/state/statestore/k0/extra",
            "/v1.0-alpha1/state/statestore",
            "/nope",
        ]),
        query_string(true),
    )
        .prop_map(|(m, p, q)| Req::new(m, p).query(q));
    (
        prop_oneof![4 => save, 4 => read, 2 => bulk, 3 => tx, 3 => query, 1 => subscribe, 2 => blocks, 1 => other],
        content_type(),
        proptest::option::weighted(0.05, Just(())),
    )
        .prop_map(|(mut r, ct, slash)| {
            r.content_type = ct;
            if slash.is_some() {
                r.path.push('/');
            }
            if r.body.len() > UNREAD_BODY_MAX && !reads_body(&r) {
                r.body.truncate(UNREAD_BODY_MAX);
            }
            r
        })
        .boxed()
}

/// Random mixes with a fixed seed: deterministic, bounded, shrunk on failure.
#[test]
fn random_requests_never_break_the_contract() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let env = rt.block_on(fuzz_env());
    let base = env.http();
    let c = client();
    let config = Config {
        cases: 3000,
        max_shrink_iters: 400,
        max_shrink_time: 20_000,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[0x5a; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&request(), |req| {
        rt.block_on(check(&c, &base, &req)).map_err(TestCaseError::fail)
    });
    rt.block_on(still_works(&c, &base));
    rt.block_on(env.stop());
    if let Err(e) = result {
        panic!("{e}");
    }
}
