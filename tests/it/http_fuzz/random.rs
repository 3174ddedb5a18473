//! The proptest run: random mixes of the matrix's ingredients, with a fixed seed
//! (deterministic, bounded, shrunk on failure). Whether a random mix is valid is mostly not
//! known, so most cases only must not get a 5xx and any 4xx must be Dapr's shape; a store
//! segment that is not a configured store must be refused whatever else the request holds.

use bytes::Bytes;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use reqwest::Method;
use serde_json::{Value, json};

use super::*;

fn json_leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        "\\PC{0,12}".prop_map(Value::from),
        "[\\x00-\\x1f\"\\\\]{0,4}".prop_map(Value::from),
    ]
    .boxed()
}

fn json_any() -> BoxedStrategy<Value> {
    json_leaf()
        .prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                btree_map("[a-zA-Z.]{0,8}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
        .boxed()
}

/// Keys as strings: a small pool (so writes and reads meet), and every odd kind.
fn key_str() -> BoxedStrategy<String> {
    prop_oneof![
        8 => select(vec!["k0", "k1", "k2", "ttl-item"]).prop_map(String::from),
        1 => Just(String::new()),
        1 => select(vec!["a||b", "||", "k||", "a/b", "bulk", "transaction", "%FF", "a%2Fb", " "]).prop_map(String::from),
        1 => select(vec![64 * 1024, 64 * 1024 + 1, 64 * 1024 - 4]).prop_map(|n| "z".repeat(n)),
        1 => "[\\x00-\\x1f\\x7f]{1,4}",
        2 => "\\PC{1,12}",
    ]
    .boxed()
}

/// A key in a JSON field: mostly a string, sometimes the wrong type.
fn key_json() -> BoxedStrategy<Value> {
    prop_oneof![6 => key_str().prop_map(Value::String), 1 => json_leaf(), 1 => json_any()].boxed()
}

/// A path segment for a key: an encoded key, or raw bad percent-encoding.
fn key_segment() -> BoxedStrategy<String> {
    prop_oneof![
        6 => key_str().prop_map(|k| path_seg(&k)),
        2 => select(BAD_SEGMENTS.to_vec()).prop_map(String::from),
        1 => select(vec!["%7C%7C", "a%7C%7Cb", "%2F", "%00", "%0A", "%20", "+", "..%2F"]).prop_map(String::from),
    ]
    .boxed()
}

fn store_segment() -> BoxedStrategy<String> {
    prop_oneof![
        8 => select(STORES.to_vec()).prop_map(String::from),
        1 => select(vec!["nostore", "STATESTORE", "s2%7C%7C", "state%20store", "%2F"]).prop_map(String::from),
        1 => select(BAD_SEGMENTS.to_vec()).prop_map(String::from),
    ]
    .boxed()
}

/// ETags in JSON. `conflicts`: whether values that parse as versions are allowed (a stale
/// version legitimately fails a transaction with 500, so transactions never get one).
fn etag_json(conflicts: bool) -> BoxedStrategy<Value> {
    let bad = prop_oneof![
        select(vec!["", "garbage", "*", "1", "a:b:c", "000000000000001:00000:", "\"\""]).prop_map(Value::from),
        json_leaf().prop_filter("not a string", |v| !v.is_string()),
        "\\PC{0,10}".prop_filter_map("not a version", |s| {
            s.parse::<stategate::hlc::Hlc>().is_err().then_some(Value::String(s))
        }),
    ];
    if conflicts {
        prop_oneof![
            3 => bad,
            1 => select(vec!["000000000000001:00000:x", "\"000000000000001:00000:x\"", "999999999999999:00000:x"])
                .prop_map(Value::from),
        ]
        .boxed()
    } else {
        bad.boxed()
    }
}

const TTL_VALUES: [&str; 14] = [
    "x",
    "1.5",
    "-2",
    "0",
    "-1",
    "100",
    "",
    " 5 ",
    "+5",
    "1e3",
    "9223372036854775807",
    "99999999999999",
    "-9223372036854775808",
    "300000000000",
];

fn metadata_json() -> BoxedStrategy<Value> {
    let value = prop_oneof![
        3 => select(TTL_VALUES.to_vec()).prop_map(String::from),
        1 => "\\PC{0,8}",
    ];
    let name = select(vec!["ttlInSeconds", "contentType", "fencingToken", "partitionKey", ""]);
    prop_oneof![
        6 => btree_map(name, value, 0..3)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), Value::String(v))).collect())),
        1 => json_any(),
    ]
    .boxed()
}

fn options_json(first_write: bool) -> BoxedStrategy<Value> {
    let mut conc = vec!["last-write", "", "maybe", "FIRST-WRITE"];
    if first_write {
        conc.push("first-write");
    }
    let conc = prop_oneof![4 => select(conc).prop_map(Value::from), 1 => json_leaf()];
    let cons =
        prop_oneof![4 => select(vec!["strong", "eventual", "", "weird"]).prop_map(Value::from), 1 => json_leaf()];
    prop_oneof![
        6 => (proptest::option::of(conc), proptest::option::of(cons), any::<bool>()).prop_map(|(c, s, extra)| {
            let mut o = serde_json::Map::new();
            if let Some(c) = c {
                o.insert("concurrency".into(), c);
            }
            if let Some(s) = s {
                o.insert("consistency".into(), s);
            }
            if extra {
                o.insert("unknown".into(), json!(1));
            }
            Value::Object(o)
        }),
        1 => json_any(),
    ]
    .boxed()
}

/// One save item (or transaction request). `tx`: no conflicts possible (see `etag_json`).
fn item_json(tx: bool) -> BoxedStrategy<Value> {
    (
        proptest::option::of(key_json()),
        proptest::option::of(json_any()),
        proptest::option::of(etag_json(!tx)),
        proptest::option::of(metadata_json()),
        proptest::option::of(options_json(!tx)),
        proptest::option::of(prop_oneof![Just(json!("application/json")), json_leaf()]),
    )
        .prop_map(|(key, value, etag, metadata, options, content_type)| {
            let mut o = serde_json::Map::new();
            for (name, v) in [
                ("key", key),
                ("value", value),
                ("etag", etag),
                ("metadata", metadata),
                ("options", options),
                ("contentType", content_type),
            ] {
                if let Some(v) = v {
                    o.insert(name.into(), v);
                }
            }
            Value::Object(o)
        })
        .boxed()
}

fn filter_json() -> BoxedStrategy<Value> {
    let path = prop_oneof![
        select(vec!["a", "n", "value.n", "a.b.c", "", "."]).prop_map(String::from),
        "\\PC{0,6}"
    ];
    let leaf = prop_oneof![
        (
            select(vec!["EQ", "NEQ", "GT", "GTE", "LT", "LTE"]),
            path.clone(),
            json_leaf()
        )
            .prop_map(|(op, p, v)| json!({ op: { p: v } })),
        (path, vec(json_leaf(), 0..3)).prop_map(|(p, l)| json!({"IN": { p: l }})),
        (select(vec!["EQ", "IN", "AND", "OR", "XOR", ""]), json_any()).prop_map(|(op, v)| json!({ op: v })),
        json_leaf(),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        (select(vec!["AND", "OR"]), vec(inner, 0..4)).prop_map(|(op, l)| json!({ op: l }))
    })
    .boxed()
}

fn query_json() -> BoxedStrategy<Value> {
    let sort_item = (
        proptest::option::of(prop_oneof![
            select(vec!["a", "n", "value.n", ""]).prop_map(Value::from),
            json_leaf()
        ]),
        proptest::option::of(prop_oneof![
            select(vec!["ASC", "DESC", "desc", "up"]).prop_map(Value::from),
            json_leaf()
        ]),
    )
        .prop_map(|(k, o)| {
            let mut m = serde_json::Map::new();
            if let Some(k) = k {
                m.insert("key".into(), k);
            }
            if let Some(o) = o {
                m.insert("order".into(), o);
            }
            Value::Object(m)
        });
    let sort = prop_oneof![4 => vec(sort_item, 0..3).prop_map(Value::Array), 1 => json_any()];
    let limit = prop_oneof![
        select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(-1),
            json!(1.5),
            json!("2"),
            json!(u64::MAX),
            json!(null)
        ]),
        json_leaf(),
    ];
    let token = prop_oneof![
        select(vec![
            "",
            "0",
            "1",
            "3",
            "-1",
            "18446744073709551615",
            "99999999999999999999",
            "x"
        ])
        .prop_map(Value::from),
        json_leaf(),
    ];
    let page = prop_oneof![
        4 => (proptest::option::of(limit), proptest::option::of(token)).prop_map(|(l, t)| {
            let mut m = serde_json::Map::new();
            if let Some(l) = l {
                m.insert("limit".into(), l);
            }
            if let Some(t) = t {
                m.insert("token".into(), t);
            }
            Value::Object(m)
        }),
        1 => json_any(),
    ];
    (
        proptest::option::of(filter_json()),
        proptest::option::of(sort),
        proptest::option::of(page),
        any::<bool>(),
    )
        .prop_map(|(f, s, p, extra)| {
            let mut m = serde_json::Map::new();
            for (name, v) in [("filter", f), ("sort", s), ("page", p)] {
                if let Some(v) = v {
                    m.insert(name.into(), v);
                }
            }
            if extra {
                m.insert("unknown".into(), json!(true));
            }
            Value::Object(m)
        })
        .boxed()
}

fn save_body() -> BoxedStrategy<Value> {
    vec(item_json(false), 0..4).prop_map(Value::Array).boxed()
}

fn bulk_body() -> BoxedStrategy<Value> {
    let keys = prop_oneof![4 => vec(key_json(), 0..5).prop_map(Value::Array), 1 => json_any()];
    (
        keys,
        proptest::option::of(json_leaf()),
        proptest::option::of(metadata_json()),
    )
        .prop_map(|(keys, par, meta)| {
            let mut m = serde_json::Map::new();
            m.insert("keys".into(), keys);
            if let Some(p) = par {
                m.insert("parallelism".into(), p);
            }
            if let Some(meta) = meta {
                m.insert("metadata".into(), meta);
            }
            Value::Object(m)
        })
        .boxed()
}

fn tx_body() -> BoxedStrategy<Value> {
    let op = (
        prop_oneof![
            6 => select(vec!["upsert", "delete"]).prop_map(Value::from),
            1 => select(vec!["merge", "", "UPSERT"]).prop_map(Value::from),
            1 => json_leaf(),
        ],
        prop_oneof![6 => item_json(true), 1 => json_any()],
    )
        .prop_map(|(operation, request)| json!({"operation": operation, "request": request}));
    let ops = prop_oneof![6 => vec(op, 0..4).prop_map(Value::Array), 1 => json_any()];
    (ops, proptest::option::of(metadata_json()))
        .prop_map(|(ops, meta)| {
            let mut m = serde_json::Map::new();
            m.insert("operations".into(), ops);
            if let Some(meta) = meta {
                m.insert("metadata".into(), meta);
            }
            Value::Object(m)
        })
        .boxed()
}

/// A body: mostly the route's own shape (full of wrong types), else anything at all.
fn body_for(shape: BoxedStrategy<Value>) -> BoxedStrategy<Bytes> {
    prop_oneof![
        12 => shape.prop_map(|v| Bytes::from(serde_json::to_vec(&v).expect("json"))),
        2 => json_any().prop_map(|v| Bytes::from(serde_json::to_vec(&v).expect("json"))),
        2 => select(bad_bodies()),
        1 => vec(any::<u8>(), 0..48).prop_map(Bytes::from),
        1 => select(oversized_bodies()),
    ]
    .boxed()
}

fn query_string(for_subscribe: bool) -> BoxedStrategy<String> {
    let mut names = vec![
        "metadata.ttlInSeconds",
        "concurrency",
        "consistency",
        "metadata.contentType",
        "metadata.fencingToken",
        "metadata.",
        "%FF",
    ];
    if for_subscribe {
        names.extend(["key", "key", "pattern"]);
    }
    let mut values: Vec<String> = [
        "maybe",
        "weird",
        "first-write",
        "last-write",
        "strong",
        "eventual",
        "%FF",
        "%",
        "[",
        "*",
        "k*",
        "k0",
        "a%7C%7Cb",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    values.extend(TTL_VALUES.iter().map(|t| seg(t)));
    let pair = (select(names), select(values), any::<bool>())
        .prop_map(|(n, v, bare)| if bare { n.to_owned() } else { format!("{n}={v}") });
    // Long keys only where the path is short (a long key may be in the path already).
    let key = key_str().prop_map(move |k| {
        let k = if for_subscribe { k } else { k.chars().take(64).collect() };
        format!("key={}", path_seg(&k))
    });
    prop_oneof![
        2 => Just(String::new()),
        6 => vec(pair, 1..4).prop_map(|p| p.join("&")),
        1 => key,
    ]
    .boxed()
}

fn if_match() -> BoxedStrategy<Option<Vec<u8>>> {
    prop_oneof![
        6 => Just(None),
        3 => select(BAD_IF_MATCH.iter().map(|b| b.to_vec()).collect::<Vec<_>>()).prop_map(Some),
        1 => Just(Some(Vec::new())),
        1 => vec(0x80u8..=0xff, 1..8).prop_map(Some),
        1 => "[ -~]{1,40}".prop_map(|s| Some(s.into_bytes())),
    ]
    .boxed()
}

fn content_type() -> BoxedStrategy<Option<&'static str>> {
    select(vec![
        None,
        Some("application/json"),
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("garbage/;;"),
    ])
    .boxed()
}

/// A request to one route, with bad parts anywhere.
fn request() -> BoxedStrategy<Req> {
    let store = store_segment();
    let save = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(save_body()),
        query_string(false),
    )
        .prop_map(|(m, s, b, q)| Req::new(m, format!("/v1.0/state/{s}")).body(b).query(q));
    let read = (
        select(vec![Method::GET, Method::DELETE]),
        store.clone(),
        key_segment(),
        query_string(false),
        if_match(),
    )
        .prop_map(|(m, s, k, q, im)| {
            let mut r = Req::new(m, format!("/v1.0/state/{s}/{k}")).query(q);
            r.if_match = im;
            r
        });
    let bulk = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(bulk_body()),
    )
        .prop_map(|(m, s, b)| Req::new(m, format!("/v1.0/state/{s}/bulk")).body(b));
    let tx = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(tx_body()),
        query_string(false),
    )
        .prop_map(|(m, s, b, q)| Req::new(m, format!("/v1.0/state/{s}/transaction")).body(b).query(q));
    let query = (
        select(vec![Method::POST, Method::PUT]),
        store.clone(),
        body_for(query_json()),
    )
        .prop_map(|(m, s, b)| Req::new(m, format!("/v1.0-alpha1/state/{s}/query")).body(b));
    let subscribe = (store, query_string(true))
        .prop_map(|(s, q)| Req::new(Method::GET, format!("/v1.0-alpha1/state/{s}/subscribe")).query(q));
    let other = (
        select(vec![
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ]),
        select(vec![
            "/v1.0/metadata",
            "/v1.0/healthz",
            "/v1.0/healthz/outbound",
            "/v1.0/state",
            "/v1.0/state/statestore/k0/extra",
            "/v1.0-alpha1/state/statestore",
            "/nope",
        ]),
        query_string(true),
    )
        .prop_map(|(m, p, q)| Req::new(m, p).query(q));
    (
        prop_oneof![4 => save, 4 => read, 2 => bulk, 3 => tx, 3 => query, 1 => subscribe, 1 => other],
        content_type(),
        proptest::option::weighted(0.05, Just(())),
    )
        .prop_map(|(mut r, ct, slash)| {
            r.content_type = ct;
            if slash.is_some() {
                r.path.push('/');
            }
            if r.body.len() > UNREAD_BODY_MAX && !reads_body(&r) {
                r.body.truncate(UNREAD_BODY_MAX);
            }
            r
        })
        .boxed()
}

/// What a random request must get, as far as it is known by construction: on a store route
/// (with a method it takes), a store segment that is not a configured store is refused whatever
/// else the request holds (after a path that does not decode and an oversized body, which are
/// refused first). Anything else only must not be a 5xx.
fn random_verdict(r: &Req) -> Expect {
    let path = r.path.trim_end_matches('/');
    let parts: Vec<&str> = path.split('/').collect();
    let post_or_put = r.method == Method::POST || r.method == Method::PUT;
    let (store, key) = match parts.as_slice() {
        ["", "v1.0", "state", store] if post_or_put => (*store, None),
        ["", "v1.0", "state", store, "bulk" | "transaction"] if post_or_put => (*store, None),
        ["", "v1.0", "state", store, key] if r.method == Method::GET || r.method == Method::DELETE => {
            (*store, Some(*key))
        }
        ["", "v1.0-alpha1", "state", store, "query"] if post_or_put => (*store, None),
        ["", "v1.0-alpha1", "state", store, "subscribe"] if r.method == Method::GET => (*store, None),
        _ => return Expect::NotServerError,
    };
    if !decodes(store) || key.is_some_and(|k| !decodes(k)) {
        refused(400, MALFORMED)
    } else if r.body.len() > BODY_LIMIT && reads_body(r) {
        refused(413, MALFORMED)
    } else if !STORES.contains(&store) {
        refused(400, STORE_NOT_FOUND)
    } else {
        Expect::NotServerError
    }
}

/// Random mixes with a fixed seed: deterministic, bounded, shrunk on failure.
#[test]
fn random_requests_never_break_the_contract() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let env = rt.block_on(fuzz_env());
    let base = env.http();
    let c = client();
    let config = Config {
        cases: 3000,
        max_shrink_iters: 400,
        max_shrink_time: 20_000,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[0x5a; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&request(), |req| {
        rt.block_on(check(&c, &base, &req, random_verdict(&req)))
            .map_err(TestCaseError::fail)
    });
    rt.block_on(still_works(&c, &base));
    rt.block_on(env.stop());
    if let Err(e) = result {
        panic!("{e}");
    }
}
