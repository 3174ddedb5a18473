//! The HTTP door: the Dapr state API, with stategate's extensions for exact bytes.
//!
//! - Values are saved as base64 with item metadata `contentEncoding: base64` (stored decoded, so
//!   any bytes round-trip) and read back raw from `GET`, whose `ETag` is the version. A save of
//!   one item answers its new version in `ETag`.
//! - NX is `concurrency: first-write`; `--if-version` is the ETag; TTLs are `ttlInSeconds`
//!   (rounded up to whole seconds); fencing tokens are metadata `fencingToken`.
//! - Dapr has no NEX, VDEL, nor a DEL that says whether it deleted: they are emulated as GET,
//!   compare, then a save or delete conditioned on the ETag just read. The ETag makes the write
//!   atomic: if anything changed in between it fails (409) and the whole step is retried, at most
//!   [`MAX_ATTEMPTS`] times. One difference remains: a VDEL whose value does not match says so
//!   without checking the fencing token (MQTT checks the token first).
//! - `scan` reads `/v1.0-alpha1/state/{store}/keys`; `watch` reads server-sent events from
//!   `/v1.0-alpha1/state/{store}/subscribe` with `contentEncoding=base64` (values byte-exact).
//!
//! Keys are text on this door (Dapr keys are strings): a key that is not UTF-8 is a usage error.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

mod sse;

use super::args::ConnectArgs;
use super::{
    CliError, Condition, DelOutcome, Door, Exit, Found, MAX_MESSAGE_BYTES, ScanPage, SetOutcome, WATCH_BUFFER, Watch,
    Write, base_url,
};

/// Tries of an emulated NEX, VDEL or DEL before giving up on a key that keeps changing.
pub const MAX_ATTEMPTS: usize = 8;
/// Keys asked for per page of the key listing (the service's maximum).
const KEYS_PER_PAGE: usize = 1000;

pub struct HttpDoor {
    client: reqwest::Client,
    base: String,
    store: String,
    token: Option<String>,
    timeout: Duration,
}

/// How a conditional save or delete ended.
enum Written {
    Done(Option<String>),
    /// 409 for an ETag or first-write condition (fencing refusals are errors).
    Conflict(String),
}

/// A path segment, percent-encoded (everything but unreserved characters).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn text_key(key: &[u8]) -> Result<&str, CliError> {
    std::str::from_utf8(key).map_err(|_| {
        CliError::usage("over HTTP keys are text (Dapr keys are strings): this key is not UTF-8; use MQTT or gRPC")
    })
}

pub(super) fn transport(e: reqwest::Error, base: &str, timeout: Duration) -> CliError {
    if e.is_timeout() {
        CliError::unavailable(format!(
            "timed out after {} waiting for {base}",
            humantime::format_duration(timeout)
        ))
    } else if e.is_connect() {
        // The cause (a refused connection, a certificate that does not verify) is a few
        // sources down.
        CliError::unavailable(format!("cannot reach {base}: {}", super::grpc::error_chain(&e)))
    } else {
        CliError::unavailable(format!("request to {base} failed: {e}"))
    }
}

/// A refusal whose message names the fencing token (the engine's texts), not an ETag.
fn is_fencing(message: &str) -> bool {
    message.contains("fencing token")
}

/// Reads a body of at most `limit` bytes; a longer one is an error, never cut short silently.
async fn body(mut resp: Response, limit: usize, base: &str, timeout: Duration) -> Result<Vec<u8>, CliError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(e, base, timeout))? {
        if out.len() + chunk.len() > limit {
            return Err(CliError::unavailable(format!(
                "the answer from {base} is larger than {limit} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The start of an error answer's body (enough for any message).
async fn error_body(mut resp: Response) -> Vec<u8> {
    const LIMIT: usize = 64 * 1024;
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        out.extend_from_slice(&chunk[..chunk.len().min(LIMIT - out.len())]);
        if out.len() >= LIMIT {
            break;
        }
    }
    out
}

/// Status and message of an error answer (Dapr's `{"errorCode","message"}`, or plain text).
pub(super) async fn error_of(resp: Response) -> (StatusCode, String) {
    let status = resp.status();
    let raw = error_body(resp).await;
    let message = match serde_json::from_slice::<Value>(&raw) {
        Ok(v) => match (v["errorCode"].as_str(), v["message"].as_str()) {
            (Some(code), Some(m)) => format!("{code}: {m}"),
            _ => String::from_utf8_lossy(&raw).into_owned(),
        },
        Err(_) => String::from_utf8_lossy(&raw).trim().to_owned(),
    };
    (status, message)
}

pub(super) fn status_error(status: StatusCode, message: &str) -> CliError {
    let exit = match status.as_u16() {
        400 | 404 | 405 | 413 | 414 | 431 => Exit::Usage,
        401 | 403 => Exit::NotAuthorized,
        409 => Exit::Conflict,
        _ => Exit::Unavailable,
    };
    CliError::new(exit, format!("the HTTP door answered {status}: {message}"))
}

fn etag_of(resp: &Response) -> Option<String> {
    resp.headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_owned())
}

impl HttpDoor {
    pub fn new(url: &str, c: &ConnectArgs) -> Result<HttpDoor, CliError> {
        let base = base_url(url, "--http")?;
        // No client-wide timeout: it would cut the server-sent events of `watch`; each request
        // gets its own.
        let mut builder = reqwest::Client::builder().connect_timeout(c.timeout).tcp_nodelay(true);
        if base.starts_with("https://") {
            builder = builder.use_preconfigured_tls(Arc::unwrap_or_clone(super::tls_client_config(c, &[b"http/1.1"])?));
        }
        let client = builder
            .build()
            .map_err(|e| CliError::unavailable(format!("cannot create the HTTP client: {e}")))?;
        Ok(HttpDoor {
            client,
            base,
            store: c.store.clone(),
            token: c.api_token.clone().filter(|t| !t.is_empty()),
            timeout: c.timeout,
        })
    }

    fn request(&self, method: Method, url: &str) -> RequestBuilder {
        let b = self.client.request(method, url);
        match &self.token {
            Some(t) => b.header("dapr-api-token", t),
            None => b,
        }
    }

    async fn send(&self, b: RequestBuilder) -> Result<Response, CliError> {
        b.timeout(self.timeout)
            .send()
            .await
            .map_err(|e| transport(e, &self.base, self.timeout))
    }

    fn state_url(&self) -> String {
        format!("{}/v1.0/state/{}", self.base, segment(&self.store))
    }

    fn key_url(&self, key: &str) -> String {
        format!("{}/{}", self.state_url(), segment(key))
    }

    fn alpha_url(&self, what: &str) -> String {
        format!("{}/v1.0-alpha1/state/{}/{what}", self.base, segment(&self.store))
    }

    async fn read(&self, key: &str) -> Result<Option<Found>, CliError> {
        let resp = self.send(self.request(Method::GET, &self.key_url(key))).await?;
        match resp.status() {
            StatusCode::OK => {
                let version = etag_of(&resp);
                let value = body(resp, MAX_MESSAGE_BYTES, &self.base, self.timeout).await?;
                Ok(Some(Found {
                    value: Bytes::from(value),
                    version,
                }))
            }
            StatusCode::NO_CONTENT => Ok(None),
            _ => {
                let (status, message) = error_of(resp).await;
                Err(status_error(status, &message))
            }
        }
    }

    /// A save of one item; the value travels as base64 and is stored as its bytes.
    async fn save(&self, key: &str, w: &Write, etag: Option<&str>, first_write: bool) -> Result<Written, CliError> {
        let mut metadata = serde_json::Map::new();
        metadata.insert("contentEncoding".into(), json!("base64"));
        if let Some(ttl) = w.ttl {
            metadata.insert("ttlInSeconds".into(), json!(ttl_seconds(ttl).to_string()));
            if w.sliding {
                metadata.insert("ttlSliding".into(), json!("true"));
            }
        }
        if let Some(ft) = &w.fencing {
            metadata.insert("fencingToken".into(), json!(ft));
        }
        let mut item = json!({
            "key": key,
            "value": base64::engine::general_purpose::STANDARD.encode(&w.value),
            "metadata": metadata,
        });
        if let Some(e) = etag {
            item["etag"] = json!(e);
        }
        if first_write {
            item["options"] = json!({"concurrency": "first-write"});
        }
        let body = serde_json::to_vec(&json!([item])).map_err(|e| CliError::usage(e.to_string()))?;
        let req = self
            .request(Method::POST, &self.state_url())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        let resp = self.send(req).await?;
        self.written(resp).await
    }

    /// A delete, conditioned on `etag` when given.
    async fn delete(&self, key: &str, etag: Option<&str>, fencing: Option<&str>) -> Result<Written, CliError> {
        let mut req = self.request(Method::DELETE, &self.key_url(key));
        if let Some(e) = etag {
            req = req.header(reqwest::header::IF_MATCH, e);
        }
        if let Some(ft) = fencing {
            req = req.query(&[("metadata.fencingToken", ft)]);
        }
        let resp = self.send(req).await?;
        self.written(resp).await
    }

    async fn written(&self, resp: Response) -> Result<Written, CliError> {
        if resp.status() == StatusCode::NO_CONTENT || resp.status() == StatusCode::OK {
            return Ok(Written::Done(etag_of(&resp)));
        }
        let (status, message) = error_of(resp).await;
        if status == StatusCode::CONFLICT && !is_fencing(&message) {
            return Ok(Written::Conflict(message));
        }
        Err(status_error(status, &message))
    }

    fn gave_up(&self, what: &str) -> CliError {
        CliError::conflict(format!(
            "{what}: the key changed under every one of {MAX_ATTEMPTS} attempts; try again"
        ))
    }
}

/// `ttlInSeconds` is whole seconds: a TTL is rounded up, never shortened.
fn ttl_seconds(ttl: Duration) -> u64 {
    let s = ttl.as_secs();
    if ttl.subsec_nanos() > 0 { s + 1 } else { s.max(1) }
}

#[async_trait::async_trait]
impl Door for HttpDoor {
    async fn get(&self, key: &Bytes) -> Result<Option<Found>, CliError> {
        self.read(text_key(key)?).await
    }

    async fn set(&self, w: &Write) -> Result<SetOutcome, CliError> {
        let key = text_key(&w.key)?;
        let applied = |v| Ok(SetOutcome::Applied { version: v });
        match &w.condition {
            Condition::Always => match self.save(key, w, None, false).await? {
                Written::Done(v) => applied(v),
                Written::Conflict(m) => Err(CliError::conflict(m)),
            },
            Condition::Nx => match self.save(key, w, None, true).await? {
                Written::Done(v) => applied(v),
                Written::Conflict(_) => Ok(SetOutcome::NotApplied),
            },
            Condition::IfVersion(version) => match self.save(key, w, Some(version), false).await? {
                Written::Done(v) => applied(v),
                Written::Conflict(m) => Err(CliError::conflict(format!("the version does not match ({m})"))),
            },
            Condition::Nex => {
                for _ in 0..MAX_ATTEMPTS {
                    let written = match self.read(key).await? {
                        None => self.save(key, w, None, true).await?,
                        Some(f) if f.value == w.value => self.save(key, w, f.version.as_deref(), false).await?,
                        Some(_) => return Ok(SetOutcome::NotApplied),
                    };
                    if let Written::Done(v) = written {
                        return applied(v);
                    }
                }
                Err(self.gave_up("set --nex"))
            }
        }
    }

    async fn del(&self, key: &Bytes, if_version: Option<&str>, fencing: Option<&str>) -> Result<DelOutcome, CliError> {
        let key = text_key(key)?;
        if let Some(version) = if_version {
            return match self.delete(key, Some(version), fencing).await? {
                Written::Done(_) => Ok(DelOutcome::Deleted),
                Written::Conflict(m) => Err(CliError::conflict(format!("the version does not match ({m})"))),
            };
        }
        for _ in 0..MAX_ATTEMPTS {
            let Some(found) = self.read(key).await? else {
                return Ok(DelOutcome::Absent);
            };
            if let Written::Done(_) = self.delete(key, found.version.as_deref(), fencing).await? {
                return Ok(DelOutcome::Deleted);
            }
        }
        Err(self.gave_up("del"))
    }

    async fn vdel(&self, key: &Bytes, value: &Bytes, fencing: Option<&str>) -> Result<DelOutcome, CliError> {
        let key = text_key(key)?;
        for _ in 0..MAX_ATTEMPTS {
            match self.read(key).await? {
                None => return Ok(DelOutcome::Absent),
                Some(f) if f.value != *value => return Ok(DelOutcome::Mismatch),
                Some(f) => {
                    if let Written::Done(_) = self.delete(key, f.version.as_deref(), fencing).await? {
                        return Ok(DelOutcome::Deleted);
                    }
                }
            }
        }
        Err(self.gave_up("vdel"))
    }

    async fn scan_page(&self, pattern: &str, token: Option<Bytes>) -> Result<ScanPage, CliError> {
        let mut query = vec![("pattern", pattern.to_owned()), ("limit", KEYS_PER_PAGE.to_string())];
        if let Some(t) = &token {
            query.push(("token", String::from_utf8_lossy(t).into_owned()));
        }
        let resp = self
            .send(self.request(Method::GET, &self.alpha_url("keys")).query(&query))
            .await?;
        if resp.status() != StatusCode::OK {
            let (status, message) = error_of(resp).await;
            return Err(status_error(status, &message));
        }
        let raw = body(resp, MAX_MESSAGE_BYTES, &self.base, self.timeout).await?;
        parse_keys_page(&raw)
    }

    async fn watch(&self, keys: &[Bytes], patterns: &[String], since: Option<&str>) -> Result<Watch, CliError> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(v) = since {
            query.push(("since", v.to_owned()));
        }
        for k in keys {
            query.push(("key", text_key(k)?.to_owned()));
        }
        for p in patterns {
            query.push(("pattern", p.clone()));
        }
        query.push(("contentEncoding", "base64".into()));
        let req = self
            .request(Method::GET, &self.alpha_url("subscribe"))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .query(&query);
        // Only the answer's headers are bounded: the stream itself lasts as long as the watch.
        // Once they arrive the service is subscribed, so nothing after this point is missed.
        let resp = match tokio::time::timeout(self.timeout, req.send()).await {
            Ok(r) => r.map_err(|e| transport(e, &self.base, self.timeout))?,
            Err(_) => return Err(CliError::unavailable(format!("timed out subscribing at {}", self.base))),
        };
        if resp.status() != StatusCode::OK {
            let (status, message) = error_of(resp).await;
            return Err(status_error(status, &message));
        }
        let (tx, events) = mpsc::channel(WATCH_BUFFER);
        let task = tokio::spawn(sse::read_events(resp, tx));
        Ok(Watch {
            events,
            keys: Vec::new(),
            task: Some(task),
        })
    }
}

/// `{"keys": [...], "token": ...}`; no token (null, empty or absent) on the last page.
fn parse_keys_page(raw: &[u8]) -> Result<ScanPage, CliError> {
    let bad = |why: &str| CliError::unavailable(format!("the key listing is malformed: {why}"));
    let v: Value = serde_json::from_slice(raw).map_err(|e| bad(&e.to_string()))?;
    let keys = v["keys"]
        .as_array()
        .ok_or_else(|| bad("no keys array"))?
        .iter()
        .map(|k| {
            k.as_str()
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .ok_or_else(|| bad("a key is not a string"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let token = match &v["token"] {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::String(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        Value::Number(n) => Some(Bytes::from(n.to_string())),
        _ => return Err(bad("the token is not a string")),
    };
    Ok(ScanPage { keys, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("a/b c?%"), "a%2Fb%20c%3F%25");
        assert_eq!(segment("plain-key_1.x~"), "plain-key_1.x~");
        assert_eq!(segment("ö"), "%C3%B6");
    }

    #[test]
    fn ttls_round_up_to_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(10)), 10);
    }

    #[test]
    fn key_pages_parse() {
        let p = parse_keys_page(br#"{"keys":["a","b"],"token":"10"}"#).unwrap();
        assert_eq!(p.keys, [Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        assert_eq!(p.token.as_deref(), Some(&b"10"[..]));
        assert!(parse_keys_page(br#"{"keys":[],"token":null}"#).unwrap().token.is_none());
        assert!(parse_keys_page(br#"{"keys":[]}"#).unwrap().token.is_none());
        assert!(parse_keys_page(br#"{"keys":[1]}"#).is_err());
        assert!(parse_keys_page(b"nope").is_err());
    }

    #[test]
    fn statuses_map_to_exit_codes() {
        assert_eq!(status_error(StatusCode::BAD_REQUEST, "").exit, Exit::Usage);
        assert_eq!(status_error(StatusCode::UNAUTHORIZED, "").exit, Exit::NotAuthorized);
        assert_eq!(status_error(StatusCode::FORBIDDEN, "").exit, Exit::NotAuthorized);
        assert_eq!(status_error(StatusCode::CONFLICT, "").exit, Exit::Conflict);
        assert_eq!(
            status_error(StatusCode::INSUFFICIENT_STORAGE, "").exit,
            Exit::Unavailable
        );
        assert_eq!(
            status_error(StatusCode::INTERNAL_SERVER_ERROR, "").exit,
            Exit::Unavailable
        );
    }
}
