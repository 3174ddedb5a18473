//! `dapr.proto.runtime.v1.Dapr`: every state RPC and its status codes, the api token.

use super::*;

crate::support::both_storages!(dapr_transactions,);

pub(super) fn item(key: &str, value: &[u8]) -> common::StateItem {
    common::StateItem {
        key: key.into(),
        value: value.to_vec(),
        ..Default::default()
    }
}

pub(super) fn with_etag(mut i: common::StateItem, etag: &str) -> common::StateItem {
    i.etag = Some(common::Etag { value: etag.into() });
    i
}

pub(super) fn with_meta(mut i: common::StateItem, k: &str, v: &str) -> common::StateItem {
    i.metadata.insert(k.into(), v.into());
    i
}

pub(super) fn first_write(mut i: common::StateItem) -> common::StateItem {
    i.options = Some(common::StateOptions {
        concurrency: common::state_options::StateConcurrency::ConcurrencyFirstWrite as i32,
        consistency: common::state_options::StateConsistency::ConsistencyStrong as i32,
    });
    i
}

pub(super) fn save_req(states: Vec<common::StateItem>) -> rpb::SaveStateRequest {
    rpb::SaveStateRequest {
        store_name: STORE.into(),
        states,
    }
}

pub(super) fn upsert(key: &str, value: &[u8]) -> rpb::TransactionalStateOperation {
    rpb::TransactionalStateOperation {
        operation_type: "upsert".into(),
        request: Some(item(key, value)),
    }
}

pub(super) fn delete_op(key: &str) -> rpb::TransactionalStateOperation {
    rpb::TransactionalStateOperation {
        operation_type: "delete".into(),
        request: Some(item(key, b"")),
    }
}

pub(super) fn tx_req(operations: Vec<rpb::TransactionalStateOperation>) -> rpb::ExecuteStateTransactionRequest {
    rpb::ExecuteStateTransactionRequest {
        store_name: STORE.into(),
        operations,
        metadata: HashMap::new(),
    }
}

pub(super) fn get_req(key: &str) -> rpb::GetStateRequest {
    rpb::GetStateRequest {
        store_name: STORE.into(),
        key: key.into(),
        ..Default::default()
    }
}

pub(super) fn del_req(key: &str, etag: Option<&str>) -> rpb::DeleteStateRequest {
    rpb::DeleteStateRequest {
        store_name: STORE.into(),
        key: key.into(),
        etag: etag.map(|e| common::Etag { value: e.into() }),
        ..Default::default()
    }
}

pub(super) async fn get_state(d: &mut Dapr, key: &str) -> rpb::GetStateResponse {
    within("GetState", d.get_state(get_req(key)))
        .await
        .expect("GetState")
        .into_inner()
}

pub(super) async fn save(d: &mut Dapr, states: Vec<common::StateItem>) {
    within("SaveState", d.save_state(save_req(states)))
        .await
        .expect("SaveState");
}

/// The `ttlExpireTime` metadata of a read, as ms since the epoch.
pub(super) fn ttl_expire_ms(meta: &HashMap<String, String>) -> Option<u64> {
    meta.get("ttlExpireTime").map(|t| {
        humantime::parse_rfc3339(t)
            .unwrap_or_else(|e| panic!("ttlExpireTime {t:?}: {e}"))
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    })
}

/// `ttlSliding` (a stategate extension) through the Dapr runtime API: every GetState (and bulk
/// get) pushes the deadline out by `ttlInSeconds` again, the ETag stays; without reads the key
/// expires; `ttlSliding` without `ttlInSeconds`, or not a boolean, is INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_ttl_sliding() {
    let env = TestEnv::start(Broker::Embedded).await;
    let (_, mut d) = clients(&env).await;
    let sliding = |key: &str| with_meta(with_meta(item(key, b"s"), "ttlInSeconds", "100"), "ttlSliding", "true");
    save(&mut d, vec![sliding("session")]).await;
    let first = get_state(&mut d, "session").await;
    for _ in 0..3 {
        // 90 s later each time: past the first deadline by the third read.
        env.advance(90_000);
        let g = get_state(&mut d, "session").await;
        assert_eq!(g.data, b"s", "alive: every read pushed its deadline out");
        assert_eq!(g.etag, first.etag, "a read changes no ETag");
    }
    let bulk = within(
        "GetBulkState",
        d.get_bulk_state(rpb::GetBulkStateRequest {
            store_name: "statestore".into(),
            keys: vec!["session".into()],
            ..Default::default()
        }),
    )
    .await
    .expect("GetBulkState")
    .into_inner();
    assert_eq!(bulk.items[0].data, b"s");
    env.advance(120_000);
    assert!(
        get_state(&mut d, "session").await.data.is_empty(),
        "no read for longer than the TTL: gone"
    );
    for bad in [
        with_meta(item("k", b"v"), "ttlSliding", "true"),
        with_meta(with_meta(item("k", b"v"), "ttlInSeconds", "5"), "ttlSliding", "yes"),
    ] {
        expect_status(
            within("SaveState", d.save_state(save_req(vec![bad]))).await,
            Code::InvalidArgument,
            "ttlSliding",
        );
    }
    env.stop().await;
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
pub(super) async fn dapr_transactions(storage: Storage) {
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
