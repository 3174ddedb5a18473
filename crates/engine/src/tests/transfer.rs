//! Import (`engine/transfer.rs`): records keep their versions, yet the change history never
//! names one position twice (a resume from a version an import repeats skips nothing), and a
//! key protected by a fencing token is replaced only by a record with an equal or higher token,
//! or when the caller asks for it explicitly.

use std::time::Duration;

use futures_util::StreamExt;

use super::*;
use crate::watch::{Start, WatchItem, WatchSpec};

async fn memory() -> Fx {
    fx_on(Store::memory(), Limits::default()).await
}

fn every_key() -> WatchSpec {
    WatchSpec {
        wanted: KeyFilter::new(|_| true),
        prefix: Bytes::new(),
        only: None,
    }
}

/// What a watch sends before it would wait. Only for the memory store: its watch answers
/// every item at once (and a timeout polls the stream before its clock), so a pause means the
/// watch has nothing more, however loaded the machine.
pub(super) async fn sent(engine: &Engine, start: Start) -> Vec<WatchItem> {
    let mut stream = Box::pin(engine.watch(every_key(), start));
    let mut out = Vec::new();
    while let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(200), stream.next()).await {
        out.push(item);
    }
    out
}

/// What a watch sends until `done` holds for the items so far (or 10 s pass: the items so far).
/// For a store read over the network, where a pause between items says nothing.
async fn sent_until(engine: &Engine, start: Start, done: impl Fn(&[WatchItem]) -> bool) -> Vec<WatchItem> {
    let mut stream = Box::pin(engine.watch(every_key(), start));
    let mut out = Vec::new();
    let patience = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(&out) {
        match tokio::time::timeout_at(patience, stream.next()).await {
            Ok(Some(item)) => out.push(item),
            Ok(None) | Err(_) => break,
        }
    }
    out
}

/// A watcher that saw `v` and nothing after it either is sent every later change (the delete
/// among them) or starts over (a reset and a snapshot): never nothing.
pub(super) fn skips_nothing(items: &[WatchItem], deleted: &[u8]) -> bool {
    let reset = matches!(items.first(), Some(WatchItem::Reset));
    let delete = items.iter().any(|i| {
        matches!(i, WatchItem::Change { event, .. }
            if event.change.key == deleted && event.change.kind == ChangeKind::Delete)
    });
    reset || delete
}

/// Export, delete, import: the imported record keeps its version, and a watcher that resumes
/// from that version (it saw the first SET and nothing after) still learns of the delete.
#[tokio::test]
async fn a_resume_from_a_version_an_import_repeats_skips_nothing() {
    let mut f = memory().await;
    let v1 = f.ok(&["SET", "k", "one"]).await.version.unwrap();
    let (records, _) = f.engine.export_page(None, 10).await.unwrap();
    f.ok(&["DEL", "k"]).await;
    f.ok(&["SET", "other", "x"]).await;
    let report = f.engine.import(records, ImportOptions::default()).await.unwrap();
    assert_eq!(report.imported, 1);
    assert_eq!(f.record("k").await.unwrap().version, v1, "the import keeps the version");

    let items = sent(&f.engine, Start::After(v1.clone())).await;
    assert!(skips_nothing(&items, b"k"), "the delete was skipped: {items:?}");
    assert!(
        matches!(items.last(), Some(WatchItem::Synced { .. })),
        "a reset is followed by a snapshot: {items:?}"
    );
    assert!(
        items
            .iter()
            .any(|i| matches!(i, WatchItem::Snapshot { key, .. } if key == "k"))
    );
    // A watcher that was reading when the import came is told it missed changes (its stream
    // ends with `overflow`, and its resume gets a snapshot): not left with a stale view.
    assert!(matches!(f.feed.try_recv(), Some(Err(Lagged { .. }))));
}

/// An imported version above everything the history held is an ordinary change: watchers get
/// it without starting over.
#[tokio::test]
async fn an_import_from_the_future_is_an_ordinary_change() {
    let f = memory().await;
    let before = f.ok(&["SET", "a", "1"]).await.version.unwrap();
    let later = Record {
        value: b("imported"),
        version: Hlc::new(T0 + 1_000, 0, "elsewhere"),
        fencing: None,
        expires_at_ms: None,
        slide_ms: None,
    };
    f.engine
        .import(vec![(b("b"), later.clone())], ImportOptions::default())
        .await
        .unwrap();
    let items = sent(&f.engine, Start::After(before)).await;
    match items.as_slice() {
        [WatchItem::Change { event, .. }] => assert_eq!(event.change.version, later.version),
        other => panic!("{other:?}"),
    }
}

/// A fenced key: an imported record without a token (or with a lower one) does not replace it,
/// whatever its version; one with an equal or higher token does, like a SET with that token.
#[tokio::test]
async fn an_import_does_not_replace_a_fenced_key_without_its_token() {
    let f = memory().await;
    let token = hlc(T0, 5);
    f.run(&["SET", "lock", "held"], ft(token.clone())).await.unwrap();
    let fenced = f.record("lock").await.unwrap();
    let newer = |fencing: Option<Hlc>| Record {
        value: b("imported"),
        version: Hlc::new(T0 + 10, 0, "elsewhere"),
        fencing,
        expires_at_ms: None,
        slide_ms: None,
    };
    let overwrite = ImportOptions {
        overwrite: true,
        ..ImportOptions::default()
    };
    for fencing in [None, Some(hlc(T0, 4))] {
        let report = f
            .engine
            .import(vec![(b("lock"), newer(fencing.clone()))], overwrite)
            .await
            .unwrap();
        assert_eq!((report.imported, report.fenced), (0, 1), "token {fencing:?}");
        assert_eq!(f.record("lock").await.unwrap(), fenced, "token {fencing:?}");
    }
    let report = f
        .engine
        .import(vec![(b("lock"), newer(Some(token.clone())))], ImportOptions::default())
        .await
        .unwrap();
    assert_eq!(report.imported, 1);
    assert_eq!(f.record("lock").await.unwrap().value, b("imported"), "the same token");

    // Only when asked: the fence goes, with the imported record's own token (none here).
    f.run(&["SET", "lock", "held"], ft(hlc(T0 + 20, 0))).await.unwrap();
    let mut older = newer(None);
    older.version = Hlc::new(T0 + 30, 0, "elsewhere");
    let asked = ImportOptions {
        overwrite_fenced: true,
        ..ImportOptions::default()
    };
    let report = f.engine.import(vec![(b("lock"), older.clone())], asked).await.unwrap();
    assert_eq!((report.imported, report.fenced), (1, 0));
    assert_eq!(f.record("lock").await.unwrap(), older);
}

/// Replicas on one Redis: the import's changes reach the other replica's history through the
/// shared log, and there too a resume from a repeated version skips nothing.
#[cfg(feature = "redis")]
#[tokio::test]
async fn on_replicas_a_resume_from_a_repeated_version_skips_nothing() {
    use crate::storage::redis::server::{Flavor, TestServer};
    use crate::storage::{RedisOptions, StorageKind};

    let server = TestServer::start(Flavor::Redis);
    let Ok(StorageKind::Redis(url)) = server.url().parse() else {
        panic!("not a redis url");
    };
    let mut replicas = Vec::new();
    for node in ["a", "b"] {
        let options = RedisOptions {
            prefix: "transfer-test:".into(),
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let store = Store::new(crate::storage::redis::RedisBackend::open(&url, &options).await.unwrap());
        let clock = Arc::new(ManualClock::new(T0));
        let engine = Engine::open(store.clone(), node, clock.clone(), Limits::default())
            .await
            .unwrap();
        let feed = engine.subscribe();
        replicas.push(Fx {
            engine,
            clock,
            store,
            feed,
        });
    }
    let (a, mut b) = (replicas.remove(0), replicas.remove(0));
    let v1 = a.ok(&["SET", "k", "one"]).await.version.unwrap();
    let (records, _) = a.engine.export_page(None, 10).await.unwrap();
    a.ok(&["DEL", "k"]).await;
    a.engine.import(records, ImportOptions::default()).await.unwrap();
    // Everything before the marker has reached b's history once the marker has.
    a.ok(&["SET", "marker", "m"]).await;
    let patience = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(patience, b.feed.recv()).await {
            Ok(Ok(e)) if e.change.key == "marker" => break,
            Ok(_) => {}
            Err(_) => panic!("the marker did not reach b"),
        }
    }
    // Read from Redis: wait for what must come (bounded), not for a pause.
    let items = sent_until(&b.engine, Start::After(v1), |items| skips_nothing(items, b"k")).await;
    assert!(skips_nothing(&items, b"k"), "the delete was skipped: {items:?}");
}
