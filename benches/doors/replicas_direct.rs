//! The physical limit of the replicas section: the same operations sent straight to the same
//! redis-server, 64 in flight on one multiplexed connection (as one replica's backend sends
//! them): a plain GET and SET of 16-byte keys with 100-byte values, and what stategate's Redis
//! backend sends Redis for the same requests, built here as the backend builds them:
//!
//! - a GET is one `HMGET` of the record hash (`v ver ft exp sl`);
//! - a SET over MQTT is one `EVALSHA` of the backend's own swap script (`swap.lua`, included
//!   from the storage crate, not copied), with the version its record cache holds as the
//!   expected one (no read first), the change log entry (`XADD MAXLEN ~ 100000`, the default
//!   `--redis-change-log-len`) and the request's mark (`SET PX 60000`: its outcome, kept for a
//!   redelivery to another replica).
//!
//! What these rows leave out of a stategate row is every replica's reading of the change log
//! (`XREAD`), its clock and membership calls: the difference in Redis CPU per request between
//! the script row and a stategate row is theirs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, IntoConnectionInfo, Value};
use tokio::sync::Mutex;

use crate::bench_key;

/// The backend's conditional swap, byte for byte what a replica loads.
const SWAP: &str = include_str!("../../crates/storage/src/redis/swap.lua");
/// Its own prefix on the shared redis-server (the replicas use `bench1:`.. `bench3:`).
const PREFIX: &str = "direct:";
/// The keys of a row: `bench_key` wraps at 10,000.
const KEYS: usize = 10_000;
/// The default `--redis-change-log-len`, and how long a request's mark is kept, ms.
const LOG_LEN: &str = "100000";
const MARK_TTL_MS: &str = "60000";

/// What one request of a straight row sends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// `GET k` of a string.
    Get,
    /// `SET k v` of a string.
    Set,
    /// `HMGET r:k v ver ft exp sl`: stategate's GET.
    Hmget,
    /// `EVALSHA swap.lua`: stategate's SET.
    Swap,
}

impl Call {
    pub(super) fn label(self) -> &'static str {
        match self {
            Call::Get => "redis GET",
            Call::Set => "redis SET",
            Call::Hmget => "redis HMGET",
            Call::Swap => "redis swap.lua",
        }
    }
}

/// One connection to the shared redis-server, and what the swap rows need to succeed: the
/// version last written to each key (a swap names the one it replaces, as a replica's record
/// cache does), held while the key's swap runs, as the engine holds a key's lock across its
/// write: two requests on one key at once then wait for each other instead of one of them
/// failing the script's check, which would leave it cheaper than a write.
#[derive(Clone)]
pub(super) struct Direct {
    conn: MultiplexedConnection,
    sha: Arc<str>,
    versions: Arc<Vec<Mutex<String>>>,
    counter: Arc<AtomicU64>,
    origin: u64,
    /// Swaps refused (should not happen: one at a time per key) and calls that failed.
    conflicts: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
}

fn version(counter: u64) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{ms:020}:{counter:010}:bench-direct")
}

fn record(key: &[u8]) -> Vec<u8> {
    [PREFIX.as_bytes(), b"r:", key].concat()
}

impl Direct {
    /// Connects (TCP_NODELAY, as the backend does), loads the swap script and creates the
    /// keys: strings for GET/SET, records through the script for HMGET and the swaps.
    pub(super) async fn connect(port: u16) -> Option<Direct> {
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        let info = format!("redis://127.0.0.1:{port}")
            .into_connection_info()
            .ok()?
            .set_tcp_settings(tcp);
        let client = redis::Client::open(info).ok()?;
        // The default 500 ms answer bound is short for a shared 2-core machine under load.
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SWAP)
            .query_async(&mut conn)
            .await
            .ok()?;
        let direct = Direct {
            conn,
            sha: sha.into(),
            versions: Arc::new((0..KEYS).map(|_| Mutex::new(String::new())).collect()),
            counter: Arc::default(),
            origin: 0xbe4c,
            conflicts: Arc::default(),
            errors: Arc::default(),
        };
        let value = vec![b'v'; 100];
        let mut fill = tokio::task::JoinSet::new();
        for w in 0..64u64 {
            let (d, value) = (direct.clone(), value.clone());
            fill.spawn(async move {
                for i in (w..KEYS as u64).step_by(64) {
                    let mut c = d.conn.clone();
                    let set = redis::cmd("SET").arg(plain(i)).arg(&value).to_owned();
                    let _ = set.query_async::<Value>(&mut c).await;
                    d.call(Call::Swap, i, &value).await;
                }
            });
        }
        fill.join_all().await;
        Some(direct)
    }

    /// What should be zero: swaps refused, calls that failed.
    pub(super) fn print_failures(&self) {
        println!(
            "(swaps refused as conflicts: {}; failed calls: {})",
            self.conflicts.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed)
        );
    }

    /// Zeroes Redis's command statistics (`CONFIG RESETSTAT`).
    pub(super) async fn reset_stats(&self) {
        let _ = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<Value>(&mut self.conn.clone())
            .await;
    }

    /// Redis's command statistics since the last reset: (command, calls, µs inside it), the
    /// commands that scripts call counted too (their time is also their script's). This bench's
    /// own `INFO` and `CONFIG` calls are left out.
    pub(super) async fn command_stats(&self) -> Vec<(String, u64, u64)> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn.clone())
            .await
            .unwrap_or_default();
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, fields) = l.split_once(':')?;
                let field = |f: &str| {
                    fields
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                        .and_then(|v| v.parse::<u64>().ok())
                };
                Some((name.to_owned(), field("calls")?, field("usec")?))
            })
            .filter(|(name, _, _)| name != "info" && !name.starts_with("config"))
            .collect()
    }

    /// One request of `call` on key `i`.
    pub(super) async fn call(&self, call: Call, i: u64, value: &[u8]) {
        let key = bench_key(i);
        let cmd = match call {
            Call::Get => redis::cmd("GET").arg(plain(i)).to_owned(),
            Call::Set => redis::cmd("SET").arg(plain(i)).arg(value).to_owned(),
            Call::Hmget => redis::cmd("HMGET")
                .arg(record(&key))
                .arg(&["v", "ver", "ft", "exp", "sl"][..])
                .to_owned(),
            Call::Swap => return self.swap(i, &key, value).await,
        };
        if cmd.query_async::<Value>(&mut self.conn.clone()).await.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A SET as the backend writes it (`Shared::write` with one swap, one change and the
    /// request's mark).
    async fn swap(&self, i: u64, key: &[u8], value: &[u8]) {
        let mut stored = self.versions[i as usize % KEYS].lock().await;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let new = version(n);
        let names = ["keys", "deadlines", "maxver", "log", "logseq"].map(|s| format!("{PREFIX}{s}"));
        let mark = format!("{PREFIX}q:clients/bench-replicas-load/bench/response{n:016x}");
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&*self.sha).arg(8).arg(&names[..]).arg(&mark);
        cmd.arg(format!("{PREFIX}removedver")).arg(record(key));
        cmd.arg("")
            .arg(LOG_LEN)
            .arg("s")
            .arg(format!("S{new}"))
            .arg(MARK_TTL_MS);
        cmd.arg(self.origin).arg(format!("{:x}:{n:x}", self.origin));
        cmd.arg(1).arg(0).arg(1).arg("f");
        // The swap: key, expected version, put, value, version, no fencing token, no deadline,
        // no sliding time to live, no deadline check.
        cmd.arg(key).arg(&*stored).arg("p").arg(value).arg(&new);
        cmd.arg("").arg("").arg("").arg("");
        // The change: key, set, version, value, no deadline, no fencing token.
        cmd.arg(key).arg("s").arg(&new).arg(value).arg("").arg("");
        match cmd.query_async::<Vec<Value>>(&mut self.conn.clone()).await {
            Ok(reply) if matches!(reply.first(), Some(Value::Int(0))) => *stored = new,
            Ok(_) => {
                self.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn plain(i: u64) -> Vec<u8> {
    [PREFIX.as_bytes(), b"k:", &bench_key(i)].concat()
}
