use super::*;
use serde_json::json;

fn q(v: Value) -> Query {
    Query::parse(&v).unwrap()
}

#[test]
fn filters_match_dotted_paths() {
    let doc = json!({"person": {"org": "Dev Ops", "id": 1036}, "city": "Seattle", "state": "WA"});
    let cases = [
        (json!({"EQ": {"person.org": "Dev Ops"}}), true),
        (json!({"EQ": {"value.person.org": "Dev Ops"}}), true),
        (json!({"NEQ": {"state": "CA"}}), true),
        (json!({"GT": {"person.id": 1000}}), true),
        (json!({"GTE": {"person.id": 1036}}), true),
        (json!({"LT": {"person.id": 1036}}), false),
        (json!({"LTE": {"person.id": 1036.0}}), true),
        (json!({"GT": {"person.id": "1"}}), false),
        (json!({"IN": {"state": ["CA", "WA"]}}), true),
        (
            json!({"AND": [{"EQ": {"state": "WA"}}, {"EQ": {"city": "Seattle"}}]}),
            true,
        ),
        (
            json!({"AND": [{"EQ": {"state": "WA"}}, {"EQ": {"city": "Spokane"}}]}),
            false,
        ),
        (
            json!({"OR": [{"EQ": {"state": "CA"}}, {"EQ": {"city": "Seattle"}}]}),
            true,
        ),
        (json!({"EQ": {"missing.path": 1}}), false),
    ];
    for (f, want) in cases {
        let query = q(json!({ "filter": f.clone() }));
        assert_eq!(query.filter.unwrap().matches(&doc), want, "{f}");
    }
}

#[test]
fn bare_value_is_the_whole_document() {
    let matches = |filter: Value, doc: Value| q(json!({ "filter": filter })).filter.unwrap().matches(&doc);
    assert!(matches(json!({"EQ": {"value": 5}}), json!(5)));
    assert!(!matches(json!({"EQ": {"value": 5}}), json!(6)));
    assert!(matches(json!({"EQ": {"value": "s"}}), json!("s")));
    assert!(matches(json!({"EQ": {"value": {"a": 1}}}), json!({"a": 1})));
    assert!(matches(json!({"GT": {"value": 4}}), json!(5)));
    assert!(matches(json!({"IN": {"value": [1, 5]}}), json!(5)));
    assert!(matches(json!({"NEQ": {"value": 5}}), json!({"value": 5})));
    // A field named `value` is `value.value`; without the prefix, `value` is not that field.
    assert!(!matches(json!({"EQ": {"value": 5}}), json!({"value": 5})));
    assert!(matches(json!({"EQ": {"value.value": 5}}), json!({"value": 5})));
    // Other paths are unchanged, with or without the prefix.
    assert!(matches(json!({"EQ": {"value.n": 1}}), json!({"n": 1})));
    assert!(matches(json!({"EQ": {"n": 1}}), json!({"n": 1})));
    assert!(!matches(json!({"EQ": {"valuex": 1}}), json!({"valuex": 2})));
    assert_eq!(lookup(&json!(7), "value"), Some(&json!(7)));
    assert_eq!(lookup(&json!(7), "value."), None);
}

#[tokio::test]
async fn sort_and_filter_on_bare_value_over_a_store() {
    use std::sync::Arc;

    use crate::engine::{Limits, Set, SetCondition};
    use crate::hlc::ManualClock;
    use crate::storage::Store;

    let clock = Arc::new(ManualClock::new(1_000_000));
    let engine = Engine::open(Store::memory(), "n", clock, Limits::default())
        .await
        .unwrap();
    for (key, value) in [
        ("a", "3"),
        ("b", "1"),
        ("c", "2"),
        ("d", "{\"value\":1}"),
        ("e", "not json"),
    ] {
        let set = Set {
            key: bytes::Bytes::from(key),
            value: bytes::Bytes::from(value),
            condition: SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        };
        engine.execute(crate::engine::Command::Set(set)).await.unwrap();
    }
    let store: StoreSpec = "statestore".parse().unwrap();
    let keys = |page: QueryPage| page.rows.into_iter().map(|r| r.key).collect::<Vec<_>>();
    let page = run(&engine, &Grant::all(), &store, &q(json!({"sort": [{"key": "value"}]})))
        .await
        .unwrap();
    // Numbers in order, then the object; the value that is not JSON is not a document.
    assert_eq!(keys(page), ["b", "c", "a", "d"]);
    let page = run(
        &engine,
        &Grant::all(),
        &store,
        &q(json!({"sort": [{"key": "value", "order": "DESC"}]})),
    )
    .await
    .unwrap();
    assert_eq!(keys(page), ["d", "a", "c", "b"]);
    let page = run(
        &engine,
        &Grant::all(),
        &store,
        &q(json!({"filter": {"EQ": {"value": 1}}})),
    )
    .await
    .unwrap();
    assert_eq!(keys(page), ["b"]);
    let page = run(
        &engine,
        &Grant::all(),
        &store,
        &q(json!({"filter": {"EQ": {"value.value": 1}}})),
    )
    .await
    .unwrap();
    assert_eq!(keys(page), ["d"]);
}

#[test]
fn malformed_queries_are_refused() {
    for bad in [
        json!([]),
        json!({"filter": {"XX": {"a": 1}}}),
        json!({"filter": {"EQ": {"a": 1, "b": 2}}}),
        json!({"filter": {"EQ": 1}}),
        json!({"filter": {"AND": [{"EQ": {"a": 1}}]}}),
        json!({"filter": {"IN": {"a": 1}}}),
        json!({"sort": [{"order": "ASC"}]}),
        json!({"sort": [{"key": "a", "order": "UP"}]}),
        json!({"page": {"limit": -1}}),
        json!({"page": {"token": "x!"}}),
        json!({"page": {"token": 3}}),
        json!({"other": 1}),
    ] {
        assert!(matches!(Query::parse(&bad), Err(DaprError::Malformed(_))), "{bad}");
    }
}

#[test]
fn page_and_sort_parse() {
    let query = q(json!({"sort": [{"key": "a", "order": "DESC"}, {"key": "b"}], "page": {"limit": 2}}));
    assert_eq!(query.limit, Some(2));
    assert_eq!(query.after, None);
    assert_eq!(
        query.sort,
        vec![
            SortKey {
                path: "a".into(),
                descending: true
            },
            SortKey {
                path: "b".into(),
                descending: false
            }
        ]
    );
}

#[test]
fn sort_order_is_total() {
    let vals = [
        None,
        Some(json!(null)),
        Some(json!(true)),
        Some(json!(2)),
        Some(json!("a")),
    ];
    for w in vals.windows(2) {
        assert_eq!(sort_order(w[0].as_ref(), w[1].as_ref()), Ordering::Less);
    }
    assert_eq!(sort_order(Some(&json!(10)), Some(&json!(9.5))), Ordering::Greater);
}

async fn engine_with(docs: &[(String, Value)]) -> Engine {
    let clock = std::sync::Arc::new(crate::hlc::ManualClock::new(1_700_000_000_000));
    let e = Engine::open(
        crate::storage::Store::memory(),
        "n",
        clock,
        crate::engine::Limits::default(),
    )
    .await
    .unwrap();
    for (k, v) in docs {
        let set = crate::engine::Set {
            key: bytes::Bytes::copy_from_slice(k.as_bytes()),
            value: bytes::Bytes::from(v.to_string()),
            condition: crate::engine::SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        };
        e.execute(crate::engine::Command::Set(set)).await.unwrap();
    }
    e
}

async fn all_pages(e: &Engine, body: Value) -> (Vec<String>, usize) {
    let store = StoreSpec::raw("s");
    let mut query = Query::parse(&body).unwrap();
    let (mut keys, mut pages) = (Vec::new(), 0);
    loop {
        let page = run(e, &Grant::all(), &store, &query).await.unwrap();
        pages += 1;
        assert!(page.rows.len() <= query.limit.unwrap_or(MAX_QUERY_PAGE));
        keys.extend(page.rows.into_iter().map(|r| r.key));
        match page.token {
            None => return (keys, pages),
            Some(t) => {
                let mut next = body.clone();
                next["page"]["token"] = json!(t);
                query = Query::parse(&next).unwrap();
            }
        }
        assert!(pages < 1000, "paging does not end");
    }
}

/// Pages are cut by the previous page's last row (sort values, then key), so following
/// tokens lists every match once, in result order, whatever the page size.
#[tokio::test]
async fn pages_follow_each_other_without_gaps_or_repeats() {
    let docs: Vec<(String, Value)> = (0..300)
        .map(|i| (format!("k{i:03}"), json!({"n": (i * 37) % 11, "even": i % 2 == 0})))
        .collect();
    let e = engine_with(&docs).await;
    // Expected: sorted by n descending, then key ascending (the stable order).
    let mut want: Vec<&(String, Value)> = docs.iter().filter(|(_, v)| v["even"] == json!(true)).collect();
    want.sort_by(|a, b| b.1["n"].as_i64().cmp(&a.1["n"].as_i64()).then(a.0.cmp(&b.0)));
    let want: Vec<String> = want.into_iter().map(|(k, _)| k.clone()).collect();
    for limit in [1, 7, 150, 2000] {
        let body = json!({"filter": {"EQ": {"even": true}}, "sort": [{"key": "n", "order": "DESC"}],
                          "page": {"limit": limit}});
        let (got, pages) = all_pages(&e, body).await;
        assert_eq!(got, want, "sorted, limit {limit}");
        assert_eq!(
            pages,
            want.len().div_ceil(limit.min(MAX_QUERY_PAGE)).max(1),
            "limit {limit}"
        );
    }
    // Unsorted: key order; the scan stops once the page is full.
    let want: Vec<String> = docs
        .iter()
        .filter(|(_, v)| v["n"] == json!(3))
        .map(|(k, _)| k.clone())
        .collect();
    for limit in [1, 4, 500] {
        let body = json!({"filter": {"EQ": {"n": 3}}, "page": {"limit": limit}});
        assert_eq!(all_pages(&e, body).await.0, want, "unsorted, limit {limit}");
    }
    // No limit: pages of at most MAX_QUERY_PAGE rows.
    let docs: Vec<(String, Value)> = (0..2500).map(|i| (format!("{i:05}"), json!(i))).collect();
    let e = engine_with(&docs).await;
    let (got, pages) = all_pages(&e, json!({})).await;
    assert_eq!((got.len(), pages), (2500, 3));
}

#[test]
fn tokens_are_checked() {
    for bad in ["x!", "e30", "bm90IGpzb24"] {
        assert!(Query::parse(&json!({"page": {"token": bad}})).is_err(), "{bad}");
    }
}
