//! The Redis/Valkey backend: records live in a Redis (or Valkey) server that every replica of
//! the service shares, so replicas see one store. Selected with `--storage redis://...`.
//!
//! # Layout
//!
//! Every Redis key of a store starts with `--redis-prefix` (`P`, default `stategate:`):
//!
//! ```text
//! P r:<key>     HASH  v = value, ver = version, ft = fencing token (absent: none),
//!                     exp = deadline in ms since the epoch (absent: none)
//! P keys        ZSET  every key, score 0: ZRANGE BYLEX pages through it in byte order
//! P deadlines   ZSET  the keys that have a deadline, score = deadline ms
//! P maxver      ZSET  one member, score 0: the highest version ever written
//! ```
//!
//! Versions and fencing tokens are stored as `{ms:020}:{counter:010}:{node}`
//! ([`codec::encode_version`]): equal versions have equal bytes, and byte order is HLC order.
//! The key count is `ZCARD P keys`.
//!
//! Why a sorted set and not Redis SCAN: SCAN walks hash buckets, so its order is not byte order
//! and its cursor is no stable paging token across replicas. Members of equal score are
//! ordered by `memcmp`, so `ZRANGE P keys (<after> + BYLEX LIMIT 0 n` gives exactly the pages
//! of the other backends. Redis key expiry and keyspace notifications are not used: the
//! engine's expiry driver finds due keys in `P deadlines` and removes them through the swap,
//! like any delete, so a removal is versioned, fenced and published as on the other backends.
//!
//! # Calls and round trips
//!
//! - `get`: one `HMGET`.
//! - `swap_many`: one `EVALSHA` of `redis/swap.lua` (compare every expected version, check the
//!   key limit, then write records, index, deadlines and highest version; all or nothing). On
//!   `NOSCRIPT` (a restarted or flushed server) the script is loaded and the call repeated.
//!   With `--redis-wait-replicas N`, `WAIT` travels in the same pipeline (still one round trip).
//! - `scan`: one `EVALSHA` of `redis/scan.lua` (a page of the index plus the deadlines).
//! - `expired`: two (the due keys, then their versions); `next_deadline`, `len`,
//!   `max_version`: one each.
//!
//! # Failures
//!
//! Every call is bounded by `--redis-timeout-ms`; a call that cannot reach Redis in time, or
//! that Redis refuses for a passing reason (loading, busy, read-only replica), fails with
//! [`StorageError::Unavailable`]; out of memory is [`StorageError::Full`]. After an
//! unavailable call the next one uses a fresh connection manager, so no connection stays
//! stuck. A write whose answer was lost (sent, then the connection dropped) may have been
//! applied: the error says so, as any lost answer would.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{TcpSettings, socket2};
use redis::{Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, Script, ServerErrorKind, Value};

use super::log::ChangeLog;
use super::{
    Backend, ChangeRecordKind, KeyPage, Record, RedisOptions, RedisUrl, StorageError, Swap, SwapOutcome, Write, Written,
};
use crate::hlc::Hlc;

mod codec;
mod log;

use codec::{Names, RECORD_FIELDS, decode_record, decode_version, encode_deadline, encode_version, score_ms};

/// A Lua script and its SHA1 (for EVALSHA).
struct LuaScript {
    code: &'static str,
    script: Script,
}

impl LuaScript {
    fn new(code: &'static str) -> LuaScript {
        LuaScript {
            code,
            script: Script::new(code),
        }
    }

    fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.code);
        cmd
    }

    fn evalsha(&self, keys: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(keys.len()).arg(keys);
        cmd
    }
}

/// The Redis/Valkey backend. Cheap to share: one multiplexed connection for all callers.
pub struct RedisBackend(Arc<Shared>);

impl std::ops::Deref for RedisBackend {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What the backend and its change log share: the connection, the names, the scripts.
pub struct Shared {
    url: RedisUrl,
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    /// The connection in use, replaced after a call fails as unavailable (see
    /// [`RedisBackend::connection`]).
    connection: RwLock<Arc<Connection>>,
    names: Names,
    timeout: Duration,
    wait_replicas: u32,
    swap: LuaScript,
    scan: LuaScript,
    observe: LuaScript,
    start: LuaScript,
    seen_script: LuaScript,
    /// Approximate most entries the change log keeps (`--redis-change-log-len`).
    log_len: u64,
    /// This process's id in the change log.
    origin: u64,
    /// Numbers the calls that append to the log (their entries' unique tags).
    calls: std::sync::atomic::AtomicU64,
    /// The connection the change log is read on (blocking reads must not hold up the others).
    reader: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
}

struct Connection {
    manager: ConnectionManager,
    /// Counts replacements, so that many calls timing out together replace it once.
    generation: u64,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("url", &self.url).finish()
    }
}

impl RedisBackend {
    /// Connects, waits until Redis answers (up to `options.startup_wait`) and loads the scripts.
    pub async fn open(url: &RedisUrl, options: &RedisOptions) -> Result<RedisBackend, StorageError> {
        if url.is_tls() {
            install_crypto_provider();
        }
        let info = url.expose().into_connection_info().map_err(|e| {
            // The parser's message can quote the URL: name the URL ourselves, password hidden.
            StorageError::Backend(format!(
                "{url} is not a redis URL (redis://[user:password@]host:port[/db] or rediss://...): {:?}",
                e.kind()
            ))
        })?;
        let info = info.set_tcp_settings(tcp_settings(options.timeout));
        let client = redis::Client::open(info).map_err(|e| StorageError::Backend(format!("{url}: {e}")))?;
        // The manager's own bounds are the same as ours; it retries a lost connection a few
        // times in the background, and we replace it after a failure (see `connection`).
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(options.timeout)
            .set_number_of_retries(4);
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
            .map_err(|e| StorageError::Backend(format!("{url}: {e}")))?;
        let backend = Shared {
            url: url.clone(),
            client,
            manager_config,
            connection: RwLock::new(Arc::new(Connection { manager, generation: 0 })),
            names: Names::new(&options.prefix),
            timeout: options.timeout,
            wait_replicas: options.wait_replicas,
            swap: LuaScript::new(include_str!("redis/swap.lua")),
            scan: LuaScript::new(include_str!("redis/scan.lua")),
            observe: LuaScript::new(include_str!("redis/observe.lua")),
            start: LuaScript::new(include_str!("redis/start.lua")),
            seen_script: LuaScript::new(log::SEEN_SCRIPT),
            log_len: options.change_log_len.max(1),
            origin: log::random_origin(),
            calls: Default::default(),
            reader: Default::default(),
        };
        backend.wait_until_ready(options.startup_wait).await?;
        backend.refuse_cluster().await?;
        for script in [
            &backend.swap,
            &backend.scan,
            &backend.observe,
            &backend.start,
            &backend.seen_script,
        ] {
            backend.query::<String>(&script.load()).await.map_err(|e| match e {
                StorageError::Backend(m) => StorageError::Backend(format!(
                    "loading a script into {url} failed (stategate needs Redis 7 or Valkey 7.2 or later): {m}"
                )),
                other => other,
            })?;
        }
        Ok(RedisBackend(Arc::new(backend)))
    }
}

impl Shared {
    /// PINGs until Redis answers: the doors open only once the storage works.
    async fn wait_until_ready(&self, patience: Duration) -> Result<(), StorageError> {
        let give_up = Instant::now() + patience;
        loop {
            let error = match self.query::<String>(&redis::cmd("PING")).await {
                Ok(_) => return Ok(()),
                Err(StorageError::Unavailable(why)) => why,
                Err(other) => return Err(other),
            };
            let now = Instant::now();
            if now >= give_up {
                return Err(StorageError::Unavailable(format!(
                    "{} did not answer within {patience:?}: {error}",
                    self.url
                )));
            }
            tracing::warn!(url = %self.url, cause = %error, "waiting for redis");
            tokio::time::sleep((give_up - now).min(Duration::from_millis(500))).await;
        }
    }

    /// The connection to use. A call that fails as unavailable (timed out, refused, loading,
    /// read-only...) replaces it, once per generation however many calls fail together: a
    /// manager can stay stuck on a connection that died silently, or on a reconnection that
    /// failed in a way it does not retry (a server still loading), and after a failover only a
    /// new connection reaches the new primary. A fresh manager connects on its first call.
    fn connection(&self) -> Arc<Connection> {
        self.connection.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace_connection(&self, failed: u64) {
        let mut current = self.connection.write().unwrap_or_else(|e| e.into_inner());
        if current.generation != failed {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.manager_config.clone()) {
            Ok(manager) => {
                tracing::debug!(url = %self.url, generation = failed + 1, "new redis connection manager");
                *current = Arc::new(Connection {
                    manager,
                    generation: failed + 1,
                });
            }
            Err(e) => tracing::error!(url = %self.url, cause = %e, "cannot create a redis connection"),
        }
    }

    /// Runs `call` on the current connection within the timeout.
    async fn bounded<T, F, Fut>(&self, call: F) -> Result<T, StorageError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, StorageError>>,
    {
        let connection = self.connection();
        let result = match tokio::time::timeout(self.timeout, call(connection.manager.clone())).await {
            Ok(result) => result,
            Err(_) => Err(StorageError::Unavailable(format!(
                "no answer from redis within {:?}",
                self.timeout
            ))),
        };
        if let Err(StorageError::Unavailable(_)) = &result {
            self.replace_connection(connection.generation);
        }
        result
    }

    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, StorageError> {
        self.bounded(|mut c| async move { cmd.query_async(&mut c).await.map_err(storage_error) })
            .await
    }

    /// Runs a pipeline whose first command is `EVALSHA` of `script`; on `NOSCRIPT` loads the
    /// script and runs it again (one bound for the whole exchange). Returns every reply.
    async fn eval_pipeline(&self, script: &LuaScript, pipe: &redis::Pipeline) -> Result<Vec<Value>, StorageError> {
        self.bounded(|mut c| async move {
            match pipe.query_async::<Vec<Value>>(&mut c).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script
                        .load()
                        .query_async::<String>(&mut c)
                        .await
                        .map_err(storage_error)?;
                    pipe.query_async(&mut c).await.map_err(storage_error)
                }
                other => other.map_err(storage_error),
            }
        })
        .await
    }
}

#[async_trait]
impl Backend for RedisBackend {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.names.record(key)).arg(&RECORD_FIELDS[..]);
        decode_record(self.query(&cmd).await?)
    }

    async fn get_marked(
        &self,
        key: &[u8],
        request: Option<&[u8]>,
    ) -> Result<(Option<Record>, Option<Bytes>), StorageError> {
        let Some(id) = request else {
            return Ok((self.get(key).await?, None));
        };
        // One round trip: the record and the request's mark.
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET").arg(self.names.record(key)).arg(&RECORD_FIELDS[..]);
        pipe.cmd("GET").arg(self.names.mark(id));
        let (fields, mark): (Vec<Option<Bytes>>, Option<Bytes>) = self
            .bounded(|mut c| async move { pipe.query_async(&mut c).await.map_err(storage_error) })
            .await?;
        Ok((decode_record(fields)?, mark))
    }

    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        let w = Write {
            swaps,
            max_keys,
            changes: &[],
            request: None,
        };
        Ok(match self.write(&w).await? {
            Written::Done { .. } => SwapOutcome::Done,
            Written::Conflict => SwapOutcome::Conflict,
            Written::TooManyKeys => SwapOutcome::TooManyKeys,
            Written::Repeated(_) => {
                return Err(StorageError::Backend(
                    "a swap without a request was taken for a repeat".into(),
                ));
            }
        })
    }

    async fn write(&self, w: &Write<'_>) -> Result<Written, StorageError> {
        if w.swaps.is_empty() {
            return Ok(Written::Done { logged: None });
        }
        let records: Vec<Vec<u8>> = w.swaps.iter().map(|s| self.names.record(&s.key)).collect();
        let mark = self.names.mark(w.request.map_or(&b""[..], |r| &r.id[..]));
        let mut keys: Vec<&[u8]> = vec![
            &self.names.index,
            &self.names.deadlines,
            &self.names.max_version,
            &self.names.log,
            &self.names.log_seq,
            &mark,
        ];
        keys.extend(records.iter().map(Vec::as_slice));
        let mut eval = self.swap.evalsha(&keys);
        let logged = !w.changes.is_empty();
        eval.arg(w.max_keys.map(|m| m.to_string()).unwrap_or_default())
            .arg(if logged {
                self.log_len.to_string()
            } else {
                String::new()
            });
        match w.request {
            Some(r) => eval.arg(&r.outcome[..]).arg(r.ttl_ms.max(1)),
            None => eval.arg("").arg(""),
        };
        eval.arg(self.origin).arg(self.call_tag()).arg(w.changes.len());
        for s in w.swaps {
            let expected = s.expected.as_ref().map(encode_version).unwrap_or_default();
            eval.arg(&s.key[..]).arg(expected);
            match &s.new {
                Some(r) => eval
                    .arg("p")
                    .arg(&r.value[..])
                    .arg(encode_version(&r.version))
                    .arg(r.fencing.as_ref().map(encode_version).unwrap_or_default())
                    .arg(r.expires_at_ms.map(encode_deadline).unwrap_or_default()),
                None => eval.arg("d").arg("").arg("").arg("").arg(""),
            };
        }
        for c in w.changes {
            eval.arg(&c.key[..]);
            match &c.kind {
                ChangeRecordKind::Set { value, expires_at_ms } => eval
                    .arg("s")
                    .arg(encode_version(&c.version))
                    .arg(&value[..])
                    .arg(expires_at_ms.map(encode_deadline).unwrap_or_default()),
                ChangeRecordKind::Delete => eval.arg("d").arg(encode_version(&c.version)).arg("").arg(""),
                ChangeRecordKind::Expire => eval.arg("e").arg(encode_version(&c.version)).arg("").arg(""),
            };
        }
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        if self.wait_replicas > 0 {
            // WAIT must answer before our own bound does: give it half.
            let wait_ms = (self.timeout.as_millis() / 2).max(1) as u64;
            pipe.cmd("WAIT").arg(self.wait_replicas).arg(wait_ms);
        }
        let replies = self.eval_pipeline(&self.swap, &pipe).await.map_err(|e| match e {
            StorageError::Unavailable(m) => StorageError::Unavailable(format!(
                "{m} (a write sent before the connection failed may have been applied)"
            )),
            other => other,
        })?;
        let mut replies = replies.into_iter();
        let answer: Result<(i64, Option<Value>), _> = match replies.next().map(Vec::<Value>::from_redis_value) {
            Some(Ok(v)) => {
                let mut v = v.into_iter();
                match v.next().map(i64::from_redis_value) {
                    Some(Ok(code)) => Ok((code, v.next())),
                    other => Err(format!("{other:?}")),
                }
            }
            other => Err(format!("{other:?}")),
        };
        let written = match answer {
            Ok((0, seq)) => Written::Done {
                logged: match seq.map(u64::from_redis_value) {
                    Some(Ok(0)) | None => None,
                    Some(Ok(n)) => Some(n),
                    Some(Err(e)) => return Err(StorageError::Backend(format!("the swap script answered {e}"))),
                },
            },
            Ok((1, _)) => return Ok(Written::Conflict),
            Ok((2, _)) => return Ok(Written::TooManyKeys),
            Ok((3, Some(outcome))) => {
                return Bytes::from_redis_value(outcome)
                    .map(Written::Repeated)
                    .map_err(|e| StorageError::Backend(format!("the swap script answered {e}")));
            }
            other => return Err(StorageError::Backend(format!("the swap script answered {other:?}"))),
        };
        if self.wait_replicas > 0 {
            let acked = replies.next().map(i64::from_redis_value);
            match acked {
                Some(Ok(n)) if n >= i64::from(self.wait_replicas) => {}
                Some(Ok(n)) => {
                    return Err(StorageError::Unavailable(format!(
                        "the write is on the primary but only {n} of {} replicas confirmed it in time; a failover may lose it",
                        self.wait_replicas
                    )));
                }
                other => return Err(StorageError::Backend(format!("WAIT answered {other:?}"))),
            }
        }
        Ok(written)
    }

    fn change_log(&self) -> Option<Arc<dyn ChangeLog>> {
        Some(Arc::new(log::RedisLog(self.0.clone())))
    }

    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError> {
        let lower = match after {
            Some(a) => [&b"("[..], a].concat(),
            None => b"-".to_vec(),
        };
        // One key past the page tells whether more follow.
        let ask = examine.min(i64::MAX as usize - 1) + 1;
        let mut eval = self.scan.evalsha(&[&self.names.index, &self.names.deadlines]);
        eval.arg(lower).arg(ask);
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        let reply = self.eval_pipeline(&self.scan, &pipe).await?;
        let (keys, deadlines): (Vec<Bytes>, Vec<Option<f64>>) = reply
            .into_iter()
            .next()
            .map(FromRedisValue::from_redis_value)
            .transpose()
            .map_err(|e| StorageError::Backend(format!("the scan script answered: {e}")))?
            .unwrap_or_default();
        if deadlines.len() != keys.len() {
            return Err(StorageError::Backend("the scan script answered unequal lists".into()));
        }
        let more = keys.len() > examine;
        let mut page = KeyPage::default();
        for (key, deadline) in keys.iter().zip(deadlines).take(examine) {
            let expired = deadline.is_some_and(|d| score_ms(d) <= now_ms);
            if !expired && keep(key) {
                page.keys.push(key.clone());
            }
        }
        if more && examine > 0 {
            page.resume_after = keys.get(examine - 1).cloned();
        }
        Ok(page)
    }

    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut due = redis::cmd("ZRANGE");
        due.arg(&self.names.deadlines)
            .arg("-inf")
            .arg(now_ms)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit.min(i64::MAX as usize));
        let keys: Vec<Bytes> = self.query(&due).await?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut versions = redis::pipe();
        for key in &keys {
            versions.cmd("HGET").arg(self.names.record(key)).arg("ver");
        }
        let versions: Vec<Option<Bytes>> = self
            .bounded(|mut c| async move { versions.query_async(&mut c).await.map_err(storage_error) })
            .await?;
        let mut out = Vec::with_capacity(keys.len());
        // A key deleted between the two calls is simply not listed.
        for (key, version) in keys.into_iter().zip(versions) {
            if let Some(v) = version {
                out.push((key, decode_version(&v)?));
            }
        }
        Ok(out)
    }

    async fn next_deadline(&self) -> Result<Option<u64>, StorageError> {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(&self.names.deadlines).arg(0).arg(0).arg("WITHSCORES");
        let first: Vec<(Bytes, f64)> = self.query(&cmd).await?;
        Ok(first.first().map(|(_, score)| score_ms(*score)))
    }

    async fn len(&self) -> Result<u64, StorageError> {
        self.query(redis::cmd("ZCARD").arg(&self.names.index)).await
    }

    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(&self.names.max_version).arg(-1).arg(-1);
        let highest: Vec<Bytes> = self.query(&cmd).await?;
        highest.first().map(|v| decode_version(v)).transpose()
    }
}

/// TCP_NODELAY (requests are small and latency-bound; redis 1.x leaves Nagle on), and a dead
/// peer noticed by the kernel: unacknowledged data or unanswered keepalives for longer than
/// the call bound (at least 1 s, so ordinary retransmissions do not count) close the socket,
/// which makes the connection manager reconnect.
fn tcp_settings(timeout: Duration) -> TcpSettings {
    let patience = timeout.max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new().with_time(patience).with_interval(patience);
    let settings = TcpSettings::default().set_nodelay(true).set_keepalive(keepalive);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(patience);
    settings
}

/// `rediss://` needs a rustls crypto provider; use ring (already built for the embedded
/// broker) unless the process chose one.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one first; either way one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A Redis failure as a storage error: what passes by itself (no connection, a server that is
/// loading, busy, read-only during a failover) is `Unavailable`; out of memory is `Full`;
/// anything else is a fault.
fn storage_error(e: RedisError) -> StorageError {
    // A pipeline's error carries the server's code inside: look there too.
    let code = e.code().map(str::to_owned).or_else(|| {
        e.clone()
            .into_server_errors()
            .and_then(|errors| errors.first().map(|(_, error)| error.code().to_owned()))
    });
    let passing = match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => true,
        _ => matches!(code.as_deref(), Some("BUSY" | "NOREPLICAS")),
    };
    if passing {
        StorageError::Unavailable(e.to_string())
    } else if code.as_deref() == Some("OOM") {
        StorageError::Full(e.to_string())
    } else {
        StorageError::Backend(e.to_string())
    }
}

#[cfg(test)]
pub(crate) mod server;
#[cfg(test)]
mod tests;
