//! `statestore.v1.StateStore`: the MQTT protocol's semantics in typed form.

use std::pin::Pin;

use bytes::Bytes;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::error::{Surface, from_engine};
use super::grant_of;
use super::pb::statestore::v1 as pb;
use crate::access::{self, Access, Op};
use crate::engine::watch::{Selector, Start, WatchItem, WatchSpec};
use crate::engine::{
    ChangeKind, Command, Del, DelCondition, Engine, EngineError, Entry, KeyFilter, MGet, Reply, Scan, Set,
    SetCondition, VDel,
};
use crate::hlc::Hlc;

pub struct Native {
    pub(crate) engine: Engine,
    pub(crate) obs: crate::health::Observe,
    pub(crate) access: Access,
}

fn err(e: EngineError) -> Status {
    from_engine(Surface::Native, e)
}

/// An optional HLC field: empty = none; anything else must parse.
fn hlc(field: &str) -> Result<Option<Hlc>, Status> {
    if field.is_empty() {
        return Ok(None);
    }
    field
        .parse()
        .map(Some)
        .map_err(|_| err(EngineError::MalformedTimestamp))
}

fn version(v: Option<Hlc>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

#[tonic::async_trait]
impl pb::state_store_server::StateStore for Native {
    async fn set(&self, req: Request<pb::SetRequest>) -> Result<Response<pb::SetResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let condition = match (pb::SetCondition::try_from(r.condition), hlc(&r.if_version)?) {
            (Ok(pb::SetCondition::Unspecified), Some(v)) => SetCondition::IfVersion(v),
            (Ok(_), Some(_)) => return Err(Status::invalid_argument("if_version cannot be combined with NX or NEX")),
            (Ok(pb::SetCondition::Unspecified), None) => SetCondition::Always,
            (Ok(pb::SetCondition::Nx), None) => SetCondition::IfAbsent,
            (Ok(pb::SetCondition::Nex), None) => SetCondition::IfAbsentOrEqual,
            (Err(_), _) => return Err(Status::invalid_argument("unknown set condition")),
        };
        let cmd = Set {
            key: Bytes::from(r.key),
            value: Bytes::from(r.value),
            condition,
            ttl_ms: (r.ttl_ms > 0).then_some(r.ttl_ms),
            timestamp: hlc(&r.timestamp)?,
            fencing: hlc(&r.fencing_token)?,
            // statestore.v1 has no such field: what is kept is the storage's choice.
            persist: false,
            sliding: r.ttl_sliding,
        };
        let resp = access::execute(&self.engine, &grant, Command::Set(cmd))
            .await
            .map_err(err)?;
        Ok(Response::new(pb::SetResponse {
            applied: resp.reply == Reply::Ok,
            version: version(resp.version),
        }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let grant = grant_of(&req)?;
        let key = Bytes::from(req.into_inner().key);
        grant.check(Op::Read, &key).map_err(err)?;
        Ok(Response::new(get_response(self.engine.read(&key).await.map_err(err)?)))
    }

    async fn get_many(&self, req: Request<pb::GetManyRequest>) -> Result<Response<pb::GetManyResponse>, Status> {
        let grant = grant_of(&req)?;
        let keys = req.into_inner().keys.into_iter().map(Bytes::from).collect();
        let resp = access::execute(&self.engine, &grant, Command::MGet(MGet { keys }))
            .await
            .map_err(err)?;
        let Reply::Values(values) = resp.reply else {
            return Err(Status::internal("MGET returned no values"));
        };
        let items = values.into_iter().map(get_response).collect();
        Ok(Response::new(pb::GetManyResponse {
            items,
            version: version(resp.version),
        }))
    }

    async fn del(&self, req: Request<pb::DelRequest>) -> Result<Response<pb::DelResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let cmd = Del {
            key: Bytes::from(r.key),
            fencing: hlc(&r.fencing_token)?,
            condition: match hlc(&r.if_version)? {
                Some(v) => DelCondition::IfVersion(v),
                None => DelCondition::Always,
            },
        };
        let resp = access::execute(&self.engine, &grant, Command::Del(cmd))
            .await
            .map_err(err)?;
        Ok(Response::new(pb::DelResponse {
            deleted: resp.reply == Reply::Int(1),
            version: version(resp.version),
        }))
    }

    async fn v_del(&self, req: Request<pb::VDelRequest>) -> Result<Response<pb::VDelResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let cmd = VDel {
            key: Bytes::from(r.key),
            value: Bytes::from(r.value),
            fencing: hlc(&r.fencing_token)?,
        };
        let resp = access::execute(&self.engine, &grant, Command::VDel(cmd))
            .await
            .map_err(err)?;
        let outcome = match resp.reply {
            Reply::Int(1) => pb::DeleteOutcome::Deleted,
            Reply::NotApplied => pb::DeleteOutcome::ValueMismatch,
            _ => pb::DeleteOutcome::Absent,
        };
        Ok(Response::new(pb::VDelResponse {
            outcome: outcome as i32,
            version: version(resp.version),
        }))
    }

    async fn scan(&self, req: Request<pb::ScanRequest>) -> Result<Response<pb::ScanResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let cmd = Scan {
            pattern: Bytes::from(r.pattern),
            token: (!r.continuation_token.is_empty()).then(|| Bytes::from(r.continuation_token)),
            filter: None,
        };
        let resp = access::execute(&self.engine, &grant, Command::Scan(cmd))
            .await
            .map_err(err)?;
        let Reply::Keys { keys, token } = resp.reply else {
            return Err(Status::internal("scan returned no keys"));
        };
        Ok(Response::new(pb::ScanResponse {
            keys: keys.into_iter().map(|k| k.to_vec()).collect(),
            continuation_token: token
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default(),
        }))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let keys = r.keys.into_iter().map(Bytes::from).collect();
        let selector = Selector::new(keys, &r.patterns).map_err(Status::invalid_argument)?;
        let since = hlc(&r.since_version).map_err(|_| Status::invalid_argument("since_version is not a version"))?;
        let slot = self.access.open_stream(grant.principal()).map_err(err)?;
        // Only keys the caller may read, by the rules in force when each is sent.
        let caller = grant.clone();
        let spec = WatchSpec {
            only: selector.only_keys(),
            wanted: KeyFilter::new(move |k| selector.wants(k, || String::from_utf8_lossy(k)) && grant.may(Op::Read, k)),
            prefix: Bytes::new(),
        };
        let stream = self
            .engine
            .watch(spec, Start::from_request(since, r.snapshot))
            .map(move |item| {
                // The stream holds its slot of the caller's stream limit until it ends.
                let _open = &slot;
                watch_event(item)
            });
        Ok(Response::new(Box::pin(until_stopped(
            &self.obs,
            caller,
            stream,
            "watch again",
        ))))
    }
}

/// A key as `Get` (and each item of `GetMany`) answers it.
fn get_response(entry: Option<Entry>) -> pb::GetResponse {
    match entry {
        None => pb::GetResponse::default(),
        Some(e) => pb::GetResponse {
            found: true,
            value: e.value.to_vec(),
            version: e.version.to_string(),
            expires_at_ms: e.expires_at_ms.unwrap_or(0),
        },
    }
}

/// A long-lived stream of this door, ended with UNAVAILABLE "shutting down" (saying to
/// `again`) when the service stops, which graceful shutdown waits for, or UNAUTHENTICATED when
/// a reload removed the caller's token; it counts as an open stream while it runs.
pub(crate) fn until_stopped<T, S>(
    obs: &crate::health::Observe,
    grant: crate::access::Grant,
    stream: S,
    again: &'static str,
) -> impl Stream<Item = Result<T, Status>> + Send + use<T, S>
where
    T: Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + 'static,
{
    let active = obs.metrics.stream_opened(crate::metrics::Stream::GrpcWatch);
    let stopped = obs.clone();
    let ending = grant.clone();
    let stream = futures_util::StreamExt::take_until(stream, async move {
        tokio::select! {
            () = stopped.stopped() => {}
            () = ending.revoked() => {}
        }
    });
    let stopping = obs.stopping.clone();
    let last = futures_util::stream::once(async move {
        let _active = active;
        if grant.is_revoked() {
            return Some(Err(Status::unauthenticated("the token of this stream was revoked")));
        }
        (*stopping.borrow()).then(|| Err(Status::unavailable(format!("the service is shutting down; {again}"))))
    })
    .filter_map(|e| e);
    stream.chain(last)
}

/// One watch item on the wire.
fn watch_event(item: WatchItem) -> Result<pb::WatchEvent, Status> {
    use pb::watch_event::Kind;
    let marker = |kind: Kind, version: String| pb::WatchEvent {
        kind: kind as i32,
        version,
        ..Default::default()
    };
    Ok(match item {
        WatchItem::Change { event, resumable } => {
            let c = &event.change;
            let (kind, value) = match &c.kind {
                ChangeKind::Set(v) => (Kind::Set, v.to_vec()),
                ChangeKind::Delete => (Kind::Delete, Vec::new()),
                ChangeKind::Expire => (Kind::Expire, Vec::new()),
            };
            pb::WatchEvent {
                key: c.key.to_vec(),
                kind: kind as i32,
                value,
                version: c.version.to_string(),
                snapshot: !resumable,
            }
        }
        WatchItem::Snapshot { key, entry } => pb::WatchEvent {
            key: key.to_vec(),
            kind: Kind::Set as i32,
            value: entry.value.to_vec(),
            version: entry.version.to_string(),
            snapshot: true,
        },
        WatchItem::Reset => marker(Kind::Reset, String::new()),
        WatchItem::Synced { resume } => marker(Kind::Synced, version(resume)),
        WatchItem::Overflow { .. } => marker(Kind::Overflow, String::new()),
        WatchItem::Failed(e) => return Err(err(e)),
    })
}
