//! Change notifications as server-sent events.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use base64::Engine as _;
use futures_util::Stream;
use tokio_stream::StreamExt;

use super::dto::ChangeEvent;
use super::error::{ApiError, ErrorBody, Op};
use super::{AppState, Caller, DaprPath, DaprQuery};
use crate::access::Op as AccessOp;
use crate::dapr;
use crate::engine::watch::{self, Selector, WatchItem};
use crate::engine::{Change, ChangeKind, FeedEvent};

/// `base64`: every value as a base64 string (`contentEncoding: base64`), never as JSON, so a
/// client gets exact bytes (a JSON value would come back re-serialized).
fn event(key: String, change: &Change, base64: bool) -> Event {
    let (name, data, reason, meta) = match &change.kind {
        ChangeKind::Set(v) => {
            let (data, enc) = if base64 {
                (
                    serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                    Some((dapr::ENCODING_METADATA, "base64")),
                )
            } else {
                dapr::value_to_json(v)
            };
            let meta = enc.map(|(k, v)| HashMap::from([(k.to_owned(), v.to_owned())]));
            ("set", Some(data), None, meta)
        }
        ChangeKind::Delete => ("delete", None, None, None),
        ChangeKind::Expire => ("delete", None, Some("expired"), None),
    };
    let etag = change.version.to_string();
    let body = ChangeEvent {
        key,
        data,
        etag: etag.clone(),
        reason,
        metadata: meta,
    };
    let json = serde_json::to_string(&body).unwrap_or_else(|_| "{}".into());
    Event::default().event(name).id(etag).data(json)
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
        ("contentEncoding" = Option<String>, Query,
         description = "`base64`: every value as a base64 string with metadata `contentEncoding: base64`, \
                        for exact bytes (a stategate extension)"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream",
         description = "events `set` and `delete` (expiry: `reason: expired`), id = the new version; \
                        a reader that falls behind gets a final `overflow` event and the stream ends"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn subscribe(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): DaprQuery,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let spec = st.store(&store, Op::Subscribe)?.clone();
    let mut keys = Vec::new();
    let mut patterns = Vec::new();
    let mut base64 = false;
    for (name, value) in params {
        match name.as_str() {
            "contentEncoding" if value.eq_ignore_ascii_case("base64") => base64 = true,
            "contentEncoding" => {
                return Err(ApiError::malformed(format!(
                    "unsupported contentEncoding {value:?} (only base64)"
                )));
            }
            "key" => keys.push(
                spec.engine_key(&value)
                    .map_err(|e| ApiError::from_dapr(Op::Subscribe, e))?,
            ),
            "pattern" => patterns.push(value),
            other => return Err(ApiError::malformed(format!("unknown parameter {other:?}"))),
        }
    }
    let selector = Selector::new(keys, &patterns).map_err(ApiError::malformed)?;
    let slot = st
        .settings
        .access
        .open_stream(grant.principal())
        .map_err(|e| ApiError::from_engine(Op::Subscribe, e))?;
    let store = spec.clone();
    // Only keys the caller may read, by the rules in force when each change happens.
    let wanted = move |e: &FeedEvent| {
        store.owns(&e.change.key)
            && selector.wants(&e.change.key, || store.dapr_key(&e.change.key).into())
            && grant.may(AccessOp::Read, &e.change.key)
    };
    let stream = watch::stream(st.engine.subscribe(), wanted).map(move |item| {
        // The stream holds its slot of the caller's stream limit until it ends.
        let _open = &slot;
        Ok(match item {
            WatchItem::Change(e) => event(spec.dapr_key(&e.change.key), &e.change, base64),
            // Never stall the engine for a slow reader: tell it, and the stream ends.
            WatchItem::Overflow { missed } => Event::default().event("overflow").data(format!(
                "{{\"missed\":{missed},\"message\":\"the subscriber fell behind; subscribe again\"}}"
            )),
        })
    });
    // Ends with a final `shutdown` event when the service stops (graceful shutdown waits for it).
    let active = st.obs.metrics.stream_opened(crate::metrics::Stream::Sse);
    let obs = st.obs.clone();
    let stream = futures_util::StreamExt::take_until(stream, async move { obs.stopped().await });
    let stopping = st.obs.stopping.clone();
    let last = futures_util::stream::once(async move {
        let _active = active;
        (*stopping.borrow()).then(|| {
            Ok(Event::default()
                .event("shutdown")
                .data("{\"message\":\"the service is shutting down; subscribe again\"}"))
        })
    })
    .filter_map(|e| e);
    Ok(Sse::new(stream.chain(last)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
