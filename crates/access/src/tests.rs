use std::path::Path;
use std::time::Duration;

use governor::clock::FakeRelativeClock;

use super::*;

fn rules(text: &str) -> RuleSet {
    RuleSet::parse(Path::new("acl.toml"), text).unwrap_or_else(|e| panic!("{e}"))
}

fn client(id: &str) -> Principal {
    Principal {
        client_id: Some(id.into()),
        ..Principal::default()
    }
}

fn user(name: &str, id: &str) -> Principal {
    Principal {
        username: Some(name.into()),
        client_id: Some(id.into()),
        token: None,
    }
}

fn token(name: &str) -> Principal {
    Principal {
        token: Some(name.into()),
        ..Principal::default()
    }
}

const RULES: &str = r#"
[[rule]]
client_ids = ["dev-*"]
allow = ["read", "write"]
keys = ["devices/{clientId}/*"]

[[rule]]
usernames = ["ops"]
tokens = ["console"]
allow = ["read", "observe"]
keys = ["*"]

[[rule]]
anonymous = true
allow = ["read"]
keys = ["public/*"]
"#;

#[test]
fn rule_matrix() {
    let r = rules(RULES);
    let may = |p: &Principal, op, key: &str| r.allowed(p).may(op, key.as_bytes());
    let dev = client("dev-1");
    assert!(may(&dev, Op::Read, "devices/dev-1/t"));
    assert!(may(&dev, Op::Write, "devices/dev-1/t"));
    assert!(!may(&dev, Op::Observe, "devices/dev-1/t"), "observe is not granted");
    assert!(!may(&dev, Op::Write, "devices/dev-2/t"), "another client's keys");
    assert!(
        may(&dev, Op::Read, "public/x"),
        "dev-1 has no username or token: anonymous"
    );
    let ops = user("ops", "laptop");
    assert!(may(&ops, Op::Read, "devices/dev-2/t"));
    assert!(may(&ops, Op::Observe, "anything"));
    assert!(!may(&ops, Op::Write, "devices/dev-2/t"));
    let console = token("console");
    assert!(may(&console, Op::Read, "k"));
    assert!(!may(&console, Op::Write, "k"));
    let nobody = token("other");
    assert!(!may(&nobody, Op::Read, "public/x"), "a token holder is not anonymous");
    assert!(!may(&nobody, Op::Read, "k"));
    assert!(may(&Principal::default(), Op::Read, "public/x"));
    assert!(!may(&Principal::default(), Op::Write, "public/x"));
}

#[test]
fn placeholders_are_literal() {
    let r = rules(RULES);
    // A client id with glob characters must not widen its rule.
    let sneaky = client("dev-*");
    assert!(!r.allowed(&sneaky).may(Op::Read, b"devices/dev-1/t"));
    assert!(r.allowed(&sneaky).may(Op::Read, b"devices/dev-*/t"));
    // A placeholder the principal lacks matches nothing.
    let r = rules("[[rule]]\ntokens=[\"*\"]\nallow=[\"read\"]\nkeys=[\"u/{username}/*\", \"t/{token}\"]\n");
    assert!(!r.allowed(&token("a")).may(Op::Read, b"u//x"));
    assert!(r.allowed(&token("a")).may(Op::Read, b"t/a"));
}

#[test]
fn no_rule_no_access() {
    let r = rules("");
    assert!(r.is_empty());
    assert!(!r.allowed(&client("x")).may(Op::Read, b"k"));
}

#[test]
fn bad_rules_name_the_line() {
    let cases = [
        (
            "[[rule]]\nclient_ids=[\"a\"]\nallow=[\"fly\"]\nkeys=[\"*\"]\n",
            1,
            "unknown permission",
        ),
        ("\n\n[[rule]]\nallow=[\"read\"]\nkeys=[\"*\"]\n", 3, "applies to nobody"),
        (
            "[[rule]]\nanonymous=true\nallow=[\"read\"]\nkeys=[\"a/{user}\"]\n",
            1,
            "braces",
        ),
        (
            "[[rule]]\nanonymous=true\nallow=[\"read\"]\nkeys=[\"[\"]\n",
            1,
            "key glob",
        ),
        (
            "\n[[rule]]\nanonymous=true\nallow=[\"read\"]\nkeys=[\"*\"]\ncolour=1\n",
            6,
            "colour",
        ),
        ("[[rule]]\nanonymous = tru\n", 2, ""),
        ("[[rule]]\nanonymous=true\nkeys=[\"*\"]\n", 1, "allow"),
    ];
    for (text, line, needle) in cases {
        let e = RuleSet::parse(Path::new("/etc/acl.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("/etc/acl.toml:{line}: ")), "{text:?}: {e}");
        assert!(e.contains(needle), "{text:?}: {e}");
    }
}

#[test]
fn tokens_file() {
    let t = Tokens::parse(
        Path::new("t"),
        "# named tokens\nconsole: 0123456789abcdef0\n\nci:fedcba98765432100\n",
    )
    .unwrap();
    assert_eq!(t.name_of("0123456789abcdef0"), Some("console"));
    assert_eq!(t.name_of("fedcba98765432100"), Some("ci"));
    assert_eq!(t.name_of("0123456789abcdef"), None);
    let t = t.with_default(Some("s3cret"));
    assert_eq!(t.name_of("s3cret"), Some(identity::DEFAULT_TOKEN_NAME));
    for (text, line) in [
        ("a:short", 1),
        ("\nnocolon", 2),
        ("a:0123456789abcdef0\na:0123456789abcdef1", 2),
    ] {
        let e = Tokens::parse(Path::new("t"), text).unwrap_err().to_string();
        assert!(e.starts_with(&format!("t:{line}: ")), "{e}");
    }
}

#[test]
fn tokens_compare_exactly() {
    assert!(token_matches("s3cret", Some("s3cret")));
    assert!(!token_matches("s3cret", Some("s3creT")));
    assert!(!token_matches("s3cret", Some("s3cre")));
    assert!(!token_matches("s3cret", Some("")));
    assert!(!token_matches("s3cret", None));
}

#[test]
fn password_round_trip() {
    let line = identity::hash_entry("alice", b"pw one").unwrap();
    assert!(line.starts_with("alice:$argon2id$"), "{line}");
    let p = Passwords::parse(Path::new("pw"), &format!("# users\n{line}\n")).unwrap();
    assert!(p.verify("alice", b"pw one"));
    assert!(!p.verify("alice", b"pw two"));
    assert!(!p.verify("bob", b"pw one"));
    assert!(identity::hash_entry("a:b", b"x").is_err());
    for (text, line) in [
        ("alice", 1),
        ("\nalice:plaintext", 2),
        (&*format!("{line}\n{line}"), 2),
        ("bob:$2b$12$abcdefghijklmnopqrstuuMPuEmq0C5d0W5BnL3.u3g3t2nR9qQ6.", 1),
    ] {
        let e = Passwords::parse(Path::new("pw"), text).unwrap_err().to_string();
        assert!(e.starts_with(&format!("pw:{line}: ")), "{e}");
    }
}

#[test]
fn sealed_positions_hide_keys() {
    let access = Access::open();
    let grant = access.grant(client("c"));
    let filter = KeyFilter::new(|k: &[u8]| k.starts_with(b"mine/"));
    let plain = grant.position_token(Some(&filter), b"mine/a", Pages::Scan);
    assert_eq!(plain, hex::encode_upper(b"mine/a"), "a readable key may be named");
    let sealed = grant.position_token(Some(&filter), b"secret/key", Pages::Scan);
    assert!(!sealed.contains(&hex::encode_upper(b"secret")), "{sealed}");
    assert_eq!(
        grant.open_position(sealed.as_bytes(), Pages::Scan).unwrap(),
        b"secret/key"
    );
    let mut forged = sealed.clone().into_bytes();
    let last = forged.len() - 1;
    forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
    assert!(grant.open_position(&forged, Pages::Scan).is_none());
    // Another process (another key) cannot open it either.
    assert!(
        Access::open()
            .grant(client("c"))
            .open_position(sealed.as_bytes(), Pages::Scan)
            .is_none()
    );
    // Nor the same process for another caller, store or operation.
    let keys = Pages::Keys { store: "statestore" };
    assert!(
        access
            .grant(client("d"))
            .open_position(sealed.as_bytes(), Pages::Scan)
            .is_none()
    );
    assert!(
        access
            .grant(user("c", "c"))
            .open_position(sealed.as_bytes(), Pages::Scan)
            .is_none()
    );
    assert!(grant.open_position(sealed.as_bytes(), keys).is_none());
    let listed = grant.position_token(Some(&filter), b"secret/key", keys);
    assert!(grant.open_position(listed.as_bytes(), keys).is_some());
    assert!(
        grant
            .open_position(listed.as_bytes(), Pages::Keys { store: "other" })
            .is_none()
    );
}

fn limit_settings(rate_per_sec: u32, burst: u32, max_streams: Option<usize>) -> LimitSettings {
    LimitSettings {
        rate_per_sec: std::num::NonZeroU32::new(rate_per_sec),
        burst: std::num::NonZeroU32::new(burst),
        max_streams,
    }
}

/// Rates on a clock the test moves: a bucket refills only when the test advances the clock, so
/// every refusal and every refill below is exact however slow the machine runs.
fn limits_on_clock(s: &LimitSettings) -> (limits::Limits<FakeRelativeClock>, FakeRelativeClock) {
    let clock = FakeRelativeClock::default();
    (limits::Limits::with_clock(s, clock.clone()), clock)
}

#[test]
fn rate_per_principal() {
    let (limits, clock) = limits_on_clock(&limit_settings(1, 3, None));
    for i in 0..3 {
        assert!(limits.take("a"), "request {i} of a's burst");
    }
    assert!(!limits.take("a"), "a's bucket is empty");
    assert!(limits.take("b"), "another principal has its own bucket");
    assert_eq!(limits.refused(), 1);
    // One request a second comes back, not sooner.
    clock.advance(Duration::from_millis(999));
    assert!(!limits.take("a"), "refilled before a second");
    clock.advance(Duration::from_millis(1));
    assert!(limits.take("a"), "a second refills one request");
    assert!(!limits.take("a"), "one request, not more");
    // A long pause fills the bucket up to the burst, and no further.
    clock.advance(Duration::from_secs(60));
    for i in 0..3 {
        assert!(limits.take("a"), "request {i} of the refilled burst");
    }
    assert!(!limits.take("a"), "the burst bounds the bucket");
    assert_eq!(limits.refused(), 4);
}

#[test]
fn streams_per_principal() {
    let settings = AccessSettings {
        limits: LimitSettings {
            max_streams: Some(1),
            ..LimitSettings::default()
        },
        ..AccessSettings::default()
    };
    let access = Access::load(&settings, None).unwrap();
    let (a, b) = (client("a"), client("b"));
    let slot = access.open_stream(&a).unwrap();
    assert!(matches!(access.open_stream(&a), Err(EngineError::RateLimited)));
    access.open_stream(&b).expect("another principal has its own count");
    drop(slot);
    access.open_stream(&a).expect("a closed stream frees its slot");
    assert_eq!(access.refused_by_limits(), 1);
}

#[test]
fn limits_change_live() {
    let (limits, clock) = limits_on_clock(&LimitSettings::default());
    for _ in 0..100 {
        assert!(limits.take("a"), "no rate: unlimited");
    }
    let mut open: Vec<_> = (0..3).map(|_| limits.open_stream("a").unwrap()).collect();
    limits.apply(&limit_settings(1, 2, Some(2)));
    assert!(
        limits.take("a") && limits.take("a"),
        "a new rate starts with a full bucket"
    );
    assert!(!limits.take("a"));
    // The streams opened before the limit count against it.
    assert!(limits.open_stream("a").is_none());
    open.truncate(1);
    open.push(limits.open_stream("a").expect("under the new limit again"));
    assert!(limits.open_stream("a").is_none());
    // Applying the same rate again keeps the buckets as they are: still empty, and refilled
    // on the same schedule.
    limits.apply(&limit_settings(1, 2, None));
    assert!(!limits.take("a"), "the same rate reapplied refilled the bucket");
    open.push(limits.open_stream("a").expect("no stream limit any more"));
    clock.advance(Duration::from_secs(1));
    assert!(limits.take("a"));
    assert!(!limits.take("a"));
    // A different rate starts every bucket full (at its own burst).
    limits.apply(&limit_settings(1, 3, None));
    for i in 0..3 {
        assert!(limits.take("a"), "request {i} of the new rate's burst");
    }
    assert!(!limits.take("a"));
    // No rate at all: unlimited again.
    limits.apply(&LimitSettings::default());
    assert!(limits.take("a"));
}

#[test]
fn bound_client_ids_are_the_identity_or_start_with_it_and_a_colon() {
    use identity::client_id_bound;
    for (id, identity) in [
        ("dev-1", "dev-1"),
        ("dev-1:logger", "dev-1"),
        ("CN=a, O=b:x", "CN=a, O=b"),
    ] {
        assert!(client_id_bound(id, identity), "{id} / {identity}");
    }
    for (id, identity) in [
        ("dev-2", "dev-1"),
        ("dev-1x", "dev-1"),
        ("dev-1-2", "dev-1"),
        ("x:dev-1", "dev-1"),
        ("", ""),
        // An identity with the separator binds nothing: else CN `sensor` would own CN
        // `sensor:1`'s ids, and `sensor:1` would share them.
        ("sensor:1", "sensor:1"),
        ("sensor:1:a", "sensor:1"),
        ("CN=a, O=b:x", "CN=a, O=b:x"),
    ] {
        assert!(!client_id_bound(id, identity), "{id} / {identity}");
    }
    let open = Access::open();
    assert!(open.may_use_client_id("anything", None), "without binding any id goes");
    let bound = Access::load(
        &AccessSettings {
            bind_client_id: true,
            ..AccessSettings::default()
        },
        None,
    )
    .unwrap();
    assert!(bound.may_use_client_id("dev-1:a", Some("dev-1")));
    assert!(!bound.may_use_client_id("dev-2", Some("dev-1")));
    assert!(
        !bound.may_use_client_id("dev-1", None),
        "an anonymous client has no identity to bind to"
    );
}

#[test]
fn the_service_password_is_random_per_process_and_checked_whole() {
    let (a, b) = (Access::open(), Access::open());
    assert_eq!(a.service_password().len(), 64);
    assert_ne!(a.service_password(), b.service_password());
    assert!(a.is_service_password(a.service_password().as_bytes()));
    assert!(!a.is_service_password(b.service_password().as_bytes()));
    assert!(!a.is_service_password(&a.service_password().as_bytes()[..63]));
    assert!(!a.is_service_password(b""));
    assert!(
        !format!("{a:?}").contains(a.service_password()),
        "never in Debug output"
    );
}
