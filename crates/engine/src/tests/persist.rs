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
        sliding: false,
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
                sliding: false,
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

/// Versions, deadlines and the key count through the engine, across a reopen with a clock that
/// went backwards and then forwards.
#[tokio::test]
async fn engine_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let set = |key: &str, ttl_ms: Option<u64>| {
        Command::Set(Set {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            condition: SetCondition::Always,
            ttl_ms,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        })
    };
    let limits = Limits {
        max_keys: Some(4),
        ..Limits::default()
    };
    let first = {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let engine = Engine::open(
            Store::new(DurableBackend::open(DurableOptions::new(dir.path())).unwrap()),
            "n",
            clock,
            limits.clone(),
        )
        .await
        .unwrap();
        let r = engine.execute(set("k", None)).await.unwrap();
        engine.execute(set("short", Some(100))).await.unwrap();
        engine.execute(set("other", None)).await.unwrap();
        // A DEL's version is issued but not stored with any record.
        engine.execute(set("gone", None)).await.unwrap();
        let del = engine
            .execute(Command::Del(Del {
                key: Bytes::from_static(b"gone"),
                fencing: None,
                condition: DelCondition::Always,
            }))
            .await
            .unwrap();
        (r.version.unwrap(), del.version.unwrap())
    };
    let (first, deleted) = first;
    // The wall clock went back a minute while the service was down.
    let clock = Arc::new(ManualClock::new(940_000));
    let engine = Engine::open(
        Store::new(DurableBackend::open(DurableOptions::new(dir.path())).unwrap()),
        "n",
        clock.clone(),
        limits.clone(),
    )
    .await
    .unwrap();
    // The first version issued after the restart: past the DEL's (which is past every stored one).
    let r = engine.execute(set("gone", None)).await.unwrap();
    assert!(r.version.unwrap() > deleted, "past the DEL's version too");
    let r = engine.execute(set("k", None)).await.unwrap();
    assert!(r.version.unwrap() > first, "the version moved forward");
    // The key count was restored ("gone" made it four): a fifth key does not fit.
    let refused = engine.execute(set("fifth", None)).await;
    assert!(matches!(refused, Err(EngineError::QuotaExceeded)), "{refused:?}");
    drop(engine);

    // Later, "short" has expired while the service was down: it is not served.
    let clock = Arc::new(ManualClock::new(2_000_000));
    let engine = Engine::open(
        Store::new(DurableBackend::open(DurableOptions::new(dir.path())).unwrap()),
        "n",
        clock,
        limits,
    )
    .await
    .unwrap();
    let got = engine
        .execute(Command::Get(Get {
            key: Bytes::from_static(b"short"),
        }))
        .await
        .unwrap();
    assert_eq!(got.reply, Reply::Nil);
    // It was removed, which made room.
    engine.execute(set("fifth", None)).await.unwrap();
}
