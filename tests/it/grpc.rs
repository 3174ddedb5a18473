//! The gRPC doors over a real port and a real Unix socket, through the generated tonic clients:
//! `statestore.v1.StateStore` (every RPC, Watch included), `dapr.proto.runtime.v1.Dapr` (every
//! state RPC and its status codes), health and reflection, the Dapr pluggable state component
//! API on its Unix socket (with its error contract), Watch across doors (MQTT and HTTP writes),
//! and the official Python Dapr SDK as a peer, cross-checked over MQTT with the official Azure
//! IoT Operations Rust SDK.
//!
//! Synchronisation: every wait is on an answer or a stream event, bounded by `support::WAIT`. A
//! Watch subscription is live once `watch()` returned: the server subscribes to the change feed
//! before it sends the response headers that `watch()` waits for.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::components::v1 as cpb;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::grpc::pb::statestore::v1 as npb;
use stategate::hlc::Hlc;
use tokio::process::Command;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_types::{ErrorDetail, StatusExt};

use crate::support::{Broker, RawClient, Storage, TestEnv, WAIT, now_ts, prop, unique_id};

const STORE: &str = "statestore";

// The native API (unary and Watch) and Dapr transactions over memory and durable storage.
crate::support::both_storages!(
    native_and_dapr_runtime_share_versions,
    native_watch_events_and_client_drop,
    dapr_transactions,
);

type Native = npb::state_store_client::StateStoreClient<Channel>;
type Dapr = rpb::dapr_client::DaprClient<Channel>;

/// Awaits `f`, failing the test with `what` if it takes longer than `WAIT`.
async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

async fn channel(env: &TestEnv) -> Channel {
    within(
        "a gRPC connection",
        Endpoint::from_shared(env.grpc()).unwrap().connect(),
    )
    .await
    .expect("the gRPC door accepts connections")
}

async fn clients(env: &TestEnv) -> (Native, Dapr) {
    let ch = channel(env).await;
    (Native::new(ch.clone()), Dapr::new(ch))
}

/// The RPC must fail with `code`, and its message must contain `text`.
#[track_caller]
fn expect_status<T: std::fmt::Debug>(r: Result<tonic::Response<T>, Status>, code: Code, text: &str) -> Status {
    match r {
        Ok(v) => panic!("expected {code:?} ({text:?}), got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "status {s:?}");
            assert!(
                s.message().contains(text),
                "message {:?} should contain {text:?}",
                s.message()
            );
            s
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn hlc(s: &str) -> Hlc {
    s.parse().unwrap_or_else(|_| panic!("{s:?} is not a version"))
}

/// A version string `ms` milliseconds from now (negative: in the past).
fn token_at(offset_ms: i64, counter: u32) -> String {
    let ms = now_ms().saturating_add_signed(offset_ms);
    format!("{ms:015}:{counter:05}:client")
}

// ---------------------------------------------------------------------------------------------
// statestore.v1.StateStore
// ---------------------------------------------------------------------------------------------

fn set_req(key: &[u8], value: &[u8]) -> npb::SetRequest {
    npb::SetRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..Default::default()
    }
}

async fn native_set(c: &mut Native, req: npb::SetRequest) -> npb::SetResponse {
    within("a Set answer", c.set(req)).await.expect("Set").into_inner()
}

async fn native_get(c: &mut Native, key: &[u8]) -> npb::GetResponse {
    within("a Get answer", c.get(npb::GetRequest { key: key.to_vec() }))
        .await
        .expect("Get")
        .into_inner()
}

async fn native_and_dapr_runtime_share_versions(storage: Storage) {
    let env = TestEnv::start_on(Broker::Embedded, storage, |_| {}).await;
    let mut native = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap();
    let mut dapr = rpb::dapr_client::DaprClient::connect(env.grpc()).await.unwrap();
    let set = native
        .set(npb::SetRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(set.applied);
    let got = dapr
        .get_state(rpb::GetStateRequest {
            store_name: "statestore".into(),
            key: "k".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.data, b"v");
    assert_eq!(got.etag, set.version);
    let err = dapr
        .save_state(rpb::SaveStateRequest {
            store_name: "statestore".into(),
            states: vec![common::StateItem {
                key: "k".into(),
                value: b"w".to_vec(),
                etag: Some(common::Etag {
                    value: "000000000000001:00000:x".into(),
                }),
                ..Default::default()
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    env.stop().await;
}

/// `if_version` on Set and Del: applied only at exactly that version, else ABORTED and nothing
/// changes; a malformed one or one combined with NX/NEX is INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_if_version_conditions_set_and_del() {
    let env = TestEnv::start(Broker::Embedded).await;
    let (mut c, _) = clients(&env).await;
    let v1 = native_set(&mut c, set_req(b"k", b"v1")).await.version;
    let at = |value: &[u8], version: &str| npb::SetRequest {
        if_version: version.to_owned(),
        ..set_req(b"k", value)
    };
    let s2 = native_set(&mut c, at(b"v2", &v1)).await;
    assert!(s2.applied);
    assert!(hlc(&s2.version) > hlc(&v1));
    expect_status(within("Set", c.set(at(b"v3", &v1))).await, Code::Aborted, "version");
    expect_status(
        within("Set", c.set(at(b"v3", "yesterday"))).await,
        Code::InvalidArgument,
        "malformed",
    );
    let nx = npb::SetRequest {
        condition: npb::SetCondition::Nx as i32,
        ..at(b"v3", &s2.version)
    };
    expect_status(within("Set", c.set(nx)).await, Code::InvalidArgument, "if_version");
    assert_eq!(native_get(&mut c, b"k").await.value, b"v2");
    let del = |version: &str| npb::DelRequest {
        key: b"k".to_vec(),
        if_version: version.to_owned(),
        ..Default::default()
    };
    expect_status(within("Del", c.del(del(&v1))).await, Code::Aborted, "version");
    let d = within("Del", c.del(del(&s2.version))).await.expect("Del").into_inner();
    assert!(d.deleted);
    expect_status(within("Del", c.del(del(&s2.version))).await, Code::Aborted, "version");
    env.stop().await;
}

/// Set: unconditional, NX, NEX, PX (ttl_ms, cleared by a later Set without it), the caller's
/// timestamp merged into the version, fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_set_conditions_ttl_timestamp_and_fencing() {
    let env = TestEnv::start(Broker::Embedded).await;
    let (mut c, _) = clients(&env).await;

    let s1 = native_set(&mut c, set_req(b"k", b"v1")).await;
    assert!(s1.applied);
    let v1 = hlc(&s1.version);

    // NX: only if absent. Not applied: nothing changes and the stored version comes back.
    let nx = |key: &[u8], value: &[u8]| npb::SetRequest {
        condition: npb::SetCondition::Nx as i32,
        ..set_req(key, value)
    };
    let r = native_set(&mut c, nx(b"k", b"other")).await;
    assert!(!r.applied, "NX on an existing key");
    assert_eq!(
        r.version, s1.version,
        "a Set that is not applied returns the stored version"
    );
    let g = native_get(&mut c, b"k").await;
    assert_eq!(
        (g.value.as_slice(), g.version.as_str()),
        (&b"v1"[..], s1.version.as_str())
    );
    let r = native_set(&mut c, nx(b"fresh", b"x")).await;
    assert!(r.applied, "NX on an absent key");

    // NEX: if absent, or if the stored value equals the new one.
    let nex = |key: &[u8], value: &[u8]| npb::SetRequest {
        condition: npb::SetCondition::Nex as i32,
        ..set_req(key, value)
    };
    let r = native_set(&mut c, nex(b"k", b"v1")).await;
    assert!(r.applied, "NEX with the stored value");
    let v2 = hlc(&r.version);
    assert!(v2 > v1, "{v2} > {v1}");
    let r = native_set(&mut c, nex(b"k", b"v2")).await;
    assert!(!r.applied, "NEX with another value");
    assert_eq!(hlc(&r.version), v2);
    let r = native_set(&mut c, nex(b"nex-new", b"v")).await;
    assert!(r.applied, "NEX on an absent key");
    expect_status(
        within(
            "Set",
            c.set(npb::SetRequest {
                condition: 42,
                ..set_req(b"k", b"v")
            }),
        )
        .await,
        Code::InvalidArgument,
        "unknown set condition",
    );

    // ttl_ms: an absolute expiry is reported; a Set without ttl clears it.
    let before = now_ms();
    native_set(
        &mut c,
        npb::SetRequest {
            ttl_ms: 60_000,
            ..set_req(b"ttl", b"t")
        },
    )
    .await;
    let g = native_get(&mut c, b"ttl").await;
    assert!(
        g.expires_at_ms >= before + 60_000 && g.expires_at_ms <= now_ms() + 60_000,
        "expires_at_ms {} for a 60 s ttl set at {before}",
        g.expires_at_ms
    );
    native_set(&mut c, set_req(b"ttl", b"t2")).await;
    assert_eq!(
        native_get(&mut c, b"ttl").await.expires_at_ms,
        0,
        "a Set without ttl clears it"
    );

    // timestamp: the caller's clock is merged in, so the version is later than it.
    for ts in [token_at(0, 999), token_at(5_000, 7)] {
        let r = native_set(
            &mut c,
            npb::SetRequest {
                timestamp: ts.clone(),
                ..set_req(b"ts", b"v")
            },
        )
        .await;
        assert!(hlc(&r.version) > hlc(&ts), "version {} after timestamp {ts}", r.version);
    }
    expect_status(
        within(
            "Set",
            c.set(npb::SetRequest {
                timestamp: token_at(3_600_000, 0),
                ..set_req(b"ts", b"v")
            }),
        )
        .await,
        Code::InvalidArgument,
        "the request timestamp is too far in the future",
    );

    // Fencing: a key set with a token needs an equal or higher one, on Set, Del and VDel.
    let token = token_at(0, 10);
    let lower = token_at(-1_000, 10);
    let higher = format!("{}:00011:client", &token[..15]);
    let fenced = |value: &[u8], t: &str| npb::SetRequest {
        fencing_token: t.to_owned(),
        ..set_req(b"fenced", value)
    };
    assert!(native_set(&mut c, fenced(b"f1", &token)).await.applied);
    expect_status(
        within("Set", c.set(set_req(b"fenced", b"none"))).await,
        Code::FailedPrecondition,
        "a fencing token is required for this request",
    );
    expect_status(
        within("Set", c.set(fenced(b"low", &lower))).await,
        Code::FailedPrecondition,
        "the request fencing token is a lower version than the fencing token protecting the resource",
    );
    assert!(native_set(&mut c, fenced(b"f2", &token)).await.applied, "equal token");
    assert!(native_set(&mut c, fenced(b"f3", &higher)).await.applied, "higher token");
    expect_status(
        within("Set", c.set(fenced(b"stale", &token))).await,
        Code::FailedPrecondition,
        "lower version",
    );
    expect_status(
        within(
            "Del",
            c.del(npb::DelRequest {
                key: b"fenced".to_vec(),
                ..Default::default()
            }),
        )
        .await,
        Code::FailedPrecondition,
        "a fencing token is required",
    );
    expect_status(
        within(
            "VDel",
            c.v_del(npb::VDelRequest {
                key: b"fenced".to_vec(),
                value: b"f3".to_vec(),
                fencing_token: lower.clone(),
            }),
        )
        .await,
        Code::FailedPrecondition,
        "lower version",
    );
    expect_status(
        within("Set", c.set(fenced(b"x", "not a token"))).await,
        Code::InvalidArgument,
        "malformed timestamp",
    );
    assert_eq!(
        native_get(&mut c, b"fenced").await.value,
        b"f3",
        "refused writes change nothing"
    );
    let d = within(
        "Del",
        c.del(npb::DelRequest {
            key: b"fenced".to_vec(),
            fencing_token: higher,
            ..Default::default()
        }),
    )
    .await
    .expect("Del with the token")
    .into_inner();
    assert!(d.deleted);
    env.stop().await;
}

/// Get, Del and VDel with every outcome; binary keys and values round-trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_get_del_vdel() {
    let env = TestEnv::start(Broker::Embedded).await;
    let (mut c, _) = clients(&env).await;
    let key: &[u8] = b"bin\x00\xff\r\nkey";
    let value: &[u8] = b"\x00\xff$3\r\nvalue";

    let miss = native_get(&mut c, key).await;
    assert_eq!(miss, npb::GetResponse::default(), "a miss: not found, no version");

    let s = native_set(&mut c, set_req(key, value)).await;
    let g = native_get(&mut c, key).await;
    assert!(g.found);
    assert_eq!(
        (g.value.as_slice(), g.version.as_str(), g.expires_at_ms),
        (value, s.version.as_str(), 0)
    );

    let d = within(
        "Del",
        c.del(npb::DelRequest {
            key: key.to_vec(),
            ..Default::default()
        }),
    )
    .await
    .expect("Del")
    .into_inner();
    assert!(d.deleted);
    assert!(hlc(&d.version) > hlc(&s.version), "the deletion gets a new version");
    assert!(!native_get(&mut c, key).await.found);
    let d = within(
        "Del",
        c.del(npb::DelRequest {
            key: key.to_vec(),
            ..Default::default()
        }),
    )
    .await
    .expect("Del")
    .into_inner();
    assert_eq!(d, npb::DelResponse::default(), "Del of a missing key");

    let vdel = |value: &[u8]| npb::VDelRequest {
        key: b"vk".to_vec(),
        value: value.to_vec(),
        ..Default::default()
    };
    let r = within("VDel", c.v_del(vdel(b"keep"))).await.expect("VDel").into_inner();
    assert_eq!(r.outcome(), npb::DeleteOutcome::Absent);
    assert_eq!(r.version, "");
    let s = native_set(&mut c, set_req(b"vk", b"keep")).await;
    let r = within("VDel", c.v_del(vdel(b"other")))
        .await
        .expect("VDel")
        .into_inner();
    assert_eq!(r.outcome(), npb::DeleteOutcome::ValueMismatch);
    assert_eq!(r.version, s.version, "a mismatch reports the stored version");
    assert_eq!(native_get(&mut c, b"vk").await.value, b"keep");
    let r = within("VDel", c.v_del(vdel(b"keep"))).await.expect("VDel").into_inner();
    assert_eq!(r.outcome(), npb::DeleteOutcome::Deleted);
    assert!(hlc(&r.version) > hlc(&s.version));
    assert!(!native_get(&mut c, b"vk").await.found);
    env.stop().await;
}

/// Scan pages through every matching key exactly once with continuation tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_scan_pages() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.limits.scan_page = 2).await;
    let (mut c, _) = clients(&env).await;
    let mut want = BTreeSet::new();
    for i in 0..7 {
        let k = format!("scan/{i}").into_bytes();
        native_set(&mut c, set_req(&k, b"v")).await;
        want.insert(k);
    }
    native_set(&mut c, set_req(b"other", b"v")).await;

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = within(
            "Scan",
            c.scan(npb::ScanRequest {
                pattern: "scan/*".into(),
                continuation_token: token.clone(),
            }),
        )
        .await
        .expect("Scan")
        .into_inner();
        pages += 1;
        assert!(pages <= 20, "scan does not end");
        seen.extend(page.keys);
        if page.continuation_token.is_empty() {
            break;
        }
        token = page.continuation_token;
    }
    assert!(pages >= 4, "8 keys at 2 per page take at least 4 pages, took {pages}");
    assert_eq!(seen.len(), want.len(), "no key twice: {seen:?}");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), want);

    expect_status(
        within(
            "Scan",
            c.scan(npb::ScanRequest {
                pattern: "*".into(),
                continuation_token: "not hex".into(),
            }),
        )
        .await,
        Code::InvalidArgument,
        "syntax error",
    );
    env.stop().await;
}

async fn next_event(s: &mut tonic::Streaming<npb::WatchEvent>) -> npb::WatchEvent {
    within("a watch event", s.message())
        .await
        .expect("the watch stream has no error")
        .expect("the watch stream is open")
}

#[track_caller]
fn assert_event(e: &npb::WatchEvent, key: &[u8], kind: npb::watch_event::Kind, value: &[u8]) {
    assert_eq!(
        (e.key.as_slice(), e.kind(), e.value.as_slice()),
        (key, kind, value),
        "event {e:?}"
    );
}

async fn watch(c: &mut Native, keys: &[&[u8]], patterns: &[&str]) -> tonic::Streaming<npb::WatchEvent> {
    within(
        "Watch",
        c.watch(npb::WatchRequest {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        }),
    )
    .await
    .expect("Watch")
    .into_inner()
}

/// Watch: set, delete and expiry events with the versions the writers were told, filtered by
/// keys and patterns; a dropped stream leaves the service (and the connection) serving.
async fn native_watch_events_and_client_drop(storage: Storage) {
    use npb::watch_event::Kind;
    let env = TestEnv::start_on(Broker::Embedded, storage, |_| {}).await;
    let (mut c, _) = clients(&env).await;

    expect_status(
        within(
            "Watch",
            c.watch(npb::WatchRequest {
                patterns: vec!["[".into()],
                ..Default::default()
            }),
        )
        .await,
        Code::InvalidArgument,
        "pattern",
    );

    let mut all = watch(&mut c, &[], &[]).await;
    let mut some = watch(&mut c, &[b"w1"], &["p/*"]).await;

    native_set(&mut c, set_req(b"unwatched", b"x")).await;
    let s1 = native_set(&mut c, set_req(b"w1", b"one")).await;
    let s2 = native_set(&mut c, set_req(b"p/a", b"two")).await;
    let d1 = within(
        "Del",
        c.del(npb::DelRequest {
            key: b"w1".to_vec(),
            ..Default::default()
        }),
    )
    .await
    .expect("Del")
    .into_inner();
    let s3 = native_set(
        &mut c,
        npb::SetRequest {
            ttl_ms: 60_000,
            ..set_req(b"p/ttl", b"brief")
        },
    )
    .await;
    // The minute passes on the service's clock, at once.
    env.advance(60_000);

    let e = next_event(&mut all).await;
    assert_event(&e, b"unwatched", Kind::Set, b"x");
    for stream in [&mut all, &mut some] {
        let e = next_event(stream).await;
        assert_event(&e, b"w1", Kind::Set, b"one");
        assert_eq!(e.version, s1.version);
        let e = next_event(stream).await;
        assert_event(&e, b"p/a", Kind::Set, b"two");
        assert_eq!(e.version, s2.version);
        let e = next_event(stream).await;
        assert_event(&e, b"w1", Kind::Delete, b"");
        assert_eq!(e.version, d1.version);
        let e = next_event(stream).await;
        assert_event(&e, b"p/ttl", Kind::Set, b"brief");
        assert_eq!(e.version, s3.version);
        // The expiry driver removes the key once its deadline passed; watchers are told.
        let e = next_event(stream).await;
        assert_event(&e, b"p/ttl", Kind::Expire, b"");
        assert!(
            hlc(&e.version) > hlc(&s3.version),
            "expiry version {} after {}",
            e.version,
            s3.version
        );
    }
    assert!(!native_get(&mut c, b"p/ttl").await.found);

    // The client drops its streams: the service keeps serving on the same connection, and
    // new watchers get events. Repeat to show dropped watchers do not pile up into trouble.
    drop(all);
    drop(some);
    for round in 0..20 {
        let key = format!("after-drop/{round}").into_bytes();
        let mut w = watch(&mut c, &[&key], &[]).await;
        let s = native_set(&mut c, set_req(&key, b"v")).await;
        let e = next_event(&mut w).await;
        assert_event(&e, &key, Kind::Set, b"v");
        assert_eq!(e.version, s.version);
        drop(w);
        assert!(native_get(&mut c, &key).await.found);
    }
    // A fresh connection works too.
    let (mut fresh, _) = clients(&env).await;
    assert!(native_get(&mut fresh, b"after-drop/0").await.found);
    env.stop().await;
}

/// Engine errors are status codes whose message is the MQTT error text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_errors_carry_the_mqtt_text() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.limits.max_keys = Some(1)).await;
    let (mut c, mut dapr) = clients(&env).await;

    expect_status(
        within("Set", c.set(set_req(b"", b"v"))).await,
        Code::InvalidArgument,
        "the key length is zero",
    );
    expect_status(
        within("Get", c.get(npb::GetRequest { key: Vec::new() })).await,
        Code::InvalidArgument,
        "the key length is zero",
    );
    expect_status(
        within("Del", c.del(npb::DelRequest::default())).await,
        Code::InvalidArgument,
        "the key length is zero",
    );
    expect_status(
        within("VDel", c.v_del(npb::VDelRequest::default())).await,
        Code::InvalidArgument,
        "the key length is zero",
    );
    for bad in ["garbage", "123", "000000000000001:00000"] {
        expect_status(
            within(
                "Set",
                c.set(npb::SetRequest {
                    timestamp: bad.into(),
                    ..set_req(b"k", b"v")
                }),
            )
            .await,
            Code::InvalidArgument,
            "malformed timestamp",
        );
    }
    expect_status(
        within(
            "Set",
            c.set(npb::SetRequest {
                fencing_token: token_at(3_600_000, 0),
                ..set_req(b"k", b"v")
            }),
        )
        .await,
        Code::InvalidArgument,
        "the request fencing token timestamp is too far in the future",
    );

    // Quota: one key may exist; overwriting it is fine; a second key is refused everywhere.
    native_set(&mut c, set_req(b"only", b"1")).await;
    native_set(&mut c, set_req(b"only", b"2")).await;
    expect_status(
        within("Set", c.set(set_req(b"second", b"v"))).await,
        Code::ResourceExhausted,
        "the quota has been exceeded",
    );
    expect_status(
        within("SaveState", dapr.save_state(save_req(vec![item("second", b"v")]))).await,
        Code::ResourceExhausted,
        "the quota has been exceeded",
    );
    expect_status(
        within(
            "ExecuteStateTransaction",
            dapr.execute_state_transaction(tx_req(vec![upsert("second", b"v")])),
        )
        .await,
        Code::Internal,
        "the quota has been exceeded",
    );
    assert!(!native_get(&mut c, b"second").await.found);
    env.stop().await;
}

// ---------------------------------------------------------------------------------------------
// dapr.proto.runtime.v1.Dapr
// ---------------------------------------------------------------------------------------------

fn item(key: &str, value: &[u8]) -> common::StateItem {
    common::StateItem {
        key: key.into(),
        value: value.to_vec(),
        ..Default::default()
    }
}

fn with_etag(mut i: common::StateItem, etag: &str) -> common::StateItem {
    i.etag = Some(common::Etag { value: etag.into() });
    i
}

fn with_meta(mut i: common::StateItem, k: &str, v: &str) -> common::StateItem {
    i.metadata.insert(k.into(), v.into());
    i
}

fn first_write(mut i: common::StateItem) -> common::StateItem {
    i.options = Some(common::StateOptions {
        concurrency: common::state_options::StateConcurrency::ConcurrencyFirstWrite as i32,
        consistency: common::state_options::StateConsistency::ConsistencyStrong as i32,
    });
    i
}

fn save_req(states: Vec<common::StateItem>) -> rpb::SaveStateRequest {
    rpb::SaveStateRequest {
        store_name: STORE.into(),
        states,
    }
}

fn upsert(key: &str, value: &[u8]) -> rpb::TransactionalStateOperation {
    rpb::TransactionalStateOperation {
        operation_type: "upsert".into(),
        request: Some(item(key, value)),
    }
}

fn delete_op(key: &str) -> rpb::TransactionalStateOperation {
    rpb::TransactionalStateOperation {
        operation_type: "delete".into(),
        request: Some(item(key, b"")),
    }
}

fn tx_req(operations: Vec<rpb::TransactionalStateOperation>) -> rpb::ExecuteStateTransactionRequest {
    rpb::ExecuteStateTransactionRequest {
        store_name: STORE.into(),
        operations,
        metadata: HashMap::new(),
    }
}

fn get_req(key: &str) -> rpb::GetStateRequest {
    rpb::GetStateRequest {
        store_name: STORE.into(),
        key: key.into(),
        ..Default::default()
    }
}

fn del_req(key: &str, etag: Option<&str>) -> rpb::DeleteStateRequest {
    rpb::DeleteStateRequest {
        store_name: STORE.into(),
        key: key.into(),
        etag: etag.map(|e| common::Etag { value: e.into() }),
        ..Default::default()
    }
}

async fn get_state(d: &mut Dapr, key: &str) -> rpb::GetStateResponse {
    within("GetState", d.get_state(get_req(key)))
        .await
        .expect("GetState")
        .into_inner()
}

async fn save(d: &mut Dapr, states: Vec<common::StateItem>) {
    within("SaveState", d.save_state(save_req(states)))
        .await
        .expect("SaveState");
}

/// The `ttlExpireTime` metadata of a read, as ms since the epoch.
fn ttl_expire_ms(meta: &HashMap<String, String>) -> Option<u64> {
    meta.get("ttlExpireTime").map(|t| {
        humantime::parse_rfc3339(t)
            .unwrap_or_else(|e| panic!("ttlExpireTime {t:?}: {e}"))
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    })
}

/// GetState, SaveState (ETags, first-write, TTL, JSON compaction, partial saves) and DeleteState.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_get_save_delete() {
    let env = TestEnv::start(Broker::Embedded).await;
    let (_, mut d) = clients(&env).await;

    // A missing key is OK with empty data and etag.
    assert_eq!(get_state(&mut d, "missing").await, rpb::GetStateResponse::default());

    // Bytes are stored verbatim.
    save(&mut d, vec![item("raw", b"\x00\xffraw")]).await;
    let g = get_state(&mut d, "raw").await;
    assert_eq!(g.data, b"\x00\xffraw");
    let e1 = g.etag.clone();
    hlc(&e1);
    assert!(g.metadata.is_empty(), "no TTL, no metadata: {:?}", g.metadata);

    // ETags: the current one applies and changes it; a stale one is ABORTED; a bad one is invalid.
    save(&mut d, vec![with_etag(item("raw", b"two"), &e1)]).await;
    let e2 = get_state(&mut d, "raw").await.etag;
    assert!(hlc(&e2) > hlc(&e1));
    expect_status(
        within(
            "SaveState",
            d.save_state(save_req(vec![with_etag(item("raw", b"x"), &e1)])),
        )
        .await,
        Code::Aborted,
        "etag mismatch",
    );
    expect_status(
        within(
            "SaveState",
            d.save_state(save_req(vec![with_etag(item("raw", b"x"), "not-an-etag")])),
        )
        .await,
        Code::InvalidArgument,
        "invalid etag",
    );
    expect_status(
        within(
            "SaveState",
            d.save_state(save_req(vec![with_etag(item("nokey", b"x"), &e2)])),
        )
        .await,
        Code::Aborted,
        "etag mismatch",
    );
    assert_eq!(
        get_state(&mut d, "raw").await.data,
        b"two",
        "refused saves change nothing"
    );
    assert_eq!(get_state(&mut d, "nokey").await.etag, "");

    // First-write: without an etag (absent or empty) only on a new key.
    save(&mut d, vec![first_write(item("fw", b"1"))]).await;
    expect_status(
        within("SaveState", d.save_state(save_req(vec![first_write(item("fw", b"2"))]))).await,
        Code::Aborted,
        "first-write",
    );
    expect_status(
        within(
            "SaveState",
            d.save_state(save_req(vec![first_write(with_etag(item("fw", b"2"), ""))])),
        )
        .await,
        Code::Aborted,
        "first-write",
    );
    let fw = get_state(&mut d, "fw").await;
    save(&mut d, vec![first_write(with_etag(item("fw", b"3"), &fw.etag))]).await;
    assert_eq!(
        get_state(&mut d, "fw").await.data,
        b"3",
        "first-write with the current etag"
    );

    // TTL: ttlInSeconds sets an expiry reported as ttlExpireTime; -1 or none clears it.
    let before = now_ms();
    save(&mut d, vec![with_meta(item("ttl", b"t"), "ttlInSeconds", "100")]).await;
    let exp = ttl_expire_ms(&get_state(&mut d, "ttl").await.metadata).expect("ttlExpireTime");
    // RFC 3339 with whole seconds: the deadline is truncated to the second.
    assert!(
        exp + 1_000 > before + 100_000 && exp <= now_ms() + 100_000,
        "ttlExpireTime {exp} for 100 s from {before}"
    );
    save(&mut d, vec![with_meta(item("ttl", b"t"), "ttlInSeconds", "-1")]).await;
    assert_eq!(
        ttl_expire_ms(&get_state(&mut d, "ttl").await.metadata),
        None,
        "-1: no expiry"
    );
    save(&mut d, vec![with_meta(item("ttl", b"t"), "ttlInSeconds", "100")]).await;
    save(&mut d, vec![item("ttl", b"t")]).await;
    assert_eq!(
        ttl_expire_ms(&get_state(&mut d, "ttl").await.metadata),
        None,
        "a save without TTL clears it"
    );
    // Bad syntax is the Dapr layer's answer; a TTL out of range is the engine's (one rule).
    for (bad, says) in [("soon", "ttlInSeconds"), ("1.5", "ttlInSeconds"), ("0", "time to live")] {
        expect_status(
            within(
                "SaveState",
                d.save_state(save_req(vec![with_meta(item("ttl-bad", b"t"), "ttlInSeconds", bad)])),
            )
            .await,
            Code::InvalidArgument,
            says,
        );
    }
    assert_eq!(
        get_state(&mut d, "ttl-bad").await.etag,
        "",
        "a refused TTL writes nothing"
    );

    // contentType=application/json: the value is parsed and stored as compact JSON.
    save(
        &mut d,
        vec![with_meta(
            item("json", b" { \"a\" : 1 ,\n \"b\" : [ true , null ] } "),
            "contentType",
            "application/json",
        )],
    )
    .await;
    assert_eq!(get_state(&mut d, "json").await.data, br#"{"a":1,"b":[true,null]}"#);
    expect_status(
        within(
            "SaveState",
            d.save_state(save_req(vec![with_meta(
                item("json-bad", b"{nope"),
                "contentType",
                "application/json",
            )])),
        )
        .await,
        Code::InvalidArgument,
        "application/json",
    );
    save(&mut d, vec![item("notjson", b" { \"a\" : 1 } ")]).await;
    assert_eq!(
        get_state(&mut d, "notjson").await.data,
        b" { \"a\" : 1 } ",
        "without contentType the bytes are kept as they are"
    );

    // A save of several items: independent writes, the good ones land, the first error returns.
    let cur = get_state(&mut d, "raw").await.etag;
    expect_status(
        within(
            "SaveState",
            d.save_state(save_req(vec![
                item("multi-1", b"1"),
                with_etag(item("raw", b"stale"), &e1),
                with_etag(item("raw-unchanged", b"x"), &cur),
                item("multi-2", b"2"),
            ])),
        )
        .await,
        Code::Aborted,
        "etag mismatch",
    );
    assert_eq!(get_state(&mut d, "multi-1").await.data, b"1");
    assert_eq!(get_state(&mut d, "multi-2").await.data, b"2");
    assert_eq!(get_state(&mut d, "raw").await.etag, cur);

    // DeleteState: stale etag ABORTED, invalid INVALID_ARGUMENT, current deletes, a missing key
    // without etag is fine, first-write without etag on an existing key is ABORTED.
    expect_status(
        within("DeleteState", d.delete_state(del_req("raw", Some(&e1)))).await,
        Code::Aborted,
        "etag mismatch",
    );
    expect_status(
        within("DeleteState", d.delete_state(del_req("raw", Some("garbage")))).await,
        Code::InvalidArgument,
        "invalid etag",
    );
    within("DeleteState", d.delete_state(del_req("raw", Some(&cur))))
        .await
        .expect("DeleteState with the current etag");
    assert_eq!(get_state(&mut d, "raw").await, rpb::GetStateResponse::default());
    within("DeleteState", d.delete_state(del_req("raw", None)))
        .await
        .expect("DeleteState of a missing key");
    let mut fw_del = del_req("fw", None);
    fw_del.options = first_write(item("", b"")).options;
    expect_status(
        within("DeleteState", d.delete_state(fw_del)).await,
        Code::Aborted,
        "first-write",
    );
    within("DeleteState", d.delete_state(del_req("fw", None)))
        .await
        .expect("DeleteState without etag");
    assert_eq!(get_state(&mut d, "fw").await.etag, "");
    env.stop().await;
}

/// GetBulkState keeps the request order; DeleteBulkState deletes independently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_bulk_get_and_bulk_delete() {
    let env = TestEnv::start(Broker::Embedded).await;
    let (_, mut d) = clients(&env).await;
    save(
        &mut d,
        vec![
            item("a", b"1"),
            with_meta(item("b", b"2"), "ttlInSeconds", "100"),
            item("c", b"3"),
        ],
    )
    .await;
    let b = get_state(&mut d, "b").await;
    let bulk = within(
        "GetBulkState",
        d.get_bulk_state(rpb::GetBulkStateRequest {
            store_name: STORE.into(),
            keys: vec!["b".into(), "missing".into(), "a".into()],
            parallelism: 4,
            metadata: HashMap::new(),
        }),
    )
    .await
    .expect("GetBulkState")
    .into_inner()
    .items;
    assert_eq!(
        bulk.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["b", "missing", "a"]
    );
    // A malformed key fails the whole request, as daprd answers.
    expect_status(
        within(
            "GetBulkState",
            d.get_bulk_state(rpb::GetBulkStateRequest {
                store_name: STORE.into(),
                keys: vec!["b".into(), "bad||key".into()],
                parallelism: 1,
                metadata: HashMap::new(),
            }),
        )
        .await,
        Code::InvalidArgument,
        "||",
    );
    assert_eq!(
        (bulk[0].data.as_slice(), bulk[0].etag.as_str()),
        (&b"2"[..], b.etag.as_str())
    );
    assert!(
        ttl_expire_ms(&bulk[0].metadata).is_some(),
        "bulk items report ttlExpireTime"
    );
    assert_eq!(
        bulk[1],
        rpb::BulkStateItem {
            key: "missing".into(),
            ..Default::default()
        },
        "a missing key is its key alone"
    );
    assert_eq!(bulk[2].data, b"1");
    assert!(bulk[2].error.is_empty() && bulk[2].metadata.is_empty());

    let a = get_state(&mut d, "a").await.etag;
    within(
        "DeleteBulkState",
        d.delete_bulk_state(rpb::DeleteBulkStateRequest {
            store_name: STORE.into(),
            states: vec![with_etag(item("a", b""), &a), item("never", b"")],
        }),
    )
    .await
    .expect("DeleteBulkState");
    assert_eq!(get_state(&mut d, "a").await.etag, "");
    // A stale etag fails its item; the others are still deleted.
    expect_status(
        within(
            "DeleteBulkState",
            d.delete_bulk_state(rpb::DeleteBulkStateRequest {
                store_name: STORE.into(),
                states: vec![with_etag(item("b", b""), &a), item("c", b"")],
            }),
        )
        .await,
        Code::Aborted,
        "etag mismatch",
    );
    assert_eq!(get_state(&mut d, "c").await.etag, "");
    assert_eq!(get_state(&mut d, "b").await.etag, b.etag);
    expect_status(
        within(
            "DeleteBulkState",
            d.delete_bulk_state(rpb::DeleteBulkStateRequest {
                store_name: STORE.into(),
                states: vec![with_etag(item("b", b""), "bad etag")],
            }),
        )
        .await,
        Code::InvalidArgument,
        "invalid etag",
    );
    env.stop().await;
}

/// ExecuteStateTransaction: in order, all or nothing, INTERNAL on any conflict.
async fn dapr_transactions(storage: Storage) {
    let env = TestEnv::start_on(Broker::Embedded, storage, |c| c.dapr.max_transaction_ops = 4).await;
    let (_, mut d) = clients(&env).await;
    save(&mut d, vec![item("t1", b"1"), item("t2", b"2")]).await;
    within(
        "ExecuteStateTransaction",
        d.execute_state_transaction(tx_req(vec![
            delete_op("t1"),
            upsert("t2", b"22"),
            delete_op("t2"),
            upsert("t3", b"3"),
        ])),
    )
    .await
    .expect("transaction");
    assert_eq!(get_state(&mut d, "t1").await.etag, "");
    assert_eq!(get_state(&mut d, "t2").await.etag, "");
    let t3 = get_state(&mut d, "t3").await;
    assert_eq!(t3.data, b"3");

    // Deleting a missing key inside a transaction succeeds; metadata applies to every item.
    let mut req = tx_req(vec![delete_op("never"), upsert("t4", b"4")]);
    req.metadata.insert("ttlInSeconds".into(), "100".into());
    within("ExecuteStateTransaction", d.execute_state_transaction(req))
        .await
        .expect("transaction");
    assert!(ttl_expire_ms(&get_state(&mut d, "t4").await.metadata).is_some());

    // Conflicts: nothing applied, INTERNAL.
    let stale = rpb::TransactionalStateOperation {
        operation_type: "upsert".into(),
        request: Some(with_etag(item("t3", b"33"), "000000000000001:00000:x")),
    };
    expect_status(
        within(
            "ExecuteStateTransaction",
            d.execute_state_transaction(tx_req(vec![upsert("t5", b"5"), delete_op("t4"), stale])),
        )
        .await,
        Code::Internal,
        "etag mismatch",
    );
    let fw = rpb::TransactionalStateOperation {
        operation_type: "upsert".into(),
        request: Some(first_write(item("t3", b"33"))),
    };
    expect_status(
        within(
            "ExecuteStateTransaction",
            d.execute_state_transaction(tx_req(vec![upsert("t5", b"5"), fw])),
        )
        .await,
        Code::Internal,
        "",
    );
    assert_eq!(
        get_state(&mut d, "t5").await.etag,
        "",
        "a failed transaction applies nothing"
    );
    assert_eq!(get_state(&mut d, "t4").await.data, b"4");
    assert_eq!(get_state(&mut d, "t3").await.etag, t3.etag);

    // Malformed transactions are INVALID_ARGUMENT.
    let merge = rpb::TransactionalStateOperation {
        operation_type: "merge".into(),
        request: Some(item("t6", b"6")),
    };
    expect_status(
        within(
            "ExecuteStateTransaction",
            d.execute_state_transaction(tx_req(vec![merge])),
        )
        .await,
        Code::InvalidArgument,
        "merge",
    );
    let bad_etag = rpb::TransactionalStateOperation {
        operation_type: "upsert".into(),
        request: Some(with_etag(item("t6", b"6"), "nope")),
    };
    expect_status(
        within(
            "ExecuteStateTransaction",
            d.execute_state_transaction(tx_req(vec![bad_etag])),
        )
        .await,
        Code::InvalidArgument,
        "invalid etag",
    );
    let no_request = rpb::TransactionalStateOperation {
        operation_type: "upsert".into(),
        request: None,
    };
    expect_status(
        within(
            "ExecuteStateTransaction",
            d.execute_state_transaction(tx_req(vec![no_request])),
        )
        .await,
        Code::InvalidArgument,
        "no request",
    );
    let too_many = (0..5).map(|i| upsert(&format!("many{i}"), b"x")).collect();
    expect_status(
        within("ExecuteStateTransaction", d.execute_state_transaction(tx_req(too_many))).await,
        Code::InvalidArgument,
        "exceeds the maximum of 4",
    );
    assert_eq!(get_state(&mut d, "t6").await.etag, "");
    assert_eq!(get_state(&mut d, "many0").await.etag, "");
    env.stop().await;
}

/// QueryStateAlpha1: filter, sort, paging with a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_query() {
    let env = TestEnv::start(Broker::Embedded).await;
    let (_, mut d) = clients(&env).await;
    let people: Vec<_> = (0..5)
        .map(|i| {
            let state = if i % 2 == 0 { "WA" } else { "CA" };
            item(
                &format!("p{i}"),
                format!(r#"{{"id":{i},"person":{{"state":"{state}"}}}}"#).as_bytes(),
            )
        })
        .collect();
    save(&mut d, people).await;
    let query = |q: serde_json::Value| rpb::QueryStateRequest {
        store_name: STORE.into(),
        query: q.to_string(),
        metadata: HashMap::new(),
    };
    let q = serde_json::json!({
        "filter": {"EQ": {"person.state": "WA"}},
        "sort": [{"key": "id", "order": "DESC"}],
        "page": {"limit": 2},
    });
    let page = within("QueryStateAlpha1", d.query_state_alpha1(query(q.clone())))
        .await
        .expect("query")
        .into_inner();
    assert_eq!(
        page.results.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["p4", "p2"]
    );
    assert_eq!(page.results[0].data, br#"{"id":4,"person":{"state":"WA"}}"#);
    assert_eq!(page.results[0].etag, get_state(&mut d, "p4").await.etag);
    assert!(!page.token.is_empty());
    let mut q2 = q.clone();
    q2["page"]["token"] = page.token.clone().into();
    let page = within("QueryStateAlpha1", d.query_state_alpha1(query(q2)))
        .await
        .expect("query")
        .into_inner();
    assert_eq!(page.results.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["p0"]);
    assert_eq!(page.token, "");

    let q = serde_json::json!({"filter": {"OR": [{"EQ": {"id": 1}}, {"IN": {"id": [3, 9]}}]}, "sort": [{"key": "id"}]});
    let page = within("QueryStateAlpha1", d.query_state_alpha1(query(q)))
        .await
        .expect("query")
        .into_inner();
    assert_eq!(
        page.results.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["p1", "p3"]
    );
    let page = within(
        "QueryStateAlpha1",
        d.query_state_alpha1(query(serde_json::json!({"filter": {"EQ": {"id": 42}}}))),
    )
    .await
    .expect("query")
    .into_inner();
    assert!(page.results.is_empty() && page.token.is_empty());

    let mut bad = query(serde_json::Value::Null);
    bad.query = "{not json".into();
    expect_status(
        within("QueryStateAlpha1", d.query_state_alpha1(bad)).await,
        Code::InvalidArgument,
        "failed parsing query",
    );
    expect_status(
        within(
            "QueryStateAlpha1",
            d.query_state_alpha1(query(serde_json::json!({"filter": {"LIKE": {"id": 1}}}))),
        )
        .await,
        Code::InvalidArgument,
        "failed parsing query",
    );
    env.stop().await;
}

/// GetMetadata lists the configured stores; a `name` prefix keeps a store's keys apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_metadata_and_store_prefixes() {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.dapr.stores =
            stategate::dapr::Stores::new(vec!["statestore".parse().unwrap(), "orders=name".parse().unwrap()])
    })
    .await;
    let (mut n, mut d) = clients(&env).await;
    let m = within("GetMetadata", d.get_metadata(rpb::GetMetadataRequest {}))
        .await
        .expect("GetMetadata")
        .into_inner();
    assert_eq!(m.id, "stategate");
    assert!(!m.runtime_version.is_empty());
    let names: Vec<_> = m.registered_components.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["statestore", "orders", "lockstore", "configstore"]);
    for c in &m.registered_components[..2] {
        assert_eq!((c.r#type.as_str(), c.version.as_str()), ("state.stategate", "v1"));
        assert_eq!(c.capabilities, ["ETAG", "TRANSACTIONAL", "TTL", "QUERY_API"]);
    }
    assert_eq!(m.registered_components[2].r#type, "lock.stategate");
    assert_eq!(m.registered_components[3].r#type, "configuration.stategate");

    let mut req = save_req(vec![item("k", b"order")]);
    req.store_name = "orders".into();
    within("SaveState", d.save_state(req)).await.expect("SaveState");
    assert_eq!(
        get_state(&mut d, "k").await.etag,
        "",
        "the default store does not see it"
    );
    let mut g = get_req("k");
    g.store_name = "orders".into();
    let got = within("GetState", d.get_state(g)).await.expect("GetState").into_inner();
    assert_eq!(got.data, b"order");
    let raw = native_get(&mut n, b"orders||k").await;
    assert_eq!(
        (raw.value.as_slice(), raw.version.as_str()),
        (&b"order"[..], got.etag.as_str()),
        "the engine key is `orders||k`"
    );
    env.stop().await;
}

/// Status codes: unknown store, empty key, malformed key, bad options; and UNIMPLEMENTED for
/// methods stategate does not declare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_error_codes_and_undeclared_methods() {
    let env = TestEnv::start(Broker::Embedded).await;
    let ch = channel(&env).await;
    let mut d = Dapr::new(ch.clone());
    let nostore = "state store nostore is not found";

    let mut g = get_req("k");
    g.store_name = "nostore".into();
    expect_status(within("GetState", d.get_state(g)).await, Code::InvalidArgument, nostore);
    let mut s = save_req(vec![item("k", b"v")]);
    s.store_name = "nostore".into();
    expect_status(
        within("SaveState", d.save_state(s)).await,
        Code::InvalidArgument,
        nostore,
    );
    let mut del = del_req("k", None);
    del.store_name = "nostore".into();
    expect_status(
        within("DeleteState", d.delete_state(del)).await,
        Code::InvalidArgument,
        nostore,
    );
    let bulk = rpb::GetBulkStateRequest {
        store_name: "nostore".into(),
        keys: vec!["k".into()],
        ..Default::default()
    };
    expect_status(
        within("GetBulkState", d.get_bulk_state(bulk)).await,
        Code::InvalidArgument,
        nostore,
    );
    let bulk_del = rpb::DeleteBulkStateRequest {
        store_name: "nostore".into(),
        states: vec![item("k", b"")],
    };
    expect_status(
        within("DeleteBulkState", d.delete_bulk_state(bulk_del)).await,
        Code::InvalidArgument,
        nostore,
    );
    let mut tx = tx_req(vec![upsert("k", b"v")]);
    tx.store_name = "nostore".into();
    expect_status(
        within("ExecuteStateTransaction", d.execute_state_transaction(tx)).await,
        Code::InvalidArgument,
        nostore,
    );
    let q = rpb::QueryStateRequest {
        store_name: "nostore".into(),
        query: "{}".into(),
        metadata: HashMap::new(),
    };
    expect_status(
        within("QueryStateAlpha1", d.query_state_alpha1(q)).await,
        Code::InvalidArgument,
        nostore,
    );

    // Empty and `||` keys.
    for key in ["", "a||b"] {
        let what = if key.is_empty() { "empty" } else { "||" };
        expect_status(
            within("GetState", d.get_state(get_req(key))).await,
            Code::InvalidArgument,
            what,
        );
        expect_status(
            within("SaveState", d.save_state(save_req(vec![item(key, b"v")]))).await,
            Code::InvalidArgument,
            what,
        );
        expect_status(
            within("DeleteState", d.delete_state(del_req(key, None))).await,
            Code::InvalidArgument,
            what,
        );
        expect_status(
            within(
                "ExecuteStateTransaction",
                d.execute_state_transaction(tx_req(vec![upsert(key, b"v")])),
            )
            .await,
            Code::InvalidArgument,
            what,
        );
    }
    // Enum values the proto does not define.
    let mut bad_opts = item("k", b"v");
    bad_opts.options = Some(common::StateOptions {
        concurrency: 9,
        consistency: 0,
    });
    expect_status(
        within("SaveState", d.save_state(save_req(vec![bad_opts]))).await,
        Code::InvalidArgument,
        "concurrency",
    );
    let mut g = get_req("k");
    g.consistency = 9;
    expect_status(
        within("GetState", d.get_state(g)).await,
        Code::InvalidArgument,
        "consistency",
    );

    // Methods stategate does not declare, on the Dapr service and on an unknown service.
    for path in [
        "/dapr.proto.runtime.v1.Dapr/PublishEvent",
        "/dapr.proto.runtime.v1.Dapr/InvokeService",
        "/no.such.v1.Service/Method",
    ] {
        let mut grpc = tonic::client::Grpc::new(ch.clone());
        within("the channel to be ready", grpc.ready()).await.expect("ready");
        let r: Result<tonic::Response<()>, Status> = within(
            path,
            grpc.unary(
                tonic::Request::new(()),
                tonic::codegen::http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::<(), ()>::default(),
            ),
        )
        .await;
        expect_status(r, Code::Unimplemented, "");
    }
    // The connection still serves declared methods.
    assert_eq!(get_state(&mut d, "k").await.etag, "");
    env.stop().await;
}

/// With an API token configured, every state RPC needs `dapr-api-token`; health and
/// reflection stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_token_guards_state_rpcs() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.http.api_token = Some("s3cret".into())).await;
    let ch = channel(&env).await;
    let (mut n, mut d) = (Native::new(ch.clone()), Dapr::new(ch.clone()));
    let with_token = |token: Option<&str>| {
        let mut r = tonic::Request::new(get_req("k"));
        if let Some(t) = token {
            r.metadata_mut().insert("dapr-api-token", t.parse().unwrap());
        }
        r
    };
    for token in [None, Some("wrong"), Some("")] {
        expect_status(
            within("GetState", d.get_state(with_token(token))).await,
            Code::Unauthenticated,
            "invalid api token",
        );
    }
    expect_status(
        within("GetMetadata", d.get_metadata(rpb::GetMetadataRequest {})).await,
        Code::Unauthenticated,
        "invalid api token",
    );
    expect_status(
        within("SaveState", d.save_state(save_req(vec![item("k", b"v")]))).await,
        Code::Unauthenticated,
        "invalid api token",
    );
    expect_status(
        within("Get", n.get(npb::GetRequest { key: b"k".to_vec() })).await,
        Code::Unauthenticated,
        "invalid api token",
    );
    expect_status(
        within("Watch", n.watch(npb::WatchRequest::default())).await,
        Code::Unauthenticated,
        "invalid api token",
    );
    let ok = within("GetState", d.get_state(with_token(Some("s3cret"))))
        .await
        .expect("GetState with the token")
        .into_inner();
    assert_eq!(ok, rpb::GetStateResponse::default());
    let mut r = tonic::Request::new(npb::GetRequest { key: b"k".to_vec() });
    r.metadata_mut().insert("dapr-api-token", "s3cret".parse().unwrap());
    assert!(
        !within("Get", n.get(r))
            .await
            .expect("Get with the token")
            .into_inner()
            .found
    );

    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let h = within(
        "health Check",
        health.check(tonic_health::pb::HealthCheckRequest::default()),
    )
    .await
    .expect("health needs no token")
    .into_inner();
    assert_eq!(
        h.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    let services = list_services_v1(ch).await;
    assert!(services.contains("dapr.proto.runtime.v1.Dapr"), "{services:?}");
    env.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Health and reflection
// ---------------------------------------------------------------------------------------------

async fn list_services_v1(ch: Channel) -> BTreeSet<String> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};
    let mut client = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = within("reflection", client.server_reflection_info(tokio_stream::iter([req])))
        .await
        .expect("reflection v1")
        .into_inner();
    let resp: ServerReflectionResponse = within("a reflection answer", stream.message())
        .await
        .expect("reflection answer")
        .expect("one answer");
    match resp.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("expected a service list, got {other:?}"),
    }
}

async fn list_services_v1alpha(ch: Channel) -> BTreeSet<String> {
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha::{ServerReflectionRequest, ServerReflectionResponse};
    let mut client = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = within("reflection", client.server_reflection_info(tokio_stream::iter([req])))
        .await
        .expect("reflection v1alpha")
        .into_inner();
    let resp: ServerReflectionResponse = within("a reflection answer", stream.message())
        .await
        .expect("reflection answer")
        .expect("one answer");
    match resp.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("expected a service list, got {other:?}"),
    }
}

/// The symbol's file descriptor is served by reflection v1 (what grpcurl `describe` needs).
async fn reflection_describes(ch: Channel, symbol: &str) -> bool {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut client = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())),
    };
    let mut stream = within("reflection", client.server_reflection_info(tokio_stream::iter([req])))
        .await
        .expect("reflection v1")
        .into_inner();
    let resp = within("a reflection answer", stream.message())
        .await
        .expect("reflection answer")
        .expect("one answer");
    matches!(resp.message_response, Some(MessageResponse::FileDescriptorResponse(f)) if !f.file_descriptor_proto.is_empty())
}

const TCP_SERVICES: [&str; 2] = ["dapr.proto.runtime.v1.Dapr", "statestore.v1.StateStore"];
const COMPONENT_SERVICES: [&str; 4] = [
    "dapr.proto.components.v1.QueriableStateStore",
    "dapr.proto.components.v1.StateStore",
    "dapr.proto.components.v1.TransactionalStateStore",
    "dapr.proto.components.v1.TransactionalStoreMultiMaxSize",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_on_tcp() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let env = TestEnv::start(Broker::Embedded).await;
    let ch = channel(&env).await;
    let mut health = HealthClient::new(ch.clone());
    for service in ["", "statestore.v1.StateStore", "dapr.proto.runtime.v1.Dapr"] {
        let h = within(
            "health Check",
            health.check(HealthCheckRequest {
                service: service.into(),
            }),
        )
        .await
        .unwrap_or_else(|s| panic!("health of {service:?}: {s:?}"))
        .into_inner();
        assert_eq!(h.status(), ServingStatus::Serving, "{service:?}");
    }
    expect_status(
        within(
            "health Check",
            health.check(HealthCheckRequest {
                service: "no.such.Service".into(),
            }),
        )
        .await,
        Code::NotFound,
        "",
    );

    let v1 = list_services_v1(ch.clone()).await;
    for s in TCP_SERVICES {
        assert!(v1.contains(s), "reflection v1 lists {s}: {v1:?}");
    }
    let v1alpha = list_services_v1alpha(ch.clone()).await;
    for s in TCP_SERVICES {
        assert!(v1alpha.contains(s), "reflection v1alpha lists {s}: {v1alpha:?}");
    }
    assert!(reflection_describes(ch.clone(), "dapr.proto.runtime.v1.Dapr").await);
    assert!(reflection_describes(ch, "statestore.v1.WatchEvent").await);
    env.stop().await;
}

/// Reflection advertises what each door serves and nothing else: a client (grpcurl, daprd)
/// that trusts the list must not find services that answer UNIMPLEMENTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_only_served_services() {
    let (env, _dir, socket) = component_env(|_| {}).await;
    let tcp = list_services_v1(channel(&env).await).await;
    let served_tcp: BTreeSet<String> = TCP_SERVICES
        .iter()
        .chain(["grpc.reflection.v1.ServerReflection"].iter())
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        tcp.difference(&served_tcp).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "the TCP door advertises services it does not serve"
    );
    let sock = list_services_v1alpha(socket).await;
    let served_sock: BTreeSet<String> = COMPONENT_SERVICES
        .iter()
        .chain(["grpc.reflection.v1alpha.ServerReflection"].iter())
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        sock.difference(&served_sock).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "the component socket advertises services it does not serve"
    );
    env.stop().await;
}

// ---------------------------------------------------------------------------------------------
// dapr.proto.components.v1 on the Unix socket
// ---------------------------------------------------------------------------------------------

/// The service with its component socket in a fresh temporary folder, and a channel to it.
async fn component_env(tweak: impl FnOnce(&mut stategate::config::Config)) -> (TestEnv, tempfile::TempDir, Channel) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("stategate.sock");
    let p = path.clone();
    let env = TestEnv::start_with(Broker::Embedded, move |c| {
        c.dapr_component_socket = Some(p);
        tweak(c);
    })
    .await;
    let ch = unix_channel(&path).await;
    (env, dir, ch)
}

/// A tonic channel over a Unix socket (tonic 0.14 connects `unix:` endpoints itself, as daprd's
/// grpc-go does with `unix://`).
async fn unix_channel(path: &Path) -> Channel {
    let endpoint = Endpoint::from_shared(format!("unix://{}", path.display())).expect("unix endpoint");
    within("a Unix socket connection", endpoint.connect())
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e:?}", path.display()))
}

fn cset(key: &str, value: &[u8]) -> cpb::SetRequest {
    cpb::SetRequest {
        key: key.into(),
        value: value.to_vec(),
        ..Default::default()
    }
}

fn cdel(key: &str, etag: Option<&str>) -> cpb::DeleteRequest {
    cpb::DeleteRequest {
        key: key.into(),
        etag: etag.map(|e| cpb::Etag { value: e.into() }),
        ..Default::default()
    }
}

fn cget(key: &str) -> cpb::GetRequest {
    cpb::GetRequest {
        key: key.into(),
        ..Default::default()
    }
}

fn etag_of(e: &Option<cpb::Etag>) -> &str {
    e.as_ref().map(|e| e.value.as_str()).unwrap_or("")
}

fn any_json(v: serde_json::Value) -> prost_types::Any {
    prost_types::Any {
        type_url: String::new(),
        value: v.to_string().into_bytes(),
    }
}

/// Every RPC of the four component services, over the Unix socket, with daprd-style keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn component_api_over_unix_socket() {
    let (env, _dir, ch) = component_env(|c| c.dapr.max_transaction_ops = 7).await;
    let mut s = cpb::state_store_client::StateStoreClient::new(ch.clone());
    let mut tx = cpb::transactional_state_store_client::TransactionalStateStoreClient::new(ch.clone());
    let mut q = cpb::queriable_state_store_client::QueriableStateStoreClient::new(ch.clone());
    let mut mm = cpb::transactional_store_multi_max_size_client::TransactionalStoreMultiMaxSizeClient::new(ch.clone());
    let (mut native, _) = clients(&env).await;

    // Discovery, as daprd does it: reflection v1alpha, then Init, Features, Ping.
    let services = list_services_v1alpha(ch.clone()).await;
    for svc in COMPONENT_SERVICES {
        assert!(services.contains(svc), "the socket lists {svc}: {services:?}");
    }
    within(
        "Init",
        s.init(cpb::InitRequest {
            metadata: Some(cpb::MetadataRequest {
                properties: HashMap::from([("anything".to_owned(), "goes".to_owned())]),
            }),
        }),
    )
    .await
    .expect("Init");
    let f = within("Features", s.features(cpb::FeaturesRequest {}))
        .await
        .expect("Features")
        .into_inner();
    assert_eq!(f.features, ["ETAG", "TRANSACTIONAL", "TTL", "QUERY_API"]);
    within("Ping", s.ping(cpb::PingRequest {})).await.expect("Ping");
    let m = within("MultiMaxSize", mm.multi_max_size(cpb::MultiMaxSizeRequest {}))
        .await
        .expect("MultiMaxSize")
        .into_inner();
    assert_eq!(m.max_size, 7);

    // Get/Set/Delete with daprd's `appid||key` keys, used as given.
    let g = within("Get", s.get(cget("app||missing")))
        .await
        .expect("Get")
        .into_inner();
    assert_eq!(g, cpb::GetResponse::default(), "a missing key");
    within("Set", s.set(cset("app||k1", b"\x00\xffbytes")))
        .await
        .expect("Set");
    let g = within("Get", s.get(cget("app||k1"))).await.expect("Get").into_inner();
    assert_eq!(g.data, b"\x00\xffbytes");
    assert_eq!(g.content_type, "application/octet-stream");
    let e1 = etag_of(&g.etag).to_owned();
    let raw = native_get(&mut native, b"app||k1").await;
    assert_eq!(
        raw.version, e1,
        "the engine key is the key daprd sent; the etag is its version"
    );
    let mut set = cset("app||k1", b"{ \"n\" : 1 }");
    set.etag = Some(cpb::Etag { value: e1.clone() });
    set.content_type = "application/json".into();
    within("Set", s.set(set)).await.expect("Set with the current etag");
    let g = within("Get", s.get(cget("app||k1"))).await.expect("Get").into_inner();
    assert_eq!(g.data, br#"{"n":1}"#, "content_type application/json compacts");
    assert_eq!(g.content_type, "application/json");
    let e2 = etag_of(&g.etag).to_owned();
    assert!(hlc(&e2) > hlc(&e1));
    let mut set = cset("app||ttl", b"t");
    set.metadata.insert("ttlInSeconds".into(), "100".into());
    within("Set", s.set(set)).await.expect("Set with ttl");
    let g = within("Get", s.get(cget("app||ttl"))).await.expect("Get").into_inner();
    assert!(ttl_expire_ms(&g.metadata).is_some(), "ttlExpireTime: {:?}", g.metadata);
    within("Delete", s.delete(cdel("app||k1", Some(&e2))))
        .await
        .expect("Delete with the current etag");
    assert!(!native_get(&mut native, b"app||k1").await.found);
    within("Delete", s.delete(cdel("app||k1", None)))
        .await
        .expect("Delete of a missing key");

    // Bulk operations.
    within(
        "BulkSet",
        s.bulk_set(cpb::BulkSetRequest {
            items: vec![cset("app||b1", b"1"), cset("app||b2", b"two"), cset("app||b3", b"3")],
            options: Some(cpb::BulkSetRequestOptions { parallelism: 2 }),
        }),
    )
    .await
    .expect("BulkSet");
    let items = within(
        "BulkGet",
        s.bulk_get(cpb::BulkGetRequest {
            items: vec![cget("app||b2"), cget("app||none"), cget("app||b1")],
            options: None,
        }),
    )
    .await
    .expect("BulkGet")
    .into_inner()
    .items;
    assert_eq!(
        items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["app||b2", "app||none", "app||b1"]
    );
    // An empty key fails the whole request.
    let empty = within(
        "BulkGet",
        s.bulk_get(cpb::BulkGetRequest {
            items: vec![cget("app||b2"), cget("")],
            options: None,
        }),
    )
    .await;
    assert_eq!(empty.map(|_| ()).unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(
        (items[0].data.as_slice(), items[0].content_type.as_str()),
        (&b"two"[..], "application/octet-stream")
    );
    assert!(!etag_of(&items[0].etag).is_empty());
    assert_eq!(
        (items[1].data.len(), items[1].etag.is_none(), items[1].error.as_str()),
        (0, true, "")
    );
    assert_eq!(
        (items[2].data.as_slice(), items[2].content_type.as_str()),
        (&b"1"[..], "application/json")
    );
    within(
        "BulkDelete",
        s.bulk_delete(cpb::BulkDeleteRequest {
            items: vec![
                cdel("app||b1", None),
                cdel("app||b2", Some(etag_of(&items[0].etag))),
                cdel("app||never", None),
            ],
            options: None,
        }),
    )
    .await
    .expect("BulkDelete");
    assert!(!native_get(&mut native, b"app||b1").await.found);
    assert!(!native_get(&mut native, b"app||b2").await.found);
    assert!(native_get(&mut native, b"app||b3").await.found);

    // Transact: in order, all or nothing.
    use cpb::transactional_state_operation::Request as Op;
    let op = |r: Op| cpb::TransactionalStateOperation { request: Some(r) };
    within(
        "Transact",
        tx.transact(cpb::TransactionalStateRequest {
            operations: vec![
                op(Op::Delete(cdel("app||b3", None))),
                op(Op::Set(cset("app||t1", b"1"))),
                op(Op::Delete(cdel("app||t1", None))),
                op(Op::Set(cset("app||t2", b"2"))),
            ],
            metadata: HashMap::new(),
        }),
    )
    .await
    .expect("Transact");
    assert!(!native_get(&mut native, b"app||b3").await.found);
    assert!(!native_get(&mut native, b"app||t1").await.found);
    assert_eq!(native_get(&mut native, b"app||t2").await.value, b"2");
    let mut stale = cset("app||t2", b"22");
    stale.etag = Some(cpb::Etag { value: e1.clone() });
    let r = within(
        "Transact",
        tx.transact(cpb::TransactionalStateRequest {
            operations: vec![op(Op::Set(cset("app||t3", b"3"))), op(Op::Set(stale))],
            metadata: HashMap::new(),
        }),
    )
    .await;
    assert_etag_error(r, Code::FailedPrecondition);
    assert!(
        !native_get(&mut native, b"app||t3").await.found,
        "a failed Transact applies nothing"
    );
    expect_status(
        within(
            "Transact",
            tx.transact(cpb::TransactionalStateRequest {
                operations: (0..8).map(|i| op(Op::Set(cset(&format!("app||m{i}"), b"x")))).collect(),
                metadata: HashMap::new(),
            }),
        )
        .await,
        Code::InvalidArgument,
        "exceeds the maximum of 7",
    );

    // Query: filter arguments are JSON bytes in Any.value.
    for i in 0..5 {
        let v = serde_json::json!({"id": i, "state": if i % 2 == 0 { "WA" } else { "CA" }});
        within("Set", s.set(cset(&format!("app||q{i}"), v.to_string().as_bytes())))
            .await
            .expect("Set");
    }
    let query = |token: &str| cpb::QueryRequest {
        query: Some(cpb::Query {
            filter: HashMap::from([("EQ".to_owned(), any_json(serde_json::json!({"state": "WA"})))]),
            sort: vec![cpb::Sorting {
                key: "id".into(),
                order: cpb::sorting::Order::Desc as i32,
            }],
            pagination: Some(cpb::Pagination {
                limit: 2,
                token: token.into(),
            }),
        }),
        metadata: HashMap::new(),
    };
    let page = within("Query", q.query(query(""))).await.expect("Query").into_inner();
    assert_eq!(
        page.items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["app||q4", "app||q2"]
    );
    assert_eq!(page.items[0].data, br#"{"id":4,"state":"WA"}"#);
    assert_eq!(page.items[0].content_type, "application/json");
    assert_eq!(
        etag_of(&page.items[0].etag),
        native_get(&mut native, b"app||q4").await.version
    );
    assert!(!page.token.is_empty());
    let page = within("Query", q.query(query(&page.token)))
        .await
        .expect("Query")
        .into_inner();
    assert_eq!(
        page.items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["app||q0"]
    );
    assert!(page.token.is_empty());
    // daprd sends no pagination (or limit 0) when the query has no page: every match comes back.
    let mut all = query("");
    all.query.as_mut().unwrap().pagination = None;
    let page = within("Query", q.query(all)).await.expect("Query").into_inner();
    assert_eq!(
        page.items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["app||q4", "app||q2", "app||q0"]
    );
    assert!(page.token.is_empty());
    let bad = cpb::QueryRequest {
        query: Some(cpb::Query {
            filter: HashMap::from([(
                "EQ".to_owned(),
                prost_types::Any {
                    type_url: String::new(),
                    value: b"{not json".to_vec(),
                },
            )]),
            ..Default::default()
        }),
        metadata: HashMap::new(),
    };
    expect_status(within("Query", q.query(bad)).await, Code::InvalidArgument, "not JSON");
    env.stop().await;
}

/// The error must be `code` with exactly one detail, a `google.rpc.BadRequest` whose single
/// field violation names `etag` (what daprd maps to its ETag errors).
#[track_caller]
fn assert_etag_error<T: std::fmt::Debug>(r: Result<tonic::Response<T>, Status>, code: Code) {
    let status = expect_status(r, code, "");
    let details = status
        .check_error_details_vec()
        .unwrap_or_else(|e| panic!("details of {status:?} do not decode: {e}"));
    assert_eq!(details.len(), 1, "exactly one detail: {details:?}");
    match &details[0] {
        ErrorDetail::BadRequest(b) => {
            assert_eq!(b.field_violations.len(), 1, "{b:?}");
            assert_eq!(b.field_violations[0].field, "etag");
            assert!(!b.field_violations[0].description.is_empty());
        }
        other => panic!("expected a BadRequest detail, got {other:?}"),
    }
    // The same, through the merged view.
    let merged = status.get_error_details();
    assert_eq!(merged.bad_request().map(|b| b.field_violations.len()), Some(1));
}

/// The component error contract: ETag mismatch = FAILED_PRECONDITION, invalid ETag =
/// INVALID_ARGUMENT, each with one BadRequest detail naming `etag`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn component_etag_error_contract() {
    let (env, _dir, ch) = component_env(|_| {}).await;
    let mut s = cpb::state_store_client::StateStoreClient::new(ch.clone());
    within("Set", s.set(cset("app||e", b"v"))).await.expect("Set");
    let cur = etag_of(
        &within("Get", s.get(cget("app||e")))
            .await
            .expect("Get")
            .into_inner()
            .etag,
    )
    .to_owned();
    let stale = "000000000000001:00000:x";

    let with = |etag: &str| {
        let mut r = cset("app||e", b"w");
        r.etag = Some(cpb::Etag { value: etag.into() });
        r
    };
    assert_etag_error(within("Set", s.set(with(stale))).await, Code::FailedPrecondition);
    assert_etag_error(within("Set", s.set(with("not-an-etag"))).await, Code::InvalidArgument);
    assert_etag_error(
        within(
            "Set",
            s.set(cpb::SetRequest {
                etag: Some(cpb::Etag { value: stale.into() }),
                ..cset("app||absent", b"w")
            }),
        )
        .await,
        Code::FailedPrecondition,
    );
    assert_etag_error(
        within("Delete", s.delete(cdel("app||e", Some(stale)))).await,
        Code::FailedPrecondition,
    );
    assert_etag_error(
        within("Delete", s.delete(cdel("app||e", Some("garbage")))).await,
        Code::InvalidArgument,
    );
    assert_etag_error(
        within(
            "BulkSet",
            s.bulk_set(cpb::BulkSetRequest {
                items: vec![cset("app||bulk-ok", b"1"), with(stale)],
                options: None,
            }),
        )
        .await,
        Code::FailedPrecondition,
    );
    assert_etag_error(
        within(
            "BulkDelete",
            s.bulk_delete(cpb::BulkDeleteRequest {
                items: vec![cdel("app||e", Some("garbage"))],
                options: None,
            }),
        )
        .await,
        Code::InvalidArgument,
    );
    // First-write without an etag on an existing key is an ETag conflict too.
    let mut fw = cset("app||e", b"w");
    fw.options = Some(cpb::StateOptions {
        concurrency: cpb::state_options::StateConcurrency::ConcurrencyFirstWrite as i32,
        consistency: 0,
    });
    assert_etag_error(within("Set", s.set(fw)).await, Code::FailedPrecondition);

    let g = within("Get", s.get(cget("app||e"))).await.expect("Get").into_inner();
    assert_eq!(
        (g.data.as_slice(), etag_of(&g.etag)),
        (&b"v"[..], cur.as_str()),
        "refused writes change nothing"
    );
    let g = within("Get", s.get(cget("app||bulk-ok")))
        .await
        .expect("Get")
        .into_inner();
    assert_eq!(g.data, b"1", "a bulk set's good items land");

    // Errors that are not about ETags carry no etag detail.
    let st = expect_status(
        within("Set", s.set(cset("", b"v"))).await,
        Code::InvalidArgument,
        "empty",
    );
    assert!(st.get_error_details().bad_request().is_none(), "{st:?}");
    env.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Across doors
// ---------------------------------------------------------------------------------------------

/// A Watch stream sees changes made over MQTT, over HTTP and over the Dapr gRPC API, with the
/// versions those writers were told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_mqtt_http_and_dapr_writes() {
    use npb::watch_event::Kind;
    let env = TestEnv::start(Broker::Embedded).await;
    let (mut n, mut d) = clients(&env).await;
    let http = reqwest::Client::new();
    let base = format!("{}/v1.0/state/{STORE}", env.http());
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("grpc-x")).await;
    let mut w = watch(&mut n, &[], &["x-*"]).await;

    // MQTT SET and DEL.
    let r = mqtt
        .request(&[b"SET", b"x-mqtt", b"\xffraw"], &[("__ts", &now_ts())])
        .await;
    assert_eq!(&r.payload[..], b"+OK\r\n");
    let v = prop(&r, "__ts").expect("__ts").to_owned();
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-mqtt", Kind::Set, b"\xffraw");
    assert_eq!(e.version, v);
    // A write outside the pattern is not delivered: the next event is the one after it.
    native_set(&mut n, set_req(b"y-skip", b"s")).await;
    let r = mqtt.request(&[b"DEL", b"x-mqtt"], &[("__ts", &now_ts())]).await;
    assert_eq!(&r.payload[..], b":1\r\n");
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-mqtt", Kind::Delete, b"");
    if let Some(ts) = prop(&r, "__ts") {
        assert_eq!(e.version, ts, "DEL's __ts is the deletion's version");
    }
    assert!(hlc(&e.version) > hlc(&v));

    // HTTP save and delete.
    let resp = http
        .post(&base)
        .json(&serde_json::json!([{"key": "x-http", "value": {"n": 1}}]))
        .send()
        .await
        .expect("HTTP save");
    assert_eq!(resp.status(), reqwest::StatusCode::NO_CONTENT);
    let etag = http
        .get(format!("{base}/x-http"))
        .send()
        .await
        .expect("HTTP get")
        .headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-http", Kind::Set, br#"{"n":1}"#);
    assert_eq!(e.version, etag);
    let resp = http
        .delete(format!("{base}/x-http"))
        .header("If-Match", &etag)
        .send()
        .await
        .expect("HTTP delete");
    assert_eq!(resp.status(), reqwest::StatusCode::NO_CONTENT);
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-http", Kind::Delete, b"");
    assert!(hlc(&e.version) > hlc(&etag));

    // Dapr gRPC: a transaction's changes arrive in order; a key it sets and deletes while
    // absent before is left as it was, and nobody hears of it.
    within(
        "ExecuteStateTransaction",
        d.execute_state_transaction(tx_req(vec![
            upsert("x-t0", b"0"),
            upsert("x-t1", b"1"),
            upsert("x-t2", b"2"),
            delete_op("x-t1"),
            delete_op("x-t0"),
        ])),
    )
    .await
    .expect("transaction");
    let t2 = get_state(&mut d, "x-t2").await.etag;
    let e2 = next_event(&mut w).await;
    assert_event(&e2, b"x-t2", Kind::Set, b"2");
    assert_eq!(e2.version, t2);
    // A key that existed before: its set and its delete both arrive, in order.
    d.save_state(save_req(vec![item("x-t3", b"old")]))
        .await
        .expect("save x-t3");
    let before = next_event(&mut w).await;
    assert_event(&before, b"x-t3", Kind::Set, b"old");
    within(
        "ExecuteStateTransaction",
        d.execute_state_transaction(tx_req(vec![upsert("x-t3", b"3"), delete_op("x-t3")])),
    )
    .await
    .expect("transaction");
    let e3 = next_event(&mut w).await;
    assert_event(&e3, b"x-t3", Kind::Set, b"3");
    let e4 = next_event(&mut w).await;
    assert_event(&e4, b"x-t3", Kind::Delete, b"");
    assert!(hlc(&e4.version) > hlc(&e3.version));
    env.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The official Python Dapr SDK as a peer
// ---------------------------------------------------------------------------------------------

/// Runs a command to its end, capturing its output, within `limit`: past it the child is killed
/// (`kill_on_drop`) and the test fails. Awaits the child's exit; nothing blocks a worker.
async fn run_bounded(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("{what}: waiting for {cmd:?}: {e}"),
        Err(_) => panic!("{what}: still running after {limit:?}, killed ({cmd:?})"),
    }
}

fn describe(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A virtualenv with the Dapr SDK, created once under `$HOME/.cache/stategate-pyvenv` and
/// reused while it imports what the tests use: the clients, the actor runtime served by the
/// SDK's FastAPI extension (with uvicorn), and the workflow runtime. `dapr[fastapi]>=1.19`:
/// since 1.19 the extensions ship inside the `dapr` package (the workflow one with no extra
/// dependency), so one requirement brings them all. A venv missing only some of them is
/// completed, not rebuilt. A lock file keeps concurrent test runs from building it twice
/// (taken on a blocking thread).
pub(crate) async fn dapr_sdk_python() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let cache = Path::new(&home).join(".cache");
    std::fs::create_dir_all(&cache).expect("create ~/.cache");
    let venv = cache.join("stategate-pyvenv");
    let python = venv.join("bin").join("python");
    let lock_path = cache.join("stategate-pyvenv.lock");
    let lock = tokio::task::spawn_blocking(move || {
        let lock = std::fs::File::create(lock_path).expect("venv lock file");
        lock.lock().expect("lock the venv");
        lock
    })
    .await
    .expect("lock task");
    async fn has_sdk(python: &Path) -> bool {
        python.exists()
            && run_bounded(
                Command::new(python).args([
                    "-c",
                    "import dapr.clients, dapr.actor, dapr.ext.fastapi, dapr.ext.workflow, uvicorn",
                ]),
                Duration::from_secs(60),
                "import dapr",
            )
            .await
            .status
            .success()
    }
    if !has_sdk(&python).await {
        if !python.exists() {
            let o = run_bounded(
                Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv),
                Duration::from_secs(120),
                "python3 -m venv",
            )
            .await;
            assert!(
                o.status.success(),
                "python3 -m venv {} failed: {}",
                venv.display(),
                describe(&o)
            );
        }
        let o = run_bounded(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "-q",
                    "dapr[fastapi]>=1.19",
                ])
                .env("PIP_DEFAULT_TIMEOUT", "60"),
            Duration::from_secs(600),
            "pip install dapr",
        )
        .await;
        assert!(
            o.status.success(),
            "pip install \"dapr[fastapi]>=1.19\" into {} failed (is PyPI reachable?): {}",
            venv.display(),
            describe(&o)
        );
        assert!(
            has_sdk(&python).await,
            "the venv at {} still cannot import the Dapr SDK's clients, actors and workflows",
            venv.display()
        );
    }
    drop(lock);
    python
}

/// The official Python Dapr SDK drives the Dapr gRPC runtime API (its script asserts every
/// result); the value it saved is then read over MQTT by the official Azure IoT Operations
/// Rust SDK with the same version as the ETag the Python SDK saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_dapr_sdk_interop() {
    let python = dapr_sdk_python().await;
    let env = TestEnv::start(Broker::Embedded).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/dapr_sdk_check.py");
    let grpc = env.grpc().trim_start_matches("http://").to_owned();
    let http = env.http();
    let out = run_bounded(
        Command::new(&python)
            .arg(&script)
            .arg(&grpc)
            .arg(&http)
            .env("PYTHONUNBUFFERED", "1")
            .env("DAPR_HEALTH_TIMEOUT", "20")
            .env_remove("DAPR_API_TOKEN"),
        Duration::from_secs(60),
        "dapr_sdk_check.py",
    )
    .await;
    assert!(
        out.status.success(),
        "the Python Dapr SDK check failed: {}",
        describe(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line: {}", describe(&out)));
    let result: serde_json::Value = serde_json::from_str(result).expect("RESULT is JSON");
    let (key, etag, value) = (
        result["key"].as_str().expect("key"),
        result["etag"].as_str().expect("etag"),
        result["value"].as_str().expect("value"),
    );

    let got = aio_get(env.broker_port, key.as_bytes()).await;
    assert_eq!(
        got.response.as_deref(),
        Some(value.as_bytes()),
        "the AIO SDK reads the Dapr SDK's value"
    );
    assert_eq!(
        got.version.map(|v| v.to_string()).as_deref(),
        Some(etag),
        "the AIO SDK's version is the Dapr SDK's ETag"
    );
    env.stop().await;
}

/// One GET through the Azure IoT Operations state store client (as in `aio.rs`); a GET needs
/// no notification subscription, so the client is used as soon as its session is connected.
async fn aio_get(port: u16, key: &[u8]) -> azure_iot_operations_services::state_store::Response<Option<Vec<u8>>> {
    use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
    use azure_iot_operations_mqtt::session::{Session, SessionOptionsBuilder};
    use azure_iot_operations_protocol::application::ApplicationContextBuilder;
    use azure_iot_operations_services::state_store;

    let settings = MqttConnectionSettingsBuilder::default()
        .client_id(unique_id("grpc-aio"))
        .hostname("127.0.0.1")
        .tcp_port(port)
        .use_tls(false)
        .build()
        .expect("connection settings");
    let session = Session::new(
        SessionOptionsBuilder::default()
            .connection_settings(settings)
            .build()
            .expect("session options"),
    )
    .expect("session");
    let monitor = session.create_session_monitor();
    let client = state_store::Client::new(
        ApplicationContextBuilder::default()
            .build()
            .expect("application context"),
        session.create_managed_client(),
        session.create_session_monitor(),
        state_store::ClientOptionsBuilder::default()
            .build()
            .expect("client options"),
    )
    .expect("state store client");
    let exit = session.create_exit_handle();
    let session = tokio::spawn(session.run());
    within("the AIO session to connect", monitor.connected()).await;
    let got = within("an AIO GET", client.get(key.to_vec(), Duration::from_secs(5)))
        .await
        .expect("AIO GET");
    within("the AIO client to shut down", client.shutdown())
        .await
        .expect("client shutdown");
    if exit.try_exit().is_err() {
        exit.force_exit();
    }
    within("the AIO session to end", session)
        .await
        .expect("session task")
        .expect("session ends cleanly");
    got
}
