//! The Dapr state routes.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use super::dto;
use super::error::{ApiError, ErrorBody, Op};
use super::{AppState, Body, Caller, DaprPath, DaprQuery};
use crate::access::Grant;
use crate::dapr::{self, DeleteItem, SaveItem, TxItem, query};

/// Query parameters as pairs (`metadata.<name>`, `concurrency`, `consistency`).
type Params = DaprQuery;

/// `metadata.<name>=<v>` query parameters.
fn query_metadata(params: &[(String, String)]) -> HashMap<String, String> {
    params
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("metadata.").map(|n| (n.to_owned(), v.clone())))
        .collect()
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A body that must be a JSON object (serde would also read a struct from a JSON array, by
/// position: `[[]]` must not pass for a transaction).
fn parse_object<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ApiError::malformed(
            "failed to parse the request body: expected a JSON object",
        ));
    }
    parse_json(body)
}

/// A JSON object, or `null`: Go's decoder leaves daprd's request struct at its zero value for
/// `null`, so daprd reads an empty request (clients send it).
fn parse_object_or_null<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiError> {
    if body.trim_ascii() == b"null" {
        return Ok(T::default());
    }
    parse_object(body)
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::malformed(format!("failed to parse the request body: {e}")))
}

/// Turns a JSON save item into the Dapr layer's item, with request-level metadata merged in
/// (see [`dapr::merge_request_metadata`]).
fn save_item(item: dto::SaveItem, request_meta: &HashMap<String, String>) -> Result<SaveItem, ApiError> {
    let key = item
        .key
        .filter(|k| !k.is_empty())
        .ok_or_else(|| ApiError::malformed("a state item has no key"))?;
    let value = match &item.value {
        Some(raw) => {
            dapr::check_decodes(raw.get()).map_err(|e| ApiError::from_dapr(Op::Save, e))?;
            dapr::compact_json(raw.get())
        }
        None => "null".to_owned(),
    };
    let mut metadata = item.metadata;
    dapr::merge_request_metadata(&mut metadata, request_meta);
    Ok(SaveItem {
        key,
        value: Bytes::from(value),
        etag: item.etag,
        metadata,
        concurrency: item.options.concurrency,
        consistency: item.options.consistency,
    })
}

/// Save state: each item is one atomic write; good items land even when another fails.
#[utoipa::path(
    method(post, put),
    path = "/v1.0/state/{store}",
    tag = "state",
    params(("store" = String, Path, description = "state store name")),
    request_body(content = Vec<dto::SaveItem>, description = "the items; `null`: none"),
    responses(
        (status = 204, description = "saved; a request of exactly one item also answers that item's new \
                                       version as `ETag` (a stategate extension)",
         headers(("ETag" = Option<String>, description = "the new version, when exactly one item was saved")),
         links(
             ("GetItem" = (operation_id = "get_state", description = "read the first item saved",
                           parameters(("store" = "$request.path.store"), ("key" = "$request.body#/0/key")))),
             ("DeleteItem" = (operation_id = "delete_state", description = "delete the first item saved",
                              parameters(("store" = "$request.path.store"), ("key" = "$request.body#/0/key"))))
         )),
        (status = 400, body = ErrorBody, description = "malformed request, unknown store or invalid etag"),
        (status = 409, body = ErrorBody, description = "etag mismatch, first-write conflict or fencing token refused"),
        (status = 507, body = ErrorBody, description = "quota exceeded"),
    )
)]
pub async fn save_state(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): Params,
    body: Body,
) -> Result<Response, ApiError> {
    let store = st.store(&store, Op::Save)?;
    // `null` is no items, as for daprd (Go decodes it into an empty list).
    let items: Vec<dto::SaveItem> = parse_json::<Option<_>>(&body.0)?.unwrap_or_default();
    let query_meta = query_metadata(&params);
    dapr::check_request_metadata(&query_meta).map_err(|e| ApiError::from_dapr(Op::Save, e))?;
    // Validate every item before writing any, so malformed input changes nothing.
    let items = items
        .into_iter()
        .map(|i| save_item(i, &query_meta))
        .collect::<Result<Vec<_>, _>>()?;
    if let [item] = &items[..] {
        // One item: its new version is known, and a client (the CLI's fencing token) needs it.
        let version = dapr::save(&st.engine, &grant, store, item)
            .await
            .map_err(|e| ApiError::from_dapr(Op::Save, e))?;
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&version.to_string()) {
            headers.insert(header::ETAG, v);
        }
        return Ok((StatusCode::NO_CONTENT, headers).into_response());
    }
    dapr::save_each(&st.engine, &grant, store, &items)
        .await
        .map_err(|e| ApiError::from_dapr(Op::Save, e))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Get state: the stored bytes unchanged, the version as `ETag`; 204 when missing.
#[utoipa::path(
    get,
    path = "/v1.0/state/{store}/{key}",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("key" = dto::DaprKey, Path, description = "key (percent-encoded)"),
        ("consistency" = Option<String>, Query, pattern = "^(eventual|strong)?$",
         description = "`eventual` or `strong` (the same here)"),
    ),
    responses(
        (status = 200, description = "the stored value; headers ETag and, when set, metadata.ttlExpireTime \
                                      and metadata.fencingToken"),
        (status = 204, description = "no such key"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn get_state(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath((store, key)): DaprPath<(String, String)>,
    DaprQuery(params): Params,
) -> Result<Response, ApiError> {
    get_one(&st, &grant, &store, &key, &params).await
}

// The keys named `bulk` and `transaction`: their paths are the bulk get's and the
// transaction's (POST/PUT), yet GET and DELETE there read and delete a key like any other.

/// Get the key named `bulk` (as `GET /v1.0/state/{store}/{key}`).
#[utoipa::path(
    get,
    path = "/v1.0/state/{store}/bulk",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("consistency" = Option<String>, Query, pattern = "^(eventual|strong)?$",
         description = "`eventual` or `strong` (the same here)"),
    ),
    responses(
        (status = 200, description = "the stored value, as for any key"),
        (status = 204, description = "no such key"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn get_bulk_key(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): Params,
) -> Result<Response, ApiError> {
    get_one(&st, &grant, &store, "bulk", &params).await
}

/// Delete the key named `bulk` (as `DELETE /v1.0/state/{store}/{key}`).
#[utoipa::path(
    delete,
    path = "/v1.0/state/{store}/bulk",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("If-Match" = Option<dto::Etag>, Header, nullable = false, description = "the ETag the key must have"),
    ),
    responses(
        (status = 204, description = "deleted, or there was no such key"),
        (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody),
    )
)]
pub async fn delete_bulk_key(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): Params,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    delete_one(&st, &grant, &store, "bulk".to_owned(), &params, &headers).await
}

/// Get the key named `transaction` (as `GET /v1.0/state/{store}/{key}`).
#[utoipa::path(
    get,
    path = "/v1.0/state/{store}/transaction",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("consistency" = Option<String>, Query, pattern = "^(eventual|strong)?$",
         description = "`eventual` or `strong` (the same here)"),
    ),
    responses(
        (status = 200, description = "the stored value, as for any key"),
        (status = 204, description = "no such key"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn get_transaction_key(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): Params,
) -> Result<Response, ApiError> {
    get_one(&st, &grant, &store, "transaction", &params).await
}

/// Delete the key named `transaction` (as `DELETE /v1.0/state/{store}/{key}`).
#[utoipa::path(
    delete,
    path = "/v1.0/state/{store}/transaction",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("If-Match" = Option<dto::Etag>, Header, nullable = false, description = "the ETag the key must have"),
    ),
    responses(
        (status = 204, description = "deleted, or there was no such key"),
        (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody),
    )
)]
pub async fn delete_transaction_key(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): Params,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    delete_one(&st, &grant, &store, "transaction".to_owned(), &params, &headers).await
}

async fn get_one(
    st: &AppState,
    grant: &Grant,
    store: &str,
    key: &str,
    params: &[(String, String)],
) -> Result<Response, ApiError> {
    let store = st.store(store, Op::Get)?;
    dapr::check_consistency(param(params, "consistency")).map_err(|e| ApiError::from_dapr(Op::Get, e))?;
    let Some(entry) = dapr::get(&st.engine, grant, store, key)
        .await
        .map_err(|e| ApiError::from_dapr(Op::Get, e))?
    else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(dapr::content_type_of(&entry.value)),
    );
    if let Ok(v) = HeaderValue::from_str(&entry.version.to_string()) {
        headers.insert(header::ETAG, v);
    }
    if let Some(ms) = entry.expires_at_ms
        && let Ok(v) = HeaderValue::from_str(&dapr::rfc3339(ms))
    {
        headers.insert("metadata.ttlExpireTime", v);
    }
    if let Some(token) = &entry.fencing
        && let Ok(v) = HeaderValue::from_str(&token.to_string())
    {
        headers.insert("metadata.fencingToken", v);
    }
    Ok((StatusCode::OK, headers, entry.value).into_response())
}

/// List keys (a stategate extension): key names of a store in key order, filtered by a glob
/// (`*`, `?`, `[a-z]`, `[!x]`, as SCAN), paged with an opaque token.
#[utoipa::path(
    get,
    path = "/v1.0-alpha1/state/{store}/keys",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("pattern" = Option<String>, Query, description = "glob over the key names (default: every key)"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 1000,
         description = "most keys returned, 1 to 1000 (default 100)"),
        ("token" = Option<String>, Query,
         description = "the `token` of the previous page, as the service issued it (sealed: any other is refused)"),
    ),
    responses(
        (status = 200, body = dto::KeysPage,
         description = "a page of keys; a page may be short (even empty) while a token is returned: \
                        each call examines a bounded number of keys, so follow tokens until none",
         links(("NextPage" = (operation_id = "list_keys", description = "the next page",
                              parameters(("store" = "$request.path.store"), ("token" = "$response.body#/token")))))),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn list_keys(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): Params,
) -> Result<axum::Json<dto::KeysPage>, ApiError> {
    let store = st.store(&store, Op::List)?;
    let mut limit = None;
    for (name, value) in &params {
        match name.as_str() {
            "pattern" | "token" => {}
            "limit" => {
                limit = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| ApiError::malformed(format!("limit {value:?} is not a number")))?,
                )
            }
            other => return Err(ApiError::malformed(format!("unknown parameter {other:?}"))),
        }
    }
    let page = dapr::list_keys(
        &st.engine,
        &grant,
        store,
        param(&params, "pattern"),
        limit,
        param(&params, "token").filter(|t| !t.is_empty()),
        st.engine.limits().scan_page.saturating_mul(10),
    )
    .await
    .map_err(|e| ApiError::from_dapr(Op::List, e))?;
    Ok(axum::Json(dto::KeysPage {
        keys: page.keys,
        token: page.token,
    }))
}

/// Bulk get: one item per key, in request order.
#[utoipa::path(
    method(post, put),
    path = "/v1.0/state/{store}/bulk",
    tag = "state",
    params(("store" = String, Path, description = "state store name")),
    request_body(content = dto::BulkGetRequest, description = "`null`: no keys"),
    responses((status = 200, body = Vec<dto::BulkItem>), (status = 400, body = ErrorBody))
)]
pub async fn bulk_get(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    body: Body,
) -> Result<axum::Json<Vec<dto::BulkItem>>, ApiError> {
    let store = st.store(&store, Op::BulkGet)?;
    let req: dto::BulkGetRequest = parse_object_or_null(&body.0)?;
    let entries = dapr::bulk_get(&st.engine, &grant, store, req.keys, st.dapr.max_bulk_keys)
        .await
        .map_err(|e| ApiError::from_dapr(Op::BulkGet, e))?;
    let out = entries
        .into_iter()
        .map(|b| match b.entry {
            Some(e) => {
                let (data, encoding) = dapr::value_to_json(&e.value);
                let mut meta = dapr::ttl_metadata(e.expires_at_ms);
                if let Some((k, v)) = encoding {
                    meta.insert(k.to_owned(), v.to_owned());
                }
                dto::BulkItem {
                    key: b.key,
                    data: Some(data),
                    etag: Some(e.version.to_string()),
                    metadata: (!meta.is_empty()).then_some(meta),
                    error: None,
                }
            }
            None => dto::BulkItem {
                key: b.key,
                data: None,
                etag: None,
                metadata: None,
                error: b.error,
            },
        })
        .collect();
    Ok(axum::Json(out))
}

/// Delete state; the ETag goes in `If-Match`.
#[utoipa::path(
    delete,
    path = "/v1.0/state/{store}/{key}",
    tag = "state",
    params(
        ("store" = String, Path, description = "state store name"),
        ("key" = dto::DaprKey, Path, description = "key (percent-encoded)"),
        ("If-Match" = Option<dto::Etag>, Header, nullable = false, description = "the ETag the key must have"),
    ),
    responses(
        (status = 204, description = "deleted, or there was no such key"),
        (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody),
    )
)]
pub async fn delete_state(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath((store, key)): DaprPath<(String, String)>,
    DaprQuery(params): Params,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    delete_one(&st, &grant, &store, key, &params, &headers).await
}

async fn delete_one(
    st: &AppState,
    grant: &Grant,
    store: &str,
    key: String,
    params: &[(String, String)],
    headers: &HeaderMap,
) -> Result<StatusCode, ApiError> {
    let store = st.store(store, Op::Delete)?;
    let etag = match headers.get(header::IF_MATCH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "ERR_STATE_DELETE", "If-Match is not text"))?
                .to_owned(),
        ),
    };
    let item = DeleteItem {
        key,
        etag,
        metadata: query_metadata(params),
        concurrency: param(params, "concurrency").map(str::to_owned),
        consistency: param(params, "consistency").map(str::to_owned),
    };
    dapr::delete(&st.engine, grant, store, &item)
        .await
        .map_err(|e| ApiError::from_dapr(Op::Delete, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Transaction: every operation in order, or none.
#[utoipa::path(
    method(post, put),
    path = "/v1.0/state/{store}/transaction",
    tag = "state",
    params(("store" = String, Path, description = "state store name")),
    request_body(content = dto::TransactionRequest, description = "`null`: no operations"),
    responses(
        (status = 204, description = "committed"),
        (status = 400, body = ErrorBody, description = "malformed, unknown operation, too many operations"),
        (status = 500, body = ErrorBody, description = "not committed (conflicts included)"),
    )
)]
pub async fn transaction(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): Params,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let store = st.store(&store, Op::Transaction)?;
    let req: dto::TransactionRequest = parse_object_or_null(&body.0)?;
    let mut meta = req.metadata;
    dapr::merge_request_metadata(&mut meta, &query_metadata(&params));
    dapr::check_request_metadata(&meta).map_err(|e| ApiError::from_dapr(Op::Transaction, e))?;
    let mut items = Vec::with_capacity(req.operations.len());
    for op in req.operations {
        let item = save_item(op.request, &meta)?;
        items.push(match op.operation.as_str() {
            "upsert" => TxItem::Upsert(item),
            "delete" => TxItem::Delete(DeleteItem {
                key: item.key,
                etag: item.etag,
                metadata: item.metadata,
                concurrency: item.concurrency,
                consistency: item.consistency,
            }),
            other => {
                return Err(ApiError::from_dapr(
                    Op::Transaction,
                    dapr::DaprError::UnsupportedOperation(other.to_owned()),
                ));
            }
        });
    }
    dapr::transact(&st.engine, &grant, store, &items, st.dapr.max_transaction_ops)
        .await
        .map_err(|e| ApiError::from_dapr(Op::Transaction, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Query (alpha): filters, sort and paging over JSON values.
#[utoipa::path(
    method(post, put),
    path = "/v1.0-alpha1/state/{store}/query",
    tag = "state",
    params(("store" = String, Path, description = "state store name")),
    request_body(content = Object, description = "`{filter?, sort?, page?: {limit?, token?}}` (schema `QueryRequest`)"),
    responses(
        (status = 200, body = dto::QueryResponse),
        (status = 204, description = "no results"),
        (status = 400, body = ErrorBody),
    )
)]
pub async fn query_state(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let store = st.store(&store, Op::Query)?;
    let q: Value = parse_json(&body.0)?;
    let q = query::Query::parse(&q).map_err(|e| ApiError::from_dapr(Op::Query, e))?;
    let page = query::run(&st.engine, &grant, store, &q)
        .await
        .map_err(|e| ApiError::from_dapr(Op::Query, e))?;
    if page.rows.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let results = page
        .rows
        .into_iter()
        .map(|r| {
            let (data, encoding) = dapr::value_to_json(&r.value);
            dto::QueryItem {
                key: r.key,
                data,
                etag: r.etag,
                metadata: encoding.map(|(k, v)| HashMap::from([(k.to_owned(), v.to_owned())])),
            }
        })
        .collect();
    Ok(axum::Json(dto::QueryResponse {
        results,
        token: page.token,
    })
    .into_response())
}

/// Health of the service.
#[utoipa::path(get, path = "/v1.0/healthz", tag = "health", responses((status = 204, description = "healthy")))]
pub async fn healthz() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// Health of outbound connections (SDKs probe this before any call).
#[utoipa::path(get, path = "/v1.0/healthz/outbound", tag = "health", responses((status = 204, description = "healthy")))]
pub async fn healthz_outbound() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// The stores and their features.
#[utoipa::path(get, path = "/v1.0/metadata", tag = "metadata", responses((status = 200, body = dto::Metadata)))]
pub async fn metadata(State(st): State<AppState>) -> axum::Json<dto::Metadata> {
    let settings = &st.dapr;
    let components = dapr::components(&settings.stores, &settings.lock_stores, &settings.configuration_stores)
        .into_iter()
        .map(|c| dto::ComponentMetadata {
            name: c.name,
            kind: c.kind.into(),
            version: c.version.into(),
            capabilities: c.capabilities,
        })
        .collect();
    axum::Json(dto::Metadata {
        id: st.dapr.app_id.clone(),
        runtime_version: env!("CARGO_PKG_VERSION").into(),
        components,
    })
}
