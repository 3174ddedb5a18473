//! The contract's deadline checks ([`DeadlineCheck`]): a sliding read's swap only moves a
//! deadline forward, and an expiry's swap only removes a key whose deadline is still the one
//! it found passed. Both are decided inside the swap, where replicas that share a store meet:
//! a slide keeps the version, so comparing versions alone cannot tell.

use super::*;

fn sliding(value: &[u8], version: Hlc, deadline: u64) -> Record {
    Record {
        slide_ms: Some(500),
        ..rec(value, version, Some(deadline))
    }
}

fn with_check(mut s: Swap, deadline: DeadlineCheck) -> Swap {
    s.deadline = deadline;
    s
}

async fn deadline_of(store: &Store, key: &[u8]) -> Option<u64> {
    get(store, key).await.expect("the key is stored").expires_at_ms
}

pub(super) async fn slides_only_move_a_deadline_forward(store: &Store) {
    let ver = v(1, 0);
    assert_eq!(
        swap(store, put(b"s", None, sliding(b"x", ver.clone(), 1000)), None).await,
        SwapOutcome::Done
    );
    // A reader's slide to 2000.
    let later = with_check(
        put(b"s", Some(ver.clone()), sliding(b"x", ver.clone(), 2000)),
        DeadlineCheck::Later,
    );
    assert_eq!(swap(store, later, None).await, SwapOutcome::Done);
    assert_eq!(deadline_of(store, b"s").await, Some(2000));
    // A reader that read earlier lands last, with the same version: its deadline is earlier
    // than the stored one, so nothing is written.
    for earlier in [1500, 2000] {
        let s = with_check(
            put(b"s", Some(ver.clone()), sliding(b"x", ver.clone(), earlier)),
            DeadlineCheck::Later,
        );
        assert_eq!(swap(store, s, None).await, SwapOutcome::Conflict, "deadline {earlier}");
        assert_eq!(
            deadline_of(store, b"s").await,
            Some(2000),
            "a deadline never moves back"
        );
    }
    // The expiry index follows the stored deadline.
    let due: Vec<Bytes> = store
        .backend()
        .expired(1999, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(due.is_empty(), "not due before the later deadline: {due:?}");
    assert_eq!(store.backend().next_deadline().await.unwrap(), Some(2000));
    // A record stored without a deadline is never given one by a slide.
    let forever = v(2, 0);
    assert_eq!(
        swap(store, put(b"p", None, rec(b"y", forever.clone(), None)), None).await,
        SwapOutcome::Done
    );
    let s = with_check(
        put(b"p", Some(forever.clone()), sliding(b"y", forever, 5000)),
        DeadlineCheck::Later,
    );
    assert_eq!(swap(store, s, None).await, SwapOutcome::Conflict);
    assert_eq!(deadline_of(store, b"p").await, None);
    // Without the check, the version alone decides (every other write).
    let s = put(b"s", Some(ver.clone()), sliding(b"x", ver, 1200));
    assert_eq!(swap(store, s, None).await, SwapOutcome::Done);
    assert_eq!(deadline_of(store, b"s").await, Some(1200));
}

pub(super) async fn expiry_removes_only_the_deadline_it_found_passed(store: &Store) {
    let ver = v(1, 0);
    assert_eq!(
        swap(store, put(b"s", None, sliding(b"x", ver.clone(), 1000)), None).await,
        SwapOutcome::Done
    );
    assert_eq!(
        swap(store, put(b"n", None, rec(b"y", v(1, 1), None)), None).await,
        SwapOutcome::Done
    );
    let found: Vec<(Bytes, Hlc)> = store.backend().expired(1000, 10).await.unwrap();
    assert_eq!(found, vec![(b(b"s"), ver.clone())]);
    // Another replica's reader slides it (same version) before the removal lands.
    let slide = with_check(
        put(b"s", Some(ver.clone()), sliding(b"x", ver.clone(), 3000)),
        DeadlineCheck::Later,
    );
    assert_eq!(swap(store, slide, None).await, SwapOutcome::Done);
    let expire = with_check(delete(b"s", ver.clone()), DeadlineCheck::Still(1000));
    assert_eq!(
        swap(store, expire, None).await,
        SwapOutcome::Conflict,
        "the deadline moved"
    );
    assert_eq!(deadline_of(store, b"s").await, Some(3000), "the key lives on");
    // All or nothing: a batch of removals with one moved deadline removes none.
    let batch = [
        with_check(delete(b"s", ver.clone()), DeadlineCheck::Still(1000)),
        delete(b"n", v(1, 1)),
    ];
    assert_eq!(
        store.backend().swap_many(&batch, None).await.unwrap(),
        SwapOutcome::Conflict
    );
    assert!(get(store, b"n").await.is_some());
    // A key without a deadline is never removed as expired.
    let s = with_check(delete(b"n", v(1, 1)), DeadlineCheck::Still(1000));
    assert_eq!(swap(store, s, None).await, SwapOutcome::Conflict);
    // The deadline it found: removed.
    let expire = with_check(delete(b"s", ver), DeadlineCheck::Still(3000));
    assert_eq!(swap(store, expire, None).await, SwapOutcome::Done);
    assert_eq!(get(store, b"s").await, None);
    assert_eq!(store.backend().next_deadline().await.unwrap(), None);
}
