//! The short-lived response cache that answers a QoS 1 redelivery without executing it again.
//!
//! Two paths use it, each with a cache of its own: requests on the invoke topic, keyed by their
//! response topic and correlation data ([`Dedup::check`]), and set-by-publish, keyed by the
//! publisher's session and packet id ([`Dedup::check_key`], `mirror::setbypublish`), whose answer
//! is a PUBACK reason code.
//!
//! Sharded by key hash, so concurrent writers rarely meet on one lock; bounded by entries,
//! bytes and age. Every write passes through it and most entries are never read again, so an
//! entry is two allocations: its key (response topic and correlation data, copied: a slice of
//! the request packet would pin the whole packet) and its answer encoded into one buffer,
//! decoded only on a redelivery. (Keeping the answer as built, a dozen allocations freed a
//! minute later from cold memory, made SET measurably slower than GET on every path.)

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::time::{Duration, Instant};

use super::request::Outgoing;

/// An answer the cache keeps, as one buffer (one allocation per entry, decoded only when a
/// redelivery asks for it).
pub(crate) trait Answer: Sized {
    fn encode(&self) -> Box<[u8]>;
    /// The inverse of `encode`; `None` only if the buffer is not one it wrote.
    fn decode(buf: &[u8]) -> Option<Self>;
}

impl Answer for Outgoing {
    fn encode(&self) -> Box<[u8]> {
        encode(self)
    }

    fn decode(buf: &[u8]) -> Option<Outgoing> {
        decode(buf)
    }
}

/// `topic_len:u32(BE) topic correlation`: the bytes of [`super::request::request_id`], allocated
/// once and shared by the map and the queue.
pub(crate) type Key = Arc<[u8]>;

/// What the cache knows of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen<A = Outgoing> {
    /// First time: execute it (the cache now marks it in progress under this key).
    New(Key),
    /// Still executing: the first copy will answer.
    InProgress,
    /// Answered before: send this again.
    Answered(Arc<A>),
}

const SHARDS: usize = 16;
/// Bookkeeping bytes counted per entry besides its key and answer.
const ENTRY_OVERHEAD: usize = 96;

#[derive(Debug)]
pub(crate) struct Dedup<A = Outgoing> {
    ttl: Duration,
    /// Per shard.
    capacity: usize,
    max_bytes: usize,
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
    answers: std::marker::PhantomData<fn() -> A>,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Key, Slot>,
    order: VecDeque<(Instant, Key)>,
    bytes: usize,
}

#[derive(Debug)]
struct Slot {
    /// The answer, [`encode`]d.
    answer: Option<Box<[u8]>>,
    cost: usize,
}

fn key(topic: &str, correlation: &[u8]) -> Key {
    let mut k = Vec::with_capacity(4 + topic.len() + correlation.len());
    k.extend_from_slice(&(topic.len() as u32).to_be_bytes());
    k.extend_from_slice(topic.as_bytes());
    k.extend_from_slice(correlation);
    k.into()
}

fn put(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf.extend_from_slice(bytes);
}

/// An [`Outgoing`] as one buffer: topic, payload, correlation (flag + bytes), expiry (flag + u32),
/// then the user properties, each a length-prefixed string.
fn encode(out: &Outgoing) -> Box<[u8]> {
    let props: usize = out.user_properties.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
    let mut buf = Vec::with_capacity(32 + out.topic.len() + out.payload.len() + props);
    put(&mut buf, out.topic.as_bytes());
    put(&mut buf, &out.payload);
    match &out.correlation {
        Some(c) => {
            buf.push(1);
            put(&mut buf, c);
        }
        None => buf.push(0),
    }
    match out.message_expiry {
        Some(e) => {
            buf.push(1);
            buf.extend_from_slice(&e.to_le_bytes());
        }
        None => buf.push(0),
    }
    for (k, v) in &out.user_properties {
        put(&mut buf, k.as_bytes());
        put(&mut buf, v.as_bytes());
    }
    buf.into_boxed_slice()
}

/// The inverse of [`encode`]; `None` only if the buffer is not one it wrote.
fn decode(mut buf: &[u8]) -> Option<Outgoing> {
    fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (buf.get(..n)?, buf.get(n..)?);
        *buf = rest;
        Some(head)
    }
    fn bytes<'a>(buf: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(take(buf, 4)?.try_into().ok()?) as usize;
        take(buf, len)
    }
    fn text(buf: &mut &[u8]) -> Option<String> {
        String::from_utf8(bytes(buf)?.to_vec()).ok()
    }
    let topic = text(&mut buf)?;
    let payload = Bytes::copy_from_slice(bytes(&mut buf)?);
    let correlation = match take(&mut buf, 1)? {
        [1] => Some(Bytes::copy_from_slice(bytes(&mut buf)?)),
        _ => None,
    };
    let message_expiry = match take(&mut buf, 1)? {
        [1] => Some(u32::from_le_bytes(take(&mut buf, 4)?.try_into().ok()?)),
        _ => None,
    };
    let mut user_properties = Vec::new();
    while !buf.is_empty() {
        user_properties.push((text(&mut buf)?, text(&mut buf)?));
    }
    Some(Outgoing {
        topic,
        payload,
        correlation,
        user_properties,
        message_expiry,
    })
}

impl Shard {
    fn remove(&mut self, key: &Key) {
        if let Some(slot) = self.map.remove(key) {
            self.bytes -= slot.cost;
        }
    }
}

impl<A: Answer> Dedup<A> {
    /// `capacity` entries and `max_bytes` in all, each kept at most `ttl`.
    pub(crate) fn new(ttl: Duration, capacity: usize, max_bytes: usize) -> Dedup<A> {
        Dedup {
            ttl,
            capacity: capacity.div_ceil(SHARDS).max(1),
            max_bytes: max_bytes.div_ceil(SHARDS).max(1),
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            answers: std::marker::PhantomData,
        }
    }

    fn shard(&self, key: &[u8]) -> std::sync::MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks a request up by (response topic, correlation data) and marks a new one in progress.
    pub(crate) fn check(&self, topic: &str, correlation: &Bytes) -> Seen<A> {
        self.check_key(key(topic, correlation))
    }

    /// Looks a request up by its key and marks a new one in progress.
    pub(crate) fn check_key(&self, probe: Key) -> Seen<A> {
        let now = Instant::now();
        let mut shard = self.shard(&probe);
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
        match shard.map.get(&probe) {
            Some(Slot { answer: Some(buf), .. }) => match A::decode(buf) {
                Some(out) => Seen::Answered(Arc::new(out)),
                None => Seen::InProgress,
            },
            Some(Slot { answer: None, .. }) => Seen::InProgress,
            None => {
                let cost = ENTRY_OVERHEAD + probe.len();
                shard.bytes += cost;
                shard.map.insert(probe.clone(), Slot { answer: None, cost });
                shard.order.push_back((now, probe.clone()));
                Seen::New(probe)
            }
        }
    }

    /// Stores the answer of a request marked in progress.
    pub(crate) fn answered(&self, key: &Key, out: &A) {
        let buf = out.encode();
        let extra = buf.len();
        let mut shard = self.shard(key);
        if let Some(slot) = shard.map.get_mut(key) {
            slot.answer = Some(buf);
            slot.cost += extra;
            shard.bytes += extra;
        }
    }

    /// Forgets a request that got no answer, so a redelivery is executed.
    pub(crate) fn forget(&self, key: &Key) {
        self.shard(key).remove(key);
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
        let d: Dedup = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let k = new_key(&d, "resp", b"1");
        assert_eq!(d.check("resp", &Bytes::from_static(b"1")), Seen::InProgress);
        d.answered(&k, &answer(b"+OK\r\n"));
        assert_eq!(
            d.check("resp", &Bytes::from_static(b"1")),
            Seen::Answered(answer(b"+OK\r\n"))
        );
        // Another topic or correlation is another request.
        new_key(&d, "other", b"1");
        new_key(&d, "resp", b"2");
    }

    #[tokio::test]
    async fn keys_are_the_request_ids() {
        let d: Dedup = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let k = new_key(&d, "resp", b"\x00\x01");
        assert_eq!(&k[..], &crate::request::request_id("resp", b"\x00\x01")[..]);
    }

    #[tokio::test]
    async fn forgotten_requests_run_again() {
        let d: Dedup = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let k = new_key(&d, "resp", b"1");
        d.forget(&k);
        new_key(&d, "resp", b"1");
    }

    #[tokio::test(start_paused = true)]
    async fn answers_expire_after_the_ttl() {
        let d: Dedup = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let k = new_key(&d, "resp", b"1");
        d.answered(&k, &answer(b"+OK\r\n"));
        tokio::time::advance(Duration::from_secs(61)).await;
        // Expiry is enforced per shard on the next lookup in it: look the same key up.
        new_key(&d, "resp", b"1");
    }

    #[tokio::test]
    async fn capacity_and_bytes_are_bounded() {
        let d: Dedup = Dedup::new(Duration::from_secs(60), 16 * 4, 1 << 30);
        for i in 0..10_000u32 {
            let corr = Bytes::from(i.to_be_bytes().to_vec());
            if let Seen::New(k) = d.check("resp", &corr) {
                d.answered(&k, &answer(b"+OK\r\n"));
            }
        }
        assert!(d.held().0 <= 16 * 4, "{:?}", d.held());

        let d: Dedup = Dedup::new(Duration::from_secs(60), 1_000_000, 16 * 64 * 1024);
        let big = vec![0u8; 16 * 1024];
        for i in 0..10_000u32 {
            let corr = Bytes::from(i.to_be_bytes().to_vec());
            if let Seen::New(k) = d.check("resp", &corr) {
                d.answered(&k, &answer(&big));
            }
        }
        let (_, bytes) = d.held();
        // Each shard may pass its budget by the one entry that filled it.
        assert!(bytes <= 16 * (64 * 1024 + 17 * 1024), "{bytes}");
    }

    #[test]
    fn answers_come_back_exactly_as_stored() {
        let full = Outgoing {
            topic: "clients/a/response/ü".into(),
            payload: Bytes::from_static(b"\x00\xff+OK\r\n"),
            correlation: Some(Bytes::from_static(&[0, 1, 2, 255])),
            user_properties: vec![
                ("__stat".into(), "200".into()),
                ("__ts".into(), "001700000000000:00001:stategate".into()),
                ("".into(), "".into()),
            ],
            message_expiry: Some(u32::MAX),
        };
        let bare = Outgoing {
            topic: String::new(),
            payload: Bytes::new(),
            correlation: None,
            user_properties: vec![],
            message_expiry: None,
        };
        for out in [full, bare] {
            assert_eq!(decode(&encode(&out)), Some(out));
        }
        // A buffer cut anywhere is refused, not misread.
        let buf = encode(&answer(b"+OK\r\n"));
        for cut in 0..buf.len() {
            assert_ne!(decode(&buf[..cut]), Some((*answer(b"+OK\r\n")).clone()), "cut at {cut}");
        }
    }

    #[tokio::test]
    async fn keys_do_not_pin_the_request_packet() {
        let d: Dedup = Dedup::new(Duration::from_secs(60), 100, 1 << 20);
        let packet = Bytes::from(vec![7u8; 1 << 20]);
        let _ = d.check("resp", &packet.slice(0..16));
        assert!(packet.is_unique());
    }
}
