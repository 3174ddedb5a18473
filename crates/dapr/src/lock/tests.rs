use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::access::Grant;
use crate::engine::{EngineError, Limits};
use crate::hlc::ManualClock;
use crate::storage::Store;
use crate::{SaveItem, save};

const T0: u64 = 1_000_000;

async fn engine() -> (Engine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(Store::memory(), "n", clock.clone(), Limits::default())
        .await
        .unwrap();
    (e, clock)
}

fn store() -> StoreSpec {
    "lockstore".parse().unwrap()
}

fn req(resource: &str, owner: &str, secs: i64) -> TryLock {
    TryLock {
        resource_id: resource.into(),
        owner: owner.into(),
        expiry_in_seconds: secs,
    }
}

#[tokio::test]
async fn try_lock_excludes_everyone_until_unlock_or_expiry() {
    let (e, clock) = engine().await;
    let s = store();
    let first = try_lock(&e, &Grant::all(), &s, &req("job", "a", 10)).await.unwrap();
    assert!(first.success);
    let token = first.fencing_token.unwrap();
    // The record is the AIO leased lock's: the owner as the value, the expiry as the deadline.
    let held = e.read(&Bytes::from("job")).await.unwrap().unwrap();
    assert_eq!((&held.value[..], held.version.clone()), (&b"a"[..], token.clone()));
    assert_eq!(held.expires_at_ms, Some(T0 + 10_000));
    for owner in ["b", "a"] {
        let again = try_lock(&e, &Grant::all(), &s, &req("job", owner, 10)).await.unwrap();
        assert_eq!(
            again,
            Locked {
                success: false,
                fencing_token: None
            },
            "{owner}"
        );
    }
    assert_eq!(
        unlock(&e, &Grant::all(), &s, "job", "b").await.unwrap(),
        UnlockStatus::LockBelongsToOthers
    );
    assert_eq!(
        unlock(&e, &Grant::all(), &s, "job", "a").await.unwrap(),
        UnlockStatus::Success
    );
    assert_eq!(
        unlock(&e, &Grant::all(), &s, "job", "a").await.unwrap(),
        UnlockStatus::LockDoesNotExist
    );
    // Expiry frees it, and the next holding gets a higher token.
    assert!(
        try_lock(&e, &Grant::all(), &s, &req("job", "b", 1))
            .await
            .unwrap()
            .success
    );
    clock.advance(1_000);
    let next = try_lock(&e, &Grant::all(), &s, &req("job", "c", 5)).await.unwrap();
    assert!(next.success);
    assert!(next.fencing_token.unwrap() > token);
    assert_eq!(
        unlock(&e, &Grant::all(), &s, "job", "b").await.unwrap(),
        UnlockStatus::LockBelongsToOthers
    );
}

#[tokio::test]
async fn malformed_requests_are_refused_with_daprd_messages() {
    let (e, _) = engine().await;
    let s = store();
    let cases = [
        (req("", "a", 1), "ResourceId is empty in lock store lockstore"),
        (req("r", "", 1), "LockOwner is empty in lock store lockstore"),
        (
            req("r", "a", 0),
            "ExpiryInSeconds is not positive in lock store lockstore",
        ),
        (
            req("r", "a", -5),
            "ExpiryInSeconds is not positive in lock store lockstore",
        ),
        (req("x||y", "a", 1), "can't contain '||'"),
    ];
    for (r, want) in cases {
        match try_lock(&e, &Grant::all(), &s, &r).await {
            Err(DaprError::Malformed(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("{r:?}: {other:?}"),
        }
    }
    assert!(matches!(
        unlock(&e, &Grant::all(), &s, "", "a").await,
        Err(DaprError::Malformed(_))
    ));
    assert!(matches!(
        unlock(&e, &Grant::all(), &s, "r", "").await,
        Err(DaprError::Malformed(_))
    ));
    assert_eq!(e.key_count().await.unwrap(), 0, "nothing was written");
}

#[tokio::test]
async fn a_prefixed_lock_store_keeps_its_locks_apart() {
    let (e, _) = engine().await;
    let named: StoreSpec = "locks=name".parse().unwrap();
    assert!(
        try_lock(&e, &Grant::all(), &named, &req("job", "a", 10))
            .await
            .unwrap()
            .success
    );
    assert!(
        try_lock(&e, &Grant::all(), &store(), &req("job", "b", 10))
            .await
            .unwrap()
            .success
    );
    assert!(e.read(&Bytes::from("locks||job")).await.unwrap().is_some());
}

/// The lock's token protects state: a holder whose lock expired and was taken by another
/// cannot write over the new holder's writes with its old token.
#[tokio::test]
async fn the_fencing_token_stops_a_stale_holder() {
    let (e, clock) = engine().await;
    let locks = store();
    let state: StoreSpec = "statestore".parse().unwrap();
    let write = |token: &Hlc, value: &str| SaveItem {
        key: "guarded".into(),
        value: Bytes::copy_from_slice(value.as_bytes()),
        etag: None,
        metadata: HashMap::from([("fencingToken".to_owned(), token.to_string())]),
        concurrency: None,
        consistency: None,
    };
    let old = try_lock(&e, &Grant::all(), &locks, &req("job", "a", 1))
        .await
        .unwrap()
        .fencing_token
        .unwrap();
    save(&e, &Grant::all(), &state, &write(&old, "\"a\"")).await.unwrap();
    clock.advance(1_000);
    let new = try_lock(&e, &Grant::all(), &locks, &req("job", "b", 10))
        .await
        .unwrap()
        .fencing_token
        .unwrap();
    save(&e, &Grant::all(), &state, &write(&new, "\"b\"")).await.unwrap();
    let stale = save(&e, &Grant::all(), &state, &write(&old, "\"a again\""))
        .await
        .unwrap_err();
    assert!(
        matches!(stale, DaprError::Engine(EngineError::FencingTokenLower)),
        "{stale:?}"
    );
    let kept = e.read(&Bytes::from("guarded")).await.unwrap().unwrap();
    assert_eq!(&kept.value[..], b"\"b\"");
}
