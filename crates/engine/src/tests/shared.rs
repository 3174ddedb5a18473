//! Replicas on one Redis (engine/shared.rs): two engines on the same store, as two processes
//! would be. Each change reaches both histories once, in log order; KEYNOTIFY registrations
//! made through one replica are honoured by the other, one replica sends every notification of
//! a client in log order, and when it dies or leaves another sends what it had not; a request
//! repeated on the other replica is not executed twice; a log that lost entries ends the
//! watchers' streams; a write costs one round trip from the record cache, and a stale cache
//! never decides an answer.

use std::time::Duration;

use super::*;
use crate::storage::redis::server::{Flavor, TestServer};
use crate::storage::{RedisOptions, StorageKind};

async fn replica(server: &TestServer, node: &str, limits: Limits) -> Fx {
    replica_with(server, node, limits, Duration::from_millis(300)).await
}

async fn replica_with(server: &TestServer, node: &str, limits: Limits, member_timeout: Duration) -> Fx {
    let Ok(StorageKind::Redis(url)) = server.url().parse() else {
        panic!("not a redis url");
    };
    let options = RedisOptions {
        prefix: "shared-test:".into(),
        timeout: Duration::from_secs(5),
        member_timeout,
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

/// Waits until every engine's log has `n` members that send notifications.
async fn members_settle(engines: &[&Engine], n: usize) {
    let patience = std::time::Instant::now() + Duration::from_secs(10);
    while engines
        .iter()
        .any(|e| e.shared().unwrap().routing().members().len() != n)
    {
        assert!(std::time::Instant::now() < patience, "the members did not settle");
        // Polling state the heartbeats change in the background: nothing to await.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn note(rx: &mut KeyNotifyReceiver) -> KeyNotification {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a notification in time")
        .expect("the engine runs")
}

#[tokio::test]
async fn one_replica_sends_every_notification_of_a_client_in_log_order() {
    let server = TestServer::start(Flavor::Valkey);
    let a = replica(&server, "a", Limits::default()).await;
    let b = replica(&server, "b", Limits::default()).await;
    let mut a_notes = a.engine.keynotify_feed().unwrap();
    let mut b_notes = b.engine.keynotify_feed().unwrap();
    members_settle(&[&a.engine, &b.engine], 2).await;
    // A client behind a shared broker (no session): either replica can reach it.
    a.run(&["KEYNOTIFY", "k"], client("dev")).await.unwrap();
    let mut versions = Vec::new();
    for i in 0..6 {
        let writer = if i % 2 == 0 { &a } else { &b };
        versions.push(writer.ok(&["SET", "k", &i.to_string()]).await.version.unwrap());
    }
    // Both agree who owns "dev"; only the owner sends, in version order, both replicas' changes.
    let owner = a.engine.shared().unwrap().routing().owner("dev");
    assert_eq!(owner, b.engine.shared().unwrap().routing().owner("dev"));
    let a_origin = a.engine.shared().unwrap().log.origin();
    let (owner_notes, other_notes) = if owner == Some(a_origin) {
        (&mut a_notes, &mut b_notes)
    } else {
        (&mut b_notes, &mut a_notes)
    };
    for v in &versions {
        let n = note(owner_notes).await;
        assert_eq!(
            (&n.change.version, &n.observers[..]),
            (v, &[Arc::<str>::from("dev")][..])
        );
    }
    assert!(other_notes.try_recv().is_none(), "only the owner notifies");

    // STOP through B; a change through A notifies nobody.
    let stop = b.run(&["KEYNOTIFY", "k", "STOP"], client("dev")).await.unwrap();
    assert_eq!(stop.reply, Reply::Ok);
    a.ok(&["SET", "k", "2"]).await;
    b.ok(&["SET", "k", "3"]).await;
    assert!(a.engine.observers_of(b"k").is_empty());
    assert!(a_notes.try_recv().is_none() && b_notes.try_recv().is_none());
    // A STOP of nothing is 0 on either replica.
    let again = a.run(&["KEYNOTIFY", "k", "STOP"], client("dev")).await.unwrap();
    assert_eq!(again.reply, Reply::Int(0));
}

#[tokio::test]
async fn a_client_of_an_embedded_broker_is_notified_by_its_home_replica() {
    let server = TestServer::start(Flavor::Redis);
    let a = replica(&server, "a", Limits::default()).await;
    let b = replica(&server, "b", Limits::default()).await;
    let mut a_notes = a.engine.keynotify_feed().unwrap();
    let mut b_notes = b.engine.keynotify_feed().unwrap();
    members_settle(&[&a.engine, &b.engine], 2).await;
    // Registered through B's embedded broker (a session): only B reaches the client.
    for n in 0..8 {
        b.run(&["KEYNOTIFY", "k"], session(&format!("dev{n}"), 1))
            .await
            .unwrap();
    }
    let v = a.ok(&["SET", "k", "1"]).await.version.unwrap();
    let n = note(&mut b_notes).await;
    assert_eq!(n.change.version, v);
    assert_eq!(n.observers.len(), 8);
    assert!(a_notes.try_recv().is_none());
}

#[tokio::test]
async fn when_the_sender_dies_another_sends_what_it_had_not() {
    let server = TestServer::start(Flavor::Redis);
    let a = replica(&server, "a", Limits::default()).await;
    let b = replica(&server, "b", Limits::default()).await;
    let c = replica(&server, "c", Limits::default()).await;
    let mut notes: Vec<KeyNotifyReceiver> = [&a, &b, &c]
        .iter()
        .map(|f| f.engine.keynotify_feed().unwrap())
        .collect();
    members_settle(&[&a.engine, &b.engine, &c.engine], 3).await;
    // A client that A owns.
    let a_origin = a.engine.shared().unwrap().log.origin();
    let owned_by_a = (0..100)
        .map(|i| format!("client-{i}"))
        .find(|c| a.engine.shared().unwrap().routing().owner(c) == Some(a_origin))
        .unwrap();
    b.run(&["KEYNOTIFY", "k"], client(&owned_by_a)).await.unwrap();
    let mut versions = Vec::new();
    for i in 0..3 {
        versions.push(b.ok(&["SET", "k", &i.to_string()]).await.version.unwrap());
    }
    // A took them on but its door never sent them (its receiver is never read); then A dies
    // without leaving.
    let first = note(&mut notes[0]).await;
    assert_eq!(first.change.version, versions[0]);
    drop(a);
    let _dead_queue = notes.remove(0);
    // After the member timeout one of B and C drops A, and A's new owner sends all three
    // (the first again: A's record of what it sent lags a heartbeat, so nothing is lost).
    let (mut got, mut from) = (Vec::new(), None);
    while got.len() < 3 {
        let [b_notes, c_notes] = &mut notes[..] else {
            panic!("two survivors")
        };
        let (n, i) = tokio::select! {
            n = note(b_notes) => (n, 0),
            n = note(c_notes) => (n, 1),
        };
        assert!(from.is_none_or(|f| f == i), "one new owner sends them");
        from = Some(i);
        got.push(n.change.version);
    }
    assert_eq!(got, versions);
    // From then on the new owner sends, once.
    let v = b.ok(&["SET", "k", "after"]).await.version.unwrap();
    let owner = from.unwrap();
    assert_eq!(note(&mut notes[owner]).await.change.version, v);
    assert!(notes[1 - owner].try_recv().is_none());
    drop(c);
}

/// A node's process killed and started again: the new process's first join drops the dead
/// one's membership (logged before its own join), so the dead one's unsent notifications go to
/// the others at once instead of after the member timeout, when the new process could already
/// have sent newer ones to the same clients (the fault test bed saw them arrive late, out of
/// order). The member timeout here is a minute: only the takeover can explain a prompt handover.
#[tokio::test]
async fn a_restarted_node_takes_its_dead_process_out_of_the_members_at_once() {
    let server = TestServer::start(Flavor::Redis);
    let minute = Duration::from_secs(60);
    let a = replica_with(&server, "a", Limits::default(), minute).await;
    let b = replica_with(&server, "b", Limits::default(), minute).await;
    let _a_notes = a.engine.keynotify_feed().unwrap();
    let mut b_notes = b.engine.keynotify_feed().unwrap();
    members_settle(&[&a.engine, &b.engine], 2).await;
    let a_origin = a.engine.shared().unwrap().log.origin();
    let owned_by_a = (0..100)
        .map(|i| format!("client-{i}"))
        .find(|c| a.engine.shared().unwrap().routing().owner(c) == Some(a_origin))
        .unwrap();
    b.run(&["KEYNOTIFY", "k"], client(&owned_by_a)).await.unwrap();
    let mut versions = Vec::new();
    for i in 0..3 {
        versions.push(b.ok(&["SET", "k", &i.to_string()]).await.version.unwrap());
    }
    // A dies without leaving; its node starts again.
    drop(a);
    let a2 = replica_with(&server, "a", Limits::default(), minute).await;
    let mut a2_notes = a2.engine.keynotify_feed().unwrap();
    members_settle(&[&b.engine, &a2.engine], 2).await;
    // B alone had A's notifications: it sends all three, in order, long before a minute.
    for v in &versions {
        assert_eq!(&note(&mut b_notes).await.change.version, v);
    }
    assert!(a2_notes.try_recv().is_none(), "the new process never read them");
    drop(a2);
}

#[tokio::test]
async fn a_replica_that_leaves_hands_its_clients_over_at_once() {
    let server = TestServer::start(Flavor::Valkey);
    let a = replica(&server, "a", Limits::default()).await;
    let b = replica(&server, "b", Limits::default()).await;
    let mut a_notes = a.engine.keynotify_feed().unwrap();
    let mut b_notes = b.engine.keynotify_feed().unwrap();
    members_settle(&[&a.engine, &b.engine], 2).await;
    let a_origin = a.engine.shared().unwrap().log.origin();
    let owned_by_a = (0..100)
        .map(|i| format!("client-{i}"))
        .find(|c| a.engine.shared().unwrap().routing().owner(c) == Some(a_origin))
        .unwrap();
    b.run(&["KEYNOTIFY", "k"], client(&owned_by_a)).await.unwrap();
    let v1 = b.ok(&["SET", "k", "1"]).await.version.unwrap();
    assert_eq!(note(&mut a_notes).await.change.version, v1);
    a.engine.leave().await;
    // B owns the client from A's leave entry on; a member timeout would be 300 ms, a leave
    // acts at once: B's next change is B's to send.
    let v2 = b.ok(&["SET", "k", "2"]).await.version.unwrap();
    let mut got = Vec::new();
    while got.last() != Some(&v2) {
        got.push(note(&mut b_notes).await.change.version);
    }
    // What A handed over within its last heartbeat may come again; nothing is missing.
    assert!(got.iter().all(|v| *v == v1 || *v == v2), "{got:?}");
    assert!(a_notes.try_recv().is_none());
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

/// Round trips the engine's storage made so far.
fn round_trips(f: &Fx) -> u64 {
    f.engine.storage_round_trips().unwrap().calls
}

/// Rewrites `key`'s record behind every replica's back (no log entry: caches stay stale).
async fn behind_the_back(server: &TestServer, key: &str, value: Option<&str>, ms: u64) {
    let redis = redis::Client::open(server.url()).unwrap();
    let mut c = redis.get_multiplexed_async_connection().await.unwrap();
    let record = format!("shared-test:r:{key}");
    let mut pipe = redis::pipe();
    match value {
        Some(v) => {
            let version = format!("{ms:020}:{:010}:elsewhere", 0);
            pipe.cmd("HSET").arg(&record).arg("v").arg(v).arg("ver").arg(version);
            pipe.cmd("ZADD").arg("shared-test:keys").arg(0).arg(key);
        }
        None => {
            pipe.cmd("DEL").arg(&record);
            pipe.cmd("ZREM").arg("shared-test:keys").arg(key);
        }
    }
    let _: () = pipe.query_async(&mut c).await.unwrap();
}

#[tokio::test]
async fn a_write_from_the_record_cache_costs_one_round_trip() {
    let server = TestServer::start(Flavor::Redis);
    let a = replica(&server, "a", Limits::default()).await;
    // A first write reads the key (its mark too, in one round trip), then swaps: two.
    let rt = round_trips(&a);
    a.ok(&["SET", "k", "1"]).await;
    assert_eq!(round_trips(&a) - rt, 2);
    // Every later write and answer starts from the cache: one each.
    for args in [
        &["SET", "k", "2"][..],
        &["SET", "k", "3", "NX"],
        &["SET", "k", "3", "NEX"],
        &["VDEL", "k", "other"],
        &["GET", "k"],
        &["VDEL", "k", "3"],
        &["DEL", "k"],
        &["SET", "k", "4", "NX"],
        &["DEL", "k"],
    ] {
        let rt = round_trips(&a);
        a.ok(args).await;
        assert_eq!(round_trips(&a) - rt, 1, "{args:?}");
    }
    // A request id rides along in the same round trip.
    let rt = round_trips(&a);
    let set = parse(&["SET", "k", "5"], ts(T0)).unwrap();
    a.engine.execute_request(set, Some(&rid("one-trip"))).await.unwrap();
    assert_eq!(round_trips(&a) - rt, 1);
    // Off: every write reads first.
    let limits = Limits {
        record_cache_bytes: 0,
        ..Limits::default()
    };
    let b = replica(&server, "b", limits).await;
    let rt = round_trips(&b);
    b.ok(&["SET", "k", "6"]).await;
    b.ok(&["SET", "k", "7"]).await;
    assert_eq!(round_trips(&b) - rt, 4);
}

#[tokio::test]
async fn a_stale_record_cache_never_decides_an_answer() {
    let server = TestServer::start(Flavor::Valkey);
    let a = replica(&server, "a", Limits::default()).await;
    a.ok(&["SET", "k", "old"]).await;
    a.ok(&["SET", "gone", "x"]).await;
    // Changed behind A's back: its cache still says "old", "gone" present, "new" absent.
    behind_the_back(&server, "k", Some("new"), T0 + 1000).await;
    behind_the_back(&server, "gone", None, 0).await;
    behind_the_back(&server, "new", Some("v"), T0 + 1000).await;
    // Each answer the cache would get wrong is checked against storage, then redone.
    let r = a.ok(&["VDEL", "k", "new"]).await;
    assert_eq!(r.reply, Reply::Int(1), "VDEL of the stored value deletes");
    let r = a.ok(&["SET", "gone", "y", "NX"]).await;
    assert_eq!(r.reply, Reply::Ok, "NX on a key deleted meanwhile is applied");
    let r = a.ok(&["DEL", "new"]).await;
    assert_eq!(r.reply, Reply::Int(1), "DEL of a key created meanwhile deletes");
    behind_the_back(&server, "k", Some("later"), T0 + 2000).await;
    let r = a.ok(&["SET", "k", "mine"]).await;
    assert_eq!(r.reply, Reply::Ok);
    assert!(
        r.version.unwrap() > Hlc::new(T0 + 2000, 0, "elsewhere"),
        "after the stored version"
    );
    assert_eq!(a.get("k").await.reply, Reply::Value(bs("mine")));
    // A stale NX refusal is confirmed first, and a stale refusal that storage confirms stands.
    behind_the_back(&server, "k", None, 0).await;
    let r = a.ok(&["SET", "k", "nx", "NX"]).await;
    assert_eq!(r.reply, Reply::Ok, "NX on a key deleted meanwhile is applied");
    let r = a.ok(&["SET", "k", "again", "NX"]).await;
    assert_eq!(r.reply, Reply::NotApplied);
    // A repeated request is answered with its first outcome even when the cache decides.
    let set = || parse(&["SET", "lock", "me", "NX"], ts(T0)).unwrap();
    let first = a.engine.execute_request(set(), Some(&rid("r1"))).await.unwrap();
    let again = a.engine.execute_request(set(), Some(&rid("r1"))).await.unwrap();
    assert_eq!(again, first);
}

/// A disconnect of a client with no registrations costs no Redis call: every MQTT disconnect
/// used to run the observe script. (Background scripts, heartbeats, run meanwhile: the script
/// cache is flushed first and then asked whether the observe script came back into it.)
#[tokio::test]
async fn dropping_a_client_without_registrations_calls_no_script() {
    let server = TestServer::start(Flavor::Redis);
    let a = replica(&server, "a", Limits::default()).await;
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let observe = redis::Script::new(include_str!("../../../storage/src/redis/observe.lua"));
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    assert_eq!(a.engine.drop_client("never-registered", Some(7)).await, 0);
    let loaded: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(observe.get_hash())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        loaded,
        [false],
        "the observe script ran for a client without registrations"
    );
    // A client with registrations is still dropped everywhere through the script.
    a.run(&["KEYNOTIFY", "k"], client("dev")).await.unwrap();
    assert_eq!(a.engine.drop_client("dev", None).await, 1);
}

/// The state topics mirror behind a shared broker: the observer of every key is one more
/// client without a home, so exactly one replica takes each change on, in log order, with no
/// registration anywhere.
#[tokio::test]
async fn one_replica_mirrors_each_change_behind_a_shared_broker() {
    use crate::notify::{EVERY_KEY_OBSERVER, EveryKey};
    let server = TestServer::start(Flavor::Valkey);
    let a = replica(&server, "a", Limits::default()).await;
    let b = replica(&server, "b", Limits::default()).await;
    let mut a_notes = a.engine.keynotify_feed_with(Some(EveryKey::OneReplica)).unwrap();
    let mut b_notes = b.engine.keynotify_feed_with(Some(EveryKey::OneReplica)).unwrap();
    members_settle(&[&a.engine, &b.engine], 2).await;
    let mut versions = Vec::new();
    for i in 0..6 {
        let writer = if i % 2 == 0 { &a } else { &b };
        versions.push(writer.ok(&["SET", &format!("k{i}"), "v"]).await.version.unwrap());
    }
    let a_owns =
        a.engine.shared().unwrap().routing().owner(EVERY_KEY_OBSERVER) == Some(a.engine.shared().unwrap().log.origin());
    let (owner, other) = if a_owns {
        (&mut a_notes, &mut b_notes)
    } else {
        (&mut b_notes, &mut a_notes)
    };
    for v in &versions {
        let n = note(owner).await;
        assert_eq!(&n.change.version, v);
        assert_eq!(
            n.observers.iter().map(|o| &**o).collect::<Vec<_>>(),
            [EVERY_KEY_OBSERVER]
        );
    }
    assert!(other.try_recv().is_none(), "the other replica sends none of them");
}

/// Each replica's embedded broker has subscribers only it reaches: every replica mirrors every
/// change to its own broker.
#[tokio::test]
async fn each_replica_mirrors_every_change_to_its_own_broker() {
    use crate::notify::EveryKey;
    let server = TestServer::start(Flavor::Redis);
    let a = replica(&server, "a", Limits::default()).await;
    let b = replica(&server, "b", Limits::default()).await;
    let mut a_notes = a.engine.keynotify_feed_with(Some(EveryKey::EachReplica)).unwrap();
    let mut b_notes = b.engine.keynotify_feed_with(Some(EveryKey::EachReplica)).unwrap();
    let v1 = a.ok(&["SET", "k", "1"]).await.version.unwrap();
    let v2 = b.ok(&["DEL", "k"]).await.version.unwrap();
    for notes in [&mut a_notes, &mut b_notes] {
        let first = note(notes).await;
        assert_eq!(
            (first.change.version, first.change.kind),
            (v1.clone(), ChangeKind::Set(bs("1")))
        );
        let second = note(notes).await;
        assert_eq!(
            (second.change.version, second.change.kind),
            (v2.clone(), ChangeKind::Delete)
        );
    }
}

mod skew;
