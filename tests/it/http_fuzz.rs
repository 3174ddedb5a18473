//! Hostile input at every HTTP route: malformed JSON, wrong types, odd keys, bad query
//! parameters, bad `If-Match` values, oversized bodies. Whatever comes in, the answer is never
//! a 5xx (nor a dropped connection), and every 4xx is Dapr's JSON error
//! `{"errorCode": <non-empty string>, "message": <string>}`. Afterwards the service still works.
//!
//! Two tests: a fixed matrix that puts each kind of bad input on each route, each case with the
//! answer it must get (input that is bad by construction: the exact 4xx and Dapr error code, so
//! a 2xx fails; input that is odd or bad only where the route does not look: a 2xx), and a
//! proptest run (`random.rs`) that mixes the same ingredients. Each runs its own service.

use std::fmt;
use std::fmt::Write as _;

use bytes::Bytes;
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
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
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

/// Dapr's error codes the door answers with.
const MALFORMED: &str = "ERR_MALFORMED_REQUEST";
const STORE_NOT_FOUND: &str = "ERR_STATE_STORE_NOT_FOUND";
const NOT_SUPPORTED: &str = "ERR_NOT_SUPPORTED_STATE_OPERATION";
const METHOD_NOT_ALLOWED: &str = "ERR_METHOD_NOT_ALLOWED";
const NO_ROUTE: &str = "ERR_NOT_FOUND";
const DELETE_FAILED: &str = "ERR_STATE_DELETE";

/// What the door must answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Valid input (odd but well-formed, or bad only in a part the route ignores): a 2xx.
    Valid,
    /// Bad by construction: exactly this status and error code.
    Refused(u16, &'static str),
    /// Random mixes only, where whether the input is valid is not known: not a 5xx.
    NotServerError,
}

fn refused(status: u16, code: &'static str) -> Expect {
    Expect::Refused(status, code)
}

/// Sends `req` and checks the answer against `expect`, and every 4xx against Dapr's error
/// shape; never a 5xx. `Err` describes the violation.
async fn check(c: &reqwest::Client, base: &str, req: &Req, expect: Expect) -> Result<(), String> {
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
    let stream = status.is_success() && ct == "text/event-stream";
    let body = if stream {
        // A live change stream: the answer is the headers; dropping it unsubscribes.
        Bytes::new()
    } else {
        match tokio::time::timeout(WAIT, resp.bytes()).await {
            Err(_) => return Err(format!("{status}: no body in time")),
            Ok(Err(e)) => {
                return Err(clip(
                    &format!("{status}: body cut short (handler panicked?): {e:?}"),
                    300,
                ));
            }
            Ok(Ok(b)) => b,
        }
    };
    let text = String::from_utf8_lossy(&body);
    if status.is_server_error() {
        return Err(format!("{status} {ct}: {}", clip(&text, 300)));
    }
    let error_code = if status.is_client_error() {
        Some(dapr_error_code(status, &ct, &body)?)
    } else {
        None
    };
    match (expect, error_code) {
        (Expect::NotServerError, _) => Ok(()),
        (Expect::Valid, None) if status.is_success() => Ok(()),
        (Expect::Refused(want, want_code), Some(code)) if status.as_u16() == want && code == want_code => Ok(()),
        (Expect::Refused(..), None) => Err(format!(
            "bad input accepted: {status}, expected {expect:?}: {}",
            clip(&text, 200)
        )),
        (_, code) => Err(format!("{status} {code:?}, expected {expect:?}: {}", clip(&text, 200))),
    }
}

/// The `errorCode` of a 4xx in Dapr's shape, `{"errorCode": <non-empty>, "message": <string>}`.
fn dapr_error_code(status: StatusCode, ct: &str, body: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(body);
    if !ct.starts_with("application/json") {
        return Err(format!("{status} with Content-Type {ct:?}: {}", clip(&text, 300)));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("{status}: body is not JSON ({e}): {text}"))?;
    let code = v.get("errorCode").and_then(Value::as_str).filter(|s| !s.is_empty());
    let message_ok = v.get("message").is_some_and(Value::is_string);
    let only_those = v.as_object().is_some_and(|o| o.len() == 2);
    match code {
        Some(code) if message_ok && only_those => Ok(code.to_owned()),
        _ => Err(format!("{status}: not Dapr's error shape: {}", clip(&text, 300))),
    }
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
        c.dapr.stores = stategate::dapr::Stores::new(vec!["statestore".parse().unwrap(), "s2=name".parse().unwrap()])
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
const ODD_KEYS: [&str; 10] = [
    "a||b",
    "||",
    "a/b",
    "with space",
    "tab\tnl\n",
    "\u{0}\u{1}\u{1f}\u{7f}",
    "ünï 鍵",
    "%FF",
    "bulk",
    "transaction",
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
    // Resume parameters of the subscriptions (a version: valid; anything else: refused).
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
    v.push(deep_and_query());
    v
}

/// A query of sixty nested ANDs: deep, but within the JSON nesting limit, and valid.
fn deep_and_query() -> Bytes {
    Bytes::from(format!(
        "{{\"filter\":{}{{\"EQ\":{{\"a\":1}}}}{}}}",
        "{\"AND\":[{\"EQ\":{\"a\":1}},".repeat(60),
        "]}".repeat(60)
    ))
}

/// Bodies over the limit: filler, and a valid-looking save whose value is too large.
fn oversized_bodies() -> Vec<Bytes> {
    let mut save = b"[{\"key\":\"big\",\"value\":\"".to_vec();
    save.resize(BODY_LIMIT + 16, b'x');
    save.extend_from_slice(b"\"}]");
    vec![Bytes::from(vec![b' '; BODY_LIMIT + 1]), Bytes::from(save)]
}

/// The routes with a store in their path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Save,
    Get,
    Delete,
    Bulk,
    Transaction,
    Query,
    Subscribe,
}

impl Route {
    /// Whether the handler reads (and so parses) the body.
    fn reads_body(self) -> bool {
        matches!(self, Route::Save | Route::Bulk | Route::Transaction | Route::Query)
    }
}

/// Every route with a store in its path, as `(route, method, path)` for a store and key segment.
fn store_routes(store: &str, key: &str) -> Vec<(Route, Method, String)> {
    vec![
        (Route::Save, Method::POST, format!("/v1.0/state/{store}")),
        (Route::Save, Method::PUT, format!("/v1.0/state/{store}")),
        (Route::Get, Method::GET, format!("/v1.0/state/{store}/{key}")),
        (Route::Delete, Method::DELETE, format!("/v1.0/state/{store}/{key}")),
        (Route::Bulk, Method::POST, format!("/v1.0/state/{store}/bulk")),
        (Route::Bulk, Method::PUT, format!("/v1.0/state/{store}/bulk")),
        (
            Route::Transaction,
            Method::POST,
            format!("/v1.0/state/{store}/transaction"),
        ),
        (
            Route::Transaction,
            Method::PUT,
            format!("/v1.0/state/{store}/transaction"),
        ),
        (Route::Query, Method::POST, format!("/v1.0-alpha1/state/{store}/query")),
        (Route::Query, Method::PUT, format!("/v1.0-alpha1/state/{store}/query")),
        (
            Route::Subscribe,
            Method::GET,
            format!("/v1.0-alpha1/state/{store}/subscribe"),
        ),
    ]
}

fn other_routes() -> Vec<(Method, &'static str)> {
    vec![
        (Method::GET, "/v1.0/metadata"),
        (Method::GET, "/v1.0/healthz"),
        (Method::GET, "/v1.0/healthz/outbound"),
        (Method::GET, "/openapi.json"),
    ]
}

/// Whether a path segment decodes to UTF-8 (the router keeps invalid `%` sequences as they are).
fn decodes(segment: &str) -> bool {
    String::from_utf8(percent_decode(segment)).is_ok()
}

/// A store segment that is not a configured store: refused before anything else is looked at,
/// as malformed if it does not decode, else as an unknown store.
fn bad_store(store: &str) -> Option<Expect> {
    if STORES.contains(&store) {
        None
    } else if !decodes(store) {
        Some(refused(400, MALFORMED))
    } else {
        Some(refused(400, STORE_NOT_FOUND))
    }
}

/// A route of a configured store with key `k0`, no body and no query: the body routes refuse
/// the empty body; the others are valid.
fn bare(route: Route) -> Expect {
    if route.reads_body() {
        refused(400, MALFORMED)
    } else {
        Expect::Valid
    }
}

/// A key segment of GET/DELETE that cannot be a Dapr key: not UTF-8, or holding `||` (the
/// prefix separator).
fn bad_key_segment(segment: &str) -> Option<Expect> {
    if !decodes(segment) || String::from_utf8_lossy(&percent_decode(segment)).contains("||") {
        Some(refused(400, MALFORMED))
    } else {
        None
    }
}

/// A body from [`bad_bodies`] on a route of a configured store. Routes that do not read the
/// body ignore it; on the others every body is refused as malformed but for the few listed here,
/// which are valid for that route (or refused otherwise).
fn bad_body_verdict(route: Route, body: &[u8]) -> Expect {
    if !route.reads_body() {
        return Expect::Valid;
    }
    let big_page = "{\"page\":{\"limit\":18446744073709551615,\"token\":\"18446744073709551615\"}}";
    match (route, std::str::from_utf8(body).unwrap_or("")) {
        // Saving nothing.
        (Route::Save, "[]") => Expect::Valid,
        // JSON `null` where daprd's Go structs take a list, a map or an object is the empty
        // one, as Go decodes it (clients send it).
        (Route::Save | Route::Bulk | Route::Transaction, "null") => Expect::Valid,
        (Route::Save, "[{\"key\":\"k\",\"metadata\":{\"ttlInSeconds\":null}}]") => Expect::Valid,
        (Route::Bulk, "{\"keys\":null}") => Expect::Valid,
        (Route::Transaction, "{\"operations\":null}") => Expect::Valid,
        // Well-formed, but keys that cannot be keys fail the whole request, as daprd answers.
        (Route::Bulk, "{\"keys\":[\"\",\"a||b\"]}") => refused(400, MALFORMED),
        (Route::Transaction, t) if t.contains("\"merge\"") => refused(400, NOT_SUPPORTED),
        // The empty query.
        (Route::Query, "{}") => Expect::Valid,
        // Page tokens are the previous page's last row, not a number: not one we issued.
        (Route::Query, t) if t == big_page => refused(400, MALFORMED),
        (Route::Query, t) if t.as_bytes() == deep_and_query() => Expect::Valid,
        // An array where the transaction object goes (serde would read it by position).
        (Route::Transaction, "[[]]") => refused(400, MALFORMED),
        _ => refused(400, MALFORMED),
    }
}

/// One of [`BAD_QUERIES`] on a route of a configured store (key `k0`; the body routes carry the
/// save body `[{"key":"k0","value":1}]`, malformed for every body route but save).
fn bad_query_verdict(route: Route, query: &str) -> Expect {
    let ttl = query.starts_with("metadata.ttlInSeconds=");
    // Whole seconds: well-formed; out of range (a time to live of 0) only for a write.
    let ttl_zero = query == "metadata.ttlInSeconds=0";
    let fencing = query.starts_with("metadata.fencingToken=");
    match route {
        // Save reads write metadata from the query; concurrency and consistency are item
        // options there, so those parameters (like unknown ones) are ignored.
        Route::Save if ttl || fencing => refused(400, MALFORMED),
        Route::Save => Expect::Valid,
        Route::Get if query.starts_with("consistency=") => refused(400, MALFORMED),
        Route::Get => Expect::Valid,
        // Delete reads metadata, concurrency and consistency from the query.
        Route::Delete
            if (ttl && !ttl_zero)
                || fencing
                || query.starts_with("concurrency=")
                || query.starts_with("consistency=") =>
        {
            refused(400, MALFORMED)
        }
        Route::Delete => Expect::Valid,
        Route::Bulk | Route::Transaction | Route::Query => refused(400, MALFORMED),
        // `since` naming a version (unknown here: the watch resets) is a valid resume.
        Route::Subscribe if query == "since=000000000000001:00000:gone&snapshot=true" => Expect::Valid,
        // The others are all bad (`key`, `pattern`, `since`, `snapshot` are its parameters).
        Route::Subscribe => refused(400, MALFORMED),
    }
}

/// One of [`BAD_IF_MATCH`]: only delete reads `If-Match`.
fn bad_if_match_verdict(route: Route, if_match: &[u8]) -> Expect {
    if route != Route::Delete {
        return bare(route);
    }
    let text = std::str::from_utf8(if_match).unwrap_or("");
    if text.trim_matches('"').parse::<stategate::hlc::Hlc>().is_ok() {
        // A version, but not the key's: a conflict, not a malformed request.
        refused(409, DELETE_FAILED)
    } else {
        refused(400, DELETE_FAILED)
    }
}

/// A request with an odd but decodable key (`key` as the handler sees it) on a configured
/// store: valid, except where the key cannot be one (`||`) or is over the 64 KiB key limit once
/// the store's prefix is added. GET, DELETE and subscribe carry the key in the URL, cut to
/// [`PATH_KEY_MAX`] bytes.
fn odd_key_verdict(route: Route, store: &str, key: &str) -> Expect {
    const MAX_KEY_BYTES: usize = 64 * 1024;
    let prefix = if store == "s2" { "s2||".len() } else { 0 };
    let separator = key.contains("||");
    match route {
        Route::Get | Route::Delete | Route::Subscribe | Route::Save | Route::Transaction if separator => {
            refused(400, MALFORMED)
        }
        Route::Bulk if separator => refused(400, MALFORMED),
        // A key longer than the limit is too large to write (bulk only reads it: a miss).
        Route::Save | Route::Transaction if prefix + key.len() > MAX_KEY_BYTES => refused(400, MALFORMED),
        // A filter on a path that no value has.
        Route::Query => Expect::Valid,
        _ => Expect::Valid,
    }
}

fn matrix() -> Vec<(Req, Expect)> {
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
        for (route, m, p) in store_routes(store, "k0") {
            out.push((Req::new(m, p), bad_store(store).unwrap_or(bare(route))));
        }
    }
    for store in STORES {
        for bad in BAD_SEGMENTS {
            for (route, m, p) in store_routes(store, bad) {
                let expect = match route {
                    // "%", "%zz", "%0" stay as they are: odd keys, but keys.
                    Route::Get | Route::Delete => bad_key_segment(bad).unwrap_or(Expect::Valid),
                    _ => bare(route),
                };
                out.push((Req::new(m, p), expect));
            }
        }
        for key in ODD_KEYS.iter().map(|k| k.to_string()).chain(long_keys.iter().cloned()) {
            for (route, m, p) in store_routes(store, &path_seg(&key)) {
                let body = match route {
                    Route::Bulk => json!({"keys": [key]}),
                    Route::Transaction => json!({"operations": [
                        {"operation": "upsert", "request": {"key": key, "value": 1}},
                        {"operation": "delete", "request": {"key": key}},
                    ]}),
                    Route::Query => json!({"filter": {"EQ": {key.clone(): 1}}}),
                    _ => json!([{"key": key, "value": "v"}]),
                };
                let query = if route == Route::Subscribe {
                    format!("key={}", path_seg(&key))
                } else {
                    String::new()
                };
                let req = Req::new(m, p).query(query);
                let req = if route.reads_body() { req.json(&body) } else { req };
                out.push((req, odd_key_verdict(route, store, &key)));
            }
        }
        for (route, m, p) in store_routes(store, "k0") {
            for b in &bodies {
                out.push((
                    Req::new(m.clone(), p.clone()).body(b.clone()),
                    bad_body_verdict(route, b),
                ));
            }
            if route.reads_body() {
                for b in &big {
                    out.push((Req::new(m.clone(), p.clone()).body(b.clone()), refused(413, MALFORMED)));
                }
            }
            for q in BAD_QUERIES {
                let body = if route.reads_body() {
                    Bytes::from_static(b"[{\"key\":\"k0\",\"value\":1}]")
                } else {
                    Bytes::new()
                };
                out.push((
                    Req::new(m.clone(), p.clone()).query(q).body(body),
                    bad_query_verdict(route, q),
                ));
            }
            for im in BAD_IF_MATCH {
                out.push((
                    Req::new(m.clone(), p.clone()).if_match(im),
                    bad_if_match_verdict(route, im),
                ));
            }
            for wrong in [Method::PATCH, Method::OPTIONS] {
                out.push((Req::new(wrong, p.clone()), refused(405, METHOD_NOT_ALLOWED)));
            }
            // A trailing slash is ignored, as Dapr does.
            out.push((Req::new(m.clone(), format!("{p}/")), bare(route)));
        }
    }
    for (m, p) in other_routes() {
        // These routes take no parameters, header or body: whatever comes is ignored.
        for q in BAD_QUERIES {
            out.push((Req::new(m.clone(), p).query(q), Expect::Valid));
        }
        out.push((
            Req::new(m.clone(), p).if_match(&b"\xff"[..]).body(&b"{not json"[..]),
            Expect::Valid,
        ));
        for wrong in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            out.push((Req::new(wrong, p), refused(405, METHOD_NOT_ALLOWED)));
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
        out.push((Req::new(Method::GET, p), refused(404, NO_ROUTE)));
    }

    // TTLs at the edge of the representable, as item metadata, in the query, per transaction:
    // up to 100 years they are accepted, beyond that refused; then read back through every
    // read route.
    for ttl in [
        "99999999999999",
        "9223372036854775807",
        "300000000000",
        "250000000000",
        "100",
    ] {
        let write = if ttl.parse::<i64>().unwrap() <= (stategate::engine::MAX_TTL_MS / 1000) as i64 {
            Expect::Valid
        } else {
            refused(400, MALFORMED)
        };
        for store in STORES {
            let state = format!("/v1.0/state/{store}");
            out.push((
                Req::new(Method::POST, state.clone()).json(&json!([
                    {"key": "ttl-item", "value": 1, "metadata": {"ttlInSeconds": ttl}}
                ])),
                write,
            ));
            out.push((
                Req::new(Method::PUT, state.clone())
                    .query(format!("metadata.ttlInSeconds={ttl}"))
                    .json(&json!([{"key": "ttl-query", "value": 1}])),
                write,
            ));
            out.push((
                Req::new(Method::POST, format!("{state}/transaction")).json(&json!({
                    "operations": [{"operation": "upsert", "request": {"key": "ttl-tx", "value": 1}}],
                    "metadata": {"ttlInSeconds": ttl},
                })),
                write,
            ));
            for key in ["ttl-item", "ttl-query", "ttl-tx"] {
                out.push((Req::new(Method::GET, format!("{state}/{key}")), Expect::Valid));
            }
            out.push((
                Req::new(Method::POST, format!("{state}/bulk"))
                    .json(&json!({"keys": ["ttl-item", "ttl-query", "ttl-tx"]})),
                Expect::Valid,
            ));
            out.push((
                Req::new(Method::POST, format!("/v1.0-alpha1/state/{store}/query")).json(&json!({})),
                Expect::Valid,
            ));
        }
    }
    out.extend(blocks::matrix());
    out
}

/// Every route, every kind of bad input, each with the answer it must get; all violations are
/// reported together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_bad_input_cleanly() {
    let env = fuzz_env().await;
    let base = env.http();
    let c = client();
    let cases = matrix();
    let mut failures = Vec::new();
    for (req, expect) in &cases {
        if let Err(e) = check(&c, &base, req, *expect).await {
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

mod blocks;
mod random;
