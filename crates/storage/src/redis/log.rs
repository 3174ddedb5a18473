//! The shared change log on Redis: a stream (`P log`) that the swap script and the
//! registration script append to, numbered by `P logseq`, read back by every replica.
//!
//! Entries (stream fields): `n` sequence number (consecutive), `u` a tag unique to the entry,
//! `o` the origin replica, `t` the kind: `s` set (`k` key, `v` version, `x` value, `e`
//! deadline, `f` fencing token), `d` delete and `e` expire (`k`, `v`), `r` register (`c`
//! client, `s` session, `k`, `h` home replica), `u` unregister (`c`, `k`), `D` drop a client
//! (`c`, `s`), `J` a member joined (`m` its origin), `L` a member left (`m`, `p` its progress).
//!
//! A reader never skips an entry silently: every read also fetches the last sequence number
//! and the entry it read last. Numbers that do not follow on, a last entry that is gone or now
//! has another tag, or a sequence number below the reader's mean the entries it missed are gone
//! (trimmed, or lost by a Redis that restarted): [`LogRead::Gap`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use redis::{FromRedisValue, Value};

use super::codec::decode_version;
use super::connection::Purpose;
use super::{Shared, storage_error};
use crate::log::{
    ChangeLog, LogBody, LogCursor, LogEntry, LogRead, LogStart, MemberOp, ObserveOutcome, ObserverBounds, ObserverOp,
    Registration,
};
use crate::{ChangeRecord, ChangeRecordKind, StorageError};

/// How long one read waits for a new entry.
const READ_BLOCK: Duration = Duration::from_millis(1000);

/// A random id for this process's entries.
pub(super) fn random_origin() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

impl Shared {
    /// A tag no other call (of any replica) uses: the origin and a per-process counter.
    pub(super) fn call_tag(&self) -> String {
        format!("{:x}:{:x}", self.origin, self.tags.fetch_add(1, Ordering::Relaxed))
    }

    /// Redis Cluster is not supported (every write touches the store's key index, so the whole
    /// store would live in one slot): refuse it at startup with a clear message rather than
    /// failing each call with MOVED or CROSSSLOT.
    pub(super) async fn refuse_cluster(&self) -> Result<(), StorageError> {
        let info: String = self
            .query(Purpose::Background, redis::cmd("INFO").arg("cluster"))
            .await?;
        if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
            return Err(StorageError::Backend(format!(
                "{} is a Redis Cluster node; stategate needs a standalone Redis or Valkey (with replicas and Sentinel for failover: redis+sentinel://)",
                self.url
            )));
        }
        Ok(())
    }

    /// The reading connection (its own, since reads block), connected when needed, to the
    /// primary the main connection uses (a new one after a failover).
    async fn reader(&self) -> Result<redis::aio::MultiplexedConnection, StorageError> {
        let mut slot = self.reader.lock().await;
        if let Some((c, generation)) = slot.as_ref()
            && *generation == self.generation()
        {
            return Ok(c.clone());
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(READ_BLOCK + self.timeout));
        let connect = async {
            let main = self.connection().await?;
            let c = main
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(storage_error)?;
            Ok::<_, StorageError>((c, main.generation))
        };
        let (c, generation) = tokio::time::timeout(self.timeout, connect)
            .await
            .map_err(|_| StorageError::Unavailable(format!("no connection to redis within {:?}", self.timeout)))??;
        *slot = Some((c.clone(), generation));
        Ok(c)
    }

    async fn drop_reader(&self) {
        *self.reader.lock().await = None;
    }
}

/// The change log of one Redis store.
pub(super) struct RedisLog(pub(super) Arc<Shared>);

#[async_trait]
impl ChangeLog for RedisLog {
    fn origin(&self) -> u64 {
        self.0.origin
    }

    fn patience(&self) -> Duration {
        self.0.timeout * 2
    }

    fn heartbeat_every(&self) -> Duration {
        (self.0.member_timeout / 5).max(Duration::from_millis(10))
    }

    async fn start(&self) -> Result<LogStart, StorageError> {
        let s = &self.0;
        let mut eval = s.start.evalsha(&[
            &s.names.log,
            &s.names.log_seq,
            &s.names.observers,
            &s.names.members,
            &s.names.homes,
        ]);
        eval.arg(s.names.observer_prefix());
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        let reply = s.eval_pipeline(Purpose::Background, &s.start, &pipe).await?;
        let bad = |what: &str| StorageError::Backend(format!("the start script answered {what}"));
        type Started = (
            Bytes,
            u64,
            Bytes,
            Vec<(String, String, String, Vec<Bytes>)>,
            Vec<String>,
        );
        let (id, seq, tag, regs, members): Started = reply
            .into_iter()
            .next()
            .map(FromRedisValue::from_redis_value)
            .transpose()
            .map_err(|e| bad(&e.to_string()))?
            .ok_or_else(|| bad("nothing"))?;
        let registrations = regs
            .into_iter()
            .map(|(client, session, home, keys)| Registration {
                client,
                session: session.parse().ok(),
                home: home.parse().ok(),
                keys,
            })
            .collect();
        let members = members
            .iter()
            .map(|m| m.parse().map_err(|_| bad(&format!("member {m:?}"))))
            .collect::<Result<_, _>>()?;
        Ok(LogStart {
            cursor: LogCursor { id, seq, tag },
            registrations,
            members,
        })
    }

    async fn heartbeat(&self, node: &str, progress: u64) -> Result<Vec<(u64, u64)>, StorageError> {
        let reply = self.members_call("h", node, progress).await?;
        let pairs: Vec<(u64, u64)> = FromRedisValue::from_redis_value(reply)
            .map_err(|e| StorageError::Backend(format!("the members script answered {e}")))?;
        self.0.joined.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(pairs)
    }

    async fn leave(&self, progress: u64) -> Result<(), StorageError> {
        self.members_call("l", "", progress).await.map(|_| ())
    }

    async fn head(&self) -> Result<u64, StorageError> {
        let s = &self.0;
        // The counter is bumped by the same script that appends, so it is never behind.
        let seq: Option<u64> = s.query(Purpose::Call, redis::cmd("GET").arg(&s.names.log_seq)).await?;
        Ok(seq.unwrap_or(0))
    }

    async fn read(&self, after: &LogCursor, max: usize) -> Result<LogRead, StorageError> {
        let s = &self.0;
        let mut conn = s.reader().await?;
        let from: &[u8] = if after.id.is_empty() { b"0-0" } else { &after.id };
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&s.names.log_seq);
        pipe.cmd("XRANGE").arg(&s.names.log).arg(from).arg(from);
        pipe.cmd("XREAD")
            .arg("COUNT")
            .arg(max.max(1))
            .arg("BLOCK")
            .arg(READ_BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&s.names.log)
            .arg(from);
        // Watchers, KEYNOTIFY and the record cache get only changes that the replicas
        // `--redis-wait-replicas` asks for have (a change a failover drops is never sent).
        let barrier = s.barrier(&mut pipe);
        s.counters.add(Purpose::Background, 1);
        let mut replies: Vec<Value> = match pipe.query_async(&mut conn).await {
            Ok(r) => r,
            Err(e) => {
                s.drop_reader().await;
                return Err(storage_error(e));
            }
        };
        s.passed(barrier, &mut replies)?;
        let mut replies = replies.into_iter();
        let (Some(seq), Some(at), Some(new)) = (replies.next(), replies.next(), replies.next()) else {
            return Err(StorageError::Backend("a log read answered too few replies".into()));
        };
        let stored_seq: u64 = Option::<u64>::from_redis_value(seq)
            .map_err(|e| StorageError::Corrupt(format!("the change log's sequence number: {e}")))?
            .unwrap_or(0);
        if stored_seq < after.seq {
            return Ok(LogRead::Gap);
        }
        if !after.tag.is_empty()
            && let Some((_, fields)) = stream_entries(at)?.into_iter().next()
            && field(&fields, b"u") != Some(&after.tag)
        {
            return Ok(LogRead::Gap);
        }
        let entries = xread_entries(new)?;
        if entries.is_empty() && stored_seq > after.seq {
            // Numbered entries exist after ours, yet none follows ours in the stream.
            return Ok(LogRead::Gap);
        }
        let mut cursor = after.clone();
        let mut out = Vec::with_capacity(entries.len());
        for (id, fields) in entries {
            let entry = decode_entry(&fields)?;
            if entry.seq != cursor.seq + 1 {
                return Ok(LogRead::Gap);
            }
            cursor = LogCursor {
                id,
                seq: entry.seq,
                tag: field(&fields, b"u").cloned().unwrap_or_default(),
            };
            out.push(entry);
        }
        Ok(LogRead::Entries(out, cursor))
    }

    async fn observe(
        &self,
        op: &ObserverOp,
        bounds: ObserverBounds,
    ) -> Result<(ObserveOutcome, Option<u64>), StorageError> {
        let s = &self.0;
        let (code, client, session, key, home): (&str, &str, Option<u64>, &[u8], Option<u64>) = match op {
            ObserverOp::Register {
                client,
                session,
                key,
                home,
            } => ("r", client, *session, key, *home),
            ObserverOp::Unregister { client, key } => ("u", client, None, key, None),
            ObserverOp::DropClient { client, session } => ("d", client, *session, b"", None),
        };
        let set = s.names.observed_by(client);
        let mut eval = s.observe.evalsha(&[
            &s.names.observers,
            &s.names.observer_count,
            &set,
            &s.names.log,
            &s.names.log_seq,
            &s.names.seen,
            &s.names.homes,
        ]);
        eval.arg(code)
            .arg(client)
            .arg(session.map(|n| n.to_string()).unwrap_or_default())
            .arg(key)
            .arg(bounds.per_client)
            .arg(bounds.total)
            .arg(s.log_len)
            .arg(s.origin)
            .arg(s.call_tag())
            .arg(home.map(|h| h.to_string()).unwrap_or_default());
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        let reply = s.eval_pipeline(Purpose::Call, &s.observe, &pipe).await?;
        let (outcome, last): (i64, u64) = reply
            .into_iter()
            .next()
            .map(FromRedisValue::from_redis_value)
            .transpose()
            .map_err(|e| StorageError::Backend(format!("the observe script answered {e}")))?
            .ok_or_else(|| StorageError::Backend("the observe script answered nothing".into()))?;
        let outcome = match outcome {
            0 => ObserveOutcome::Applied,
            1 => ObserveOutcome::Unchanged,
            2 => ObserveOutcome::ClientFull,
            3 => ObserveOutcome::RegistryFull,
            other => return Err(StorageError::Backend(format!("the observe script answered {other}"))),
        };
        Ok((outcome, (last > 0).then_some(last)))
    }

    async fn seen(&self, clients: &[(String, u64)]) -> Result<Vec<u64>, StorageError> {
        let s = &self.0;
        if clients.is_empty() {
            return Ok(Vec::new());
        }
        // The latest time wins whichever replica writes last: a replica that saw the client
        // long ago must not overwrite a newer time.
        let mut eval = s.seen_script.evalsha(&[&s.names.seen]);
        for (client, ms) in clients {
            eval.arg(client).arg(ms);
        }
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        let reply = s.eval_pipeline(Purpose::Background, &s.seen_script, &pipe).await?;
        let times: Vec<u64> = reply
            .into_iter()
            .next()
            .map(FromRedisValue::from_redis_value)
            .transpose()
            .map_err(|e| StorageError::Backend(format!("the seen script answered {e}")))?
            .unwrap_or_default();
        if times.len() != clients.len() {
            return Err(StorageError::Backend("the seen script answered a short list".into()));
        }
        Ok(times)
    }
}

impl RedisLog {
    /// One call of `redis/members.lua`: `op` `h` (heartbeat) or `l` (leave).
    async fn members_call(&self, op: &str, node: &str, progress: u64) -> Result<Value, StorageError> {
        let s = &self.0;
        let mut eval = s.members.evalsha(&[
            &s.names.members,
            &s.names.progress,
            &s.names.log,
            &s.names.log_seq,
            &s.names.nodes,
        ]);
        let first = !s.joined.load(std::sync::atomic::Ordering::Relaxed);
        eval.arg(op)
            .arg(s.origin)
            .arg(progress)
            .arg(s.member_timeout.as_millis() as u64)
            .arg(s.log_len)
            .arg(s.call_tag())
            .arg(node)
            .arg(if first { "1" } else { "0" });
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        let reply = s.eval_pipeline(Purpose::Background, &s.members, &pipe).await?;
        reply
            .into_iter()
            .next()
            .ok_or_else(|| StorageError::Backend("the members script answered nothing".into()))
    }
}

/// Keeps the latest time per client; returns each client's latest.
pub(super) const SEEN_SCRIPT: &str = r#"#!lua
local out = {}
for i = 1, #ARGV, 2 do
  local c, ms = ARGV[i], tonumber(ARGV[i + 1])
  local cur = tonumber(redis.call('HGET', KEYS[1], c) or '0') or 0
  if ms > cur then
    redis.call('HSET', KEYS[1], c, ms)
    cur = ms
  end
  out[#out + 1] = cur
end
return out
"#;

/// A stream entry: its id and its (field, value) pairs.
type StreamEntry = (Bytes, Vec<(Bytes, Bytes)>);

/// `[[id, [field, value, ...]], ...]` (XRANGE), or nil.
fn stream_entries(v: Value) -> Result<Vec<StreamEntry>, StorageError> {
    if matches!(v, Value::Nil) {
        return Ok(Vec::new());
    }
    let entries: Vec<(Bytes, Vec<Bytes>)> =
        FromRedisValue::from_redis_value(v).map_err(|e| StorageError::Backend(format!("a stream entry: {e}")))?;
    Ok(entries
        .into_iter()
        .map(|(id, flat)| {
            let mut pairs = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(f), Some(v)) = (it.next(), it.next()) {
                pairs.push((f, v));
            }
            (id, pairs)
        })
        .collect())
}

/// XREAD's answer for one stream: `[[name, entries]]` (RESP2) or `{name: entries}` (RESP3),
/// nil when nothing came within the block time.
fn xread_entries(v: Value) -> Result<Vec<StreamEntry>, StorageError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => match streams.into_iter().next() {
            Some(Value::Array(pair)) => pair.into_iter().nth(1).map_or(Ok(Vec::new()), stream_entries),
            Some(other) => Err(StorageError::Backend(format!("XREAD answered {other:?}"))),
            None => Ok(Vec::new()),
        },
        Value::Map(streams) => streams
            .into_iter()
            .next()
            .map_or(Ok(Vec::new()), |(_, entries)| stream_entries(entries)),
        other => Err(StorageError::Backend(format!("XREAD answered {other:?}"))),
    }
}

fn field<'a>(fields: &'a [(Bytes, Bytes)], name: &[u8]) -> Option<&'a Bytes> {
    fields.iter().find(|(f, _)| &f[..] == name).map(|(_, v)| v)
}

fn decode_entry(fields: &[(Bytes, Bytes)]) -> Result<LogEntry, StorageError> {
    let bad = |what: &str| StorageError::Corrupt(format!("a change log entry: {what}"));
    let number = |name: &[u8]| -> Result<u64, StorageError> {
        field(fields, name)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .ok_or_else(|| bad(&format!("field {}", String::from_utf8_lossy(name))))
    };
    let text = |name: &[u8]| -> Result<String, StorageError> {
        field(fields, name)
            .and_then(|v| String::from_utf8(v.to_vec()).ok())
            .ok_or_else(|| bad(&format!("field {}", String::from_utf8_lossy(name))))
    };
    let bytes = |name: &[u8]| field(fields, name).cloned().ok_or_else(|| bad("a missing field"));
    let session = || field(fields, b"s").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
    let seq = number(b"n")?;
    let origin = number(b"o")?;
    let kind = bytes(b"t")?;
    let change = |kind: ChangeRecordKind| -> Result<LogBody, StorageError> {
        Ok(LogBody::Change(ChangeRecord {
            key: bytes(b"k")?,
            version: decode_version(&bytes(b"v")?)?,
            kind,
        }))
    };
    let body = match &kind[..] {
        b"s" => change(ChangeRecordKind::Set {
            value: field(fields, b"x").cloned().unwrap_or_default(),
            expires_at_ms: field(fields, b"e").map(|_| number(b"e")).transpose()?,
            fencing: field(fields, b"f").map(|f| decode_version(f)).transpose()?,
            imported: field(fields, b"i").is_some(),
        })?,
        b"d" => change(ChangeRecordKind::Delete)?,
        b"e" => change(ChangeRecordKind::Expire)?,
        b"r" => LogBody::Observe(ObserverOp::Register {
            client: text(b"c")?,
            session: session(),
            key: bytes(b"k")?,
            home: field(fields, b"h").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()),
        }),
        b"u" => LogBody::Observe(ObserverOp::Unregister {
            client: text(b"c")?,
            key: bytes(b"k")?,
        }),
        b"D" => LogBody::Observe(ObserverOp::DropClient {
            client: text(b"c")?,
            session: session(),
        }),
        b"J" => LogBody::Member(MemberOp::Join { member: number(b"m")? }),
        b"L" => LogBody::Member(MemberOp::Leave {
            member: number(b"m")?,
            progress: number(b"p")?,
        }),
        other => return Err(bad(&format!("kind {:?}", String::from_utf8_lossy(other)))),
    };
    Ok(LogEntry { seq, origin, body })
}

#[cfg(test)]
mod tests {
    use super::super::codec::encode_version;
    use super::*;
    use crate::hlc::Hlc;

    fn fields(pairs: &[(&str, &[u8])]) -> Vec<(Bytes, Bytes)> {
        pairs
            .iter()
            .map(|(f, v)| (Bytes::copy_from_slice(f.as_bytes()), Bytes::copy_from_slice(v)))
            .collect()
    }

    #[test]
    fn entries_decode() {
        let v = encode_version(&Hlc::new(5, 1, "n"));
        let e = decode_entry(&fields(&[
            ("n", b"7"),
            ("u", b"t.1"),
            ("o", b"42"),
            ("t", b"s"),
            ("k", b"key"),
            ("v", &v),
            ("x", b"val"),
            ("e", b"99"),
        ]))
        .unwrap();
        assert_eq!((e.seq, e.origin), (7, 42));
        assert_eq!(
            e.body,
            LogBody::Change(ChangeRecord {
                key: Bytes::from_static(b"key"),
                version: Hlc::new(5, 1, "n"),
                kind: ChangeRecordKind::Set {
                    value: Bytes::from_static(b"val"),
                    expires_at_ms: Some(99),
                    fencing: None,
                    imported: false,
                },
            })
        );
        // An import's set carries `i` (replicas of earlier releases ignore the field).
        let e = decode_entry(&fields(&[
            ("n", b"7"),
            ("o", b"42"),
            ("t", b"s"),
            ("k", b"key"),
            ("v", &v),
            ("x", b"val"),
            ("i", b"1"),
        ]))
        .unwrap();
        assert!(matches!(
            e.body,
            LogBody::Change(ChangeRecord {
                kind: ChangeRecordKind::Set { imported: true, .. },
                ..
            })
        ));
        let e = decode_entry(&fields(&[
            ("n", b"8"),
            ("o", b"1"),
            ("t", b"D"),
            ("c", b"cl"),
            ("s", b""),
        ]))
        .unwrap();
        assert_eq!(
            e.body,
            LogBody::Observe(ObserverOp::DropClient {
                client: "cl".into(),
                session: None
            })
        );
        for broken in [
            fields(&[("n", b"x"), ("o", b"1"), ("t", b"d"), ("k", b"k"), ("v", &v)]),
            fields(&[("n", b"1"), ("o", b"1"), ("t", b"?")]),
            fields(&[("n", b"1"), ("o", b"1"), ("t", b"d"), ("k", b"k"), ("v", b"bad")]),
            fields(&[("n", b"1"), ("o", b"1"), ("t", b"r"), ("c", b"\xff"), ("k", b"k")]),
        ] {
            assert!(
                matches!(decode_entry(&broken), Err(StorageError::Corrupt(_))),
                "{broken:?}"
            );
        }
    }
}
