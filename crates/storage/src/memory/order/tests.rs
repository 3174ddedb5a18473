//! The ordered index against a plain ordered map: inserts in and out of order, replacements
//! and removals, with every invariant checked and every range compared.

use std::collections::BTreeMap;

use super::super::entry::Entry;
use super::{LEAF, MIN, Order};
use crate::hlc::Hlc;

fn entry(key: &[u8]) -> Entry {
    Entry::new(key, b"v", &Hlc::new(1, 0, "n"), 0, 0, None, 0).expect("small")
}

/// Entries owned here, as the hash index owns them beside the ordered index.
#[derive(Default)]
struct Fixture {
    order: Order,
    model: BTreeMap<Vec<u8>, Entry>,
}

impl Fixture {
    fn insert(&mut self, key: &[u8]) {
        if self.model.contains_key(key) {
            return;
        }
        let e = entry(key);
        self.order.insert(e.key_ref());
        self.model.insert(key.to_vec(), e);
    }

    fn replace(&mut self, key: &[u8]) {
        let Some(old) = self.model.get(key) else { return };
        let e = entry(key);
        self.order.replace(old.key_ref(), e.key_ref());
        // The old entry is freed only now, after the index points at the new one.
        self.model.insert(key.to_vec(), e);
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(old) = self.model.get(key) {
            self.order.remove(old.key_ref());
        }
        self.model.remove(key);
    }

    fn keys_after(&self, after: Option<&[u8]>) -> Vec<Vec<u8>> {
        self.order.range_after(after).map(|r| r.key().to_vec()).collect()
    }

    fn check(&self, after: &[u8]) {
        self.order.check();
        let all: Vec<Vec<u8>> = self.model.keys().cloned().collect();
        assert_eq!(self.keys_after(None), all);
        let want: Vec<Vec<u8>> = self.model.keys().filter(|k| k.as_slice() > after).cloned().collect();
        assert_eq!(self.keys_after(Some(after)), want, "after {after:?}");
        assert_eq!(self.order.is_empty(), self.model.is_empty());
    }
}

fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

#[test]
fn matches_a_model_through_inserts_replacements_and_removals() {
    let mut f = Fixture::default();
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for step in 0..60_000u64 {
        let r = next();
        let key = format!("k{:05}", r % 3_000).into_bytes();
        // Grow, then shrink, then grow again: splits, merges and refills all happen.
        let phase = (step / 20_000) % 3;
        let (op, inserts) = ((r >> 32) % 10, if phase == 1 { 2 } else { 6 });
        if op < inserts {
            f.insert(&key);
        } else if op < inserts + 2 {
            f.replace(&key);
        } else {
            f.remove(&key);
        }
        if step % 997 == 0 {
            f.check(format!("k{:05}", (r >> 16) % 3_100).as_bytes());
        }
    }
    f.check(b"");
    for k in f.model.keys().cloned().collect::<Vec<_>>() {
        f.remove(&k);
    }
    f.check(b"k");
}

#[test]
fn keys_created_in_order_fill_every_leaf() {
    let mut f = Fixture::default();
    for n in 0..10_000 {
        f.insert(format!("key-{n:06}").as_bytes());
    }
    f.check(b"key-005000");
    assert_eq!(f.order.leaf_count(), 10_000usize.div_ceil(LEAF));
    // The same keys built in one pass (a snapshot load): the same leaves.
    let refs = f.model.values().map(Entry::key_ref).collect();
    let built = Order::from_sorted(refs);
    built.check();
    assert_eq!(built.leaf_count(), 10_000usize.div_ceil(LEAF));
}

#[test]
fn removals_keep_leaves_from_emptying_out() {
    let mut f = Fixture::default();
    let mut next = xorshift(7);
    for _ in 0..20_000 {
        f.insert(format!("k{:08}", next() % 100_000_000).as_bytes());
    }
    // Remove nine keys in ten, at random: the leaves left are merged or refilled.
    let keys: Vec<Vec<u8>> = f.model.keys().cloned().collect();
    for k in keys.iter().filter(|_| !next().is_multiple_of(10)) {
        f.remove(k);
    }
    f.check(b"k5");
    let kept = f.model.len();
    assert!(
        f.order.leaf_count() <= kept / MIN + 2,
        "{} leaves for {kept} keys",
        f.order.leaf_count()
    );
}

#[test]
fn smallest_keys_replacements_and_lookups_at_the_edges() {
    let mut f = Fixture::default();
    // Descending: every insert is a new smallest key (the first leaf is filed anew each time).
    for n in (0..500).rev() {
        f.insert(format!("{n:04}").as_bytes());
    }
    f.check(b"0250");
    // Replace every leaf's first key, then the last key; look before, at and after the edges.
    for n in (0..500).step_by(LEAF / 2) {
        f.replace(format!("{n:04}").as_bytes());
    }
    f.replace(b"0499");
    f.check(b"");
    f.check(b"0499");
    f.check(b"9");
    // Removing what the index does not hold changes nothing: absent keys, and a key it holds
    // through another entry (found by address, not by key).
    for key in [&b"0500"[..], b"", b"0000", b"0250"] {
        f.order.remove(entry(key).key_ref());
    }
    f.check(b"0000");
}
