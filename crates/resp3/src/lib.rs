//! The RESP3-style payload codec of the state store protocol, without I/O.
//!
//! Requests are arrays of bulk strings; replies are the handful of frame kinds in [`Frame`].
//! [`decode_request`] is what the service runs on untrusted bytes; [`decode`] reads any frame
//! (clients, tests and the benchmark use it). Neither panics on any input.

pub mod envelope;

use bytes::{BufMut, Bytes, BytesMut};

/// One RESP frame, as far as the state store protocol uses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `+OK\r\n`
    Simple(String),
    /// `-ERR message\r\n` (the text after the `-`)
    Error(String),
    /// `:1\r\n`
    Integer(i64),
    /// `$3\r\nabc\r\n`
    Bulk(Bytes),
    /// `$-1\r\n`
    Null,
    /// `*2\r\n...`
    Array(Vec<Frame>),
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the payload ends inside a frame")]
    Incomplete,
    #[error("unexpected byte {0:#04x} where a frame type was expected")]
    UnknownType(u8),
    #[error("a length or integer is not a decimal number")]
    BadNumber,
    #[error("a line does not end with CRLF")]
    MissingCrlf,
    #[error("bytes follow the end of the frame")]
    TrailingBytes,
    #[error("a request must be an array of bulk strings")]
    NotACommand,
    #[error("the frame nests or counts more than the limit allows")]
    TooLarge,
    #[error("a simple string or error is not UTF-8")]
    NotUtf8,
}

/// Upper bound on array elements accepted while decoding (protects against `*999999999`).
pub const MAX_ELEMENTS: usize = 1 << 20;
const MAX_DEPTH: usize = 8;

/// Decodes a request payload: exactly one array of bulk strings, nothing after it.
/// The returned arguments share the input's memory.
pub fn decode_request(payload: &Bytes) -> Result<Vec<Bytes>, DecodeError> {
    let mut cur = Cursor { buf: payload, pos: 0 };
    if cur.byte()? != b'*' {
        return Err(DecodeError::NotACommand);
    }
    let n = cur.count()?.ok_or(DecodeError::NotACommand)?;
    if n > MAX_ELEMENTS {
        return Err(DecodeError::TooLarge);
    }
    let mut args = Vec::with_capacity(n.min(16));
    for _ in 0..n {
        if cur.byte()? != b'$' {
            return Err(DecodeError::NotACommand);
        }
        let len = cur.count()?.ok_or(DecodeError::NotACommand)?;
        args.push(cur.take(len)?);
    }
    cur.finish()?;
    Ok(args)
}

/// Decodes exactly one frame with nothing after it.
pub fn decode(payload: &Bytes) -> Result<Frame, DecodeError> {
    let mut cur = Cursor { buf: payload, pos: 0 };
    let frame = cur.frame(0)?;
    cur.finish()?;
    Ok(frame)
}

struct Cursor<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Incomplete)?;
        self.pos += 1;
        Ok(b)
    }

    /// The bytes up to the next CRLF, which is consumed.
    fn line(&mut self) -> Result<&[u8], DecodeError> {
        let rest = &self.buf[self.pos..];
        let end = rest.iter().position(|&b| b == b'\r').ok_or(DecodeError::Incomplete)?;
        match rest.get(end + 1) {
            Some(b'\n') => {}
            Some(_) => return Err(DecodeError::MissingCrlf),
            None => return Err(DecodeError::Incomplete),
        }
        self.pos += end + 2;
        Ok(&rest[..end])
    }

    fn integer(&mut self) -> Result<i64, DecodeError> {
        let line = self.line()?;
        let (neg, digits) = match line.split_first() {
            Some((b'-', d)) => (true, d),
            _ => (false, line),
        };
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return Err(DecodeError::BadNumber);
        }
        // Accumulate towards the sign, so that `i64::MIN` (which `encode` emits) decodes too.
        let mut v: i64 = 0;
        for d in digits {
            let d = i64::from(d - b'0');
            v = v
                .checked_mul(10)
                .and_then(|v| if neg { v.checked_sub(d) } else { v.checked_add(d) })
                .ok_or(DecodeError::BadNumber)?;
        }
        Ok(v)
    }

    /// A length: `None` for `-1`, an error for other negatives.
    fn count(&mut self) -> Result<Option<usize>, DecodeError> {
        match self.integer()? {
            -1 => Ok(None),
            n if n < 0 => Err(DecodeError::BadNumber),
            n => Ok(Some(n as usize)),
        }
    }

    fn take(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        let end = self.pos.checked_add(len).ok_or(DecodeError::Incomplete)?;
        if end.checked_add(2).is_none_or(|e| e > self.buf.len()) {
            return Err(DecodeError::Incomplete);
        }
        if &self.buf[end..end + 2] != b"\r\n" {
            return Err(DecodeError::MissingCrlf);
        }
        let out = self.buf.slice(self.pos..end);
        self.pos = end + 2;
        Ok(out)
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        let line = self.line()?;
        String::from_utf8(line.to_vec()).map_err(|_| DecodeError::NotUtf8)
    }

    fn frame(&mut self, depth: usize) -> Result<Frame, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooLarge);
        }
        match self.byte()? {
            b'+' => Ok(Frame::Simple(self.text()?)),
            b'-' => Ok(Frame::Error(self.text()?)),
            b':' => Ok(Frame::Integer(self.integer()?)),
            b'$' => match self.count()? {
                None => Ok(Frame::Null),
                Some(len) => Ok(Frame::Bulk(self.take(len)?)),
            },
            b'*' => match self.count()? {
                None => Ok(Frame::Null),
                Some(n) if n > MAX_ELEMENTS => Err(DecodeError::TooLarge),
                Some(n) => {
                    let mut items = Vec::with_capacity(n.min(64));
                    for _ in 0..n {
                        items.push(self.frame(depth + 1)?);
                    }
                    Ok(Frame::Array(items))
                }
            },
            b'_' => {
                if !self.line()?.is_empty() {
                    return Err(DecodeError::MissingCrlf);
                }
                Ok(Frame::Null)
            }
            other => Err(DecodeError::UnknownType(other)),
        }
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}

impl Frame {
    /// The frame's exact bytes.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out.freeze()
    }

    pub fn encode_into(&self, out: &mut BytesMut) {
        match self {
            Frame::Simple(s) => line(out, b'+', s.as_bytes()),
            Frame::Error(s) => line(out, b'-', s.as_bytes()),
            Frame::Integer(i) => line(out, b':', itoa(*i).as_bytes()),
            Frame::Bulk(b) => {
                line(out, b'$', itoa(b.len() as i64).as_bytes());
                out.put_slice(b);
                out.put_slice(b"\r\n");
            }
            Frame::Null => out.put_slice(b"$-1\r\n"),
            Frame::Array(items) => {
                line(out, b'*', itoa(items.len() as i64).as_bytes());
                for item in items {
                    item.encode_into(out);
                }
            }
        }
    }

    fn encoded_len(&self) -> usize {
        match self {
            Frame::Simple(s) | Frame::Error(s) => s.len() + 3,
            Frame::Integer(_) => 24,
            Frame::Bulk(b) => b.len() + 16,
            Frame::Null => 5,
            Frame::Array(items) => 16 + items.iter().map(Frame::encoded_len).sum::<usize>(),
        }
    }
}

fn line(out: &mut BytesMut, tag: u8, body: &[u8]) {
    out.put_u8(tag);
    out.put_slice(body);
    out.put_slice(b"\r\n");
}

fn itoa(i: i64) -> String {
    i.to_string()
}

/// Encodes a request: an array of bulk strings (clients, tests and the benchmark use it).
pub fn encode_request<I, A>(args: I) -> Bytes
where
    I: IntoIterator<Item = A>,
    A: AsRef<[u8]>,
{
    let args: Vec<A> = args.into_iter().collect();
    let mut out = BytesMut::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    line(&mut out, b'*', itoa(args.len() as i64).as_bytes());
    for a in &args {
        let a = a.as_ref();
        line(&mut out, b'$', itoa(a.len() as i64).as_bytes());
        out.put_slice(a);
        out.put_slice(b"\r\n");
    }
    out.freeze()
}

#[cfg(test)]
mod tests;
