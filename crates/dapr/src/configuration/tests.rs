use std::sync::Arc;

use super::*;
use crate::access::Grant;
use crate::engine::{Command, Limits, Set, SetCondition};
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

async fn set(e: &Engine, key: &str, value: &[u8], ttl_ms: Option<u64>) -> Hlc {
    let cmd = Set {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value),
        condition: SetCondition::Always,
        ttl_ms,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    e.execute(Command::Set(cmd)).await.unwrap().version.unwrap()
}

fn store(s: &str) -> StoreSpec {
    s.parse().unwrap()
}

#[tokio::test]
async fn get_named_keys_and_every_key() {
    let e = engine().await;
    let v = set(&e, "a", b"\"json text\"", Some(5_000)).await;
    set(&e, "b", b"\xff\x00", None).await;
    set(&e, "other||c", b"x", None).await;
    let s = store("configstore");
    let got = get(&e, &Grant::all(), &s, vec!["a".into(), "missing".into()], 10, 100)
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "a missing key is left out");
    let (key, a) = &got[0];
    assert_eq!(key, "a");
    assert_eq!(a.value, "\"json text\"", "the stored text, quotes included");
    assert_eq!(a.version, v.to_string());
    assert_eq!(a.metadata["ttlExpireTime"], crate::rfc3339(1_005_000));
    // Every key of the store: not the keys of prefixed stores.
    let all = get(&e, &Grant::all(), &s, vec![], 10, 100).await.unwrap();
    let names: Vec<_> = all.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(all[1].1.value, "/wA=");
    assert_eq!(all[1].1.metadata[ENCODING_METADATA], "base64");
    let prefixed = get(&e, &Grant::all(), &store("cfg=other"), vec![], 10, 100)
        .await
        .unwrap();
    assert_eq!(prefixed.len(), 1);
    assert_eq!(prefixed[0].0, "c");
}

#[tokio::test]
async fn get_is_bounded() {
    let e = engine().await;
    for i in 0..5 {
        set(&e, &format!("k{i}"), b"1", None).await;
    }
    let s = store("configstore");
    assert_eq!(get(&e, &Grant::all(), &s, vec![], 5, 2).await.unwrap().len(), 5);
    let err = get(&e, &Grant::all(), &s, vec![], 4, 2).await.unwrap_err().to_string();
    assert!(err.contains("more than 4 keys"), "{err}");
    let named = (0..5).map(|i| format!("k{i}")).collect();
    assert!(matches!(
        get(&e, &Grant::all(), &s, named, 4, 2).await,
        Err(DaprError::Malformed(_))
    ));
    let bad = vec!["k1".into(), "a||b".into()];
    assert!(matches!(
        get(&e, &Grant::all(), &s, bad, 4, 2).await,
        Err(DaprError::Malformed(_))
    ));
}

/// A caller who may read few keys of a large store is refused once the examined keys pass
/// the bound, instead of walking the whole store for them.
#[tokio::test]
async fn get_of_every_key_examines_a_bounded_number_of_keys() {
    let e = engine().await;
    for i in 0..3000 {
        set(&e, &format!("b{i:05}"), b"1", None).await;
    }
    set(&e, "z-mine", b"1", None).await;
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[[rule]]\nclient_ids = [\"dev-1\"]\nallow = [\"read\"]\nkeys = [\"z-*\"]\n",
    )
    .unwrap();
    let access = crate::access::Access::load(
        &crate::access::AccessSettings {
            acl_file: Some(acl),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let grant = access.grant(crate::access::Principal {
        client_id: Some("dev-1".into()),
        ..Default::default()
    });
    let s = store("configstore");
    // 3,001 keys to walk for one readable key: past 10 x 100 examined keys, refused.
    let err = get(&e, &grant, &s, vec![], 100, 1000).await.unwrap_err().to_string();
    assert!(err.contains("examines at most 1000 keys"), "{err}");
    // A bound that covers the store finds the one key.
    let got = get(&e, &grant, &s, vec![], 1000, 1000).await.unwrap();
    assert_eq!(got.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["z-mine"]);
}

#[test]
fn changes_as_items() {
    let v = Hlc::new(5, 1, "n");
    let change = |kind| Change {
        key: Bytes::from("k"),
        version: v.clone(),
        kind,
    };
    let set = item_of_change(&change(ChangeKind::Set(Bytes::from("on"))));
    assert_eq!((set.value.as_str(), set.version.clone()), ("on", v.to_string()));
    assert!(set.metadata.is_empty());
    let del = item_of_change(&change(ChangeKind::Delete));
    assert_eq!(del.value, "");
    assert_eq!(del.metadata, HashMap::from([("deleted".into(), "true".into())]));
    let exp = item_of_change(&change(ChangeKind::Expire));
    assert_eq!(exp.metadata["expired"], "true");
}

#[tokio::test]
async fn subscriptions_end_by_id_and_leave_when_dropped() {
    let subs = Arc::new(Subscriptions::default());
    let owner = crate::access::Principal {
        token: Some("app".into()),
        ..Default::default()
    };
    let a = subs.open(&owner);
    let b = subs.open(&owner);
    assert_ne!(a.id(), b.id());
    assert_eq!(a.id().len(), 32);
    assert_eq!(subs.len(), 2);
    // Someone else's id ends nothing.
    for other in [
        crate::access::Principal::default(),
        crate::access::Principal {
            token: Some("viewer".into()),
            ..Default::default()
        },
    ] {
        assert!(!subs.close(a.id(), &other));
    }
    assert_eq!(subs.len(), 2);
    // Closed before anyone waits: the stop is not lost.
    assert!(subs.close(a.id(), &owner));
    a.stopped().await;
    assert!(!subs.close(a.id(), &owner), "already ended");
    assert!(!subs.close("nope", &owner));
    drop(b);
    assert!(subs.is_empty());
}
