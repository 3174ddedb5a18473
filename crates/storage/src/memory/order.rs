//! The ordered index: a pointer to every entry ([`KeyRef`]), in key order, for SCAN, the Dapr
//! query pages and snapshots.
//!
//! Why not a `BTreeSet<KeyRef>`: its nodes hold at most 11 pointers in a 112-byte malloc chunk
//! and ascending inserts leave them about half full, so it cost 21 bytes a key for 1 million
//! keys (benches/memory_per_key.rs), more than the hash index. Here the pointers sit in leaves
//! of up to [`LEAF`] (one allocation each, 528 bytes), and a `BTreeMap` keyed by each leaf's
//! first key finds the leaf: about 9 bytes a key when filled in order (a leaf full before the
//! next one starts), about 13 after random inserts (leaves split in halves), and at most about
//! 24 after any deletes (a leaf that falls under [`MIN`] is merged with or refilled from a
//! neighbour). Finding a key costs what it did: a descent of a much smaller B-tree, then a
//! binary search of one leaf, each comparison following a pointer to an entry.
//!
//! A leaf's key in the map is a copy of its first pointer, so it must change whenever the
//! first pointer does (a new smallest key, a removal or a replacement of the first), before
//! the entry it named is freed: every method here does that itself ([`Order::rekey`]).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::entry::KeyRef;

/// Pointers a leaf holds at most: 512 bytes, in a 528-byte malloc chunk (64 leaves a page and
/// a bit). Larger leaves save little more (the map is already under 1 byte a key) and move
/// more on each insert.
const LEAF: usize = 64;

/// A leaf with fewer pointers than this (and not alone) is merged with a neighbour, or takes
/// some of its pointers: no leaf is less than 3/8 full for long.
const MIN: usize = LEAF * 3 / 8;

/// Two leaves with at most this many pointers together become one. Below [`LEAF`], so that a
/// merged leaf does not split again at the next insert.
const MERGE: usize = LEAF * 3 / 4;

type Leaf = Vec<KeyRef>;

fn new_leaf() -> Leaf {
    Vec::with_capacity(LEAF)
}

/// Where `key` goes in `leaf`: a binary search that, while it compares with one entry, loads
/// the two it may compare with next. Each comparison follows a pointer to an entry that is
/// usually cold (the leaf's keys are anywhere in memory); loading ahead overlaps those misses
/// instead of waiting for them one after another.
fn place_in(leaf: &[KeyRef], key: &[u8]) -> usize {
    let (mut lo, mut hi) = (0, leaf.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        leaf[lo + (mid - lo) / 2].touch();
        if let Some(r) = leaf.get(mid + 1 + (hi - mid - 1) / 2) {
            r.touch();
        }
        if leaf[mid].key() < key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[derive(Default)]
pub(super) struct Order {
    /// Every leaf (sorted, never empty, at most [`LEAF`] long) under its first pointer.
    leaves: BTreeMap<KeyRef, Leaf>,
}

impl Order {
    /// The index of `refs`, which must be sorted by key and unique: full leaves, built in one
    /// pass (a snapshot loads in key order).
    pub(super) fn from_sorted(refs: Vec<KeyRef>) -> Order {
        let leaves = refs
            .chunks(LEAF)
            .map(|c| {
                let mut l = new_leaf();
                l.extend_from_slice(c);
                (c[0], l)
            })
            .collect();
        Order { leaves }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    /// The first pointer of the leaf where `key` is or would go: the last leaf starting at or
    /// before it, or the first leaf when `key` comes before every key.
    fn leaf_of(&self, key: &[u8]) -> Option<KeyRef> {
        self.leaves
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .or_else(|| self.leaves.first_key_value())
            .map(|(first, _)| *first)
    }

    /// [`Order::leaf_of`] and the leaf, in one descent of the map (each comparison on the way
    /// follows a pointer to an entry: a cache miss when the key is cold).
    fn leaf_of_mut(&mut self, key: &[u8]) -> Option<(KeyRef, &mut Leaf)> {
        // The first key is on the map's leftmost path, which every lookup's range walks anyway.
        let before_all = self.leaves.first_key_value().is_none_or(|(f, _)| key < f.key());
        let (first, leaf) = if before_all {
            self.leaves.iter_mut().next()?
        } else {
            self.leaves
                .range_mut::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
                .next_back()?
        };
        Some((*first, leaf))
    }

    fn leaf_mut(&mut self, first: KeyRef) -> &mut Leaf {
        // Cannot fail: `first` was read from the map under the same borrow of `self`.
        self.leaves.get_mut(first.key()).expect("a leaf of the ordered index")
    }

    /// Files the leaf kept under `old` under its (new) first pointer. Called while the entry
    /// `old` points to is still alive (the map compares keys through the pointers).
    fn rekey(&mut self, old: KeyRef) {
        if let Some(leaf) = self.leaves.remove(old.key()) {
            self.leaves.insert(leaf[0], leaf);
        }
    }

    /// Adds the pointer of a key not in the index.
    pub(super) fn insert(&mut self, k: KeyRef) {
        let Some((first, leaf)) = self.leaf_of_mut(k.key()) else {
            let mut l = new_leaf();
            l.push(k);
            self.leaves.insert(k, l);
            return;
        };
        let at = place_in(leaf, k.key());
        if leaf.len() < LEAF {
            leaf.insert(at, k);
            if at == 0 {
                self.rekey(first);
            }
            return;
        }
        // Full. Appending: start a new leaf, so keys created in order fill every leaf.
        // Otherwise split in halves.
        let mut right = new_leaf();
        if at == LEAF {
            right.push(k);
        } else {
            right.extend(leaf.drain(LEAF / 2..));
            if at <= LEAF / 2 {
                leaf.insert(at, k);
            } else {
                right.insert(at - LEAF / 2, k);
            }
        }
        self.leaves.insert(right[0], right);
        if at == 0 {
            self.rekey(first);
        }
    }

    /// Replaces `old`, a pointer in the index, by `new`, a pointer to a new entry for the same
    /// key (`old`'s entry is freed after this returns).
    pub(super) fn replace(&mut self, old: KeyRef, new: KeyRef) {
        let Some((first, leaf, at)) = self.position(old) else {
            return;
        };
        leaf[at] = new;
        if at == 0 {
            // The map still holds the old pointer; it names the same key, and is alive.
            self.rekey(first);
        }
    }

    /// The leaf holding the pointer `k` and its place there. The leaf is found by key; in it,
    /// `k` is found by address: one pass over 512 contiguous bytes instead of a binary search
    /// that follows a pointer to a cold entry at each of its six steps (measured: a delete or
    /// a move at random among 1 million keys took a third longer that way).
    fn position(&mut self, k: KeyRef) -> Option<(KeyRef, &mut Leaf, usize)> {
        let (first, leaf) = self.leaf_of_mut(k.key())?;
        let at = leaf.iter().position(|r| r.same(&k))?;
        Some((first, leaf, at))
    }

    /// Removes `k`, a pointer in the index (its entry is still alive).
    pub(super) fn remove(&mut self, k: KeyRef) {
        let Some((first, leaf, at)) = self.position(k) else {
            return;
        };
        leaf.remove(at);
        let Some(&now_first) = leaf.first() else {
            self.leaves.remove(first.key());
            return;
        };
        let short = leaf.len() < MIN;
        if at == 0 {
            self.rekey(first);
        }
        if short {
            self.rebalance(now_first);
        }
    }

    /// The leaf under `first` fell under [`MIN`]: merged with a neighbour (the next one, or
    /// the previous one for the last leaf) when both fit in [`MERGE`], else the two share
    /// their pointers evenly.
    fn rebalance(&mut self, first: KeyRef) {
        let next = self
            .leaves
            .range::<[u8], _>((Bound::Excluded(first.key()), Bound::Unbounded))
            .next()
            .map(|(k, _)| *k);
        let prev = || {
            self.leaves
                .range::<[u8], _>((Bound::Unbounded, Bound::Excluded(first.key())))
                .next_back()
                .map(|(k, _)| *k)
        };
        // (left, right): the pair of adjacent leaves to even out, by their first pointers.
        let (left, right) = match next {
            Some(n) => (first, n),
            None => match prev() {
                Some(p) => (p, first),
                None => return,
            },
        };
        let Some(mut moved) = self.leaves.remove(right.key()) else {
            return;
        };
        let keep = self.leaf_mut(left);
        if keep.len() + moved.len() <= MERGE {
            keep.append(&mut moved);
            return;
        }
        // Even them out: the left keeps the first half of both, the right the rest.
        let half = (keep.len() + moved.len()) / 2;
        if keep.len() > half {
            let spill: Vec<KeyRef> = keep.drain(half..).collect();
            moved.splice(0..0, spill);
        } else {
            let take = half - keep.len();
            keep.extend(moved.drain(..take));
        }
        self.leaves.insert(moved[0], moved);
    }

    /// Every pointer after `after` (all when `None`), in key order.
    pub(super) fn range_after<'a>(&'a self, after: Option<&'a [u8]>) -> impl Iterator<Item = &'a KeyRef> + 'a {
        let start = match after {
            Some(a) => self.leaf_of(a),
            None => self.leaves.first_key_value().map(|(k, _)| *k),
        };
        let (head, rest) = match start {
            Some(first) => {
                let leaf = &self.leaves[first.key()];
                let from = after.map_or(0, |a| leaf.partition_point(|r| r.key() <= a));
                let rest = self
                    .leaves
                    .range::<[u8], _>((Bound::Excluded(first.key()), Bound::Unbounded));
                (&leaf[from..], Some(rest))
            }
            None => (&[][..], None),
        };
        head.iter()
            .chain(rest.into_iter().flatten().flat_map(|(_, leaf)| leaf.iter()))
    }

    /// Leaves in use (tests: how full they are).
    #[cfg(test)]
    fn leaf_count(&self) -> usize {
        self.leaves.len()
    }

    /// Checks every invariant (tests).
    #[cfg(test)]
    fn check(&self) {
        let mut last: Option<Vec<u8>> = None;
        for (first, leaf) in &self.leaves {
            assert!(!leaf.is_empty() && leaf.len() <= LEAF && leaf.capacity() == LEAF);
            assert_eq!(first.key(), leaf[0].key());
            for r in leaf {
                if let Some(l) = &last {
                    assert!(l.as_slice() < r.key(), "order");
                }
                last = Some(r.key().to_vec());
            }
        }
    }
}

#[cfg(test)]
mod tests;
