//! The fuzz targets' seeds (`fuzz/seeds/<target>/`): small real inputs, made here from the
//! same requests, messages and files the tests use, in each target's framing (see
//! `fuzz/src/lib.rs` and the targets' docs). The test fails when a committed seed differs from
//! what this makes (a format, a message or a route changed: the seeds must stay real inputs);
//! `STATEGATE_WRITE_FUZZ_SEEDS=1` rewrites them instead.
//!
//! Encrypted data directories (random nonces) and snapshots (stamped with the wall time of
//! `rekey`) differ from run to run: those seeds are checked by the keys they load, not byte
//! for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use stategate::grpc::pb;
use stategate::hlc::{Hlc, ManualClock};
use stategate::resp3::encode_request;
use stategate::storage::durable::{DurableBackend, DurableOptions, EncryptionKey, FsyncMode, load_read_only, rekey};
use stategate::storage::{Backend, DeadlineCheck, Record, Swap};
use tonic_prost::prost::Message;

/// The wall time of the seeds (as `fuzz/src/lib.rs` NOW_MS).
const NOW_MS: u64 = 1_700_000_000_000;
/// The key of encrypted data directories (as `fuzz/src/lib.rs` DataDir::KEY).
const FUZZ_KEY: [u8; 32] = [0x5a; 32];
const ENCRYPTED_SEED: &str = "encrypted-log";
/// Seeds that differ from run to run (see the module's doc).
const LOADED_NOT_COMPARED: [&str; 2] = [ENCRYPTED_SEED, "snapshot-and-log"];

type Seeds = BTreeMap<&'static str, Vec<u8>>;

fn seeds_dir() -> PathBuf {
    crate::support::repo_path("fuzz/seeds")
}

fn ts(counter: u32) -> String {
    Hlc::new(NOW_MS, counter, "c1").to_string()
}

fn resp3_seeds() -> Seeds {
    let mut s = Seeds::new();
    let mut put = |name, args: &[&[u8]]| s.insert(name, encode_request(args).to_vec());
    put("set", &[b"SET", b"k", b"v"]);
    put("set-px-nx", &[b"SET", b"k", b"v", b"NX", b"PX", b"1000"]);
    put(
        "set-nex-sliding",
        &[b"SET", b"k", b"v", b"NEX", b"PX", b"500", b"SLIDING"],
    );
    put("get", &[b"GET", b"k"]);
    put("mget", &[b"MGET", b"a", b"b", b"c"]);
    put("del", &[b"DEL", b"k"]);
    put("vdel", &[b"VDEL", b"k", b"v"]);
    put("keynotify", &[b"KEYNOTIFY", b"k"]);
    put("keynotify-stop", &[b"KEYNOTIFY", b"k", b"STOP"]);
    put("scan", &[b"SCAN", b"user:*"]);
    put("scan-token", &[b"SCAN", b"*", b"6B6579"]);
    s.insert("frames", b"%1\r\n+a\r\n:1\r\n~2\r\n#t\r\n,1.5\r\n_\r\n".to_vec());
    s
}

fn mqtt_seeds() -> Seeds {
    let mut s = Seeds::new();
    let mut put = |name, props: &[(&str, &str)], args: &[&[u8]]| {
        let mut out = Vec::new();
        for (k, v) in props {
            out.extend_from_slice(format!("{k}={v}\n").as_bytes());
        }
        out.push(b'\n');
        out.extend_from_slice(&encode_request(args));
        s.insert(name, out);
    };
    let t = ts(0);
    let ft = ts(3);
    put(
        "set",
        &[("__ts", &t), ("__srcId", "c1")],
        &[b"SET", b"k", b"v", b"PX", b"1000"],
    );
    put(
        "set-fenced",
        &[
            ("__ts", &t),
            ("__ft", &ft),
            ("aio-persistence", "true"),
            ("__protVer", "1.0"),
        ],
        &[b"SET", b"lock", b"owner", b"NEX", b"PX", b"10000"],
    );
    put("set-no-ts", &[], &[b"SET", b"k", b"v"]);
    put("get", &[("__protVer", "1.0")], &[b"GET", b"k"]);
    put("del-fenced", &[("__ts", &t), ("__ft", &ft)], &[b"DEL", b"k"]);
    put("vdel", &[("__ts", &t)], &[b"VDEL", b"k", b"v"]);
    put("keynotify", &[("__srcId", "c1"), ("__ts", &t)], &[b"KEYNOTIFY", b"k"]);
    put("scan-token", &[], &[b"SCAN", b"*", b"6B6579"]);
    put("mget", &[], &[b"MGET", b"a", b"b"]);
    put("protocol-2", &[("__protVer", "2.0")], &[b"GET", b"k"]);
    s
}

fn http_seeds() -> Seeds {
    let mut s = Seeds::new();
    let json = "content-type: application/json\n";
    let mut put = |name, head: &str, body: &str| {
        s.insert(name, format!("{head}\n\n{body}").into_bytes());
    };
    put(
        "save",
        &format!("POST /v1.0/state/statestore\n{json}"),
        r#"[{"key":"a","value":{"n":1}},{"key":"b","value":"text","etag":"001700000000000:00000:x","options":{"concurrency":"first-write","consistency":"strong"},"metadata":{"ttlInSeconds":"60"}}]"#,
    );
    put(
        "get",
        "GET /v1.0/state/statestore/a?consistency=strong&metadata.contentType=application%2Fjson",
        "",
    );
    put(
        "delete",
        "DELETE /v1.0/state/statestore/a\nif-match: 001700000000000:00000:x",
        "",
    );
    put(
        "bulk",
        &format!("POST /v1.0/state/statestore/bulk?metadata.partitionKey=p\n{json}"),
        r#"{"keys":["a","b"],"parallelism":10,"metadata":{"k":"v"}}"#,
    );
    put(
        "transaction",
        &format!("POST /v1.0/state/statestore/transaction\n{json}"),
        r#"{"operations":[{"operation":"upsert","request":{"key":"a","value":1}},{"operation":"delete","request":{"key":"b","etag":"001700000000000:00000:x"}}],"metadata":{}}"#,
    );
    put(
        "query",
        &format!("POST /v1.0-alpha1/state/statestore/query\n{json}"),
        r#"{"filter":{"AND":[{"EQ":{"state":"CA"}},{"IN":{"person.org":["A","B"]}}]},"sort":[{"key":"person.id","order":"DESC"}],"page":{"limit":2,"token":"eyJzIjpbMV0sImsiOiI2MSJ9"}}"#,
    );
    put(
        "keys",
        "GET /v1.0-alpha1/state/statestore/keys?pattern=a*&limit=10&token=61",
        "",
    );
    put(
        "lock",
        &format!("POST /v1.0-alpha1/lock/lockstore\n{json}"),
        r#"{"resourceId":"r","lockOwner":"o","expiryInSeconds":60}"#,
    );
    put(
        "unlock",
        &format!("POST /v1.0-alpha1/unlock/lockstore\n{json}"),
        r#"{"resourceId":"r","lockOwner":"o"}"#,
    );
    put(
        "configuration",
        "GET /v1.0/configuration/configstore?key=a&key=b&metadata.m=1",
        "",
    );
    put(
        "configuration-subscribe",
        "GET /v1.0/configuration/configstore/subscribe?key=a",
        "",
    );
    put(
        "campaign",
        &format!("POST /v1.0-alpha1/election/lockstore/campaign\n{json}"),
        r#"{"name":"e","holder":"h","value":"v","ttlMs":10000,"waitMs":100}"#,
    );
    put(
        "import",
        "POST /v1.0-alpha1/stategate/import\ncontent-type: application/x-ndjson",
        &String::from_utf8(export_seeds().remove("records").unwrap_or_default()).unwrap_or_default(),
    );
    put(
        "subscribe",
        "GET /v1.0-alpha1/state/statestore/subscribe?key=a&pattern=b*&since=001700000000000:00000:x",
        "",
    );
    s
}

fn grpc_seeds() -> Seeds {
    use pb::dapr::proto::common::v1 as common;
    use pb::dapr::proto::components::v1 as cpb;
    use pb::dapr::proto::runtime::v1 as rpb;
    use pb::statestore::v1 as npb;
    let mut s = Seeds::new();
    let mut put = |name, path: &str, msg: Vec<u8>| {
        let mut out = format!("{path}\n").into_bytes();
        out.extend(msg);
        s.insert(name, out);
    };
    let meta = || [("ttlInSeconds".to_owned(), "60".to_owned())].into_iter().collect();
    let item = |key: &str| common::StateItem {
        key: key.into(),
        value: br#"{"n":1}"#.to_vec(),
        etag: Some(common::Etag { value: ts(0) }),
        metadata: meta(),
        options: Some(common::StateOptions {
            concurrency: 1,
            consistency: 2,
        }),
    };
    let native = "/statestore.v1.StateStore";
    put(
        "native-set",
        &format!("{native}/Set"),
        npb::SetRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            condition: 2,
            ttl_ms: 1000,
            fencing_token: ts(3),
            timestamp: ts(1),
            if_version: ts(0),
            ttl_sliding: true,
        }
        .encode_to_vec(),
    );
    put(
        "native-get",
        &format!("{native}/Get"),
        npb::GetRequest { key: b"k".to_vec() }.encode_to_vec(),
    );
    put(
        "native-del",
        &format!("{native}/Del"),
        npb::DelRequest {
            key: b"k".to_vec(),
            fencing_token: ts(3),
            if_version: ts(0),
        }
        .encode_to_vec(),
    );
    put(
        "native-vdel",
        &format!("{native}/VDel"),
        npb::VDelRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            fencing_token: String::new(),
        }
        .encode_to_vec(),
    );
    put(
        "native-scan",
        &format!("{native}/Scan"),
        npb::ScanRequest {
            pattern: "user:*".into(),
            continuation_token: "6B6579".into(),
        }
        .encode_to_vec(),
    );
    put(
        "native-watch",
        &format!("{native}/Watch"),
        npb::WatchRequest {
            keys: vec![b"k".to_vec()],
            patterns: vec!["user:*".into()],
            since_version: ts(0),
            snapshot: true,
        }
        .encode_to_vec(),
    );
    put(
        "native-getmany",
        &format!("{native}/GetMany"),
        npb::GetManyRequest {
            keys: vec![b"a".to_vec(), b"b".to_vec()],
        }
        .encode_to_vec(),
    );
    let election = "/statestore.v1.Election";
    put(
        "election-campaign",
        &format!("{election}/Campaign"),
        npb::CampaignRequest {
            name: b"e".to_vec(),
            holder: b"h".to_vec(),
            value: Some(b"v".to_vec()),
            ttl_ms: 10_000,
            wait_ms: 100,
        }
        .encode_to_vec(),
    );
    put(
        "election-proclaim",
        &format!("{election}/Proclaim"),
        npb::ProclaimRequest {
            name: b"e".to_vec(),
            holder: b"h".to_vec(),
            token: ts(0),
            value: b"v2".to_vec(),
        }
        .encode_to_vec(),
    );
    put(
        "election-observe",
        &format!("{election}/Observe"),
        npb::LeaderRequest { name: b"e".to_vec() }.encode_to_vec(),
    );
    let dapr = "/dapr.proto.runtime.v1.Dapr";
    put(
        "dapr-save",
        &format!("{dapr}/SaveState"),
        rpb::SaveStateRequest {
            store_name: "statestore".into(),
            states: vec![item("a"), item("b")],
        }
        .encode_to_vec(),
    );
    put(
        "dapr-get",
        &format!("{dapr}/GetState"),
        rpb::GetStateRequest {
            store_name: "statestore".into(),
            key: "a".into(),
            consistency: 1,
            metadata: meta(),
        }
        .encode_to_vec(),
    );
    put(
        "dapr-bulk",
        &format!("{dapr}/GetBulkState"),
        rpb::GetBulkStateRequest {
            store_name: "statestore".into(),
            keys: vec!["a".into(), "b".into()],
            parallelism: 2,
            metadata: meta(),
        }
        .encode_to_vec(),
    );
    put(
        "dapr-transaction",
        &format!("{dapr}/ExecuteStateTransaction"),
        rpb::ExecuteStateTransactionRequest {
            store_name: "statestore".into(),
            operations: vec![
                rpb::TransactionalStateOperation {
                    operation_type: "upsert".into(),
                    request: Some(item("a")),
                },
                rpb::TransactionalStateOperation {
                    operation_type: "delete".into(),
                    request: Some(item("b")),
                },
            ],
            metadata: meta(),
        }
        .encode_to_vec(),
    );
    put(
        "dapr-query",
        &format!("{dapr}/QueryStateAlpha1"),
        rpb::QueryStateRequest {
            store_name: "statestore".into(),
            query: r#"{"filter":{"EQ":{"n":1}},"sort":[{"key":"n"}],"page":{"limit":1}}"#.into(),
            metadata: meta(),
        }
        .encode_to_vec(),
    );
    put(
        "dapr-configuration",
        &format!("{dapr}/GetConfiguration"),
        rpb::GetConfigurationRequest {
            store_name: "configstore".into(),
            keys: vec!["a".into()],
            metadata: meta(),
        }
        .encode_to_vec(),
    );
    put(
        "dapr-lock",
        &format!("{dapr}/TryLockAlpha1"),
        rpb::TryLockRequest {
            store_name: "lockstore".into(),
            resource_id: "r".into(),
            lock_owner: "o".into(),
            expiry_in_seconds: 60,
        }
        .encode_to_vec(),
    );
    let component = "/dapr.proto.components.v1";
    let set = |key: &str| cpb::SetRequest {
        key: key.into(),
        value: b"v".to_vec(),
        etag: Some(cpb::Etag { value: ts(0) }),
        metadata: meta(),
        options: Some(cpb::StateOptions {
            concurrency: 1,
            consistency: 1,
        }),
        content_type: "text/plain".into(),
    };
    put(
        "component-set",
        &format!("{component}.StateStore/Set"),
        set("a").encode_to_vec(),
    );
    put(
        "component-bulkset",
        &format!("{component}.StateStore/BulkSet"),
        cpb::BulkSetRequest {
            items: vec![set("a"), set("b")],
            options: None,
        }
        .encode_to_vec(),
    );
    put(
        "component-transact",
        &format!("{component}.TransactionalStateStore/Transact"),
        cpb::TransactionalStateRequest {
            operations: vec![cpb::TransactionalStateOperation {
                request: Some(cpb::transactional_state_operation::Request::Set(set("a"))),
            }],
            metadata: meta(),
        }
        .encode_to_vec(),
    );
    s
}

fn export_seeds() -> Seeds {
    let mut s = Seeds::new();
    let record = |value: &[u8], fencing, expires: Option<u64>, slide| Record {
        value: Bytes::copy_from_slice(value),
        version: Hlc::new(NOW_MS, 0, "stategate"),
        fencing,
        expires_at_ms: expires,
        slide_ms: slide,
    };
    let mut out = Vec::new();
    stategate::dump::encode_line(b"user:1", &record(b"hello", None, None, None), &mut out);
    stategate::dump::encode_line(
        b"lock",
        &record(
            b"owner",
            Some(Hlc::new(NOW_MS, 3, "stategate")),
            Some(NOW_MS + 60_000),
            None,
        ),
        &mut out,
    );
    stategate::dump::encode_line(
        &[0xff, 0x00, b'k'],
        &record(&[0, 1, 2], None, Some(NOW_MS + 1000), Some(1000)),
        &mut out,
    );
    s.insert("records", out);
    s
}

fn token_seeds() -> Seeds {
    let mut s = Seeds::new();
    s.insert("plain", b"6B6579".to_vec());
    s.insert("sealed-shape", format!("S{}", "AB".repeat(48)).into_bytes());
    // A query page token: base64url of {"s":[sort values],"k":"<hex key>"}.
    s.insert("query", b"eyJzIjpbMV0sImsiOiI2MSJ9".to_vec());
    s
}

fn config_seeds() -> Seeds {
    let mut s = Seeds::new();
    s.insert(
        "settings",
        concat!(
            "max-keys = 1000\n",
            "http-listen = \"0.0.0.0:3500\"\n",
            "grpc-listen = \"127.0.0.1:50051\"\n",
            "node-id = \"node-1\"\n",
            "fsync = \"batch\"\n",
            "state-topics = \"state/\"\n",
            "max-value-bytes = 65536\n",
            "http-request-timeout = \"30s\"\n",
            "log-format = \"json\"\n",
            "dapr-store = [\"statestore\", \"other\"]\n",
        )
        .as_bytes()
        .to_vec(),
    );
    s
}

/// Sets `pairs` on a durable store in `dir`, one write each.
async fn write(dir: &Path, encryption: Option<EncryptionKey>, pairs: &[(&str, Option<&str>)]) {
    let store = DurableBackend::open(DurableOptions {
        fsync: FsyncMode::Never,
        clock: Arc::new(ManualClock::new(NOW_MS)),
        encryption,
        ..DurableOptions::new(dir)
    })
    .unwrap();
    for (i, (key, value)) in pairs.iter().enumerate() {
        let key = Bytes::copy_from_slice(key.as_bytes());
        let expected = store.get(&key).await.unwrap().map(|r| r.version);
        let new = value.map(|v| Record {
            value: Bytes::copy_from_slice(v.as_bytes()),
            version: Hlc::new(NOW_MS, i as u32 + 1, "seed"),
            fencing: (i == 0).then(|| Hlc::new(NOW_MS, 9, "seed")),
            expires_at_ms: (i == 1).then_some(NOW_MS + 3_600_000),
            slide_ms: None,
        });
        store
            .swap_many(
                &[Swap {
                    key,
                    expected,
                    new,
                    deadline: DeadlineCheck::Any,
                }],
                None,
            )
            .await
            .unwrap();
    }
}

/// A data directory as the `durable_dir` target reads it (`fuzz/src/lib.rs` DataDir).
fn pack(dir: &Path, encrypted: bool) -> Vec<u8> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "LOCK")
        .collect();
    names.sort();
    let mut out = vec![u8::from(encrypted)];
    for name in names {
        let data = std::fs::read(dir.join(&name)).unwrap();
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
    }
    out
}

async fn durable_seeds() -> Seeds {
    let mut s = Seeds::new();
    let writes = [("a", Some("1")), ("b", Some("two")), ("a", None), ("c", Some("3"))];
    let log = tempfile::tempdir().unwrap();
    write(log.path(), None, &writes).await;
    s.insert("log", pack(log.path(), false));
    // A snapshot (rekey writes one of everything), then more log after it.
    let snap = tempfile::tempdir().unwrap();
    write(snap.path(), None, &writes).await;
    rekey(snap.path(), None, None).unwrap();
    write(snap.path(), None, &[("d", Some("4")), ("b", None)]).await;
    s.insert("snapshot-and-log", pack(snap.path(), false));
    let sealed = tempfile::tempdir().unwrap();
    write(sealed.path(), Some(fuzz_key()), &writes).await;
    s.insert(ENCRYPTED_SEED, pack(sealed.path(), true));
    s
}

fn fuzz_key() -> EncryptionKey {
    EncryptionKey::from_bytes(FUZZ_KEY, "fuzz.key")
}

/// The keys of a packed data directory, loaded read-only.
async fn keys_of_packed(packed: &[u8], key: Option<&EncryptionKey>) -> Vec<Bytes> {
    let dir = tempfile::tempdir().unwrap();
    let mut rest = &packed[1..];
    while let Some((&len, after)) = rest.split_first() {
        let (name, after) = after.split_at(len as usize);
        let n = u32::from_le_bytes(after[..4].try_into().unwrap()) as usize;
        std::fs::write(dir.path().join(std::str::from_utf8(name).unwrap()), &after[4..4 + n]).unwrap();
        rest = &after[4 + n..];
    }
    let index = load_read_only(dir.path(), key).unwrap();
    let page = index.scan(None, 1000, NOW_MS, &|_: &[u8]| true).await.unwrap();
    page.keys
}

#[tokio::test]
async fn fuzz_seeds_match_their_generator() {
    let all: [(&str, Seeds); 8] = [
        ("resp3_request", resp3_seeds()),
        ("mqtt_request", mqtt_seeds()),
        ("http_request", http_seeds()),
        ("grpc_message", grpc_seeds()),
        ("export_lines", export_seeds()),
        ("paging_token", token_seeds()),
        ("durable_dir", durable_seeds().await),
        ("config_file", config_seeds()),
    ];
    let write = std::env::var_os("STATEGATE_WRITE_FUZZ_SEEDS").is_some();
    let mut stale = Vec::new();
    for (target, seeds) in all {
        let dir = seeds_dir().join(target);
        if write {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
        }
        let committed: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
            .unwrap_or_default();
        for name in &committed {
            if !seeds.contains_key(name.as_str()) {
                stale.push(format!("{target}/{name}: not made by this generator"));
            }
        }
        for (name, bytes) in seeds {
            let path = dir.join(name);
            if write {
                std::fs::write(&path, &bytes).unwrap();
                continue;
            }
            let Ok(on_disk) = std::fs::read(&path) else {
                stale.push(format!("{target}/{name}: missing"));
                continue;
            };
            let same = if LOADED_NOT_COMPARED.contains(&name) {
                let key = (name == ENCRYPTED_SEED).then(fuzz_key);
                keys_of_packed(&on_disk, key.as_ref()).await == keys_of_packed(&bytes, key.as_ref()).await
            } else {
                on_disk == bytes
            };
            if !same {
                stale.push(format!("{target}/{name}: differs"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "fuzz seeds out of date (STATEGATE_WRITE_FUZZ_SEEDS=1 rewrites them): {stale:#?}"
    );
}
