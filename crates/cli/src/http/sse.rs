//! Server-sent change events of the HTTP door, as `watch` events.

use base64::Engine as _;
use bytes::Bytes;
use reqwest::Response;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::{CliError, Event, MAX_MESSAGE_BYTES};

/// Longest server-sent event accepted (a value up to the message limit, in base64).
const MAX_EVENT_BYTES: usize = MAX_MESSAGE_BYTES * 4 / 3 + 4096;

pub async fn read_events(mut resp: Response, tx: mpsc::Sender<Result<Event, CliError>>) {
    let mut parser = SseParser::default();
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => {
                let _ = tx
                    .send(Err(CliError::unavailable("the service closed the event stream")))
                    .await;
                return;
            }
            Err(e) => {
                let _ = tx
                    .send(Err(CliError::unavailable(format!("the event stream failed: {e}"))))
                    .await;
                return;
            }
        };
        let messages = match parser.feed(&chunk) {
            Ok(m) => m,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        for (name, data) in messages {
            let event = match to_event(&name, &data) {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                Err(e) if name == "failed" => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                Err(e) => {
                    eprintln!("stategate: ignored an event: {}", e.message);
                    continue;
                }
            };
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
    }
}

/// One server-sent event as a change (`None`: not one we know, skipped).
fn to_event(name: &str, data: &str) -> Result<Option<Event>, CliError> {
    let bad = |why: &str| CliError::unavailable(format!("malformed {name} event: {why}"));
    match name {
        "overflow" => return Ok(Some(Event::Overflow)),
        "reset" => return Ok(Some(Event::Reset)),
        "synced" => {
            let v: Value = serde_json::from_str(data).map_err(|e| bad(&e.to_string()))?;
            let version = v["since"].as_str().map(str::to_owned);
            return Ok(Some(Event::Synced { version }));
        }
        "failed" => {
            let v: Value = serde_json::from_str(data).unwrap_or_default();
            let message = v["message"].as_str().unwrap_or("the service failed");
            return Err(CliError::unavailable(format!("the watch failed: {message}")));
        }
        "set" | "delete" => {}
        _ => return Ok(None),
    }
    let v: Value = serde_json::from_str(data).map_err(|e| bad(&e.to_string()))?;
    let key = Bytes::copy_from_slice(v["key"].as_str().ok_or_else(|| bad("no key"))?.as_bytes());
    let version = v["etag"].as_str().ok_or_else(|| bad("no etag"))?.to_owned();
    if name == "delete" {
        return Ok(Some(if v["reason"] == "expired" {
            Event::Expire { key, version }
        } else {
            Event::Delete { key, version }
        }));
    }
    let value = if v["metadata"]["contentEncoding"] == "base64" {
        let s = v["data"].as_str().ok_or_else(|| bad("base64 data is not a string"))?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| bad(&e.to_string()))?
    } else {
        // A service without the base64 option: the JSON as it came (not byte-exact).
        serde_json::to_vec(&v["data"]).map_err(|e| bad(&e.to_string()))?
    };
    Ok(Some(Event::Set {
        key,
        value: Bytes::from(value),
        version,
    }))
}

/// Server-sent events: lines `field: value`, an event per blank line, `:` comments ignored.
#[derive(Debug, Default)]
struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: Option<String>,
}

impl SseParser {
    /// Consumes a chunk; returns the completed events as (name, data).
    fn feed(&mut self, chunk: &[u8]) -> Result<Vec<(String, String)>, CliError> {
        self.buf.extend_from_slice(chunk);
        let mut done = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let line = &self.buf[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    let name = std::mem::take(&mut self.event);
                    done.push((if name.is_empty() { "message".into() } else { name }, data));
                }
                self.event.clear();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event = value.to_owned(),
                "data" => match &mut self.data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                },
                _ => {}
            }
        }
        self.buf.drain(..start);
        let pending = self.buf.len() + self.data.as_ref().map_or(0, String::len);
        if pending > MAX_EVENT_BYTES {
            return Err(CliError::unavailable(format!(
                "an event is longer than {MAX_EVENT_BYTES} bytes"
            )));
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_across_chunks() {
        let mut p = SseParser::default();
        let stream = b": keep-alive\n\nevent: set\nid: 1:0:n\ndata: {\"key\":\"k\",\"data\":\"AP8=\",\"etag\":\"1:0:n\",\
                       \"metadata\":{\"contentEncoding\":\"base64\"}}\n\nevent: delete\r\ndata: {\"key\":\"k\",\"etag\":\"2:0:n\",\
                       \"reason\":\"expired\"}\r\n\r\nevent: overflow\ndata: {}\n\n";
        let mut all = Vec::new();
        for chunk in stream.chunks(7) {
            all.extend(p.feed(chunk).unwrap());
        }
        let names: Vec<_> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["set", "delete", "overflow"]);
        assert_eq!(
            to_event(&all[0].0, &all[0].1).unwrap(),
            Some(Event::Set {
                key: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"\x00\xff"),
                version: "1:0:n".into()
            })
        );
        assert!(matches!(
            to_event(&all[1].0, &all[1].1).unwrap(),
            Some(Event::Expire { .. })
        ));
        assert_eq!(to_event(&all[2].0, &all[2].1).unwrap(), Some(Event::Overflow));
        assert!(to_event("set", "{not json").is_err());
        assert_eq!(to_event("ping", "{}").unwrap(), None);
    }
}
