use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;

use super::*;
use crate::engine::Limits;
use crate::hlc::ManualClock;
use crate::storage::Store;

async fn engine() -> Engine {
    Engine::open(
        Store::memory(),
        "n",
        Arc::new(ManualClock::new(1_000_000)),
        Limits::default(),
    )
    .await
    .unwrap()
}

fn spec(s: &str) -> StoreSpec {
    s.parse().unwrap()
}

fn save_item(key: &str, value: &str) -> SaveItem {
    SaveItem {
        key: key.into(),
        value: Bytes::copy_from_slice(value.as_bytes()),
        etag: None,
        metadata: HashMap::new(),
        concurrency: None,
        consistency: None,
    }
}

fn delete_item(key: &str) -> DeleteItem {
    DeleteItem {
        key: key.into(),
        etag: None,
        metadata: HashMap::new(),
        concurrency: None,
        consistency: None,
    }
}

#[test]
fn store_specs_and_key_prefixes() {
    assert_eq!(spec("statestore").engine_key("k").unwrap(), "k");
    assert_eq!(spec("s=name").engine_key("k").unwrap(), "s||k");
    assert_eq!(spec("s=app1").engine_key("k").unwrap(), "app1||k");
    assert_eq!(spec("s=app1").dapr_key(b"app1||k"), "k");
    assert!(matches!(spec("s").engine_key(""), Err(DaprError::Malformed(_))));
    assert!(matches!(spec("s").engine_key("a||b"), Err(DaprError::Malformed(_))));
    for (bad, why) in [
        ("", "the name must be non-empty"),
        ("=x", "the name must be non-empty"),
        ("a/b", "have no '/'"),
        ("s=a||b", "a literal without ||"),
        ("s=", "a literal without ||"),
    ] {
        match bad.parse::<StoreSpec>() {
            Err(e) if e.contains(why) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn metadata_parsing() {
    let m = |k: &str, v: &str| HashMap::from([(k.to_owned(), v.to_owned())]);
    assert_eq!(WriteMeta::parse(&m("ttlInSeconds", "5")).unwrap().ttl_ms, Some(5000));
    assert_eq!(WriteMeta::parse(&m("ttlInSeconds", "-1")).unwrap().ttl_ms, None);
    let malformed = |r: Result<WriteMeta, DaprError>, what: &str| match r {
        Err(DaprError::Malformed(m)) if m.contains(what) => {}
        other => panic!("{what}: {other:?}"),
    };
    for bad in ["abc", "1.5", "-2", "99999999999999999999"] {
        malformed(WriteMeta::parse(&m("ttlInSeconds", bad)), "'ttlInSeconds'");
    }
    // In range or not is the engine's rule (see `ttl_out_of_range_is_the_engines_answer`).
    assert_eq!(WriteMeta::parse(&m("ttlInSeconds", "0")).unwrap().ttl_ms, Some(0));
    malformed(WriteMeta::parse(&m("fencingToken", "x")), "'fencingToken'");
    let sliding = HashMap::from([
        ("ttlInSeconds".to_owned(), "30".to_owned()),
        ("ttlSliding".to_owned(), "TRUE".to_owned()),
    ]);
    assert_eq!(WriteMeta::parse(&sliding).unwrap().ttl_ms, Some(30_000));
    assert!(WriteMeta::parse(&sliding).unwrap().sliding);
    assert!(!WriteMeta::parse(&m("ttlSliding", "false")).unwrap().sliding);
    malformed(WriteMeta::parse(&m("ttlSliding", "true")), "needs 'ttlInSeconds'");
    malformed(WriteMeta::parse(&m("ttlSliding", "yes")), "'ttlSliding'");
    assert!(WriteMeta::parse(&m("fencingToken", "1:0:n")).unwrap().fencing.is_some());
    assert!(matches!(Concurrency::parse(Some("sometimes")), Err(DaprError::Malformed(m)) if m.contains("concurrency")));
    assert!(matches!(check_consistency(Some("weak")), Err(DaprError::Malformed(m)) if m.contains("consistency")));
    assert!(matches!(parse_etag(Some("nope")), Err(DaprError::InvalidEtag(_))));
    assert_eq!(parse_etag(Some("")).unwrap(), None);
}

#[tokio::test]
async fn etags_and_first_write() {
    let e = engine().await;
    let s = spec("statestore");
    let v1 = save(&e, &Grant::all(), &s, &save_item("k", "1")).await.unwrap();
    let mut stale = save_item("k", "2");
    stale.etag = Some(v1.to_string());
    let v2 = save(&e, &Grant::all(), &s, &stale).await.unwrap();
    assert!(v2 > v1);
    // The old etag is now stale.
    assert!(matches!(
        save(&e, &Grant::all(), &s, &stale).await,
        Err(DaprError::EtagMismatch(_))
    ));
    let mut fw = save_item("k", "3");
    fw.concurrency = Some("first-write".into());
    assert!(matches!(
        save(&e, &Grant::all(), &s, &fw).await,
        Err(DaprError::EtagMismatch(_))
    ));
    fw.key = "fresh".into();
    save(&e, &Grant::all(), &s, &fw).await.unwrap();
    // Delete: first-write without etag on an existing key conflicts; a missing key is fine.
    let mut d = delete_item("k");
    d.concurrency = Some("first-write".into());
    assert!(matches!(
        delete(&e, &Grant::all(), &s, &d).await,
        Err(DaprError::EtagMismatch(_))
    ));
    d.key = "absent".into();
    delete(&e, &Grant::all(), &s, &d).await.unwrap();
    let mut d = delete_item("k");
    d.etag = Some(v1.to_string());
    assert!(matches!(
        delete(&e, &Grant::all(), &s, &d).await,
        Err(DaprError::EtagMismatch(_))
    ));
    d.etag = Some(v2.to_string());
    delete(&e, &Grant::all(), &s, &d).await.unwrap();
    assert_eq!(get(&e, &Grant::all(), &s, "k").await.unwrap(), None);
}

#[tokio::test]
async fn transactions_are_all_or_nothing_and_ordered() {
    let e = engine().await;
    let s = spec("statestore");
    save(&e, &Grant::all(), &s, &save_item("k1", "1")).await.unwrap();
    save(&e, &Grant::all(), &s, &save_item("k2", "2")).await.unwrap();
    let items = vec![
        TxItem::Delete(delete_item("k1")),
        TxItem::Upsert(save_item("k2", "22")),
        TxItem::Delete(delete_item("k2")),
        TxItem::Upsert(save_item("k3", "3")),
    ];
    transact(&e, &Grant::all(), &s, &items, 10).await.unwrap();
    assert_eq!(get(&e, &Grant::all(), &s, "k1").await.unwrap(), None);
    assert_eq!(get(&e, &Grant::all(), &s, "k2").await.unwrap(), None);
    assert_eq!(
        &get(&e, &Grant::all(), &s, "k3").await.unwrap().unwrap().value[..],
        b"3"
    );

    // A stale etag in the middle fails everything.
    let mut bad = save_item("k3", "x");
    bad.etag = Some("000000000000001:00000:n".into());
    let items = vec![TxItem::Upsert(save_item("k4", "4")), TxItem::Upsert(bad)];
    assert!(matches!(
        transact(&e, &Grant::all(), &s, &items, 10).await,
        Err(DaprError::EtagMismatch(_))
    ));
    assert_eq!(get(&e, &Grant::all(), &s, "k4").await.unwrap(), None);
    assert_eq!(
        &get(&e, &Grant::all(), &s, "k3").await.unwrap().unwrap().value[..],
        b"3"
    );
    // Too many operations.
    let many: Vec<TxItem> = (0..3)
        .map(|i| TxItem::Upsert(save_item(&format!("m{i}"), "1")))
        .collect();
    assert!(matches!(
        transact(&e, &Grant::all(), &s, &many, 2).await,
        Err(DaprError::TooManyOperations { got: 3, max: 2 })
    ));
}

#[tokio::test]
async fn fencing_tokens_protect_keys_over_dapr_too() {
    let e = engine().await;
    let s = spec("statestore");
    let mut item = save_item("f", "1");
    item.metadata
        .insert("fencingToken".into(), "000000000001000:00000:c".into());
    save(&e, &Grant::all(), &s, &item).await.unwrap();
    let err = save(&e, &Grant::all(), &s, &save_item("f", "2")).await.unwrap_err();
    assert!(matches!(err, DaprError::Engine(EngineError::FencingTokenRequired)));
    item.metadata
        .insert("fencingToken".into(), "000000000000999:00000:c".into());
    let err = save(&e, &Grant::all(), &s, &item).await.unwrap_err();
    assert!(matches!(err, DaprError::Engine(EngineError::FencingTokenLower)));
}

#[test]
fn values_inside_json_keep_their_text() {
    let text = |v: &[u8]| {
        let (raw, enc) = value_to_json(v);
        (raw.get().to_owned(), enc)
    };
    assert_eq!(text(b"{\"a\":1}"), ("{\"a\":1}".to_owned(), None));
    assert_eq!(text(b"\"s\""), ("\"s\"".to_owned(), None));
    // Numbers exactly as stored: no re-parse, so no digit changes.
    assert_eq!(text(b"-1984.5926649180853").0, "-1984.5926649180853");
    assert_eq!(
        text(b"[123456789012345678901234567890, 1e400]").0,
        "[123456789012345678901234567890, 1e400]"
    );
    assert_eq!(text(b" 1 ").0, "1", "surrounding whitespace is not part of the value");
    let (v, enc) = text(b"\xff raw");
    assert_eq!(v, "\"/yByYXc=\"");
    assert_eq!(enc, Some(("contentEncoding", "base64")));
    assert_eq!(text(b"{\"a\":").1, Some(("contentEncoding", "base64")), "not JSON");
}

#[test]
fn values_must_decode_as_daprd_decodes_them() {
    for ok in [
        "1",
        "-0.0",
        "[1e308, -1.5E-300, true, false, null]",
        "123456789012345678901234567890",
        r#"{"e": "1e999", "k": {"\u00e9": ["\ud83d\ude00"]}}"#,
    ] {
        assert!(check_decodes(ok).is_ok(), "{ok}");
    }
    for bad in ["1e400", r#"[1, {"x": -2E309}]"#, r#""\ud800""#, r#"{"\udc00": 1}"#] {
        assert!(check_decodes(bad).is_err(), "{bad}");
    }
}

#[test]
fn compacting_json_touches_only_whitespace_between_tokens() {
    assert_eq!(
        compact_json(" { \"a b\" : [ 1 , 2.50 ,\n\t-0 ] } "),
        "{\"a b\":[1,2.50,-0]}"
    );
    assert_eq!(compact_json("\"q\\\" \\\\ x\""), "\"q\\\" \\\\ x\"");
    assert_eq!(compact_json("\"\\u0041 \""), "\"\\u0041 \"");
}

#[test]
fn rfc3339_is_utc_seconds() {
    assert_eq!(rfc3339(1_700_000_000_000), "2023-11-14T22:13:20Z");
}

#[test]
fn base64_content_encoding_stores_the_decoded_bytes() {
    let meta = |v: &str| HashMap::from([(ENCODING_METADATA.to_owned(), v.to_owned())]);
    let all: Vec<u8> = (0..=255u8).collect();
    let b64 = format!("\"{}\"", base64::engine::general_purpose::STANDARD.encode(&all));
    let decoded = decode_value(&Bytes::from(b64.clone()), &meta("base64")).unwrap();
    assert_eq!(&decoded[..], &all[..]);
    assert_eq!(&decode_value(&Bytes::from(b64), &meta("BASE64")).unwrap()[..], &all[..]);
    assert_eq!(
        &decode_value(&Bytes::from_static(b"\"\""), &meta("base64")).unwrap()[..],
        b""
    );
    // Without the metadata the value is stored as it came.
    assert_eq!(
        &decode_value(&Bytes::from_static(b"\"AP8=\""), &HashMap::new()).unwrap()[..],
        b"\"AP8=\""
    );
    for (value, encoding) in [
        (&b"\"not base64!\""[..], "base64"),
        (b"42", "base64"),
        (b"{\"a\":1}", "base64"),
        (b"\"AP8=\"", "gzip"),
    ] {
        let err = decode_value(&Bytes::copy_from_slice(value), &meta(encoding)).unwrap_err();
        assert!(matches!(err, DaprError::Malformed(_)), "{value:?} {encoding}: {err}");
    }
}

#[tokio::test]
async fn a_base64_save_item_stores_bytes() {
    let e = engine().await;
    let store = spec("statestore");
    let mut item = save_item("bin", "\"AP8=\"");
    item.metadata.insert(ENCODING_METADATA.into(), "base64".into());
    save(&e, &Grant::all(), &store, &item).await.unwrap();
    assert_eq!(
        &get(&e, &Grant::all(), &store, "bin").await.unwrap().unwrap().value[..],
        b"\x00\xff"
    );
    item.value = Bytes::from_static(b"\"%%\"");
    assert!(matches!(
        save(&e, &Grant::all(), &store, &item).await,
        Err(DaprError::Malformed(_))
    ));
}

#[tokio::test]
async fn ttl_out_of_range_is_the_engines_answer() {
    let e = engine().await;
    let s = spec("statestore");
    for ttl in ["0", "3153600001"] {
        let mut item = save_item("k", "1");
        item.metadata.insert("ttlInSeconds".into(), ttl.into());
        assert!(
            matches!(
                save(&e, &Grant::all(), &s, &item).await,
                Err(DaprError::Engine(EngineError::TtlOutOfRange))
            ),
            "{ttl}"
        );
    }
}

/// A sealed paging token opens only for the principal that got it, for the operation and the
/// store it was issued for: another caller, another store (even one with the same keys), or
/// SCAN with a key list's token (and the other way round) is refused as a bad token.
#[tokio::test]
async fn sealed_tokens_are_bound_to_principal_store_and_operation() {
    use crate::access::{Access, AccessSettings, Principal, execute};
    use crate::engine::{Command, EngineError, Reply, Scan};

    let client = |id: &str| Principal {
        client_id: Some(id.into()),
        ..Principal::default()
    };

    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[[rule]]\nclient_ids = [\"*\"]\nallow = [\"read\"]\nkeys = [\"open-*\"]\n",
    )
    .unwrap();
    let settings = AccessSettings {
        acl_file: Some(acl),
        ..AccessSettings::default()
    };
    let access = Access::load(&settings, None).unwrap();
    let limits = Limits {
        scan_page: 1,
        ..Limits::default()
    };
    let clock = Arc::new(ManualClock::new(1_000_000));
    let engine = crate::engine::Engine::open(Store::memory(), "n", clock, limits)
        .await
        .unwrap();
    for k in ["hidden-1", "hidden-2", "open-1"] {
        let set = crate::engine::Set {
            key: Bytes::from(k),
            value: Bytes::from_static(b"v"),
            condition: crate::engine::SetCondition::Always,
            ttl_ms: None,
            timestamp: None,
            fencing: None,
            persist: false,
            sliding: false,
        };
        engine.execute(Command::Set(set)).await.unwrap();
    }
    let (a, b) = (access.grant(client("a")), access.grant(client("b")));
    let scan = |token: Option<&str>| {
        Command::Scan(Scan {
            pattern: Bytes::from_static(b"*"),
            token: token.map(|t| Bytes::copy_from_slice(t.as_bytes())),
            filter: None,
        })
    };
    // A SCAN page of one key that ends on a hidden key: its token is sealed.
    let page = execute(&engine, &a, scan(None)).await.unwrap();
    let Reply::Keys {
        token: Some(scan_token),
        ..
    } = page.reply
    else {
        panic!("{page:?}")
    };
    let scan_token = String::from_utf8(scan_token.to_vec()).unwrap();
    assert!(scan_token.starts_with('S'), "{scan_token}");
    assert!(execute(&engine, &a, scan(Some(&scan_token))).await.is_ok());
    assert!(
        matches!(
            execute(&engine, &b, scan(Some(&scan_token))).await,
            Err(EngineError::Syntax)
        ),
        "another principal"
    );

    let (one, other): (StoreSpec, StoreSpec) = ("one".parse().unwrap(), "other".parse().unwrap());
    let keys = |grant: Grant, store: StoreSpec, token: Option<String>| {
        let engine = engine.clone();
        async move { list_keys(&engine, &grant, &store, None, Some(1), token.as_deref(), 1).await }
    };
    let listed = keys(a.clone(), one.clone(), None).await.unwrap();
    let list_token = listed.token.unwrap();
    assert!(list_token.starts_with('S'), "{list_token}");
    assert!(keys(a.clone(), one.clone(), Some(list_token.clone())).await.is_ok());
    for (what, result) in [
        (
            "another principal",
            keys(b.clone(), one.clone(), Some(list_token.clone())).await,
        ),
        (
            "another store",
            keys(a.clone(), other.clone(), Some(list_token.clone())).await,
        ),
        (
            "a SCAN token",
            keys(a.clone(), one.clone(), Some(scan_token.clone())).await,
        ),
    ] {
        assert!(matches!(result, Err(DaprError::Malformed(_))), "{what}: {result:?}");
    }
    assert!(
        matches!(
            execute(&engine, &a, scan(Some(&list_token))).await,
            Err(EngineError::Syntax)
        ),
        "a key list's token in SCAN"
    );
}

/// Request-level metadata is checked on its own: a transaction with no operation used to take
/// `ttlSliding: true` without `ttlInSeconds` (found by schemathesis).
#[test]
fn request_metadata_is_checked_without_items() {
    let meta = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    assert!(check_request_metadata(&meta(&[])).is_ok());
    assert!(check_request_metadata(&meta(&[("ttlInSeconds", "60"), ("ttlSliding", "TRUE")])).is_ok());
    assert!(check_request_metadata(&meta(&[("contentEncoding", "Base64")])).is_ok());
    for bad in [
        meta(&[("ttlSliding", "true")]),
        meta(&[("ttlInSeconds", "soon")]),
        meta(&[("fencingToken", "")]),
        meta(&[("contentEncoding", "gzip")]),
    ] {
        assert!(
            matches!(check_request_metadata(&bad), Err(DaprError::Malformed(_))),
            "{bad:?}"
        );
    }
}

/// A writer moves units between two keys in Dapr transactions (their sum stays 100) on a
/// worker thread while the test's thread reads both with the bulk get: every bulk get sees a
/// sum of 100. Read one key at a time, as it once was, the bulk get showed half of a
/// transaction (found by the fault test bed's x + y = 100 invariant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_get_never_sees_half_of_a_transaction() {
    const TRANSACTIONS: i64 = 2000;
    let e = engine().await;
    let s = spec("statestore");
    let pair = |x: i64| {
        vec![
            TxItem::Upsert(save_item("x", &x.to_string())),
            TxItem::Upsert(save_item("y", &(100 - x).to_string())),
        ]
    };
    transact(&e, &Grant::all(), &s, &pair(50), 10).await.unwrap();
    let writer = {
        let (e, s) = (e.clone(), s.clone());
        tokio::spawn(async move {
            for i in 0..TRANSACTIONS {
                transact(&e, &Grant::all(), &s, &pair(50 - i % 7), 10).await.unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let got = bulk_get(&e, &Grant::all(), &s, vec!["x".into(), "y".into()], 10)
            .await
            .unwrap();
        let sum: i64 = got
            .iter()
            .map(|b| {
                std::str::from_utf8(&b.entry.as_ref().unwrap().value)
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(sum, 100, "a torn bulk get after {reads} reads: {got:?}");
        reads += 1;
    }
    writer.await.unwrap();
}
