//! `statestore.v1.StateStore`: every RPC, Watch included, on memory and durable storage.

use super::*;

crate::support::both_storages!(
    native_and_dapr_runtime_share_versions,
    native_watch_events_and_client_drop,
);

pub(super) fn set_req(key: &[u8], value: &[u8]) -> npb::SetRequest {
    npb::SetRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..Default::default()
    }
}

pub(super) async fn native_set(c: &mut Native, req: npb::SetRequest) -> npb::SetResponse {
    within("a Set answer", c.set(req)).await.expect("Set").into_inner()
}

pub(super) async fn native_get(c: &mut Native, key: &[u8]) -> npb::GetResponse {
    within("a Get answer", c.get(npb::GetRequest { key: key.to_vec() }))
        .await
        .expect("Get")
        .into_inner()
}

pub(super) async fn native_and_dapr_runtime_share_versions(storage: Storage) {
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

pub(super) async fn next_event(s: &mut tonic::Streaming<npb::WatchEvent>) -> npb::WatchEvent {
    within("a watch event", s.message())
        .await
        .expect("the watch stream has no error")
        .expect("the watch stream is open")
}

#[track_caller]
pub(super) fn assert_event(e: &npb::WatchEvent, key: &[u8], kind: npb::watch_event::Kind, value: &[u8]) {
    assert_eq!(
        (e.key.as_slice(), e.kind(), e.value.as_slice()),
        (key, kind, value),
        "event {e:?}"
    );
}

pub(super) async fn watch(c: &mut Native, keys: &[&[u8]], patterns: &[&str]) -> tonic::Streaming<npb::WatchEvent> {
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
pub(super) async fn native_watch_events_and_client_drop(storage: Storage) {
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
