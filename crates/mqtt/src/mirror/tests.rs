use super::*;
use crate::hlc::Hlc;

fn topics(set_by_publish: bool) -> StateTopics {
    StateTopics {
        prefix: "state/".into(),
        set_by_publish,
        external_broker: false,
    }
}

#[test]
fn keys_that_can_be_topics() {
    let t = topics(false);
    assert_eq!(t.topic_of(b"foo").as_deref(), Some("state/foo"));
    assert_eq!(t.topic_of(b"devices/7/temp").as_deref(), Some("state/devices/7/temp"));
    assert_eq!(t.topic_of(b"a/set").as_deref(), Some("state/a/set"));
    assert_eq!(
        t.topic_of("caf\u{e9} $x".as_bytes()).as_deref(),
        Some("state/caf\u{e9} $x")
    );
    for bad in [
        &b""[..],
        b"/a",
        b"a/",
        b"a//b",
        b"a+b",
        b"a/#",
        b"a\0b",
        b"a\nb",
        b"\xff\xfe",
    ] {
        assert_eq!(t.topic_of(bad), None, "{bad:?}");
    }
    let longest = "k".repeat(MAX_TOPIC_BYTES - "state/".len());
    assert!(t.topic_of(longest.as_bytes()).is_some());
    assert_eq!(t.topic_of(format!("{longest}k").as_bytes()), None);
    // With set-by-publish a key ending in `set` would share its topic with a set request.
    let s = topics(true);
    assert_eq!(s.topic_of(b"a/set"), None);
    assert_eq!(s.topic_of(b"set").as_deref(), Some("state/set"));
    assert_eq!(s.topic_of(b"a/settings").as_deref(), Some("state/a/settings"));
}

#[test]
fn topics_back_to_keys() {
    let t = topics(true);
    assert_eq!(t.key_of("state/a/b"), Some("a/b"));
    assert_eq!(t.key_of("state/a/set"), None);
    assert_eq!(t.key_of("other/a"), None);
    assert_eq!(t.key_of("state/"), None);
    assert_eq!(t.set_key_of("state/a/b/set"), Some("a/b"));
    assert_eq!(t.set_key_of("state/set"), None);
    assert_eq!(t.set_key_of("state//set"), None);
    // Keys the mirror could never carry are no set requests, though shaped like one.
    for (topic, shaped) in [
        ("state/a//set", true),
        ("state/x/set/set", true),
        ("state//a/set", true),
        ("state/a+b/set", true),
        ("state//set", true),
        ("state/set", false),
    ] {
        assert_eq!(t.set_key_of(topic), None, "{topic}");
        assert_eq!(t.is_set_topic(topic), shaped, "{topic}");
    }
    assert!(t.is_set_topic("state/a/b/set"));
    assert!(!topics(false).is_set_topic("state/a/set"));
    assert_eq!(t.set_key_of("state/a/b"), None);
    assert_eq!(topics(false).set_key_of("state/a/set"), None);
}

#[test]
fn prefixes() {
    for ok in ["state/", "site/7/state/", "a/"] {
        assert!(check_prefix(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "/",
        "state",
        "$state/",
        "st+te/",
        "s#/",
        "/state/",
        "a//",
        "statestore/",
        "clients/x/",
    ] {
        assert!(check_prefix(bad).is_err(), "{bad}");
    }
}

#[test]
fn messages_carry_the_version_and_the_kind() {
    let t = topics(false);
    let version = Hlc::new(1_700_000_000_000, 3, "n1");
    let change = |kind| Change {
        key: Bytes::from_static(b"foo"),
        version: version.clone(),
        kind,
    };
    let set = t.message(&change(ChangeKind::Set(Bytes::from_static(b"42")))).unwrap();
    assert_eq!(set.topic, "state/foo");
    assert_eq!(&set.payload[..], b"42");
    assert_eq!(
        set.user_properties,
        [
            (PROP_VERSION.to_owned(), version.to_string()),
            (PROP_KIND.to_owned(), KIND_SET.to_owned())
        ]
    );
    for (kind, name) in [(ChangeKind::Delete, KIND_DELETE), (ChangeKind::Expire, KIND_EXPIRE)] {
        let m = t.message(&change(kind)).unwrap();
        assert!(m.payload.is_empty(), "an empty retained message clears the topic");
        assert_eq!(m.user_properties[1].1, name);
    }
}

/// Records what the mirror publishes.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<(String, Bytes)>>);

#[async_trait::async_trait]
impl crate::door::Sink for Recorder {
    async fn publish(&self, _out: &crate::request::Outgoing) {}

    async fn publish_retained(&self, msg: &Retained) {
        self.0.lock().unwrap().push((msg.topic.clone(), msg.payload.clone()));
    }
}

#[tokio::test]
async fn a_change_older_than_its_topic_is_not_published() {
    let mirror = Mirror::new(topics(false), Access::open(), Metrics::disabled());
    let sink = Recorder::default();
    let change = |ms, kind| Change {
        key: Bytes::from_static(b"k"),
        version: Hlc::new(ms, 0, "n1"),
        kind,
    };
    let set = |ms, v: &'static [u8]| change(ms, ChangeKind::Set(Bytes::from_static(v)));
    mirror.publish_change(&sink, &set(2, b"new")).await;
    // Older, or the same version again: the topic keeps what it has.
    mirror.publish_change(&sink, &set(1, b"old")).await;
    mirror.publish_change(&sink, &set(2, b"new")).await;
    mirror.publish_change(&sink, &change(1, ChangeKind::Delete)).await;
    // Newer: published; a delete clears the topic, after which any version goes.
    mirror.publish_change(&sink, &change(3, ChangeKind::Delete)).await;
    mirror.publish_change(&sink, &set(1, b"again")).await;
    let seen: Vec<_> = sink.0.lock().unwrap().iter().map(|(_, v)| v.clone()).collect();
    assert_eq!(seen, [&b"new"[..], b"", b"again"]);
}
