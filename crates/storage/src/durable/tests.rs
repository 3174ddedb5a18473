//! The durable backend: the storage contract, what survives a reopen, recovery of torn tails and
//! refusal of corruption, compaction. A reopen here is a clean close; the crash test (kill -9
//! of the real binary) is in tests/it/durability.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::Store;
use crate::hlc::ManualClock;

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn v(ms: u64, counter: u32) -> Hlc {
    Hlc::new(ms, counter, "t")
}

fn rec(value: &[u8], version: Hlc) -> Record {
    Record {
        value: b(value),
        version,
        fencing: None,
        expires_at_ms: None,
        slide_ms: None,
    }
}

fn options(dir: &Path) -> DurableOptions {
    DurableOptions::new(dir)
}

fn open(dir: &Path) -> Store {
    Store::new(DurableBackend::open(options(dir)).unwrap())
}

fn open_err(dir: &Path) -> StorageError {
    match DurableBackend::open(options(dir)) {
        Ok(_) => panic!("opened a store that should be refused"),
        Err(e) => e,
    }
}

async fn put(store: &Store, key: &[u8], r: Record) {
    let cur = store.backend().get(key).await.unwrap().map(|r| r.version);
    let swap = Swap {
        key: b(key),
        expected: cur,
        new: Some(r),
        deadline: crate::DeadlineCheck::Any,
    };
    assert_eq!(
        store.backend().swap_many(&[swap], None).await.unwrap(),
        SwapOutcome::Done
    );
}

async fn del(store: &Store, key: &[u8]) {
    let cur = store.backend().get(key).await.unwrap().map(|r| r.version);
    let swap = Swap {
        key: b(key),
        expected: cur,
        new: None,
        deadline: crate::DeadlineCheck::Any,
    };
    assert_eq!(
        store.backend().swap_many(&[swap], None).await.unwrap(),
        SwapOutcome::Done
    );
}

async fn get(store: &Store, key: &[u8]) -> Option<Record> {
    store.backend().get(key).await.unwrap()
}

/// Waits until the compaction the writes so far started, if any, is over
/// ([`DurableBackend::wait_compaction_settled`]): the files stay as they are until the next write.
async fn compaction_settled(backend: &Arc<DurableBackend>) {
    let backend = backend.clone();
    tokio::task::spawn_blocking(move || backend.wait_compaction_settled())
        .await
        .unwrap();
}

fn files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(prefix))
        .collect();
    v.sort();
    v
}

fn last_segment(dir: &Path) -> PathBuf {
    files(dir, "log-").pop().expect("a segment")
}

/// The end offset of every frame in a log segment.
fn frame_ends(path: &Path) -> Vec<usize> {
    let data = std::fs::read(path).unwrap();
    let mut pos = format::PLAIN_HEADER_LEN;
    let mut ends = Vec::new();
    while pos < data.len() {
        let (_, n) = format::read_frame(&data[pos..]).unwrap();
        pos += n;
        ends.push(pos);
    }
    ends
}

fn flip_byte(path: &Path, at: usize) {
    let mut data = std::fs::read(path).unwrap();
    data[at] ^= 0x5a;
    std::fs::write(path, data).unwrap();
}

#[tokio::test]
async fn contract_always() {
    let dir = tempfile::tempdir().unwrap();
    crate::tests::test_suite(open(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_batch_and_never_multi_thread() {
    for fsync in [FsyncMode::Batch, FsyncMode::Never] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = options(dir.path());
        o.fsync = fsync;
        crate::tests::test_suite(Store::new(DurableBackend::open(o).unwrap())).await;
    }
}

/// Everything a store serves, as the contract observes it (the highest version aside: a reopen
/// may raise it).
#[derive(Debug, PartialEq)]
struct Contents {
    records: Vec<(Bytes, Record)>,
    len: u64,
    next_deadline: Option<u64>,
}

async fn contents(store: &Store) -> Contents {
    let be = store.backend();
    let page = be.scan(None, usize::MAX, 0, &|_| true).await.unwrap();
    assert_eq!(page.resume_after, None);
    let mut records = Vec::new();
    for key in page.keys {
        let r = get(store, &key).await.expect("a scanned key is there");
        records.push((key, r));
    }
    Contents {
        records,
        len: be.len().await.unwrap(),
        next_deadline: be.next_deadline().await.unwrap(),
    }
}

/// After a clean close with compaction on: the one snapshot left is the newest one, `snap-N`
/// with N >= 2 (every rotation starts segment N+1 and a snapshot of it; closing joins the
/// snapshot in progress), and every segment before N and every older snapshot was removed, so
/// only `log-N` remains. Returns N.
fn assert_compacted(dir: &Path) -> u64 {
    let seq = |p: &PathBuf| -> u64 {
        let name = p.file_name().unwrap().to_str().unwrap();
        name[name.find('-').unwrap() + 1..name.find('.').unwrap()]
            .parse()
            .unwrap()
    };
    let snaps: Vec<u64> = files(dir, "snap-").iter().map(seq).collect();
    let logs: Vec<u64> = files(dir, "log-").iter().map(seq).collect();
    assert_eq!(snaps.len(), 1, "exactly one snapshot is left: {snaps:?}");
    let n = snaps[0];
    assert!(n >= 2, "the log was rotated and a snapshot committed: snap-{n}");
    assert_eq!(logs, vec![n], "the segments the snapshot replaces were removed");
    let snap_len = std::fs::metadata(dir.join(snapshot_name(n))).unwrap().len();
    assert!(
        snap_len > format::PLAIN_HEADER_LEN as u64,
        "the snapshot holds records: {snap_len} bytes"
    );
    n
}

/// The contract while the log is rotated and snapshotted after almost every write; then the
/// store reopened from that snapshot serves exactly what it served before closing, keeps
/// checking versions, and goes on compacting.
#[tokio::test]
async fn contract_with_constant_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.segment_bytes = 256;

    let store = Store::new(DurableBackend::open(o.clone()).unwrap());
    crate::tests::test_suite(store.clone()).await;
    let before = contents(&store).await;
    assert!(!before.records.is_empty(), "the suite leaves records behind");
    let max_before = store.backend().max_version().await.unwrap().unwrap();
    drop(store);
    let first = assert_compacted(dir.path());

    let store = Store::new(DurableBackend::open(o.clone()).unwrap());
    assert_eq!(
        contents(&store).await,
        before,
        "a reopen from the snapshot serves the same"
    );
    let max = store.backend().max_version().await.unwrap().unwrap();
    assert!(max >= max_before, "{max} < {max_before}");
    // Compare-and-set still checks the recovered versions.
    for (key, r) in &before.records {
        let insert = Swap {
            key: key.clone(),
            expected: None,
            new: Some(rec(b"x", v(1, 0))),
            deadline: crate::DeadlineCheck::Any,
        };
        assert_eq!(
            store.backend().swap_many(&[insert], None).await.unwrap(),
            SwapOutcome::Conflict
        );
        let delete = Swap {
            key: key.clone(),
            expected: Some(r.version.clone()),
            new: None,
            deadline: crate::DeadlineCheck::Any,
        };
        assert_eq!(
            store.backend().swap_many(&[delete], None).await.unwrap(),
            SwapOutcome::Done
        );
    }
    // Every field, so that a snapshot that loses one is caught by the reopen below.
    for i in 0..100u32 {
        let r = Record {
            value: b(format!("value {i}").as_bytes()),
            version: v(10_000 + u64::from(i), 0),
            fencing: (i % 3 == 0).then(|| v(7, i)),
            expires_at_ms: (i % 5 == 0).then_some(20_000 + u64::from(i)),
            slide_ms: None,
        };
        put(&store, format!("after-{i}").as_bytes(), r).await;
    }
    let after = contents(&store).await;
    assert_eq!(after.len, 100);
    drop(store);
    let second = assert_compacted(dir.path());
    assert!(
        second > first,
        "compaction went on after the reopen: {first} then {second}"
    );
    let store = Store::new(DurableBackend::open(o).unwrap());
    assert_eq!(contents(&store).await, after);
}

#[tokio::test]
async fn every_field_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let written_at = crate::hlc::Clock::now_ms(&crate::hlc::SystemClock);
    let full = Record {
        value: b(b"v\r\n\x00"),
        version: v(100, 7),
        // A client's fencing token can carry a long node id (over 64 KiB, multi-byte UTF-8).
        fencing: Some(Hlc::new(90, 3, "é".repeat(40_000))),
        expires_at_ms: Some(5_000),
        slide_ms: None,
    };
    {
        let store = open(dir.path());
        put(&store, b"full", full.clone()).await;
        put(&store, b"gone", rec(b"x", v(900, 0))).await;
        del(&store, b"gone").await;
        put(&store, b"over", rec(b"1", v(101, 0))).await;
        put(&store, b"over", rec(b"2", v(102, 0))).await;
        // A multi-key swap.
        let both = [
            Swap {
                key: b(b"m1"),
                expected: None,
                new: Some(rec(b"a", v(103, 0))),
                deadline: crate::DeadlineCheck::Any,
            },
            Swap {
                key: b(b"m2"),
                expected: None,
                new: Some(rec(b"b", v(103, 0))),
                deadline: crate::DeadlineCheck::Any,
            },
        ];
        assert_eq!(store.backend().swap_many(&both, None).await.unwrap(), SwapOutcome::Done);
        put(&store, b"", rec(b"", v(104, 0))).await;
    }
    let store = open(dir.path());
    assert_eq!(get(&store, b"full").await, Some(full));
    assert_eq!(get(&store, b"gone").await, None);
    assert_eq!(get(&store, b"over").await, Some(rec(b"2", v(102, 0))));
    assert_eq!(get(&store, b"m1").await, Some(rec(b"a", v(103, 0))));
    assert_eq!(get(&store, b"m2").await, Some(rec(b"b", v(103, 0))));
    assert_eq!(get(&store, b"").await, Some(rec(b"", v(104, 0))));
    assert_eq!(store.backend().len().await.unwrap(), 5);
    assert_eq!(store.backend().next_deadline().await.unwrap(), Some(5_000));
    let max = store.backend().max_version().await.unwrap().unwrap();
    assert!(
        max > v(900, 0),
        "above the highest version ever written, though its key was deleted: {max}"
    );
    assert!(max.ms > written_at, "above the wall clock of the last write: {max}");
}

#[tokio::test]
async fn a_snapshot_keeps_everything_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.segment_bytes = 1024;
    {
        let store = Store::new(DurableBackend::open(o.clone()).unwrap());
        put(&store, b"top", rec(b"x", v(5_000, 0))).await;
        del(&store, b"top").await;
        for i in 0..200u32 {
            let r = Record {
                value: b(format!("value {i}").as_bytes()),
                version: v(1_000 + u64::from(i), 0),
                fencing: (i % 3 == 0).then(|| v(7, i)),
                expires_at_ms: (i % 5 == 0).then_some(10_000 + u64::from(i)),
                slide_ms: None,
            };
            put(&store, format!("k{}", i % 50).as_bytes(), r).await;
        }
    }
    assert!(!files(dir.path(), "snap-").is_empty(), "a snapshot was written");
    let store = Store::new(DurableBackend::open(o).unwrap());
    assert_eq!(store.backend().len().await.unwrap(), 50);
    for k in 0..50u32 {
        let i = 150 + k;
        let r = get(&store, format!("k{k}").as_bytes()).await.unwrap();
        assert_eq!(r.value, b(format!("value {i}").as_bytes()));
        assert_eq!(r.version, v(1_000 + u64::from(i), 0));
        assert_eq!(r.fencing, (i % 3 == 0).then(|| v(7, i)));
        assert_eq!(r.expires_at_ms, (i % 5 == 0).then_some(10_000 + u64::from(i)));
    }
    let max = store.backend().max_version().await.unwrap().unwrap();
    assert!(max > v(5_000, 0), "{max}");
    assert_eq!(store.backend().next_deadline().await.unwrap(), Some(10_150));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_keep_disk_use_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.segment_bytes = 16 * 1024;
    o.fsync = FsyncMode::Never;
    let store = Store::new(DurableBackend::open(o.clone()).unwrap());
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1_000u64 {
                let key = format!("key-{t}-{}", i % 4);
                put(&store, key.as_bytes(), rec(&[b'x'; 100], v(t * 10_000 + i, 0))).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Closing joins a snapshot in progress.
    drop(store);
    assert_eq!(
        files(dir.path(), "snap-").len(),
        1,
        "snapshots were taken, old ones removed"
    );
    let disk = |dir: &Path| -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    };
    // Writes that went on during the last snapshot may have left the newest segment over its
    // budget; opening compacts it.
    drop(Store::new(DurableBackend::open(o.clone()).unwrap()));
    // 8 000 writes of ~140 bytes (about 1.1 MB of log) over 32 live keys.
    let total = disk(dir.path());
    assert!(total < 2 * o.segment_bytes, "{total} bytes on disk");
    assert_eq!(files(dir.path(), "log-").len(), 1);
    let store = Store::new(DurableBackend::open(o).unwrap());
    assert_eq!(store.backend().len().await.unwrap(), 32);
    for t in 0..8u64 {
        for j in 0..4u64 {
            let r = get(&store, format!("key-{t}-{j}").as_bytes()).await.unwrap();
            assert_eq!(r.version, v(t * 10_000 + 996 + j, 0));
        }
    }
}

#[tokio::test]
async fn a_torn_tail_at_any_offset_leaves_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    const N: usize = 12;
    {
        let store = open(dir.path());
        for i in 0..N {
            // A value of a few hundred bytes, so that cuts land inside values too.
            let value = vec![b'a' + i as u8; 40 * i];
            put(&store, format!("k{i}").as_bytes(), rec(&value, v(10 + i as u64, 0))).await;
        }
    }
    let seg = last_segment(dir.path());
    let ends = frame_ends(&seg);
    assert_eq!(ends.len(), N);
    let len = *ends.last().unwrap();
    // Cut from the end towards the start; each open cuts the file back to a frame boundary.
    for cut in (0..len).rev() {
        if (std::fs::metadata(&seg).unwrap().len() as usize) > cut {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&seg)
                .unwrap()
                .set_len(cut as u64)
                .unwrap();
        }
        let kept = ends.iter().filter(|&&e| e <= cut).count();
        let store = open(dir.path());
        for i in 0..N {
            let got = get(&store, format!("k{i}").as_bytes()).await;
            if i < kept {
                let r = got.unwrap_or_else(|| panic!("cut at {cut}: k{i} is missing"));
                assert_eq!(r.value.len(), 40 * i, "cut at {cut}: k{i} whole");
            } else {
                assert_eq!(got, None, "cut at {cut}: k{i} was cut off");
            }
        }
        assert_eq!(store.backend().len().await.unwrap(), kept as u64);
    }
    // The store still works after the harshest cut.
    let store = open(dir.path());
    put(&store, b"after", rec(b"1", v(99, 0))).await;
    drop(store);
    assert_eq!(get(&open(dir.path()), b"after").await.unwrap().value, b(b"1"));
}

#[tokio::test]
async fn garbage_or_zeros_after_the_last_record_are_a_torn_tail() {
    for tail in [vec![0u8; 4096], vec![0xff; 7], b"\x10\x00\x00\x00garbage!".to_vec()] {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path());
            put(&store, b"a", rec(b"1", v(1, 0))).await;
            put(&store, b"b", rec(b"2", v(2, 0))).await;
        }
        let seg = last_segment(dir.path());
        let before = std::fs::metadata(&seg).unwrap().len();
        let mut data = std::fs::read(&seg).unwrap();
        data.extend_from_slice(&tail);
        std::fs::write(&seg, data).unwrap();
        let store = open(dir.path());
        assert_eq!(get(&store, b"a").await.unwrap().value, b(b"1"));
        assert_eq!(get(&store, b"b").await.unwrap().value, b(b"2"));
        assert_eq!(std::fs::metadata(&seg).unwrap().len(), before, "the tail was cut");
    }
}

#[tokio::test]
async fn a_bad_record_followed_by_valid_ones_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        for i in 0..5u64 {
            put(&store, format!("k{i}").as_bytes(), rec(b"value", v(i + 1, 0))).await;
        }
    }
    let seg = last_segment(dir.path());
    let ends = frame_ends(&seg);
    // A byte inside the second record's payload.
    flip_byte(&seg, ends[0] + 12);
    let err = open_err(dir.path());
    let msg = err.to_string();
    assert!(matches!(err, StorageError::Corrupt(_)), "{msg}");
    assert!(msg.contains(&*seg.file_name().unwrap().to_string_lossy()), "{msg}");
    assert!(msg.contains(&format!("offset {}", ends[0])), "{msg}");
    // Refused again: nothing was cut.
    assert!(matches!(open_err(dir.path()), StorageError::Corrupt(_)));

    // The same damage in the very last record is a torn tail.
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        put(&store, b"a", rec(b"1", v(1, 0))).await;
        put(&store, b"b", rec(b"2", v(2, 0))).await;
    }
    let seg = last_segment(dir.path());
    let ends = frame_ends(&seg);
    flip_byte(&seg, ends[0] + 12);
    let store = open(dir.path());
    assert!(get(&store, b"a").await.is_some());
    assert_eq!(get(&store, b"b").await, None);
}

#[tokio::test]
async fn damage_to_a_snapshot_or_an_older_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.segment_bytes = 512;
    {
        let store = Store::new(DurableBackend::open(o.clone()).unwrap());
        for i in 0..40u64 {
            put(&store, format!("k{}", i % 10).as_bytes(), rec(&[b'v'; 30], v(i + 1, 0))).await;
        }
    }
    let snaps = files(dir.path(), "snap-");
    assert_eq!(snaps.len(), 1);
    let pristine: Vec<(PathBuf, Vec<u8>)> = files(dir.path(), "")
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let d = std::fs::read(&p).unwrap();
            (p, d)
        })
        .collect();
    let restore = || {
        for (p, d) in &pristine {
            std::fs::write(p, d).unwrap();
        }
    };

    // A flipped byte in the snapshot.
    flip_byte(&snaps[0], format::PLAIN_HEADER_LEN + 20);
    assert!(matches!(open_err(dir.path()), StorageError::Corrupt(m) if m.contains("snap-")));
    restore();
    // A truncated snapshot.
    let len = std::fs::metadata(&snaps[0]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&snaps[0])
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    assert!(matches!(open_err(dir.path()), StorageError::Corrupt(m) if m.contains("snap-")));
    restore();
    // A wrong header.
    flip_byte(&snaps[0], 2);
    assert!(matches!(open_err(dir.path()), StorageError::Corrupt(m) if m.contains("header")));
    restore();

    // Force two segments after the snapshot, then damage the older one's last record.
    {
        let store = Store::new(DurableBackend::open(o.clone()).unwrap());
        assert_eq!(store.backend().len().await.unwrap(), 10);
    }
    let dir2 = tempfile::tempdir().unwrap();
    let mut o2 = options(dir2.path());
    o2.segment_bytes = 1 << 30;
    {
        let store = Store::new(DurableBackend::open(o2.clone()).unwrap());
        put(&store, b"a", rec(b"1", v(1, 0))).await;
    }
    // A second segment, as if a rotation happened (its snapshot never committed).
    let seg1 = last_segment(dir2.path());
    let seg2 = dir2.path().join(segment_name(2));
    std::fs::write(&seg2, format::Codec::plain().header(format::FileType::Log, 2)).unwrap();
    {
        let store = Store::new(DurableBackend::open(o2.clone()).unwrap());
        assert!(get(&store, b"a").await.is_some(), "replays both segments");
        put(&store, b"b", rec(b"2", v(2, 0))).await;
    }
    let ends = frame_ends(&seg1);
    let len = *ends.last().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg1)
        .unwrap()
        .set_len(len as u64 - 1)
        .unwrap();
    let msg = open_err(dir2.path()).to_string();
    assert!(msg.contains("not the last") && msg.contains(&segment_name(1)), "{msg}");
}

#[tokio::test]
async fn a_missing_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        put(&store, b"a", rec(b"1", v(1, 0))).await;
    }
    std::fs::write(
        dir.path().join(segment_name(3)),
        format::Codec::plain().header(format::FileType::Log, 3),
    )
    .unwrap();
    let msg = open_err(dir.path()).to_string();
    assert!(msg.contains(&segment_name(2)) && msg.contains("missing"), "{msg}");
}

#[tokio::test]
async fn unfinished_snapshots_are_removed_and_others_files_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        put(&store, b"a", rec(b"1", v(1, 0))).await;
    }
    std::fs::write(dir.path().join("snap-00000000000000000002.tmp"), b"half").unwrap();
    std::fs::write(dir.path().join("README"), b"mine").unwrap();
    let store = open(dir.path());
    assert!(get(&store, b"a").await.is_some());
    assert!(!dir.path().join("snap-00000000000000000002.tmp").exists());
    assert!(dir.path().join("README").exists());
}

#[tokio::test]
async fn one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path());
    let err = open_err(dir.path());
    assert!(err.to_string().contains("in use"), "{err}");
    drop(first);
    let _second = open(dir.path());
}

#[test]
fn fsync_modes_parse() {
    assert_eq!("always".parse::<FsyncMode>().unwrap(), FsyncMode::Always);
    assert_eq!("Batch".parse::<FsyncMode>().unwrap(), FsyncMode::Batch);
    assert_eq!("never".parse::<FsyncMode>().unwrap(), FsyncMode::Never);
    let err = "sometimes".parse::<FsyncMode>().unwrap_err().to_string();
    assert!(err.contains("always, batch or never"), "{err}");
}

#[test]
fn decoding_never_panics_and_frames_check_out() {
    let mut out = Vec::new();
    let swaps = [
        Swap {
            key: b(b"k"),
            expected: None,
            new: Some(Record {
                value: b(b"value"),
                version: v(1, 2),
                fencing: Some(v(3, 4)),
                expires_at_ms: Some(5),
                slide_ms: None,
            }),
            deadline: crate::DeadlineCheck::Any,
        },
        Swap {
            key: b(b"d"),
            expected: Some(v(1, 0)),
            new: None,
            deadline: crate::DeadlineCheck::Any,
        },
    ];
    format::encode_batch(&mut out, &swaps, 42);
    let (payload, n) = format::read_frame(&out).unwrap();
    assert_eq!(n, out.len());
    let mut dec = format::Decoder::default();
    match dec.decode(payload).unwrap() {
        format::Payload::Entries { kind, wall_ms, entries } => {
            assert_eq!(kind, format::KIND_BATCH);
            assert_eq!(wall_ms, 42);
            assert_eq!(entries.len(), 2);
            assert_eq!(entries[0].1.as_ref(), swaps[0].new.as_ref());
            assert_eq!(entries[1], (b(b"d"), None));
        }
        other => panic!("{other:?}"),
    }
    // Every truncation and every single-byte change is refused, never a panic.
    for cut in 0..out.len() {
        assert_eq!(
            format::read_frame(&out[..cut]),
            Err(format::FormatError::Incomplete),
            "cut {cut}"
        );
        let _ = dec.decode(&payload[..cut.min(payload.len())]);
    }
    for at in 0..out.len() {
        let mut bad = out.clone();
        bad[at] ^= 0x01;
        // A changed length reads past the end or checks a shorter payload; any other byte
        // changes the payload or its checksum.
        let len = u32::from_le_bytes(bad[..4].try_into().unwrap()) as usize;
        let expect = if at < 4 && len > bad.len() - 8 {
            format::FormatError::Incomplete
        } else {
            format::FormatError::Checksum
        };
        assert_eq!(format::read_frame(&bad), Err(expect), "byte {at}");
        let mut p = payload.to_vec();
        if at < p.len() {
            p[at] ^= 0xff;
            let _ = dec.decode(&p);
        }
    }
}

/// A panic in the commit thread fails the store like an I/O error: the write waiting for it
/// and every later call get an error; nothing hangs.
#[tokio::test]
async fn a_commit_thread_panic_is_a_fail_stop() {
    let dir = tempfile::tempdir().unwrap();
    let backend = DurableBackend::open(options(dir.path())).unwrap();
    backend.panic_next_commit();
    let swap = Swap {
        key: b(b"k"),
        expected: None,
        new: Some(Record {
            value: b(b"v"),
            version: Hlc::new(1, 0, "n"),
            fencing: None,
            expires_at_ms: None,
            slide_ms: None,
        }),
        deadline: crate::DeadlineCheck::Any,
    };
    let limit = std::time::Duration::from_secs(10);
    let write = tokio::time::timeout(limit, backend.swap_many(std::slice::from_ref(&swap), None)).await;
    assert!(matches!(write, Ok(Err(StorageError::Io(_)))), "{write:?}");
    let read = tokio::time::timeout(limit, backend.get(b"k")).await;
    assert!(matches!(read, Ok(Err(StorageError::Io(_)))), "{read:?}");
    let again = tokio::time::timeout(limit, backend.swap_many(&[swap], None)).await;
    assert!(matches!(again, Ok(Err(StorageError::Io(_)))), "{again:?}");
}

/// Records are stamped with the injected clock, not the system's: a DEL (which leaves no
/// record) made at a clock far in the future still floors the versions after a reopen.
#[tokio::test]
async fn records_are_stamped_with_the_injected_clock() {
    let dir = tempfile::tempdir().unwrap();
    let future = 4_000_000_000_000; // year 2096
    let mut o = options(dir.path());
    o.clock = Arc::new(ManualClock::new(future));
    let store = Store::new(DurableBackend::open(o).unwrap());
    put(
        &store,
        b"k",
        Record {
            value: b(b"v"),
            version: Hlc::new(1, 0, "n"),
            fencing: None,
            expires_at_ms: None,
            slide_ms: None,
        },
    )
    .await;
    del(&store, b"k").await;
    drop(store);
    let store = open(dir.path());
    let floor = store.backend().max_version().await.unwrap().unwrap();
    assert!(floor.ms > future, "{floor:?}");
}

mod backup;
mod binding;
mod crypt;
mod full;
