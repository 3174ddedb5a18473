//! The record an election's leader proclaims in: the companion key `NAME.proclaimed` of the
//! lease `NAME` (`docs/election.md`). Its one encoder and its one parser, shared by the
//! service's election API (`dapr/election.rs`) and the client's `stategate elect` (which reaches
//! the record through a door, as any client would). Pure: no engine call here.
//!
//! Stored form: `token\nholder` or `token\nholder\nvalue`, where `token` is the fencing token
//! of the leadership that wrote it (an HLC in its text form) and `holder` the lease's holder
//! (non-empty, no newline; the value may hold anything). The token travels in the value so
//! that a reader that cannot see the record's fencing token (a client over MQTT) applies the
//! same check as the service: a proclamation counts only for the lease it belongs to. A value
//! that does not parse is no proclamation (an ordinary key that happens to have the name):
//! the election neither counts, overwrites nor removes it.

use bytes::Bytes;

use crate::hlc::Hlc;

/// What the companion key of an election adds to the election's key.
pub const PROCLAIMED_SUFFIX: &str = ".proclaimed";

/// The companion key holding what the leader of `key` proclaimed.
pub fn proclaimed_key(key: &[u8]) -> Bytes {
    let mut k = Vec::with_capacity(key.len() + PROCLAIMED_SUFFIX.len());
    k.extend_from_slice(key);
    k.extend_from_slice(PROCLAIMED_SUFFIX.as_bytes());
    Bytes::from(k)
}

/// A leader's proclamation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proclamation {
    /// The fencing token of the leadership that wrote it.
    pub token: Hlc,
    /// The lease's holder when it was written.
    pub holder: Bytes,
    /// What the leader proclaimed (`None`: nothing; the record still marks the leadership).
    pub value: Option<Bytes>,
}

impl Proclamation {
    /// The stored form.
    pub fn encode(&self) -> Bytes {
        let token = self.token.to_string();
        let value = self.value.as_ref().map_or(0, |v| v.len() + 1);
        let mut out = Vec::with_capacity(token.len() + 1 + self.holder.len() + value);
        out.extend_from_slice(token.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(&self.holder);
        if let Some(v) = &self.value {
            out.push(b'\n');
            out.extend_from_slice(v);
        }
        Bytes::from(out)
    }

    /// Reads a stored value; `None` when it is no proclamation (no token line, an empty holder).
    pub fn parse(stored: &Bytes) -> Option<Proclamation> {
        let token_end = stored.iter().position(|b| *b == b'\n')?;
        let token: Hlc = std::str::from_utf8(&stored[..token_end]).ok()?.parse().ok()?;
        let rest = stored.slice(token_end + 1..);
        let (holder, value) = match rest.iter().position(|b| *b == b'\n') {
            Some(at) => (rest.slice(..at), Some(rest.slice(at + 1..))),
            None => (rest, None),
        };
        if holder.is_empty() {
            return None;
        }
        Some(Proclamation { token, holder, value })
    }

    /// Whether it was proclaimed during the leadership of the lease that `holder` holds now at
    /// `lease_version`: the same holder, and a token not newer than the lease (a token is the
    /// version of the SET that won the lease; renewals only raise the lease's version).
    pub fn belongs_to(&self, holder: &[u8], lease_version: &Hlc) -> bool {
        self.holder == holder && self.token <= *lease_version
    }

    /// Whether a record read with its fencing token (where the reader sees it: the service)
    /// was written under the token it names. A client through a door cannot see it and relies
    /// on [`Proclamation::belongs_to`] alone.
    pub fn written_under(&self, record_fencing: Option<&Hlc>) -> bool {
        record_fencing == Some(&self.token)
    }
}

/// Whether the election may write its proclamation over what `NAME.proclaimed` holds: nothing,
/// or an earlier proclamation. Anything else is someone's ordinary key, left alone.
pub fn may_replace(stored: Option<&Bytes>) -> bool {
    stored.is_none_or(|v| Proclamation::parse(v).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn round_trips_with_and_without_a_value() {
        for value in [None, Some(b("")), Some(b("http://a:8080\nsecond line"))] {
            let p = Proclamation {
                token: Hlc::new(1_700_000_000_000, 3, "stategate"),
                holder: b("host-a"),
                value,
            };
            assert_eq!(Proclamation::parse(&p.encode()), Some(p));
        }
        assert_eq!(
            &Proclamation {
                token: Hlc::new(5, 0, "n"),
                holder: b("a"),
                value: Some(b("v")),
            }
            .encode()[..],
            b"000000000000005:00000:n\na\nv"
        );
    }

    #[test]
    fn ordinary_values_are_no_proclamation() {
        for stored in [
            "",
            "a",
            "a\nhttp://a",
            "not a token\na\nv",
            "000000000000005:00000:n",
            "000000000000005:00000:n\n",
            "000000000000005:00000:n\n\nv",
        ] {
            assert_eq!(Proclamation::parse(&b(stored)), None, "{stored:?}");
        }
        assert!(may_replace(None));
        assert!(may_replace(Some(&b("000000000000005:00000:n\na"))));
        assert!(!may_replace(Some(&b("a\nhttp://a"))));
    }

    #[test]
    fn belongs_to_the_lease_of_its_holder_from_its_token_on() {
        let p = Proclamation::parse(&b("000000000000005:00000:n\na\nv")).unwrap();
        assert!(p.belongs_to(b"a", &Hlc::new(5, 0, "n")));
        assert!(
            p.belongs_to(b"a", &Hlc::new(9, 0, "n")),
            "a renewal raises the lease's version"
        );
        assert!(!p.belongs_to(b"b", &Hlc::new(9, 0, "n")), "another holder's lease");
        assert!(
            !p.belongs_to(b"a", &Hlc::new(4, 0, "n")),
            "a token newer than the lease"
        );
        assert!(p.written_under(Some(&Hlc::new(5, 0, "n"))));
        assert!(!p.written_under(None), "written without its token");
        assert!(!p.written_under(Some(&Hlc::new(6, 0, "n"))));
    }
}
