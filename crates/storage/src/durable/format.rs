//! On-disk formats of the durable backend: file headers, CRC-checked frames, and the records
//! inside them, sealed when the store is encrypted. Pure: bytes in, bytes out, no I/O. Decoding
//! never panics on any input.
//!
//! ```text
//! file    = header frame*
//! header  = magic[8] seq:u64                          plain (16 bytes)
//!         | magic[8] seq:u64 nonce[24] tag[16]        encrypted (56 bytes): the tag seals nothing
//!                                                     with magic+seq as associated data, so it
//!                                                     proves the key before any record is read
//! magic   = "SGLOG01\n" | "SGSNP01\n"                 plain log / snapshot
//!         | "SGLOG02E" | "SGSNP02E"                   encrypted
//!         | "SGLOG01E" | "SGSNP01E"                   encrypted by earlier releases (read only by
//!                                                     `rekey` and `export --data-dir`)
//! frame   = len:u32 crc:u32 payload   (crc32 of payload; len = payload length)
//! payload = record                                    plain
//!         | nonce[24] seal(record) tag[16]            encrypted (XChaCha20-Poly1305, crypt.rs),
//!                                                     associated data = the file's header (56
//!                                                     bytes) and the frame's offset:u64 in the
//!                                                     file (01E: none)
//! record  = kind:u8 ...
//!   kind 1 (log: one swap_many call)    wall_ms:u64 count:u32 entry{count}
//!   kind 2 (snapshot: a chunk of keys)  count:u32 entry{count}    (puts only)
//!   kind 3 (snapshot: the end)          keys:u64 has_max:u8 [hlc] wall_ms:u64
//! wall_ms = the wall clock when the record was written (a floor for the clock after a restart)
//! entry   = key_len:u32 key tag:u8        tag 0 = delete; tag 1 = put, followed by:
//!           value_len:u32 value hlc(version) has_fencing:u8 [hlc] has_expiry:u8 [deadline_ms:u64]
//! hlc     = ms:u64 counter:u32 node_len:u32 node(utf-8)
//! ```
//! Integers are little-endian. The CRC stays outside the seal: a torn write is found by its
//! length and CRC as in a plain log, before any decryption, so it is cut as a torn tail; a
//! frame whose CRC holds but whose seal does not open was tampered with (or the key is wrong).
//!
//! Why the header and the offset: a sealed record proves only that the key sealed it, not where.
//! The header names the file (log or snapshot, format, sequence number) and its random nonce
//! and tag make it unique to this one file, so with the offset a sealed record opens only where
//! it was written: one moved within its file, copied into another (an older segment or
//! snapshot kept aside), or played again at the end is refused as tampering. What this cannot
//! tell is a file cut short at a record boundary, or replaced whole by an older copy of itself.
//! The log's frames are therefore sealed by the commit thread, the one writer that knows which
//! segment and offset a frame lands at (`writer.rs`); writers queue them plain.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::crypt::{Cipher, NONCE_LEN, TAG_LEN};
use crate::hlc::Hlc;
use crate::{Record, Swap};

const LOG_MAGIC: &[u8; 8] = b"SGLOG01\n";
const SNAP_MAGIC: &[u8; 8] = b"SGSNP01\n";
const LOG_MAGIC_SEALED: &[u8; 8] = b"SGLOG02E";
const SNAP_MAGIC_SEALED: &[u8; 8] = b"SGSNP02E";
/// The format version and mode of encrypted files before records were bound to their place.
const SEALED_UNBOUND: &[u8; 3] = b"01E";
pub const PLAIN_HEADER_LEN: usize = 16;
pub const SEALED_HEADER_LEN: usize = PLAIN_HEADER_LEN + NONCE_LEN + TAG_LEN;
pub const FRAME_HEADER_LEN: usize = 8;
/// Largest payload accepted (a guard against a corrupt length; values are at most a few MiB).
pub const MAX_PAYLOAD: usize = 1 << 30;
/// What sealing adds to a record.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;

pub const KIND_BATCH: u8 = 1;
pub const KIND_SNAP_CHUNK: u8 = 2;
pub const KIND_SNAP_END: u8 = 3;

const TAG_DELETE: u8 = 0;
const TAG_PUT: u8 = 1;

/// Why some bytes are not a valid frame or payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("incomplete frame")]
    Incomplete,
    #[error("frame length {0} is out of range")]
    BadLength(u64),
    #[error("checksum mismatch")]
    Checksum,
    #[error("malformed payload: {0}")]
    Malformed(&'static str),
    #[error("the record does not authenticate under the key (tampered with, or sealed with another key)")]
    Unauthentic,
}

/// Which kind of file a header starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Log,
    Snapshot,
}

/// Why a header is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Shorter than a header.
    Incomplete,
    /// Not a header of this file type (or not ours at all).
    NotOurs,
    /// An encrypted file, and no key was given.
    Encrypted,
    /// A plain file, and a key was given.
    NotEncrypted,
    /// Encrypted under another key.
    WrongKey,
}

/// The file a frame belongs to, for sealing and opening frames in place: its header (type,
/// format, sequence number; sealed, also a random nonce and tag unique to this file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileId {
    header: Vec<u8>,
    /// Encrypted by an earlier release: frames sealed without their place.
    unbound: bool,
}

/// The associated data of a sealed frame: its file's header, then its offset.
type Place = [u8; SEALED_HEADER_LEN + 8];

impl FileId {
    /// Whether the file's sealed frames are not bound to their place (format 01E).
    pub fn is_unbound(&self) -> bool {
        self.unbound
    }

    /// The associated data of a frame at `offset`; `None` (no associated data) only for the
    /// earlier format. A sealed header is always 56 bytes; anything shorter is zero-padded, so
    /// a frame is never sealed with less than its offset.
    fn place(&self, offset: u64) -> Option<Place> {
        if self.unbound {
            return None;
        }
        let mut aad = [0u8; SEALED_HEADER_LEN + 8];
        let n = self.header.len().min(SEALED_HEADER_LEN);
        aad[..n].copy_from_slice(&self.header[..n]);
        aad[SEALED_HEADER_LEN..].copy_from_slice(&offset.to_le_bytes());
        Some(aad)
    }
}

/// Where the next frame of a file being written goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    pub file: FileId,
    pub offset: u64,
}

/// How records are framed: plain, or sealed under a key.
#[derive(Debug)]
pub struct Codec {
    cipher: Option<Cipher>,
}

impl Codec {
    pub fn plain() -> Codec {
        Codec { cipher: None }
    }

    pub fn sealed(cipher: Cipher) -> Codec {
        Codec { cipher: Some(cipher) }
    }

    pub fn cipher(&self) -> Option<&Cipher> {
        self.cipher.as_ref()
    }

    pub fn header_len(&self) -> usize {
        match self.cipher {
            Some(_) => SEALED_HEADER_LEN,
            None => PLAIN_HEADER_LEN,
        }
    }

    fn magic(&self, file: FileType) -> &'static [u8; 8] {
        match (file, self.cipher.is_some()) {
            (FileType::Log, false) => LOG_MAGIC,
            (FileType::Snapshot, false) => SNAP_MAGIC,
            (FileType::Log, true) => LOG_MAGIC_SEALED,
            (FileType::Snapshot, true) => SNAP_MAGIC_SEALED,
        }
    }

    pub fn header(&self, file: FileType, seq: u64) -> Vec<u8> {
        let mut h = Vec::with_capacity(self.header_len());
        h.extend_from_slice(self.magic(file));
        h.extend_from_slice(&seq.to_le_bytes());
        if let Some(c) = &self.cipher {
            let aad = h.clone();
            c.seal_tail(&mut h, PLAIN_HEADER_LEN, &aad);
        }
        h
    }

    /// A new file's header, and where its first frame goes.
    pub fn start(&self, file: FileType, seq: u64) -> (Vec<u8>, Cursor) {
        let header = self.header(file, seq);
        let cursor = Cursor {
            file: self.file_id(&header),
            offset: header.len() as u64,
        };
        (header, cursor)
    }

    /// The identity of the file that `header` (checked already) starts.
    pub fn file_id(&self, header: &[u8]) -> FileId {
        let header = &header[..self.header_len().min(header.len())];
        FileId {
            header: header.to_vec(),
            unbound: self.cipher.is_some() && header.get(5..8) == Some(SEALED_UNBOUND),
        }
    }

    /// The sequence number in a header of this file type, once the header proves it was
    /// written in this codec's mode (and, sealed, under this key). Sealed headers of the
    /// earlier, unbound format are accepted here: [`FileId::is_unbound`] tells them.
    pub fn check_header(&self, file: FileType, bytes: &[u8]) -> Result<u64, HeaderError> {
        let magic = bytes.get(..8).ok_or(HeaderError::Incomplete)?;
        let plain = match file {
            FileType::Log => LOG_MAGIC,
            FileType::Snapshot => SNAP_MAGIC,
        };
        let sealed = match (&magic[5..], magic[..5] == plain[..5]) {
            (b"01\n", true) => false,
            (b"01E" | b"02E", true) => true,
            _ => return Err(HeaderError::NotOurs),
        };
        let seq_bytes: [u8; 8] = bytes
            .get(8..PLAIN_HEADER_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(HeaderError::Incomplete)?;
        let seq = u64::from_le_bytes(seq_bytes);
        match (&self.cipher, sealed) {
            (None, false) => Ok(seq),
            (None, true) => Err(HeaderError::Encrypted),
            (Some(_), false) => Err(HeaderError::NotEncrypted),
            (Some(c), true) => {
                let seal = bytes
                    .get(PLAIN_HEADER_LEN..SEALED_HEADER_LEN)
                    .ok_or(HeaderError::Incomplete)?;
                c.open(seal, &bytes[..PLAIN_HEADER_LEN])
                    .map_err(|_| HeaderError::WrongKey)?;
                Ok(seq)
            }
        }
    }

    /// Appends one frame at `at` around the record that `fill` writes (sealed for that place,
    /// when encrypted), and moves `at` past it.
    pub fn frame(&self, out: &mut Vec<u8>, at: &mut Cursor, fill: impl FnOnce(&mut Vec<u8>)) {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
        fill(out);
        if let Some(c) = &self.cipher {
            let place = at.file.place(at.offset);
            c.seal_tail(
                out,
                start + FRAME_HEADER_LEN,
                place.as_ref().map_or(&[][..], |p| &p[..]),
            );
        }
        finish_frame(out, start);
        at.offset += (out.len() - start) as u64;
    }

    /// Appends the plain frames of `plain` (as [`encode_batch`] makes them) at `at`, sealed
    /// for their places when encrypted, and moves `at` past them.
    pub fn seal_frames(&self, plain: &[u8], at: &mut Cursor, out: &mut Vec<u8>) {
        if self.cipher.is_none() {
            out.extend_from_slice(plain);
            at.offset += plain.len() as u64;
            return;
        }
        let mut pos = 0;
        // Made in this process a moment ago: every frame checks out.
        while let Ok((payload, n)) = read_frame(&plain[pos..]) {
            self.frame(out, at, |p| p.extend_from_slice(payload));
            pos += n;
        }
    }

    /// The record inside a frame's payload that was found at `offset` in `file` (opened, when
    /// encrypted).
    pub fn open<'a>(&self, payload: &'a [u8], file: &FileId, offset: u64) -> Result<Cow<'a, [u8]>, FormatError> {
        match &self.cipher {
            None => Ok(Cow::Borrowed(payload)),
            Some(c) => {
                let place = file.place(offset);
                c.open(payload, place.as_ref().map_or(&[][..], |p| &p[..]))
                    .map(Cow::Owned)
                    .map_err(|_| FormatError::Unauthentic)
            }
        }
    }

    /// Whether a frame that checks out starts at `buf[0]`, found at `offset` in `file`, judged
    /// cheaply first (used only to tell a torn tail from damage in the middle of a log).
    pub fn looks_like_frame(&self, buf: &[u8], file: &FileId, offset: u64) -> bool {
        let Some(head) = buf.get(..FRAME_HEADER_LEN + 1) else {
            return false;
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let min = match self.cipher {
            Some(_) => NONCE_LEN + TAG_LEN + 5,
            None => 5,
        };
        if len < min || len > buf.len() - FRAME_HEADER_LEN {
            return false;
        }
        if self.cipher.is_none() && !(KIND_BATCH..=KIND_SNAP_END).contains(&head[FRAME_HEADER_LEN]) {
            return false;
        }
        match read_frame(buf) {
            Ok((payload, _)) => self.open(payload, file, offset).is_ok(),
            Err(_) => false,
        }
    }
}

/// Writes a frame's length and CRC into the 8 bytes at `start`, around the payload after them.
fn finish_frame(out: &mut [u8], start: usize) {
    let payload_len = (out.len() - start - FRAME_HEADER_LEN) as u32;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER_LEN..]);
    out[start..start + 4].copy_from_slice(&payload_len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The frame at the start of `buf`: its payload and its whole length.
pub fn read_frame(buf: &[u8]) -> Result<(&[u8], usize), FormatError> {
    let head = buf.get(..FRAME_HEADER_LEN).ok_or(FormatError::Incomplete)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len == 0 || len > MAX_PAYLOAD {
        return Err(FormatError::BadLength(len as u64));
    }
    let payload = buf
        .get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len)
        .ok_or(FormatError::Incomplete)?;
    if crc32fast::hash(payload) != crc {
        return Err(FormatError::Checksum);
    }
    Ok((payload, FRAME_HEADER_LEN + len))
}

/// One swap_many call as a plain log frame: every key's outcome, all or nothing. Writers make
/// it before they know where it lands; the commit thread seals it for its place, when
/// encrypted ([`Codec::seal_frames`]).
pub fn encode_batch(out: &mut Vec<u8>, swaps: &[Swap], wall_ms: u64) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    out.push(KIND_BATCH);
    out.extend_from_slice(&wall_ms.to_le_bytes());
    out.extend_from_slice(&(swaps.len() as u32).to_le_bytes());
    for s in swaps {
        put_entry(out, &s.key, s.new.as_ref());
    }
    finish_frame(out, start);
}

/// A snapshot chunk of live records, at `at`.
pub fn encode_chunk(codec: &Codec, out: &mut Vec<u8>, at: &mut Cursor, records: &[(Bytes, Record)]) {
    codec.frame(out, at, |p| {
        p.push(KIND_SNAP_CHUNK);
        p.extend_from_slice(&(records.len() as u32).to_le_bytes());
        for (k, r) in records {
            put_entry(p, k, Some(r));
        }
    });
}

/// The last frame of a snapshot: how many keys it holds, the highest version ever stored, and
/// the wall clock when it was written.
pub fn encode_end(
    codec: &Codec,
    out: &mut Vec<u8>,
    at: &mut Cursor,
    keys: u64,
    max_version: Option<&Hlc>,
    wall_ms: u64,
) {
    codec.frame(out, at, |p| {
        p.push(KIND_SNAP_END);
        p.extend_from_slice(&keys.to_le_bytes());
        put_opt_hlc(p, max_version);
        p.extend_from_slice(&wall_ms.to_le_bytes());
    });
}

fn put_bytes32(p: &mut Vec<u8>, b: &[u8]) {
    p.extend_from_slice(&(b.len() as u32).to_le_bytes());
    p.extend_from_slice(b);
}

fn put_hlc(p: &mut Vec<u8>, h: &Hlc) {
    p.extend_from_slice(&h.ms.to_le_bytes());
    p.extend_from_slice(&h.counter.to_le_bytes());
    // Fencing tokens come from clients: their node part can be long (an HTTP body).
    put_bytes32(p, h.node.as_bytes());
}

fn put_opt_hlc(p: &mut Vec<u8>, h: Option<&Hlc>) {
    match h {
        Some(h) => {
            p.push(1);
            put_hlc(p, h);
        }
        None => p.push(0),
    }
}

fn put_entry(p: &mut Vec<u8>, key: &[u8], rec: Option<&Record>) {
    put_bytes32(p, key);
    match rec {
        None => p.push(TAG_DELETE),
        Some(r) => {
            p.push(TAG_PUT);
            put_bytes32(p, &r.value);
            put_hlc(p, &r.version);
            put_opt_hlc(p, r.fencing.as_ref());
            // 0: no deadline; 1: a deadline; 2: a deadline that slides by the u64 after it
            // (files written before sliding deadlines existed only hold 0 and 1).
            match (r.expires_at_ms, r.slide_ms) {
                (Some(d), None) => {
                    p.push(1);
                    p.extend_from_slice(&d.to_le_bytes());
                }
                (Some(d), Some(slide)) => {
                    p.push(2);
                    p.extend_from_slice(&d.to_le_bytes());
                    p.extend_from_slice(&slide.to_le_bytes());
                }
                (None, _) => p.push(0),
            }
        }
    }
}

/// A decoded payload.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload {
    /// A log batch or a snapshot chunk: (key, record or delete) in order; `wall_ms` is 0 in a
    /// chunk.
    Entries {
        kind: u8,
        wall_ms: u64,
        entries: Vec<(Bytes, Option<Record>)>,
    },
    /// The end of a snapshot.
    End {
        keys: u64,
        max_version: Option<Hlc>,
        wall_ms: u64,
    },
}

/// Decodes payloads, sharing one `Arc<str>` per node id (a store has few of them).
#[derive(Debug, Default)]
pub struct Decoder {
    nodes: HashMap<Box<[u8]>, Arc<str>>,
}

impl Decoder {
    pub fn decode(&mut self, payload: &[u8]) -> Result<Payload, FormatError> {
        let mut r = Reader { buf: payload, pos: 0 };
        let kind = r.u8()?;
        let out = match kind {
            KIND_BATCH | KIND_SNAP_CHUNK => {
                let wall_ms = if kind == KIND_BATCH { r.u64()? } else { 0 };
                let count = r.u32()? as usize;
                // Each entry takes at least 5 bytes: do not trust `count` for the allocation.
                let mut entries = Vec::with_capacity(count.min(payload.len() / 5));
                for _ in 0..count {
                    let key = Bytes::copy_from_slice(r.bytes32()?);
                    let rec = match r.u8()? {
                        TAG_DELETE => None,
                        TAG_PUT => Some(self.record(&mut r)?),
                        _ => return Err(FormatError::Malformed("entry tag")),
                    };
                    if kind == KIND_SNAP_CHUNK && rec.is_none() {
                        return Err(FormatError::Malformed("delete in a snapshot"));
                    }
                    entries.push((key, rec));
                }
                Payload::Entries { kind, wall_ms, entries }
            }
            KIND_SNAP_END => {
                let keys = r.u64()?;
                let max_version = self.opt_hlc(&mut r)?;
                let wall_ms = r.u64()?;
                Payload::End {
                    keys,
                    max_version,
                    wall_ms,
                }
            }
            _ => return Err(FormatError::Malformed("payload kind")),
        };
        if r.pos != payload.len() {
            return Err(FormatError::Malformed("trailing bytes"));
        }
        Ok(out)
    }

    fn record(&mut self, r: &mut Reader<'_>) -> Result<Record, FormatError> {
        let value = Bytes::copy_from_slice(r.bytes32()?);
        let version = self.hlc(r)?;
        let fencing = self.opt_hlc(r)?;
        let (expires_at_ms, slide_ms) = match r.u8()? {
            0 => (None, None),
            1 => (Some(r.u64()?), None),
            2 => (Some(r.u64()?), Some(r.u64()?)),
            _ => return Err(FormatError::Malformed("expiry flag")),
        };
        Ok(Record {
            value,
            version,
            fencing,
            expires_at_ms,
            slide_ms,
        })
    }

    fn hlc(&mut self, r: &mut Reader<'_>) -> Result<Hlc, FormatError> {
        let ms = r.u64()?;
        let counter = r.u32()?;
        let node = r.bytes32()?;
        let node = match self.nodes.get(node) {
            Some(n) => n.clone(),
            None => {
                let s: Arc<str> = std::str::from_utf8(node)
                    .map_err(|_| FormatError::Malformed("node id is not utf-8"))?
                    .into();
                self.nodes.insert(node.into(), s.clone());
                s
            }
        };
        Ok(Hlc { ms, counter, node })
    }

    fn opt_hlc(&mut self, r: &mut Reader<'_>) -> Result<Option<Hlc>, FormatError> {
        match r.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.hlc(r)?)),
            _ => Err(FormatError::Malformed("version flag")),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self.pos.checked_add(n).ok_or(FormatError::Malformed("length"))?;
        let s = self.buf.get(self.pos..end).ok_or(FormatError::Malformed("truncated"))?;
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn bytes32(&mut self) -> Result<&'a [u8], FormatError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}
