//! Moving data in and out of a running service (stategate extensions, protected by the api
//! token like every data route): `GET .../export` streams every live record as JSON lines
//! (`dump.rs`), `POST .../import` stores such lines with their own versions, `GET .../backup`
//! streams an online backup of the durable store.
//!
//! Memory stays bounded: the export holds one page of records at a time, the backup a few
//! chunks (the producer waits while the client reads). A backup's producer waits at most
//! `--backup-send-timeout` for the client to take a chunk: past it the backup ends, letting go
//! of the files it holds open, and the stream is cut short (compaction never waits for the
//! client either way: `storage/durable/backup.rs`). A stalled export holds only its page and its
//! connection: no thread, no storage state.
//!
//! Access rules (`--acl-file`) apply: the export holds only the keys the caller may read (it
//! shows what GET shows of each: value, version, deadline, fencing token); an import needs
//! `write` and `admin` on every key it holds (its records keep their own versions, tokens and
//! deadlines, and `overwriteFenced` takes locks' protection away); a backup (the whole store,
//! keys to come included, as files that pause log compaction while they are read) needs `read`
//! and `admin` on every key (`*` rules).

use std::time::Duration;

use axum::body::Body as RawBody;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{StreamExt, stream};

use super::error::{ApiError, ErrorBody, Op};
use super::{AppState, Caller, DaprQuery, dto};
use crate::access::Op as Access;
use crate::dump;
use crate::engine::ImportOptions;
use crate::storage::{BackupFile, BackupSink};

/// Chunks of the backup stream the producer may run ahead of the client.
const BACKUP_CHUNKS_AHEAD: usize = 4;
/// Bytes of one part of the backup stream (a larger frame is split into several).
const BACKUP_CHUNK_BYTES: usize = 256 * 1024;

/// Export every live record (stategate extension).
#[utoipa::path(
    get,
    path = "/v1.0-alpha1/stategate/export",
    tag = "stategate",
    responses(
        (status = 200, content_type = "application/x-ndjson",
         description = "every live record, one JSON object per line: `key` (text, or base64 with \
                        `key_base64: true`), `value` (base64), `version`, and when set \
                        `fencing_token` and `expires_at_ms` (the absolute deadline). Each record \
                        as it was when read; for a copy of one moment use the backup. A body cut \
                        short (no final newline, or the connection reset) means the export failed."),
    )
)]
pub async fn export(State(st): State<AppState>, Caller(grant): Caller) -> Response {
    let engine = st.engine.clone();
    let page = engine.limits().scan_page.max(1);
    // (key to continue after, done)
    let pages = stream::unfold((None::<Bytes>, false), move |(after, done)| {
        let (engine, grant) = (engine.clone(), grant.clone());
        async move {
            if done {
                return None;
            }
            match engine.export_page(after.as_deref(), page).await {
                Ok((records, next)) => {
                    let mut out = Vec::new();
                    for (k, r) in records.iter().filter(|(k, _)| grant.may(Access::Read, k)) {
                        dump::encode_line(k, r, &mut out);
                    }
                    let done = next.is_none();
                    Some((Ok::<_, std::io::Error>(Bytes::from(out)), (next, done)))
                }
                Err(e) => {
                    tracing::error!(cause = %e, "export: a page could not be read; the export is cut short");
                    Some((Err(std::io::Error::other(e.to_string())), (None, true)))
                }
            }
        }
    });
    (
        [(header::CONTENT_TYPE, dump::CONTENT_TYPE)],
        RawBody::from_stream(pages),
    )
        .into_response()
}

/// The largest import body: the configured HTTP limit, or one record of the largest key and
/// value in base64 if that is more.
fn import_limit(st: &AppState) -> usize {
    let l = st.engine.limits();
    let one_record = (l.max_key_bytes.saturating_add(l.max_value_bytes) / 3 + 1).saturating_mul(4);
    st.settings.body_limit.max(one_record.saturating_add(64 * 1024))
}

/// Import records with their own versions (stategate extension).
#[utoipa::path(
    post,
    path = "/v1.0-alpha1/stategate/import",
    tag = "stategate",
    params(("overwrite" = Option<bool>, Query,
            description = "`true`: also replace keys that hold a newer version than the record's"),
           ("overwriteFenced" = Option<bool>, Query,
            description = "`true`: also replace keys protected by a fencing token the record does not \
                           match (equal or higher); without it such keys are kept and counted")),
    request_body(content = Option<Vec<dto::ImportRecord>>, content_type = "application/x-ndjson",
                 description = "records, one JSON object per line, as `GET /v1.0-alpha1/stategate/export` \
                                writes them; empty: nothing to import"),
    responses(
        (status = 200, body = dto::ImportReport),
        (status = 400, body = ErrorBody, description = "a line that is not a record, or a record the \
                                                        store refuses (size, version too far ahead): \
                                                        nothing was imported"),
        (status = 403, body = ErrorBody, description = "the caller lacks `write` or `admin` on one of the keys: \
                                                        nothing was imported"),
        (status = 507, body = ErrorBody, description = "--max-keys reached, or the disk is full"),
    )
)]
pub async fn import(
    State(st): State<AppState>,
    Caller(grant): Caller,
    DaprQuery(params): DaprQuery,
    body: RawBody,
) -> Result<Response, ApiError> {
    let flag = |name: &str| match params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::malformed(format!(
            "{name} must be true or false (got {other:?})"
        ))),
    };
    let options = ImportOptions {
        overwrite: flag("overwrite")?,
        overwrite_fenced: flag("overwriteFenced")?,
    };
    let limit = import_limit(&st);
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            super::error::MALFORMED,
            format!("the import body is larger than {limit} bytes: send fewer records per request"),
        )
    })?;
    let records = dump::decode_lines(&bytes, 1).map_err(|e| ApiError::malformed(e.to_string()))?;
    for op in [Access::Write, Access::Admin] {
        grant
            .check_all(op, records.iter().map(|(k, _)| &k[..]))
            .map_err(|e| ApiError::from_engine(Op::Import, e))?;
    }
    st.engine.check_import(&records).map_err(|(i, e)| {
        let mut err = ApiError::from_engine(Op::Import, e);
        err.message = format!(
            "record {} ({:?}): {}",
            i + 1,
            String::from_utf8_lossy(&records[i].0),
            err.message
        );
        err
    })?;
    let report = st
        .engine
        .import(records, options)
        .await
        .map_err(|e| ApiError::from_engine(Op::Import, e))?;
    Ok(axum::Json(dto::ImportReport {
        imported: report.imported,
        unchanged: report.unchanged,
        kept_newer: report.kept_newer,
        fenced: report.fenced,
        expired: report.expired,
    })
    .into_response())
}

/// The backup stream (`stategate backup --to DIR` reads it):
///
/// ```text
/// stream = part* end
/// part   = kind:u8 seq:u64 len:u32 bytes[len]     kind 1: snap-<seq>.snap, 2: log-<seq>.log
/// end    = 0:u8 keys:u64 log_records:u64          the backup is complete
/// ```
/// Integers little-endian. A stream without its end was cut short: the copy is incomplete.
///
/// Runs on a blocking thread; each chunk waits at most `timeout` for room in the stream.
struct StreamSink {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    buf: BytesMut,
    file: Option<BackupFile>,
}

pub use crate::dump::{BACKUP_END, BACKUP_PART_LOG, BACKUP_PART_SNAPSHOT};

impl StreamSink {
    fn send(&mut self, chunk: Bytes) -> std::io::Result<()> {
        let sent = self
            .runtime
            .block_on(tokio::time::timeout(self.timeout, self.tx.send(chunk)));
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the client went away",
            )),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client took nothing for {} (--backup-send-timeout)",
                    humantime::format_duration(self.timeout)
                ),
            )),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let Some(file) = self.file else { return Ok(()) };
        if self.buf.is_empty() {
            return Ok(());
        }
        let (kind, seq) = match file {
            BackupFile::Snapshot { seq } => (BACKUP_PART_SNAPSHOT, seq),
            BackupFile::Log { seq } => (BACKUP_PART_LOG, seq),
        };
        let mut head = BytesMut::with_capacity(13);
        head.put_u8(kind);
        head.put_u64_le(seq);
        head.put_u32_le(self.buf.len() as u32);
        self.send(head.freeze())?;
        let body = self.buf.split().freeze();
        self.send(body)
    }
}

impl BackupSink for StreamSink {
    fn write(&mut self, file: BackupFile, bytes: &[u8]) -> std::io::Result<()> {
        if self.file != Some(file) {
            self.flush()?;
            self.file = Some(file);
        }
        // Parts of at most a chunk, however large a frame the backup hands over at once.
        let mut rest = bytes;
        while !rest.is_empty() {
            let take = rest.len().min(BACKUP_CHUNK_BYTES - self.buf.len());
            self.buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.buf.len() >= BACKUP_CHUNK_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }
}

/// Online backup of the durable store (stategate extension).
#[utoipa::path(
    get,
    path = "/v1.0-alpha1/stategate/backup",
    tag = "stategate",
    responses(
        (status = 200, content_type = "application/octet-stream",
         description = "a consistent copy of the store at one point of its log, taken while it \
                        serves: parts `kind:u8 seq:u64 len:u32 bytes` (kind 1 the snapshot, 2 the \
                        log segment), then `0:u8 keys:u64 log_records:u64`. `stategate backup --to \
                        DIR` writes it as a data directory. A stream without the end part failed."),
        (status = 400, body = ErrorBody, description = "the storage is not durable (use the export)"),
        (status = 403, body = ErrorBody, description = "the caller lacks `read` or `admin` on every key"),
    )
)]
pub async fn backup(State(st): State<AppState>, Caller(grant): Caller) -> Result<Response, ApiError> {
    if !(grant.may_every_key(Access::Read) && grant.may_every_key(Access::Admin)) {
        return Err(ApiError::from_engine(
            Op::Import,
            crate::engine::EngineError::NotAuthorized,
        ));
    }
    if !st.engine.can_backup() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "ERR_NOT_SUPPORTED_STATE_OPERATION",
            "an online backup needs --storage durable; export the records instead",
        ));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(BACKUP_CHUNKS_AHEAD);
    // The end part, or the error that cuts the stream: after every chunk, and never waiting.
    let (end_tx, end_rx) = tokio::sync::oneshot::channel();
    let engine = st.engine.clone();
    let timeout = st.settings.backup_send_timeout;
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut sink = StreamSink {
            tx,
            runtime,
            timeout,
            buf: BytesMut::new(),
            file: None,
        };
        let done = engine.backup(&mut sink).and_then(|info| {
            sink.flush()
                .map_err(|e| crate::engine::EngineError::Storage(e.into()))
                .map(|()| info)
        });
        drop(sink);
        let last = match done {
            Ok(info) => {
                tracing::info!(
                    keys = info.keys,
                    log_records = info.log_records,
                    bytes = info.snapshot_bytes + info.log_bytes,
                    "online backup sent"
                );
                let mut end = BytesMut::with_capacity(17);
                end.put_u8(BACKUP_END);
                end.put_u64_le(info.keys);
                end.put_u64_le(info.log_records);
                Ok(end.freeze())
            }
            Err(e) => {
                if by_client(&e) {
                    tracing::warn!(cause = %e, "online backup cut short");
                } else {
                    tracing::error!(cause = %e, "online backup failed");
                }
                Err(std::io::Error::other(e.to_string()))
            }
        };
        let _ = end_tx.send(last);
    });
    let end = stream::once(async {
        end_rx
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the backup ended without an answer")))
    });
    let body = RawBody::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok).chain(end));
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

/// Whether a backup ended because of its client (gone, or too slow), not of the store.
fn by_client(e: &crate::engine::EngineError) -> bool {
    matches!(
        e,
        crate::engine::EngineError::Storage(crate::storage::StorageError::Io(io))
            if matches!(io.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::BrokenPipe)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(tx: tokio::sync::mpsc::Sender<Bytes>) -> StreamSink {
        StreamSink {
            tx,
            runtime: tokio::runtime::Handle::current(),
            timeout: Duration::from_millis(50),
            buf: BytesMut::new(),
            file: None,
        }
    }

    /// A client that takes nothing: the backup's sink gives up after its timeout (the backup
    /// then ends) instead of waiting for as long as the connection stays open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_stream_nobody_reads_times_out() {
        let (tx, _client) = tokio::sync::mpsc::channel(1);
        let mut sink = sink(tx);
        // A full chunk goes as a head and a body: the body finds no room.
        let got = tokio::task::spawn_blocking(move || sink.write(BackupFile::Log { seq: 1 }, &[0; BACKUP_CHUNK_BYTES]))
            .await
            .unwrap();
        assert_eq!(got.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    }

    /// However large a frame the backup hands over, the stream holds parts of a chunk (the
    /// client refuses parts over 64 MiB; memory stays a few chunks ahead of the client).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_frame_goes_as_parts_of_a_chunk() {
        let (tx, mut client) = tokio::sync::mpsc::channel(64);
        let mut sink = sink(tx);
        let frame = vec![7u8; 5 * BACKUP_CHUNK_BYTES / 2];
        tokio::task::spawn_blocking(move || {
            sink.write(BackupFile::Snapshot { seq: 3 }, &frame)?;
            sink.flush()
        })
        .await
        .unwrap()
        .unwrap();
        let mut parts = Vec::new();
        while let Ok(head) = client.try_recv() {
            let body = client.try_recv().unwrap();
            assert_eq!(head[..9], [BACKUP_PART_SNAPSHOT, 3, 0, 0, 0, 0, 0, 0, 0]);
            assert_eq!(u32::from_le_bytes(head[9..13].try_into().unwrap()) as usize, body.len());
            parts.push(body.len());
        }
        let chunk = BACKUP_CHUNK_BYTES;
        assert_eq!(parts, [chunk, chunk, chunk / 2]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_stream_whose_client_left_fails_at_once() {
        let (tx, client) = tokio::sync::mpsc::channel(1);
        drop(client);
        let mut sink = sink(tx);
        let got = tokio::task::spawn_blocking(move || sink.write(BackupFile::Log { seq: 1 }, &[0; BACKUP_CHUNK_BYTES]))
            .await
            .unwrap();
        assert_eq!(got.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
    }
}
