//! The Dapr distributed lock API (alpha) over HTTP, as daprd serves it; the rules are in
//! [`crate::dapr::lock`], shared with the gRPC door.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::dto;
use super::error::{ApiError, ErrorBody, Op};
use super::{AppState, Body, Caller, DaprPath};
use crate::dapr::lock::{self, TryLock};

/// The response header (and gRPC response metadata) carrying a lock's fencing token.
pub const FENCING_TOKEN_HEADER: &str = "metadata.fencingToken";

/// A body as daprd reads it (protojson): empty or `null` is every field at its default;
/// anything else must be a JSON object (serde would also read a struct from an array, by
/// position).
fn body<T: serde::de::DeserializeOwned + Default>(raw: &[u8]) -> Result<T, ApiError> {
    let raw = raw.trim_ascii();
    if raw.is_empty() || raw == b"null" {
        return Ok(T::default());
    }
    if raw.first() != Some(&b'{') {
        return Err(ApiError::malformed(
            "failed to parse the request body: expected a JSON object",
        ));
    }
    serde_json::from_slice(raw).map_err(|e| ApiError::malformed(format!("failed to parse the request body: {e}")))
}

/// Try to take a lock: `{resourceId, lockOwner, expiryInSeconds}` -> `{"success": bool}`. The
/// lock is a key of the lock store holding the owner, with the expiry as its deadline (the
/// record an Azure IoT Operations leased lock writes, so both exclude each other). On success
/// the lock's version comes back as header `metadata.fencingToken` (a stategate extension:
/// pass it as metadata `fencingToken` on state writes to fence them).
#[utoipa::path(
    post,
    path = "/v1.0-alpha1/lock/{store}",
    tag = "lock",
    params(("store" = String, Path, description = "lock store name")),
    request_body = dto::TryLockRequest,
    responses(
        (status = 200, body = dto::TryLockResponse,
         description = "`success` false: someone holds it (the same owner included)",
         headers(("metadata.fencingToken" = Option<String>,
                  description = "on success: the lock's version, its fencing token")),
         links(("Unlock" = (operation_id = "unlock", description = "release the lock taken",
                            parameters(("store" = "$request.path.store")),
                            request_body = json!({"resourceId": "$request.body#/resourceId",
                                                  "lockOwner": "$request.body#/lockOwner"}))))),
        (status = 400, body = ErrorBody,
         description = "unknown lock store (ERR_LOCK_STORE_NOT_FOUND); empty resourceId or lockOwner, \
                        expiryInSeconds not positive, malformed body (ERR_MALFORMED_REQUEST)"),
        (status = 409, body = ErrorBody,
         description = "the key is protected by a fencing token (written with metadata `fencingToken`)"),
    )
)]
pub async fn try_lock(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    Body(raw): Body,
) -> Result<Response, ApiError> {
    let store = st.lock_store(&store, Op::TryLock)?;
    let req: dto::TryLockRequest = body(&raw)?;
    let req = TryLock {
        resource_id: req.resource_id.unwrap_or_default(),
        owner: req.lock_owner.unwrap_or_default(),
        expiry_in_seconds: req.expiry_in_seconds,
    };
    let locked = lock::try_lock(&st.engine, &grant, store, &req)
        .await
        .map_err(|e| ApiError::from_dapr(Op::TryLock, e))?;
    let mut headers = HeaderMap::new();
    if let Some(token) = &locked.fencing_token
        && let Ok(v) = HeaderValue::from_str(&token.to_string())
    {
        headers.insert(FENCING_TOKEN_HEADER, v);
    }
    Ok((
        headers,
        axum::Json(dto::TryLockResponse {
            success: locked.success,
        }),
    )
        .into_response())
}

/// Release a lock: `{resourceId, lockOwner}` -> `{"status": n}` (0 SUCCESS, 1
/// LOCK_DOES_NOT_EXIST, 2 LOCK_BELONGS_TO_OTHERS).
#[utoipa::path(
    post,
    path = "/v1.0-alpha1/unlock/{store}",
    tag = "lock",
    params(("store" = String, Path, description = "lock store name")),
    request_body = dto::UnlockRequest,
    responses(
        (status = 200, body = dto::UnlockResponse),
        (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody,
         description = "the key is protected by a fencing token (written with metadata `fencingToken`)"),
    )
)]
pub async fn unlock(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    Body(raw): Body,
) -> Result<axum::Json<dto::UnlockResponse>, ApiError> {
    let store = st.lock_store(&store, Op::Unlock)?;
    let req: dto::UnlockRequest = body(&raw)?;
    let status = lock::unlock(
        &st.engine,
        &grant,
        store,
        req.resource_id.as_deref().unwrap_or_default(),
        req.lock_owner.as_deref().unwrap_or_default(),
    )
    .await
    .map_err(|e| ApiError::from_dapr(Op::Unlock, e))?;
    Ok(axum::Json(dto::UnlockResponse { status: status as i32 }))
}
