//! `stategate backup` of a durable service: under write load (the copy is one point of the
//! log), and with a client that stops reading (compaction goes on, and the backup is cut off
//! after `--backup-send-timeout`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use stategate::engine::{Command, TxOp};
use stategate::storage::Store;

use super::{durable_config, set, stategate};
use crate::support::{Broker, Storage, TestEnv, WAIT};

/// Pairs written together (one transaction each) and a sequence written one after another,
/// while `stategate backup` runs: the copy has every pair equal, a sequence without a gap that
/// holds every write acknowledged before the backup started, and opens as a data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_write_load_restores_to_one_point_of_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let key = crate::durability::key_file(tmp.path());
    let mut config = durable_config(&tmp.path().join("data"));
    config.fsync = stategate::storage::durable::FsyncMode::Never;
    config.encryption_key_file = Some(key.clone());
    let store = Store::open(&config).await.unwrap();
    let env = TestEnv::start_on(Broker::Embedded, Storage::Shared(store), |_| {}).await;
    let engine = env.engine().clone();
    // Padding: the pairs' keys land in different snapshot chunks.
    for i in 0..1500u32 {
        engine
            .execute(Command::Set(set(format!("m-{i:05}").as_bytes(), b"pad")))
            .await
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sequenced = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for t in 0..3u64 {
        let (engine, stop) = (engine.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let i = t * 10 + n % 10;
                let value = n.to_string();
                engine
                    .transact(vec![
                        TxOp::Set(set(format!("a-{i}").as_bytes(), value.as_bytes())),
                        TxOp::Set(set(format!("z-{i}").as_bytes(), value.as_bytes())),
                    ])
                    .await
                    .unwrap();
            }
        }));
    }
    {
        let (engine, stop, sequenced) = (engine.clone(), stop.clone(), sequenced.clone());
        load.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                engine
                    .execute(Command::Set(set(format!("p-{n:06}").as_bytes(), b"s")))
                    .await
                    .unwrap();
                sequenced.store(n, Ordering::SeqCst);
            }
        }));
    }
    let wait = async {
        while sequenced.load(Ordering::SeqCst) < 100 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WAIT, wait).await.expect("the load runs");
    let acked_before = sequenced.load(Ordering::SeqCst);
    let to = tmp.path().join("backup");
    let (code, err) = stategate(&["backup", "--to", to.to_str().unwrap(), "--http", &env.http()]).await;
    let acked_after = sequenced.load(Ordering::SeqCst);
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    assert_eq!(code, 0, "{err}");
    eprintln!("{err}");
    let (code, err) = stategate(&["backup", "--to", to.to_str().unwrap(), "--http", &env.http()]).await;
    assert_eq!(code, 2, "the directory is not empty: {err}");
    env.stop().await;

    let mut restored = durable_config(&to);
    restored.encryption_key_file = Some(key);
    let copy = Store::open(&restored)
        .await
        .expect("the backup opens as a data directory");
    for i in 0..30u64 {
        let a = copy
            .backend()
            .get(format!("a-{i}").as_bytes())
            .await
            .unwrap()
            .map(|r| r.value);
        let z = copy
            .backend()
            .get(format!("z-{i}").as_bytes())
            .await
            .unwrap()
            .map(|r| r.value);
        assert_eq!(a, z, "pair {i} was written together");
    }
    let seq = copy
        .backend()
        .scan(Some(b"p-"), 1_000_000, 0, &|k| k.starts_with(b"p-"))
        .await
        .unwrap();
    let m = seq.keys.len() as u64;
    assert!(m >= acked_before, "{m} < {acked_before} acknowledged before the backup");
    assert!(
        m <= acked_after + 1,
        "{m} > {acked_after} written by the end of the backup"
    );
    for n in 1..=m {
        assert!(
            copy.backend()
                .get(format!("p-{n:06}").as_bytes())
                .await
                .unwrap()
                .is_some(),
            "p-{n} missing: a gap"
        );
    }
    eprintln!("backup: sequence {acked_before}..={acked_after} running, {m} in the copy");

    // A memory service has no online backup: a clear refusal.
    let memory = TestEnv::start(Broker::Embedded).await;
    let (code, err) = stategate(&[
        "backup",
        "--to",
        tmp.path().join("none").to_str().unwrap(),
        "--http",
        &memory.http(),
    ])
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("durable"), "{err}");
    assert!(!tmp.path().join("none").exists(), "nothing left behind");
    memory.stop().await;
}

/// The store's snapshot and log segments in `dir`.
fn store_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".snap") || name.ends_with(".log")
        })
        .collect();
    files.sort();
    files
}

/// Whether this process has one of `files` open (removed since, or not).
fn open_in_process(files: &[PathBuf]) -> bool {
    std::fs::read_dir("/proc/self/fd").unwrap().any(|fd| {
        let Ok(target) = std::fs::read_link(fd.unwrap().path()) else {
            return false;
        };
        let target = target.to_string_lossy();
        let target = target.strip_suffix(" (deleted)").unwrap_or(&target);
        files.iter().any(|f| Path::new(target) == f)
    })
}

/// A plain HTTP/1.1 client of the backup route with a small receive buffer (the kernel would
/// otherwise take tens of MiB for it): after the headers it reads only when asked.
struct RawClient {
    conn: tokio::net::TcpStream,
    /// What was read and not parsed yet.
    buf: Vec<u8>,
}

impl RawClient {
    /// Sends the request and reads the answer's head.
    async fn backup(http: &str) -> RawClient {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr: std::net::SocketAddr = http.trim_start_matches("http://").parse().unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(64 * 1024).unwrap();
        let mut conn = socket.connect(addr).await.unwrap();
        let request =
            format!("GET /v1.0-alpha1/stategate/backup HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut more = [0u8; 16 * 1024];
            let n = conn.read(&mut more).await.unwrap();
            assert!(n > 0, "the connection closed before the answer's head");
            buf.extend_from_slice(&more[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        buf.drain(..head_end);
        RawClient { conn, buf }
    }

    /// Reads some of the body.
    async fn read_some(&mut self) -> usize {
        use tokio::io::AsyncReadExt;
        let mut more = [0u8; 16 * 1024];
        let n = self.conn.read(&mut more).await.unwrap();
        self.buf.extend_from_slice(&more[..n]);
        n
    }

    /// Reads the rest: whether the body ends with its last chunk (or is cut short), and the
    /// bytes of its data.
    async fn read_to_end(mut self) -> (bool, usize) {
        use tokio::io::AsyncReadExt;
        let mut rest = Vec::new();
        // A reset after a cut is an end too.
        let _ = self.conn.read_to_end(&mut rest).await;
        self.buf.extend_from_slice(&rest);
        let (mut at, mut data) = (0, 0);
        loop {
            let Some(line) = self.buf[at..].windows(2).position(|w| w == b"\r\n") else {
                return (false, data);
            };
            let size = std::str::from_utf8(&self.buf[at..at + line]).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            at += line + 2;
            if size == 0 {
                return (true, data);
            }
            if self.buf.len() < at + size + 2 {
                return (false, data + self.buf.len().saturating_sub(at));
            }
            at += size + 2;
            data += size;
        }
    }
}

/// A client opens a backup, takes its first chunk and then reads nothing more. Writes go on:
/// the log is rotated and compacted while the backup is open (every file the backup started
/// from is removed). After `--backup-send-timeout` the service lets the backup go (it holds
/// none of those files any more) and the client finds its copy cut short; a backup taken
/// after that is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_whose_client_stops_reading_holds_no_compaction_up_and_is_cut_off() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut config = durable_config(&data);
    config.fsync = stategate::storage::durable::FsyncMode::Never;
    // A rotation (and a compaction) after about half the live data is written again.
    config.segment_bytes = 4 << 20;
    let store = Store::open(&config).await.unwrap();
    let env = TestEnv::start_on(Broker::Embedded, Storage::Shared(store), |c| {
        c.http.backup_send_timeout = Duration::from_millis(300);
    })
    .await;
    let engine = env.engine().clone();
    // 40 MiB: far more than the socket buffers and the stream's chunks hold, so the backup's
    // producer has to wait for the client.
    let small = vec![b's'; 4096];
    for i in 0..10_240u32 {
        engine
            .execute(Command::Set(set(format!("small-{i:05}").as_bytes(), &small)))
            .await
            .unwrap();
    }
    let value = vec![b'v'; 1 << 20];

    let mut stalled = RawClient::backup(&env.http()).await;
    tokio::time::timeout(WAIT, stalled.read_some())
        .await
        .expect("the backup sends");
    // The backup has opened its files (it sent some): the ones in the directory now.
    let held = store_files(&data);

    // Writes until compaction has replaced every one of them (or give up: it is held off).
    let mut written = 0u32;
    while held.iter().any(|f| f.exists()) {
        assert!(
            written < 200,
            "200 MiB written and the files the stalled backup copies are still there: \
             compaction waits for the client ({held:?})"
        );
        engine
            .execute(Command::Set(set(format!("more-{}", written % 8).as_bytes(), &value)))
            .await
            .unwrap();
        written += 1;
    }
    eprintln!("{written} MiB written: the files the backup started from were compacted away");

    // The client still reads nothing: the service lets the backup go.
    let cut = async {
        while open_in_process(&held) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, cut)
        .await
        .expect("the backup let go of its files");
    let (whole, bytes) = tokio::time::timeout(WAIT, stalled.read_to_end())
        .await
        .expect("the stream ends");
    assert!(
        !whole,
        "the stalled backup was cut short, not sent whole ({bytes} bytes)"
    );
    eprintln!("the stalled backup was cut short after {bytes} bytes");

    // The service goes on: a backup now is whole, and opens.
    let to = tmp.path().join("backup");
    let (code, err) = stategate(&["backup", "--to", to.to_str().unwrap(), "--http", &env.http()]).await;
    assert_eq!(code, 0, "{err}");
    env.stop().await;
    let copy = Store::open(&durable_config(&to))
        .await
        .expect("the backup opens as a data directory");
    assert_eq!(copy.backend().len().await.unwrap(), 10_240 + 8.min(written as u64));
}
