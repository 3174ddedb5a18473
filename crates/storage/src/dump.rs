//! The export format (`stategate export` / `import`, `GET /v1.0-alpha1/stategate/export`): JSON
//! lines, one live record per line, every field a record has.
//!
//! ```text
//! {"key":"user:1","value":"aGVsbG8=","version":"001795380000000:00000:stategate",
//!  "fencing_token":"001795380000000:00003:stategate","expires_at_ms":1795380060000}
//! ```
//! (one line). `value` is always base64 (standard alphabet, padded). `key` is the key as text
//! when it is UTF-8; otherwise base64 with `"key_base64": true` beside it. `fencing_token` and
//! `expires_at_ms` (the absolute deadline, ms since the epoch) are absent when the record has
//! none; `slide_ms` (a sliding time to live, pushed out by every read) only with a deadline.
//! Unknown fields are refused, so a line never loses a meaning on the way in.
//!
//! Pure: bytes in, bytes out. Shared by the HTTP door (which serves and takes it) and the
//! command-line client (which reads and writes files of it).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::Record;
use crate::hlc::Hlc;

/// The media type of an export.
pub const CONTENT_TYPE: &str = "application/x-ndjson";

/// The online backup as a byte stream (`GET /v1.0-alpha1/stategate/backup`, read by
/// `stategate backup`): parts `kind:u8 seq:u64 len:u32 bytes` (little-endian), then an end part.
/// A part of a snapshot file `seq`.
pub const BACKUP_PART_SNAPSHOT: u8 = 1;
/// A part of a log segment `seq`.
pub const BACKUP_PART_LOG: u8 = 2;
/// The end part, with the counts.
pub const BACKUP_END: u8 = 0;

/// A line that is not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DumpError(String);

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    key: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    key_base64: bool,
    value: String,
    version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fencing_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "milliseconds")]
    expires_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "milliseconds")]
    slide_ms: Option<u64>,
}

/// Milliseconds as the HTTP import's document describes them (an `int64` at least 0): a whole
/// number, `5` or `5.0`, up to `i64::MAX`; `null` is none. A double is taken only below 2^53,
/// where it is exactly the integer it shows.
fn milliseconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    n.as_u64()
        .filter(|&u| i64::try_from(u).is_ok())
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(f))
                .map(|f| f as u64)
        })
        .map(Some)
        .ok_or_else(|| D::Error::custom(format!("{n} is not a whole number of milliseconds from 0 to 2^63-1")))
}

/// Appends one record as a line (with its `\n`).
pub fn encode_line(key: &[u8], record: &Record, out: &mut Vec<u8>) {
    let (key, key_base64) = match std::str::from_utf8(key) {
        Ok(k) => (k.to_owned(), false),
        Err(_) => (STANDARD.encode(key), true),
    };
    let line = Line {
        key,
        key_base64,
        value: STANDARD.encode(&record.value),
        version: record.version.to_string(),
        fencing_token: record.fencing.as_ref().map(ToString::to_string),
        expires_at_ms: record.expires_at_ms,
        slide_ms: record.slide_ms,
    };
    // Serializing strings and integers cannot fail.
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    }
}

/// Decodes one line (without its `\n`; a trailing `\r` is allowed).
pub fn decode_line(line: &[u8]) -> Result<(Bytes, Record), DumpError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let l: Line = serde_json::from_slice(line).map_err(|e| DumpError(format!("not a record: {e}")))?;
    let key = if l.key_base64 {
        STANDARD
            .decode(&l.key)
            .map_err(|e| DumpError(format!("key_base64: the key is not base64: {e}")))?
    } else {
        l.key.into_bytes()
    };
    if key.is_empty() {
        return Err(DumpError("the key is empty".into()));
    }
    let value = STANDARD
        .decode(&l.value)
        .map_err(|e| DumpError(format!("the value is not base64: {e}")))?;
    let hlc = |field: &str, s: &str| {
        s.parse::<Hlc>()
            .map_err(|_| DumpError(format!("{field} {s:?} is not a version (<ms>:<counter>:<node>)")))
    };
    let version = hlc("version", &l.version)?;
    if l.slide_ms.is_some() && l.expires_at_ms.is_none() {
        return Err(DumpError("slide_ms needs expires_at_ms".into()));
    }
    if l.slide_ms == Some(0) {
        return Err(DumpError("slide_ms must be at least 1".into()));
    }
    let fencing = l
        .fencing_token
        .as_deref()
        .map(|t| hlc("fencing_token", t))
        .transpose()?;
    Ok((
        Bytes::from(key),
        Record {
            value: Bytes::from(value),
            version,
            fencing,
            expires_at_ms: l.expires_at_ms,
            slide_ms: l.slide_ms,
        },
    ))
}

/// Decodes every non-empty line of `text`; an error names the line (1-based, counted from
/// `first_line`).
pub fn decode_lines(text: &[u8], first_line: usize) -> Result<Vec<(Bytes, Record)>, DumpError> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
        .map(|(i, l)| decode_line(l).map_err(|e| DumpError(format!("line {}: {}", first_line + i, e.0))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value: &[u8]) -> Record {
        Record {
            value: Bytes::copy_from_slice(value),
            version: Hlc::new(1_795_380_000_000, 2, "n1"),
            fencing: Some(Hlc::new(1_795_380_000_000, 1, "n1")),
            expires_at_ms: Some(1_795_380_060_000),
            slide_ms: None,
        }
    }

    #[test]
    fn lines_round_trip_every_field_and_any_bytes() {
        let mut out = Vec::new();
        encode_line(b"user:1", &rec(b"hello"), &mut out);
        encode_line(b"\xff\x00bin", &rec(b"\x00\xff\r\n"), &mut out);
        let plain = Record {
            fencing: None,
            expires_at_ms: None,
            slide_ms: None,
            ..rec(b"")
        };
        encode_line(b"k", &plain, &mut out);
        let sliding = Record {
            slide_ms: Some(30_000),
            ..rec(b"s")
        };
        encode_line(b"session", &sliding, &mut out);
        let text = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            text.lines().next().unwrap(),
            r#"{"key":"user:1","value":"aGVsbG8=","version":"001795380000000:00002:n1","fencing_token":"001795380000000:00001:n1","expires_at_ms":1795380060000}"#
        );
        assert!(text.lines().nth(1).unwrap().contains(r#""key_base64":true"#));
        assert_eq!(
            text.lines().nth(2).unwrap(),
            r#"{"key":"k","value":"","version":"001795380000000:00002:n1"}"#
        );
        let back = decode_lines(&out, 1).unwrap();
        assert_eq!(back[0], (Bytes::from_static(b"user:1"), rec(b"hello")));
        assert_eq!(back[1], (Bytes::from_static(b"\xff\x00bin"), rec(b"\x00\xff\r\n")));
        assert_eq!(back[2], (Bytes::from_static(b"k"), plain));
        assert!(
            text.lines()
                .nth(3)
                .unwrap()
                .ends_with(r#""expires_at_ms":1795380060000,"slide_ms":30000}"#)
        );
        assert_eq!(back[3], (Bytes::from_static(b"session"), sliding));
        let bad = r#"{"key":"k","value":"","version":"001795380000000:00002:n1","slide_ms":5}"#;
        assert!(
            decode_line(bad.as_bytes())
                .unwrap_err()
                .0
                .contains("needs expires_at_ms")
        );
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (line, why) in [
            (r#"{"key":"k","value":"!!","version":"1:0:n"}"#, "not base64"),
            (r#"{"key":"k","value":"","version":"yesterday"}"#, "not a version"),
            (r#"{"key":"","value":"","version":"1:0:n"}"#, "empty"),
            (r#"{"key":"k","value":"","version":"1:0:n","ttl":5}"#, "unknown field"),
            (r#"{"key":"k","value":""}"#, "missing field"),
            ("not json", "not a record"),
        ] {
            let text = format!("\n{line}\n");
            let e = decode_lines(text.as_bytes(), 10).unwrap_err().to_string();
            assert!(e.starts_with("line 11: ") && e.contains(why), "{line}: {e}");
        }
    }
}
