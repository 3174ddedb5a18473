//! How records, versions and deadlines look inside Redis, and the names of the Redis keys of
//! one store. Pure: no connection, unit-tested below.

use bytes::Bytes;

use crate::hlc::Hlc;
use crate::{Record, StorageError};

/// The fields of a record hash, in the order [`decode_record`] takes them.
pub const RECORD_FIELDS: [&str; 5] = ["v", "ver", "ft", "exp", "sl"];

/// The Redis keys of one store, all under one prefix.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: Vec<u8>,
    /// ZSET, score 0, member = key: every key in byte order (ZRANGE BYLEX compares bytes).
    pub index: Vec<u8>,
    /// ZSET, score = deadline ms, member = key: the keys that have a deadline.
    pub deadlines: Vec<u8>,
    /// ZSET with one member, score 0: the highest version ever written (lex order of the
    /// encoding = HLC order, see [`encode_version`]).
    pub max_version: Vec<u8>,
    /// ZSET with one member, score 0: the highest version a removal (delete or expiry) was
    /// issued. A key created from then on must get a later version: versions and fencing
    /// tokens of a key never go backwards, even across its deletion and replicas' clocks.
    pub removed_version: Vec<u8>,
    /// STRING, a counter: written by reads with `--redis-wait-replicas`, so that `WAIT` after
    /// a read waits for every write the read saw (see `Shared::barrier`).
    pub read_barrier: Vec<u8>,
    /// STREAM: the shared change log; STRING: its last sequence number.
    pub log: Vec<u8>,
    pub log_seq: Vec<u8>,
    /// HASH client -> broker session ('' = unknown): the clients with KEYNOTIFY registrations.
    pub observers: Vec<u8>,
    /// STRING: registrations of all clients.
    pub observer_count: Vec<u8>,
    /// HASH client -> ms since the epoch: when a replica last saw the client.
    pub seen: Vec<u8>,
    /// HASH client -> origin: the only replica that can reach the client, when only one can.
    pub homes: Vec<u8>,
    /// HASH origin -> ms of Redis's clock: the replicas that send notifications, and when
    /// each last renewed its membership.
    pub members: Vec<u8>,
    /// HASH origin -> log position up to which the member sent what it owed.
    pub progress: Vec<u8>,
    /// HASH node id -> origin: the process that last joined for each node.
    pub nodes: Vec<u8>,
    observer_prefix: Vec<u8>,
    mark_prefix: Vec<u8>,
}

impl Names {
    pub fn new(prefix: &str) -> Names {
        let with = |suffix: &str| [prefix.as_bytes(), suffix.as_bytes()].concat();
        Names {
            prefix: with("r:"),
            index: with("keys"),
            deadlines: with("deadlines"),
            max_version: with("maxver"),
            removed_version: with("removedver"),
            read_barrier: with("readbarrier"),
            log: with("log"),
            log_seq: with("logseq"),
            observers: with("obs"),
            observer_count: with("obscount"),
            seen: with("seen"),
            homes: with("obshome"),
            members: with("members"),
            progress: with("progress"),
            nodes: with("nodes"),
            observer_prefix: with("o:"),
            mark_prefix: with("q:"),
        }
    }

    /// SET: the keys `client` observes.
    pub fn observed_by(&self, client: &str) -> Vec<u8> {
        [&self.observer_prefix[..], client.as_bytes()].concat()
    }

    /// STRING with a TTL: the stored outcome of the request `id`.
    pub fn mark(&self, id: &[u8]) -> Vec<u8> {
        [&self.mark_prefix[..], id].concat()
    }

    /// The prefix of [`Names::observed_by`] (scripts that list every client build names).
    pub fn observer_prefix(&self) -> &[u8] {
        &self.observer_prefix
    }

    /// The hash holding `key`'s record. Record names start with `<prefix>r:`, which no other
    /// name of the store does.
    pub fn record(&self, key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], key].concat()
    }
}

/// A version as stored: `{ms:020}:{counter:010}:{node}`. Fixed-width numbers make the byte
/// order of encodings the order of the versions (ms, then counter, then node bytes), so Redis
/// can keep the highest in a sorted set without understanding HLCs, and equal versions have
/// equal encodings, which is all the swap script compares.
pub fn encode_version(v: &Hlc) -> Vec<u8> {
    format!("{:020}:{:010}:{}", v.ms, v.counter, v.node).into_bytes()
}

pub fn decode_version(bytes: &[u8]) -> Result<Hlc, StorageError> {
    let bad = || {
        StorageError::Corrupt(format!(
            "a stored version is malformed: {:?}",
            String::from_utf8_lossy(bytes)
        ))
    };
    if bytes.len() <= 32 || bytes[20] != b':' || bytes[31] != b':' {
        return Err(bad());
    }
    let number = |digits: &[u8]| -> Option<u64> {
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    let ms = number(&bytes[..20]).ok_or_else(bad)?;
    let counter = number(&bytes[21..31])
        .and_then(|c| u32::try_from(c).ok())
        .ok_or_else(bad)?;
    let node = std::str::from_utf8(&bytes[32..]).map_err(|_| bad())?;
    Ok(Hlc::new(ms, counter, node))
}

pub fn encode_deadline(ms: u64) -> String {
    ms.to_string()
}

fn decode_deadline(bytes: &[u8]) -> Result<u64, StorageError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| StorageError::Corrupt(format!("a stored deadline is malformed: {bytes:?}")))
}

/// A record from the values of [`RECORD_FIELDS`] (HMGET), or `None` when the hash is absent.
pub fn decode_record(fields: Vec<Option<Bytes>>) -> Result<Option<Record>, StorageError> {
    let mut fields = fields.into_iter();
    let (Some(value), Some(version), Some(fencing), Some(deadline), Some(slide)) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(StorageError::Backend("HMGET answered fewer fields than asked".into()));
    };
    let Some(version) = version else {
        // Every write sets `ver`: no version, no record.
        return Ok(None);
    };
    Ok(Some(Record {
        value: value.unwrap_or_default(),
        version: decode_version(&version)?,
        fencing: fencing.map(|f| decode_version(&f)).transpose()?,
        expires_at_ms: deadline.map(|d| decode_deadline(&d)).transpose()?,
        slide_ms: slide.map(|s| decode_deadline(&s)).transpose()?,
    }))
}

/// A sorted-set score (a deadline) back as milliseconds. Scores are doubles: exact up to 2^53
/// ms (year 287,000); beyond that only the order matters, and it is kept.
pub fn score_ms(score: f64) -> u64 {
    // `as` saturates: NaN and negatives become 0, infinities the bounds.
    score as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip() {
        for v in [
            Hlc::new(0, 0, "n"),
            Hlc::new(1_700_000_000_000, 7, "stategate-1"),
            Hlc::new(u64::MAX, u32::MAX, "ü node"),
        ] {
            let e = encode_version(&v);
            assert_eq!(decode_version(&e).unwrap(), v);
        }
        assert_eq!(
            encode_version(&Hlc::new(5, 3, "a")),
            b"00000000000000000005:0000000003:a".to_vec()
        );
    }

    #[test]
    fn encoding_order_is_hlc_order() {
        let versions = [
            Hlc::new(1, 0, "b"),
            Hlc::new(1, 0, "ba"),
            Hlc::new(1, 1, "a"),
            Hlc::new(1, 10, "a"),
            Hlc::new(2, 0, "a"),
            Hlc::new(10, 0, "a"),
            Hlc::new(u64::MAX, 0, "a"),
        ];
        for pair in versions.windows(2) {
            assert!(pair[0] < pair[1]);
            assert!(encode_version(&pair[0]) < encode_version(&pair[1]), "{pair:?}");
        }
    }

    #[test]
    fn malformed_versions_are_corrupt() {
        for bad in [
            &b""[..],
            b"00000000000000000005:0000000003:",
            b"00000000000000000005:0000000003a",
            b"0000000000000000000x:0000000003:a",
            b"00000000000000000005:9999999999:a",
            b"00000000000000000005:0000000003:\xff",
        ] {
            assert!(matches!(decode_version(bad), Err(StorageError::Corrupt(_))), "{bad:?}");
        }
    }

    #[test]
    fn records_decode() {
        let b = |s: &str| Some(Bytes::copy_from_slice(s.as_bytes()));
        let ver = "00000000000000000005:0000000003:a";
        assert_eq!(decode_record(vec![None, None, None, None, None]).unwrap(), None);
        let r = decode_record(vec![b("x"), b(ver), b(ver), b("42"), None])
            .unwrap()
            .unwrap();
        assert_eq!(r.value, Bytes::from_static(b"x"));
        assert_eq!(r.version, Hlc::new(5, 3, "a"));
        assert_eq!(r.fencing, Some(Hlc::new(5, 3, "a")));
        assert_eq!(r.expires_at_ms, Some(42));
        let r = decode_record(vec![None, b(ver), None, None, None]).unwrap().unwrap();
        assert_eq!((r.value, r.fencing, r.expires_at_ms), (Bytes::new(), None, None));
        assert!(decode_record(vec![b("x"), b(ver), None, b("soon"), None]).is_err());
        let r = decode_record(vec![b("x"), b(ver), None, b("42"), b("7")])
            .unwrap()
            .unwrap();
        assert_eq!((r.expires_at_ms, r.slide_ms), (Some(42), Some(7)));
        assert!(decode_record(vec![b("x")]).is_err());
    }

    #[test]
    fn names_do_not_collide() {
        let n = Names::new("sg:");
        assert_eq!(n.record(b"keys"), b"sg:r:keys");
        for other in [
            &n.index,
            &n.deadlines,
            &n.max_version,
            &n.removed_version,
            &n.read_barrier,
            &n.log,
            &n.log_seq,
            &n.observers,
            &n.observer_count,
            &n.seen,
            &n.observed_by("c"),
            &n.mark(b"m"),
        ] {
            assert!(!other.starts_with(b"sg:r:"));
        }
        assert!(!n.mark(b"").starts_with(b"sg:o:") && !n.observed_by("").starts_with(b"sg:q:"));
    }

    #[test]
    fn scores() {
        assert_eq!(score_ms(1_700_000_000_123.0), 1_700_000_000_123);
        assert_eq!(score_ms(f64::NAN), 0);
        assert_eq!(score_ms(f64::INFINITY), u64::MAX);
    }
}
