//! A SET asking for persistence (MQTT `aio-persistence: true`): applied where the storage
//! keeps keys beyond the process (durable, Redis, Valkey), refused with
//! [`EngineError::NotPersistent`] where it does not (memory), and then nothing changes: not the
//! key, not the feed, not the other operations of a transaction.

use super::*;
use crate::storage::durable::{DurableBackend, DurableOptions};

fn persisted(key: &str, v: &str, condition: SetCondition) -> Set {
    Set {
        key: b(key),
        value: b(v),
        condition,
        ttl_ms: None,
        timestamp: Some(hlc(T0, 0)),
        fencing: None,
        persist: true,
    }
}

/// Runs on every backend; what each says of itself decides the outcome.
async fn a_set_asking_for_persistence_follows_the_storage() {
    let mut f = fx().await;
    let v1 = f.ok(&["SET", "k", "plain"]).await.version.unwrap();
    f.changes();
    let asked = f
        .engine
        .execute(Command::Set(persisted("k", "kept", SetCondition::Always)))
        .await;
    let absent = f
        .engine
        .execute(Command::Set(persisted("new", "x", SetCondition::IfAbsent)))
        .await;
    let in_tx = f
        .engine
        .transact(vec![
            TxOp::Set(persisted("tx-a", "1", SetCondition::Always)),
            TxOp::Set(Set {
                persist: false,
                ..persisted("tx-b", "2", SetCondition::Always)
            }),
        ])
        .await;
    if f.store.backend().persistent() {
        let v2 = asked.unwrap().version.unwrap();
        assert!(v2 > v1);
        assert_eq!(f.get("k").await.reply, value("kept"));
        assert_eq!(absent.unwrap().reply, Reply::Ok);
        assert_eq!(in_tx.unwrap().len(), 2);
        assert_eq!(f.changes().len(), 4, "every applied change is published");
        return;
    }
    assert_err!(asked, EngineError::NotPersistent);
    assert_err!(absent, EngineError::NotPersistent);
    assert_err!(in_tx, EngineError::NotPersistent);
    let kept = f.get("k").await;
    assert_eq!((kept.reply, kept.version), (value("plain"), Some(v1)));
    for key in ["new", "tx-a", "tx-b"] {
        assert_eq!(
            f.get(key).await.reply,
            Reply::Nil,
            "{key} was created by a refused request"
        );
    }
    f.no_changes();
    // Without the request the same SET is applied: only the promise is refused.
    assert_eq!(f.ok(&["SET", "k", "volatile"]).await.reply, Reply::Ok);
}

#[tokio::test]
async fn memory_storage_refuses_and_durable_storage_accepts() {
    let memory = fx_on(Store::memory(), Limits::default()).await;
    assert!(!memory.store.backend().persistent());
    assert_err!(
        memory
            .engine
            .execute(Command::Set(persisted("k", "v", SetCondition::Always)))
            .await,
        EngineError::NotPersistent
    );

    let dir = tempfile::tempdir().unwrap();
    let durable = DurableBackend::open(DurableOptions::new(dir.path())).unwrap();
    let f = fx_on(Store::new(durable), Limits::default()).await;
    assert!(f.store.backend().persistent());
    let r = f
        .engine
        .execute(Command::Set(persisted("k", "v", SetCondition::Always)))
        .await
        .unwrap();
    assert_eq!(r.reply, Reply::Ok);
    assert_eq!(f.get("k").await.reply, value("v"));
}

on_every_backend!(a_set_asking_for_persistence_follows_the_storage);
