//! Change notifications as server-sent events, resumable with `Last-Event-ID` / `since` and
//! optionally starting with a snapshot. The rules are the engine's ([`crate::engine::watch`]);
//! this only reads the request and writes events.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use tokio_stream::StreamExt;

use super::dto::{ChangeEvent, ResetEvent, SyncedEvent};
use super::error::{ApiError, ErrorBody, Op};
use super::{AppState, Caller, DaprPath, DaprQuery};
use crate::access::Op as AccessOp;
use crate::dapr::{self, StoreSpec};
use crate::engine::watch::{Start, WatchItem};
use crate::engine::{Change, ChangeKind, Entry};
use crate::hlc::Hlc;

/// How often an idle stream sends a comment, so proxies keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The data of the last event of a stream whose token a reload removed (state and
/// configuration subscriptions alike); a reconnect with that token gets 401.
pub const REVOKED_EVENT: &str = "{\"message\":\"the token of this stream was revoked\"}";

/// Where a watch over HTTP starts: the `Last-Event-ID` header (what a browser's EventSource sends
/// when it reconnects) wins over `since` (the first connection's choice), and either wins over
/// `snapshot`. Either id must be a version; anything else is a 400.
pub fn start_of(headers: &HeaderMap, since: Option<&str>, snapshot: bool) -> Result<Start, ApiError> {
    let last = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::malformed("Last-Event-ID is not text"))?
                .trim(),
        ),
    };
    let version = match last.filter(|v| !v.is_empty()).or(since) {
        None => None,
        Some(v) => Some(v.parse::<Hlc>().map_err(|_| {
            ApiError::malformed(format!(
                "{v:?} is not a version (Last-Event-ID and since take an event id)"
            ))
        })?),
    };
    Ok(Start::from_request(version, snapshot))
}

/// `true`/`false` (and `1`/`0`) for a boolean query parameter.
pub fn flag(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        other => Err(ApiError::malformed(format!(
            "{name} must be true or false (got {other:?})"
        ))),
    }
}

/// The data of a `set` event.
fn set_data(key: String, value: &[u8], version: &Hlc, base64: bool, snapshot: bool) -> ChangeEvent {
    let (data, enc) = if base64 {
        (dapr::base64_json(value), Some((dapr::ENCODING_METADATA, "base64")))
    } else {
        dapr::value_to_json(value)
    };
    ChangeEvent {
        key,
        data: Some(data),
        etag: version.to_string(),
        reason: None,
        metadata: enc.map(|(k, v)| HashMap::from([(k.to_owned(), v.to_owned())])),
        snapshot,
    }
}

pub(super) fn json_event(name: &str, body: &impl serde::Serialize) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(body).unwrap_or_else(|_| "{}".into()))
}

/// What a change stream sends of a change or of a snapshot entry: its event, in the stream's
/// own shape (the state subscription's `set`/`delete`, the configuration subscription's
/// `update`).
pub(super) enum Item<'a> {
    Change { change: &'a Change, resumable: bool },
    Snapshot { key: &'a [u8], entry: &'a Entry },
}

/// One watch item as an event: the one encoder of every change stream (state and
/// configuration subscriptions). `shape` renders changes and snapshot entries; ids and the
/// markers are the same for every stream. A change's id is its version, a resume position.
/// Events sent during a snapshot (and the reset before it) are no resume position: they
/// repeat the position the watch was asked to start from (`asked`, empty for a fresh
/// snapshot), so a browser that reconnects in the middle of a snapshot asks for it again
/// instead of resuming halfway through it, whatever its id buffer does between connections.
pub(super) fn encode(item: WatchItem, asked: &str, op: Op, shape: impl FnOnce(Item<'_>) -> Event) -> Event {
    match item {
        WatchItem::Change { event, resumable } => {
            let id = if resumable {
                event.change.version.to_string()
            } else {
                asked.to_owned()
            };
            shape(Item::Change {
                change: &event.change,
                resumable,
            })
            .id(id)
        }
        WatchItem::Snapshot { key, entry } => shape(Item::Snapshot {
            key: &key,
            entry: &entry,
        })
        .id(asked),
        WatchItem::Reset => json_event(
            "reset",
            &ResetEvent {
                since: asked.to_owned(),
                message: "the changes after this position are no longer kept; a snapshot follows".into(),
            },
        )
        .id(asked),
        WatchItem::Synced { resume } => {
            let since = resume.map(|v| v.to_string());
            let e = json_event("synced", &SyncedEvent { since: since.clone() });
            match since {
                Some(v) => e.id(v),
                None => e,
            }
        }
        // Never stall the engine for a slow reader: tell it, and the stream ends.
        WatchItem::Overflow { missed } => Event::default().event("overflow").data(format!(
            "{{\"missed\":{missed},\"message\":\"the subscriber fell behind; subscribe again with Last-Event-ID\"}}"
        )),
        WatchItem::Failed(e) => {
            let err = ApiError::from_engine(op, e);
            json_event(
                "failed",
                &ErrorBody {
                    error_code: err.code.to_owned(),
                    message: err.message,
                },
            )
        }
    }
}

/// The state subscription's shape of a change or snapshot entry.
fn state_event(store: &StoreSpec, item: Item<'_>, base64: bool) -> Event {
    match item {
        Item::Change { change: c, resumable } => {
            let key = store.dapr_key(&c.key);
            let (name, body) = match &c.kind {
                ChangeKind::Set(v) => ("set", set_data(key, v, &c.version, base64, !resumable)),
                ChangeKind::Delete | ChangeKind::Expire => (
                    "delete",
                    ChangeEvent {
                        key,
                        data: None,
                        etag: c.version.to_string(),
                        reason: (c.kind == ChangeKind::Expire).then_some("expired"),
                        metadata: None,
                        snapshot: !resumable,
                    },
                ),
            };
            json_event(name, &body)
        }
        Item::Snapshot { key, entry } => snapshot_event(store, key, entry, base64),
    }
}

fn snapshot_event(store: &StoreSpec, key: &[u8], entry: &Entry, base64: bool) -> Event {
    let mut body = set_data(store.dapr_key(key), &entry.value, &entry.version, base64, true);
    if let Some(ms) = entry.expires_at_ms {
        body.metadata
            .get_or_insert_with(HashMap::new)
            .insert("ttlExpireTime".into(), dapr::rfc3339(ms));
    }
    json_event("set", &body)
}

/// Subscribe to changes: `?key=a&key=b` and/or `?pattern=<glob>`; none = every key of the store.
#[utoipa::path(
    get,
    path = "/v1.0-alpha1/state/{store}/subscribe",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("key" = Option<Vec<String>>, Query, description = "keys to watch (repeatable)"),
        ("pattern" = Option<Vec<String>>, Query, description = "glob patterns of keys to watch (repeatable)"),
        ("since" = Option<String>, Query,
         description = "resume after the change with this version (an event id): every later change, \
                        none twice; when the history no longer holds it, a `reset` event, a snapshot, \
                        then changes"),
        ("snapshot" = Option<bool>, Query,
         description = "`true`: start with the current value of every matching key (`set` events with \
                        `snapshot: true`), then `synced` (its id is the resume position), then \
                        changes, with no gap and no repeat; ignored when resuming"),
        ("Last-Event-ID" = Option<String>, Header,
         description = "what EventSource sends when it reconnects; same meaning as `since`, and wins over it"),
        ("contentEncoding" = Option<String>, Query,
         description = "`base64`: every value as a base64 string with metadata `contentEncoding: base64`, \
                        for exact bytes (a stategate extension)"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream",
         description = "events `set` and `delete` (expiry: `reason: expired`), id = the new version; \
                        `reset`, `synced` around a snapshot (events in between carry `snapshot: true` \
                        and repeat the id asked for, empty for a fresh snapshot; `synced`'s id is the \
                        resume position); a reader that falls behind gets a final `overflow` event \
                        and the stream ends; a storage failure a final `failed`; the service stopping \
                        a final `shutdown`; a reload that removed the caller's token a final `revoked`"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn subscribe(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): DaprQuery,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let spec = st.store(&store, Op::Subscribe)?.clone();
    let mut keys = Vec::new();
    let mut patterns = Vec::new();
    let mut base64 = false;
    let (mut since, mut snapshot) = (None, false);
    for (name, value) in &params {
        match name.as_str() {
            "contentEncoding" if value.eq_ignore_ascii_case("base64") => base64 = true,
            "contentEncoding" => {
                return Err(ApiError::malformed(format!(
                    "unsupported contentEncoding {value:?} (only base64)"
                )));
            }
            "key" => keys.push(
                spec.engine_key(value)
                    .map_err(|e| ApiError::from_dapr(Op::Subscribe, e))?,
            ),
            "pattern" => patterns.push(value.clone()),
            "since" => since = Some(value.as_str()),
            "snapshot" => snapshot = flag("snapshot", value)?,
            other => return Err(ApiError::malformed(format!("unknown parameter {other:?}"))),
        }
    }
    let start = start_of(&headers, since, snapshot)?;
    let asked = match &start {
        Start::After(v) => Some(v.to_string()),
        Start::Live | Start::Snapshot => None,
    };
    let slot = st
        .dapr
        .access
        .open_stream(grant.principal())
        .map_err(|e| ApiError::from_engine(Op::Subscribe, e))?;
    // Only keys the caller may read, by the rules in force when each is sent.
    let caller = grant.clone();
    let watch = spec
        .watch(keys, &patterns)
        .map_err(|e| ApiError::from_dapr(Op::Subscribe, e))?
        .and(move |k| grant.may(AccessOp::Read, k));
    let stream = st.engine.watch(watch, start).map(move |item| {
        // The stream holds its slot of the caller's stream limit until it ends.
        let _open = &slot;
        let asked = asked.as_deref().unwrap_or_default();
        Ok(encode(item, asked, Op::Subscribe, |i| state_event(&spec, i, base64)))
    });
    Ok(until_stopped(&st, caller, stream, "subscribe again"))
}

/// The SSE response of a long-lived stream of this door: it ends with a final `shutdown` event
/// (saying to `again`) when the service stops, which graceful shutdown waits for, or `revoked`
/// when a reload removed the caller's token; it counts as an open SSE stream while it runs.
pub fn until_stopped<S>(
    st: &AppState,
    grant: crate::access::Grant,
    stream: S,
    again: &'static str,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<S>>
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let active = st.obs.metrics.stream_opened(crate::metrics::Stream::Sse);
    let obs = st.obs.clone();
    let ending = grant.clone();
    let stream = futures_util::StreamExt::take_until(stream, async move {
        tokio::select! {
            () = obs.stopped() => {}
            () = ending.revoked() => {}
        }
    });
    let stopping = st.obs.stopping.clone();
    let last = futures_util::stream::once(async move {
        let _active = active;
        if grant.is_revoked() {
            return Some(Ok(Event::default().event("revoked").data(REVOKED_EVENT)));
        }
        (*stopping.borrow()).then(|| {
            Ok(Event::default()
                .event("shutdown")
                .data(format!("{{\"message\":\"the service is shutting down; {again}\"}}")))
        })
    })
    .filter_map(|e| e);
    Sse::new(stream.chain(last)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
