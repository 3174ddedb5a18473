//! A set that keeps one member inline, for the KEYNOTIFY registry: most keys have one observer
//! and most clients observe a few keys. A `HashSet` per key and per client (its table in an
//! allocation of its own, and a hasher) was most of what a registration cost; see
//! docs/performance.md, Connections.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;

/// One member, or more in a table. Never empty: the registry drops a set whose last member
/// goes. 16 bytes when `T` is a reference-counted pointer (the table is boxed, and the
/// pointer's niche tells the two apart).
#[derive(Debug)]
#[allow(clippy::box_collection, reason = "boxed so that a set of one is 16 bytes, not 48")]
pub(crate) enum Few<T: Hash + Eq> {
    One(T),
    Many(Box<HashSet<T>>),
}

/// What [`Few::remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// It was not a member.
    NotThere,
    /// Removed; members are left.
    Left,
    /// Removed the last member: the set must be dropped.
    Emptied,
}

impl<T: Hash + Eq + Clone> Few<T> {
    pub(crate) fn contains<Q>(&self, q: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self {
            Few::One(m) => <T as Borrow<Q>>::borrow(m) == q,
            Few::Many(set) => set.contains(q),
        }
    }

    /// Adds `v`; `false` when it was already a member.
    pub(crate) fn insert(&mut self, v: T) -> bool {
        match self {
            Few::One(m) if *m == v => false,
            Few::One(m) => {
                let set: HashSet<T> = [m.clone(), v].into_iter().collect();
                *self = Few::Many(Box::new(set));
                true
            }
            Few::Many(set) => set.insert(v),
        }
    }

    pub(crate) fn remove<Q>(&mut self, q: &Q) -> Removed
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self {
            Few::One(m) if <T as Borrow<Q>>::borrow(m) == q => Removed::Emptied,
            Few::One(_) => Removed::NotThere,
            Few::Many(set) => {
                if !set.remove(q) {
                    return Removed::NotThere;
                }
                // Back to one inline member: a key whose crowd left costs what a quiet one does.
                if set.len() == 1
                    && let Some(last) = set.iter().next().cloned()
                {
                    *self = Few::One(last);
                }
                Removed::Left
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Few::One(_) => 1,
            Few::Many(set) => set.len(),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        let (one, many) = match self {
            Few::One(m) => (Some(m), None),
            Few::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn members(f: &Few<Arc<str>>) -> Vec<String> {
        let mut v: Vec<String> = f.iter().map(|m| m.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn one_member_is_inline_and_16_bytes() {
        assert_eq!(std::mem::size_of::<Few<Arc<str>>>(), 16);
        assert_eq!(std::mem::size_of::<Few<Arc<[u8]>>>(), 16);
        let f = Few::One(Arc::<str>::from("a"));
        assert!(f.contains("a") && !f.contains("b"));
        assert_eq!((f.len(), members(&f)), (1, vec!["a".to_owned()]));
    }

    #[test]
    fn grows_to_a_table_and_back() {
        let mut f = Few::One(Arc::<str>::from("a"));
        assert!(!f.insert("a".into()), "a member twice");
        assert!(f.insert("b".into()) && f.insert("c".into()));
        assert!(matches!(f, Few::Many(_)));
        assert_eq!((f.len(), members(&f)), (3, vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(f.remove("x"), Removed::NotThere);
        assert_eq!(f.remove("a"), Removed::Left);
        assert_eq!(f.remove("c"), Removed::Left);
        assert!(matches!(&f, Few::One(m) if &**m == "b"), "one left: inline again");
        assert_eq!(f.remove("c"), Removed::NotThere);
        assert_eq!(f.remove("b"), Removed::Emptied);
    }
}
