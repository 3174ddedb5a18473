//! Resumable watches over SSE and gRPC: a watcher cut off while changes keep coming from every
//! door resumes with the last id it saw and gets exactly what it missed; one that resumes from
//! before the history kept gets `reset` + a snapshot and ends with the store's state; a
//! snapshot under concurrent writes has no gap and no repeat (replayed into a map, compared with
//! the store).

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use bytes::Bytes;
use serde_json::Value;
use stategate::grpc::pb::statestore::v1 as npb;
use tokio::task::JoinHandle;

use crate::support::{Broker, RawClient, TestEnv, now_ts, prop, unique_id, within};

/// One client per door, to write as other clients would.
pub(crate) struct Doors {
    mqtt: RawClient,
    http: reqwest::Client,
    base: String,
    native: npb::state_store_client::StateStoreClient<tonic::transport::Channel>,
}

impl Doors {
    pub(crate) async fn connect(env: &TestEnv) -> Doors {
        Doors {
            mqtt: RawClient::connect(env.broker_port, &unique_id("writer")).await,
            http: reqwest::Client::new(),
            base: env.http(),
            native: npb::state_store_client::StateStoreClient::connect(env.grpc())
                .await
                .expect("grpc"),
        }
    }

    /// Sets `key` through door `n % 3` (MQTT, HTTP, gRPC); the new version.
    pub(crate) async fn set(&mut self, n: usize, key: &str, value: &str) -> String {
        match n % 3 {
            0 => {
                let p = self
                    .mqtt
                    .request(&[b"SET", key.as_bytes(), value.as_bytes()], &[("__ts", &now_ts())])
                    .await;
                assert_eq!(&p.payload[..], b"+OK\r\n", "MQTT SET {key}");
                prop(&p, "__ts").expect("__ts").to_owned()
            }
            1 => {
                let r = self
                    .http
                    .post(format!("{}/v1.0/state/statestore", self.base))
                    .json(&serde_json::json!([{"key": key, "value": value}]))
                    .send()
                    .await
                    .expect("HTTP save");
                assert_eq!(r.status(), 204, "HTTP save {key}");
                r.headers()["etag"].to_str().unwrap().to_owned()
            }
            _ => {
                let r = within(
                    "gRPC Set",
                    self.native.set(npb::SetRequest {
                        key: key.as_bytes().to_vec(),
                        value: value.as_bytes().to_vec(),
                        ..Default::default()
                    }),
                )
                .await
                .expect("gRPC Set")
                .into_inner();
                r.version
            }
        }
    }

    /// Deletes `key` through MQTT or gRPC (the doors that answer the deletion's version).
    pub(crate) async fn del(&mut self, n: usize, key: &str) {
        if n.is_multiple_of(2) {
            self.mqtt
                .request(&[b"DEL", key.as_bytes()], &[("__ts", &now_ts())])
                .await;
        } else {
            within(
                "gRPC Del",
                self.native.del(npb::DelRequest {
                    key: key.as_bytes().to_vec(),
                    ..Default::default()
                }),
            )
            .await
            .expect("gRPC Del");
        }
    }
}

/// A watch event, whichever door it came through.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Set {
        key: String,
        value: Vec<u8>,
        version: String,
        resumable: bool,
    },
    Del {
        key: String,
        version: String,
        resumable: bool,
    },
    Reset,
    Synced(Option<String>),
}

impl Ev {
    /// The resume position this event names, if any.
    fn resume(&self) -> Option<&str> {
        match self {
            Ev::Set {
                version,
                resumable: true,
                ..
            }
            | Ev::Del {
                version,
                resumable: true,
                ..
            } => Some(version),
            Ev::Synced(v) => v.as_deref(),
            _ => None,
        }
    }
}

/// A watch over SSE or gRPC.
enum Watcher {
    /// `asked`: the position the watch was asked to resume from ("" when none).
    Sse {
        resp: reqwest::Response,
        buf: Vec<u8>,
        asked: String,
    },
    Grpc(tonic::Streaming<npb::WatchEvent>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    Sse,
    Grpc,
}

impl Watcher {
    /// Watches keys matching `pattern`, resuming after `since` (SSE: as `Last-Event-ID`).
    async fn open(env: &TestEnv, door: Door, pattern: &str, since: Option<&str>, snapshot: bool) -> Watcher {
        match door {
            Door::Sse => {
                let mut req = reqwest::Client::new()
                    .get(format!("{}/v1.0-alpha1/state/statestore/subscribe", env.http()))
                    .query(&[("pattern", pattern), ("contentEncoding", "base64")]);
                if snapshot {
                    req = req.query(&[("snapshot", "true")]);
                }
                if let Some(v) = since {
                    req = req.header("Last-Event-ID", v);
                }
                let resp = within("SSE subscribe", req.send()).await.expect("subscribe");
                assert_eq!(resp.status(), 200);
                Watcher::Sse {
                    resp,
                    buf: Vec::new(),
                    asked: since.unwrap_or_default().to_owned(),
                }
            }
            Door::Grpc => {
                let mut c = npb::state_store_client::StateStoreClient::connect(env.grpc())
                    .await
                    .expect("grpc");
                let req = npb::WatchRequest {
                    patterns: vec![pattern.into()],
                    since_version: since.unwrap_or_default().into(),
                    snapshot,
                    ..Default::default()
                };
                Watcher::Grpc(within("Watch", c.watch(req)).await.expect("Watch").into_inner())
            }
        }
    }

    async fn next(&mut self) -> Ev {
        within("a watch event", self.next_unbounded()).await
    }

    async fn next_unbounded(&mut self) -> Ev {
        match self {
            Watcher::Grpc(s) => {
                use npb::watch_event::Kind;
                let e = s.message().await.expect("watch stream").expect("watch open");
                let key = String::from_utf8(e.key.clone()).expect("utf8 key");
                match e.kind() {
                    Kind::Set => Ev::Set {
                        key,
                        value: e.value,
                        version: e.version,
                        resumable: !e.snapshot,
                    },
                    Kind::Delete | Kind::Expire => Ev::Del {
                        key,
                        version: e.version,
                        resumable: !e.snapshot,
                    },
                    Kind::Reset => Ev::Reset,
                    Kind::Synced => Ev::Synced((!e.version.is_empty()).then_some(e.version)),
                    other => panic!("unexpected {other:?}"),
                }
            }
            Watcher::Sse { resp, buf, asked } => loop {
                if let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                    let block = String::from_utf8(buf.drain(..end + 2).collect()).expect("utf8 event");
                    if let Some(ev) = sse_event(&block, asked) {
                        return ev;
                    }
                    continue;
                }
                let chunk = resp.chunk().await.expect("SSE stream").expect("SSE open");
                buf.extend_from_slice(&chunk);
            },
        }
    }
}

/// One SSE event block as an [`Ev`] (`None`: a comment). Every event has an id: a change's is
/// its version, `synced`'s the resume position; the rest (a snapshot's, the reset) repeat the
/// position asked for, so a reconnect in the middle of a snapshot asks for it again.
fn sse_event(block: &str, asked: &str) -> Option<Ev> {
    let (mut name, mut id, mut data) = (None, None, String::new());
    for line in block.lines() {
        match line.split_once(':') {
            Some(("event", v)) => name = Some(v.trim_start().to_owned()),
            Some(("id", v)) => id = Some(v.trim_start().to_owned()),
            Some(("data", v)) => data.push_str(v.trim_start()),
            _ => {}
        }
    }
    let name = name?;
    let v: Value = serde_json::from_str(&data).expect("event data is JSON");
    let key = v["key"].as_str().unwrap_or_default().to_owned();
    let version = v["etag"].as_str().unwrap_or_default().to_owned();
    let snapshot = v["snapshot"] == true;
    let id = id.unwrap_or_else(|| panic!("no id: {block}"));
    match name.as_str() {
        "synced" => assert!(!id.is_empty(), "{block}"),
        "reset" => assert_eq!(id, asked, "{block}"),
        _ if snapshot => assert_eq!(id, asked, "a snapshot's event repeats the position asked: {block}"),
        _ => assert_eq!(id, version, "a change's id is its version"),
    }
    let id = Some(id);
    Some(match name.as_str() {
        "set" => Ev::Set {
            key,
            value: base64::engine::general_purpose::STANDARD
                .decode(v["data"].as_str().expect("base64 data"))
                .expect("base64"),
            version,
            resumable: !snapshot,
        },
        "delete" => Ev::Del {
            key,
            version,
            resumable: !snapshot,
        },
        "reset" => Ev::Reset,
        "synced" => Ev::Synced(id),
        other => panic!("unexpected event {other}: {block}"),
    })
}

/// A watcher's view, built only from events; panics on a repeated (key, version) or a version
/// going backwards.
#[derive(Default)]
struct Replica {
    map: BTreeMap<String, (Vec<u8>, String)>,
    seen: HashSet<(String, String)>,
    last_resume: Option<String>,
}

impl Replica {
    fn apply(&mut self, ev: &Ev) {
        if let Some(v) = ev.resume() {
            self.last_resume = Some(v.to_owned());
        }
        match ev {
            Ev::Set {
                key, value, version, ..
            } => {
                assert!(
                    self.seen.insert((key.clone(), version.clone())),
                    "repeated {key} {version}"
                );
                if let Some((_, old)) = self.map.get(key) {
                    assert!(old < version, "{key}: {version} after {old}");
                }
                self.map.insert(key.clone(), (value.clone(), version.clone()));
            }
            Ev::Del { key, version, .. } => {
                assert!(
                    self.seen.insert((key.clone(), version.clone())),
                    "repeated {key} {version}"
                );
                self.map.remove(key);
            }
            Ev::Reset => self.map.clear(),
            Ev::Synced(_) => {}
        }
    }

    /// Applies events until `key` is set to `value`.
    async fn until(&mut self, w: &mut Watcher, key: &str, value: &[u8]) -> Vec<Ev> {
        let mut got = Vec::new();
        loop {
            let ev = w.next().await;
            self.apply(&ev);
            let done = matches!(&ev, Ev::Set { key: k, value: v, .. } if k == key && v == value);
            got.push(ev);
            if done {
                return got;
            }
        }
    }
}

/// The store's keys under `prefix` with their values and versions.
async fn store_contents(env: &TestEnv, prefix: &str) -> BTreeMap<String, (Vec<u8>, String)> {
    let mut out = BTreeMap::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = env
            .engine()
            .keys_with_prefix(prefix.as_bytes(), after.as_deref(), 1000)
            .await
            .unwrap();
        for k in page.keys {
            if let Some(e) = env.engine().read(&k).await.unwrap() {
                out.insert(
                    String::from_utf8(k.to_vec()).unwrap(),
                    (e.value.to_vec(), e.version.to_string()),
                );
            }
        }
        match page.resume_after {
            Some(r) if r.starts_with(prefix.as_bytes()) => after = Some(r),
            _ => return out,
        }
    }
}

/// Writes `n` changes to `w*` keys through every door, in turn; sets and deletes.
fn writer(env: &TestEnv, from: usize, n: usize) -> JoinHandle<()> {
    let (broker, base, grpc) = (env.broker_port, env.http(), env.grpc());
    tokio::spawn(async move {
        let mut doors = Doors {
            mqtt: RawClient::connect(broker, &unique_id("w")).await,
            http: reqwest::Client::new(),
            base,
            native: npb::state_store_client::StateStoreClient::connect(grpc)
                .await
                .expect("grpc"),
        };
        for i in from..from + n {
            let key = format!("w{:02}", i % 23);
            if i % 7 == 3 {
                doors.del(i, &key).await;
            } else {
                doors.set(i, &key, &format!("v{i}")).await;
            }
        }
    })
}

async fn cut_and_resume(door: Door) {
    let env = TestEnv::start(Broker::Embedded).await;
    let mut doors = Doors::connect(&env).await;
    let mut whole = Watcher::open(&env, door, "w*", None, false).await;
    let mut cut = Watcher::open(&env, door, "w*", None, false).await;
    let first = writer(&env, 0, 150);
    // Read part of the stream, then drop the connection while changes keep coming.
    let mut before = Vec::new();
    while before.len() < 40 {
        before.push(cut.next().await);
    }
    drop(cut);
    let second = writer(&env, 150, 150);
    let last = before
        .iter()
        .rev()
        .find_map(Ev::resume)
        .expect("a resume position")
        .to_owned();
    let mut resumed = Watcher::open(&env, door, "w*", Some(&last), false).await;
    within("the writers", async {
        first.await.unwrap();
        second.await.unwrap();
    })
    .await;
    doors.set(0, "w-end", "end").await;
    let all = Replica::default().until(&mut whole, "w-end", b"end").await;
    let after = Replica::default().until(&mut resumed, "w-end", b"end").await;
    assert!(
        all.iter().all(|e| e.resume().is_some()),
        "a live watch sends resume positions only"
    );
    let mut stitched = before;
    stitched.extend(after);
    assert_eq!(stitched.len(), all.len(), "events before the cut + after the resume");
    assert_eq!(stitched, all, "exactly the missed changes, in order, none twice");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resume_with_last_event_id_gets_exactly_what_was_missed() {
    cut_and_resume(Door::Sse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_resume_with_since_version_gets_exactly_what_was_missed() {
    cut_and_resume(Door::Grpc).await;
}

async fn resume_older_than_the_history(door: Door) {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.limits.feed.max_events = 8;
        c.limits.scan_page = 5;
    })
    .await;
    let mut doors = Doors::connect(&env).await;
    let mut w = Watcher::open(&env, door, "w*", None, false).await;
    let mut replica = Replica::default();
    for i in 0..6 {
        doors.set(i, &format!("w{i:02}"), "old").await;
    }
    replica.until(&mut w, "w05", b"old").await;
    drop(w);
    // Far more changes than the history keeps: the watcher's position is gone.
    within("the writer", writer(&env, 0, 60)).await.unwrap();
    let since = replica.last_resume.clone().expect("a position");
    let mut w = Watcher::open(&env, door, "w*", Some(&since), false).await;
    assert_eq!(w.next().await, Ev::Reset);
    loop {
        let ev = w.next().await;
        replica.apply(&ev);
        match ev {
            Ev::Synced(v) => {
                assert!(v.is_some(), "the end of the snapshot names a position");
                break;
            }
            Ev::Set { resumable: false, .. } => {}
            other => panic!("only the snapshot before `synced`: {other:?}"),
        }
    }
    assert_eq!(
        replica.map,
        store_contents(&env, "w").await,
        "consistent after the snapshot"
    );
    // Then live changes (fewer than the history holds: this watcher may read slowly).
    within("the writer", writer(&env, 60, 5)).await.unwrap();
    doors.set(0, "w-end", "end").await;
    replica.until(&mut w, "w-end", b"end").await;
    doors.set(0, "w-end", "end2").await;
    replica.until(&mut w, "w-end", b"end2").await;
    assert_eq!(replica.map, store_contents(&env, "w").await);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resume_older_than_the_history_resets_and_snapshots() {
    resume_older_than_the_history(Door::Sse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_resume_older_than_the_history_resets_and_snapshots() {
    resume_older_than_the_history(Door::Grpc).await;
}

async fn snapshot_under_concurrent_writes(door: Door) {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.limits.scan_page = 7).await;
    let mut doors = Doors::connect(&env).await;
    for i in 0..23 {
        doors.set(i, &format!("w{i:02}"), "initial").await;
    }
    let writers = [writer(&env, 0, 200), writer(&env, 1000, 200)];
    let mut w = Watcher::open(&env, door, "w*", None, true).await;
    let mut replica = Replica::default();
    loop {
        let ev = w.next().await;
        replica.apply(&ev);
        if matches!(ev, Ev::Synced(_)) {
            break;
        }
        assert!(
            ev.resume().is_none(),
            "nothing before `synced` is a resume position: {ev:?}"
        );
    }
    for t in writers {
        within("the writers", t).await.unwrap();
    }
    doors.set(2, "w-end", "end").await;
    replica.until(&mut w, "w-end", b"end").await;
    assert_eq!(
        replica.map,
        store_contents(&env, "w").await,
        "no gap: the replay is the store"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_snapshot_under_concurrent_writes_has_no_gap_and_no_repeat() {
    snapshot_under_concurrent_writes(Door::Sse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_snapshot_under_concurrent_writes_has_no_gap_and_no_repeat() {
    snapshot_under_concurrent_writes(Door::Grpc).await;
}

/// Bad resume positions are refused up front; the stream never starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_resume_positions_are_refused() {
    let env = TestEnv::start(Broker::Embedded).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1.0-alpha1/state/statestore/subscribe", env.http());
    for (query, header) in [
        ("since=nope", None),
        ("snapshot=maybe", None),
        ("", Some("not-a-version")),
    ] {
        let mut req = c.get(format!("{url}?{query}"));
        if let Some(h) = header {
            req = req.header("Last-Event-ID", h);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 400, "{query} {header:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST");
    }
    let mut n = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap();
    let bad = npb::WatchRequest {
        since_version: "nope".into(),
        ..Default::default()
    };
    let status = within("Watch", n.watch(bad)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    env.stop().await;
}
