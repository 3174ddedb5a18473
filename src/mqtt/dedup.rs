//! The short-lived response cache that answers a QoS 1 redelivery without executing it again.
//!
//! Sharded by key hash, so concurrent writers rarely meet on one lock; bounded by entries,
//! bytes and age. Keys are copies (a correlation id sliced from a request packet would pin the
//! whole packet, value included, for as long as the entry lives).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
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

const SHARDS: usize = 16;
/// Bookkeeping bytes counted per entry besides its key and answer.
const ENTRY_OVERHEAD: usize = 128;

#[derive(Debug)]
pub(crate) struct Dedup {
    ttl: Duration,
    /// Per shard.
    capacity: usize,
    max_bytes: usize,
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Key, Slot>,
    order: VecDeque<(Instant, Key)>,
    bytes: usize,
}

#[derive(Debug)]
struct Slot {
    answer: Option<Arc<Outgoing>>,
    cost: usize,
}

fn key_cost(key: &Key) -> usize {
    ENTRY_OVERHEAD + key.0.len() + key.1.len()
}

fn answer_cost(out: &Outgoing) -> usize {
    out.topic.len()
        + out.payload.len()
        + out.correlation.as_ref().map_or(0, Bytes::len)
        + out
            .user_properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 48)
            .sum::<usize>()
}

impl Shard {
    fn remove(&mut self, key: &Key) {
        if let Some(slot) = self.map.remove(key) {
            self.bytes -= slot.cost;
        }
    }
}

impl Dedup {
    /// `capacity` entries and `max_bytes` in all, each kept at most `ttl`.
    pub(crate) fn new(ttl: Duration, capacity: usize, max_bytes: usize) -> Dedup {
        Dedup {
            ttl,
            capacity: capacity.div_ceil(SHARDS).max(1),
            max_bytes: max_bytes.div_ceil(SHARDS).max(1),
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, topic: &str, correlation: &[u8]) -> std::sync::MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one((topic, correlation)) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks a request up by (response topic, correlation data) and marks a new one in progress.
    pub(crate) fn check(&self, topic: &str, correlation: &Bytes) -> Seen {
        let now = Instant::now();
        let mut shard = self.shard(topic, correlation);
        // Forget what is too old, and the oldest while over a limit.
        while let Some((t, _)) = shard.order.front() {
            let over = shard.order.len() >= self.capacity || shard.bytes >= self.max_bytes;
            if now.duration_since(*t) <= self.ttl && !over {
                break;
            }
            if let Some((_, k)) = shard.order.pop_front() {
                shard.remove(&k);
            }
        }
        let probe: Key = Arc::new((topic.to_owned(), Bytes::copy_from_slice(correlation)));
        match shard.map.get(&probe) {
            Some(Slot { answer: Some(out), .. }) => Seen::Answered(out.clone()),
            Some(Slot { answer: None, .. }) => Seen::InProgress,
            None => {
                let cost = key_cost(&probe);
                shard.bytes += cost;
                shard.map.insert(probe.clone(), Slot { answer: None, cost });
                shard.order.push_back((now, probe.clone()));
                Seen::New(probe)
            }
        }
    }

    /// Stores the answer of a request marked in progress.
    pub(crate) fn answered(&self, key: &Key, out: Arc<Outgoing>) {
        let mut shard = self.shard(&key.0, &key.1);
        let extra = answer_cost(&out);
        if let Some(slot) = shard.map.get_mut(key) {
            slot.answer = Some(out);
            slot.cost += extra;
            shard.bytes += extra;
        }
    }

    /// Forgets a request that got no answer, so a redelivery is executed.
    pub(crate) fn forget(&self, key: &Key) {
        self.shard(&key.0, &key.1).remove(key);
    }

    /// Entries and bytes held (tests and metrics).
    pub(crate) fn held(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(n, b), s| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            (n + s.map.len(), b + s.bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(payload: &[u8]) -> Arc<Outgoing> {
        Arc::new(Outgoing {
            topic: "resp".into(),
            payload: Bytes::copy_from_slice(payload),
            correlation: Some(Bytes::from_static(b"c")),
            user_properties: vec![("__stat".into(), "200".into())],
            message_expiry: None,
        })
    }

    fn new_key(d: &Dedup, topic: &str, corr: &'static [u8]) -> Key {
        match d.check(topic, &Bytes::from_static(corr)) {
            Seen::New(k) => k,
            other => panic!("expected a new request, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn redelivery_gets_the_first_answer_and_a_copy_in_progress_gets_nothing() {
        let d = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let k = new_key(&d, "resp", b"1");
        assert_eq!(d.check("resp", &Bytes::from_static(b"1")), Seen::InProgress);
        d.answered(&k, answer(b"+OK\r\n"));
        assert_eq!(
            d.check("resp", &Bytes::from_static(b"1")),
            Seen::Answered(answer(b"+OK\r\n"))
        );
        // Another topic or correlation is another request.
        new_key(&d, "other", b"1");
        new_key(&d, "resp", b"2");
    }

    #[tokio::test]
    async fn forgotten_requests_run_again() {
        let d = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let k = new_key(&d, "resp", b"1");
        d.forget(&k);
        new_key(&d, "resp", b"1");
    }

    #[tokio::test(start_paused = true)]
    async fn answers_expire_after_the_ttl() {
        let d = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let k = new_key(&d, "resp", b"1");
        d.answered(&k, answer(b"+OK\r\n"));
        tokio::time::advance(Duration::from_secs(61)).await;
        // Expiry is enforced per shard on the next lookup in it: look the same key up.
        new_key(&d, "resp", b"1");
    }

    #[tokio::test]
    async fn capacity_and_bytes_are_bounded() {
        let d = Dedup::new(Duration::from_secs(60), 16 * 4, 1 << 30);
        for i in 0..10_000u32 {
            let corr = Bytes::from(i.to_be_bytes().to_vec());
            if let Seen::New(k) = d.check("resp", &corr) {
                d.answered(&k, answer(b"+OK\r\n"));
            }
        }
        assert!(d.held().0 <= 16 * 4, "{:?}", d.held());

        let d = Dedup::new(Duration::from_secs(60), 1_000_000, 16 * 64 * 1024);
        let big = vec![0u8; 16 * 1024];
        for i in 0..10_000u32 {
            let corr = Bytes::from(i.to_be_bytes().to_vec());
            if let Seen::New(k) = d.check("resp", &corr) {
                d.answered(&k, answer(&big));
            }
        }
        let (_, bytes) = d.held();
        // Each shard may pass its budget by the one entry that filled it.
        assert!(bytes <= 16 * (64 * 1024 + 17 * 1024), "{bytes}");
    }

    #[tokio::test]
    async fn keys_do_not_pin_the_request_packet() {
        let d = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let packet = Bytes::from(vec![7u8; 1 << 20]);
        let _ = d.check("resp", &packet.slice(0..16));
        assert!(packet.is_unique());
    }
}
