//! The Dapr configuration API over HTTP: get as daprd serves it; subscribe as server-sent events
//! (daprd calls the app back instead; a stream needs no app endpoint), resumable like the state
//! subscription; unsubscribe by id. Rules in [`crate::dapr::configuration`], shared with gRPC.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use tokio_stream::StreamExt;

use super::dto::{self, ConfigurationItem, ConfigurationUpdate};
use super::error::{ApiError, ErrorBody, Op};
use super::sse::{Item, KEEP_ALIVE, encode, flag, json_event, start_of};
use super::{AppState, Caller, DaprPath, DaprQuery};
use crate::access::Op as AccessOp;
use crate::dapr::configuration::{self as config, ConfigItem};

fn to_dto(item: ConfigItem) -> ConfigurationItem {
    ConfigurationItem {
        value: item.value,
        version: item.version,
        metadata: item.metadata,
    }
}

/// `key` (repeatable) and `metadata.*` are what daprd reads; anything else is refused.
fn keys_of(params: &[(String, String)], extra: &[&str]) -> Result<Vec<String>, ApiError> {
    let mut keys = Vec::new();
    for (name, value) in params {
        match name.as_str() {
            "key" => keys.push(value.clone()),
            n if n.starts_with("metadata.") || extra.contains(&n) => {}
            other => return Err(ApiError::malformed(format!("unknown parameter {other:?}"))),
        }
    }
    Ok(keys)
}

/// Get configuration items: `?key=a&key=b`, or every key of the store (at most
/// `--max-bulk-keys`; a store with more is refused: name the keys, or page the key list).
#[utoipa::path(
    get,
    path = "/v1.0/configuration/{store}",
    tag = "configuration",
    params(
        ("store" = String, Path, description = "configuration store name (also served under /v1.0-alpha1)"),
        ("key" = Option<Vec<dto::DaprKey>>, Query, description = "keys to get (repeatable); none: every key of the store"),
    ),
    responses(
        (status = 200, body = HashMap<String, dto::ConfigurationItem>,
         description = "key -> {value, version, metadata}; missing keys are left out"),
        (status = 204, description = "no item"),
        (status = 400, body = ErrorBody,
         description = "unknown store (ERR_CONFIGURATION_STORE_NOT_FOUND), a key that is not valid, \
                        more keys than --max-bulk-keys"),
    )
)]
pub async fn get_configuration(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): DaprQuery,
) -> Result<Response, ApiError> {
    let store = st.configuration_store(&store, Op::ConfigurationGet)?;
    let keys = keys_of(&params, &[])?;
    let items = config::get(
        &st.engine,
        &grant,
        store,
        keys,
        st.dapr.max_bulk_keys,
        st.engine.limits().scan_page.saturating_mul(10),
    )
    .await
    .map_err(|e| ApiError::from_dapr(Op::ConfigurationGet, e))?;
    if items.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let map: HashMap<String, ConfigurationItem> = items.into_iter().map(|(k, v)| (k, to_dto(v))).collect();
    Ok(axum::Json(map).into_response())
}

fn update(id: &str, key: String, item: ConfigItem) -> ConfigurationUpdate {
    ConfigurationUpdate {
        id: id.to_owned(),
        items: HashMap::from([(key, to_dto(item))]),
    }
}

/// Subscribe to configuration changes as server-sent events: first `subscribe` with the
/// subscription id, then one `update` per change (`{id, items: {key: item}}`, deletes and
/// expiries included, event id = the version). Resumable like the state subscription:
/// `Last-Event-ID` / `since`, and `snapshot=true` to get every current item first.
#[utoipa::path(
    get,
    path = "/v1.0/configuration/{store}/subscribe",
    tag = "configuration",
    params(
        ("store" = String, Path, description = "configuration store name (also served under /v1.0-alpha1)"),
        ("key" = Option<Vec<dto::DaprKey>>, Query, description = "keys to watch (repeatable); none: every key"),
        ("since" = Option<String>, Query, description = "resume after this event id (a version)"),
        ("snapshot" = Option<bool>, Query, description = "`true`: the current items first, then `synced`"),
        ("Last-Event-ID" = Option<String>, Header, description = "as `since` (sent by EventSource on reconnect)"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream",
         description = "`subscribe` {id}; `update` {id, items}; `reset`/`synced` around a snapshot; \
                        `overflow` or `failed` end the stream; so do unsubscribe and a final `revoked` \
                        (a reload removed the caller's token)"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn subscribe_configuration(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): DaprQuery,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let op = Op::ConfigurationSubscribe;
    let store = st.configuration_store(&store, op)?.clone();
    let keys = keys_of(&params, &["since", "snapshot"])?;
    let since = params.iter().find(|(k, _)| k == "since").map(|(_, v)| v.as_str());
    let snapshot = match params.iter().find(|(k, _)| k == "snapshot") {
        Some((_, v)) => flag("snapshot", v)?,
        None => false,
    };
    let start = start_of(&headers, since, snapshot)?;
    // Events that are no resume position repeat the one asked for (see the state subscription).
    let asked = match &start {
        crate::engine::watch::Start::After(v) => v.to_string(),
        crate::engine::watch::Start::Live | crate::engine::watch::Start::Snapshot => String::new(),
    };
    let engine_keys = config::subscription_keys(&store, &keys).map_err(|e| ApiError::from_dapr(op, e))?;
    let slot = st
        .dapr
        .access
        .open_stream(grant.principal())
        .map_err(|e| ApiError::from_engine(op, e))?;
    // Only keys the caller may read, by the rules in force when each is sent.
    let caller = grant.clone();
    let watch = store
        .watch(engine_keys, &[])
        .map_err(|e| ApiError::from_dapr(op, e))?
        .and(move |k| grant.may(AccessOp::Read, k));
    let subscription = st.dapr.subscriptions.open(caller.principal());
    let id = subscription.id().to_owned();
    let first = json_event(
        "subscribe",
        &ConfigurationUpdate {
            id: id.clone(),
            items: HashMap::new(),
        },
    );
    let events = st.engine.watch(watch, start).map(move |item| {
        encode(item, &asked, op, |i| {
            let (key, item) = match i {
                Item::Change { change, .. } => (&change.key[..], config::item_of_change(change)),
                Item::Snapshot { key, entry } => (key, config::item_of_entry(entry)),
            };
            json_event("update", &update(&id, store.dapr_key(key), item))
        })
    });
    // The subscription lives as long as the stream (as does its slot of the caller's stream
    // limit); unsubscribe ends it, and so does the service stopping (`Running::shutdown`
    // closes every subscription) or a reload that removes the caller's token (a last
    // `revoked` event says so).
    let ending = caller.clone();
    let last = futures_util::stream::once(async move {
        caller
            .is_revoked()
            .then(|| Event::default().event("revoked").data(super::sse::REVOKED_EVENT))
    })
    .filter_map(|e| e);
    let stream = futures_util::stream::once(async move { first })
        .chain(futures_util::StreamExt::take_until(events, async move {
            tokio::select! {
                () = subscription.stopped() => {}
                () = ending.revoked() => {}
            }
        }))
        .chain(last)
        .map(move |e| {
            let _open = &slot;
            Ok(e)
        });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// End a configuration subscription by its id (from either door).
#[utoipa::path(
    get,
    path = "/v1.0/configuration/{store}/{id}/unsubscribe",
    tag = "configuration",
    params(
        ("store" = String, Path, description = "configuration store name (also served under /v1.0-alpha1)"),
        ("id" = String, Path, description = "the subscription id"),
    ),
    responses(
        (status = 200, body = dto::UnsubscribeResponse, description = "`ok: true`: the subscription ended"),
        (status = 404, body = ErrorBody,
         description = "ERR_CONFIGURATION_UNSUBSCRIBE: no live subscription of the caller has this id (daprd \
                        answers 500 with `{ok: false}` here; a client's mistake is a 4xx in Dapr's error shape); \
                        another caller's subscription is answered the same, so ids tell nothing"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn unsubscribe_configuration(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath((store, id)): DaprPath<(String, String)>,
) -> Result<Response, ApiError> {
    st.configuration_store(&store, Op::ConfigurationUnsubscribe)?;
    if st.dapr.subscriptions.close(&id, grant.principal()) {
        return Ok(axum::Json(dto::UnsubscribeResponse {
            ok: true,
            message: String::new(),
        })
        .into_response());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "ERR_CONFIGURATION_UNSUBSCRIBE",
        format!("failed to unsubscribe to configuration request {id}: subscription does not exist"),
    ))
}

/// The same routes under `/v1.0-alpha1`, as daprd serves them (left out of the OpenAPI document,
/// which names them in each route's description).
pub fn alpha_routes(router: Router<AppState>) -> Router<AppState> {
    router
        .route(
            "/v1.0-alpha1/configuration/{store}",
            axum::routing::get(get_configuration),
        )
        .route(
            "/v1.0-alpha1/configuration/{store}/subscribe",
            axum::routing::get(subscribe_configuration),
        )
        .route(
            "/v1.0-alpha1/configuration/{store}/{id}/unsubscribe",
            axum::routing::get(unsubscribe_configuration),
        )
}
