//! Leader election (etcd's Election API: campaign, proclaim, resign, leader, observe) on the
//! lease record that Azure IoT Operations leased locks, Dapr locks and `stategate lock` share,
//! for the HTTP and gRPC doors. The doors only read requests and write answers.
//!
//! # Records
//!
//! - The **lease**: the election's key, holding the leader's holder id, with the lease's time to
//!   live as its deadline: `SET key holder NEX PX ttl`, exactly the AIO leased lock's write, so
//!   an election campaigner and a leased-lock client on the same name exclude each other.
//! - The **proclamation**: the companion key `<key>.proclaimed` holding `token\nholder\nvalue`
//!   (`engine::proclamation`, its one parser, which `stategate elect` uses too), written by the
//!   lease's holder with the leadership's fencing token (so the record keeps the highest token
//!   that wrote it, and a deposed leader's late write is refused by the engine's fencing rule).
//!   It counts only for the lease it belongs to: the same holder, a token not newer than the
//!   lease, and the record's own fencing token the one it names (a leader who took the lease
//!   another way, say over MQTT, has proclaimed nothing). It has no deadline of its own: resign
//!   deletes it when it belongs to the lease given up; a leader that died leaves it until the
//!   next campaign overwrites it. A key of that name that is no proclamation (an ordinary key)
//!   is never overwritten nor removed: a campaign is refused instead. Access to it follows the
//!   election's key: who may write the key may proclaim.
//!
//! # Fencing token
//!
//! The version of the SET that won the lease: higher than any token of an earlier leadership,
//! lower than any later one. A renewal (the same SET again) gives the lease a newer version,
//! which is as good a token for the same leadership; [`Leader::token`] reports the campaign's
//! token when the leader proclaimed, else the lease's current version.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use super::{DaprError, DaprSettings};
use crate::access::{self, Grant, Op};
use crate::engine::proclamation::{self, Proclamation};
pub use crate::engine::proclamation::{PROCLAIMED_SUFFIX, proclaimed_key};
use crate::engine::watch::{Start, WatchItem, WatchSpec};
use crate::engine::{
    ChangeKind, Command, Del, DelCondition, Engine, EngineError, Entry, KeyFilter, Reply, Set, SetCondition, VDel,
};
use crate::hlc::Hlc;

/// Attempts at writing the proclamation while others change the companion key meanwhile.
const PROCLAIM_ATTEMPTS: usize = 8;

/// How long a campaign waits at most unless configured otherwise (`--election-max-wait`).
pub const DEFAULT_MAX_CAMPAIGN_WAIT: Duration = Duration::from_secs(30);

/// What campaign asks for.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The election's (engine) key.
    pub key: Bytes,
    /// Who campaigns: the lease's value. Non-empty, no newline.
    pub holder: Bytes,
    /// What the leader proclaims when elected (`None`: nothing).
    pub value: Option<Bytes>,
    /// The lease's time to live; the leader renews it by campaigning again before it runs out.
    pub ttl: Duration,
    /// How long to wait for the lease when someone else holds it (zero: one attempt); capped
    /// at [`DaprSettings::max_campaign_wait`].
    pub wait: Duration,
}

/// Who leads an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub holder: Bytes,
    /// What the leader proclaimed (`None`: nothing, e.g. a leased-lock client).
    pub value: Option<Bytes>,
    /// The fencing token of this leadership.
    pub token: Hlc,
    /// The lease's current version (a renewal changes it).
    pub lease_version: Hlc,
    /// The lease's deadline, ms since the Unix epoch.
    pub expires_at_ms: Option<u64>,
    /// Elected by campaign (its token is the campaign's); false for a lease taken as a
    /// leased lock, whose token is the lease's current version.
    pub campaigned: bool,
}

/// Campaign's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Campaigned {
    /// The caller leads; `leader.token` is its fencing token.
    Elected(Leader),
    /// The wait ended first; who leads meanwhile (`None`: the lease was just released).
    NotElected(Option<Leader>),
}

/// Proclaim's and resign's answer when the caller does not lead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Nobody leads (the lease was released or expired).
    NoLeader,
    /// Someone else leads, or the caller's token belongs to an earlier leadership.
    NotLeader,
}

fn check_holder(holder: &[u8]) -> Result<(), DaprError> {
    if holder.is_empty() {
        return Err(DaprError::Malformed("the holder is missing or empty".into()));
    }
    if holder.contains(&b'\n') {
        return Err(DaprError::Malformed("the holder may not contain a newline".into()));
    }
    Ok(())
}

fn check_key(key: &[u8]) -> Result<(), DaprError> {
    if key.is_empty() {
        return Err(DaprError::Malformed("the election name is missing or empty".into()));
    }
    Ok(())
}

/// The proclamation `record` (the companion key as read) holds for the lease `holder` holds
/// at `lease_version`, if it belongs to that lease.
fn belonging(record: Option<Entry>, holder: &[u8], lease_version: &Hlc) -> Option<(Proclamation, Entry)> {
    let record = record?;
    let p = Proclamation::parse(&record.value)?;
    (p.written_under(record.fencing.as_ref()) && p.belongs_to(holder, lease_version)).then_some((p, record))
}

/// The refusal when the companion key is someone's ordinary key.
fn occupied(key: &[u8]) -> DaprError {
    DaprError::Malformed(format!(
        "{:?} holds a key that is not this election's proclamation: the election does not \
         overwrite it (delete or rename it)",
        String::from_utf8_lossy(&proclaimed_key(key))
    ))
}

/// Who leads `key` now (the caller needs `read` on the key).
pub async fn leader(engine: &Engine, grant: &Grant, key: &Bytes) -> Result<Option<Leader>, DaprError> {
    check_key(key)?;
    grant.check(Op::Read, key)?;
    Ok(current(engine, key).await?)
}

/// The lease and the proclamation that belongs to it, read without an access check.
async fn current(engine: &Engine, key: &Bytes) -> Result<Option<Leader>, EngineError> {
    let Some(lease) = engine.read(key).await? else {
        return Ok(None);
    };
    let mut leader = Leader {
        holder: lease.value,
        value: None,
        token: lease.version.clone(),
        lease_version: lease.version,
        expires_at_ms: lease.expires_at_ms,
        campaigned: false,
    };
    let record = engine.peek(&proclaimed_key(key)).await?;
    if let Some((p, _)) = belonging(record, &leader.holder, &leader.lease_version) {
        leader.value = p.value;
        leader.token = p.token;
        leader.campaigned = true;
    }
    Ok(Some(leader))
}

/// A watch of the election's two keys.
fn watch_spec(key: &Bytes) -> WatchSpec {
    let keys = vec![key.clone(), proclaimed_key(key)];
    let wanted = keys.clone();
    WatchSpec {
        wanted: KeyFilter::new(move |k| wanted.iter().any(|w| w[..] == *k)),
        prefix: Bytes::new(),
        only: Some(keys),
    }
}

/// One attempt to take (or renew) the lease: its version when the caller holds it now.
async fn take_lease(engine: &Engine, grant: &Grant, c: &Campaign) -> Result<Option<Hlc>, DaprError> {
    let ttl_ms = u64::try_from(c.ttl.as_millis()).unwrap_or(u64::MAX);
    let set = Set {
        key: c.key.clone(),
        value: c.holder.clone(),
        condition: SetCondition::IfAbsentOrEqual,
        ttl_ms: Some(ttl_ms),
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    let resp = access::execute(engine, grant, Command::Set(set)).await?;
    Ok(match (resp.reply, resp.version) {
        (Reply::Ok, Some(version)) => Some(version),
        _ => None,
    })
}

/// What writing the proclamation did.
#[derive(Debug, PartialEq, Eq)]
enum Wrote {
    Done,
    /// The companion key holds no proclamation (an ordinary key): left as it is.
    Occupied,
}

/// Writes the proclamation with the leadership's token (the caller holds the lease and was
/// checked on the key): over nothing or an earlier proclamation only, never over an ordinary
/// key of that name (the swap's condition keeps it so while others write).
async fn write_proclamation(engine: &Engine, key: &Bytes, p: &Proclamation) -> Result<Wrote, EngineError> {
    let companion = proclaimed_key(key);
    let mut last = EngineError::VersionMismatch;
    for _ in 0..PROCLAIM_ATTEMPTS {
        let stored = engine.peek(&companion).await?;
        if !proclamation::may_replace(stored.as_ref().map(|e| &e.value)) {
            return Ok(Wrote::Occupied);
        }
        let set = Set {
            key: companion.clone(),
            value: p.encode(),
            condition: match stored {
                None => SetCondition::IfAbsent,
                Some(e) => SetCondition::IfVersion(e.version),
            },
            ttl_ms: None,
            timestamp: None,
            fencing: Some(p.token.clone()),
            persist: false,
            sliding: false,
        };
        match engine.execute(Command::Set(set)).await {
            Ok(r) if matches!(r.reply, Reply::Ok) => return Ok(Wrote::Done),
            // Written or removed since it was read: look again.
            Ok(_) => {}
            Err(EngineError::VersionMismatch) => last = EngineError::VersionMismatch,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// Campaigns for `c.key`: takes the lease if it is free (or already the caller's: a renewal,
/// with a new token), else waits for its deletion or expiry in the change history and tries
/// again, until `c.wait` has passed. The caller needs `write` on the key.
///
/// The wait is capped at `settings.max_campaign_wait` here, for every door: a waiting campaign
/// holds a request slot of its door and a watch of the change history, and a client that set
/// no deadline of its own would hold both for as long as it asked. A capped wait ends like
/// any other: `NotElected`, with who leads; the client campaigns again.
pub async fn campaign(
    engine: &Engine,
    settings: &DaprSettings,
    grant: &Grant,
    c: &Campaign,
) -> Result<Campaigned, DaprError> {
    check_key(&c.key)?;
    check_holder(&c.holder)?;
    if c.ttl.is_zero() {
        return Err(DaprError::Malformed("the lease's ttl must be positive".into()));
    }
    grant.check(Op::Write, &c.key)?;
    let wait = c.wait.min(settings.max_campaign_wait);
    // A cap configured past what a clock can add reads as "a year".
    let deadline = Instant::now()
        .checked_add(wait)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
    // Watching starts before the first attempt, so a release right after it is not missed.
    let mut changes = (!wait.is_zero()).then(|| Box::pin(engine.watch(watch_spec(&c.key), Start::Live)));
    loop {
        if let Some(token) = take_lease(engine, grant, c).await? {
            return elected(engine, c, token).await;
        }
        let Some(watch) = changes.as_mut() else {
            return Ok(Campaigned::NotElected(current(engine, &c.key).await?));
        };
        let released = async {
            while let Some(item) = watch.next().await {
                match item {
                    WatchItem::Change { event, .. } if event.change.key == c.key => {
                        if matches!(event.change.kind, ChangeKind::Delete | ChangeKind::Expire) {
                            return true;
                        }
                    }
                    // Fell behind the history: look again, with a new watch.
                    WatchItem::Overflow { .. } | WatchItem::Reset => return false,
                    WatchItem::Failed(_) => return false,
                    WatchItem::Change { .. } | WatchItem::Snapshot { .. } | WatchItem::Synced { .. } => {}
                }
            }
            false
        };
        match tokio::time::timeout_at(deadline, released).await {
            Ok(true) => {}
            Ok(false) => changes = Some(Box::pin(engine.watch(watch_spec(&c.key), Start::Live))),
            Err(_) => {
                // One last attempt: the lease may have been freed as the wait ended.
                if let Some(token) = take_lease(engine, grant, c).await? {
                    return elected(engine, c, token).await;
                }
                return Ok(Campaigned::NotElected(current(engine, &c.key).await?));
            }
        }
    }
}

/// The caller holds the lease with `token`: proclaims its value (or nothing, which still
/// records the token, so proclaim can tell an earlier leadership's token), then reports it.
async fn elected(engine: &Engine, c: &Campaign, token: Hlc) -> Result<Campaigned, DaprError> {
    let p = Proclamation {
        token: token.clone(),
        holder: c.holder.clone(),
        value: c.value.clone(),
    };
    let refusal = match write_proclamation(engine, &c.key, &p).await {
        Ok(Wrote::Done) => None,
        Ok(Wrote::Occupied) => Some(occupied(&c.key)),
        Err(e) => Some(e.into()),
    };
    if let Some(refusal) = refusal {
        // Leading without the value asked for would mislead observers: give the lease back.
        let _ = release(engine, &c.key, &c.holder).await;
        return Err(refusal);
    }
    let expires_at_ms = engine.read(&c.key).await?.and_then(|e| e.expires_at_ms);
    Ok(Campaigned::Elected(Leader {
        holder: c.holder.clone(),
        value: c.value.clone(),
        token: token.clone(),
        lease_version: token,
        expires_at_ms,
        campaigned: true,
    }))
}

/// Updates what the leader proclaims: only by the holder of the lease, with a token of its
/// leadership (not older than the last proclamation, not newer than the lease). The caller
/// needs `write` on the key.
pub async fn proclaim(
    engine: &Engine,
    grant: &Grant,
    key: &Bytes,
    holder: &Bytes,
    token: &Hlc,
    value: &Bytes,
) -> Result<Outcome, DaprError> {
    check_key(key)?;
    check_holder(holder)?;
    grant.check(Op::Write, key)?;
    let Some(lease) = engine.read(key).await? else {
        return Ok(Outcome::NoLeader);
    };
    if lease.value != *holder || *token > lease.version {
        return Ok(Outcome::NotLeader);
    }
    let p = Proclamation {
        token: token.clone(),
        holder: holder.clone(),
        value: Some(value.clone()),
    };
    match write_proclamation(engine, key, &p).await {
        Ok(Wrote::Done) => Ok(Outcome::Done),
        Ok(Wrote::Occupied) => Err(occupied(key)),
        // A later leadership proclaimed since: this token is deposed.
        Err(EngineError::FencingTokenLower) => Ok(Outcome::NotLeader),
        Err(e) => Err(e.into()),
    }
}

/// Gives the lease up (`VDEL key holder`) and deletes the proclamation that belongs to it. The
/// caller needs `write` on the key.
pub async fn resign(engine: &Engine, grant: &Grant, key: &Bytes, holder: &Bytes) -> Result<Outcome, DaprError> {
    check_key(key)?;
    check_holder(holder)?;
    grant.check(Op::Write, key)?;
    Ok(release(engine, key, holder).await?)
}

async fn release(engine: &Engine, key: &Bytes, holder: &Bytes) -> Result<Outcome, EngineError> {
    // The proclamation of this holder's lease, read before the lease goes (after, nothing
    // tells whose it was): nothing when the holder holds no lease.
    let companion = proclaimed_key(key);
    let owned = match engine.peek(key).await? {
        Some(lease) if lease.value == *holder => belonging(engine.peek(&companion).await?, holder, &lease.version),
        _ => None,
    };
    let vdel = VDel {
        key: key.clone(),
        value: holder.clone(),
        fencing: None,
    };
    let outcome = match engine.execute(Command::VDel(vdel)).await?.reply {
        Reply::Int(1) => Outcome::Done,
        Reply::NotApplied => return Ok(Outcome::NotLeader),
        _ => Outcome::NoLeader,
    };
    // The proclamation goes only with the lease it belongs to; one written meanwhile (by a
    // newer leader) is left alone by the version condition, and so is any key of that name
    // when the holder held no lease.
    if let (Outcome::Done, Some((_, record))) = (&outcome, owned) {
        let del = Del {
            key: companion,
            fencing: record.fencing,
            condition: DelCondition::IfVersion(record.version),
        };
        match engine.execute(Command::Del(del)).await {
            Ok(_) | Err(EngineError::VersionMismatch | EngineError::FencingTokenLower) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(outcome)
}

/// What an observer of an election is told.
#[derive(Debug)]
pub enum Observed {
    /// Who leads now (`None`: nobody); sent first, then at each change of leader, token or
    /// proclaimed value (not at a renewal).
    Leader(Option<Leader>),
    /// Reading failed, or the caller lost `read` on the key; the stream ends.
    Failed(EngineError),
}

/// A stream of the leaders of `key`, driven by the change history: the current leader, then
/// each change. An observer that falls behind the history starts over from the current state
/// (it may miss intermediate leaders, never report a stale one). The caller needs `read`.
pub fn observe(
    engine: &Engine,
    grant: &Grant,
    key: Bytes,
) -> Result<impl Stream<Item = Observed> + Send + use<>, DaprError> {
    check_key(&key)?;
    grant.check(Op::Read, &key)?;
    let state = Observer {
        engine: engine.clone(),
        grant: grant.clone(),
        watch: Box::pin(engine.watch(watch_spec(&key), Start::Snapshot)),
        key,
        synced: false,
        last: None,
        ended: false,
    };
    Ok(futures_util::stream::unfold(state, |mut o| async move {
        let item = o.next().await?;
        Some((item, o))
    }))
}

type Changes = std::pin::Pin<Box<dyn Stream<Item = WatchItem> + Send>>;

/// What tells one reported leader from the next: holder, value, and the campaign's token (a
/// renewal changes the lease's version only, so it is not reported).
type Identity = Option<(Bytes, Option<Bytes>, Option<Hlc>)>;

struct Observer {
    engine: Engine,
    grant: Grant,
    key: Bytes,
    watch: Changes,
    /// Whether the snapshot ended (changes before that only describe the current state).
    synced: bool,
    /// What was sent last: (holder, value, token when proclaimed).
    last: Option<Identity>,
    ended: bool,
}

impl Observer {
    async fn next(&mut self) -> Option<Observed> {
        if self.ended {
            return None;
        }
        loop {
            let look = match self.watch.next().await {
                Some(WatchItem::Synced { .. }) => {
                    self.synced = true;
                    true
                }
                Some(WatchItem::Change { .. }) => self.synced,
                Some(WatchItem::Snapshot { .. } | WatchItem::Reset) => false,
                Some(WatchItem::Overflow { .. }) | None => {
                    self.watch = Box::pin(self.engine.watch(watch_spec(&self.key), Start::Snapshot));
                    self.synced = false;
                    false
                }
                Some(WatchItem::Failed(e)) => return Some(self.end(e)),
            };
            if !look {
                continue;
            }
            if !self.grant.may(Op::Read, &self.key) {
                return Some(self.end(EngineError::NotAuthorized));
            }
            let leader = match current(&self.engine, &self.key).await {
                Ok(l) => l,
                Err(e) => return Some(self.end(e)),
            };
            // The token of a leader that did not campaign is the lease's version: left out.
            let seen: Identity = leader.as_ref().map(|l| {
                let token = l.campaigned.then(|| l.token.clone());
                (l.holder.clone(), l.value.clone(), token)
            });
            if self.last.as_ref() != Some(&seen) {
                self.last = Some(seen);
                return Some(Observed::Leader(leader));
            }
        }
    }

    fn end(&mut self, e: EngineError) -> Observed {
        self.ended = true;
        Observed::Failed(e)
    }
}

#[cfg(test)]
mod tests;
