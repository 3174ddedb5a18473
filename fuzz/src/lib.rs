//! What the fuzz targets share: a fresh runtime and engine per input (so a crash reproduces
//! from its input alone), and the plain-text framings the seeds are written in.

use std::future::Future;
use std::sync::Arc;

use stategate::engine::{Engine, Limits};
use stategate::hlc::ManualClock;
use stategate::storage::Store;

/// The wall time of every fuzzed engine (ms since the epoch), as the tests use.
pub const NOW_MS: u64 = 1_700_000_000_000;

/// Runs `f` on a fresh current-thread runtime with paused time: whatever waits (a campaign, a
/// stream, a timeout) completes as soon as nothing else can run. Dropping the runtime ends
/// every task the input started.
pub fn run<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
        .block_on(f)
}

/// A fresh engine on the memory store, at [`NOW_MS`].
pub async fn engine() -> Engine {
    Engine::open(
        Store::memory(),
        "fuzz",
        Arc::new(ManualClock::new(NOW_MS)),
        Limits::default(),
    )
    .await
    .expect("an engine on the memory store")
}

/// Splits `data` at its first `\n`: (first line, rest). No `\n`: the whole is the line.
pub fn first_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Header lines (`name<sep>value`, split at the first `sep`, nothing trimmed) up to an empty
/// line, then the body: the framing of the MQTT and HTTP seeds, so they stay readable.
pub fn head_and_body(data: &[u8], sep: u8) -> (Vec<(String, String)>, &[u8]) {
    let mut headers = Vec::new();
    let mut rest = data;
    loop {
        if rest.is_empty() {
            return (headers, rest);
        }
        let (line, next) = first_line(rest);
        rest = next;
        if line.is_empty() {
            return (headers, rest);
        }
        let line = String::from_utf8_lossy(line);
        let (k, v) = line.split_once(sep as char).unwrap_or((&line, ""));
        headers.push((k.to_owned(), v.to_owned()));
    }
}

/// A data directory as a fuzz input: a flags byte (bit 0: the files are encrypted under
/// [`DataDir::KEY`]), then files, each `name_len:u8 name data_len:u32le data` (the last one's
/// data may be cut short). Names outside `[A-Za-z0-9._-]{1,64}`, `.` and `..` are skipped: the
/// files stay inside the directory.
pub struct DataDir<'a> {
    pub encrypted: bool,
    pub files: Vec<(&'a str, &'a [u8])>,
}

impl<'a> DataDir<'a> {
    /// The encryption key of encrypted inputs (and of the seeds made encrypted).
    pub const KEY: [u8; 32] = [0x5a; 32];

    pub fn parse(data: &'a [u8]) -> DataDir<'a> {
        let Some((&flags, mut rest)) = data.split_first() else {
            return DataDir {
                encrypted: false,
                files: Vec::new(),
            };
        };
        let mut files = Vec::new();
        while let Some((&len, after)) = rest.split_first() {
            let len = usize::from(len).min(after.len());
            let (name, after) = after.split_at(len);
            let data_len = after
                .get(..4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
            let after = after.get(4..).unwrap_or_default();
            let (data, after) = after.split_at(data_len.min(after.len()));
            rest = after;
            let ok = std::str::from_utf8(name).ok().filter(|n| {
                (1..=64).contains(&n.len())
                    && *n != "."
                    && *n != ".."
                    && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            });
            if let Some(name) = ok {
                files.push((name, data));
            }
        }
        DataDir {
            encrypted: flags & 1 == 1,
            files,
        }
    }

    /// Appends one file in the input's framing (for the seed generator).
    pub fn push_file(out: &mut Vec<u8>, name: &str, data: &[u8]) {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }

    pub fn write(&self, dir: &std::path::Path) {
        for (name, data) in &self.files {
            std::fs::write(dir.join(name), data).expect("writing a file of the input");
        }
    }

    pub fn key(&self) -> Option<stategate::storage::durable::EncryptionKey> {
        self.encrypted
            .then(|| stategate::storage::durable::EncryptionKey::from_bytes(Self::KEY, "fuzz.key"))
    }
}
