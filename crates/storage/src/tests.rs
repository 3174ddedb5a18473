//! The [`Backend`] contract, as one suite every backend runs (`test_suite(store)`), plus its run
//! on the in-memory backend.
//!
//! The suite expects an empty store and leaves records behind; give it a fresh one.

use bytes::Bytes;

use super::*;

mod deadlines;

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn v(ms: u64, counter: u32) -> Hlc {
    Hlc::new(ms, counter, "suite")
}

fn rec(value: &[u8], version: Hlc, expires_at_ms: Option<u64>) -> Record {
    Record {
        value: b(value),
        version,
        fencing: None,
        expires_at_ms,
        slide_ms: None,
    }
}

fn put(key: &[u8], expected: Option<Hlc>, new: Record) -> Swap {
    Swap {
        key: b(key),
        expected,
        new: Some(new),
        deadline: crate::DeadlineCheck::Any,
    }
}

fn delete(key: &[u8], expected: Hlc) -> Swap {
    Swap {
        key: b(key),
        expected: Some(expected),
        new: None,
        deadline: crate::DeadlineCheck::Any,
    }
}

async fn swap(store: &Store, s: Swap, max_keys: Option<u64>) -> SwapOutcome {
    store
        .backend()
        .swap_many(std::slice::from_ref(&s), max_keys)
        .await
        .unwrap()
}

async fn get(store: &Store, key: &[u8]) -> Option<Record> {
    store.backend().get(key).await.unwrap()
}

async fn len(store: &Store) -> u64 {
    store.backend().len().await.unwrap()
}

async fn wipe(store: &Store) {
    let all = store.backend().scan(None, usize::MAX, 0, &|_| true).await.unwrap();
    for key in all.keys {
        let r = get(store, &key).await.unwrap();
        assert_eq!(swap(store, delete(&key, r.version), None).await, SwapOutcome::Done);
    }
    assert_eq!(len(store).await, 0);
}

/// Every page of a scan from the start; pages must respect `examine` and end.
async fn scan_all(
    store: &Store,
    examine: usize,
    now_ms: u64,
    keep: &(dyn Fn(&[u8]) -> bool + Sync),
) -> (Vec<Bytes>, usize) {
    let mut keys = Vec::new();
    let mut after: Option<Bytes> = None;
    let mut pages = 0;
    loop {
        let page = store
            .backend()
            .scan(after.as_deref(), examine, now_ms, keep)
            .await
            .unwrap();
        pages += 1;
        assert!(page.keys.len() <= examine, "a page examines at most {examine} keys");
        if let (Some(prev), Some(next)) = (&after, &page.resume_after) {
            assert!(next > prev, "resume_after moves forward");
        }
        keys.extend(page.keys);
        match page.resume_after {
            Some(next) => after = Some(next),
            None => return (keys, pages),
        }
        assert!(pages < 10_000, "scan does not end");
    }
}

/// The whole contract. Run it on a fresh, empty store of each backend.
pub(crate) async fn test_suite(store: Store) {
    empty_store(&store).await;
    insert_get_update_delete(&store).await;
    wipe(&store).await;
    conflicts_write_nothing(&store).await;
    wipe(&store).await;
    max_keys(&store).await;
    wipe(&store).await;
    swap_many_is_all_or_nothing(&store).await;
    wipe(&store).await;
    binary_keys_and_values(&store).await;
    wipe(&store).await;
    scan_order_and_paging(&store).await;
    wipe(&store).await;
    scan_skips_expired_and_filters(&store).await;
    wipe(&store).await;
    expiry_index(&store).await;
    wipe(&store).await;
    max_version_is_the_highest_written(&store).await;
    wipe(&store).await;
    every_record_shape_round_trips(&store).await;
    wipe(&store).await;
    concurrent_swaps_are_atomic(&store).await;
    wipe(&store).await;
    get_many_reads_one_moment(&store).await;
    wipe(&store).await;
    deadlines::slides_only_move_a_deadline_forward(&store).await;
    wipe(&store).await;
    deadlines::expiry_removes_only_the_deadline_it_found_passed(&store).await;
}

/// One key rewritten through every shape a record can take (the memory index stores each
/// differently: in place, reallocated, with boxed extras, with a version that does not pack),
/// with a neighbour on each side that must stay intact and in order.
async fn every_record_shape_round_trips(store: &Store) {
    let long_key = [b'k'; 40];
    let fenced = |value: &[u8], version: Hlc, token: Hlc| Record {
        fencing: Some(token),
        ..rec(value, version, None)
    };
    let shapes = vec![
        rec(b"first", v(10, 0), None),
        rec(b"again", v(11, 0), None),        // same length: rewritten in place
        rec(b"longer value", v(12, 1), None), // another length
        rec(b"", v(13, 0), None),
        fenced(b"fenced", v(14, 0), v(14, 0)),
        rec(b"expiring", v(15, 0), Some(900)),
        rec(b"expiring", v(16, 0), Some(800)), // another deadline, same value
        rec(b"plain", v(17, 0), None),
        rec(b"wide", v(18, 200_000), None), // a counter past 17 bits
        Record {
            fencing: Some(Hlc::new(19, 3, "other")),
            ..rec(b"all of it", Hlc::new(19, 4, "yet-another-node"), Some(950))
        },
        Record {
            slide_ms: Some(500),
            ..rec(b"sliding", v(19, 5), Some(1000))
        },
        // A read of a sliding key stores the same record, same version, a later deadline.
        Record {
            slide_ms: Some(500),
            ..rec(b"sliding", v(19, 5), Some(1200))
        },
        rec(b"plain again", v(20, 0), None),
    ];
    for key in [&b"m"[..], &long_key[..]] {
        assert_eq!(
            swap(store, put(b"a", None, rec(b"left", v(1, 0), None)), None).await,
            SwapOutcome::Done
        );
        assert_eq!(
            swap(store, put(b"z", None, rec(b"right", v(1, 0), None)), None).await,
            SwapOutcome::Done
        );
        let mut expected: Option<Hlc> = None;
        for shape in &shapes {
            let outcome = swap(store, put(key, expected.clone(), shape.clone()), None).await;
            assert_eq!(outcome, SwapOutcome::Done, "{shape:?}");
            assert_eq!(get(store, key).await.as_ref(), Some(shape));
            assert_eq!(
                scan_keys(store).await,
                vec![b(b"a"), b(key), b(b"z")],
                "order after {shape:?}"
            );
            let deadline = store.backend().next_deadline().await.unwrap();
            assert_eq!(deadline, shape.expires_at_ms, "deadline after {shape:?}");
            expected = Some(shape.version.clone());
        }
        assert_eq!(get(store, b"a").await, Some(rec(b"left", v(1, 0), None)));
        assert_eq!(get(store, b"z").await, Some(rec(b"right", v(1, 0), None)));
        assert_eq!(swap(store, delete(key, v(20, 0)), None).await, SwapOutcome::Done);
        assert_eq!(get(store, key).await, None);
        assert_eq!(len(store).await, 2);
        wipe(store).await;
    }
}

async fn scan_keys(store: &Store) -> Vec<Bytes> {
    store.backend().scan(None, usize::MAX, 0, &|_| true).await.unwrap().keys
}

async fn empty_store(store: &Store) {
    let be = store.backend();
    assert_eq!(be.get(b"k").await.unwrap(), None);
    assert_eq!(be.len().await.unwrap(), 0);
    assert_eq!(be.next_deadline().await.unwrap(), None);
    assert_eq!(be.max_version().await.unwrap(), None);
    assert_eq!(be.expired(u64::MAX, 10).await.unwrap(), vec![]);
    let page = be.scan(None, 10, 0, &|_| true).await.unwrap();
    assert!(page.keys.is_empty() && page.resume_after.is_none());
}

async fn insert_get_update_delete(store: &Store) {
    let r1 = Record {
        value: b(b"v1"),
        version: v(100, 0),
        fencing: Some(v(90, 3)),
        expires_at_ms: Some(5_000),
        slide_ms: None,
    };
    // Insert: expected None means "must be absent".
    assert_eq!(swap(store, put(b"k", None, r1.clone()), None).await, SwapOutcome::Done);
    assert_eq!(get(store, b"k").await, Some(r1.clone()), "every field is stored");
    assert_eq!(len(store).await, 1);

    // Update with the version read.
    let r2 = rec(b"v2", v(101, 0), None);
    assert_eq!(
        swap(store, put(b"k", Some(r1.version.clone()), r2.clone()), None).await,
        SwapOutcome::Done
    );
    assert_eq!(
        get(store, b"k").await,
        Some(r2.clone()),
        "the old fields are all replaced"
    );
    assert_eq!(len(store).await, 1);

    // Delete with the version read.
    assert_eq!(
        swap(store, delete(b"k", r2.version.clone()), None).await,
        SwapOutcome::Done
    );
    assert_eq!(get(store, b"k").await, None);
    assert_eq!(len(store).await, 0);

    // Deleting an absent key with `expected: None` is a no-op that succeeds.
    let noop = Swap {
        key: b(b"k"),
        expected: None,
        new: None,
        deadline: crate::DeadlineCheck::Any,
    };
    assert_eq!(swap(store, noop, None).await, SwapOutcome::Done);
    assert_eq!(len(store).await, 0);
}

async fn conflicts_write_nothing(store: &Store) {
    let r1 = rec(b"v1", v(200, 0), None);
    assert_eq!(swap(store, put(b"k", None, r1.clone()), None).await, SwapOutcome::Done);

    // Insert over a present key.
    let other = rec(b"other", v(201, 0), Some(1));
    assert_eq!(
        swap(store, put(b"k", None, other.clone()), None).await,
        SwapOutcome::Conflict
    );
    // Update with a stale version (same ms, other counter; other node).
    assert_eq!(
        swap(store, put(b"k", Some(v(200, 1)), other.clone()), None).await,
        SwapOutcome::Conflict
    );
    assert_eq!(
        swap(
            store,
            put(b"k", Some(Hlc::new(200, 0, "other-node")), other.clone()),
            None
        )
        .await,
        SwapOutcome::Conflict
    );
    // Delete with a stale version.
    assert_eq!(swap(store, delete(b"k", v(199, 0)), None).await, SwapOutcome::Conflict);
    assert_eq!(get(store, b"k").await, Some(r1), "nothing was written");
    assert_eq!(
        store.backend().next_deadline().await.unwrap(),
        None,
        "no deadline leaked"
    );

    // Update or delete of an absent key.
    assert_eq!(
        swap(store, put(b"absent", Some(v(1, 0)), other.clone()), None).await,
        SwapOutcome::Conflict
    );
    assert_eq!(
        swap(store, delete(b"absent", v(1, 0)), None).await,
        SwapOutcome::Conflict
    );
    assert_eq!(get(store, b"absent").await, None);
    assert_eq!(len(store).await, 1);
}

async fn max_keys(store: &Store) {
    let max = Some(2);
    assert_eq!(
        swap(store, put(b"a", None, rec(b"1", v(300, 0), None)), max).await,
        SwapOutcome::Done
    );
    assert_eq!(
        swap(store, put(b"b", None, rec(b"1", v(300, 1), None)), max).await,
        SwapOutcome::Done
    );
    // A third key does not fit.
    assert_eq!(
        swap(store, put(b"c", None, rec(b"1", v(300, 2), Some(9))), max).await,
        SwapOutcome::TooManyKeys
    );
    assert_eq!(get(store, b"c").await, None);
    assert_eq!(store.backend().next_deadline().await.unwrap(), None);
    assert_eq!(len(store).await, 2);
    // Overwriting a key at the limit is fine.
    assert_eq!(
        swap(store, put(b"a", Some(v(300, 0)), rec(b"2", v(300, 3), None)), max).await,
        SwapOutcome::Done
    );
    // A delete is fine at the limit, and makes room.
    assert_eq!(swap(store, delete(b"b", v(300, 1)), max).await, SwapOutcome::Done);
    assert_eq!(
        swap(store, put(b"c", None, rec(b"1", v(300, 4), None)), max).await,
        SwapOutcome::Done
    );
    // Replacing one key by another in one swap keeps the count.
    let replace = [delete(b"c", v(300, 4)), put(b"d", None, rec(b"1", v(300, 5), None))];
    assert_eq!(
        store.backend().swap_many(&replace, max).await.unwrap(),
        SwapOutcome::Done
    );
    assert_eq!(get(store, b"c").await, None);
    assert!(get(store, b"d").await.is_some());
    // A conflict is reported before the count.
    assert_eq!(
        swap(store, put(b"a", None, rec(b"1", v(300, 6), None)), Some(0)).await,
        SwapOutcome::Conflict
    );
    // No limit.
    assert_eq!(
        swap(store, put(b"e", None, rec(b"1", v(300, 7), None)), None).await,
        SwapOutcome::Done
    );
    assert_eq!(len(store).await, 3);
}

async fn swap_many_is_all_or_nothing(store: &Store) {
    let be = store.backend();
    let both = [
        put(b"x", None, rec(b"1", v(400, 0), Some(10))),
        put(b"y", None, rec(b"1", v(400, 0), None)),
    ];
    assert_eq!(be.swap_many(&both, None).await.unwrap(), SwapOutcome::Done);
    assert_eq!(len(store).await, 2);

    // The second swap conflicts: the first is not applied either.
    let mixed = [
        put(b"x", Some(v(400, 0)), rec(b"2", v(401, 0), None)),
        put(b"y", Some(v(399, 0)), rec(b"2", v(401, 0), None)),
    ];
    assert_eq!(be.swap_many(&mixed, None).await.unwrap(), SwapOutcome::Conflict);
    assert_eq!(get(store, b"x").await.unwrap().value, b(b"1"));
    assert_eq!(get(store, b"x").await.unwrap().expires_at_ms, Some(10));
    assert_eq!(be.next_deadline().await.unwrap(), Some(10));

    // The first conflicts: the second is not applied.
    let mixed = [delete(b"x", v(1, 0)), put(b"z", None, rec(b"1", v(401, 0), None))];
    assert_eq!(be.swap_many(&mixed, None).await.unwrap(), SwapOutcome::Conflict);
    assert_eq!(get(store, b"z").await, None);
    assert!(get(store, b"x").await.is_some());

    // Too many keys: none of the new keys is written.
    let grow = [
        put(b"p", None, rec(b"1", v(402, 0), None)),
        put(b"q", None, rec(b"1", v(402, 0), None)),
    ];
    assert_eq!(be.swap_many(&grow, Some(3)).await.unwrap(), SwapOutcome::TooManyKeys);
    assert_eq!(get(store, b"p").await, None);
    assert_eq!(len(store).await, 2);
    assert_eq!(be.swap_many(&grow, Some(4)).await.unwrap(), SwapOutcome::Done);
    assert_eq!(len(store).await, 4);

    // Several changes at once.
    let all = [
        put(b"x", Some(v(400, 0)), rec(b"3", v(403, 0), None)),
        delete(b"y", v(400, 0)),
        delete(b"p", v(402, 0)),
    ];
    assert_eq!(be.swap_many(&all, Some(4)).await.unwrap(), SwapOutcome::Done);
    assert_eq!(get(store, b"x").await.unwrap().value, b(b"3"));
    assert_eq!(get(store, b"y").await, None);
    assert_eq!(get(store, b"p").await, None);
    assert_eq!(be.next_deadline().await.unwrap(), None, "x lost its deadline");
    assert_eq!(len(store).await, 2);

    // An empty swap list does nothing.
    assert_eq!(be.swap_many(&[], Some(0)).await.unwrap(), SwapOutcome::Done);
}

async fn binary_keys_and_values(store: &Store) {
    let keys: [&[u8]; 5] = [b"\x00", b"a\r\nb", b"\xff\xfe", b"$-1\r\n", b"*"];
    for (i, k) in keys.iter().enumerate() {
        let r = rec(&[k, &b"\r\n\x00"[..]].concat(), v(500, i as u32), None);
        assert_eq!(swap(store, put(k, None, r.clone()), None).await, SwapOutcome::Done);
        assert_eq!(get(store, k).await, Some(r));
    }
    // Empty values are values.
    assert_eq!(
        swap(store, put(b"empty", None, rec(b"", v(501, 0), None)), None).await,
        SwapOutcome::Done
    );
    assert_eq!(get(store, b"empty").await.unwrap().value, Bytes::new());
    // Keys differ by bytes: no prefix or case confusion.
    assert_eq!(get(store, b"a\r\n").await, None);
    assert_eq!(get(store, b"\xff").await, None);
    assert_eq!(get(store, b"EMPTY").await, None);
    assert_eq!(len(store).await, 6);
}

async fn scan_order_and_paging(store: &Store) {
    // Inserted out of order; byte order is: "" < "\x00" < "a" < "a\x00" < "aa" < "b" < "\xff".
    let inserted: [&[u8]; 6] = [b"b", b"\xff", b"a\x00", b"aa", b"a", b"\x00"];
    for (i, k) in inserted.iter().enumerate() {
        assert_eq!(
            swap(store, put(k, None, rec(b"v", v(600, i as u32), None)), None).await,
            SwapOutcome::Done
        );
    }
    let sorted: Vec<Bytes> = [&b"\x00"[..], b"a", b"a\x00", b"aa", b"b", b"\xff"]
        .iter()
        .map(|k| b(k))
        .collect();

    let whole = store.backend().scan(None, 100, 0, &|_| true).await.unwrap();
    assert_eq!(whole.keys, sorted);
    assert_eq!(whole.resume_after, None, "nothing follows");

    // Pages of two: every key once, in order.
    for examine in 1..=7 {
        let (keys, pages) = scan_all(store, examine, 0, &|_| true).await;
        assert_eq!(keys, sorted, "examine {examine}");
        assert!(
            pages <= sorted.len().div_ceil(examine) + 1,
            "examine {examine}: {pages} pages"
        );
    }

    // The first page of two names where it stopped.
    let first = store.backend().scan(None, 2, 0, &|_| true).await.unwrap();
    assert_eq!(first.keys, sorted[..2]);
    assert_eq!(first.resume_after, Some(sorted[1].clone()));

    // `after` is exclusive, and need not be a stored key.
    let page = store.backend().scan(Some(b"a"), 100, 0, &|_| true).await.unwrap();
    assert_eq!(page.keys, sorted[2..]);
    let page = store
        .backend()
        .scan(Some(b"a\x00\x00"), 100, 0, &|_| true)
        .await
        .unwrap();
    assert_eq!(page.keys, sorted[3..]);
    let page = store.backend().scan(Some(b"\xff"), 100, 0, &|_| true).await.unwrap();
    assert!(page.keys.is_empty() && page.resume_after.is_none());

    // Keys deleted behind the cursor or ahead of it never come back.
    let first = store.backend().scan(None, 3, 0, &|_| true).await.unwrap();
    let resume = first.resume_after.clone().unwrap();
    assert_eq!(resume, sorted[2]);
    for k in [&sorted[2], &sorted[4]] {
        let r = get(store, k).await.unwrap();
        assert_eq!(swap(store, delete(k, r.version), None).await, SwapOutcome::Done);
    }
    let rest = store.backend().scan(Some(&resume), 100, 0, &|_| true).await.unwrap();
    assert_eq!(rest.keys, vec![sorted[3].clone(), sorted[5].clone()]);
}

async fn scan_skips_expired_and_filters(store: &Store) {
    let now = 10_000;
    let records = [
        (&b"k1"[..], None),
        (b"k2", Some(now)), // the deadline is now: expired
        (b"k3", Some(now + 1)),
        (b"k4", Some(now - 1)),
        (b"x5", None),
    ];
    for (i, (k, exp)) in records.iter().enumerate() {
        assert_eq!(
            swap(store, put(k, None, rec(b"v", v(700, i as u32), *exp)), None).await,
            SwapOutcome::Done
        );
    }
    let page = store.backend().scan(None, 100, now, &|_| true).await.unwrap();
    assert_eq!(page.keys, vec![b(b"k1"), b(b"k3"), b(b"x5")]);
    let page = store.backend().scan(None, 100, now - 1, &|_| true).await.unwrap();
    assert_eq!(page.keys, vec![b(b"k1"), b(b"k2"), b(b"k3"), b(b"x5")]);

    // `keep` filters, and examined keys that are skipped still count towards a page.
    let only_k = |k: &[u8]| k.starts_with(b"k");
    let page = store.backend().scan(None, 100, now, &only_k).await.unwrap();
    assert_eq!(page.keys, vec![b(b"k1"), b(b"k3")]);
    let (keys, _) = scan_all(store, 1, now, &only_k).await;
    assert_eq!(keys, vec![b(b"k1"), b(b"k3")]);
    let (keys, _) = scan_all(store, 2, now, &|k| k == b"x5").await;
    assert_eq!(keys, vec![b(b"x5")]);

    // Expired records are still stored (and counted) until removed.
    assert_eq!(len(store).await, 5);
    assert!(get(store, b"k2").await.is_some());
}

async fn expiry_index(store: &Store) {
    let be = store.backend();
    let deadlines = [
        (&b"d30"[..], 30),
        (b"d10", 10),
        (b"d20", 20),
        (b"d20b", 20),
        (b"never", 0),
    ];
    for (i, (k, d)) in deadlines.iter().enumerate() {
        let exp = (*d > 0).then_some(*d);
        assert_eq!(
            swap(store, put(k, None, rec(b"v", v(800, i as u32), exp)), None).await,
            SwapOutcome::Done
        );
    }
    assert_eq!(be.next_deadline().await.unwrap(), Some(10));
    assert_eq!(be.expired(9, 100).await.unwrap(), vec![]);
    assert_eq!(
        be.expired(10, 100).await.unwrap(),
        vec![(b(b"d10"), v(800, 1))],
        "at the deadline"
    );
    let due = be.expired(25, 100).await.unwrap();
    assert_eq!(due.len(), 3);
    assert_eq!(due[0], (b(b"d10"), v(800, 1)), "earliest first");
    let mut at_20: Vec<_> = due[1..].iter().map(|(k, _)| k.clone()).collect();
    at_20.sort();
    assert_eq!(at_20, vec![b(b"d20"), b(b"d20b")]);
    assert_eq!(be.expired(u64::MAX, 2).await.unwrap().len(), 2, "limit");
    assert_eq!(
        be.expired(u64::MAX, 100).await.unwrap().len(),
        4,
        "never expiring keys are not listed"
    );

    // A new deadline replaces the old one.
    assert_eq!(
        swap(
            store,
            put(b"d10", Some(v(800, 1)), rec(b"v", v(801, 0), Some(40))),
            None
        )
        .await,
        SwapOutcome::Done
    );
    assert_eq!(be.next_deadline().await.unwrap(), Some(20));
    assert_eq!(be.expired(39, 100).await.unwrap().len(), 3);
    let due = be.expired(40, 100).await.unwrap();
    assert_eq!(due.last(), Some(&(b(b"d10"), v(801, 0))), "with the new version");

    // The same deadline again, with a new version: listed once, with the new version.
    assert_eq!(
        swap(
            store,
            put(b"d30", Some(v(800, 0)), rec(b"w", v(801, 1), Some(30))),
            None
        )
        .await,
        SwapOutcome::Done
    );
    let due = be.expired(30, 100).await.unwrap();
    assert_eq!(due.iter().filter(|(k, _)| k == "d30").count(), 1);
    assert!(due.contains(&(b(b"d30"), v(801, 1))));

    // No deadline clears it; a delete removes it.
    assert_eq!(
        swap(store, put(b"d20", Some(v(800, 2)), rec(b"v", v(802, 0), None)), None).await,
        SwapOutcome::Done
    );
    assert_eq!(swap(store, delete(b"d20b", v(800, 3)), None).await, SwapOutcome::Done);
    assert_eq!(be.next_deadline().await.unwrap(), Some(30));
    let due: Vec<_> = be
        .expired(u64::MAX, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(due, vec![b(b"d30"), b(b"d10")]);

    // Removing the rest empties the index.
    assert_eq!(swap(store, delete(b"d30", v(801, 1)), None).await, SwapOutcome::Done);
    assert_eq!(swap(store, delete(b"d10", v(801, 0)), None).await, SwapOutcome::Done);
    assert_eq!(be.next_deadline().await.unwrap(), None);
    assert_eq!(be.expired(u64::MAX, 100).await.unwrap(), vec![]);
}

async fn max_version_is_the_highest_written(store: &Store) {
    let be = store.backend();
    let versions = [v(900, 5), v(901, 0), v(900, 99), Hlc::new(901, 0, "a-node")];
    for (i, ver) in versions.iter().enumerate() {
        let key = format!("m{i}");
        assert_eq!(
            swap(store, put(key.as_bytes(), None, rec(b"v", ver.clone(), None)), None).await,
            SwapOutcome::Done
        );
    }
    // Order is ms, counter, node: "suite" > "a-node".
    assert_eq!(be.max_version().await.unwrap(), Some(v(901, 0)));
    // A conflicting swap does not count.
    assert_eq!(
        swap(store, put(b"m0", None, rec(b"v", v(999, 0), None)), None).await,
        SwapOutcome::Conflict
    );
    assert_eq!(be.max_version().await.unwrap(), Some(v(901, 0)));
    // After a delete, the result is never below what is still stored.
    assert_eq!(swap(store, delete(b"m1", v(901, 0)), None).await, SwapOutcome::Done);
    let max = be.max_version().await.unwrap().unwrap();
    assert!(max >= Hlc::new(901, 0, "a-node"), "{max}");
}

async fn concurrent_swaps_are_atomic(store: &Store) {
    const TASKS: u64 = 8;
    const EACH: u64 = 25;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut retries = 0u64;
            for i in 0..EACH {
                loop {
                    let cur = store.backend().get(b"counter").await.unwrap();
                    let n: u64 = cur
                        .as_ref()
                        .map(|r| std::str::from_utf8(&r.value).unwrap().parse().unwrap())
                        .unwrap_or(0);
                    let new = rec(
                        (n + 1).to_string().as_bytes(),
                        v(1_000 + n, (t * EACH + i) as u32),
                        None,
                    );
                    let outcome = swap(&store, put(b"counter", cur.map(|r| r.version), new), None).await;
                    if outcome == SwapOutcome::Done {
                        break;
                    }
                    assert_eq!(outcome, SwapOutcome::Conflict);
                    retries += 1;
                    tokio::task::yield_now().await;
                }
                tokio::task::yield_now().await;
            }
            retries
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = get(store, b"counter").await.unwrap().value;
    assert_eq!(total, b((TASKS * EACH).to_string().as_bytes()), "no lost update");
}

/// `get_many` answers in the order asked (repeats and absent keys included), and never sees
/// half of a multi-key swap: writers move units between two keys in one swap, keeping their
/// sum, while a reader checks the sum of every point-in-time read.
async fn get_many_reads_one_moment(store: &Store) {
    let all = usize::MAX;
    assert_eq!(store.backend().get_many(&[], all).await.unwrap(), Some(Vec::new()));
    let (a, z) = (rec(b"50", v(1, 0), None), rec(b"50", v(1, 1), Some(7_000)));
    let both = [put(b"a", None, a.clone()), put(b"z", None, z.clone())];
    assert_eq!(store.backend().swap_many(&both, None).await.unwrap(), SwapOutcome::Done);
    let asked = [b(b"z"), b(b"none"), b(b"a"), b(b"z")];
    assert_eq!(
        store.backend().get_many(&asked, all).await.unwrap(),
        Some(vec![Some(z.clone()), None, Some(a.clone()), Some(z)])
    );
    // The values together (2 + 2 + 2 bytes) against the budget: exactly fits, one byte short.
    assert!(store.backend().get_many(&asked, 6).await.unwrap().is_some());
    assert_eq!(store.backend().get_many(&asked, 5).await.unwrap(), None);
    let number = |r: &Option<Record>| -> i64 {
        std::str::from_utf8(&r.as_ref().unwrap().value)
            .unwrap()
            .parse()
            .unwrap()
    };
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut moved = 0u32;
            while moved < 100 {
                let cur = store
                    .backend()
                    .get_many(&[b(b"a"), b(b"z")], usize::MAX)
                    .await
                    .unwrap()
                    .unwrap();
                let (x, y) = (number(&cur[0]), number(&cur[1]));
                let version = |i: usize| cur[i].as_ref().unwrap().version.clone();
                let swaps = [
                    put(
                        b"a",
                        Some(version(0)),
                        rec((x - 1).to_string().as_bytes(), v(10 + u64::from(moved), 0), None),
                    ),
                    put(
                        b"z",
                        Some(version(1)),
                        rec((y + 1).to_string().as_bytes(), v(10 + u64::from(moved), 1), None),
                    ),
                ];
                if store.backend().swap_many(&swaps, None).await.unwrap() == SwapOutcome::Done {
                    moved += 1;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let both = store
            .backend()
            .get_many(&[b(b"a"), b(b"z")], usize::MAX)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(number(&both[0]) + number(&both[1]), 100, "a torn read: {both:?}");
        reads += 1;
        tokio::task::yield_now().await;
    }
    writer.await.unwrap();
}

#[tokio::test]
async fn memory_backend() {
    test_suite(Store::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_multi_thread() {
    test_suite(Store::memory()).await;
}

#[tokio::test]
async fn memory_backend_load_replays_records() {
    let backend = memory::MemoryBackend::default();
    backend.load(b(b"a"), Some(rec(b"1", v(5, 0), Some(50)))).unwrap();
    backend.load(b(b"b"), Some(rec(b"2", v(7, 0), None))).unwrap();
    backend.load(b(b"a"), Some(rec(b"3", v(9, 0), None))).unwrap();
    backend.load(b(b"b"), None).unwrap();
    let store = Store::new(backend);
    assert_eq!(get(&store, b"a").await, Some(rec(b"3", v(9, 0), None)));
    assert_eq!(get(&store, b"b").await, None);
    assert_eq!(len(&store).await, 1);
    assert_eq!(store.backend().next_deadline().await.unwrap(), None);
    assert_eq!(store.backend().max_version().await.unwrap(), Some(v(9, 0)));
}

/// The memory index against a plain ordered map, over a long pseudo-random run of creations,
/// overwrites (same and other lengths, with and without extras), deletes and scans.
#[tokio::test]
async fn memory_index_matches_a_model() {
    use std::collections::BTreeMap;
    let store = Store::memory();
    let mut model: BTreeMap<Vec<u8>, Record> = BTreeMap::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for step in 0..20_000u64 {
        let r = next();
        // Short and long keys, so both sides of the inline limit and many collisions of prefixes.
        let key = if r % 5 == 0 {
            format!("a-long-key-that-spills-{:03}", r % 300).into_bytes()
        } else {
            format!("k{:03}", (r >> 8) % 300).into_bytes()
        };
        let cur = model.get(&key).map(|rec| rec.version.clone());
        if (r >> 20) % 4 == 0 {
            if let Some(cur) = cur {
                assert_eq!(swap(&store, delete(&key, cur), None).await, SwapOutcome::Done);
                model.remove(&key);
            }
        } else {
            let len = [0usize, 3, 3, 8, 100][((r >> 24) % 5) as usize];
            let mut new = rec(&vec![b'x'; len], v(step + 1, (r >> 30) as u32 % 3), None);
            if (r >> 34) % 7 == 0 {
                new.expires_at_ms = Some(1_000_000 + (r >> 40) % 1000);
            }
            if (r >> 44) % 11 == 0 {
                new.fencing = Some(v(step, 0));
            }
            assert_eq!(swap(&store, put(&key, cur, new.clone()), None).await, SwapOutcome::Done);
            model.insert(key.clone(), new);
        }
        if step % 1000 == 999 {
            let keys: Vec<Bytes> = model.keys().map(|k| b(k)).collect();
            assert_eq!(scan_keys(&store).await, keys, "step {step}");
            for (k, rec) in &model {
                assert_eq!(get(&store, k).await.as_ref(), Some(rec), "step {step}");
            }
            let due = store.backend().expired(u64::MAX, usize::MAX).await.unwrap();
            let want: usize = model.values().filter(|r| r.expires_at_ms.is_some()).count();
            assert_eq!(due.len(), want, "step {step}");
            assert_eq!(len(&store).await, model.len() as u64);
        }
    }
}

/// Versions from more nodes than the entry header can index keep their node names.
#[tokio::test]
async fn memory_index_keeps_versions_of_many_nodes() {
    let store = Store::memory();
    for n in 0..200u64 {
        let key = format!("key-{n}");
        let version = Hlc::new(n + 1, 0, format!("node-{n}"));
        let new = rec(b"v", version, None);
        assert_eq!(
            swap(&store, put(key.as_bytes(), None, new), None).await,
            SwapOutcome::Done
        );
    }
    for n in 0..200u64 {
        let got = get(&store, format!("key-{n}").as_bytes()).await.unwrap();
        assert_eq!(got.version, Hlc::new(n + 1, 0, format!("node-{n}")));
        // A swap must match the full version, node included.
        let wrong = Hlc::new(n + 1, 0, "node-x");
        let s = put(format!("key-{n}").as_bytes(), Some(wrong), rec(b"w", v(999, 0), None));
        assert_eq!(swap(&store, s, None).await, SwapOutcome::Conflict);
    }
}

/// A bulk load (what a restart does with a snapshot) leaves the same index as loading the
/// records one at a time: the same records, the same key order for scans, the same deadlines,
/// whether the keys come ascending, fall out of order midway, or meet a non-empty index.
#[tokio::test]
async fn a_bulk_load_builds_the_index_one_load_at_a_time_would() {
    let record = |n: u64| {
        let expires = n.is_multiple_of(3).then_some(10_000 + n);
        (
            b(format!("key-{n:04}").as_bytes()),
            Some(rec(format!("value-{n}").as_bytes(), v(n + 1, 0), expires)),
        )
    };
    // Ascending, then a key out of order, a repeated key, a delete, and more keys.
    let mut batch: Vec<(Bytes, Option<Record>)> = (0..300).map(record).collect();
    batch.push(record(150));
    batch.push((b(b"key-0001"), Some(rec(b"again", v(999, 0), None))));
    batch.push((b(b"key-0002"), None));
    batch.extend((300..400).map(record));
    let one_by_one = memory::MemoryBackend::default();
    for (k, r) in batch.clone() {
        one_by_one.load(k, r).unwrap();
    }
    let expected = one_by_one.records_after(None, usize::MAX);
    for prefilled in [false, true] {
        let bulk = memory::MemoryBackend::default();
        if prefilled {
            bulk.load(b(b"key-0000"), record(0).1).unwrap();
        }
        let result: Result<(), StorageError> = bulk.load_many(batch.len(), |load| {
            for (k, r) in batch.clone() {
                load(k, r)?;
            }
            Ok(())
        });
        result.unwrap();
        assert_eq!(bulk.records_after(None, usize::MAX), expected, "prefilled: {prefilled}");
        assert_eq!(
            bulk.expired(u64::MAX, usize::MAX).await.unwrap(),
            one_by_one.expired(u64::MAX, usize::MAX).await.unwrap(),
            "the deadlines, prefilled: {prefilled}"
        );
        assert_eq!(
            bulk.records_after(Some(b"key-0100"), 5),
            one_by_one.records_after(Some(b"key-0100"), 5)
        );
    }
    // Only ascending keys: the ordered index is built at the end, scans see all of them.
    let ascending = memory::MemoryBackend::default();
    let result: Result<(), StorageError> = ascending.load_many(10, |load| {
        for n in 0..300 {
            let (k, r) = record(n);
            load(k, r)?;
        }
        Ok(())
    });
    result.unwrap();
    let all = ascending.records_after(None, usize::MAX);
    assert_eq!(all.len(), 300);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
}
