//! The Dapr distributed lock API (alpha): TryLock and Unlock, for the HTTP and gRPC doors.
//!
//! A lock is a key of a lock store whose value is the owner's name, with the lock's expiry as
//! the key's deadline: exactly the record the Azure IoT Operations leased lock writes (`SET name
//! holder NX|NEX PX ttl`, released with `VDEL name holder`). So a Dapr app and an AIO device
//! that lock the same name exclude each other, whichever comes first.
//!
//! - TryLock is `SET resource owner NX PX expiry`: it succeeds only when no one holds the lock,
//!   the same owner included (as daprd's Redis lock does; an AIO holder renews with NEX).
//! - Unlock is `VDEL resource owner`: deleted (SUCCESS), absent (LOCK_DOES_NOT_EXIST), or held
//!   by another owner (LOCK_BELONGS_TO_OTHERS), decided atomically by the engine.
//! - Fencing (which Dapr lacks): the version of the SET that took the lock is its fencing token.
//!   Passed back as metadata `fencingToken` on state writes, it protects those keys: once a
//!   later holder's (higher) token wrote a key, a stale holder's write with its old token fails.

use bytes::Bytes;

use super::{DaprError, StoreSpec};
use crate::access::{self, Grant};
use crate::engine::{Command, Engine, Reply, Set, SetCondition, VDel};
use crate::hlc::Hlc;

/// What TryLock asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryLock {
    pub resource_id: String,
    pub owner: String,
    /// Must be positive (daprd refuses anything else).
    pub expiry_in_seconds: i64,
}

/// TryLock's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locked {
    pub success: bool,
    /// When the lock was taken: its version, the fencing token of this holding.
    pub fencing_token: Option<Hlc>,
}

/// Unlock's answer, with the numbers of Dapr's `UnlockResponse.Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnlockStatus {
    Success = 0,
    LockDoesNotExist = 1,
    LockBelongsToOthers = 2,
    InternalError = 3,
}

/// The checks daprd makes before it reaches a lock store (same messages).
fn check(store: &StoreSpec, resource_id: &str, owner: &str) -> Result<Bytes, DaprError> {
    if resource_id.is_empty() {
        return Err(DaprError::Malformed(format!(
            "ResourceId is empty in lock store {}",
            store.name
        )));
    }
    if owner.is_empty() {
        return Err(DaprError::Malformed(format!(
            "LockOwner is empty in lock store {}",
            store.name
        )));
    }
    store.engine_key(resource_id)
}

/// Takes the lock if no one holds it (a write of the lock's key: the caller needs `write`).
pub async fn try_lock(engine: &Engine, grant: &Grant, store: &StoreSpec, req: &TryLock) -> Result<Locked, DaprError> {
    if req.expiry_in_seconds <= 0 {
        return Err(DaprError::Malformed(format!(
            "ExpiryInSeconds is not positive in lock store {}",
            store.name
        )));
    }
    let key = check(store, &req.resource_id, &req.owner)?;
    let set = Set {
        key,
        value: Bytes::copy_from_slice(req.owner.as_bytes()),
        condition: SetCondition::IfAbsent,
        ttl_ms: Some((req.expiry_in_seconds as u64).saturating_mul(1000)),
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    let resp = access::execute(engine, grant, Command::Set(set)).await?;
    Ok(match (resp.reply, resp.version) {
        (Reply::Ok, Some(version)) => Locked {
            success: true,
            fencing_token: Some(version),
        },
        _ => Locked {
            success: false,
            fencing_token: None,
        },
    })
}

/// Releases the lock if `owner` holds it.
pub async fn unlock(
    engine: &Engine,
    grant: &Grant,
    store: &StoreSpec,
    resource_id: &str,
    owner: &str,
) -> Result<UnlockStatus, DaprError> {
    let key = check(store, resource_id, owner)?;
    let vdel = VDel {
        key,
        value: Bytes::copy_from_slice(owner.as_bytes()),
        fencing: None,
    };
    let resp = access::execute(engine, grant, Command::VDel(vdel)).await?;
    Ok(match resp.reply {
        Reply::Int(1) => UnlockStatus::Success,
        Reply::NotApplied => UnlockStatus::LockBelongsToOthers,
        Reply::Int(_) => UnlockStatus::LockDoesNotExist,
        // VDEL answers nothing else; were it to, the lock's state is unknown.
        Reply::Ok | Reply::Nil | Reply::Value(_) | Reply::Keys { .. } | Reply::Values(_) => UnlockStatus::InternalError,
    })
}

#[cfg(test)]
mod tests;
