//! Engine rules with a manual clock: no sleeps; time moves only when a test moves the clock.
//! Every rule test runs on each backend (`on_every_backend!` at the end): on the in-memory
//! store, and, with the `redis` feature, on a real redis-server and valkey-server.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::hlc::{Hlc, ManualClock};
use crate::storage::{Record, Store, Swap, SwapOutcome};

/// The service clock at the start of every test.
const T0: u64 = 1_700_000_000_000;
const NODE: &str = "node-1";

struct Fx {
    engine: Engine,
    clock: Arc<ManualClock>,
    store: Store,
    feed: FeedReader,
}

async fn fx() -> Fx {
    fx_with(Limits::default()).await
}

async fn fx_with(limits: Limits) -> Fx {
    fx_on(test_store().await, limits).await
}

async fn fx_on(store: Store, limits: Limits) -> Fx {
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::open(store.clone(), NODE, clock.clone(), limits).await.unwrap();
    let feed = engine.subscribe();
    Fx {
        engine,
        clock,
        store,
        feed,
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A client-side HLC.
fn hlc(ms: u64, counter: u32) -> Hlc {
    Hlc::new(ms, counter, "client")
}

fn ts(ms: u64) -> Meta {
    Meta {
        timestamp: Some(hlc(ms, 0)),
        ..Meta::default()
    }
}

fn ft(token: Hlc) -> Meta {
    Meta {
        timestamp: Some(hlc(T0, 0)),
        fencing: Some(token),
        ..Meta::default()
    }
}

fn client(id: &str) -> Meta {
    Meta {
        client: Some(id.into()),
        ..Meta::default()
    }
}

fn parse(args: &[&str], meta: Meta) -> Result<Command, EngineError> {
    Command::parse(args.iter().map(|a| b(a)).collect(), meta)
}

macro_rules! assert_err {
    ($res:expr, $pat:pat) => {
        match $res {
            Err($pat) => {}
            other => panic!("expected {}, got {:?}", stringify!($pat), other),
        }
    };
}

impl Fx {
    /// Parses and executes, as a front end does.
    async fn run(&self, args: &[&str], meta: Meta) -> Result<Response, EngineError> {
        self.engine.execute(parse(args, meta)?).await
    }

    /// Runs with a request timestamp equal to the service clock.
    async fn ok(&self, args: &[&str]) -> Response {
        let now = self.clock.now_ms();
        self.run(args, ts(now))
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e:?}"))
    }

    async fn get(&self, key: &str) -> Response {
        self.ok(&["GET", key]).await
    }

    async fn record(&self, key: &str) -> Option<Record> {
        self.store.backend().get(key.as_bytes()).await.unwrap()
    }

    /// Everything published since the last call.
    fn changes(&mut self) -> Vec<Change> {
        let mut out = Vec::new();
        loop {
            match self.feed.try_recv() {
                Some(Ok(e)) => out.push(e.change.clone()),
                None => return out,
                Some(Err(e)) => panic!("change feed: {e:?}"),
            }
        }
    }

    #[track_caller]
    fn no_changes(&mut self) {
        let changes = self.changes();
        assert!(changes.is_empty(), "unexpected changes: {changes:?}");
    }

    /// All keys matching `pattern`, page by page; also returns the number of pages.
    async fn scan_all(&self, pattern: &str) -> (Vec<Bytes>, usize) {
        let mut keys = Vec::new();
        let mut token: Option<Bytes> = None;
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(pages <= 100_000, "scan does not end");
            let cmd = Command::Scan(Scan {
                pattern: b(pattern),
                token: token.take(),
                filter: None,
            });
            let resp = self.engine.execute(cmd).await.unwrap();
            assert_eq!(resp.version, None);
            let Reply::Keys {
                keys: page,
                token: next,
            } = resp.reply
            else {
                panic!("not a SCAN reply: {resp:?}");
            };
            keys.extend(page);
            match next {
                Some(t) => token = Some(t),
                None => return (keys, pages),
            }
        }
    }

    async fn scan_sorted(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .scan_all(pattern)
            .await
            .0
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        keys.sort();
        keys
    }
}

fn value(v: &str) -> Reply {
    Reply::Value(b(v))
}

fn set_change(key: &str, v: &str, version: &Hlc) -> Change {
    Change {
        key: b(key),
        version: version.clone(),
        kind: ChangeKind::Set(b(v)),
    }
}

fn change(key: &str, version: &Hlc, kind: ChangeKind) -> Change {
    Change {
        key: b(key),
        version: version.clone(),
        kind,
    }
}

// ======================= Command::parse =======================

fn parse_set(args: &[&str]) -> Set {
    match parse(args, Meta::default()) {
        Ok(Command::Set(s)) => s,
        other => panic!("{args:?}: {other:?}"),
    }
}

#[test]
fn parse_set_forms() {
    let s = parse_set(&["SET", "k", "v"]);
    assert_eq!((s.key, s.value), (b("k"), b("v")));
    assert_eq!(s.condition, SetCondition::Always);
    assert_eq!(s.ttl_ms, None);

    assert_eq!(parse_set(&["SET", "k", "v", "NX"]).condition, SetCondition::IfAbsent);
    assert_eq!(
        parse_set(&["SET", "k", "v", "NEX"]).condition,
        SetCondition::IfAbsentOrEqual
    );
    assert_eq!(parse_set(&["SET", "k", "v", "PX", "100"]).ttl_ms, Some(100));
    let s = parse_set(&["SET", "k", "v", "NX", "PX", "100"]);
    assert_eq!((s.condition, s.ttl_ms), (SetCondition::IfAbsent, Some(100)));
    let s = parse_set(&["SET", "k", "v", "PX", "100", "NEX"]);
    assert_eq!((s.condition, s.ttl_ms), (SetCondition::IfAbsentOrEqual, Some(100)));
    // The value may look like an option.
    assert_eq!(parse_set(&["SET", "k", "NX"]).value, b("NX"));
    assert_eq!(parse_set(&["SET", "k", "NX"]).condition, SetCondition::Always);
    // An empty value is a value.
    assert_eq!(parse_set(&["SET", "k", ""]).value, Bytes::new());
}

#[test]
fn parse_px_is_lenient_about_fractions() {
    assert_eq!(parse_set(&["SET", "k", "v", "PX", "1500.5"]).ttl_ms, Some(1501));
    assert_eq!(parse_set(&["SET", "k", "v", "PX", "1500.0"]).ttl_ms, Some(1500));
    assert_eq!(parse_set(&["SET", "k", "v", "PX", "0.1"]).ttl_ms, Some(1));
    assert_eq!(parse_set(&["SET", "k", "v", "PX", "1."]).ttl_ms, Some(1));
    assert_eq!(parse_set(&["SET", "k", "v", "PX", "007"]).ttl_ms, Some(7));
    assert_eq!(parse_set(&["SET", "k", "v", "PX", "86400000"]).ttl_ms, Some(86_400_000));
}

#[test]
fn parse_passes_the_metadata_on() {
    let meta = Meta {
        timestamp: Some(hlc(5, 1)),
        fencing: Some(hlc(6, 2)),
        client: Some("c1".into()),
        session: None,
        persist: true,
    };
    let s = match parse(&["SET", "k", "v"], meta.clone()) {
        Ok(Command::Set(s)) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!((s.timestamp, s.fencing), (Some(hlc(5, 1)), Some(hlc(6, 2))));
    assert!(s.persist, "the persistence request reaches the SET");

    match parse(&["GET", "k"], meta.clone()) {
        Ok(Command::Get(g)) => assert_eq!(g.key, b("k")),
        other => panic!("{other:?}"),
    }
    match parse(&["DEL", "k"], meta.clone()) {
        Ok(Command::Del(d)) => {
            assert_eq!(d.key, b("k"));
            assert_eq!(d.fencing, Some(hlc(6, 2)));
            assert_eq!(d.condition, DelCondition::Always);
        }
        other => panic!("{other:?}"),
    }
    match parse(&["VDEL", "k", "v"], meta.clone()) {
        Ok(Command::VDel(d)) => {
            assert_eq!((d.key, d.value), (b("k"), b("v")));
            assert_eq!(d.fencing, Some(hlc(6, 2)));
        }
        other => panic!("{other:?}"),
    }
    match parse(&["KEYNOTIFY", "k"], meta.clone()) {
        Ok(Command::KeyNotify(n)) => {
            assert_eq!((n.key, n.client.as_str(), n.stop), (b("k"), "c1", false))
        }
        other => panic!("{other:?}"),
    }
    match parse(&["KEYNOTIFY", "k", "STOP"], meta.clone()) {
        Ok(Command::KeyNotify(n)) => assert!(n.stop),
        other => panic!("{other:?}"),
    }
    match parse(&["SCAN", "k*"], meta.clone()) {
        Ok(Command::Scan(s)) => assert_eq!((s.pattern, s.token), (b("k*"), None)),
        other => panic!("{other:?}"),
    }
    match parse(&["SCAN", "k*", "6B"], meta) {
        Ok(Command::Scan(s)) => assert_eq!(s.token, Some(b("6B"))),
        other => panic!("{other:?}"),
    }
}

#[test]
fn parse_names() {
    let m = || client("c");
    for (args, name) in [
        (&["SET", "k", "v"][..], "SET"),
        (&["GET", "k"], "GET"),
        (&["DEL", "k"], "DEL"),
        (&["VDEL", "k", "v"], "VDEL"),
        (&["KEYNOTIFY", "k"], "KEYNOTIFY"),
        (&["SCAN", "*"], "SCAN"),
    ] {
        assert_eq!(parse(args, m()).unwrap().name(), name);
    }
}

#[test]
fn parse_unknown_command() {
    for args in [
        &[][..],
        &["FOO"],
        &["FOO", "k"],
        &["get", "k"],
        &["Set", "k", "v"],
        &["GETX", "k"],
        &[""],
        &["HSET", "k", "f", "v"],
    ] {
        assert_err!(parse(args, client("c")), EngineError::UnknownCommand);
    }
}

#[test]
fn parse_wrong_arity() {
    for args in [
        &["SET"][..],
        &["SET", "k"],
        &["GET"],
        &["GET", "k", "x"],
        &["DEL"],
        &["DEL", "k", "x"],
        &["VDEL"],
        &["VDEL", "k"],
        &["VDEL", "k", "v", "x"],
        &["KEYNOTIFY"],
        &["KEYNOTIFY", "k", "STOP", "x"],
        &["SCAN"],
        &["SCAN", "*", "6B", "x"],
    ] {
        assert_err!(parse(args, client("c")), EngineError::WrongArity);
    }
}

#[test]
fn parse_syntax_errors() {
    for args in [
        &["SET", "k", "v", "XX"][..],
        &["SET", "k", "v", "nx"],
        &["SET", "k", "v", "EX", "10"],
        &["SET", "k", "v", "NX", "NEX"],
        &["SET", "k", "v", "NEX", "NX"],
        &["SET", "k", "v", "NX", "NX"],
        &["SET", "k", "v", "NEX", "v"],
        &["SET", "k", "v", "PX"],
        &["SET", "k", "v", "NX", "PX"],
        &["SET", "k", "v", "PX", "-1"],
        &["SET", "k", "v", "PX", "abc"],
        &["SET", "k", "v", "PX", ""],
        &["SET", "k", "v", "PX", "."],
        &["SET", "k", "v", "PX", "1.2.3"],
        &["SET", "k", "v", "PX", "1e3"],
        &["SET", "k", "v", "PX", " 100"],
        &["SET", "k", "v", "PX", "+100"],
        &["SET", "k", "v", "PX", "inf"],
        &["SET", "k", "v", "PX", "NaN"],
        &["SET", "k", "v", "PX", "100", "PX", "200"],
        &["KEYNOTIFY", "k", "START"],
        &["KEYNOTIFY", "k", "stop"],
    ] {
        assert_err!(parse(args, client("c")), EngineError::Syntax);
    }
}

/// Whether a TTL is in range is one engine rule, whichever door parsed it.
async fn ttl_range_is_decided_by_the_engine() {
    let f = fx().await;
    for px in ["0", "0.0", &(MAX_TTL_MS + 1).to_string(), "99999999999999999999999"] {
        assert_err!(
            f.run(&["SET", "k", "v", "PX", px], ts(T0)).await,
            EngineError::TtlOutOfRange
        );
    }
    let max = MAX_TTL_MS.to_string();
    for px in ["1", "0.5", max.as_str()] {
        assert_eq!(
            f.run(&["SET", "k", "v", "PX", px], ts(T0)).await.unwrap().reply,
            Reply::Ok,
            "{px}"
        );
    }
    let set = |ttl_ms| Set {
        key: b("t"),
        value: b("v"),
        condition: SetCondition::Always,
        ttl_ms,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    assert_err!(
        f.engine.execute(Command::Set(set(Some(0)))).await,
        EngineError::TtlOutOfRange
    );
    assert_err!(
        f.engine.transact(vec![TxOp::Set(set(Some(MAX_TTL_MS + 1)))]).await,
        EngineError::TtlOutOfRange
    );
}

#[test]
fn parse_keynotify_needs_a_caller() {
    assert_err!(parse(&["KEYNOTIFY", "k"], Meta::default()), EngineError::Syntax);
}

#[test]
fn parse_empty_key() {
    for args in [
        &["SET", "", "v"][..],
        &["SET", "", "v", "NX"],
        &["GET", ""],
        &["DEL", ""],
        &["VDEL", "", "v"],
        &["KEYNOTIFY", ""],
        &["KEYNOTIFY", "", "STOP"],
    ] {
        assert_err!(parse(args, client("c")), EngineError::EmptyKey);
    }
    // An empty SCAN pattern is a pattern (that matches no key).
    assert!(
        matches!(parse(&["SCAN", ""], Meta::default()), Ok(Command::Scan(s)) if s.pattern.is_empty() && s.token.is_none())
    );
}

async fn empty_keys_are_refused_by_execute_too() {
    let f = fx().await;
    let set = Set {
        key: Bytes::new(),
        value: b("v"),
        condition: SetCondition::Always,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    assert_err!(f.engine.execute(Command::Set(set)).await, EngineError::EmptyKey);
    let get = Get { key: Bytes::new() };
    assert_err!(f.engine.execute(Command::Get(get)).await, EngineError::EmptyKey);
    let del = Del {
        key: Bytes::new(),
        fencing: None,
        condition: DelCondition::Always,
    };
    assert_err!(f.engine.execute(Command::Del(del)).await, EngineError::EmptyKey);
    let vdel = VDel {
        key: Bytes::new(),
        value: b("v"),
        fencing: None,
    };
    assert_err!(f.engine.execute(Command::VDel(vdel)).await, EngineError::EmptyKey);
    let kn = KeyNotify {
        key: Bytes::new(),
        client: "c".into(),
        session: None,
        stop: false,
    };
    assert_err!(f.engine.execute(Command::KeyNotify(kn)).await, EngineError::EmptyKey);
}

// ======================= SET / GET / DEL / VDEL =======================

async fn set_get_del_replies_and_versions() {
    let mut f = fx().await;
    // A request timestamp behind the service clock is fine.
    let r = f.run(&["SET", "k", "v1"], ts(T0 - 5_000)).await.unwrap();
    assert_eq!(r.reply, Reply::Ok);
    let v1 = r.version.unwrap();
    assert!(v1 > hlc(T0 - 5_000, 0));
    assert_eq!(v1.ms, T0, "the physical part is the service clock");
    assert_eq!(&*v1.node, NODE);

    // GET hit: the stored version, not a new one, however often it is read.
    for _ in 0..3 {
        let g = f.get("k").await;
        assert_eq!(
            g,
            Response {
                reply: value("v1"),
                version: Some(v1.clone())
            }
        );
    }

    // A second SET gets a later version.
    let v2 = f.ok(&["SET", "k", "v2"]).await.version.unwrap();
    assert!(v2 > v1);
    assert_eq!(f.get("k").await.version, Some(v2.clone()));

    // GET miss: no version.
    assert_eq!(
        f.get("other").await,
        Response {
            reply: Reply::Nil,
            version: None
        }
    );

    // DEL: 1 with the version issued for the deletion, then 0 without one.
    let d = f.ok(&["DEL", "k"]).await;
    assert_eq!(d.reply, Reply::Int(1));
    let vd = d.version.unwrap();
    assert!(vd > v2);
    assert_eq!(f.get("k").await.reply, Reply::Nil);
    assert_eq!(
        f.ok(&["DEL", "k"]).await,
        Response {
            reply: Reply::Int(0),
            version: None
        }
    );

    assert_eq!(
        f.changes(),
        vec![
            set_change("k", "v1", &v1),
            set_change("k", "v2", &v2),
            change("k", &vd, ChangeKind::Delete),
        ]
    );
}

async fn set_version_is_after_the_request_timestamp() {
    let f = fx().await;
    // A request timestamp ahead of the service clock (but within the skew) is merged.
    let ahead = Hlc::new(T0 + 30_000, 7, "zzz-client");
    let meta = Meta {
        timestamp: Some(ahead.clone()),
        ..Meta::default()
    };
    let v = f.run(&["SET", "k", "v"], meta).await.unwrap().version.unwrap();
    assert!(v > ahead, "{v} > {ahead}");
    assert_eq!((v.ms, v.counter), (T0 + 30_000, 8));

    // Other keys' versions keep moving forward too (one clock).
    let w = f.ok(&["SET", "other", "v"]).await.version.unwrap();
    assert!(w > v);
}

async fn set_version_is_after_the_stored_version() {
    // Another node sharing the storage wrote a version ahead of this node's clock; the request
    // timestamp is old. The new version still beats both.
    let f = fx().await;
    let stored = Hlc::new(T0 + 40_000, 3, "other-node");
    let write = crate::storage::Swap {
        key: b("k"),
        expected: None,
        new: Some(Record {
            value: b("old"),
            version: stored.clone(),
            fencing: None,
            expires_at_ms: None,
            slide_ms: None,
        }),
        deadline: crate::storage::DeadlineCheck::Any,
    };
    let outcome = f.store.backend().swap_many(&[write], None).await.unwrap();
    assert_eq!(outcome, crate::storage::SwapOutcome::Done);
    let v = f.run(&["SET", "k", "new"], ts(T0 - 1)).await.unwrap().version.unwrap();
    assert!(v > stored, "{v} > {stored}");
    // A not-applied SET answers with the stored version.
    let r = f.run(&["SET", "k", "x", "NX"], ts(T0)).await.unwrap();
    assert_eq!(
        r,
        Response {
            reply: Reply::NotApplied,
            version: Some(v)
        }
    );
}

async fn versions_never_go_backwards_after_a_restart() {
    let store = test_store().await;
    let stored = Hlc::new(T0 + 5_000, 9, NODE);
    let old = Swap {
        key: b("old"),
        expected: None,
        new: Some(Record {
            value: b("v"),
            version: stored.clone(),
            fencing: None,
            expires_at_ms: None,
            slide_ms: None,
        }),
        deadline: crate::storage::DeadlineCheck::Any,
    };
    assert_eq!(
        store.backend().swap_many(&[old], None).await.unwrap(),
        SwapOutcome::Done
    );
    // The engine opens on a store written before it started, as after a restart.
    let f = fx_on(store, Limits::default()).await;
    // A different key: only the clock floor from `max_version` can put it after `stored`.
    let v = f.ok(&["SET", "new", "v"]).await.version.unwrap();
    assert!(v > stored, "{v} > {stored}");
}

async fn set_without_a_timestamp_still_gets_a_version() {
    // The MQTT door insists on `__ts`; other doors may not carry one.
    let f = fx().await;
    let r = f.run(&["SET", "k", "v"], Meta::default()).await.unwrap();
    assert_eq!(r.reply, Reply::Ok);
    assert_eq!(r.version.unwrap().ms, T0);
}

async fn versions_within_one_millisecond_use_the_counter() {
    let f = fx().await;
    let mut last: Option<Hlc> = None;
    for i in 0..50 {
        let v = f.ok(&["SET", &format!("k{}", i % 3), "v"]).await.version.unwrap();
        assert_eq!(v.ms, T0);
        if let Some(l) = &last {
            assert!(v > *l);
        }
        last = Some(v);
    }
    f.clock.advance(1);
    let v = f
        .run(&["SET", "k", "v"], Meta::default())
        .await
        .unwrap()
        .version
        .unwrap();
    assert_eq!(
        (v.ms, v.counter),
        (T0 + 1, 0),
        "the counter resets when the ms advances"
    );
    // A request timestamp at the same ms is merged: the version must beat it.
    let v = f.run(&["SET", "k", "v"], ts(T0 + 1)).await.unwrap().version.unwrap();
    assert_eq!((v.ms, v.counter), (T0 + 1, 1));
}

async fn values_are_binary() {
    let f = fx().await;
    let set = Set {
        key: Bytes::from_static(b"\x00k\r\n"),
        value: Bytes::from_static(b"\xff\r\n\x00"),
        condition: SetCondition::Always,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    f.engine.execute(Command::Set(set)).await.unwrap();
    let got = f
        .engine
        .execute(Command::Get(Get {
            key: Bytes::from_static(b"\x00k\r\n"),
        }))
        .await
        .unwrap();
    assert_eq!(got.reply, Reply::Value(Bytes::from_static(b"\xff\r\n\x00")));
    // Empty values are values, not misses.
    f.ok(&["SET", "empty", ""]).await;
    assert_eq!(f.get("empty").await.reply, Reply::Value(Bytes::new()));
}

async fn vdel_replies() {
    let mut f = fx().await;
    let v1 = f.ok(&["SET", "k", "v1"]).await.version.unwrap();
    // Another value: not applied, the stored version, nothing changes.
    let r = f.ok(&["VDEL", "k", "other"]).await;
    assert_eq!(
        r,
        Response {
            reply: Reply::NotApplied,
            version: Some(v1.clone())
        }
    );
    assert_eq!(f.get("k").await.reply, value("v1"));
    // The stored value: deleted.
    let r = f.ok(&["VDEL", "k", "v1"]).await;
    assert_eq!(r.reply, Reply::Int(1));
    let vd = r.version.unwrap();
    assert!(vd > v1);
    assert_eq!(f.get("k").await.reply, Reply::Nil);
    // Absent: 0.
    assert_eq!(
        f.ok(&["VDEL", "k", "v1"]).await,
        Response {
            reply: Reply::Int(0),
            version: None
        }
    );
    assert_eq!(
        f.changes(),
        vec![set_change("k", "v1", &v1), change("k", &vd, ChangeKind::Delete)]
    );
}

async fn nx_and_nex() {
    let mut f = fx().await;
    // NX on an absent key applies.
    let v1 = f.ok(&["SET", "k", "a", "NX"]).await;
    assert_eq!(v1.reply, Reply::Ok);
    let v1 = v1.version.unwrap();
    // NX on a present key: not applied, with the stored version.
    let r = f.ok(&["SET", "k", "b", "NX"]).await;
    assert_eq!(
        r,
        Response {
            reply: Reply::NotApplied,
            version: Some(v1.clone())
        }
    );
    assert_eq!(f.get("k").await.reply, value("a"));
    // NEX with another value: not applied, with the stored version.
    let r = f.ok(&["SET", "k", "b", "NEX"]).await;
    assert_eq!(
        r,
        Response {
            reply: Reply::NotApplied,
            version: Some(v1.clone())
        }
    );
    // NEX with the same value: a renewal, with a fresh, later version.
    let r = f.ok(&["SET", "k", "a", "NEX"]).await;
    assert_eq!(r.reply, Reply::Ok);
    let v2 = r.version.unwrap();
    assert!(v2 > v1);
    assert_eq!(
        f.get("k").await,
        Response {
            reply: value("a"),
            version: Some(v2.clone())
        }
    );
    // NEX on an absent key applies.
    let v3 = f.ok(&["SET", "n", "x", "NEX"]).await.version.unwrap();
    assert_eq!(
        f.changes(),
        vec![
            set_change("k", "a", &v1),
            set_change("k", "a", &v2),
            set_change("n", "x", &v3),
        ],
        "nothing is published for conditions not met"
    );
}

async fn etag_conditions() {
    // Not reachable from MQTT, but part of the engine: SET/DEL only at one version.
    let f = fx().await;
    let v1 = f.ok(&["SET", "k", "a"]).await.version.unwrap();
    let set = |v: Hlc| {
        Command::Set(Set {
            key: b("k"),
            value: b("b"),
            condition: SetCondition::IfVersion(v),
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        })
    };
    assert_err!(f.engine.execute(set(hlc(1, 0))).await, EngineError::VersionMismatch);
    let v2 = f.engine.execute(set(v1.clone())).await.unwrap().version.unwrap();
    assert_err!(f.engine.execute(set(v1.clone())).await, EngineError::VersionMismatch);
    let del = |v: Hlc| {
        Command::Del(Del {
            key: b("k"),
            fencing: None,
            condition: DelCondition::IfVersion(v),
        })
    };
    assert_err!(f.engine.execute(del(v1)).await, EngineError::VersionMismatch);
    assert_eq!(f.engine.execute(del(v2.clone())).await.unwrap().reply, Reply::Int(1));
    assert_err!(f.engine.execute(del(v2.clone())).await, EngineError::VersionMismatch);
    assert_err!(f.engine.execute(set(v2)).await, EngineError::VersionMismatch);
}

// ======================= expiry (PX) =======================

async fn px_expires_at_the_deadline() {
    let mut f = fx().await;
    let v1 = f.ok(&["SET", "k", "v", "PX", "1000"]).await.version.unwrap();
    f.clock.advance(999);
    assert_eq!(f.get("k").await.reply, value("v"));
    f.clock.advance(1);
    assert_eq!(
        f.get("k").await,
        Response {
            reply: Reply::Nil,
            version: None
        }
    );
    assert!(f.record("k").await.is_none(), "an expired key read is deleted");
    let changes = f.changes();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(changes[0], set_change("k", "v", &v1));
    assert_eq!(changes[1].key, b("k"));
    assert_eq!(changes[1].kind, ChangeKind::Expire);
    assert!(changes[1].version > v1);
    // Reading again publishes nothing more.
    assert_eq!(f.get("k").await.reply, Reply::Nil);
    f.no_changes();
}

async fn expired_keys_read_as_absent_everywhere() {
    let mut f = fx().await;
    for k in ["a", "b", "c", "d"] {
        f.ok(&["SET", k, "v", "PX", "10"]).await;
    }
    f.changes();
    f.clock.advance(10);
    // DEL and VDEL of an expired key: 0, and it is removed as expired (not deleted).
    assert_eq!(
        f.ok(&["DEL", "a"]).await,
        Response {
            reply: Reply::Int(0),
            version: None
        }
    );
    assert_eq!(
        f.ok(&["VDEL", "b", "v"]).await,
        Response {
            reply: Reply::Int(0),
            version: None
        }
    );
    // SCAN does not list it.
    assert_eq!(f.scan_sorted("*").await, Vec::<String>::new());
    let kinds: Vec<_> = f.changes().into_iter().map(|c| (c.key, c.kind)).collect();
    assert_eq!(kinds, vec![(b("a"), ChangeKind::Expire), (b("b"), ChangeKind::Expire)]);
}

async fn nx_and_nex_treat_an_expired_key_as_absent() {
    let mut f = fx().await;
    f.ok(&["SET", "k", "old", "PX", "100"]).await;
    f.ok(&["SET", "n", "old", "PX", "100"]).await;
    f.changes();
    f.clock.advance(100);
    let r = f.ok(&["SET", "k", "new", "NX"]).await;
    assert_eq!(r.reply, Reply::Ok);
    let vk = r.version.unwrap();
    let r = f.ok(&["SET", "n", "new", "NEX"]).await;
    assert_eq!(r.reply, Reply::Ok);
    let vn = r.version.unwrap();
    assert_eq!(f.get("k").await.reply, value("new"));
    assert_eq!(f.get("n").await.reply, value("new"));
    let changes = f.changes();
    let kinds: Vec<_> = changes.iter().map(|c| (c.key.clone(), c.kind.clone())).collect();
    assert_eq!(
        kinds,
        vec![
            (b("k"), ChangeKind::Expire),
            (b("k"), ChangeKind::Set(b("new"))),
            (b("n"), ChangeKind::Expire),
            (b("n"), ChangeKind::Set(b("new"))),
        ],
        "observers see the expiry before the new value"
    );
    assert!(changes[0].version < vk && changes[2].version < vn);
    // The new keys have no deadline.
    f.clock.advance(1_000_000);
    assert_eq!(f.get("k").await.reply, value("new"));
}

async fn set_without_px_clears_px() {
    let mut f = fx().await;
    f.ok(&["SET", "k", "v", "PX", "100"]).await;
    f.ok(&["SET", "k", "w"]).await;
    assert_eq!(f.record("k").await.unwrap().expires_at_ms, None);
    assert_eq!(f.store.backend().next_deadline().await.unwrap(), None);
    f.clock.advance(1_000);
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 0);
    assert_eq!(f.get("k").await.reply, value("w"));
    // Also with NEX: a renewal without PX keeps the key for good.
    f.ok(&["SET", "n", "v", "NEX", "PX", "100"]).await;
    f.ok(&["SET", "n", "v", "NEX"]).await;
    f.clock.advance(1_000);
    assert_eq!(f.get("n").await.reply, value("v"));
    let kinds: Vec<_> = f.changes().into_iter().map(|c| c.kind).collect();
    assert!(!kinds.contains(&ChangeKind::Expire), "{kinds:?}");
}

async fn px_renewal_moves_the_deadline() {
    let f = fx().await;
    f.ok(&["SET", "lock", "me", "NEX", "PX", "100"]).await;
    f.clock.advance(60);
    assert_eq!(f.ok(&["SET", "lock", "me", "NEX", "PX", "100"]).await.reply, Reply::Ok);
    f.clock.advance(60);
    assert_eq!(f.get("lock").await.reply, value("me"), "renewed at +60 until +160");
    f.clock.advance(39);
    assert_eq!(f.get("lock").await.reply, value("me"));
    f.clock.advance(1);
    assert_eq!(f.get("lock").await.reply, Reply::Nil);
    // A not-applied NEX does not extend someone else's lease.
    f.ok(&["SET", "lock", "other", "PX", "100"]).await;
    f.clock.advance(50);
    assert_eq!(
        f.ok(&["SET", "lock", "me", "NEX", "PX", "1000"]).await.reply,
        Reply::NotApplied
    );
    f.clock.advance(50);
    assert_eq!(f.get("lock").await.reply, Reply::Nil);
}

async fn px_fraction_rounds_up() {
    let f = fx().await;
    f.ok(&["SET", "k", "v", "PX", "1500.5"]).await;
    assert_eq!(f.record("k").await.unwrap().expires_at_ms, Some(T0 + 1501));
}

async fn expire_due_removes_many_keys() {
    let mut f = fx().await;
    // More than one batch of the expiry sweep.
    for i in 0..600 {
        f.ok(&["SET", &format!("short{i:04}"), "v", "PX", "100"]).await;
    }
    for i in 0..10 {
        f.ok(&["SET", &format!("long{i}"), "v", "PX", "10000"]).await;
        f.ok(&["SET", &format!("keep{i}"), "v"]).await;
    }
    // Overwritten without PX before its deadline: not expired.
    f.ok(&["SET", "short0000", "kept"]).await;
    f.changes();

    f.clock.advance(99);
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 0);
    f.clock.advance(1);
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 599);
    assert_eq!(f.store.backend().len().await.unwrap(), 21);
    assert_eq!(f.store.backend().next_deadline().await.unwrap(), Some(T0 + 10_000));
    let changes = f.changes();
    assert_eq!(changes.len(), 599);
    assert!(changes.iter().all(|c| c.kind == ChangeKind::Expire));
    let mut keys: Vec<_> = changes.iter().map(|c| c.key.clone()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 599, "each key expires once");
    assert!(!keys.contains(&b("short0000")));
    // Nothing more to do.
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 0);
    f.no_changes();
    assert_eq!(f.get("short0000").await.reply, value("kept"));
    assert_eq!(f.get("short0001").await.reply, Reply::Nil);

    f.clock.advance(10_000);
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 10);
    assert_eq!(f.store.backend().len().await.unwrap(), 11);
    assert_eq!(f.store.backend().next_deadline().await.unwrap(), None);
}

async fn expiry_drops_the_fencing_token() {
    let f = fx().await;
    f.run(&["SET", "k", "v", "PX", "10"], ft(hlc(T0, 5))).await.unwrap();
    f.clock.advance(10);
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 1);
    // No token needed any more.
    assert_eq!(f.ok(&["SET", "k", "v"]).await.reply, Reply::Ok);
}

// ======================= clock skew =======================

async fn request_timestamp_skew() {
    let mut f = fx().await;
    // Exactly 60 s ahead: fine (whatever the counter).
    let meta = Meta {
        timestamp: Some(hlc(T0 + MAX_CLOCK_SKEW_MS, 99_999)),
        ..Meta::default()
    };
    assert_eq!(f.run(&["SET", "a", "v"], meta).await.unwrap().reply, Reply::Ok);
    // 60 s + 1 ms: refused, nothing written or published.
    f.changes();
    assert_err!(
        f.run(&["SET", "b", "v"], ts(T0 + 60_001)).await,
        EngineError::TimestampSkew
    );
    assert_eq!(f.get("b").await.reply, Reply::Nil);
    f.no_changes();
    // The limit follows the service clock.
    f.clock.advance(1);
    assert_eq!(
        f.run(&["SET", "b", "v"], ts(T0 + 60_001)).await.unwrap().reply,
        Reply::Ok
    );
    // Far behind is fine.
    assert_eq!(f.run(&["SET", "c", "v"], ts(0)).await.unwrap().reply, Reply::Ok);
    // `__ts` is optional and unchecked on the other commands.
    for args in [&["GET", "a"][..], &["DEL", "a"], &["VDEL", "b", "v"]] {
        if let Err(e) = f.run(args, ts(u64::MAX / 2)).await {
            panic!("{args:?}: {e:?}");
        }
    }
}

async fn fencing_token_skew() {
    let mut f = fx().await;
    let ok = hlc(T0 + MAX_CLOCK_SKEW_MS, 7);
    let too_far = hlc(T0 + 60_001, 0);
    assert_eq!(
        f.run(&["SET", "a", "v"], ft(ok.clone())).await.unwrap().reply,
        Reply::Ok
    );
    f.changes();
    assert_err!(
        f.run(&["SET", "b", "v"], ft(too_far.clone())).await,
        EngineError::FencingTokenSkew
    );
    assert_err!(
        f.run(&["DEL", "a"], ft(too_far.clone())).await,
        EngineError::FencingTokenSkew
    );
    assert_err!(
        f.run(&["VDEL", "a", "v"], ft(too_far.clone())).await,
        EngineError::FencingTokenSkew
    );
    f.no_changes();
    assert_eq!(f.get("b").await.reply, Reply::Nil);
    assert_eq!(f.get("a").await.reply, value("v"));
    // The skew of a token is checked before the stored token: a too-far token is refused even
    // where it would be high enough.
    f.clock.advance(1);
    assert_eq!(f.run(&["DEL", "a"], ft(too_far)).await.unwrap().reply, Reply::Int(1));
}

// ======================= fencing tokens (spec section 6) =======================

async fn fencing_rule_1_a_token_is_stored() {
    let f = fx().await;
    f.run(&["SET", "k", "v"], ft(hlc(T0, 3))).await.unwrap();
    assert_eq!(f.record("k").await.unwrap().fencing, Some(hlc(T0, 3)));
    // A key set without a token has none.
    f.ok(&["SET", "free", "v"]).await;
    assert_eq!(f.record("free").await.unwrap().fencing, None);
    // ... and any write to it may carry one or not.
    f.run(&["DEL", "free"], ft(hlc(1, 0))).await.unwrap();
}

async fn fencing_rule_2_a_token_is_required() {
    let mut f = fx().await;
    let v1 = f
        .run(&["SET", "k", "v"], ft(hlc(T0, 3)))
        .await
        .unwrap()
        .version
        .unwrap();
    f.changes();
    assert_err!(
        f.run(&["SET", "k", "w"], ts(T0)).await,
        EngineError::FencingTokenRequired
    );
    assert_err!(f.run(&["DEL", "k"], ts(T0)).await, EngineError::FencingTokenRequired);
    assert_err!(
        f.run(&["VDEL", "k", "v"], ts(T0)).await,
        EngineError::FencingTokenRequired
    );
    assert_err!(
        f.run(&["SET", "k", "v", "NEX"], ts(T0)).await,
        EngineError::FencingTokenRequired
    );
    f.no_changes();
    assert_eq!(
        f.get("k").await,
        Response {
            reply: value("v"),
            version: Some(v1)
        }
    );
}

async fn fencing_rule_2_lower_is_refused_equal_or_higher_accepted() {
    let mut f = fx().await;
    f.run(&["SET", "k", "v1"], ft(hlc(T0, 3))).await.unwrap();
    // Lower: by counter, by ms, and by node id at the same (ms, counter).
    for lower in [hlc(T0, 2), hlc(T0 - 1, 9), Hlc::new(T0, 3, "a-client")] {
        assert_err!(
            f.run(&["SET", "k", "x"], ft(lower.clone())).await,
            EngineError::FencingTokenLower
        );
        assert_err!(
            f.run(&["DEL", "k"], ft(lower.clone())).await,
            EngineError::FencingTokenLower
        );
        assert_err!(
            f.run(&["VDEL", "k", "v1"], ft(lower)).await,
            EngineError::FencingTokenLower
        );
    }
    assert_eq!(f.get("k").await.reply, value("v1"));
    // Equal: accepted, the token stays.
    assert_eq!(
        f.run(&["SET", "k", "v2"], ft(hlc(T0, 3))).await.unwrap().reply,
        Reply::Ok
    );
    assert_eq!(f.record("k").await.unwrap().fencing, Some(hlc(T0, 3)));
    // Higher: accepted, and the higher one is kept.
    assert_eq!(
        f.run(&["SET", "k", "v3"], ft(hlc(T0, 10))).await.unwrap().reply,
        Reply::Ok
    );
    assert_eq!(f.record("k").await.unwrap().fencing, Some(hlc(T0, 10)));
    // The old token is now lower.
    assert_err!(
        f.run(&["SET", "k", "v4"], ft(hlc(T0, 3))).await,
        EngineError::FencingTokenLower
    );
    assert_eq!(f.get("k").await.reply, value("v3"));
    let kinds: Vec<_> = f.changes().into_iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        vec![
            ChangeKind::Set(b("v1")),
            ChangeKind::Set(b("v2")),
            ChangeKind::Set(b("v3"))
        ]
    );
}

async fn fencing_a_set_never_lowers_the_token() {
    let f = fx().await;
    f.run(&["SET", "k", "v"], ft(hlc(T0, 10))).await.unwrap();
    // A NEX renewal with the same token keeps it; a not-applied NX changes nothing.
    f.run(&["SET", "k", "v", "NEX"], ft(hlc(T0, 10))).await.unwrap();
    assert_eq!(
        f.run(&["SET", "k", "w", "NX"], ft(hlc(T0, 20))).await.unwrap().reply,
        Reply::NotApplied
    );
    assert_eq!(f.record("k").await.unwrap().fencing, Some(hlc(T0, 10)));
}

async fn fencing_rule_3_token_before_value() {
    let mut f = fx().await;
    let v1 = f
        .run(&["SET", "k", "v"], ft(hlc(T0, 3)))
        .await
        .unwrap()
        .version
        .unwrap();
    f.changes();
    // A valid token and a wrong value: not applied.
    let r = f.run(&["VDEL", "k", "wrong"], ft(hlc(T0, 3))).await.unwrap();
    assert_eq!(
        r,
        Response {
            reply: Reply::NotApplied,
            version: Some(v1)
        }
    );
    // A lower or missing token and a wrong value: the token error, not `:-1`.
    assert_err!(
        f.run(&["VDEL", "k", "wrong"], ft(hlc(T0, 2))).await,
        EngineError::FencingTokenLower
    );
    assert_err!(
        f.run(&["VDEL", "k", "wrong"], ts(T0)).await,
        EngineError::FencingTokenRequired
    );
    f.no_changes();
    // A valid token and the right value: deleted.
    assert_eq!(
        f.run(&["VDEL", "k", "v"], ft(hlc(T0, 4))).await.unwrap().reply,
        Reply::Int(1)
    );
}

async fn fencing_rule_5_get_needs_no_token_and_delete_drops_it() {
    let f = fx().await;
    f.run(&["SET", "k", "v"], ft(hlc(T0, 3))).await.unwrap();
    assert_eq!(f.run(&["GET", "k"], Meta::default()).await.unwrap().reply, value("v"));
    assert_eq!(f.run(&["GET", "k"], ft(hlc(1, 0))).await.unwrap().reply, value("v"));
    assert_eq!(f.run(&["DEL", "k"], ft(hlc(T0, 3))).await.unwrap().reply, Reply::Int(1));
    // Deleted: no token stored, no token needed.
    assert_eq!(f.ok(&["SET", "k", "v"]).await.reply, Reply::Ok);
    assert_eq!(f.record("k").await.unwrap().fencing, None);
    // The same after VDEL, and a new lower token is then fine.
    f.run(&["SET", "j", "v"], ft(hlc(T0, 9))).await.unwrap();
    assert_eq!(
        f.run(&["VDEL", "j", "v"], ft(hlc(T0, 9))).await.unwrap().reply,
        Reply::Int(1)
    );
    assert_eq!(
        f.run(&["SET", "j", "v"], ft(hlc(T0, 1))).await.unwrap().reply,
        Reply::Ok
    );
    assert_eq!(f.record("j").await.unwrap().fencing, Some(hlc(T0, 1)));
}

// ======================= quotas =======================

async fn quota_max_keys() {
    let mut f = fx_with(Limits {
        max_keys: Some(2),
        ..Limits::default()
    })
    .await;
    f.ok(&["SET", "a", "1"]).await;
    f.ok(&["SET", "b", "1"]).await;
    f.changes();
    assert_err!(f.run(&["SET", "c", "1"], ts(T0)).await, EngineError::QuotaExceeded);
    assert_err!(
        f.run(&["SET", "c", "1", "NX"], ts(T0)).await,
        EngineError::QuotaExceeded
    );
    f.no_changes();
    assert_eq!(f.get("c").await.reply, Reply::Nil);
    // Overwriting an existing key at the limit is allowed.
    assert_eq!(f.ok(&["SET", "a", "2"]).await.reply, Reply::Ok);
    assert_eq!(f.ok(&["SET", "b", "1", "NEX", "PX", "10"]).await.reply, Reply::Ok);
    // A delete makes room.
    assert_eq!(f.ok(&["DEL", "a"]).await.reply, Reply::Int(1));
    assert_eq!(f.ok(&["SET", "c", "1"]).await.reply, Reply::Ok);
    // A removed expired key makes room too.
    f.clock.advance(10);
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 1);
    assert_eq!(f.ok(&["SET", "d", "1"]).await.reply, Reply::Ok);
}

async fn quota_does_not_count_expired_keys_the_sweeper_has_not_reached() {
    let mut f = fx_with(Limits {
        max_keys: Some(1),
        ..Limits::default()
    })
    .await;
    f.ok(&["SET", "brief", "1", "PX", "10"]).await;
    f.clock.advance(10);
    f.changes();
    // No sweep has run: the expired key still occupies the only slot, yet reads as absent.
    assert_eq!(f.ok(&["SET", "next", "1"]).await.reply, Reply::Ok);
    let kinds: Vec<ChangeKind> = f.changes().into_iter().map(|c| c.kind).collect();
    assert_eq!(kinds, vec![ChangeKind::Expire, ChangeKind::Set(b("1"))]);
    // Still full now: a third key is refused.
    assert_err!(f.run(&["SET", "third", "1"], ts(T0)).await, EngineError::QuotaExceeded);
}

async fn quota_key_and_value_sizes() {
    let mut f = fx_with(Limits {
        max_key_bytes: 8,
        max_value_bytes: 16,
        ..Limits::default()
    })
    .await;
    let key8 = "k".repeat(8);
    let key9 = "k".repeat(9);
    let val16 = "v".repeat(16);
    let val17 = "v".repeat(17);
    assert_eq!(f.ok(&["SET", &key8, &val16]).await.reply, Reply::Ok);
    f.changes();
    assert_err!(f.run(&["SET", &key9, "v"], ts(T0)).await, EngineError::TooLarge);
    assert_err!(f.run(&["SET", "k", &val17], ts(T0)).await, EngineError::TooLarge);
    assert_err!(f.run(&["SET", &key8, &val17], ts(T0)).await, EngineError::TooLarge);
    f.no_changes();
    assert_eq!(
        f.get(&key8).await.reply,
        value(&val16),
        "a refused overwrite changes nothing"
    );
    // Reads and deletes of long keys are not quota errors.
    assert_eq!(f.get(&key9).await.reply, Reply::Nil);
    assert_eq!(f.ok(&["DEL", &key9]).await.reply, Reply::Int(0));
}

// ======================= KEYNOTIFY =======================

fn sorted(mut ids: Vec<Arc<str>>) -> Vec<String> {
    ids.sort();
    ids.iter().map(|s| s.to_string()).collect()
}

async fn keynotify_register_and_stop() {
    let mut f = fx().await;
    // Registering answers OK whether or not the key exists, and twice is fine.
    let r = f.run(&["KEYNOTIFY", "k"], client("c1")).await.unwrap();
    assert_eq!(
        r,
        Response {
            reply: Reply::Ok,
            version: None
        }
    );
    assert_eq!(f.run(&["KEYNOTIFY", "k"], client("c1")).await.unwrap().reply, Reply::Ok);
    assert_eq!(sorted(f.engine.observers_of(b"k")), ["c1"]);
    f.run(&["KEYNOTIFY", "k"], client("c2")).await.unwrap();
    assert_eq!(sorted(f.engine.observers_of(b"k")), ["c1", "c2"]);
    assert_eq!(f.engine.observing_clients(), 2);
    assert!(f.engine.observers_of(b"other").is_empty());

    // STOP: OK when registered, `:0` when not.
    let r = f.run(&["KEYNOTIFY", "k", "STOP"], client("c1")).await.unwrap();
    assert_eq!(
        r,
        Response {
            reply: Reply::Ok,
            version: None
        }
    );
    assert_eq!(sorted(f.engine.observers_of(b"k")), ["c2"]);
    let r = f.run(&["KEYNOTIFY", "k", "STOP"], client("c1")).await.unwrap();
    assert_eq!(
        r,
        Response {
            reply: Reply::Int(0),
            version: None
        }
    );
    let r = f.run(&["KEYNOTIFY", "never", "STOP"], client("c3")).await.unwrap();
    assert_eq!(r.reply, Reply::Int(0));
    assert_eq!(f.engine.observing_clients(), 1);
    f.run(&["KEYNOTIFY", "k", "STOP"], client("c2")).await.unwrap();
    assert!(f.engine.observers_of(b"k").is_empty());
    assert_eq!(f.engine.observing_clients(), 0);

    // Registrations never touch storage or the change feed.
    f.no_changes();
    assert_eq!(f.store.backend().len().await.unwrap(), 0);
}

async fn keynotify_registrations_outlive_the_key() {
    let f = fx().await;
    f.run(&["KEYNOTIFY", "k"], client("c1")).await.unwrap();
    f.ok(&["SET", "k", "v", "PX", "5"]).await;
    f.ok(&["DEL", "k"]).await;
    f.ok(&["SET", "k", "v", "PX", "5"]).await;
    f.clock.advance(5);
    f.engine.expire_due(usize::MAX).await.unwrap();
    assert_eq!(sorted(f.engine.observers_of(b"k")), ["c1"]);
}

async fn keynotify_drop_client() {
    let f = fx().await;
    for k in ["a", "b", "c"] {
        f.run(&["KEYNOTIFY", k], client("c1")).await.unwrap();
    }
    f.run(&["KEYNOTIFY", "a"], client("c2")).await.unwrap();
    assert_eq!(f.engine.drop_client("c1", None).await, 3);
    assert_eq!(sorted(f.engine.observers_of(b"a")), ["c2"]);
    assert!(f.engine.observers_of(b"b").is_empty());
    assert_eq!(f.engine.observing_clients(), 1);
    assert_eq!(f.engine.drop_client("c1", None).await, 0);
    assert_eq!(f.engine.drop_client("nobody", None).await, 0);
    // A dropped client may register again; STOP after a drop answers `:0`.
    assert_eq!(
        f.run(&["KEYNOTIFY", "b", "STOP"], client("c1")).await.unwrap().reply,
        Reply::Int(0)
    );
    assert_eq!(f.run(&["KEYNOTIFY", "b"], client("c1")).await.unwrap().reply, Reply::Ok);
    assert_eq!(sorted(f.engine.observers_of(b"b")), ["c1"]);
    // Touching and sweeping without an idle limit drops nobody.
    f.engine.touch_client("c1");
    f.engine.touch_client("nobody");
    assert_eq!(f.engine.sweep_idle_observers().await, 0);
    assert_eq!(f.engine.observing_clients(), 2);
}

async fn keynotify_per_client_cap() {
    let mut limits = Limits::default();
    limits.observers.per_client = 2;
    let f = fx_with(limits).await;
    f.run(&["KEYNOTIFY", "a"], client("c1")).await.unwrap();
    f.run(&["KEYNOTIFY", "b"], client("c1")).await.unwrap();
    assert_err!(
        f.run(&["KEYNOTIFY", "c"], client("c1")).await,
        EngineError::QuotaExceeded
    );
    assert!(f.engine.observers_of(b"c").is_empty());
    // Observing a key again at the cap is fine.
    assert_eq!(f.run(&["KEYNOTIFY", "a"], client("c1")).await.unwrap().reply, Reply::Ok);
    // The cap is per client.
    assert_eq!(f.run(&["KEYNOTIFY", "c"], client("c2")).await.unwrap().reply, Reply::Ok);
    // A STOP makes room.
    f.run(&["KEYNOTIFY", "a", "STOP"], client("c1")).await.unwrap();
    assert_eq!(f.run(&["KEYNOTIFY", "c"], client("c1")).await.unwrap().reply, Reply::Ok);
    assert_eq!(sorted(f.engine.observers_of(b"c")), ["c1", "c2"]);
}

// ======================= change feed =======================

async fn change_feed_order_and_contents() {
    let mut f = fx().await;
    let v1 = f.ok(&["SET", "k", "1"]).await.version.unwrap();
    let v2 = f.ok(&["SET", "j", "a", "PX", "10"]).await.version.unwrap();
    let v3 = f.ok(&["SET", "k", "2", "NEX"]).await; // not applied
    assert_eq!(v3.reply, Reply::NotApplied);
    let v4 = f.ok(&["SET", "k", "3"]).await.version.unwrap();
    let v5 = f.ok(&["VDEL", "k", "3"]).await.version.unwrap();
    let v6 = f.ok(&["SET", "k", "4"]).await.version.unwrap();
    let v7 = f.ok(&["DEL", "k"]).await.version.unwrap();
    f.clock.advance(10);
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 1);
    let changes = f.changes();
    assert_eq!(changes.len(), 7, "{changes:?}");
    assert_eq!(
        changes[..6],
        [
            set_change("k", "1", &v1),
            set_change("j", "a", &v2),
            set_change("k", "3", &v4),
            change("k", &v5, ChangeKind::Delete),
            set_change("k", "4", &v6),
            change("k", &v7, ChangeKind::Delete),
        ]
    );
    assert_eq!(
        (changes[6].key.clone(), changes[6].kind.clone()),
        (b("j"), ChangeKind::Expire)
    );
    // Versions grow with every change.
    for w in changes.windows(2) {
        assert!(w[0].version < w[1].version, "{:?}", w);
    }
}

async fn change_feed_nothing_for_operations_not_applied() {
    let mut f = fx_with(Limits {
        max_keys: Some(2),
        ..Limits::default()
    })
    .await;
    f.ok(&["SET", "k", "v"]).await;
    f.run(&["SET", "f", "v"], ft(hlc(T0, 5))).await.unwrap();
    f.changes();

    f.ok(&["SET", "k", "w", "NX"]).await;
    f.ok(&["SET", "k", "w", "NEX"]).await;
    f.ok(&["VDEL", "k", "w"]).await;
    f.ok(&["DEL", "absent"]).await;
    f.ok(&["VDEL", "absent", "v"]).await;
    f.ok(&["GET", "k"]).await;
    f.ok(&["GET", "absent"]).await;
    f.run(&["KEYNOTIFY", "k"], client("c")).await.unwrap();
    f.run(&["KEYNOTIFY", "k", "STOP"], client("c")).await.unwrap();
    f.ok(&["SCAN", "*"]).await;
    assert_err!(f.run(&["SET", "third", "v"], ts(T0)).await, EngineError::QuotaExceeded);
    assert_err!(
        f.run(&["SET", "f", "w"], ts(T0)).await,
        EngineError::FencingTokenRequired
    );
    assert_err!(
        f.run(&["DEL", "f"], ft(hlc(T0, 4))).await,
        EngineError::FencingTokenLower
    );
    assert_err!(
        f.run(&["SET", "k", "w"], ts(T0 + 3_600_000)).await,
        EngineError::TimestampSkew
    );
    assert_err!(
        f.run(&["SET", "k", "w", "PX", "0"], ts(T0)).await,
        EngineError::TtlOutOfRange
    );
    f.no_changes();
}

async fn change_feed_subscribers_see_changes_from_subscription_on() {
    let f = fx().await;
    f.ok(&["SET", "before", "v"]).await;
    let mut late = f.engine.subscribe();
    let v = f.ok(&["SET", "after", "v"]).await.version.unwrap();
    assert_eq!(late.try_recv().unwrap().unwrap().change, set_change("after", "v", &v));
    assert!(late.try_recv().is_none());
}

// ======================= SCAN =======================

async fn glob_fixture() -> Fx {
    let f = fx().await;
    for k in [
        "a", "b", "c", "ab", "abc", "a1", "a5", "ax", "a^", "a!", "a*", "a?", "a[", "A1", "b1", "dir/x", "dir/y/z",
    ] {
        f.ok(&["SET", k, "v"]).await;
    }
    f
}

async fn scan_glob_patterns() {
    let f = glob_fixture().await;
    let s = |v: &[&str]| {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(f.scan_sorted("*").await.len(), 17);
    // Anchored at both ends.
    assert_eq!(f.scan_sorted("a").await, s(&["a"]));
    assert_eq!(f.scan_sorted("b").await, s(&["b"]));
    assert_eq!(f.scan_sorted("*b").await, s(&["ab", "b"]));
    assert_eq!(f.scan_sorted("b*").await, s(&["b", "b1"]));
    // `*` also matches the empty run and `/`.
    assert_eq!(f.scan_sorted("ab*").await, s(&["ab", "abc"]));
    assert_eq!(f.scan_sorted("dir*").await, s(&["dir/x", "dir/y/z"]));
    assert_eq!(f.scan_sorted("dir/*").await, s(&["dir/x", "dir/y/z"]));
    // `?` is exactly one character.
    assert_eq!(f.scan_sorted("?").await, s(&["a", "b", "c"]));
    assert_eq!(
        f.scan_sorted("a?").await,
        s(&["a!", "a*", "a1", "a5", "a?", "a[", "a^", "ab", "ax"])
    );
    // Classes, ranges, negation with `!`.
    assert_eq!(f.scan_sorted("[ab]").await, s(&["a", "b"]));
    assert_eq!(f.scan_sorted("[ab]1").await, s(&["a1", "b1"]));
    assert_eq!(f.scan_sorted("a[0-9]").await, s(&["a1", "a5"]));
    assert_eq!(
        f.scan_sorted("a[!0-9]").await,
        s(&["a!", "a*", "a?", "a[", "a^", "ab", "ax"])
    );
    // `[^0-9]` is NOT negation in the glob crate: `^` is one more member of the class.
    assert_eq!(f.scan_sorted("a[^0-9]").await, s(&["a1", "a5", "a^"]));
    // Brackets escape the metacharacters.
    assert_eq!(f.scan_sorted("a[*]").await, s(&["a*"]));
    assert_eq!(f.scan_sorted("a[?]").await, s(&["a?"]));
    assert_eq!(f.scan_sorted("a[[]").await, s(&["a["]));
    // A `]` right after `[` is a member, not the end of the class.
    assert_eq!(f.scan_sorted("a[]!]").await, s(&["a!"]));
    // Case-sensitive.
    assert_eq!(f.scan_sorted("A*").await, s(&["A1"]));
    // No match at all.
    assert_eq!(f.scan_sorted("zzz*").await, Vec::<String>::new());
    assert_eq!(f.scan_sorted("").await, Vec::<String>::new());
}

async fn scan_bad_patterns_and_tokens_are_syntax_errors() {
    let f = glob_fixture().await;
    for pattern in ["[", "a[", "a[!", "a[!]", "***", "a**"] {
        assert_err!(f.run(&["SCAN", pattern], Meta::default()).await, EngineError::Syntax);
    }
    let bad_utf8 = Command::Scan(Scan {
        pattern: Bytes::from_static(b"\xff*"),
        token: None,
        filter: None,
    });
    assert_err!(f.engine.execute(bad_utf8).await, EngineError::Syntax);
    for token in ["zz", "", "ABC", "6B 65", "0x6B"] {
        assert_err!(f.run(&["SCAN", "*", token], Meta::default()).await, EngineError::Syntax);
    }
}

async fn scan_binary_keys() {
    let f = fx().await;
    for key in [&b"\xff\xfe"[..], b"k\r\n", b"k\x00"] {
        let set = Set {
            key: Bytes::copy_from_slice(key),
            value: b("v"),
            condition: SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        };
        f.engine.execute(Command::Set(set)).await.unwrap();
    }
    let (mut keys, _) = f.scan_all("*").await;
    keys.sort();
    assert_eq!(
        keys,
        vec![
            Bytes::from_static(b"k\x00"),
            Bytes::from_static(b"k\r\n"),
            Bytes::from_static(b"\xff\xfe")
        ]
    );
    let (keys, _) = f.scan_all("k?").await;
    assert_eq!(keys.len(), 1, "k\\r\\n is three characters");
}

fn small_pages(n: usize) -> Limits {
    Limits {
        scan_page: n,
        ..Limits::default()
    }
}

async fn scan_paging_lists_every_key_once() {
    let f = fx_with(small_pages(3)).await;
    let all: Vec<String> = (0..20).map(|i| format!("key{i:02}")).collect();
    for k in &all {
        f.ok(&["SET", k, "v"]).await;
    }
    f.ok(&["SET", "other", "v"]).await;
    let (keys, pages) = f.scan_all("key*").await;
    let keys: Vec<String> = keys.iter().map(|k| String::from_utf8_lossy(k).into()).collect();
    assert_eq!(keys, all, "every key exactly once, in key order");
    assert_eq!(pages, 7, "21 keys, 3 examined per page");

    // A page's token resumes after the last key examined, whether or not it matched.
    let first = f.ok(&["SCAN", "zzz"]).await;
    let Reply::Keys { keys, token } = first.reply else {
        panic!("{first:?}");
    };
    assert!(keys.is_empty());
    assert!(token.is_some(), "k may be 0 with more pages to come");
}

async fn scan_deleted_keys_never_come_back() {
    let f = fx_with(small_pages(4)).await;
    let all: Vec<String> = (0..12).map(|i| format!("k{i:02}")).collect();
    for k in &all {
        f.ok(&["SET", k, "v"]).await;
    }
    let Reply::Keys { keys: first, token } = f.ok(&["SCAN", "*"]).await.reply else {
        panic!("not a SCAN reply");
    };
    assert_eq!(first.len(), 4);
    let mut token = token.expect("more pages");
    // Delete one key that was returned, the key the token points after, and keys ahead.
    for k in ["k00", "k03", "k05", "k08", "k11"] {
        assert_eq!(f.ok(&["DEL", k]).await.reply, Reply::Int(1));
    }
    // And let one expire.
    f.ok(&["SET", "k09", "v", "PX", "1"]).await;
    f.clock.advance(1);
    let mut rest = Vec::new();
    loop {
        let tok = String::from_utf8(token.to_vec()).unwrap();
        let Reply::Keys { keys, token: next } = f.ok(&["SCAN", "*", &tok]).await.reply else {
            panic!("not a SCAN reply");
        };
        rest.extend(keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()));
        match next {
            Some(t) => token = t,
            None => break,
        }
    }
    assert_eq!(rest, ["k04", "k06", "k07", "k10"]);
}

async fn scan_of_100_keys_takes_at_most_64_pages() {
    let f = fx().await;
    for i in 0..100 {
        f.ok(&["SET", &format!("key{i:03}"), "v"]).await;
    }
    let (keys, pages) = f.scan_all("*").await;
    assert_eq!(keys.len(), 100);
    assert!(pages <= 64, "{pages} pages");
    // The smallest page that still meets the rule.
    let f = fx_with(small_pages(2)).await;
    for i in 0..100 {
        f.ok(&["SET", &format!("key{i:03}"), "v"]).await;
    }
    let (keys, pages) = f.scan_all("*").await;
    assert_eq!(keys.len(), 100);
    assert!(pages <= 64, "{pages} pages");
}

async fn scan_tokens_are_upper_case_hex_of_the_last_key() {
    let f = fx_with(small_pages(1)).await;
    f.ok(&["SET", "key", "v"]).await;
    f.ok(&["SET", "lock", "v"]).await;
    let Reply::Keys { keys, token } = f.ok(&["SCAN", "*"]).await.reply else {
        panic!("not a SCAN reply");
    };
    assert_eq!(keys, [b("key")]);
    assert_eq!(token, Some(b("6B6579")));
    // Lower-case hex works as well (clients must not care, but hand-written ones may).
    let Reply::Keys { keys, .. } = f.ok(&["SCAN", "*", "6b6579"]).await.reply else {
        panic!("not a SCAN reply");
    };
    assert_eq!(keys, [b("lock")]);
}

// ======================= hardening: rules once, bounded work ================
fn del_cmd(key: &str, condition: DelCondition) -> Command {
    Command::Del(Del {
        key: b(key),
        fencing: None,
        condition,
    })
}

/// First-write without an ETag: a no-op on an absent key, refused on an existing one, decided
/// under the key's lock (in a transaction too), so a concurrent SET cannot slip in between.
async fn first_write_delete_is_an_engine_condition() {
    let mut f = fx().await;
    let r = f.engine.execute(del_cmd("k", DelCondition::IfAbsent)).await.unwrap();
    assert_eq!(r.reply, Reply::Int(0));
    f.ok(&["SET", "k", "v"]).await;
    f.changes();
    assert_err!(
        f.engine.execute(del_cmd("k", DelCondition::IfAbsent)).await,
        EngineError::VersionMismatch
    );
    let tx = vec![TxOp::Del(Del {
        key: b("k"),
        fencing: None,
        condition: DelCondition::IfAbsent,
    })];
    assert_err!(f.engine.transact(tx).await, EngineError::VersionMismatch);
    assert!(f.record("k").await.is_some());
    f.no_changes();
    // The check and the write share the lock: racing SETs and first-write deletes never end
    // with a first-write delete having removed a key.
    let e = f.engine.clone();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let key = b(&format!("race-{}", i % 5));
            if i % 2 == 0 {
                let set = Set {
                    key,
                    value: b("v"),
                    condition: SetCondition::Always,
                    ttl_ms: None,
                    timestamp: None,
                    fencing: None,
                    persist: false,
                    sliding: false,
                };
                e.execute(Command::Set(set)).await.map(|_| ())
            } else {
                match e
                    .execute(del_cmd(&String::from_utf8_lossy(&key), DelCondition::IfAbsent))
                    .await
                {
                    Ok(r) => {
                        assert_eq!(r.reply, Reply::Int(0), "a first-write delete never deletes");
                        Ok(())
                    }
                    Err(EngineError::VersionMismatch) => Ok(()),
                    Err(other) => Err(other),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert!(f.changes().iter().all(|c| matches!(c.kind, ChangeKind::Set(_))));
}

/// Transactions sweep expired-but-unswept keys at `max_keys`, as SET does.
async fn transactions_make_room_from_expired_keys_too() {
    let limits = Limits {
        max_keys: Some(2),
        ..Limits::default()
    };
    let f = fx_with(limits).await;
    f.ok(&["SET", "a", "v", "PX", "10"]).await;
    f.ok(&["SET", "b", "v", "PX", "10"]).await;
    f.clock.advance(20);
    let set = |k: &str| {
        TxOp::Set(Set {
            key: b(k),
            value: b("v"),
            condition: SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        })
    };
    f.engine.transact(vec![set("c"), set("d")]).await.unwrap();
    assert_err!(f.engine.transact(vec![set("e")]).await, EngineError::QuotaExceeded);
}

/// A write at `max_keys` removes a bounded number of due keys itself; the driver does the rest.
async fn quota_refusals_do_bounded_expiry_work() {
    let limits = Limits {
        max_keys: Some(1000),
        ..Limits::default()
    };
    let mut f = fx_with(limits).await;
    for i in 0..1000 {
        f.ok(&["SET", &format!("k{i:04}"), "v", "PX", "10"]).await;
    }
    f.clock.advance(20);
    f.changes();
    f.ok(&["SET", "new", "v"]).await;
    let expired = f.changes().iter().filter(|c| c.kind == ChangeKind::Expire).count();
    assert!(expired > 0 && expired <= 64, "{expired} removed inline");
    // What is left goes in batches through the driver's path.
    assert_eq!(f.engine.expire_due(usize::MAX).await.unwrap(), 1000 - expired);
    let mut seen: Vec<Change> = f.changes();
    assert_eq!(seen.len(), 1000 - expired);
    seen.sort_by(|a, b| a.key.cmp(&b.key));
    assert!(seen.iter().all(|c| c.kind == ChangeKind::Expire));
}

/// The registry is bounded as a whole, per client and by key size.
async fn keynotify_registry_bounds() {
    let mut limits = Limits::default();
    limits.observers.total = 3;
    limits.observers.per_client = 2;
    limits.max_key_bytes = 8;
    let f = fx_with(limits).await;
    f.run(&["KEYNOTIFY", "a"], client("c1")).await.unwrap();
    f.run(&["KEYNOTIFY", "b"], client("c1")).await.unwrap();
    assert_err!(
        f.run(&["KEYNOTIFY", "c"], client("c1")).await,
        EngineError::QuotaExceeded
    );
    f.run(&["KEYNOTIFY", "a"], client("c2")).await.unwrap();
    assert_err!(
        f.run(&["KEYNOTIFY", "b"], client("c3")).await,
        EngineError::QuotaExceeded
    );
    assert_eq!(f.engine.registrations(), 3);
    // A refused client leaves nothing behind.
    assert_eq!(f.engine.observing_clients(), 2);
    assert_err!(
        f.run(&["KEYNOTIFY", "123456789"], client("c2")).await,
        EngineError::TooLarge
    );
    // STOP frees room.
    f.run(&["KEYNOTIFY", "a", "STOP"], client("c1")).await.unwrap();
    f.run(&["KEYNOTIFY", "z"], client("c3")).await.unwrap();
    assert_eq!(f.engine.registrations(), 3);
}

fn session(id: &str, s: u64) -> Meta {
    Meta {
        client: Some(id.into()),
        session: Some(s),
        ..Meta::default()
    }
}

/// Registrations belong to a broker session: a newer session of the same client id replaces
/// the old one's, and a late report of the old session's end leaves the new ones alone.
async fn keynotify_registrations_follow_the_broker_session() {
    let f = fx().await;
    f.run(&["KEYNOTIFY", "old"], session("c1", 1)).await.unwrap();
    f.run(&["KEYNOTIFY", "new"], session("c1", 2)).await.unwrap();
    assert!(f.engine.observers_of(b"old").is_empty());
    assert_eq!(
        f.engine.drop_client("c1", Some(1)).await,
        0,
        "a late disconnect of session 1"
    );
    assert_eq!(sorted(f.engine.observers_of(b"new")), ["c1"]);
    assert_eq!(f.engine.drop_client("c1", Some(2)).await, 1);
    assert_eq!(f.engine.registrations(), 0);
}

/// Keys kept by the registry are copies, not slices of the request's buffer.
async fn keynotify_keys_do_not_pin_request_buffers() {
    let f = fx().await;
    let packet = Bytes::from(vec![b'k'; 4096]);
    let kn = KeyNotify {
        key: packet.slice(0..8),
        client: "c1".into(),
        session: None,
        stop: false,
    };
    f.engine.execute(Command::KeyNotify(kn)).await.unwrap();
    assert!(packet.is_unique());
}

/// Notifications that do not fit the door's queue are dropped and counted, never silently.
async fn keynotify_queue_overflow_is_counted() {
    let mut limits = Limits::default();
    limits.observers.queue_len = 4;
    let f = fx_with(limits).await;
    let mut rx = f.engine.keynotify_feed().unwrap();
    f.run(&["KEYNOTIFY", "k"], client("c1")).await.unwrap();
    for i in 0..10 {
        f.ok(&["SET", "k", &i.to_string()]).await;
    }
    assert_eq!(f.engine.keynotify_dropped(), 6);
    for i in 0..4 {
        let n = rx.recv().await.unwrap();
        assert_eq!(n.change.kind, ChangeKind::Set(b(&i.to_string())));
    }
    let mut limits = Limits::default();
    limits.observers.queue_bytes = 10_000;
    let f = fx_with(limits).await;
    let _rx = f.engine.keynotify_feed().unwrap();
    f.run(&["KEYNOTIFY", "k"], client("c1")).await.unwrap();
    let big = "x".repeat(4000);
    for _ in 0..5 {
        f.ok(&["SET", "k", &big]).await;
    }
    assert_eq!(
        f.engine.keynotify_dropped(),
        3,
        "two notifications of 4 KB fit in 10 KB"
    );
}
// ======================= every backend =======================

/// Which backend the running test uses (a task-local, set by `on_every_backend!`).
#[derive(Debug, Clone)]
enum Backing {
    Memory,
    /// A Redis or Valkey server: each store opened on it gets a prefix of its own.
    #[cfg(feature = "redis")]
    Redis(String),
}

tokio::task_local! {
    static BACKING: Backing;
}

/// A fresh, empty store of the running test's backend.
async fn test_store() -> Store {
    test_replica_stores(1).await.remove(0)
}

/// `n` handles on one fresh, empty store of the running test's backend, one per replica: on
/// memory the same store (no lock in common but the storage's), on Redis a connection each.
async fn test_replica_stores(n: usize) -> Vec<Store> {
    let backing = BACKING
        .try_with(Backing::clone)
        .unwrap_or_else(|_| panic!("engine tests run through on_every_backend!: list the test there"));
    match backing {
        Backing::Memory => vec![Store::memory(); n],
        #[cfg(feature = "redis")]
        Backing::Redis(url) => {
            use std::sync::atomic::AtomicU64;
            static STORES: AtomicU64 = AtomicU64::new(0);
            let Ok(crate::storage::StorageKind::Redis(url)) = url.parse() else {
                panic!("not a redis url: {url}");
            };
            let options = crate::storage::RedisOptions {
                prefix: format!("engine-test-{}:", STORES.fetch_add(1, Ordering::Relaxed)),
                timeout: std::time::Duration::from_secs(5),
                ..Default::default()
            };
            let mut stores = Vec::with_capacity(n);
            for _ in 0..n {
                let backend = crate::storage::redis::RedisBackend::open(&url, &options).await.unwrap();
                stores.push(Store::new(backend));
            }
            stores
        }
    }
}

#[cfg(feature = "redis")]
async fn on_server(flavor: crate::storage::redis::server::Flavor, test: impl std::future::Future<Output = ()>) {
    let server = crate::storage::redis::server::TestServer::start(flavor);
    BACKING.scope(Backing::Redis(server.url()), test).await;
}

macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test]
                async fn $test() {
                    super::BACKING.scope(super::Backing::Memory, super::$test()).await;
                }
            )*
        }
        #[cfg(feature = "redis")]
        mod on_redis {
            $(
                #[tokio::test]
                async fn $test() {
                    super::on_server(crate::storage::redis::server::Flavor::Redis, super::$test()).await;
                }
            )*
        }
        #[cfg(feature = "redis")]
        mod on_valkey {
            $(
                #[tokio::test]
                async fn $test() {
                    super::on_server(crate::storage::redis::server::Flavor::Valkey, super::$test()).await;
                }
            )*
        }
    };
}

on_every_backend!(
    empty_keys_are_refused_by_execute_too,
    set_get_del_replies_and_versions,
    set_version_is_after_the_request_timestamp,
    set_version_is_after_the_stored_version,
    versions_never_go_backwards_after_a_restart,
    set_without_a_timestamp_still_gets_a_version,
    versions_within_one_millisecond_use_the_counter,
    values_are_binary,
    vdel_replies,
    nx_and_nex,
    etag_conditions,
    px_expires_at_the_deadline,
    expired_keys_read_as_absent_everywhere,
    nx_and_nex_treat_an_expired_key_as_absent,
    set_without_px_clears_px,
    px_renewal_moves_the_deadline,
    px_fraction_rounds_up,
    expire_due_removes_many_keys,
    expiry_drops_the_fencing_token,
    request_timestamp_skew,
    fencing_token_skew,
    fencing_rule_1_a_token_is_stored,
    fencing_rule_2_a_token_is_required,
    fencing_rule_2_lower_is_refused_equal_or_higher_accepted,
    fencing_a_set_never_lowers_the_token,
    fencing_rule_3_token_before_value,
    fencing_rule_5_get_needs_no_token_and_delete_drops_it,
    quota_max_keys,
    quota_does_not_count_expired_keys_the_sweeper_has_not_reached,
    quota_key_and_value_sizes,
    keynotify_register_and_stop,
    keynotify_registrations_outlive_the_key,
    keynotify_drop_client,
    keynotify_per_client_cap,
    change_feed_order_and_contents,
    change_feed_nothing_for_operations_not_applied,
    change_feed_subscribers_see_changes_from_subscription_on,
    scan_glob_patterns,
    scan_bad_patterns_and_tokens_are_syntax_errors,
    scan_binary_keys,
    scan_paging_lists_every_key_once,
    scan_deleted_keys_never_come_back,
    scan_of_100_keys_takes_at_most_64_pages,
    scan_tokens_are_upper_case_hex_of_the_last_key,
    ttl_range_is_decided_by_the_engine,
    first_write_delete_is_an_engine_condition,
    transactions_make_room_from_expired_keys_too,
    quota_refusals_do_bounded_expiry_work,
    keynotify_registry_bounds,
    keynotify_registrations_follow_the_broker_session,
    keynotify_keys_do_not_pin_request_buffers,
    keynotify_queue_overflow_is_counted,
);

mod expiry;
mod persist;
#[cfg(feature = "redis")]
mod shared;
mod sliding;
mod sliding_races;
mod transact;
mod transfer;
