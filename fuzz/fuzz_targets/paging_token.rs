//! Paging tokens a client hands back: SCAN and key-list positions (plain upper-case hex, or
//! sealed: `crates/access/src/seal.rs`) and the query API's `page.token`.
//!
//! Whatever comes in: no panic; a token opens only to the key it names (plain hex) or to a key
//! this process sealed for this caller, so bytes from outside never open as a sealed token;
//! and a position this process seals opens again to the same key, for the same caller only.

#![no_main]

use libfuzzer_sys::fuzz_target;
use stategate::access::{Access, Pages, Principal};
use stategate::dapr::query::Query;
use stategate::engine::KeyFilter;

fn principal(id: &str) -> Principal {
    Principal {
        client_id: Some(id.to_owned()),
        ..Principal::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let access = Access::open();
    let grant = access.grant(principal("fuzz"));
    let keys = Pages::Keys { store: "statestore" };

    for of in [Pages::Scan, keys] {
        if let Some(key) = grant.open_position(data, of) {
            assert!(
                hex::encode_upper(&key).as_bytes().eq_ignore_ascii_case(data),
                "a token from outside opened to {key:?}"
            );
        }
    }

    if !data.is_empty() {
        let hidden = KeyFilter::new(|_: &[u8]| false);
        let sealed = grant.position_token(Some(&hidden), data, Pages::Scan);
        assert_eq!(
            grant.open_position(sealed.as_bytes(), Pages::Scan).as_deref(),
            Some(data)
        );
        assert_eq!(grant.open_position(sealed.as_bytes(), keys), None);
        let other = access.grant(principal("other"));
        assert_eq!(other.open_position(sealed.as_bytes(), Pages::Scan), None);
    }

    let token = String::from_utf8_lossy(data);
    let body = serde_json::json!({ "filter": {}, "sort": [{ "key": "a.b" }], "page": { "token": token, "limit": 2 } });
    let _ = Query::parse(&body);
});
