//! Leader election over HTTP (a stategate extension on lock stores): campaign, proclaim,
//! resign, leader, and observe as server-sent events. The rules are in
//! [`crate::dapr::election`], shared with the gRPC door.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use bytes::Bytes;
use futures_util::Stream;
use tokio_stream::StreamExt;

use super::dto;
use super::error::{ApiError, ErrorBody, Op};
use super::sse::json_event;
use super::{AppState, Body, Caller, DaprPath, DaprQuery};
use crate::dapr::StoreSpec;
use crate::dapr::election::{self, Campaign, Campaigned, Leader, Observed, Outcome};
use crate::hlc::Hlc;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn leader_dto(l: Leader) -> dto::ElectionLeader {
    dto::ElectionLeader {
        holder: text(&l.holder),
        value: l.value.as_deref().map(text),
        token: l.token.to_string(),
        lease_version: l.lease_version.to_string(),
        ttl_expire_time: l.expires_at_ms.map(crate::dapr::rfc3339),
        campaigned: l.campaigned,
    }
}

fn status(o: Outcome) -> dto::ElectionStatus {
    dto::ElectionStatus {
        status: match o {
            Outcome::Done => "SUCCESS",
            Outcome::NoLeader => "NO_LEADER",
            Outcome::NotLeader => "NOT_LEADER",
        },
    }
}

fn json<T: serde::de::DeserializeOwned>(raw: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(raw).map_err(|e| ApiError::malformed(format!("failed to parse the request body: {e}")))
}

/// The lock store and the engine key of the election `name` in it.
fn key_of<'a>(st: &'a AppState, store: &str, name: &str) -> Result<(&'a StoreSpec, Bytes), ApiError> {
    let spec = st.lock_store(store, Op::Election)?;
    let key = spec
        .engine_key(name)
        .map_err(|e| ApiError::from_dapr(Op::Election, e))?;
    Ok((spec, key))
}

fn dapr_err(e: crate::dapr::DaprError) -> ApiError {
    ApiError::from_dapr(Op::Election, e)
}

/// Campaign to lead the election `name`: take its lease (`SET name holder NEX PX ttlMs`, the
/// Azure IoT Operations leased lock's write), waiting up to `waitMs` for a release or expiry
/// while someone else holds it. A holder that leads already is elected again (a new token).
#[utoipa::path(
    post,
    path = "/v1.0-alpha1/election/{store}/campaign",
    tag = "stategate",
    params(("store" = String, Path, description = "lock store name")),
    request_body = dto::CampaignRequest,
    responses(
        (status = 200, body = dto::CampaignResponse,
         description = "`elected` true: the caller leads, `leader.token` is its fencing token; false: \
                        the wait ended, `leader` is who leads",
         links(
             ("Leader" = (operation_id = "leader", description = "who leads the election",
                          parameters(("store" = "$request.path.store"), ("name" = "$request.body#/name")))),
             ("Proclaim" = (operation_id = "proclaim", description = "proclaim as the leader elected",
                            parameters(("store" = "$request.path.store")),
                            request_body = json!({"name": "$request.body#/name", "holder": "$request.body#/holder",
                                                  "token": "$response.body#/leader/token", "value": "proclaimed"}))),
             ("Resign" = (operation_id = "resign", description = "give the leadership up",
                          parameters(("store" = "$request.path.store")),
                          request_body = json!({"name": "$request.body#/name", "holder": "$request.body#/holder"})))
         )),
        (status = 400, body = ErrorBody,
         description = "unknown lock store (ERR_LOCK_STORE_NOT_FOUND), empty name or holder, a holder \
                        with a newline, ttlMs not positive (ERR_MALFORMED_REQUEST)"),
        (status = 403, body = ErrorBody, description = "the caller may not write the election's key"),
        (status = 409, body = ErrorBody,
         description = "the key is protected by a fencing token (written with metadata `fencingToken`)"),
    )
)]
pub async fn campaign(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    Body(raw): Body,
) -> Result<axum::Json<dto::CampaignResponse>, ApiError> {
    let req: dto::CampaignRequest = json(&raw)?;
    let (_, key) = key_of(&st, &store, &req.name)?;
    // Answer before this door's request timeout does (a 408 would hide who leads); the cap
    // every door shares (`--election-max-wait`) is the shared layer's.
    let most = st.settings.request_timeout.mul_f64(0.9);
    let c = Campaign {
        key,
        holder: Bytes::from(req.holder),
        value: req.value.map(Bytes::from),
        ttl: Duration::from_millis(req.ttl_ms),
        wait: Duration::from_millis(req.wait_ms).min(most),
    };
    let answer = election::campaign(&st.engine, &st.dapr, &grant, &c)
        .await
        .map_err(dapr_err)?;
    Ok(axum::Json(match answer {
        Campaigned::Elected(l) => dto::CampaignResponse {
            elected: true,
            leader: Some(leader_dto(l)),
        },
        Campaigned::NotElected(l) => dto::CampaignResponse {
            elected: false,
            leader: l.map(leader_dto),
        },
    }))
}

/// Update what the leader proclaims: only the lease's holder, with a token of its leadership.
#[utoipa::path(
    post,
    path = "/v1.0-alpha1/election/{store}/proclaim",
    tag = "stategate",
    params(("store" = String, Path, description = "lock store name")),
    request_body = dto::ProclaimRequest,
    responses(
        (status = 200, body = dto::ElectionStatus),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody,
         description = "the key is protected by a fencing token (written with metadata `fencingToken`)"),
    )
)]
pub async fn proclaim(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    Body(raw): Body,
) -> Result<axum::Json<dto::ElectionStatus>, ApiError> {
    let req: dto::ProclaimRequest = json(&raw)?;
    let (_, key) = key_of(&st, &store, &req.name)?;
    let token: Hlc = req
        .token
        .parse()
        .map_err(|_| ApiError::malformed(format!("{:?} is not a fencing token", req.token)))?;
    let holder = Bytes::from(req.holder);
    let value = Bytes::from(req.value);
    let o = election::proclaim(&st.engine, &grant, &key, &holder, &token, &value)
        .await
        .map_err(dapr_err)?;
    Ok(axum::Json(status(o)))
}

/// Give up leadership (`VDEL name holder`, then the holder's proclamation goes).
#[utoipa::path(
    post,
    path = "/v1.0-alpha1/election/{store}/resign",
    tag = "stategate",
    params(("store" = String, Path, description = "lock store name")),
    request_body = dto::ResignRequest,
    responses(
        (status = 200, body = dto::ElectionStatus),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody,
         description = "the key is protected by a fencing token (written with metadata `fencingToken`)"),
    )
)]
pub async fn resign(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    Body(raw): Body,
) -> Result<axum::Json<dto::ElectionStatus>, ApiError> {
    let req: dto::ResignRequest = json(&raw)?;
    let (_, key) = key_of(&st, &store, &req.name)?;
    let o = election::resign(&st.engine, &grant, &key, &Bytes::from(req.holder))
        .await
        .map_err(dapr_err)?;
    Ok(axum::Json(status(o)))
}

/// `name`, the one parameter of the read routes.
fn name_param(params: &[(String, String)]) -> Result<String, ApiError> {
    let mut name = None;
    for (k, v) in params {
        match k.as_str() {
            "name" => name = Some(v.clone()),
            other => return Err(ApiError::malformed(format!("unknown parameter {other:?}"))),
        }
    }
    name.ok_or_else(|| ApiError::malformed("the election name is missing (?name=)"))
}

/// Who leads the election `name` now.
#[utoipa::path(
    get,
    path = "/v1.0-alpha1/election/{store}/leader",
    tag = "stategate",
    params(
        ("store" = String, Path, description = "lock store name"),
        ("name" = dto::DaprKey, Query, description = "the election's name"),
    ),
    responses(
        (status = 200, body = dto::LeaderResponse),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "the caller may not read the election's key"),
    )
)]
pub async fn leader(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): DaprQuery,
) -> Result<axum::Json<dto::LeaderResponse>, ApiError> {
    let (_, key) = key_of(&st, &store, &name_param(&params)?)?;
    let l = election::leader(&st.engine, &grant, &key).await.map_err(dapr_err)?;
    Ok(axum::Json(dto::LeaderResponse {
        leader: l.map(leader_dto),
    }))
}

/// Observe the election `name`: who leads now, then each new leader, as server-sent events.
#[utoipa::path(
    get,
    path = "/v1.0-alpha1/election/{store}/observe",
    tag = "stategate",
    params(
        ("store" = String, Path, description = "lock store name"),
        ("name" = dto::DaprKey, Query, description = "the election's name"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream",
         description = "events `leader` (data: `{\"leader\": ...}`, null when nobody leads): the current \
                        leader first, then each change of leader, token or proclaimed value (renewals \
                        are not reported); a final `failed` (storage failure, read access lost), \
                        `shutdown` or `revoked`"),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
    )
)]
pub async fn observe(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprPath(store): DaprPath<String>,
    DaprQuery(params): DaprQuery,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let (_, key) = key_of(&st, &store, &name_param(&params)?)?;
    let leaders = election::observe(&st.engine, &grant, key).map_err(dapr_err)?;
    let slot = st
        .dapr
        .access
        .open_stream(grant.principal())
        .map_err(|e| ApiError::from_engine(Op::Election, e))?;
    let stream = leaders.map(move |o| {
        // The stream holds its slot of the caller's stream limit until it ends.
        let _open = &slot;
        Ok(match o {
            Observed::Leader(l) => json_event(
                "leader",
                &dto::LeaderResponse {
                    leader: l.map(leader_dto),
                },
            ),
            Observed::Failed(e) => {
                let err = ApiError::from_engine(Op::Election, e);
                json_event(
                    "failed",
                    &ErrorBody {
                        error_code: err.code.to_owned(),
                        message: err.message,
                    },
                )
            }
        })
    });
    // Ends like the state subscription: `shutdown` when the service stops, `revoked` when a
    // reload removed the caller's token.
    Ok(super::sse::until_stopped(&st, grant, stream, "observe again"))
}
