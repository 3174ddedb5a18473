//! What the MQTT door's metrics and spans need from a request and its answer, read without
//! decoding the request again.

use super::request::{Outgoing, PROP_STATUS};
use crate::metrics::{Cmd, Outcome};

/// The verb and the key length of a RESP request (`*<n>\r\n$<len>\r\n<verb>\r\n$<len>\r\n...`).
pub fn verb_and_key_len(payload: &[u8]) -> (Cmd, usize) {
    let Some(body) = payload
        .strip_prefix(b"*")
        .and_then(|p| line_end(p).map(|i| &p[i + 2..]))
    else {
        return (Cmd::Other, 0);
    };
    let Some((verb, rest)) = next_bulk(body) else {
        return (Cmd::Other, 0);
    };
    let key_len = next_bulk(rest).map_or(0, |(k, _)| k.len());
    (Cmd::from_verb(verb), key_len)
}

/// The bulk string at the start of `p`, and what follows it.
fn next_bulk(p: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, after) = bulk_len(p)?;
    let value = after.get(..len)?;
    Some((value, after.get(len + 2..).unwrap_or_default()))
}

fn line_end(p: &[u8]) -> Option<usize> {
    p.windows(2).position(|w| w == b"\r\n")
}

/// `$<len>\r\n` at the start of `p`: the length and what follows the line.
fn bulk_len(p: &[u8]) -> Option<(usize, &[u8])> {
    let p = p.strip_prefix(b"$")?;
    let end = line_end(p)?;
    let len = std::str::from_utf8(&p[..end]).ok()?.parse().ok()?;
    Some((len, &p[end + 2..]))
}

/// How an answer ended: its `__stat`, and for 200 whether the payload is a RESP error.
pub fn outcome(out: &Outgoing) -> Outcome {
    let status = out
        .user_properties
        .iter()
        .find(|(k, _)| k == PROP_STATUS)
        .and_then(|(_, v)| v.parse::<u16>().ok())
        .unwrap_or(200);
    match Outcome::from_status(status) {
        Outcome::Ok if out.payload.first() == Some(&b'-') => Outcome::ClientError,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_and_keys() {
        assert_eq!(verb_and_key_len(b"*2\r\n$3\r\nGET\r\n$5\r\nhello\r\n"), (Cmd::Get, 5));
        assert_eq!(
            verb_and_key_len(b"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$1\r\nv\r\n"),
            (Cmd::Set, 1)
        );
        assert_eq!(verb_and_key_len(b"*1\r\n$4\r\nSCAN\r\n"), (Cmd::Scan, 0));
        for junk in [
            &b""[..],
            b"*",
            b"*2\r\n$99\r\nGET\r\n",
            b"$3\r\nGET\r\n",
            b"*2\r\n$x\r\n",
        ] {
            assert_eq!(verb_and_key_len(junk).0, Cmd::Other, "{junk:?}");
        }
    }
}
