//! Online backup under a write load: the copy is the state at one point of the log (pairs
//! written together are equal, a sequence written one after another has no gap), holds every
//! write acknowledged before it started, and opens as a data directory.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;
use crate::{BackupFile, BackupSink, OnlineBackup};

/// Writes the backup's two files into a directory, as `stategate backup --to` does.
struct DirSink(PathBuf);

impl BackupSink for DirSink {
    fn write(&mut self, file: BackupFile, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let name = match file {
            BackupFile::Snapshot { seq } => snapshot_name(seq),
            BackupFile::Log { seq } => segment_name(seq),
        };
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.0.join(name))?
            .write_all(bytes)
    }
}

async fn set_pair(store: &Store, i: u64, n: u64) {
    let (a, z) = (format!("a-{i}"), format!("z-{i}"));
    let cur_a = store.backend().get(a.as_bytes()).await.unwrap().map(|r| r.version);
    let cur_z = store.backend().get(z.as_bytes()).await.unwrap().map(|r| r.version);
    let value = n.to_string();
    let swaps = [
        Swap {
            key: Bytes::from(a),
            expected: cur_a,
            new: Some(rec(value.as_bytes(), v(n, 0))),
            deadline: crate::DeadlineCheck::Any,
        },
        Swap {
            key: Bytes::from(z),
            expected: cur_z,
            new: Some(rec(value.as_bytes(), v(n, 0))),
            deadline: crate::DeadlineCheck::Any,
        },
    ];
    assert_eq!(
        store.backend().swap_many(&swaps, None).await.unwrap(),
        SwapOutcome::Done
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_is_one_point_of_the_log() {
    for encrypted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = options(&dir.path().join("data"));
        o.fsync = FsyncMode::Never;
        if encrypted {
            o.encryption = Some(crate::durable::EncryptionKey::from_bytes([9; 32], "k"));
        }
        let backend = Arc::new(DurableBackend::open(o.clone()).unwrap());
        let store = Store(backend.clone());
        // Padding between the pairs' keys: "a-*" and "z-*" land in different snapshot chunks.
        for i in 0..1500u64 {
            put(&store, format!("m-{i:05}").as_bytes(), rec(b"pad", v(1, 0))).await;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let sequenced = Arc::new(AtomicU64::new(0));
        let mut load = Vec::new();
        for t in 0..4u64 {
            let (store, stop) = (store.clone(), stop.clone());
            load.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    set_pair(&store, t * 10 + n % 10, 1_000 + n).await;
                }
            }));
        }
        {
            let (store, stop, sequenced) = (store.clone(), stop.clone(), sequenced.clone());
            load.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    put(&store, format!("p-{n:06}").as_bytes(), rec(b"s", v(2, 0))).await;
                    sequenced.store(n, Ordering::SeqCst);
                }
            }));
        }
        while sequenced.load(Ordering::SeqCst) < 200 {
            tokio::task::yield_now().await;
        }
        let acked_before = sequenced.load(Ordering::SeqCst);
        let to = dir.path().join("backup");
        std::fs::create_dir(&to).unwrap();
        let info = {
            let (backend, to) = (backend.clone(), to.clone());
            tokio::task::spawn_blocking(move || backend.backup(&mut DirSink(to)))
                .await
                .unwrap()
                .unwrap()
        };
        stop.store(true, Ordering::Relaxed);
        for t in load {
            t.await.unwrap();
        }
        eprintln!("encrypted {encrypted}: {info:?}");
        assert!(info.log_records > 0, "writes went on during the backup: {info:?}");

        let mut ro = o.clone();
        ro.dir = to.clone();
        let copy = Store::new(DurableBackend::open(ro).unwrap());
        for i in 0..40u64 {
            let a = get(&copy, format!("a-{i}").as_bytes()).await.map(|r| r.value);
            let z = get(&copy, format!("z-{i}").as_bytes()).await.map(|r| r.value);
            assert_eq!(a, z, "pair {i} was written together");
        }
        let mut m = 0;
        while get(&copy, format!("p-{:06}", m + 1).as_bytes()).await.is_some() {
            m += 1;
        }
        assert!(m >= acked_before, "{m} < {acked_before} acknowledged before the backup");
        let page = copy
            .backend()
            .scan(Some(b"p-"), 1_000_000, 0, &|k| k.starts_with(b"p-"))
            .await
            .unwrap();
        assert_eq!(page.keys.len() as u64, m, "no gap in the sequence");
        assert_eq!(copy.backend().len().await.unwrap(), 1500 + 80 + m);
    }
}

#[tokio::test]
async fn memory_has_no_online_backup() {
    assert!(Store::memory().backend().online_backup().is_none());
}

/// Lets a [`Stalled`] sink go when dropped (the test's asserts may fail while it waits).
struct LetGo(std::sync::mpsc::Sender<()>);

impl Drop for LetGo {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// A client that stops reading: the first write waits until the test lets it go, then the
/// bytes go to a directory.
struct Stalled {
    entered: Option<std::sync::mpsc::Sender<()>>,
    go: std::sync::mpsc::Receiver<()>,
    to: DirSink,
}

impl BackupSink for Stalled {
    fn write(&mut self, file: BackupFile, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(entered) = self.entered.take() {
            let _ = entered.send(());
            let _ = self.go.recv();
        }
        self.to.write(file, bytes)
    }
}

/// A backup whose reader stops reading holds nothing up: the log is rotated and compacted
/// meanwhile (the segments the backup copies are removed), and once the reader goes on, the
/// copy is still the store as of the moment the backup started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_backup_reader_does_not_hold_compaction_up() {
    for encrypted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = options(&dir.path().join("data"));
        o.fsync = FsyncMode::Never;
        o.segment_bytes = 4096;
        if encrypted {
            o.encryption = Some(crate::durable::EncryptionKey::from_bytes([7; 32], "k"));
        }
        let backend = Arc::new(DurableBackend::open(o.clone()).unwrap());
        let store = Store(backend.clone());
        for i in 0..200u32 {
            put(&store, format!("a-{i:04}").as_bytes(), rec(&[b'a'; 64], v(1, 0))).await;
        }
        let to = dir.path().join("backup");
        std::fs::create_dir(&to).unwrap();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel();
        let let_go = LetGo(go_tx);
        let mut sink = Stalled {
            entered: Some(entered_tx),
            go,
            to: DirSink(to.clone()),
        };
        let running = {
            let backend = backend.clone();
            std::thread::spawn(move || backend.backup(&mut sink))
        };
        let started = tokio::task::spawn_blocking(move || entered.recv_timeout(Duration::from_secs(30)));
        started.await.unwrap().expect("the backup sent its first bytes");
        let segment = lock(&backend.shared.progress).segment;

        // Far more than a segment's budget while the reader does not read.
        for i in 0..1000u32 {
            put(&store, format!("b-{i:04}").as_bytes(), rec(&[b'b'; 128], v(2, 0))).await;
        }
        // The compactions those writes started: they remove the segments the backup copies.
        compaction_settled(&backend).await;
        let now = lock(&backend.shared.progress).segment;
        assert!(
            now > segment,
            "encrypted {encrypted}: the log was rotated while the backup's reader stalled (segment {segment}, now {now})"
        );
        let snaps = files(&dir.path().join("data"), "snap-");
        assert!(!snaps.is_empty(), "a snapshot was committed meanwhile");
        assert!(
            !dir.path().join("data").join(segment_name(segment)).exists(),
            "the segment the backup started in was compacted away"
        );

        drop(let_go);
        let info = tokio::task::spawn_blocking(move || running.join())
            .await
            .unwrap()
            .unwrap()
            .expect("the backup completes once its reader goes on");
        eprintln!("encrypted {encrypted}: {info:?}");
        let mut ro = o.clone();
        ro.dir = to.clone();
        let copy = Store::new(DurableBackend::open(ro).unwrap());
        assert_eq!(
            copy.backend().len().await.unwrap(),
            200,
            "the store when the backup started"
        );
        assert!(get(&copy, b"a-0199").await.is_some());
        assert!(
            get(&copy, b"b-0000").await.is_none(),
            "written after the backup started"
        );
    }
}

/// The copy is checked as it is read: a damaged frame in the store's snapshot fails the backup
/// (naming the file) instead of sending a copy that would not open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_file_fails_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.segment_bytes = 1024;
    let backend = Arc::new(DurableBackend::open(o).unwrap());
    let store = Store(backend.clone());
    for i in 0..100u32 {
        put(&store, format!("k-{i:04}").as_bytes(), rec(&[b'v'; 64], v(1, 0))).await;
    }
    // Not only the compaction running now: the last writes may call for one that has not
    // started yet, and would replace the snapshot damaged below.
    compaction_settled(&backend).await;
    let snap = files(dir.path(), "snap-").pop().expect("a snapshot was written");
    flip_byte(&snap, format::PLAIN_HEADER_LEN + format::FRAME_HEADER_LEN + 3);
    let to = dir.path().join("backup");
    std::fs::create_dir(&to).unwrap();
    let got = {
        let backend = backend.clone();
        tokio::task::spawn_blocking(move || backend.backup(&mut DirSink(to)))
            .await
            .unwrap()
    };
    match got {
        Err(StorageError::Corrupt(m)) => assert!(m.contains("snap-"), "{m}"),
        other => panic!("a damaged snapshot is not copied: {other:?}"),
    }
    assert!(
        !backend.shared.snapshotting.load(Ordering::Acquire),
        "the backup let the log go"
    );
}
