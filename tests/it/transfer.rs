//! Moving whole stores with the real binary: `stategate export` from a running service, `import`
//! into a fresh memory service, a stopped durable directory and Redis (same records, same
//! versions); `backup` of a durable service (`transfer/backup.rs`); the api token on the admin
//! routes.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use stategate::engine::{Command, Engine, Set, SetCondition};
use stategate::hlc::Hlc;
use stategate::storage::{Record, StorageKind, Store};
use tokio::process::Command as Process;

use crate::redis::server::{Flavor, TestServer};
use crate::support::{Broker, Storage, TestEnv, WAIT};

const BIN: &str = env!("CARGO_BIN_EXE_stategate");

mod backup;

/// Runs the binary (no `STATEGATE_*` inherited), bounded; returns (exit code, stderr).
async fn stategate(args: &[&str]) -> (i32, String) {
    let mut c = Process::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("STATEGATE_") {
            c.env_remove(k);
        }
    }
    c.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(4 * WAIT, c.output())
        .await
        .expect("the command finished in time")
        .expect("run the stategate binary");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

fn set(key: &[u8], value: &[u8]) -> Set {
    Set {
        key: Bytes::copy_from_slice(key),
        value: Bytes::copy_from_slice(value),
        condition: SetCondition::Always,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    }
}

/// Keys of every shape: text and binary keys, binary values, a deadline, a fencing token.
async fn fill(engine: &Engine) {
    for i in 0..300u32 {
        engine
            .execute(Command::Set(set(
                format!("plain-{i:04}").as_bytes(),
                format!("{{\"n\":{i}}}").as_bytes(),
            )))
            .await
            .unwrap();
    }
    engine
        .execute(Command::Set(set(b"bin-\xff\x00", b"\x00\x01\xfe\xff")))
        .await
        .unwrap();
    let mut ttl = set(b"with-ttl", b"expires later");
    ttl.ttl_ms = Some(3_600_000);
    engine.execute(Command::Set(ttl)).await.unwrap();
    let token: Hlc = "000000000000100:00007:locker".parse().unwrap();
    let mut fenced = set(b"fenced", b"protected");
    fenced.fencing = Some(token);
    engine.execute(Command::Set(fenced)).await.unwrap();
}

/// Every record of a store, in key order.
async fn records(store: &Store) -> Vec<(Bytes, Record)> {
    let page = store.backend().scan(None, 1_000_000, 0, &|_| true).await.unwrap();
    let mut out = Vec::new();
    for k in page.keys {
        let r = store.backend().get(&k).await.unwrap().unwrap();
        out.push((k, r));
    }
    out
}

fn durable_config(dir: &Path) -> stategate::storage::StorageConfig {
    let mut c = stategate::config::Config::default().storage;
    c.kind = StorageKind::Durable;
    c.data_dir = dir.to_owned();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_into_memory_durable_and_redis_keeps_records_and_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let source_store = Store::memory();
    let source = TestEnv::start_on(Broker::Embedded, Storage::Shared(source_store.clone()), |c| {
        c.http.api_token = Some("admin-token".into());
    })
    .await;
    fill(source.engine()).await;
    let expected = records(&source_store).await;
    assert_eq!(expected.len(), 303);

    let file = tmp.path().join("export.jsonl");
    let file = file.to_str().unwrap();
    let (code, err) = stategate(&["export", "--http", &source.http(), "-o", file]).await;
    assert_eq!(code, 4, "no token: not authorized: {err}");
    assert!(!Path::new(file).exists(), "nothing left behind: {err}");
    let (code, err) = stategate(&[
        "export",
        "--http",
        &source.http(),
        "--api-token",
        "admin-token",
        "-o",
        file,
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("exported 303 records"), "{err}");
    let lines = std::fs::read_to_string(file).unwrap();
    assert_eq!(lines.lines().count(), 303);
    let (code, err) = stategate(&[
        "export",
        "--http",
        &source.http(),
        "--api-token",
        "admin-token",
        "-o",
        file,
    ])
    .await;
    assert_eq!(code, 2, "an existing file is not overwritten: {err}");

    // Into a fresh memory service, over HTTP.
    let memory = Store::memory();
    let target = TestEnv::start_on(Broker::Embedded, Storage::Shared(memory.clone()), |_| {}).await;
    let (code, err) = stategate(&["import", file, "--http", &target.http()]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("303 imported"), "{err}");
    assert_eq!(records(&memory).await, expected, "memory: same records and versions");
    // Again: nothing changes.
    let (code, err) = stategate(&["import", file, "--http", &target.http()]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("0 imported, 303 unchanged"), "{err}");
    // A newer version is kept unless told.
    target
        .engine()
        .execute(Command::Set(set(b"plain-0001", b"newer")))
        .await
        .unwrap();
    let (code, err) = stategate(&["import", file, "--http", &target.http()]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("1 kept"), "{err}");
    let (code, err) = stategate(&["import", file, "--http", &target.http(), "--overwrite"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(records(&memory).await, expected, "overwritten back");
    // Versions issued afterwards are above every imported one.
    let after = target
        .engine()
        .execute(Command::Set(set(b"later", b"x")))
        .await
        .unwrap();
    let newest = expected.iter().map(|(_, r)| r.version.clone()).max().unwrap();
    assert!(after.version.unwrap() > newest);
    target.stop().await;

    // Into a stopped durable directory, then exported back from it, byte for byte.
    let dir = tmp.path().join("durable");
    let dir_s = dir.to_str().unwrap();
    let (code, err) = stategate(&["import", file, "--data-dir", dir_s]).await;
    assert_eq!(code, 0, "{err}");
    let again = tmp.path().join("again.jsonl");
    let (code, err) = stategate(&["export", "--data-dir", dir_s, "-o", again.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(&again).unwrap(),
        lines,
        "durable: the same lines"
    );
    let durable = Store::open(&durable_config(&dir)).await.unwrap();
    assert_eq!(records(&durable).await, expected, "durable: same records and versions");
    drop(durable);

    // Into Redis, directly (the path from one node to Redis), and back out.
    let server = TestServer::start(Flavor::Redis);
    let (code, err) = stategate(&["import", file, "--redis", &server.url(), "--redis-prefix", "moved:"]).await;
    assert_eq!(code, 0, "{err}");
    let from_redis = tmp.path().join("redis.jsonl");
    let (code, err) = stategate(&[
        "export",
        "--redis",
        &server.url(),
        "--redis-prefix",
        "moved:",
        "-o",
        from_redis.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(&from_redis).unwrap(),
        lines,
        "redis: the same lines"
    );

    // A bad line: nothing imported, the line named.
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        format!("{}{{\"key\":\"x\"}}\n", lines.lines().next().unwrap().to_owned() + "\n"),
    )
    .unwrap();
    let fresh = TestEnv::start(Broker::Embedded).await;
    let (code, err) = stategate(&["import", bad.to_str().unwrap(), "--http", &fresh.http()]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2"), "{err}");
    assert_eq!(fresh.engine().key_count().await.unwrap(), 0);
    fresh.stop().await;
    source.stop().await;
}

/// `rekey` on a stopped store, then the service needs the new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_a_stopped_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let old = crate::durability::key_file(tmp.path());
    let new = tmp.path().join("new.key");
    std::fs::copy(&old, &new).unwrap();
    // A different key of its own.
    std::fs::write(&new, [0x42u8; 32]).unwrap();
    let mut config = durable_config(&dir);
    config.encryption_key_file = Some(old.clone());
    {
        let store = Store::open(&config).await.unwrap();
        let limits = stategate::engine::Limits::default();
        let engine = Engine::open(store, "n", Arc::new(stategate::hlc::SystemClock), limits)
            .await
            .unwrap();
        engine.execute(Command::Set(set(b"k", b"v"))).await.unwrap();
        // Dropping the engine closes the store and releases the directory.
    }
    let (d, o, n) = (dir.to_str().unwrap(), old.to_str().unwrap(), new.to_str().unwrap());
    let (code, err) = stategate(&[
        "rekey",
        "--data-dir",
        d,
        "--encryption-key-file",
        o,
        "--new-encryption-key-file",
        n,
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 keys rewritten"), "{err}");
    let e = Store::open(&config).await.unwrap_err().to_string();
    assert!(e.contains("wrong key") && e.contains(o), "{e}");
    config.encryption_key_file = Some(new);
    let store = Store::open(&config).await.unwrap();
    assert_eq!(&store.backend().get(b"k").await.unwrap().unwrap().value[..], b"v");
}

/// Access rules apply to the admin routes: the export holds only readable keys, an import
/// needs write and admin access to every key, a backup read and admin access to every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_rules_bound_export_import_and_backup() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("acl.toml"),
        "[[rule]]\ntokens = [\"viewer\"]\nallow = [\"read\"]\nkeys = [\"app/*\"]\n\n\
         [[rule]]\ntokens = [\"admin\"]\nallow = [\"read\", \"write\", \"admin\"]\nkeys = [\"*\"]\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("tokens"),
        "viewer:viewer-token-0123456789\nadmin:admin-token-0123456789\n",
    )
    .unwrap();
    let (acl, tokens) = (tmp.path().join("acl.toml"), tmp.path().join("tokens"));
    let env = TestEnv::start_on(Broker::Embedded, Storage::Durable, |c| {
        c.access.acl_file = Some(acl);
        c.access.api_token_file = Some(tokens);
    })
    .await;
    for k in ["app/1", "app/2", "secret/1"] {
        env.engine()
            .execute(Command::Set(set(k.as_bytes(), b"v")))
            .await
            .unwrap();
    }
    let http = env.http();
    let file = tmp.path().join("viewer.jsonl");
    let (code, err) = stategate(&[
        "export",
        "--http",
        &http,
        "--api-token",
        "viewer-token-0123456789",
        "-o",
        file.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(!text.contains("secret"), "{text}");
    let (code, err) = stategate(&[
        "import",
        file.to_str().unwrap(),
        "--http",
        &http,
        "--api-token",
        "viewer-token-0123456789",
    ])
    .await;
    assert_eq!(code, 4, "the viewer may not write: {err}");
    let to = tmp.path().join("b");
    let (code, err) = stategate(&[
        "backup",
        "--to",
        to.to_str().unwrap(),
        "--http",
        &http,
        "--api-token",
        "viewer-token-0123456789",
    ])
    .await;
    assert_eq!(code, 4, "the viewer may not read every key: {err}");
    let (code, err) = stategate(&[
        "backup",
        "--to",
        to.to_str().unwrap(),
        "--http",
        &http,
        "--api-token",
        "admin-token-0123456789",
    ])
    .await;
    assert_eq!(code, 0, "the admin may: {err}");
    env.stop().await;
}

/// Import and backup need the `admin` permission: `write` (and `read`) on every key is not
/// enough. An import leaves a fenced key alone unless its record carries an equal or higher
/// token, or the admin asks with `--overwrite-fenced` (exit 3 until then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_and_backup_need_admin_and_import_keeps_fences() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("acl.toml"),
        "[[rule]]\ntokens = [\"writer\"]\nallow = [\"read\", \"write\"]\nkeys = [\"*\"]\n\n\
         [[rule]]\ntokens = [\"admin\"]\nallow = [\"read\", \"write\", \"admin\"]\nkeys = [\"*\"]\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("tokens"),
        "writer:writer-token-0123456789\nadmin:admin-token-0123456789\n",
    )
    .unwrap();
    let (acl, tokens) = (tmp.path().join("acl.toml"), tmp.path().join("tokens"));
    let env = TestEnv::start_on(Broker::Embedded, Storage::Durable, |c| {
        c.access.acl_file = Some(acl);
        c.access.api_token_file = Some(tokens);
    })
    .await;
    let engine = env.engine();
    engine.execute(Command::Set(set(b"plain", b"v1"))).await.unwrap();
    let mut fenced = set(b"fenced", b"held");
    fenced.fencing = Some(Hlc::new(engine.now_ms(), 5, "locker"));
    engine.execute(Command::Set(fenced)).await.unwrap();
    let http = env.http();
    let file = tmp.path().join("dump.jsonl");
    let file = file.to_str().unwrap();
    let as_writer = ["--http", &http, "--api-token", "writer-token-0123456789"];
    let as_admin = ["--http", &http, "--api-token", "admin-token-0123456789"];
    let (code, err) = stategate(&[&["export", "-o", file][..], &as_writer].concat()).await;
    assert_eq!(code, 0, "an export is a read: {err}");

    // The keys change after the export; the lock is taken again without the old token.
    engine.execute(Command::Set(set(b"plain", b"v2"))).await.unwrap();
    let mut retaken = set(b"fenced", b"held again");
    retaken.fencing = Some(Hlc::new(engine.now_ms() + 1, 0, "locker"));
    engine.execute(Command::Set(retaken)).await.unwrap();
    let held = engine.read(&Bytes::from_static(b"fenced")).await.unwrap().unwrap();

    let (code, err) = stategate(&[&["import", file, "--overwrite"][..], &as_writer].concat()).await;
    assert_eq!(code, 4, "write on every key is not enough to import: {err}");
    let (code, err) = stategate(&[&["import", file, "--overwrite"][..], &as_admin].concat()).await;
    assert_eq!(code, 3, "the fenced key was kept: {err}");
    assert!(err.contains("1 fenced"), "{err}");
    let now = engine.read(&Bytes::from_static(b"fenced")).await.unwrap().unwrap();
    assert_eq!(now.value, held.value, "the fence held");
    assert_eq!(
        &engine.read(&Bytes::from_static(b"plain")).await.unwrap().unwrap().value[..],
        b"v1"
    );
    let (code, err) =
        stategate(&[&["import", file, "--overwrite", "--overwrite-fenced"][..], &as_admin].concat()).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        &engine
            .read(&Bytes::from_static(b"fenced"))
            .await
            .unwrap()
            .unwrap()
            .value[..],
        b"held",
        "replaced when asked"
    );

    let to = tmp.path().join("b");
    let to = to.to_str().unwrap();
    let (code, err) = stategate(&[&["backup", "--to", to][..], &as_writer].concat()).await;
    assert_eq!(code, 4, "read on every key is not enough for a backup: {err}");
    let (code, err) = stategate(&[&["backup", "--to", to][..], &as_admin].concat()).await;
    assert_eq!(code, 0, "{err}");
    env.stop().await;
}
