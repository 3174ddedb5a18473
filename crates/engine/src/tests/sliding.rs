//! Sliding expiry and MGET, on every backend: a read pushes a sliding deadline out (and writes
//! only when the stored one comes within the time to live), without a new version or a change;
//! MGET answers every key as of one moment, never half of a transaction.

use super::*;

fn set_sliding(key: &str, value: &str, ttl_ms: u64) -> Command {
    Command::Set(Set {
        key: b(key),
        value: b(value),
        condition: SetCondition::Always,
        ttl_ms: Some(ttl_ms),
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: true,
    })
}

async fn sliding_reads_push_the_deadline_out() {
    let mut f = fx().await; // slack: 10 % of the TTL
    let v1 = f
        .engine
        .execute(set_sliding("s", "v", 1000))
        .await
        .unwrap()
        .version
        .unwrap();
    assert_eq!(f.record("s").await.unwrap().expires_at_ms, Some(T0 + 1000));
    assert_eq!(f.record("s").await.unwrap().slide_ms, Some(1000));
    // Read at 900 ms: the deadline (T0 + 1000) is nearer than the TTL; it moves to
    // now + TTL + slack.
    f.clock.advance(900);
    assert_eq!(f.get("s").await, Response::new(value("v"), Some(v1.clone())));
    assert_eq!(f.record("s").await.unwrap().expires_at_ms, Some(T0 + 900 + 1000 + 100));
    // Within the slack, reads write nothing.
    f.clock.advance(50);
    f.get("s").await;
    assert_eq!(f.record("s").await.unwrap().expires_at_ms, Some(T0 + 2000));
    // Past the first deadline, alive: reads kept it.
    f.clock.advance(1000);
    assert_eq!(f.get("s").await.reply, value("v"));
    let entry = f.engine.read(&b("s")).await.unwrap().unwrap();
    assert_eq!(entry.version, v1, "a read changes no version (ETags stay)");
    assert_eq!(
        entry.expires_at_ms,
        Some(T0 + 1950 + 1100),
        "the reader is told the new deadline"
    );
    // No read for longer than the deadline: gone, as any expired key.
    f.clock.advance(1101);
    assert_eq!(f.get("s").await.reply, Reply::Nil);
    let changes = f.changes();
    assert_eq!(
        changes.len(),
        2,
        "a set and an expiry, no change for the reads: {changes:?}"
    );
    assert_eq!(changes[1].kind, ChangeKind::Expire);
}

async fn sliding_needs_a_ttl_and_a_plain_set_ends_it() {
    let f = fx().await;
    let mut no_ttl = set_sliding("s", "v", 1000);
    if let Command::Set(s) = &mut no_ttl {
        s.ttl_ms = None;
    }
    assert!(matches!(f.engine.execute(no_ttl).await, Err(EngineError::Syntax)));
    assert!(matches!(
        parse(&["SET", "k", "v", "SLIDING"], ts(T0)),
        Err(EngineError::Syntax)
    ));
    assert!(matches!(
        parse(&["SET", "k", "v", "PX", "5", "SLIDING", "SLIDING"], ts(T0)),
        Err(EngineError::Syntax)
    ));
    let Ok(Command::Set(s)) = parse(&["SET", "k", "v", "SLIDING", "PX", "5"], ts(T0)) else {
        panic!("SLIDING before PX parses");
    };
    assert!(s.sliding && s.ttl_ms == Some(5));
    f.engine.execute(set_sliding("s", "v", 1000)).await.unwrap();
    f.ok(&["SET", "s", "w", "PX", "1000"]).await;
    f.clock.advance(900);
    f.get("s").await;
    let r = f.record("s").await.unwrap();
    assert_eq!(
        (r.expires_at_ms, r.slide_ms),
        (Some(T0 + 1000), None),
        "a SET without SLIDING does not slide"
    );
}

async fn sliding_with_no_slack_writes_on_every_read() {
    let f = fx_with(Limits {
        sliding_slack_percent: 0,
        ..Limits::default()
    })
    .await;
    f.engine.execute(set_sliding("s", "v", 1000)).await.unwrap();
    for step in 1..=5u64 {
        f.clock.advance(10);
        f.get("s").await;
        assert_eq!(f.record("s").await.unwrap().expires_at_ms, Some(T0 + 10 * step + 1000));
    }
}

async fn mget_answers_in_order_with_versions() {
    let f = fx().await;
    let va = f.ok(&["SET", "a", "1"]).await.version.unwrap();
    let vb = f.ok(&["SET", "b", "2", "PX", "100"]).await.version.unwrap();
    let r = f.ok(&["MGET", "b", "missing", "a", "b"]).await;
    let Reply::Values(values) = r.reply else {
        panic!("MGET answers values");
    };
    let seen: Vec<Option<(Bytes, Hlc, Option<u64>)>> = values
        .into_iter()
        .map(|e| e.map(|e| (e.value, e.version, e.expires_at_ms)))
        .collect();
    let b_entry = Some((b("2"), vb.clone(), Some(T0 + 100)));
    assert_eq!(seen, vec![b_entry.clone(), None, Some((b("1"), va, None)), b_entry]);
    assert_eq!(r.version, Some(vb), "the newest version read");
    f.clock.advance(100);
    assert_eq!(
        f.ok(&["MGET", "b"]).await,
        Response::new(Reply::Values(vec![None]), None),
        "expired reads as absent"
    );
    // The engine's rule, whatever door built the command (gRPC GetMany included).
    assert!(matches!(
        f.run(&["MGET"], Meta::default()).await,
        Err(EngineError::WrongArity)
    ));
    assert!(matches!(
        f.run(&["MGET", "a", ""], Meta::default()).await,
        Err(EngineError::EmptyKey)
    ));
    let direct = Command::MGet(MGet { keys: vec![] });
    assert!(matches!(f.engine.execute(direct).await, Err(EngineError::WrongArity)));
}

async fn mget_limits() {
    let f = fx_with(Limits {
        mget_keys: 2,
        max_value_bytes: 2048,
        ..Limits::default()
    })
    .await;
    assert!(matches!(
        f.run(&["MGET", "a", "b", "c"], Meta::default()).await,
        Err(EngineError::TooLarge)
    ));
    let big = "x".repeat(1500);
    f.ok(&["SET", "a", &big]).await;
    f.ok(&["SET", "b", &big]).await;
    f.ok(&["MGET", "a"]).await;
    // The answer stays within what one GET of the largest value takes.
    assert!(matches!(
        f.run(&["MGET", "a", "b"], Meta::default()).await,
        Err(EngineError::TooLarge)
    ));
}

/// A writer moves units between two keys in transactions (their sum stays 100) on a worker
/// thread while the test's thread reads both with MGET: every MGET sees a sum of 100. Run on a
/// multi-thread runtime (see [`mget_under_a_concurrent_writer`]): on a current-thread one the
/// writer runs only while the reader awaits, and an MGET that read the keys one at a time
/// without an await between them would pass.
async fn mget_never_sees_half_a_transaction() {
    const TRANSACTIONS: i64 = 2000;
    let f = fx().await;
    f.ok(&["SET", "x", "50"]).await;
    f.ok(&["SET", "y", "50"]).await;
    let engine = f.engine.clone();
    let writer = tokio::spawn(async move {
        for i in 0..TRANSACTIONS {
            let (x, y) = (50 - (i % 7), 50 + (i % 7));
            let set = |k: &str, v: i64| {
                TxOp::Set(Set {
                    key: b(k),
                    value: b(&v.to_string()),
                    condition: SetCondition::Always,
                    ttl_ms: None,
                    timestamp: None,
                    fencing: None,
                    persist: false,
                    sliding: false,
                })
            };
            engine.transact(vec![set("x", x), set("y", y)]).await.unwrap();
        }
    });
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let Reply::Values(values) = f.ok(&["MGET", "x", "y"]).await.reply else {
            panic!("MGET answers values");
        };
        let sum: i64 = values
            .iter()
            .map(|v| {
                std::str::from_utf8(&v.as_ref().unwrap().value)
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(sum, 100, "a torn read after {reads} reads: {values:?}");
        reads += 1;
    }
    writer.await.unwrap();
}

/// [`mget_never_sees_half_a_transaction`] on every backend, each on a multi-thread runtime:
/// the spawned writer runs on a worker thread, the reads on the test's own thread (tokio runs
/// the test's body there), so both really run at once.
mod mget_under_a_concurrent_writer {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_memory() {
        super::BACKING
            .scope(super::Backing::Memory, super::mget_never_sees_half_a_transaction())
            .await;
    }

    #[cfg(feature = "redis")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_redis() {
        super::on_server(
            crate::storage::redis::server::Flavor::Redis,
            super::mget_never_sees_half_a_transaction(),
        )
        .await;
    }

    #[cfg(feature = "redis")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_valkey() {
        super::on_server(
            crate::storage::redis::server::Flavor::Valkey,
            super::mget_never_sees_half_a_transaction(),
        )
        .await;
    }
}

on_every_backend!(
    sliding_reads_push_the_deadline_out,
    sliding_needs_a_ttl_and_a_plain_set_ends_it,
    sliding_with_no_slack_writes_on_every_read,
    mget_answers_in_order_with_versions,
    mget_limits,
);
