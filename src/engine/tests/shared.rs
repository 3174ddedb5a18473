//! Replicas on one Redis (engine/shared.rs): two engines on the same store, as two processes
//! would be. Each change reaches both histories once, in log order; KEYNOTIFY registrations
//! made through one replica are honoured by the other, and the replica that applied a change
//! notifies; a request repeated on the other replica is not executed twice; a log that lost
//! entries ends the watchers' streams.

use std::time::Duration;

use super::*;
use crate::storage::redis::server::{Flavor, TestServer};
use crate::storage::{RedisOptions, StorageKind};

async fn replica(server: &TestServer, node: &str, limits: Limits) -> Fx {
    let Ok(StorageKind::Redis(url)) = server.url().parse() else {
        panic!("not a redis url");
    };
    let options = RedisOptions {
        prefix: "shared-test:".into(),
        timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let store = Store::new(crate::storage::redis::RedisBackend::open(&url, &options).await.unwrap());
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::open(store.clone(), node, clock.clone(), limits).await.unwrap();
    let feed = engine.subscribe();
    Fx {
        engine,
        clock,
        store,
        feed,
    }
}

/// The next change in `f`'s history (it may still be on its way from the log).
async fn next(f: &mut Fx) -> Change {
    tokio::time::timeout(Duration::from_secs(10), f.feed.recv())
        .await
        .expect("a change in time")
        .expect("no lag")
        .change
        .clone()
}

fn bs(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn rid(id: &str) -> RequestId {
    RequestId {
        id: bs(id),
        ttl: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn every_change_reaches_every_replica_once_in_order() {
    let server = TestServer::start(Flavor::Redis);
    let mut a = replica(&server, "a", Limits::default()).await;
    let mut b = replica(&server, "b", Limits::default()).await;
    let v1 = a.ok(&["SET", "k", "1"]).await.version.unwrap();
    let v2 = b.ok(&["SET", "k", "2", "PX", "60000"]).await.version.unwrap();
    let v3 = a.ok(&["DEL", "k"]).await.version.unwrap();
    assert!(v1 < v2 && v2 < v3);
    let expected = vec![
        set_change("k", "1", &v1),
        set_change("k", "2", &v2),
        Change {
            key: bs("k"),
            version: v3,
            kind: ChangeKind::Delete,
        },
    ];
    for f in [&mut a, &mut b] {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(next(f).await);
        }
        assert_eq!(got, expected);
    }
    // The writer's own change is in its history when the write returns.
    let v4 = b.ok(&["SET", "other", "x"]).await.version.unwrap();
    assert_eq!(b.changes(), vec![set_change("other", "x", &v4)]);
    assert_eq!(next(&mut a).await, set_change("other", "x", &v4));
    a.no_changes();
}

#[tokio::test]
async fn keynotify_registered_on_one_replica_is_served_by_the_one_that_changes_the_key() {
    let server = TestServer::start(Flavor::Valkey);
    let a = replica(&server, "a", Limits::default()).await;
    let b = replica(&server, "b", Limits::default()).await;
    let mut a_notes = a.engine.keynotify_feed().unwrap();
    let mut b_notes = b.engine.keynotify_feed().unwrap();
    a.run(&["KEYNOTIFY", "k"], client("dev")).await.unwrap();
    // B's change comes after the registration in the log, and B reads the log in order.
    b.ok(&["SET", "k", "1"]).await;
    let n = tokio::time::timeout(Duration::from_secs(10), b_notes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.change.key, bs("k"));
    assert_eq!(n.observers, vec![Arc::<str>::from("dev")]);
    assert!(
        a_notes.try_recv().is_none(),
        "only the replica that applied a change notifies"
    );
    assert_eq!(b.engine.observers_of(b"k"), vec![Arc::<str>::from("dev")]);

    // STOP through B; a change through A notifies nobody.
    let stop = b.run(&["KEYNOTIFY", "k", "STOP"], client("dev")).await.unwrap();
    assert_eq!(stop.reply, Reply::Ok);
    a.ok(&["SET", "k", "2"]).await;
    assert!(a.engine.observers_of(b"k").is_empty());
    assert!(a_notes.try_recv().is_none() && b_notes.try_recv().is_none());
    // A STOP of nothing is 0 on either replica.
    let again = a.run(&["KEYNOTIFY", "k", "STOP"], client("dev")).await.unwrap();
    assert_eq!(again.reply, Reply::Int(0));
}

#[tokio::test]
async fn registrations_survive_in_storage_and_drops_reach_every_replica() {
    let server = TestServer::start(Flavor::Redis);
    let a = replica(&server, "a", Limits::default()).await;
    a.run(&["KEYNOTIFY", "k1"], client("dev")).await.unwrap();
    a.run(&["KEYNOTIFY", "k2"], client("dev")).await.unwrap();
    // A replica started later loads them.
    let b = replica(&server, "b", Limits::default()).await;
    assert_eq!(b.engine.registrations(), 2);
    assert_eq!(b.engine.drop_client("dev", None).await, 2);
    assert_eq!(b.engine.registrations(), 0);
    // A applied the drop from the log (it is answered once B has read it back; A reads on).
    let patience = std::time::Instant::now() + Duration::from_secs(10);
    while a.engine.registrations() != 0 {
        assert!(
            std::time::Instant::now() < patience,
            "A still has the dropped registrations"
        );
        a.ok(&["GET", "nudge"]).await;
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn registry_bounds_hold_across_replicas() {
    let server = TestServer::start(Flavor::Redis);
    let mut limits = Limits::default();
    limits.observers.per_client = 2;
    limits.observers.total = 3;
    let a = replica(&server, "a", limits.clone()).await;
    let b = replica(&server, "b", limits).await;
    a.run(&["KEYNOTIFY", "k1"], client("c1")).await.unwrap();
    b.run(&["KEYNOTIFY", "k2"], client("c1")).await.unwrap();
    assert_err!(
        a.run(&["KEYNOTIFY", "k3"], client("c1")).await,
        EngineError::QuotaExceeded
    );
    b.run(&["KEYNOTIFY", "k1"], client("c2")).await.unwrap();
    assert_err!(
        a.run(&["KEYNOTIFY", "k2"], client("c2")).await,
        EngineError::QuotaExceeded
    );
    assert_eq!(b.engine.registrations(), 3);
}

#[tokio::test]
async fn a_request_repeated_on_another_replica_is_not_executed_again() {
    let server = TestServer::start(Flavor::Redis);
    let mut a = replica(&server, "a", Limits::default()).await;
    let mut b = replica(&server, "b", Limits::default()).await;
    let nx = || parse(&["SET", "lock", "me", "NX"], ts(T0)).unwrap();
    let first = a.engine.execute_request(nx(), Some(&rid("r1"))).await.unwrap();
    assert_eq!(first.reply, Reply::Ok);
    // The redelivery on B: the key exists now, yet the answer is the first one.
    let again = b.engine.execute_request(nx(), Some(&rid("r1"))).await.unwrap();
    assert_eq!(again, first);
    // Another request id is another request.
    let other = b.engine.execute_request(nx(), Some(&rid("r2"))).await.unwrap();
    assert_eq!(other.reply, Reply::NotApplied);

    let del = || parse(&["DEL", "lock"], ts(T0)).unwrap();
    let deleted = b.engine.execute_request(del(), Some(&rid("r3"))).await.unwrap();
    assert_eq!(deleted.reply, Reply::Int(1));
    a.ok(&["SET", "lock", "someone else"]).await;
    let again = a.engine.execute_request(del(), Some(&rid("r3"))).await.unwrap();
    assert_eq!(again, deleted, "the repeat deletes nothing");
    assert_eq!(a.get("lock").await.reply, Reply::Value(bs("someone else")));
    // Each change happened once: SET, DEL, SET.
    let _ = (a.changes(), b.changes());
    for f in [&mut a, &mut b] {
        f.no_changes();
    }
}

#[tokio::test]
async fn a_log_that_lost_entries_ends_every_watch() {
    let server = TestServer::start(Flavor::Redis);
    let mut a = replica(&server, "a", Limits::default()).await;
    a.ok(&["SET", "k", "1"]).await;
    a.changes();
    // Redis loses its log (as a restart without persistence would), then another replica
    // writes: A must not go on as if it had missed nothing.
    let redis = redis::Client::open(server.url()).unwrap();
    let mut c = redis.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg("shared-test:log")
        .cmd("DEL")
        .arg("shared-test:logseq")
        .query_async(&mut c)
        .await
        .unwrap();
    let b = replica(&server, "b", Limits::default()).await;
    b.ok(&["SET", "k", "2"]).await;
    let lag = tokio::time::timeout(Duration::from_secs(10), a.feed.recv())
        .await
        .unwrap();
    assert!(lag.is_err(), "a watcher of A must learn it missed changes: {lag:?}");
    // A follows the log again afterwards.
    let v = b.ok(&["SET", "k", "3"]).await.version.unwrap();
    loop {
        let c = next(&mut a).await;
        if c.version == v {
            break;
        }
    }
}

#[tokio::test]
async fn an_expired_key_is_removed_once_whichever_replica_notices() {
    let server = TestServer::start(Flavor::Valkey);
    let mut a = replica(&server, "a", Limits::default()).await;
    let mut b = replica(&server, "b", Limits::default()).await;
    a.ok(&["SET", "k", "v", "PX", "100"]).await;
    a.clock.advance(200);
    b.clock.advance(200);
    let (x, y) = tokio::join!(a.engine.expire_due(10), b.engine.expire_due(10));
    assert_eq!(x.unwrap() + y.unwrap(), 1);
    for f in [&mut a, &mut b] {
        let mut kinds = Vec::new();
        for _ in 0..2 {
            kinds.push(next(f).await.kind);
        }
        assert_eq!(kinds[1], ChangeKind::Expire);
        f.no_changes();
    }
}
