//! A count of slots whose size can change while slots are taken (a reloaded configuration).
//!
//! Growing adds free slots at once. Shrinking takes free slots away at once and, for slots
//! still taken past the new size, records a debt: each such slot is retired when it is given
//! back instead of becoming free again. Slots already taken are never revoked: a lower limit
//! refuses new work until the count is under it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct Capacity {
    sem: Arc<Semaphore>,
    /// The size in force.
    max: AtomicUsize,
    /// Taken slots to retire when given back (what a shrink could not take away at once).
    debt: Arc<AtomicUsize>,
    /// Serialises resizes (each reads and changes `max`, the semaphore and `debt` together).
    resizing: std::sync::Mutex<()>,
}

/// A taken slot; given back (or retired, see [`Capacity`]) on drop.
#[derive(Debug)]
pub struct Taken {
    permit: Option<OwnedSemaphorePermit>,
    debt: Arc<AtomicUsize>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let paid = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
            .is_ok();
        if paid {
            permit.forget();
        }
    }
}

impl Capacity {
    /// `max` slots (at least one; at most what a semaphore can count, about 2^61).
    pub fn new(max: usize) -> Capacity {
        let max = bounded(max);
        Capacity {
            sem: Arc::new(Semaphore::new(max)),
            max: AtomicUsize::new(max),
            debt: Arc::default(),
            resizing: std::sync::Mutex::new(()),
        }
    }

    /// Takes a slot, or `None` when every one is taken.
    pub fn try_take(&self) -> Option<Taken> {
        let permit = self.sem.clone().try_acquire_owned().ok()?;
        Some(Taken {
            permit: Some(permit),
            debt: self.debt.clone(),
        })
    }

    /// The size in force.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::Acquire)
    }

    /// Slots taken now (may exceed [`Capacity::max`] for a while after a shrink).
    pub fn taken(&self) -> usize {
        let _guard = self.resizing.lock().unwrap_or_else(|e| e.into_inner());
        let live = self.max() + self.debt.load(Ordering::Acquire);
        live.saturating_sub(self.sem.available_permits())
    }

    /// Changes the size to `max` (bounded as in [`Capacity::new`]).
    pub fn resize(&self, max: usize) {
        let max = bounded(max);
        let _guard = self.resizing.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.max.swap(max, Ordering::AcqRel);
        if max > old {
            // Cancel debt first: a slot still to be retired may as well stay.
            let mut grow = max - old;
            let owed = self
                .debt
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| Some(d - d.min(grow)))
                .unwrap_or(0);
            grow -= owed.min(grow);
            self.sem.add_permits(grow);
        } else if max < old {
            let shrink = old - max;
            let gone = self.sem.forget_permits(shrink);
            self.debt.fetch_add(shrink - gone, Ordering::AcqRel);
        }
    }
}

/// A configured size as a semaphore can hold it (tokio panics past `MAX_PERMITS`).
fn bounded(max: usize) -> usize {
    max.clamp(1, Semaphore::MAX_PERMITS)
}

impl Default for Capacity {
    fn default() -> Capacity {
        Capacity::new(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_and_shrinking_while_slots_are_taken() {
        let c = Capacity::new(3);
        let mut held: Vec<Taken> = (0..3).map(|_| c.try_take().unwrap()).collect();
        assert!(c.try_take().is_none());
        c.resize(5);
        held.push(c.try_take().unwrap());
        held.push(c.try_take().unwrap());
        assert!(c.try_take().is_none());
        assert_eq!((c.max(), c.taken()), (5, 5));
        // Shrink below what is taken: nothing is revoked, nothing new is admitted...
        c.resize(2);
        assert_eq!((c.max(), c.taken()), (2, 5));
        held.truncate(2);
        assert!(c.try_take().is_none(), "the three given back were retired");
        assert_eq!(c.taken(), 2);
        held.pop();
        // ...until the count is under the new size.
        held.push(c.try_take().unwrap());
        assert!(c.try_take().is_none());
        // Growing again while debt is owed cancels it first.
        c.resize(1);
        c.resize(4);
        held.push(c.try_take().unwrap());
        held.push(c.try_take().unwrap());
        assert!(c.try_take().is_none());
        assert_eq!((c.max(), c.taken()), (4, 4));
        drop(held);
        assert_eq!(c.taken(), 0);
        let all: Vec<Taken> = (0..4).map(|_| c.try_take().unwrap()).collect();
        assert!(c.try_take().is_none());
        drop(all);
    }

    #[test]
    fn absurd_sizes_are_bounded_not_a_panic() {
        let c = Capacity::new(usize::MAX);
        c.resize(usize::MAX);
        c.resize(0);
        assert_eq!(c.max(), 1);
        c.resize(usize::MAX);
        assert!(c.try_take().is_some());
    }
}
