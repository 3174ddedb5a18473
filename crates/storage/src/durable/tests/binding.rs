//! Encrypted frames are bound to their place: a sealed record moved within its file, copied to
//! another file, or played again at the end no longer opens, so reordering and replay by
//! someone who can write the data directory (but has no key) stop startup as corruption.

use super::*;
use crate::durable::crypt::EncryptionKey;

fn key(byte: u8) -> EncryptionKey {
    EncryptionKey::from_bytes([byte; 32], format!("/keys/{byte}.key"))
}

fn encrypted(dir: &Path, byte: u8) -> DurableOptions {
    let mut o = options(dir);
    o.encryption = Some(key(byte));
    o
}

/// (start, end) of every frame of an encrypted file.
fn frames(path: &Path) -> Vec<(usize, usize)> {
    let data = std::fs::read(path).unwrap();
    let mut pos = format::SEALED_HEADER_LEN;
    let mut out = Vec::new();
    while pos < data.len() {
        let (_, n) = format::read_frame(&data[pos..]).unwrap();
        out.push((pos, pos + n));
        pos += n;
    }
    out
}

fn refused(o: DurableOptions) -> String {
    match DurableBackend::open(o) {
        Ok(_) => panic!("opened a store whose records were moved"),
        Err(e @ StorageError::Corrupt(_)) => e.to_string(),
        Err(e) => panic!("not corruption: {e}"),
    }
}

/// Two writes of one key, swapped on disk: the older value would come back.
#[tokio::test]
async fn records_swapped_within_a_segment_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::new(DurableBackend::open(encrypted(dir.path(), 1)).unwrap());
        put(&store, b"k", rec(b"older", v(1, 0))).await;
        put(&store, b"k", rec(b"newer", v(2, 0))).await;
    }
    let seg = last_segment(dir.path());
    let f = frames(&seg);
    let data = std::fs::read(&seg).unwrap();
    let (a, b) = (&data[f[0].0..f[0].1], &data[f[1].0..f[1].1]);
    assert_eq!(a.len(), b.len());
    let swapped = [&data[..f[0].0], b, a, &data[f[1].1..]].concat();
    std::fs::write(&seg, swapped).unwrap();
    let e = refused(encrypted(dir.path(), 1));
    assert!(e.contains("log-") && e.contains("authenticate"), "{e}");
}

/// An earlier record copied to the end of the log: a replay that would roll the key back.
#[tokio::test]
async fn a_record_played_again_at_the_end_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::new(DurableBackend::open(encrypted(dir.path(), 2)).unwrap());
        put(&store, b"k", rec(b"older", v(1, 0))).await;
        put(&store, b"k", rec(b"newer", v(2, 0))).await;
    }
    let seg = last_segment(dir.path());
    let f = frames(&seg);
    let mut data = std::fs::read(&seg).unwrap();
    let first = data[f[0].0..f[0].1].to_vec();
    data.extend_from_slice(&first);
    std::fs::write(&seg, data).unwrap();
    refused(encrypted(dir.path(), 2));
}

/// A record of an older segment (a copy kept from before compaction) written into the newest
/// one at the same offset: its value would come back.
#[tokio::test]
async fn a_record_copied_from_another_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = encrypted(dir.path(), 3);
    {
        let store = Store::new(DurableBackend::open(o.clone()).unwrap());
        put(&store, b"k00", rec(b"stale", v(1, 0))).await;
    }
    let kept = std::fs::read(last_segment(dir.path())).unwrap();
    o.segment_bytes = 1024;
    {
        let store = Store::new(DurableBackend::open(o.clone()).unwrap());
        let mut i = 1u64;
        while last_segment(dir.path()).file_name().unwrap() == "log-00000000000000000001.log" {
            put(
                &store,
                format!("k{:02}", i % 100).as_bytes(),
                rec(b"fresh", v(i + 1, 0)),
            )
            .await;
            i += 1;
        }
        put(&store, b"k00", rec(b"fresh", v(i + 1, 0))).await;
    }
    let newest = last_segment(dir.path());
    let (start, end) = frames(&newest)[0];
    let donor = &kept[start..end];
    assert_eq!(donor.len(), end - start, "records of the same size");
    let mut data = std::fs::read(&newest).unwrap();
    data.splice(start..end, donor.iter().copied());
    std::fs::write(&newest, data).unwrap();
    refused(o);
}

/// Two chunks of a snapshot swapped: same keys, other places.
#[tokio::test]
async fn snapshot_chunks_swapped_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = encrypted(dir.path(), 4);
    o.segment_bytes = 64 * 1024;
    {
        let store = Store::new(DurableBackend::open(o.clone()).unwrap());
        for i in 0..1500u64 {
            put(&store, format!("k{i:05}").as_bytes(), rec(b"some value", v(i + 1, 0))).await;
        }
    }
    let snaps = files(dir.path(), "snap-");
    let snap = snaps.last().expect("a snapshot");
    let f = frames(snap);
    assert!(f.len() >= 3, "two chunks and the end: {f:?}");
    let data = std::fs::read(snap).unwrap();
    let (a, b) = (&data[f[0].0..f[0].1], &data[f[1].0..f[1].1]);
    let swapped = [&data[..f[0].0], b, a, &data[f[1].1..]].concat();
    std::fs::write(snap, swapped).unwrap();
    let e = refused(o);
    assert!(e.contains("snap-"), "{e}");
}

/// A store written by an earlier release (format 01E: records sealed without their place): the
/// service refuses it before reading or changing anything, naming the upgrade; `export
/// --data-dir` still reads it, and `rekey` under the same key rewrites it in the current format.
#[tokio::test]
async fn a_store_in_the_earlier_format_is_refused_until_rekeyed() {
    use crate::durable::crypt::Cipher;

    let dir = tempfile::tempdir().unwrap();
    let cipher = Cipher::new(&key(6)).unwrap();
    // What earlier releases wrote: the magic ends in 01E, and frames are sealed with no
    // associated data.
    let mut file = b"SGLOG01E".to_vec();
    file.extend_from_slice(&1u64.to_le_bytes());
    let aad = file.clone();
    cipher.seal_tail(&mut file, format::PLAIN_HEADER_LEN, &aad);
    for (i, value) in [&b"first"[..], b"second"].iter().enumerate() {
        let swap = Swap {
            key: b(format!("k{i}").as_bytes()),
            expected: None,
            new: Some(rec(value, v(i as u64 + 1, 0))),
            deadline: crate::DeadlineCheck::Any,
        };
        let mut plain = Vec::new();
        format::encode_batch(&mut plain, &[swap], 42);
        let (record, _) = format::read_frame(&plain).unwrap();
        let mut payload = record.to_vec();
        cipher.seal_tail(&mut payload, 0, b"");
        file.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        file.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        file.extend_from_slice(&payload);
    }
    let seg = dir.path().join(segment_name(1));
    std::fs::write(&seg, &file).unwrap();

    let e = match DurableBackend::open(encrypted(dir.path(), 6)) {
        Ok(_) => panic!("opened a store of the earlier format"),
        Err(e) => e,
    };
    let m = e.to_string();
    assert!(matches!(e, StorageError::Encryption(_)), "{m}");
    assert!(
        m.contains("log-") && m.contains("earlier release") && m.contains("stategate rekey"),
        "{m}"
    );
    assert_eq!(std::fs::read(&seg).unwrap(), file, "nothing was changed");

    let index = load_read_only(dir.path(), Some(&key(6))).unwrap();
    assert_eq!(index.key_count(), 2, "an export still reads it");
    rekey(dir.path(), Some(&key(6)), Some(&key(6))).unwrap();
    for name in files(dir.path(), "") {
        let data = std::fs::read(&name).unwrap();
        assert!(
            !data.starts_with(b"SGLOG01E") && !data.starts_with(b"SGSNP01E"),
            "{name:?}"
        );
    }
    let store = Store::new(DurableBackend::open(encrypted(dir.path(), 6)).unwrap());
    assert_eq!(get(&store, b"k1").await.unwrap().value, b(b"second"));
}
