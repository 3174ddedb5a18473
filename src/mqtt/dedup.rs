//! The short-lived response cache that answers a QoS 1 redelivery without executing it again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::time::{Duration, Instant};

use super::request::Outgoing;

/// (response topic, correlation data), allocated once and shared by the map and the queue.
pub(crate) type Key = Arc<(String, Bytes)>;

/// What the cache knows of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// First time: execute it (the cache now marks it in progress under this key).
    New(Key),
    /// Still executing: the first copy will answer.
    InProgress,
    /// Answered before: send this again.
    Answered(Arc<Outgoing>),
}

#[derive(Debug)]
pub(crate) struct Dedup {
    ttl: Duration,
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Key, Option<Arc<Outgoing>>>,
    order: VecDeque<(Instant, Key)>,
}

impl Dedup {
    pub(crate) fn new(ttl: Duration, capacity: usize) -> Dedup {
        Dedup {
            ttl,
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks a request up by (response topic, correlation data) and marks a new one in progress.
    pub(crate) fn check(&self, topic: &str, correlation: &Bytes) -> Seen {
        let now = Instant::now();
        let mut inner = self.lock();
        // Forget what is too old, and the oldest when full.
        while let Some((t, _)) = inner.order.front() {
            if now.duration_since(*t) <= self.ttl && inner.order.len() < self.capacity {
                break;
            }
            if let Some((_, k)) = inner.order.pop_front() {
                inner.map.remove(&k);
            }
        }
        let key: Key = Arc::new((topic.to_owned(), correlation.clone()));
        match inner.map.get(&key) {
            Some(Some(out)) => Seen::Answered(out.clone()),
            Some(None) => Seen::InProgress,
            None => {
                inner.map.insert(key.clone(), None);
                inner.order.push_back((now, key.clone()));
                Seen::New(key)
            }
        }
    }

    /// Stores the answer of a request marked in progress.
    pub(crate) fn answered(&self, key: &Key, out: Arc<Outgoing>) {
        if let Some(slot) = self.lock().map.get_mut(key) {
            *slot = Some(out);
        }
    }

    /// Forgets a request that got no answer, so a redelivery is executed.
    pub(crate) fn forget(&self, key: &Key) {
        self.lock().map.remove(key);
    }
}
