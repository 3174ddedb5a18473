//! A full disk: the write that does not fit is refused and taken back (nothing of it stays in
//! the log or the index), reads go on, later writes are refused until space is freed, and then
//! writes resume by themselves. The real thing (a small tmpfs) is in tests/it/durability.rs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::*;

fn backend(dir: &Path) -> DurableBackend {
    let mut o = options(dir);
    o.full_retry = Duration::from_millis(20);
    DurableBackend::open(o).unwrap()
}

async fn set(b: &DurableBackend, key: &[u8], value: &[u8], ms: u64) -> Result<SwapOutcome, StorageError> {
    let cur = b.get(key).await.unwrap().map(|r| r.version);
    let swap = Swap {
        key: Bytes::copy_from_slice(key),
        expected: cur,
        new: Some(rec(value, v(ms, 0))),
        deadline: crate::DeadlineCheck::Any,
    };
    b.swap_many(&[swap], None).await
}

/// Waits (bounded) until the backend's health is `want`.
async fn health_becomes(b: &DurableBackend, want: fn(&StorageHealth) -> bool) {
    let mut rx = b.health_changes().expect("the durable backend reports its health");
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(want))
        .await
        .expect("the health changed in time")
        .expect("the backend is alive");
}

#[tokio::test]
async fn a_write_that_does_not_fit_is_taken_back_and_writes_resume() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path());
    set(&b, b"k1", b"v1", 10).await.unwrap();
    let log = last_segment(dir.path());
    let before = std::fs::metadata(&log).unwrap().len();

    b.shared.disk_full.store(true, Ordering::Relaxed);
    let refused = set(&b, b"k1", b"v2", 11).await;
    assert!(matches!(refused, Err(StorageError::Full(_))), "{refused:?}");
    let refused = set(&b, b"k2", b"new", 12).await;
    assert!(
        matches!(refused, Err(StorageError::Full(_))),
        "refused up front: {refused:?}"
    );
    assert!(matches!(b.health(), StorageHealth::Full { .. }), "{:?}", b.health());
    // Nothing of the refused writes stays: reads serve what was there before.
    assert_eq!(b.get(b"k1").await.unwrap(), Some(rec(b"v1", v(10, 0))));
    assert_eq!(b.get(b"k2").await.unwrap(), None);
    assert_eq!(b.len().await.unwrap(), 1);
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        before,
        "the partial write was cut"
    );

    b.shared.disk_full.store(false, Ordering::Relaxed);
    health_becomes(&b, |h| *h == StorageHealth::Ok).await;
    assert_eq!(set(&b, b"k2", b"new", 13).await.unwrap(), SwapOutcome::Done);
    assert_eq!(set(&b, b"k1", b"v3", 14).await.unwrap(), SwapOutcome::Done);
    drop(b);

    // The log holds whole records only, each once.
    assert_eq!(frame_ends(&log).len(), 3);
    let store = open(dir.path());
    assert_eq!(get(&store, b"k1").await, Some(rec(b"v3", v(14, 0))));
    assert_eq!(get(&store, b"k2").await, Some(rec(b"new", v(13, 0))));
    assert_eq!(store.backend().len().await.unwrap(), 2);
}

/// Writers in flight when the disk fills: each write is either acknowledged (and stays, after
/// a reopen too) or refused (and leaves no trace); multi-key swaps are taken back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_see_acknowledged_or_refused_never_half() {
    let dir = tempfile::tempdir().unwrap();
    let b = Arc::new(backend(dir.path()));
    let (acked, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let (b, acked, refused) = (b.clone(), acked.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            // The last value each of this task's two keys was acknowledged with.
            let mut last_ok: Option<u64> = None;
            let (ka, kb) = (format!("a{t}"), format!("b{t}"));
            for i in 1..=200u64 {
                let cur = b.get(ka.as_bytes()).await.unwrap().map(|r| r.version);
                let value = format!("{i}");
                let swaps = [
                    Swap {
                        key: Bytes::from(ka.clone()),
                        expected: cur.clone(),
                        new: Some(rec(value.as_bytes(), v(t * 1000 + i, 0))),
                        deadline: crate::DeadlineCheck::Any,
                    },
                    Swap {
                        key: Bytes::from(kb.clone()),
                        expected: cur,
                        new: Some(rec(value.as_bytes(), v(t * 1000 + i, 0))),
                        deadline: crate::DeadlineCheck::Any,
                    },
                ];
                match b.swap_many(&swaps, None).await {
                    Ok(SwapOutcome::Done) => {
                        last_ok = Some(i);
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(StorageError::Full(_)) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("{other:?}"),
                }
                // What a reader sees is always the last acknowledged state.
                let seen = b.get(kb.as_bytes()).await.unwrap().map(|r| r.value);
                assert_eq!(seen, last_ok.map(|i| Bytes::from(format!("{i}"))), "task {t} at {i}");
                tokio::task::yield_now().await;
            }
            (t, last_ok)
        }));
    }
    // Fill the disk in the middle of the load, until some writes were refused.
    let reach = async |n: &AtomicU64, at_least: u64| {
        let wait = async {
            while n.load(Ordering::Relaxed) < at_least {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("the load went on");
    };
    reach(&acked, 200).await;
    b.shared.disk_full.store(true, Ordering::Relaxed);
    health_becomes(&b, |h| matches!(h, StorageHealth::Full { .. })).await;
    reach(&refused, 50).await;
    b.shared.disk_full.store(false, Ordering::Relaxed);
    let mut expected = Vec::new();
    for task in tasks {
        expected.push(task.await.unwrap());
    }
    let (acked, refused) = (acked.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    eprintln!("{acked} writes acknowledged, {refused} refused");
    assert!(acked < 3200 && refused >= 50);
    let b = Arc::try_unwrap(b).expect("the only handle");
    drop(b);
    let store = open(dir.path());
    for (t, last_ok) in expected {
        for k in [format!("a{t}"), format!("b{t}")] {
            let got = get(&store, k.as_bytes()).await.map(|r| r.value);
            assert_eq!(got, last_ok.map(|i| Bytes::from(format!("{i}"))), "{k} after a reopen");
        }
    }
}

/// Other I/O errors stay a fail-stop; a full disk is not one.
#[tokio::test]
async fn health_tells_full_from_failed() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path());
    assert_eq!(b.health(), StorageHealth::Ok);
    b.panic_next_commit();
    assert!(set(&b, b"k", b"v", 1).await.is_err());
    // The writer learns of the failure as the thread unwinds; the health follows.
    health_becomes(&b, |h| matches!(h, StorageHealth::Failed { .. })).await;
}
