//! `Engine::transact`: every operation in order or none, conditions that fail the whole
//! transaction, several operations on one key, deletes of missing and expired keys, the key
//! quota, and one notification per change, in order.

use super::*;

fn set(key: &str, v: &str) -> TxOp {
    TxOp::Set(Set {
        key: b(key),
        value: b(v),
        condition: SetCondition::Always,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    })
}

fn set_if(key: &str, v: &str, condition: SetCondition) -> TxOp {
    TxOp::Set(Set {
        key: b(key),
        value: b(v),
        condition,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    })
}

fn del(key: &str) -> TxOp {
    TxOp::Del(Del {
        key: b(key),
        fencing: None,
        condition: DelCondition::Always,
    })
}

fn del_if(key: &str, version: Hlc) -> TxOp {
    TxOp::Del(Del {
        key: b(key),
        fencing: None,
        condition: DelCondition::IfVersion(version),
    })
}

impl Fx {
    /// Every key with its value and version, as GET sees them.
    async fn snapshot(&self, keys: &[&str]) -> Vec<(String, Response)> {
        let mut out = Vec::new();
        for k in keys {
            out.push((k.to_string(), self.get(k).await));
        }
        out
    }
}

/// A failing operation anywhere (first, middle, last) leaves every key as it was and publishes
/// nothing, whatever the failure.
async fn transact_is_all_or_nothing() {
    let mut f = fx().await;
    let a = f.ok(&["SET", "a", "old"]).await.version.unwrap();
    f.run(&["SET", "fenced", "v"], ft(hlc(T0, 5))).await.unwrap();
    f.changes();
    let keys = ["a", "b", "c", "fenced"];
    let before = f.snapshot(&keys).await;

    let stale = hlc(T0 - 1, 0);
    type Failing = (TxOp, fn(&EngineError) -> bool);
    let failing: Vec<Failing> = vec![
        (del_if("a", stale.clone()), |e| {
            matches!(e, EngineError::VersionMismatch)
        }),
        (set_if("a", "x", SetCondition::IfVersion(stale)), |e| {
            matches!(e, EngineError::VersionMismatch)
        }),
        (set("fenced", "x"), |e| matches!(e, EngineError::FencingTokenRequired)),
        (del("fenced"), |e| matches!(e, EngineError::FencingTokenRequired)),
        (set("", "x"), |e| matches!(e, EngineError::EmptyKey)),
        (del(""), |e| matches!(e, EngineError::EmptyKey)),
        (set("b", &"v".repeat(5 * 1024 * 1024)), |e| {
            matches!(e, EngineError::TooLarge)
        }),
    ];
    for (bad, is_expected) in failing {
        for at in 0..3 {
            let mut ops = vec![set("a", "new"), set("b", "new"), del("c")];
            ops.insert(at, bad.clone());
            let got = f.engine.transact(ops).await;
            match &got {
                Err(e) if is_expected(e) => {}
                other => panic!("{bad:?} at {at}: {other:?}"),
            }
            assert_eq!(f.snapshot(&keys).await, before, "{bad:?} at {at} changed nothing");
            f.no_changes();
        }
    }
    assert_eq!(f.get("a").await.version, Some(a));
}

/// An unmet NX/NEX or ETag inside a transaction fails it all (outside one, NX is a reply).
async fn transact_conditions_fail_the_whole_transaction() {
    let mut f = fx().await;
    let x = f.ok(&["SET", "x", "1"]).await.version.unwrap();
    f.changes();
    for cond in [
        SetCondition::IfAbsent,
        SetCondition::IfAbsentOrEqual,
        SetCondition::IfVersion(hlc(T0, 99)),
    ] {
        let got = f
            .engine
            .transact(vec![set("y", "1"), set_if("x", "2", cond.clone())])
            .await;
        assert_err!(got, EngineError::VersionMismatch);
        assert_eq!(f.get("y").await.reply, Reply::Nil, "{cond:?}");
        assert_eq!(f.get("x").await.version.as_ref(), Some(&x));
        f.no_changes();
    }
    // Met conditions apply.
    let r = f
        .engine
        .transact(vec![
            set_if("y", "1", SetCondition::IfAbsent),
            set_if("x", "1", SetCondition::IfAbsentOrEqual),
            set_if("x", "3", SetCondition::Always),
        ])
        .await
        .unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(f.get("y").await.reply, value("1"));
    assert_eq!(f.get("x").await.reply, value("3"));
    let x3 = f.get("x").await.version.unwrap();
    let r = f
        .engine
        .transact(vec![set_if("x", "4", SetCondition::IfVersion(x3.clone()))])
        .await
        .unwrap();
    assert_eq!(r[0].reply, Reply::Ok);
    assert!(r[0].version.as_ref().unwrap() > &x3);
}

/// Several operations on one key run in order, each seeing the one before; one record is
/// written for the key, the last state.
async fn transact_several_ops_on_one_key_in_order() {
    let mut f = fx().await;
    let r = f
        .engine
        .transact(vec![set("k", "1"), set("k", "2"), del("k"), set("k", "3")])
        .await
        .unwrap();
    let replies: Vec<Reply> = r.iter().map(|r| r.reply.clone()).collect();
    assert_eq!(replies, [Reply::Ok, Reply::Ok, Reply::Int(1), Reply::Ok]);
    let versions: Vec<Hlc> = r.iter().map(|r| r.version.clone().unwrap()).collect();
    for w in versions.windows(2) {
        assert!(w[0] < w[1], "versions grow within the transaction: {versions:?}");
    }
    let got = f.get("k").await;
    assert_eq!(got.reply, value("3"));
    assert_eq!(got.version.as_ref(), Some(&versions[3]));
    assert_eq!(
        f.changes(),
        [
            set_change("k", "1", &versions[0]),
            set_change("k", "2", &versions[1]),
            change("k", &versions[2], ChangeKind::Delete),
            set_change("k", "3", &versions[3]),
        ]
    );

    // NX sees the transaction's own earlier write: the key exists by then.
    let got = f
        .engine
        .transact(vec![del("n"), set("n", "1"), set_if("n", "2", SetCondition::IfAbsent)])
        .await;
    assert_err!(got, EngineError::VersionMismatch);
    assert_eq!(f.get("n").await.reply, Reply::Nil);
    // ... and its own earlier delete: the key is absent by then.
    let r = f
        .engine
        .transact(vec![del("k"), set_if("k", "4", SetCondition::IfAbsent)])
        .await
        .unwrap();
    assert_eq!(r[0].reply, Reply::Int(1));
    assert_eq!(r[1].reply, Reply::Ok);
    assert_eq!(f.get("k").await.reply, value("4"));
}

/// Deleting a missing key succeeds with `0` and no version, and publishes nothing; with an
/// ETag it fails the transaction.
async fn transact_deletes_of_missing_keys() {
    let mut f = fx().await;
    let r = f.engine.transact(vec![del("missing")]).await.unwrap();
    assert_eq!(r, [Response::new(Reply::Int(0), None)]);
    f.no_changes();
    let r = f.engine.transact(vec![del("missing"), set("k", "1")]).await.unwrap();
    assert_eq!(r[0], Response::new(Reply::Int(0), None));
    assert_eq!(f.changes(), [set_change("k", "1", r[1].version.as_ref().unwrap())]);
    let got = f
        .engine
        .transact(vec![set("j", "1"), del_if("missing", hlc(T0, 0))])
        .await;
    assert_err!(got, EngineError::VersionMismatch);
    assert_eq!(f.get("j").await.reply, Reply::Nil);
    f.no_changes();
    // An empty transaction does nothing.
    assert_eq!(f.engine.transact(vec![]).await.unwrap(), []);
    f.no_changes();
}

/// An expired key is absent inside a transaction: NX applies, a delete finds nothing, an
/// ETag of the expired version fails. Finding it removes it (an `Expire` change), even when the
/// transaction then fails.
async fn transact_treats_expired_keys_as_absent() {
    let mut f = fx().await;
    let old = f.ok(&["SET", "e", "old", "PX", "10"]).await.version.unwrap();
    f.ok(&["SET", "d", "old", "PX", "10"]).await;
    f.ok(&["SET", "g", "old", "PX", "10"]).await;
    f.clock.advance(10);
    f.changes();

    let r = f
        .engine
        .transact(vec![set_if("e", "new", SetCondition::IfAbsent), del("d")])
        .await
        .unwrap();
    assert_eq!(r[0].reply, Reply::Ok);
    assert_eq!(r[1], Response::new(Reply::Int(0), None));
    let changes = f.changes();
    let kinds: Vec<(Bytes, ChangeKind)> = changes.iter().map(|c| (c.key.clone(), c.kind.clone())).collect();
    assert_eq!(
        kinds,
        [
            (b("e"), ChangeKind::Expire),
            (b("d"), ChangeKind::Expire),
            (b("e"), ChangeKind::Set(b("new"))),
        ]
    );
    assert_eq!(f.get("e").await.reply, value("new"));

    let got = f.engine.transact(vec![del_if("g", old), set("h", "1")]).await;
    assert_err!(got, EngineError::VersionMismatch);
    assert_eq!(f.get("h").await.reply, Reply::Nil);
    let kinds: Vec<(Bytes, ChangeKind)> = f.changes().into_iter().map(|c| (c.key, c.kind)).collect();
    assert_eq!(kinds, [(b("g"), ChangeKind::Expire)], "only the expiry is published");
}

/// The key quota counts the transaction's net effect, atomically: over it, nothing applies.
async fn transact_respects_the_key_quota() {
    let mut f = fx_with(Limits {
        max_keys: Some(2),
        ..Limits::default()
    })
    .await;
    f.ok(&["SET", "a", "1"]).await;
    f.changes();
    let got = f.engine.transact(vec![set("b", "1"), set("c", "1")]).await;
    assert_err!(got, EngineError::QuotaExceeded);
    assert_eq!(f.get("b").await.reply, Reply::Nil);
    f.no_changes();
    // Overwrites do not count; a delete in the same transaction makes room.
    f.engine.transact(vec![set("a", "2"), set("b", "1")]).await.unwrap();
    f.engine
        .transact(vec![del("a"), set("c", "1"), set("b", "2")])
        .await
        .unwrap();
    assert_eq!(f.store.backend().len().await.unwrap(), 2);
    assert_eq!(f.get("a").await.reply, Reply::Nil);
    assert_eq!(f.get("c").await.reply, value("1"));
}

/// A SET sweeps expired keys the driver has not reached when the quota is full
/// (`quota_does_not_count_expired_keys_the_sweeper_has_not_reached`); a transaction does too,
/// so the same write is accepted: an `Expire` change, then the `Set`.
async fn transact_quota_counts_unswept_expired_keys() {
    let mut f = fx_with(Limits {
        max_keys: Some(1),
        ..Limits::default()
    })
    .await;
    f.ok(&["SET", "brief", "1", "PX", "10"]).await;
    f.clock.advance(10);
    f.changes();
    let got = f.engine.transact(vec![set("next", "1")]).await.unwrap();
    let v = got[0].version.clone().unwrap();
    let changes = f.changes();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(
        (changes[0].key.clone(), changes[0].kind.clone()),
        (b("brief"), ChangeKind::Expire)
    );
    assert_eq!(changes[1], set_change("next", "1", &v));
}

/// Every change of a transaction is published once, in operation order, with the versions the
/// responses carry, on the change feed and to KEYNOTIFY observers.
async fn transact_notifies_every_change_in_order() {
    let mut f = fx().await;
    let mut keynotify = f.engine.keynotify_feed().expect("the KEYNOTIFY feed");
    for k in ["a", "b"] {
        f.run(&["KEYNOTIFY", k], client("obs")).await.unwrap();
    }
    f.ok(&["SET", "b", "0"]).await;
    let _ = keynotify.try_recv();
    f.changes();

    let r = f
        .engine
        .transact(vec![
            set("a", "1"),
            del("b"),
            set("c", "1"),
            set("a", "2"),
            del("missing"),
        ])
        .await
        .unwrap();
    let v: Vec<Option<Hlc>> = r.iter().map(|r| r.version.clone()).collect();
    let want = [
        set_change("a", "1", v[0].as_ref().unwrap()),
        change("b", v[1].as_ref().unwrap(), ChangeKind::Delete),
        set_change("c", "1", v[2].as_ref().unwrap()),
        set_change("a", "2", v[3].as_ref().unwrap()),
    ];
    assert_eq!(v[4], None);
    assert_eq!(f.changes(), want);
    // Observers of `a` and `b` are told of their keys' changes, in the same order.
    let mut told = Vec::new();
    while let Some(n) = keynotify.try_recv() {
        assert_eq!(sorted(n.observers), ["obs"]);
        told.push(n.change);
    }
    let observed: Vec<Change> = want.iter().filter(|c| c.key != b("c")).cloned().collect();
    assert_eq!(told, observed);
}

/// A key set then deleted in one transaction, absent before and after, swapped nothing: no
/// observer hears of it (a `set` with no `delete` heard, or a version nobody can read, would
/// mislead watchers), while the transaction's other changes are published.
async fn transact_publishes_nothing_for_a_key_it_leaves_as_it_was() {
    let mut f = fx().await;
    let mut keynotify = f.engine.keynotify_feed().expect("the KEYNOTIFY feed");
    f.run(&["KEYNOTIFY", "ghost"], client("obs")).await.unwrap();
    f.changes();
    let r = f
        .engine
        .transact(vec![set("ghost", "1"), del("ghost"), set("real", "1")])
        .await
        .unwrap();
    assert_eq!(f.get("ghost").await, Response::new(Reply::Nil, None));
    let real = r[2].version.clone().expect("the real set's version");
    assert_eq!(f.changes(), [set_change("real", "1", &real)]);
    assert!(keynotify.try_recv().is_none(), "the observer of ghost heard of it");
}

on_every_backend!(
    transact_publishes_nothing_for_a_key_it_leaves_as_it_was,
    transact_is_all_or_nothing,
    transact_conditions_fail_the_whole_transaction,
    transact_several_ops_on_one_key_in_order,
    transact_deletes_of_missing_keys,
    transact_treats_expired_keys_as_absent,
    transact_respects_the_key_quota,
    transact_quota_counts_unswept_expired_keys,
    transact_notifies_every_change_in_order,
);
