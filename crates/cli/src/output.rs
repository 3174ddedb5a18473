//! What the client prints: for people (text, escaped where it is not printable), `--json` (one
//! object per line, documented in docs/cli.md) or `--raw` (exact bytes).
//!
//! Rendering is pure (it returns the bytes and notes to print) so it is unit-tested here; only
//! [`Output::print`] does I/O.

use std::io::Write as _;

use base64::Engine as _;
use serde_json::Value;

use super::{CliError, DelOutcome, Event, Exit, Found, SetOutcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
    Raw,
}

/// What one result prints: bytes for stdout, and lines for stderr.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Printed {
    pub stdout: Vec<u8>,
    pub stderr: Vec<String>,
}

impl Printed {
    fn out(stdout: Vec<u8>) -> Printed {
        Printed {
            stdout,
            stderr: Vec::new(),
        }
    }

    fn note(mut self, line: String) -> Printed {
        self.stderr.push(line);
        self
    }

    fn join(mut self, more: Printed) -> Printed {
        self.stdout.extend(more.stdout);
        self.stderr.extend(more.stderr);
        self
    }
}

/// Bytes for people: UTF-8 text as it is, except that `\`, control characters and bytes that
/// are not UTF-8 are escaped (`\\`, `\n`, `\x00`), so that one item stays on one line.
pub fn escape(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => s.push_str("\\\\"),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\t' => s.push_str("\\t"),
                c if c.is_ascii_control() => s.push_str(&format!("\\x{:02x}", c as u32)),
                c if c.is_control() => s.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => s.push(c),
            }
        }
        for b in chunk.invalid() {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s
}

/// A value for people: UTF-8 text unchanged (it may span lines), anything else escaped.
fn text_or_escaped(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => escape(bytes),
    }
}

/// One JSON object, fields in the given order, as one line.
fn json_line(fields: Vec<(String, Value)>) -> Vec<u8> {
    let mut line = String::from("{");
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        line.push_str(&Value::String(name.clone()).to_string());
        line.push(':');
        line.push_str(&value.to_string());
    }
    line.push_str("}\n");
    line.into_bytes()
}

/// A bytes field: a string when UTF-8; otherwise base64, with `<name>_base64: true` beside it.
fn bytes_field(fields: &mut Vec<(String, Value)>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => fields.push((name.to_owned(), Value::from(s))),
        Err(_) => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
            fields.push((name.to_owned(), Value::from(b64)));
            fields.push((format!("{name}_base64"), Value::Bool(true)));
        }
    }
}

fn field(name: &str, value: impl Into<Value>) -> (String, Value) {
    (name.to_owned(), value.into())
}

fn key_fields(key: &[u8]) -> Vec<(String, Value)> {
    let mut f = Vec::with_capacity(6);
    bytes_field(&mut f, "key", key);
    f
}

/// A key for people on one line: escaped, or exact with `--raw`.
fn key_text(format: Format, key: &[u8]) -> Vec<u8> {
    match format {
        Format::Raw => key.to_vec(),
        Format::Human | Format::Json => escape(key).into_bytes(),
    }
}

fn version_note(verbose: bool, version: Option<&str>) -> Option<String> {
    match (verbose, version) {
        (true, Some(v)) => Some(format!("version {v}")),
        _ => None,
    }
}

/// `get`: the value (`--raw`: exactly its bytes, no newline) or, when missing, nothing.
pub fn get(format: Format, verbose: bool, key: &[u8], found: Option<&Found>) -> Printed {
    let Some(found) = found else {
        return match format {
            Format::Json => {
                let mut f = key_fields(key);
                f.push(field("found", false));
                Printed::out(json_line(f))
            }
            Format::Human | Format::Raw => Printed::default().note(format!("not found: {}", escape(key))),
        };
    };
    let printed = match format {
        Format::Json => {
            let mut f = key_fields(key);
            f.push(field("found", true));
            bytes_field(&mut f, "value", &found.value);
            if let Some(v) = &found.version {
                f.push(field("version", v.as_str()));
            }
            Printed::out(json_line(f))
        }
        Format::Raw => Printed::out(found.value.to_vec()),
        Format::Human => {
            let mut text = text_or_escaped(&found.value).into_bytes();
            text.push(b'\n');
            Printed::out(text)
        }
    };
    match version_note(verbose, found.version.as_deref()) {
        Some(n) => printed.note(n),
        None => printed,
    }
}

/// `mget`: one line per key in the order given. People: `KEY<TAB>VALUE` (an absent key: a note
/// on stderr only); JSON: `get`'s line for each key, absent ones included.
pub fn mget(format: Format, verbose: bool, keys: &[bytes::Bytes], found: &[Option<Found>]) -> Printed {
    let mut printed = Printed::default();
    for (key, found) in keys.iter().zip(found) {
        let line = match (format, found) {
            (Format::Json, _) => get(format, verbose, key, found.as_ref()),
            (Format::Human | Format::Raw, None) => Printed::default().note(format!("not found: {}", escape(key))),
            (Format::Human | Format::Raw, Some(f)) => {
                let with = Printed::out(format!("{}\t{}\n", escape(key), text_or_escaped(&f.value)).into_bytes());
                match version_note(verbose, f.version.as_deref()) {
                    Some(n) => with.note(n),
                    None => with,
                }
            }
        };
        printed = printed.join(line);
    }
    printed
}

/// `set`: `OK`, or (condition not met) nothing and a note.
pub fn set(format: Format, verbose: bool, key: &[u8], outcome: &SetOutcome) -> Printed {
    match (format, outcome) {
        (Format::Json, SetOutcome::Applied { version }) => {
            let mut f = key_fields(key);
            f.push(field("applied", true));
            if let Some(v) = version {
                f.push(field("version", v.as_str()));
            }
            Printed::out(json_line(f))
        }
        (Format::Json, SetOutcome::NotApplied) => {
            let mut f = key_fields(key);
            f.push(field("applied", false));
            Printed::out(json_line(f))
        }
        (_, SetOutcome::Applied { version }) => {
            let p = Printed::out(b"OK\n".to_vec());
            match version_note(verbose, version.as_deref()) {
                Some(n) => p.note(n),
                None => p,
            }
        }
        (_, SetOutcome::NotApplied) => {
            Printed::default().note(format!("not set: {} (the condition was not met)", escape(key)))
        }
    }
}

/// `del` and `vdel`: `deleted`, or nothing and a note saying why not.
pub fn del(format: Format, key: &[u8], outcome: DelOutcome) -> Printed {
    match format {
        Format::Json => {
            let mut f = key_fields(key);
            f.push(field("deleted", outcome == DelOutcome::Deleted));
            match outcome {
                DelOutcome::Deleted => {}
                DelOutcome::Absent => f.push(field("reason", "absent")),
                DelOutcome::Mismatch => f.push(field("reason", "value_mismatch")),
            }
            Printed::out(json_line(f))
        }
        Format::Human | Format::Raw => match outcome {
            DelOutcome::Deleted => Printed::out(b"deleted\n".to_vec()),
            DelOutcome::Absent => Printed::default().note(format!("not found: {}", escape(key))),
            DelOutcome::Mismatch => {
                Printed::default().note(format!("not deleted: {} holds another value", escape(key)))
            }
        },
    }
}

/// `scan`: one key per line.
pub fn scan_keys(format: Format, keys: &[bytes::Bytes]) -> Printed {
    let mut out = Vec::new();
    for k in keys {
        match format {
            Format::Json => out.extend(json_line(key_fields(k))),
            Format::Human | Format::Raw => {
                out.extend(key_text(format, k));
                out.push(b'\n');
            }
        }
    }
    Printed::out(out)
}

/// `watch`: one change per line: `set KEY VALUE`, `delete KEY`, `expire KEY`.
pub fn event(format: Format, verbose: bool, event: &Event) -> Printed {
    let (kind, key, value, version) = match event {
        Event::Set { key, value, version } => ("set", key, Some(value), version),
        Event::Delete { key, version } => ("delete", key, None, version),
        Event::Expire { key, version } => ("expire", key, None, version),
        Event::Overflow => {
            return match format {
                Format::Json => Printed::out(json_line(vec![field("event", "overflow")])),
                Format::Human | Format::Raw => {
                    Printed::default().note("the watch fell behind and was ended by the service".into())
                }
            };
        }
        Event::Reset => {
            return match format {
                Format::Json => Printed::out(json_line(vec![field("event", "reset")])),
                Format::Human | Format::Raw => Printed::out(b"reset\n".to_vec()),
            };
        }
        Event::Synced { version } => {
            return match format {
                Format::Json => {
                    let mut f = vec![field("event", "synced")];
                    if let Some(v) = version {
                        f.push(field("version", v.as_str()));
                    }
                    Printed::out(json_line(f))
                }
                Format::Human | Format::Raw => {
                    let p = Printed::out(b"synced\n".to_vec());
                    match version_note(verbose, version.as_deref()) {
                        Some(n) => p.note(n),
                        None => p,
                    }
                }
            };
        }
    };
    match format {
        Format::Json => {
            let mut f = vec![field("event", kind)];
            bytes_field(&mut f, "key", key);
            if let Some(v) = value {
                bytes_field(&mut f, "value", v);
            }
            f.push(field("version", version.as_str()));
            Printed::out(json_line(f))
        }
        Format::Human | Format::Raw => {
            let mut line = kind.as_bytes().to_vec();
            line.push(b' ');
            line.extend(key_text(format, key));
            if let Some(v) = value {
                line.push(b' ');
                match format {
                    Format::Raw => line.extend_from_slice(v),
                    _ => line.extend(escape(v).into_bytes()),
                }
            }
            line.push(b'\n');
            let p = Printed::out(line);
            match version_note(verbose, Some(version)) {
                Some(n) => p.note(n),
                None => p,
            }
        }
    }
}

/// `lock` without a command: the fencing token.
pub fn locked(format: Format, name: &[u8], holder: &[u8], token: &str) -> Printed {
    match format {
        Format::Json => {
            let mut f = Vec::new();
            bytes_field(&mut f, "name", name);
            bytes_field(&mut f, "holder", holder);
            f.push(field("fencing_token", token));
            Printed::out(json_line(f))
        }
        Format::Human | Format::Raw => Printed::out(format!("{token}\n").into_bytes()),
    }
}

/// `unlock`: `unlocked`, or a note saying why not.
pub fn unlocked(format: Format, name: &[u8], outcome: DelOutcome) -> Printed {
    match format {
        Format::Json => {
            let mut f = Vec::new();
            bytes_field(&mut f, "name", name);
            f.push(field("released", outcome == DelOutcome::Deleted));
            match outcome {
                DelOutcome::Deleted => {}
                DelOutcome::Absent => f.push(field("reason", "not_held")),
                DelOutcome::Mismatch => f.push(field("reason", "held_by_another")),
            }
            Printed::out(json_line(f))
        }
        Format::Human | Format::Raw => match outcome {
            DelOutcome::Deleted => Printed::out(b"unlocked\n".to_vec()),
            DelOutcome::Absent => Printed::default().note(format!("not locked: {}", escape(name))),
            DelOutcome::Mismatch => {
                Printed::default().note(format!("not unlocked: {} is held by another holder", escape(name)))
            }
        },
    }
}

/// Where results go.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub format: Format,
    pub verbose: bool,
}

impl Output {
    /// Writes and flushes (watch lines must show up as they happen). A reader that went away
    /// (`stategate scan | head`) ends the command quietly.
    pub fn print(&self, p: Printed) -> Result<(), CliError> {
        for line in &p.stderr {
            eprintln!("{line}");
        }
        if p.stdout.is_empty() {
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        match out.write_all(&p.stdout).and_then(|()| out.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::quiet(Exit::Done)),
            Err(e) => Err(CliError::new(
                Exit::Unavailable,
                format!("cannot write the output: {e}"),
            )),
        }
    }

    /// Progress for people, with `-v`.
    pub fn progress(&self, line: impl FnOnce() -> String) {
        if self.verbose {
            eprintln!("{}", line());
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn found(value: &[u8]) -> Found {
        Found {
            value: Bytes::copy_from_slice(value),
            version: Some("001700000000000:00001:n".into()),
        }
    }

    fn stdout(p: &Printed) -> &str {
        std::str::from_utf8(&p.stdout).unwrap()
    }

    #[test]
    fn escape_keeps_text_and_escapes_the_rest() {
        assert_eq!(escape(b"hello w\xc3\xb6rld"), "hello wörld");
        assert_eq!(escape(b"a\\b\n\r\t\x00\x7f"), "a\\\\b\\n\\r\\t\\x00\\x7f");
        assert_eq!(escape(b"\xff\xfeok"), "\\xff\\xfeok");
        assert_eq!(escape("\u{2028}".as_bytes()), "\u{2028}");
        assert_eq!(escape("\u{85}".as_bytes()), "\\u{85}");
    }

    #[test]
    fn get_in_every_format() {
        let f = found(b"v1");
        assert_eq!(stdout(&get(Format::Human, false, b"k", Some(&f))), "v1\n");
        assert_eq!(
            get(Format::Human, true, b"k", Some(&f)).stderr,
            ["version 001700000000000:00001:n"]
        );
        assert_eq!(
            get(Format::Raw, false, b"k", Some(&found(b"\x00\xff"))).stdout,
            b"\x00\xff"
        );
        assert_eq!(
            stdout(&get(Format::Human, false, b"k", Some(&found(b"\x00\xff")))),
            "\\x00\\xff\n"
        );
        assert_eq!(
            stdout(&get(Format::Json, false, b"k", Some(&f))),
            "{\"key\":\"k\",\"found\":true,\"value\":\"v1\",\"version\":\"001700000000000:00001:n\"}\n"
        );
        assert_eq!(
            stdout(&get(Format::Json, false, b"\xff", Some(&found(b"\x00\xff")))),
            "{\"key\":\"/w==\",\"key_base64\":true,\"found\":true,\"value\":\"AP8=\",\"value_base64\":true,\
             \"version\":\"001700000000000:00001:n\"}\n"
        );
        let miss = get(Format::Human, false, b"k", None);
        assert!(miss.stdout.is_empty());
        assert_eq!(miss.stderr, ["not found: k"]);
        assert_eq!(
            stdout(&get(Format::Json, false, b"k", None)),
            "{\"key\":\"k\",\"found\":false}\n"
        );
    }

    #[test]
    fn set_del_and_unlock_outcomes() {
        let applied = SetOutcome::Applied {
            version: Some("1:2:n".into()),
        };
        assert_eq!(stdout(&set(Format::Human, false, b"k", &applied)), "OK\n");
        assert_eq!(
            stdout(&set(Format::Json, false, b"k", &applied)),
            "{\"key\":\"k\",\"applied\":true,\"version\":\"1:2:n\"}\n"
        );
        let not = set(Format::Human, false, b"k", &SetOutcome::NotApplied);
        assert!(not.stdout.is_empty() && not.stderr.len() == 1);
        assert_eq!(
            stdout(&set(Format::Json, false, b"k", &SetOutcome::NotApplied)),
            "{\"key\":\"k\",\"applied\":false}\n"
        );
        assert_eq!(stdout(&del(Format::Human, b"k", DelOutcome::Deleted)), "deleted\n");
        assert_eq!(
            stdout(&del(Format::Json, b"k", DelOutcome::Mismatch)),
            "{\"key\":\"k\",\"deleted\":false,\"reason\":\"value_mismatch\"}\n"
        );
        assert_eq!(
            stdout(&del(Format::Json, b"k", DelOutcome::Absent)),
            "{\"key\":\"k\",\"deleted\":false,\"reason\":\"absent\"}\n"
        );
        assert_eq!(
            stdout(&unlocked(Format::Json, b"n", DelOutcome::Mismatch)),
            "{\"name\":\"n\",\"released\":false,\"reason\":\"held_by_another\"}\n"
        );
        assert_eq!(
            stdout(&locked(Format::Json, b"n", b"me", "1:0:n")),
            "{\"name\":\"n\",\"holder\":\"me\",\"fencing_token\":\"1:0:n\"}\n"
        );
    }

    #[test]
    fn scan_and_watch_lines() {
        let keys = [Bytes::from_static(b"a"), Bytes::from_static(b"b\nc")];
        assert_eq!(stdout(&scan_keys(Format::Human, &keys)), "a\nb\\nc\n");
        assert_eq!(scan_keys(Format::Raw, &keys).stdout, b"a\nb\nc\n");
        assert_eq!(
            stdout(&scan_keys(Format::Json, &keys)),
            "{\"key\":\"a\"}\n{\"key\":\"b\\nc\"}\n"
        );
        let set = Event::Set {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"two\nlines"),
            version: "1:0:n".into(),
        };
        assert_eq!(stdout(&event(Format::Human, false, &set)), "set k two\\nlines\n");
        assert_eq!(
            stdout(&event(Format::Json, false, &set)),
            "{\"event\":\"set\",\"key\":\"k\",\"value\":\"two\\nlines\",\"version\":\"1:0:n\"}\n"
        );
        let exp = Event::Expire {
            key: Bytes::from_static(b"k"),
            version: "2:0:n".into(),
        };
        assert_eq!(stdout(&event(Format::Human, false, &exp)), "expire k\n");
        assert_eq!(
            stdout(&event(Format::Json, false, &exp)),
            "{\"event\":\"expire\",\"key\":\"k\",\"version\":\"2:0:n\"}\n"
        );
        assert_eq!(
            stdout(&event(Format::Json, false, &Event::Overflow)),
            "{\"event\":\"overflow\"}\n"
        );
    }
}
