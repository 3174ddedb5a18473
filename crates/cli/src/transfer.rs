//! `stategate export|import|backup|rekey`: moving whole stores.
//!
//! `export` and `import` reach the records in one of three places: a running service through
//! its HTTP door (`--http`: the admin routes `/v1.0-alpha1/stategate/export` and `import`), a
//! stopped durable store (`--data-dir`, read without changing it for an export), or a Redis /
//! Valkey server (`--redis`). Used directly, the store goes through the same engine import path
//! as the service's route. `backup` streams a running durable store's online backup into a new
//! directory; `rekey` rewrites a stopped store under another key.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};

use super::args::{BackupArgs, ExportArgs, ImportArgs, RekeyArgs, StoreArgs};
use super::http::{error_of, status_error, transport};
use super::{CliError, Exit, base_url};
use crate::dump;
use crate::engine::{Engine, EngineError, ImportOptions, ImportReport, Limits};
use crate::hlc::SystemClock;
use crate::storage::durable::{self, EncryptionKey, FsyncMode};
use crate::storage::{Record, StorageConfig, StorageError, StorageKind, Store};

/// Records per import request over HTTP (and at most about [`IMPORT_REQUEST_BYTES`]).
const IMPORT_REQUEST_RECORDS: usize = 1000;
const IMPORT_REQUEST_BYTES: usize = 1 << 20;
/// Records per page of a direct export.
const EXPORT_PAGE: usize = 1000;
/// Largest part of a backup stream accepted (the service sends 256 KiB parts).
const MAX_BACKUP_PART: usize = 64 << 20;

/// The HTTP door's import answer, as this client reads it (the door's OpenAPI schema is
/// `ImportReport`).
#[derive(serde::Deserialize)]
struct ImportAnswer {
    imported: u64,
    unchanged: u64,
    #[serde(rename = "keptNewer")]
    kept_newer: u64,
    #[serde(default)]
    fenced: u64,
    expired: u64,
}

/// Where the records are.
enum Target {
    Http {
        base: String,
        token: Option<String>,
        timeout: Duration,
    },
    Dir {
        dir: PathBuf,
        key: Option<PathBuf>,
    },
    Redis {
        url: String,
        prefix: String,
    },
}

fn target(a: &StoreArgs) -> Result<Target, CliError> {
    match (&a.http, &a.data_dir, &a.redis) {
        (Some(url), None, None) => Ok(Target::Http {
            base: base_url(url, "--http")?,
            token: a.api_token.clone().filter(|t| !t.is_empty()),
            timeout: a.timeout,
        }),
        (None, Some(dir), None) => Ok(Target::Dir {
            dir: dir.clone(),
            key: a.encryption_key_file.clone(),
        }),
        (None, None, Some(url)) => Ok(Target::Redis {
            url: url.clone(),
            prefix: a.redis_prefix.clone(),
        }),
        _ => Err(CliError::usage(
            "give exactly one of --http URL (a running service), --data-dir DIR (a stopped store) or --redis URL",
        )),
    }
}

fn storage_error(e: StorageError) -> CliError {
    match e {
        StorageError::Encryption(m) => CliError::usage(m),
        other => CliError::unavailable(other.to_string()),
    }
}

fn engine_error(e: EngineError) -> CliError {
    match e {
        EngineError::Storage(s) => storage_error(s),
        e @ (EngineError::StorageFull | EngineError::Unavailable | EngineError::QuotaExceeded) => {
            CliError::unavailable(format!("the store refused: {e}"))
        }
        e => CliError::usage(format!("the store refused a record: {e}")),
    }
}

/// An engine on a store used directly: no limits of a service's (the records came from one).
async fn direct_engine(store: Store) -> Result<Engine, CliError> {
    let limits = Limits {
        max_key_bytes: usize::MAX,
        max_value_bytes: usize::MAX,
        ..Limits::default()
    };
    Engine::open(store, "stategate", Arc::new(SystemClock), limits)
        .await
        .map_err(engine_error)
}

fn key_of(path: &Option<PathBuf>) -> Result<Option<EncryptionKey>, CliError> {
    path.as_deref()
        .map(EncryptionKey::from_file)
        .transpose()
        .map_err(storage_error)
}

async fn open_redis(url: &str, prefix: &str) -> Result<Store, CliError> {
    let kind: StorageKind = url.parse().map_err(|e| CliError::usage(format!("--redis: {e}")))?;
    if !matches!(kind, StorageKind::Redis(_)) {
        return Err(CliError::usage("--redis must be a redis:// or rediss:// URL"));
    }
    let mut config = StorageConfig {
        kind,
        data_dir: PathBuf::new(),
        fsync: FsyncMode::Always,
        encryption_key_file: None,
        segment_bytes: 64 << 20,
        redis: Default::default(),
    };
    config.redis.prefix = prefix.to_owned();
    config.redis.startup_wait = Duration::from_secs(10);
    Store::open(&config).await.map_err(storage_error)
}

/// Where the export goes: stdout, or a new file (removed again if the export fails).
struct Sink {
    out: Box<dyn std::io::Write>,
    path: Option<PathBuf>,
}

impl Sink {
    fn open(path: &Path) -> Result<Sink, CliError> {
        if path.as_os_str() == "-" {
            return Ok(Sink {
                out: Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
                path: None,
            });
        }
        let f = std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| {
                CliError::usage(format!(
                    "cannot create {}: {e} (an existing file is not overwritten)",
                    path.display()
                ))
            })?;
        Ok(Sink {
            out: Box::new(std::io::BufWriter::new(f)),
            path: Some(path.to_owned()),
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), CliError> {
        self.out
            .write_all(bytes)
            .map_err(|e| CliError::unavailable(format!("cannot write the export: {e}")))
    }

    fn finish(mut self) -> Result<(), CliError> {
        self.out
            .flush()
            .map_err(|e| CliError::unavailable(format!("cannot write the export: {e}")))
    }

    fn discard(self) {
        if let Some(p) = self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

pub async fn export(a: ExportArgs) -> Result<i32, CliError> {
    let target = target(&a.store)?;
    let mut sink = Sink::open(&a.output)?;
    let result = async {
        match target {
            Target::Http { base, token, timeout } => export_http(&base, token.as_deref(), timeout, &mut sink).await,
            Target::Dir { dir, key } => {
                let key = key_of(&key)?;
                let index = tokio::task::spawn_blocking(move || durable::load_read_only(&dir, key.as_ref()))
                    .await
                    .map_err(|e| CliError::unavailable(format!("the reading thread failed: {e}")))?
                    .map_err(storage_error)?;
                export_engine(&direct_engine(Store::new(index)).await?, &mut sink).await
            }
            Target::Redis { url, prefix } => {
                export_engine(&direct_engine(open_redis(&url, &prefix).await?).await?, &mut sink).await
            }
        }
    }
    .await;
    let finished = match result {
        Ok(n) => sink.finish().map(|()| n),
        Err(e) => {
            sink.discard();
            return Err(e);
        }
    };
    match finished {
        Ok(n) => {
            eprintln!("exported {n} records");
            Ok(Exit::Done as i32)
        }
        Err(e) => {
            if a.output.as_os_str() != "-" {
                let _ = std::fs::remove_file(&a.output);
            }
            Err(e)
        }
    }
}

async fn export_engine(engine: &Engine, sink: &mut Sink) -> Result<u64, CliError> {
    let mut after: Option<Bytes> = None;
    let mut n = 0;
    loop {
        let (records, next) = engine
            .export_page(after.as_deref(), EXPORT_PAGE)
            .await
            .map_err(engine_error)?;
        let mut out = Vec::new();
        for (k, r) in &records {
            dump::encode_line(k, r, &mut out);
        }
        n += records.len() as u64;
        sink.write(&out)?;
        match next {
            Some(k) => after = Some(k),
            None => return Ok(n),
        }
    }
}

fn client(timeout: Duration) -> Result<reqwest::Client, CliError> {
    reqwest::Client::builder()
        .connect_timeout(timeout)
        .read_timeout(timeout)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| CliError::unavailable(format!("cannot create the HTTP client: {e}")))
}

fn request(client: &reqwest::Client, method: Method, url: String, token: Option<&str>) -> reqwest::RequestBuilder {
    let b = client.request(method, url);
    match token {
        Some(t) => b.header("dapr-api-token", t),
        None => b,
    }
}

/// GET of an admin route (`export`, `backup`) whose body streams; an error answer as an error.
async fn get_admin(
    base: &str,
    route: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<reqwest::Response, CliError> {
    let client = client(timeout)?;
    let url = format!("{base}/v1.0-alpha1/stategate/{route}");
    let resp = request(&client, Method::GET, url, token)
        .send()
        .await
        .map_err(|e| transport(e, base, timeout))?;
    if resp.status() != StatusCode::OK {
        let (status, message) = error_of(resp).await;
        return Err(status_error(status, &message));
    }
    Ok(resp)
}

async fn export_http(base: &str, token: Option<&str>, timeout: Duration, sink: &mut Sink) -> Result<u64, CliError> {
    let mut resp = get_admin(base, "export", token, timeout).await?;
    let (mut lines, mut last) = (0u64, b'\n');
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(e, base, timeout))? {
        lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
        if let Some(&b) = chunk.last() {
            last = b;
        }
        sink.write(&chunk)?;
    }
    if last != b'\n' {
        return Err(CliError::unavailable("the export was cut short (no final newline)"));
    }
    Ok(lines)
}

fn read_input(path: &Path) -> Result<Vec<u8>, CliError> {
    use std::io::Read;
    let mut buf = Vec::new();
    let what = path.display();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .read_to_end(&mut buf)
            .map_err(|e| CliError::usage(format!("cannot read stdin: {e}")))?;
    } else {
        buf = std::fs::read(path).map_err(|e| CliError::usage(format!("cannot read {what}: {e}")))?;
    }
    Ok(buf)
}

pub async fn import(a: ImportArgs) -> Result<i32, CliError> {
    let target = target(&a.store)?;
    // Every line is checked before anything is sent: a bad file changes nothing.
    let text = read_input(&a.file)?;
    let records = dump::decode_lines(&text, 1).map_err(|e| CliError::usage(format!("{}: {e}", a.file.display())))?;
    drop(text);
    let total = records.len();
    let options = ImportOptions {
        overwrite: a.overwrite,
        overwrite_fenced: a.overwrite_fenced,
    };
    let report = match target {
        Target::Http { base, token, timeout } => {
            import_http(&base, token.as_deref(), timeout, records, options).await?
        }
        Target::Dir { dir, key } => {
            let config = StorageConfig {
                kind: StorageKind::Durable,
                data_dir: dir,
                fsync: FsyncMode::Always,
                encryption_key_file: key,
                segment_bytes: 64 << 20,
                redis: Default::default(),
            };
            let store = Store::open(&config).await.map_err(storage_error)?;
            import_engine(&direct_engine(store).await?, records, options).await?
        }
        Target::Redis { url, prefix } => {
            import_engine(
                &direct_engine(open_redis(&url, &prefix).await?).await?,
                records,
                options,
            )
            .await?
        }
    };
    eprintln!(
        "{total} records read: {} imported, {} unchanged, {} kept (the store has a newer version), {} fenced \
         (kept: a fencing token protects the key), {} expired",
        report.imported, report.unchanged, report.kept_newer, report.fenced, report.expired
    );
    if report.kept_newer > 0 || report.fenced > 0 {
        return Err(CliError::conflict(format!(
            "{} records were not imported: the store holds newer versions of {} (--overwrite replaces them), \
             and {} keys are protected by a fencing token the record does not match (--overwrite-fenced \
             replaces them)",
            report.kept_newer + report.fenced,
            report.kept_newer,
            report.fenced
        )));
    }
    Ok(Exit::Done as i32)
}

async fn import_engine(
    engine: &Engine,
    records: Vec<(Bytes, Record)>,
    options: ImportOptions,
) -> Result<ImportReport, CliError> {
    engine.check_import(&records).map_err(|(i, e)| {
        CliError::usage(format!(
            "record {} ({:?}): the store refuses it: {e}",
            i + 1,
            String::from_utf8_lossy(&records[i].0)
        ))
    })?;
    engine.import(records, options).await.map_err(engine_error)
}

async fn import_http(
    base: &str,
    token: Option<&str>,
    timeout: Duration,
    records: Vec<(Bytes, Record)>,
    options: ImportOptions,
) -> Result<ImportReport, CliError> {
    let client = client(timeout)?;
    let url = format!(
        "{base}/v1.0-alpha1/stategate/import?overwrite={}&overwriteFenced={}",
        options.overwrite, options.overwrite_fenced
    );
    let mut report = ImportReport::default();
    let mut body = Vec::new();
    let mut in_body = 0;
    let mut sent = 0;
    let mut records = records.into_iter().peekable();
    while let Some((k, r)) = records.next() {
        dump::encode_line(&k, &r, &mut body);
        in_body += 1;
        let last = records.peek().is_none();
        if !(last || in_body >= IMPORT_REQUEST_RECORDS || body.len() >= IMPORT_REQUEST_BYTES) {
            continue;
        }
        let resp = request(&client, Method::POST, url.clone(), token)
            .header(reqwest::header::CONTENT_TYPE, dump::CONTENT_TYPE)
            .body(std::mem::take(&mut body))
            .send()
            .await
            .map_err(|e| transport(e, base, timeout))?;
        if resp.status() != StatusCode::OK {
            let (status, message) = error_of(resp).await;
            let mut e = status_error(status, &message);
            if sent > 0 {
                e.message = format!("{} (the first {sent} records were imported)", e.message);
            }
            return Err(e);
        }
        let raw = resp.bytes().await.map_err(|e| transport(e, base, timeout))?;
        let got: ImportAnswer = serde_json::from_slice(&raw)
            .map_err(|e| CliError::unavailable(format!("the import answer from {base} is not a report: {e}")))?;
        report.imported += got.imported;
        report.unchanged += got.unchanged;
        report.kept_newer += got.kept_newer;
        report.fenced += got.fenced;
        report.expired += got.expired;
        sent += in_body;
        in_body = 0;
    }
    Ok(report)
}

/// The files a backup wrote, removed again if it fails.
struct BackupDir {
    dir: PathBuf,
    created: bool,
    files: Vec<PathBuf>,
}

impl BackupDir {
    fn discard(&self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        if self.created {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }

    fn append(&mut self, name: String, bytes: &[u8]) -> Result<(), CliError> {
        let path = self.dir.join(name);
        if !self.files.contains(&path) {
            self.files.push(path.clone());
        }
        std::fs::File::options()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|e| CliError::unavailable(format!("cannot write {}: {e}", path.display())))
    }

    fn sync(&self) -> std::io::Result<()> {
        for f in &self.files {
            std::fs::File::open(f)?.sync_all()?;
        }
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

pub async fn backup(a: BackupArgs) -> Result<i32, CliError> {
    let base = base_url(&a.http, "--http")?;
    let created = match std::fs::read_dir(&a.to) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(CliError::usage(format!("{} is not empty", a.to.display())));
            }
            false
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&a.to)
                .map_err(|e| CliError::usage(format!("cannot create {}: {e}", a.to.display())))?;
            true
        }
        Err(e) => return Err(CliError::usage(format!("{}: {e}", a.to.display()))),
    };
    let mut out = BackupDir {
        dir: a.to.clone(),
        created,
        files: Vec::new(),
    };
    match receive_backup(&base, a.api_token.as_deref(), a.timeout, &mut out).await {
        Ok((keys, log_records)) => {
            out.sync()
                .map_err(|e| CliError::unavailable(format!("cannot sync {}: {e}", a.to.display())))?;
            eprintln!(
                "backup of {keys} keys and {log_records} log records in {} (start a service with --data-dir on it to restore)",
                a.to.display()
            );
            Ok(Exit::Done as i32)
        }
        Err(e) => {
            out.discard();
            Err(e)
        }
    }
}

/// Reads the backup stream (`http/transfer.rs` describes it) into `out`.
async fn receive_backup(
    base: &str,
    token: Option<&str>,
    timeout: Duration,
    out: &mut BackupDir,
) -> Result<(u64, u64), CliError> {
    let mut resp = get_admin(base, "backup", token, timeout).await?;
    let cut_short = || CliError::unavailable("the backup was cut short: the copy is incomplete and was removed");
    let mut buf: Vec<u8> = Vec::new();
    loop {
        // Parse every whole part in the buffer.
        while let Some(&kind) = buf.first() {
            if kind == 0 {
                if buf.len() < 17 {
                    break;
                }
                let keys = u64::from_le_bytes(buf[1..9].try_into().unwrap_or_default());
                let records = u64::from_le_bytes(buf[9..17].try_into().unwrap_or_default());
                if buf.len() > 17 {
                    return Err(CliError::unavailable("the backup stream goes on after its end"));
                }
                return Ok((keys, records));
            }
            if buf.len() < 13 {
                break;
            }
            let seq = u64::from_le_bytes(buf[1..9].try_into().unwrap_or_default());
            let len = u32::from_le_bytes(buf[9..13].try_into().unwrap_or_default()) as usize;
            if len > MAX_BACKUP_PART {
                return Err(CliError::unavailable(format!(
                    "a backup part of {len} bytes: not a backup stream"
                )));
            }
            if buf.len() < 13 + len {
                break;
            }
            let name = match kind {
                crate::dump::BACKUP_PART_SNAPSHOT => durable::snapshot_name(seq),
                crate::dump::BACKUP_PART_LOG => durable::segment_name(seq),
                other => {
                    return Err(CliError::unavailable(format!(
                        "backup part of kind {other}: not a backup stream"
                    )));
                }
            };
            out.append(name, &buf[13..13 + len])?;
            buf.drain(..13 + len);
        }
        match resp.chunk().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            Ok(None) => return Err(cut_short()),
            Err(e) => {
                let e = transport(e, base, timeout);
                return Err(CliError::unavailable(format!("{}; {}", cut_short().message, e.message)));
            }
        }
    }
}

pub fn rekey(a: RekeyArgs) -> Result<i32, CliError> {
    let old = key_of(&a.encryption_key_file)?;
    let new = key_of(&a.new_encryption_key_file)?;
    let report = durable::rekey(&a.data_dir, old.as_ref(), new.as_ref()).map_err(storage_error)?;
    let now = match &new {
        Some(k) => format!("encrypted with {}", k.path().display()),
        None => "not encrypted".to_owned(),
    };
    eprintln!(
        "{}: {} keys rewritten ({} bytes), {now}",
        a.data_dir.display(),
        report.keys,
        report.snapshot_bytes
    );
    Ok(Exit::Done as i32)
}
