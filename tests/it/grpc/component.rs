//! The Dapr pluggable state component API on its Unix socket, with its error contract.

use super::*;

/// The service with its component socket in a fresh temporary folder, and a channel to it.
pub(super) async fn component_env(
    tweak: impl FnOnce(&mut stategate::config::Config),
) -> (TestEnv, tempfile::TempDir, Channel) {
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
pub(super) async fn unix_channel(path: &Path) -> Channel {
    let endpoint = Endpoint::from_shared(format!("unix://{}", path.display())).expect("unix endpoint");
    within("a Unix socket connection", endpoint.connect())
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e:?}", path.display()))
}

pub(super) fn cset(key: &str, value: &[u8]) -> cpb::SetRequest {
    cpb::SetRequest {
        key: key.into(),
        value: value.to_vec(),
        ..Default::default()
    }
}

pub(super) fn cdel(key: &str, etag: Option<&str>) -> cpb::DeleteRequest {
    cpb::DeleteRequest {
        key: key.into(),
        etag: etag.map(|e| cpb::Etag { value: e.into() }),
        ..Default::default()
    }
}

pub(super) fn cget(key: &str) -> cpb::GetRequest {
    cpb::GetRequest {
        key: key.into(),
        ..Default::default()
    }
}

pub(super) fn etag_of(e: &Option<cpb::Etag>) -> &str {
    e.as_ref().map(|e| e.value.as_str()).unwrap_or("")
}

pub(super) fn any_json(v: serde_json::Value) -> prost_types::Any {
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
pub(super) fn assert_etag_error<T: std::fmt::Debug>(r: Result<tonic::Response<T>, Status>, code: Code) {
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
