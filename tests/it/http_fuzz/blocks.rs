//! The Dapr lock and configuration routes in the barrage: their stores and the other building
//! blocks' stores, bad segments, bad bodies (daprd reads lock bodies with protojson), bad
//! parameters, odd keys, wrong methods; each case with the answer it must get.

use reqwest::Method;
use serde_json::json;

use super::*;

const LOCK_STORE: &str = "lockstore";
const CONFIG_STORE: &str = "configstore";
const LOCK_NOT_FOUND: &str = "ERR_LOCK_STORE_NOT_FOUND";
const CONFIG_NOT_FOUND: &str = "ERR_CONFIGURATION_STORE_NOT_FOUND";
const NO_SUBSCRIPTION: &str = "ERR_CONFIGURATION_UNSUBSCRIBE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Lock,
    Unlock,
    Get,
    Subscribe,
    Unsubscribe,
}

impl Block {
    fn is_lock(self) -> bool {
        matches!(self, Block::Lock | Block::Unlock)
    }
}

fn routes(store: &str, id: &str) -> Vec<(Block, Method, String)> {
    vec![
        (Block::Lock, Method::POST, format!("/v1.0-alpha1/lock/{store}")),
        (Block::Unlock, Method::POST, format!("/v1.0-alpha1/unlock/{store}")),
        (Block::Get, Method::GET, format!("/v1.0/configuration/{store}")),
        (Block::Get, Method::GET, format!("/v1.0-alpha1/configuration/{store}")),
        (
            Block::Subscribe,
            Method::GET,
            format!("/v1.0/configuration/{store}/subscribe"),
        ),
        (
            Block::Subscribe,
            Method::GET,
            format!("/v1.0-alpha1/configuration/{store}/subscribe"),
        ),
        (
            Block::Unsubscribe,
            Method::GET,
            format!("/v1.0/configuration/{store}/{id}/unsubscribe"),
        ),
    ]
}

/// A store segment refused before anything else: not decodable, or not this block's store.
fn bad_store(block: Block, store: &str) -> Option<Expect> {
    if !decodes(store) {
        Some(refused(400, MALFORMED))
    } else if block.is_lock() && store != LOCK_STORE {
        Some(refused(400, LOCK_NOT_FOUND))
    } else if !block.is_lock() && store != CONFIG_STORE {
        Some(refused(400, CONFIG_NOT_FOUND))
    } else {
        None
    }
}

/// The block's own store, no body and no parameters: a lock needs its fields; a get and a
/// subscription are fine; no subscription has id `k0`.
fn bare(block: Block) -> Expect {
    match block {
        Block::Lock | Block::Unlock => refused(400, MALFORMED),
        Block::Get | Block::Subscribe => Expect::Valid,
        Block::Unsubscribe => refused(404, NO_SUBSCRIPTION),
    }
}

/// Lock bodies with wrong types and values, and the answer of TryLock and of Unlock (which
/// reads no expiry).
const LOCK_BODIES: [(&str, bool, bool); 16] = [
    (
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":1.5}"#,
        false,
        true,
    ),
    (
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":"x"}"#,
        false,
        true,
    ),
    (
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":99999999999}"#,
        false,
        true,
    ),
    (
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":-1}"#,
        false,
        true,
    ),
    (
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":[]}"#,
        false,
        true,
    ),
    // Unlock has no expiry: the field is skipped unread, as protojson skips unknown fields.
    (
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":1e400}"#,
        false,
        true,
    ),
    (r#"{"resourceId":1,"lockOwner":"o","expiryInSeconds":1}"#, false, false),
    (r#"{"resourceId":"r","lockOwner":{},"expiryInSeconds":1}"#, false, false),
    (r#"{"resourceId":"","lockOwner":"o","expiryInSeconds":1}"#, false, false),
    (
        r#"{"resourceId":"a||b","lockOwner":"o","expiryInSeconds":1}"#,
        false,
        false,
    ),
    (r#"{"resourceId":"r","lockOwner":"","expiryInSeconds":1}"#, false, false),
    // protojson reads the proto field names too, and an int32 in a string.
    (
        r#"{"resource_id":"r","lock_owner":"o","expiry_in_seconds":"3"}"#,
        true,
        true,
    ),
    (
        r#"{"resourceId":null,"lockOwner":null,"expiryInSeconds":null}"#,
        false,
        false,
    ),
    (
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":2147483647}"#,
        true,
        true,
    ),
    (r#"[{"resourceId":"r"}]"#, false, false),
    (
        r#"{"resourceId":"r","lockOwner":"\u0000","expiryInSeconds":1}"#,
        true,
        true,
    ),
];

fn verdict(valid: bool) -> Expect {
    if valid { Expect::Valid } else { refused(400, MALFORMED) }
}

/// One of [`BAD_QUERIES`] on a configuration route (the lock routes read no parameter).
fn query_verdict(block: Block, query: &str) -> Expect {
    let only_metadata = query
        .split('&')
        .all(|p| p.starts_with("metadata.") && !p.starts_with("metadata.="));
    match block {
        Block::Lock | Block::Unlock | Block::Unsubscribe => bare(block),
        Block::Get if only_metadata => Expect::Valid,
        Block::Subscribe if only_metadata => Expect::Valid,
        Block::Subscribe if query == "since=000000000000001:00000:gone&snapshot=true" => Expect::Valid,
        // Unknown parameters, keys that cannot be keys, bad resume positions.
        Block::Get | Block::Subscribe => refused(400, MALFORMED),
    }
}

pub(super) fn matrix() -> Vec<(Req, Expect)> {
    let mut out = Vec::new();
    let stores = [LOCK_STORE, CONFIG_STORE, "statestore", "nostore", "%2F"];
    for store in stores.iter().copied().chain(BAD_SEGMENTS) {
        for (block, m, p) in routes(store, "k0") {
            out.push((Req::new(m, p), bad_store(block, store).unwrap_or(bare(block))));
        }
    }
    // Subscription ids that do not decode are malformed; the others are simply unknown.
    for id in BAD_SEGMENTS
        .iter()
        .copied()
        .chain(["%7C%7C", "%2F", "0123456789abcdef0123456789abcdef"])
    {
        let p = format!("/v1.0/configuration/{CONFIG_STORE}/{id}/unsubscribe");
        let expect = if decodes(id) {
            refused(404, NO_SUBSCRIPTION)
        } else {
            refused(400, MALFORMED)
        };
        out.push((Req::new(Method::GET, p), expect));
    }
    for store in [LOCK_STORE, CONFIG_STORE] {
        for (block, m, p) in routes(store, "k0") {
            if bad_store(block, store).is_some() {
                continue;
            }
            if block.is_lock() {
                for (body, lock_ok, unlock_ok) in LOCK_BODIES {
                    let ok = if block == Block::Lock { lock_ok } else { unlock_ok };
                    out.push((
                        Req::new(m.clone(), p.clone()).body(body.as_bytes().to_vec()),
                        verdict(ok),
                    ));
                }
                // Every malformed or wrong-shaped body lacks a lock's fields.
                for b in bad_bodies() {
                    out.push((Req::new(m.clone(), p.clone()).body(b), refused(400, MALFORMED)));
                }
                for b in oversized_bodies() {
                    out.push((Req::new(m.clone(), p.clone()).body(b), refused(413, MALFORMED)));
                }
                for key in ODD_KEYS {
                    let body = json!({"resourceId": key, "lockOwner": "o", "expiryInSeconds": 30});
                    out.push((Req::new(m.clone(), p.clone()).json(&body), verdict(!key.contains("||"))));
                }
            }
            for q in BAD_QUERIES {
                out.push((Req::new(m.clone(), p.clone()).query(q), query_verdict(block, q)));
            }
            if matches!(block, Block::Get | Block::Subscribe) {
                for key in ODD_KEYS {
                    let expect = verdict(!key.contains("||"));
                    out.push((
                        Req::new(m.clone(), p.clone()).query(format!("key={}", path_seg(key))),
                        expect,
                    ));
                }
            }
            for wrong in [Method::PUT, Method::DELETE, Method::PATCH] {
                out.push((Req::new(wrong, p.clone()), refused(405, METHOD_NOT_ALLOWED)));
            }
            out.push((Req::new(m.clone(), format!("{p}/")), bare(block)));
        }
    }
    out
}
