//! The command-line client: `stategate get|set|del|vdel|scan|watch|lock|unlock`, over the MQTT
//! door (the default, speaking the Azure IoT Operations state store protocol as its SDKs do), the
//! HTTP door (`--http`, the Dapr state API) or the gRPC door (`--grpc`, `statestore.v1`).
//!
//! - `args.rs`: the command line; `output.rs`: what is printed (people, `--json`, `--raw`);
//! - `mqtt.rs`, `http.rs`, `grpc.rs`: one [`Door`] each; `lock.rs`: leases over any door.
//! - `transfer.rs`: `export`, `import`, `backup` (the HTTP door's admin routes, or a stopped
//!   store / Redis used directly) and `rekey` (a stopped store).
//!
//! The client reaches the service only through its doors; nothing below the doors (engine,
//! storage) knows this module. The same command prints the same thing whichever door it used;
//! where a door cannot do something (MQTT has no version condition and no pattern watch) the
//! command says so and exits 2 rather than doing something weaker.

use stategate_engine as engine;
use stategate_hlc as hlc;
use stategate_net::tls;
use stategate_resp3 as resp3;
use stategate_storage as storage;
use stategate_storage::dump;

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

pub mod args;
mod elect;
mod grpc;
mod http;
mod lock;
mod mqtt;
mod output;
mod transfer;

use args::{ClientCommand, ConnectArgs, OutputArgs, ValueSource, arg_bytes};
use output::{Format, Output};

/// Largest value read from stdin or a file (the service's own limit is usually lower).
pub const MAX_INPUT_BYTES: u64 = 64 * 1024 * 1024;
/// Largest MQTT packet and gRPC message the client accepts.
pub const MAX_MESSAGE_BYTES: usize = 80 * 1024 * 1024;

/// Exit statuses scripts can rely on (listed in `args::EXIT_CODES` and docs/cli.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Done = 0,
    /// Key not found, or a condition (NX, NEX, VDEL value, a held lock) not met.
    NotFound = 1,
    Usage = 2,
    /// Version mismatch, fencing token refused, lease lost.
    Conflict = 3,
    NotAuthorized = 4,
    /// Unreachable, timed out, busy or failing.
    Unavailable = 5,
}

/// Why a command failed, with the status it exits with.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    /// Empty: nothing to say (a reader that went away).
    pub message: String,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> CliError {
        CliError {
            exit,
            message: message.into(),
        }
    }
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Usage, message)
    }
    pub fn conflict(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Conflict, message)
    }
    pub fn unavailable(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Unavailable, message)
    }
    pub fn quiet(exit: Exit) -> CliError {
        CliError::new(exit, "")
    }
}

/// A key that exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub value: Bytes,
    /// Its version (HLC); every door reports it.
    pub version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    Always,
    /// Only if absent.
    Nx,
    /// Only if absent or holding the same value.
    Nex,
    /// Only if present with exactly this version.
    IfVersion(String),
}

/// A SET as every door takes it.
#[derive(Debug, Clone)]
pub struct Write {
    pub key: Bytes,
    pub value: Bytes,
    pub condition: Condition,
    pub ttl: Option<Duration>,
    /// The TTL slides: every read pushes the deadline out again (needs `ttl`).
    pub sliding: bool,
    pub fencing: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOutcome {
    Applied {
        version: Option<String>,
    },
    /// NX/NEX not met: nothing changed.
    NotApplied,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelOutcome {
    Deleted,
    Absent,
    /// VDEL: the key holds another value.
    Mismatch,
}

/// One page of a scan; `token` is set when more pages follow.
#[derive(Debug, Clone, Default)]
pub struct ScanPage {
    pub keys: Vec<Bytes>,
    pub token: Option<Bytes>,
}

/// A change seen by `watch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Set {
        key: Bytes,
        value: Bytes,
        version: String,
    },
    Delete {
        key: Bytes,
        version: String,
    },
    /// Over MQTT an expiry arrives as a delete (KEYNOTIFY does not say why a key went away).
    Expire {
        key: Bytes,
        version: String,
    },
    /// The service ended the watch because the client fell behind.
    Overflow,
    /// The position `--since` named is gone from the service's history: the current value of
    /// every watched key follows (as `Set` events), then `Synced`.
    Reset,
    /// The values after a `Reset` are complete; `version` resumes from here.
    Synced {
        version: Option<String>,
    },
}

/// A live watch: its events, and what a door needs to end it.
pub struct Watch {
    pub events: mpsc::Receiver<Result<Event, CliError>>,
    /// Keys registered with KEYNOTIFY (MQTT), to stop on the way out.
    pub keys: Vec<Bytes>,
    pub task: Option<tokio::task::JoinHandle<()>>,
}

/// Events buffered between a door's reader and the printer.
pub const WATCH_BUFFER: usize = 4096;

/// One way into the service. Every method is bounded by the `--timeout` given at connection.
#[async_trait::async_trait]
pub trait Door: Send + Sync {
    async fn get(&self, key: &Bytes) -> Result<Option<Found>, CliError>;
    /// Every key as of one moment (MGET, a stategate extension over MQTT and gRPC).
    async fn mget(&self, _keys: &[Bytes]) -> Result<Vec<Option<Found>>, CliError> {
        Err(CliError::usage(
            "mget needs MQTT or --grpc: the Dapr HTTP API has no point-in-time read of several keys",
        ))
    }
    async fn set(&self, write: &Write) -> Result<SetOutcome, CliError>;
    async fn del(&self, key: &Bytes, if_version: Option<&str>, fencing: Option<&str>) -> Result<DelOutcome, CliError>;
    async fn vdel(&self, key: &Bytes, value: &Bytes, fencing: Option<&str>) -> Result<DelOutcome, CliError>;
    async fn scan_page(&self, pattern: &str, token: Option<Bytes>) -> Result<ScanPage, CliError>;
    /// Starts watching (after the change with version `since`, when given); returns once
    /// changes are being delivered.
    async fn watch(&self, keys: &[Bytes], patterns: &[String], since: Option<&str>) -> Result<Watch, CliError>;
    /// Ends a watch (MQTT: KEYNOTIFY STOP for each key).
    async fn unwatch(&self, watch: Watch) {
        if let Some(t) = watch.task {
            t.abort();
        }
    }
    /// Says goodbye to the service (MQTT: DISCONNECT).
    async fn close(&self) {}
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DoorKind {
    Mqtt,
    Http,
    Grpc,
}

fn door_kind(c: &ConnectArgs) -> DoorKind {
    match (&c.http, &c.grpc) {
        (Some(_), _) => DoorKind::Http,
        (None, Some(_)) => DoorKind::Grpc,
        (None, None) => DoorKind::Mqtt,
    }
}

async fn open(c: &ConnectArgs) -> Result<Box<dyn Door>, CliError> {
    Ok(match (&c.http, &c.grpc) {
        (Some(url), _) => Box::new(http::HttpDoor::new(url, c)?),
        (None, Some(url)) => Box::new(grpc::GrpcDoor::connect(url, c).await?),
        (None, None) => Box::new(mqtt::MqttDoor::connect(c).await?),
    })
}

/// Runs a client command; returns the process exit status.
pub fn run(cmd: ClientCommand) -> i32 {
    // One thread is plenty for one client, and leaves the cores to the service.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stategate: cannot start the runtime: {e}");
            return Exit::Unavailable as i32;
        }
    };
    runtime.block_on(execute(cmd))
}

fn output_of(o: &OutputArgs) -> Output {
    let format = match (o.json, o.raw) {
        (true, _) => Format::Json,
        (false, true) => Format::Raw,
        (false, false) => Format::Human,
    };
    Output {
        format,
        verbose: o.verbose,
    }
}

/// A version or fencing token from the command line, as the doors send it.
fn hlc_text(token: &Option<crate::hlc::Hlc>) -> Option<String> {
    token.as_ref().map(ToString::to_string)
}

/// A key from the command line: bytes, never empty.
fn key_of(arg: &std::ffi::OsString, what: &str) -> Result<Bytes, CliError> {
    let key = arg_bytes(arg);
    if key.is_empty() {
        return Err(CliError::usage(format!("the {what} must not be empty")));
    }
    Ok(Bytes::from(key))
}

/// Reads a value (up to [`MAX_INPUT_BYTES`]) before anything goes on the network.
fn read_value(source: ValueSource) -> Result<Bytes, CliError> {
    use std::io::Read;
    let (mut reader, what): (Box<dyn Read>, String) = match source {
        ValueSource::Arg(v) => return Ok(Bytes::from(v)),
        ValueSource::Stdin => (Box::new(std::io::stdin().lock()), "stdin".into()),
        ValueSource::File(path) => {
            let f = std::fs::File::open(&path)
                .map_err(|e| CliError::usage(format!("cannot open {}: {e}", path.display())))?;
            (Box::new(f), path.display().to_string())
        }
    };
    let mut buf = Vec::new();
    reader
        .by_ref()
        .take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| CliError::usage(format!("cannot read {what}: {e}")))?;
    if buf.len() as u64 > MAX_INPUT_BYTES {
        return Err(CliError::usage(format!(
            "the value in {what} is larger than {MAX_INPUT_BYTES} bytes"
        )));
    }
    Ok(Bytes::from(buf))
}

async fn execute(cmd: ClientCommand) -> i32 {
    let out = match &cmd {
        ClientCommand::Get(a) => output_of(&a.output),
        ClientCommand::Mget(a) => output_of(&a.output),
        ClientCommand::Set(a) => output_of(&a.output),
        ClientCommand::Del(a) => output_of(&a.output),
        ClientCommand::Vdel(a) => output_of(&a.output),
        ClientCommand::Scan(a) => output_of(&a.output),
        ClientCommand::Watch(a) => output_of(&a.output),
        ClientCommand::Lock(a) => output_of(&a.output),
        ClientCommand::Unlock(a) => output_of(&a.output),
        ClientCommand::Elect(a) => output_of(&a.output),
        ClientCommand::Export(_) | ClientCommand::Import(_) | ClientCommand::Backup(_) | ClientCommand::Rekey(_) => {
            Output {
                format: Format::Human,
                verbose: false,
            }
        }
    };
    match dispatch(cmd, out).await {
        Ok(code) => code,
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("stategate: {}", e.message);
            }
            e.exit as i32
        }
    }
}

/// Opens the door, runs `f`, closes the door whatever happened.
async fn with_door<T>(c: &ConnectArgs, f: impl AsyncFnOnce(&dyn Door) -> Result<T, CliError>) -> Result<T, CliError> {
    let door = open(c).await?;
    let result = f(door.as_ref()).await;
    door.close().await;
    result
}

fn status(found: bool) -> i32 {
    if found {
        Exit::Done as i32
    } else {
        Exit::NotFound as i32
    }
}

async fn dispatch(cmd: ClientCommand, out: Output) -> Result<i32, CliError> {
    match cmd {
        ClientCommand::Get(a) => {
            let key = key_of(&a.key, "key")?;
            let found = with_door(&a.connect, async |d| d.get(&key).await).await?;
            out.print(output::get(out.format, out.verbose, &key, found.as_ref()))?;
            Ok(status(found.is_some()))
        }
        ClientCommand::Mget(a) => {
            let keys = a.keys.iter().map(|k| key_of(k, "key")).collect::<Result<Vec<_>, _>>()?;
            let found = with_door(&a.connect, async |d| d.mget(&keys).await).await?;
            out.print(output::mget(out.format, out.verbose, &keys, &found))?;
            Ok(status(found.iter().all(Option::is_some)))
        }
        ClientCommand::Set(a) => {
            let key = key_of(&a.key, "key")?;
            let source = ValueSource::of(a.value.as_ref(), a.file.as_ref())
                .ok_or_else(|| CliError::usage("give a value, `-` for stdin, or --file"))?;
            let condition = match (&a.if_version, a.nx, a.nex) {
                (Some(v), _, _) => Condition::IfVersion(v.to_string()),
                (None, true, _) => Condition::Nx,
                (None, false, true) => Condition::Nex,
                (None, false, false) => Condition::Always,
            };
            if matches!(condition, Condition::IfVersion(_)) && door_kind(&a.connect) == DoorKind::Mqtt {
                return Err(no_version_condition_over_mqtt());
            }
            if a.sliding && a.ttl.is_none() && a.px.is_none() {
                return Err(CliError::usage(
                    "--sliding needs --ttl or --px: the time to live that slides",
                ));
            }
            let write = Write {
                key: key.clone(),
                value: read_value(source)?,
                condition,
                ttl: a.ttl.or(a.px.map(Duration::from_millis)),
                sliding: a.sliding,
                fencing: hlc_text(&a.fencing_token),
            };
            let outcome = with_door(&a.connect, async |d| d.set(&write).await).await?;
            out.print(output::set(out.format, out.verbose, &key, &outcome))?;
            Ok(status(outcome != SetOutcome::NotApplied))
        }
        ClientCommand::Del(a) => {
            let key = key_of(&a.key, "key")?;
            if a.if_version.is_some() && door_kind(&a.connect) == DoorKind::Mqtt {
                return Err(no_version_condition_over_mqtt());
            }
            let (if_version, ft) = (hlc_text(&a.if_version), hlc_text(&a.fencing_token));
            let outcome = with_door(&a.connect, async |d| {
                d.del(&key, if_version.as_deref(), ft.as_deref()).await
            })
            .await?;
            out.print(output::del(out.format, &key, outcome))?;
            Ok(status(outcome == DelOutcome::Deleted))
        }
        ClientCommand::Vdel(a) => {
            let key = key_of(&a.key, "key")?;
            let value = read_value(ValueSource::of(Some(&a.value), None).unwrap_or(ValueSource::Stdin))?;
            let ft = hlc_text(&a.fencing_token);
            let outcome = with_door(&a.connect, async |d| d.vdel(&key, &value, ft.as_deref()).await).await?;
            out.print(output::del(out.format, &key, outcome))?;
            Ok(status(outcome == DelOutcome::Deleted))
        }
        ClientCommand::Scan(a) => {
            with_door(&a.connect, async |d| scan(d, &a.pattern, out).await).await?;
            Ok(Exit::Done as i32)
        }
        ClientCommand::Watch(a) => {
            let keys = a.keys.iter().map(|k| key_of(k, "key")).collect::<Result<Vec<_>, _>>()?;
            if door_kind(&a.connect) == DoorKind::Mqtt && (keys.is_empty() || !a.pattern.is_empty()) {
                return Err(CliError::usage(
                    "over MQTT, watch needs named keys and no --pattern: the protocol notifies only keys \
                     registered one by one (KEYNOTIFY); use --http or --grpc to watch patterns or every key",
                ));
            }
            if door_kind(&a.connect) == DoorKind::Mqtt && a.since.is_some() {
                return Err(CliError::usage(
                    "--since needs --http or --grpc: MQTT notifications (KEYNOTIFY) keep no history to resume from",
                ));
            }
            let since = a.since.as_deref().map(str::trim).filter(|s| !s.is_empty());
            // Registered before the watch starts, so a signal is never lost once it is ready.
            let mut stop = lock::Signals::new()?;
            with_door(&a.connect, async |d| {
                watch(d, &keys, &a.pattern, since, out, &mut stop).await
            })
            .await
        }
        ClientCommand::Lock(a) => {
            let lease = lock::Lease {
                name: key_of(&a.name, "lock name")?,
                holder: key_of(&a.holder, "holder")?,
                ttl: a.ttl,
            };
            let mut signals = lock::Signals::new()?;
            with_door(&a.connect, async |d| {
                lock::lock(d, &lease, a.wait, &a.command, out, &mut signals).await
            })
            .await
        }
        ClientCommand::Unlock(a) => {
            let name = key_of(&a.name, "lock name")?;
            let holder = key_of(&a.holder, "holder")?;
            let outcome = with_door(&a.connect, async |d| d.vdel(&name, &holder, None).await).await?;
            out.print(output::unlocked(out.format, &name, outcome))?;
            Ok(status(outcome == DelOutcome::Deleted))
        }
        ClientCommand::Elect(a) => {
            let name = key_of(&a.name, "election name")?;
            if a.leader {
                return with_door(&a.connect, async |d| elect::print_leader(d, &name, out).await).await;
            }
            let holder = a.holder.as_ref().map(|h| key_of(h, "holder")).transpose()?;
            let lease = lock::Lease {
                name,
                holder: holder.ok_or_else(|| CliError::usage("--holder is required"))?,
                ttl: a.ttl,
            };
            let value = a.value.as_ref().map(|v| Bytes::from(args::arg_bytes(v)));
            let mut signals = lock::Signals::new()?;
            with_door(&a.connect, async |d| {
                elect::elect(d, &lease, value.as_ref(), a.wait, &a.command, out, &mut signals).await
            })
            .await
        }
        ClientCommand::Export(a) => transfer::export(a).await,
        ClientCommand::Import(a) => transfer::import(a).await,
        ClientCommand::Backup(a) => transfer::backup(a).await,
        ClientCommand::Rekey(a) => transfer::rekey(a),
    }
}

fn no_version_condition_over_mqtt() -> CliError {
    CliError::usage("--if-version needs --http or --grpc: the MQTT state store protocol has no version condition")
}

/// Prints every page as it arrives.
async fn scan(door: &dyn Door, pattern: &str, out: Output) -> Result<(), CliError> {
    let mut token: Option<Bytes> = None;
    loop {
        let page = door.scan_page(pattern, token.clone()).await?;
        out.print(output::scan_keys(out.format, &page.keys))?;
        match page.token {
            None => return Ok(()),
            // A service that hands back the token it was given with nothing in between would
            // make this loop forever.
            Some(t) if page.keys.is_empty() && token.as_ref() == Some(&t) => {
                return Err(CliError::unavailable(
                    "the scan made no progress (the same page token came back)",
                ));
            }
            Some(t) => token = Some(t),
        }
    }
}

/// Prints changes until SIGINT or SIGTERM (exit 0), or until the service ends the watch.
async fn watch(
    door: &dyn Door,
    keys: &[Bytes],
    patterns: &[String],
    since: Option<&str>,
    out: Output,
    stop: &mut lock::Signals,
) -> Result<i32, CliError> {
    let mut w = door.watch(keys, patterns, since).await?;
    out.progress(|| "watching (Ctrl-C to stop)".to_owned());
    // The last version printed that a resume can start from.
    let mut resume: Option<String> = since.map(str::to_owned);
    let result = loop {
        tokio::select! {
            _ = stop.recv() => break Ok(Exit::Done as i32),
            ev = w.events.recv() => match ev {
                Some(Ok(Event::Overflow)) => {
                    let _ = out.print(output::event(out.format, out.verbose, &Event::Overflow));
                    let how = match &resume {
                        Some(v) => format!("start it again with --since {v}"),
                        None => "start it again".to_owned(),
                    };
                    break Err(CliError::unavailable(format!("the watch fell behind and the service ended it; {how}")));
                }
                Some(Ok(e)) => {
                    match &e {
                        Event::Set { version, .. } | Event::Delete { version, .. } | Event::Expire { version, .. } => {
                            resume = Some(version.clone())
                        }
                        Event::Synced { version } => resume = version.clone(),
                        Event::Reset | Event::Overflow => {}
                    }
                    if let Err(e) = out.print(output::event(out.format, out.verbose, &e)) {
                        break Err(e);
                    }
                }
                Some(Err(e)) => break Err(e),
                None => break Err(CliError::unavailable("the watch ended: the connection to the service was lost")),
            },
        }
    };
    door.unwatch(w).await;
    result
}

/// `http://` is assumed when a URL has no scheme; only plain HTTP is supported so far.
fn base_url(url: &str, flag: &str) -> Result<String, CliError> {
    let url = url.trim();
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        ("https", rest)
    } else if url.contains("://") {
        return Err(CliError::usage(format!(
            "{flag} must be an http:// or https:// URL (got {url:?})"
        )));
    } else {
        ("http", url)
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.starts_with('/') {
        return Err(CliError::usage(format!("{flag} has no host (got {url:?})")));
    }
    Ok(format!("{scheme}://{rest}"))
}

/// The TLS client configuration of the HTTP and gRPC doors: servers verified against
/// `--ca-file`, or the system's trusted roots.
fn tls_client_config(c: &args::ConnectArgs, alpn: &[&[u8]]) -> Result<std::sync::Arc<rustls::ClientConfig>, CliError> {
    crate::tls::client_config(c.ca_file.as_deref(), alpn).map_err(|e| CliError::usage(format!("--ca-file: {e}")))
}

/// Whole milliseconds of a TTL, rounded up (a TTL is never shortened).
fn ttl_ms(ttl: Duration) -> u64 {
    let ms = ttl.as_millis();
    let ms = if !ttl.subsec_nanos().is_multiple_of(1_000_000) {
        ms + 1
    } else {
        ms
    };
    ms.clamp(1, u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_ttls() {
        assert_eq!(base_url("127.0.0.1:3500/", "--http").unwrap(), "http://127.0.0.1:3500");
        assert_eq!(base_url("http://h:1", "--http").unwrap(), "http://h:1");
        assert_eq!(base_url("https://h:1/", "--http").unwrap(), "https://h:1");
        assert_eq!(base_url("ftp://h", "--http").unwrap_err().exit, Exit::Usage);
        assert_eq!(base_url("http://", "--http").unwrap_err().exit, Exit::Usage);
        assert_eq!(ttl_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(ttl_ms(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_ms(Duration::from_secs(3)), 3000);
    }

    #[test]
    fn values_come_from_arguments_files_and_limits_hold() {
        assert_eq!(&read_value(ValueSource::Arg(b"x".to_vec())).unwrap()[..], b"x");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.bin");
        let bytes: Vec<u8> = (0..=255u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(&read_value(ValueSource::File(path)).unwrap()[..], &bytes[..]);
        let missing = read_value(ValueSource::File(dir.path().join("nope"))).unwrap_err();
        assert_eq!(missing.exit, Exit::Usage);
    }
}
