//! Values and JSON as Dapr carries them: which stored bytes are JSON, their content type, JSON
//! kept exactly as given (numbers keep every digit), and the base64 form of other bytes.

use std::collections::HashMap;

use base64::Engine as _;
use bytes::Bytes;
use serde_json::value::RawValue;

use super::*;

/// Whether stored bytes are a JSON document.
pub fn is_json(value: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok()
}

/// The content type of stored bytes, as reads report it.
pub fn content_type_of(value: &[u8]) -> &'static str {
    if is_json(value) {
        "application/json"
    } else {
        "application/octet-stream"
    }
}

/// The bytes to store for a value that arrived as bytes (gRPC): verbatim, unless metadata
/// `contentType` says JSON, in which case it must be JSON and is stored compacted (as HTTP
/// stores JSON values).
pub fn stored_value(value: Vec<u8>, metadata: &HashMap<String, String>) -> Result<Bytes, DaprError> {
    let json = metadata
        .get("contentType")
        .is_some_and(|c| c.split(';').next().is_some_and(|m| m.trim() == "application/json"));
    if !json {
        return Ok(Bytes::from(value));
    }
    let raw: &RawValue = serde_json::from_slice(&value)
        .map_err(|e| DaprError::Malformed(format!("contentType is application/json but the value is not: {e}")))?;
    check_decodes(raw.get())?;
    Ok(Bytes::from(compact_json(raw.get())))
}

/// Refuses JSON that does not decode into values, as daprd refuses it (Go decodes a saved value
/// before storing it): a number outside the range of a double (`1e400`), a string escape that
/// is not Unicode (a lone surrogate, `"\ud800"`). Such text would be stored, yet no one who
/// decodes JSON could read it (the query engine included). Nothing is kept: numbers in range
/// keep their text, every digit, whatever their precision. `json` must be syntactically valid.
pub fn check_decodes(json: &str) -> Result<(), DaprError> {
    serde_json::from_str::<Decodes>(json)
        .map(|_| ())
        .map_err(|e| DaprError::Malformed(format!("the value does not decode: {e}")))
}

/// Decodes every scalar of a JSON document (validating it) and keeps nothing.
struct Decodes;

impl<'de> serde::Deserialize<'de> for Decodes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Decodes, D::Error> {
        d.deserialize_any(DecodesVisitor)
    }
}

struct DecodesVisitor;

impl<'de> serde::de::Visitor<'de> for DecodesVisitor {
    type Value = Decodes;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Decodes, E> {
        Ok(Decodes)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Decodes, E> {
        Ok(Decodes)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Decodes, E> {
        Ok(Decodes)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Decodes, E> {
        Ok(Decodes)
    }
    fn visit_str<E>(self, _: &str) -> Result<Decodes, E> {
        Ok(Decodes)
    }
    fn visit_unit<E>(self) -> Result<Decodes, E> {
        Ok(Decodes)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Decodes, A::Error> {
        while seq.next_element::<Decodes>()?.is_some() {}
        Ok(Decodes)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Decodes, A::Error> {
        while map.next_entry::<Decodes, Decodes>()?.is_some() {}
        Ok(Decodes)
    }
}

/// JSON text without the whitespace between its tokens; everything else (numbers, string
/// escapes, key order) exactly as given. `json` must be valid JSON (a parsed [`RawValue`]).
/// Re-serialising a parsed document instead would change numbers: a double can come back with
/// another last digit, and integers past 2^64 as doubles.
pub fn compact_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            ' ' | '\t' | '\n' | '\r' => {}
            '"' => {
                in_string = true;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// The bytes a save item stores. A stategate extension, the mirror of how reads carry non-JSON
/// values: with item metadata `contentEncoding: base64`, the item's value is a JSON string
/// holding the base64 (standard alphabet, padded) of the bytes to store, so a Dapr-shaped save
/// can store any bytes exactly. Without it the value is stored as given.
pub fn decode_value(value: &Bytes, metadata: &HashMap<String, String>) -> Result<Bytes, DaprError> {
    if !check_encoding(metadata)? {
        return Ok(value.clone());
    }
    let text: String = serde_json::from_slice(value).map_err(|_| {
        DaprError::Malformed(format!(
            "metadata '{ENCODING_METADATA}' is base64 but the value is not a JSON string"
        ))
    })?;
    base64::engine::general_purpose::STANDARD
        .decode(text.as_bytes())
        .map(Bytes::from)
        .map_err(|e| {
            DaprError::Malformed(format!(
                "metadata '{ENCODING_METADATA}' is base64 but the value is not valid base64: {e}"
            ))
        })
}

/// Whether metadata asks for base64 values (`contentEncoding: base64`, any case); any other
/// encoding is refused.
fn check_encoding(metadata: &HashMap<String, String>) -> Result<bool, DaprError> {
    match metadata.get(ENCODING_METADATA) {
        None => Ok(false),
        Some(encoding) if encoding.eq_ignore_ascii_case("base64") => Ok(true),
        Some(encoding) => Err(DaprError::Malformed(format!(
            "unsupported metadata '{ENCODING_METADATA}' {encoding:?} (only base64)"
        ))),
    }
}

/// Checks request-level metadata (a transaction's, the `metadata.<name>` query parameters) on
/// its own: items check it when they take it, yet a request with no item takes it nowhere,
/// and malformed input is refused whether or not anything would use it.
pub fn check_request_metadata(metadata: &HashMap<String, String>) -> Result<(), DaprError> {
    crate::WriteMeta::parse(metadata)?;
    check_encoding(metadata).map(|_| ())
}

/// A value placed inside a JSON document (bulk get, query, events): JSON values as their stored
/// text (never re-parsed, so numbers keep every digit); anything else as a base64 string,
/// flagged by item metadata `contentEncoding: base64`.
pub fn value_to_json(value: &[u8]) -> (Box<RawValue>, Option<(&'static str, &'static str)>) {
    let json = std::str::from_utf8(value)
        .ok()
        .and_then(|text| serde_json::from_str::<Box<RawValue>>(text).ok());
    match json {
        Some(raw) => (raw, None),
        None => (base64_json(value), Some((ENCODING_METADATA, "base64"))),
    }
}

/// Bytes as a JSON string of their base64.
pub fn base64_json(value: &[u8]) -> Box<RawValue> {
    let text = format!("\"{}\"", base64::engine::general_purpose::STANDARD.encode(value));
    // Base64 has no character that needs escaping in a JSON string.
    RawValue::from_string(text).unwrap_or_else(|_| Box::<RawValue>::default())
}
