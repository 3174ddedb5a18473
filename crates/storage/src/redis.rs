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
//! P removedver  ZSET  one member, score 0: the highest version issued for a removal (a key
//!                     created later gets a version above it, whichever replica creates it)
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
//! - `swap_many`: one `EVALSHA` of `redis/swap.lua` (compare every expected version and
//!   deadline check, check the key limit, then write records, index, deadlines and highest
//!   version; all or nothing). On
//!   `NOSCRIPT` (a restarted or flushed server) the script is loaded and the call repeated.
//!   With `--redis-wait-replicas N`, `WAIT` travels in the same pipeline (still one round trip).
//! - `scan`: one `EVALSHA` of `redis/scan.lua` (a page of the index plus the deadlines).
//! - `get_many`: one `EVALSHA` of `redis/mget.lua` (the records, if their values fit).
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use redis::aio::ConnectionManagerConfig;
use redis::{Cmd, FromRedisValue, Script, Value};

use super::log::ChangeLog;
use super::{
    Backend, ChangeRecord, ChangeRecordKind, DeadlineCheck, KeyPage, Record, RedisOptions, RedisUrl, RoundTrips,
    StorageError, Swap, SwapOutcome, Write, Written,
};
use crate::hlc::Hlc;

mod clock;
mod codec;
mod connection;
mod log;

pub use clock::ServerClock;

use codec::{Names, RECORD_FIELDS, decode_record, decode_version, encode_deadline, encode_version, score_ms};
use connection::{Counters, Purpose, Slot, Target, storage_error};

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
    target: Target,
    manager_config: ConnectionManagerConfig,
    /// The connection in use (see [`Shared::connection`]).
    slot: Slot,
    counters: Counters,
    names: Names,
    timeout: Duration,
    wait_replicas: u32,
    swap: LuaScript,
    scan: LuaScript,
    mget: LuaScript,
    observe: LuaScript,
    start: LuaScript,
    seen_script: LuaScript,
    members: LuaScript,
    /// Approximate most entries the change log keeps (`--redis-change-log-len`).
    log_len: u64,
    /// This process's id in the change log.
    origin: u64,
    /// Numbers the calls that append to the log (their entries' unique tags).
    tags: std::sync::atomic::AtomicU64,
    /// A replica that has not renewed its membership for this long is dropped.
    member_timeout: Duration,
    /// Whether this process has joined the members yet: its first join takes over the
    /// membership of an earlier process of the same node (`redis/members.lua`).
    joined: std::sync::atomic::AtomicBool,
    /// The connection the change log is read on (blocking reads must not hold up the others),
    /// with the generation of the main connection it was made for.
    reader: tokio::sync::Mutex<Option<(redis::aio::MultiplexedConnection, u64)>>,
    /// The server's time, which every replica takes its versions and deadlines from.
    clock: Arc<ServerClock>,
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
            connection::install_crypto_provider();
        }
        let target = Target::new(url, connection::tcp_settings(options.timeout))?;
        let backend = Shared {
            url: url.clone(),
            target,
            manager_config: connection::manager_config(options.timeout),
            slot: Slot::default(),
            counters: Counters::default(),
            names: Names::new(&options.prefix),
            timeout: options.timeout,
            wait_replicas: options.wait_replicas,
            swap: LuaScript::new(include_str!("redis/swap.lua")),
            scan: LuaScript::new(include_str!("redis/scan.lua")),
            mget: LuaScript::new(include_str!("redis/mget.lua")),
            observe: LuaScript::new(include_str!("redis/observe.lua")),
            start: LuaScript::new(include_str!("redis/start.lua")),
            seen_script: LuaScript::new(log::SEEN_SCRIPT),
            members: LuaScript::new(include_str!("redis/members.lua")),
            log_len: options.change_log_len.max(1),
            origin: log::random_origin(),
            tags: Default::default(),
            member_timeout: options.member_timeout,
            joined: Default::default(),
            reader: Default::default(),
            clock: Arc::new(ServerClock::new(0, Instant::now())),
        };
        backend.wait_until_ready(options.startup_wait).await?;
        backend.refuse_cluster().await?;
        let (server_ms, sent, answered) = clock::read(&backend).await?;
        backend
            .clock
            .set(server_ms, sent + answered.saturating_duration_since(sent) / 2);
        for script in [
            &backend.swap,
            &backend.scan,
            &backend.observe,
            &backend.start,
            &backend.seen_script,
            &backend.members,
        ] {
            backend
                .query::<String>(Purpose::Background, &script.load())
                .await
                .map_err(|e| match e {
                    StorageError::Backend(m) => StorageError::Backend(format!(
                        "loading a script into {url} failed (stategate needs Redis 7 or Valkey 7.2 or later): {m}"
                    )),
                    other => other,
                })?;
        }
        let backend = Arc::new(backend);
        tokio::spawn(clock::refresh(Arc::downgrade(&backend), backend.clock.clone()));
        if url.is_sentinel() {
            let every = options
                .timeout
                .clamp(Duration::from_millis(100), Duration::from_secs(1));
            tokio::spawn(Shared::watch_primary(Arc::downgrade(&backend), every));
        }
        Ok(RedisBackend(backend))
    }
}

impl Shared {
    /// How long `WAIT` may take: half the call bound, so that it answers before the bound does.
    fn wait_ms(&self) -> u64 {
        (self.timeout.as_millis() / 2).max(1) as u64
    }

    /// With `--redis-wait-replicas N`, ends a read's pipeline with a write and `WAIT N`: the
    /// write's place in the replication stream is after everything the read saw, so once `N`
    /// replicas have it they have every write the read saw. Without it a read (or a watcher)
    /// could see a write that its replica never received (its writer got 503) and that a
    /// failover then drops: the fault tests saw a read return a value that later reads, after
    /// the failover, did not have. Whether the barrier was added.
    pub(super) fn barrier(&self, pipe: &mut redis::Pipeline) -> bool {
        if self.wait_replicas == 0 {
            return false;
        }
        pipe.cmd("INCR").arg(&self.names.read_barrier);
        pipe.cmd("WAIT").arg(self.wait_replicas).arg(self.wait_ms());
        true
    }

    /// Runs a read's pipeline, ended by the barrier, and answers its replies once it passed.
    async fn read(&self, mut pipe: redis::Pipeline) -> Result<Vec<Value>, StorageError> {
        let barrier = self.barrier(&mut pipe);
        let mut replies: Vec<Value> = self
            .bounded(Purpose::Call, |mut c| async move {
                pipe.query_async(&mut c).await.map_err(storage_error)
            })
            .await?;
        self.passed(barrier, &mut replies)?;
        Ok(replies)
    }

    /// Takes the barrier's two replies off the end of `replies`: an error if fewer than `N`
    /// replicas confirmed in time (the read's answer must not be used).
    pub(super) fn passed(&self, barrier: bool, replies: &mut Vec<Value>) -> Result<(), StorageError> {
        if !barrier {
            return Ok(());
        }
        let acked = replies.pop().map(i64::from_redis_value);
        replies.pop();
        match acked {
            Some(Ok(n)) if n >= i64::from(self.wait_replicas) => Ok(()),
            Some(Ok(n)) => Err(StorageError::Unavailable(format!(
                "only {n} of {} replicas confirmed what a read saw in time",
                self.wait_replicas
            ))),
            other => Err(StorageError::Backend(format!("WAIT answered {other:?}"))),
        }
    }

    /// PINGs until Redis answers: the doors open only once the storage works.
    async fn wait_until_ready(&self, patience: Duration) -> Result<(), StorageError> {
        let give_up = Instant::now() + patience;
        loop {
            let error = match self.query::<String>(Purpose::Background, &redis::cmd("PING")).await {
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
}

#[async_trait]
impl Backend for RedisBackend {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET").arg(self.names.record(key)).arg(&RECORD_FIELDS[..]);
        let replies = self.read(pipe).await?;
        let fields = replies
            .into_iter()
            .next()
            .map(FromRedisValue::from_redis_value)
            .transpose();
        decode_record(
            fields
                .map_err(|e| StorageError::Backend(format!("HMGET answered {e}")))?
                .unwrap_or_default(),
        )
    }

    async fn get_many(
        &self,
        keys: &[Bytes],
        max_value_bytes: usize,
    ) -> Result<Option<Vec<Option<Record>>>, StorageError> {
        if keys.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let records: Vec<Vec<u8>> = keys.iter().map(|k| self.names.record(k)).collect();
        let names: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let mut eval = self.mget.evalsha(&names);
        eval.arg(max_value_bytes);
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        let barrier = self.barrier(&mut pipe);
        let mut reply = self.eval_pipeline(Purpose::Call, &self.mget, &pipe).await?;
        self.passed(barrier, &mut reply)?;
        let bad = |e: String| StorageError::Backend(format!("the mget script answered: {e}"));
        let reply = reply.into_iter().next().ok_or_else(|| bad("nothing".into()))?;
        if matches!(reply, redis::Value::Int(0)) {
            return Ok(None);
        }
        let fields: Vec<Vec<Option<Bytes>>> =
            FromRedisValue::from_redis_value(reply).map_err(|e| bad(e.to_string()))?;
        if fields.len() != keys.len() {
            return Err(bad(format!("{} records for {} keys", fields.len(), keys.len())));
        }
        fields
            .into_iter()
            .map(decode_record)
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
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
        let replies = self.read(pipe).await?;
        let (fields, mark): (Vec<Option<Bytes>>, Option<Bytes>) =
            FromRedisValue::from_redis_value(Value::Array(replies))
                .map_err(|e| StorageError::Backend(format!("HMGET and GET answered {e}")))?;
        Ok((decode_record(fields)?, mark))
    }

    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        let w = Write {
            swaps,
            checks: &[],
            max_keys,
            changes: &[],
            request: None,
        };
        Ok(match self.write(&w).await? {
            Written::Done { .. } => SwapOutcome::Done,
            // A swap without changes removes nothing the floor counts; a caller of this
            // method reads again, with its clock past the stored versions.
            Written::Conflict | Written::Behind(_) => SwapOutcome::Conflict,
            Written::TooManyKeys => SwapOutcome::TooManyKeys,
            Written::Repeated(_) => {
                return Err(StorageError::Backend(
                    "a swap without a request was taken for a repeat".into(),
                ));
            }
        })
    }

    async fn write(&self, w: &Write<'_>) -> Result<Written, StorageError> {
        if w.swaps.is_empty() && w.checks.is_empty() {
            return Ok(Written::Done { logged: None });
        }
        let records: Vec<Vec<u8>> = (w.swaps.iter().map(|s| &s.key))
            .chain(w.checks.iter().map(|c| &c.key))
            .map(|k| self.names.record(k))
            .collect();
        let mark = self.names.mark(w.request.map_or(&b""[..], |r| &r.id[..]));
        let mut keys: Vec<&[u8]> = vec![
            &self.names.index,
            &self.names.deadlines,
            &self.names.max_version,
            &self.names.log,
            &self.names.log_seq,
            &mark,
            &self.names.removed_version,
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
            Some(r) if r.outcome.is_empty() => eval.arg("c").arg("").arg(""),
            Some(r) => eval.arg("s").arg(&r.outcome[..]).arg(r.ttl_ms.max(1)),
            None => eval.arg("").arg("").arg(""),
        };
        eval.arg(self.origin)
            .arg(self.call_tag())
            .arg(w.swaps.len())
            .arg(w.checks.len())
            .arg(w.changes.len())
            // An import keeps the versions it was exported with; every other write issued its
            // versions now, and a key it creates must get one above every removal's.
            .arg(if w.changes.iter().any(ChangeRecord::imported) {
                ""
            } else {
                "f"
            });
        for s in w.swaps {
            let expected = s.expected.as_ref().map(encode_version).unwrap_or_default();
            eval.arg(&s.key[..]).arg(expected);
            match &s.new {
                Some(r) => eval
                    .arg("p")
                    .arg(&r.value[..])
                    .arg(encode_version(&r.version))
                    .arg(r.fencing.as_ref().map(encode_version).unwrap_or_default())
                    .arg(r.expires_at_ms.map(encode_deadline).unwrap_or_default())
                    .arg(r.slide_ms.map(encode_deadline).unwrap_or_default()),
                None => eval.arg("d").arg("").arg("").arg("").arg("").arg(""),
            };
            match s.deadline {
                DeadlineCheck::Any => eval.arg(""),
                DeadlineCheck::Later => eval.arg("l"),
                DeadlineCheck::Still(d) => eval.arg(format!("={}", encode_deadline(d))),
            };
        }
        for c in w.checks {
            eval.arg(c.expected.as_ref().map(encode_version).unwrap_or_default());
        }
        for c in w.changes {
            eval.arg(&c.key[..]);
            match &c.kind {
                ChangeRecordKind::Set {
                    value,
                    expires_at_ms,
                    fencing,
                    imported,
                } => eval
                    .arg(if *imported { "i" } else { "s" })
                    .arg(encode_version(&c.version))
                    .arg(&value[..])
                    .arg(expires_at_ms.map(encode_deadline).unwrap_or_default())
                    .arg(fencing.as_ref().map(encode_version).unwrap_or_default()),
                ChangeRecordKind::Delete => eval.arg("d").arg(encode_version(&c.version)).arg("").arg("").arg(""),
                ChangeRecordKind::Expire => eval.arg("e").arg(encode_version(&c.version)).arg("").arg("").arg(""),
            };
        }
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        // Only a write needs WAIT; a confirmation changed nothing.
        let wait = self.wait_replicas > 0 && !w.swaps.is_empty();
        if wait {
            // WAIT must answer before our own bound does: give it half.
            pipe.cmd("WAIT").arg(self.wait_replicas).arg(self.wait_ms());
        }
        let replies = self
            .eval_pipeline(Purpose::Call, &self.swap, &pipe)
            .await
            .map_err(|e| match e {
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
            Ok((4, Some(floor))) => {
                return Bytes::from_redis_value(floor)
                    .map_err(|e| e.to_string())
                    .and_then(|v| decode_version(&v).map_err(|e| e.to_string()))
                    .map(Written::Behind)
                    .map_err(|e| StorageError::Backend(format!("the swap script answered {e}")));
            }
            Ok((3, Some(outcome))) => {
                return Bytes::from_redis_value(outcome)
                    .map(Written::Repeated)
                    .map_err(|e| StorageError::Backend(format!("the swap script answered {e}")));
            }
            other => return Err(StorageError::Backend(format!("the swap script answered {other:?}"))),
        };
        if wait {
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

    fn round_trips(&self) -> Option<RoundTrips> {
        Some(self.counters.get())
    }

    fn clock(&self) -> Option<Arc<dyn crate::hlc::Clock>> {
        Some(self.clock.clone())
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
        let barrier = self.barrier(&mut pipe);
        let mut reply = self.eval_pipeline(Purpose::Call, &self.scan, &pipe).await?;
        self.passed(barrier, &mut reply)?;
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
        let keys: Vec<Bytes> = self.query(Purpose::Call, &due).await?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut versions = redis::pipe();
        for key in &keys {
            versions.cmd("HGET").arg(self.names.record(key)).arg("ver");
        }
        let versions: Vec<Option<Bytes>> = self
            .bounded(Purpose::Call, |mut c| async move {
                versions.query_async(&mut c).await.map_err(storage_error)
            })
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
        let first: Vec<(Bytes, f64)> = self.query(Purpose::Background, &cmd).await?;
        Ok(first.first().map(|(_, score)| score_ms(*score)))
    }

    async fn len(&self) -> Result<u64, StorageError> {
        self.query(Purpose::Call, redis::cmd("ZCARD").arg(&self.names.index))
            .await
    }

    /// The highest version written or issued for a removal.
    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        let mut highest = None;
        for name in [&self.names.max_version, &self.names.removed_version] {
            let mut cmd = redis::cmd("ZRANGE");
            cmd.arg(name).arg(-1).arg(-1);
            let top: Vec<Bytes> = self.query(Purpose::Background, &cmd).await?;
            highest = highest.max(top.first().map(|v| decode_version(v)).transpose()?);
        }
        Ok(highest)
    }

    /// The server keeps the keys beyond this process; how long is its own persistence
    /// configuration (RDB, AOF, replicas), which the operator chose with it.
    fn persistent(&self) -> bool {
        true
    }
}

/// Real Redis and Valkey servers for tests (this crate's and the engine's: feature
/// `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod server;
#[cfg(test)]
mod tests;
