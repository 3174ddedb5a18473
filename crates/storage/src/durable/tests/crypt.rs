//! Encryption at rest: sealed frames round-trip and refuse tampering, nonces never repeat, a
//! torn tail is still a torn tail, no key or value is left in the clear on disk, and the wrong
//! key (or none, or a key for a plain store) is a clear error naming the files.

use std::collections::HashSet;

use super::*;
use crate::durable::crypt::{Cipher, EncryptionKey, NONCE_LEN};
use crate::durable::format::{Codec, Cursor, FileType, FormatError, HeaderError};

fn key(byte: u8) -> EncryptionKey {
    EncryptionKey::from_bytes([byte; 32], format!("/keys/{byte}.key"))
}

fn sealed(byte: u8) -> Codec {
    Codec::sealed(Cipher::new(&key(byte)).unwrap())
}

fn encrypted(dir: &Path, byte: u8) -> DurableOptions {
    let mut o = options(dir);
    o.encryption = Some(key(byte));
    o
}

fn open_with(o: DurableOptions) -> Store {
    Store::new(DurableBackend::open(o).unwrap())
}

fn open_err_with(o: DurableOptions) -> StorageError {
    match DurableBackend::open(o) {
        Ok(_) => panic!("opened a store that should be refused"),
        Err(e) => e,
    }
}

/// The end offset of every frame of an encrypted segment.
fn sealed_frame_ends(path: &Path) -> Vec<usize> {
    let data = std::fs::read(path).unwrap();
    let mut pos = format::SEALED_HEADER_LEN;
    let mut ends = Vec::new();
    while pos < data.len() {
        let (_, n) = format::read_frame(&data[pos..]).unwrap();
        pos += n;
        ends.push(pos);
    }
    ends
}

/// A log frame as the commit thread writes it first in segment 1, and where it was written.
fn batch(codec: &Codec, key: &[u8], value: &[u8]) -> (Vec<u8>, Cursor) {
    let swap = Swap {
        key: b(key),
        expected: None,
        new: Some(rec(value, v(1, 2))),
        deadline: crate::DeadlineCheck::Any,
    };
    let mut plain = Vec::new();
    format::encode_batch(&mut plain, &[swap], 42);
    let (_, at) = codec.start(FileType::Log, 1);
    let mut out = Vec::new();
    codec.seal_frames(&plain, &mut at.clone(), &mut out);
    (out, at)
}

#[test]
fn sealed_frames_round_trip_and_refuse_tampering() {
    let codec = sealed(1);
    let (out, at) = batch(&codec, b"secret-key", b"secret-value");
    let (file, offset) = (&at.file, at.offset);
    assert!(
        !out.windows(6).any(|w| w == b"secret"),
        "no plaintext in a sealed frame"
    );
    let (payload, n) = format::read_frame(&out).unwrap();
    assert_eq!(n, out.len());
    let record = codec.open(payload, file, offset).unwrap();
    match format::Decoder::default().decode(&record).unwrap() {
        format::Payload::Entries { entries, .. } => assert_eq!(entries[0].0, b(b"secret-key")),
        other => panic!("{other:?}"),
    }
    // Another open of the same key reads it; another key does not.
    assert!(sealed(1).open(payload, file, offset).is_ok());
    assert_eq!(sealed(2).open(payload, file, offset), Err(FormatError::Unauthentic));
    // Nor does the same key at another offset, or in another file (even of the same name).
    assert_eq!(codec.open(payload, file, offset + 1), Err(FormatError::Unauthentic));
    let (_, twin) = codec.start(FileType::Log, 1);
    assert_eq!(codec.open(payload, &twin.file, offset), Err(FormatError::Unauthentic));
    let (_, snap) = codec.start(FileType::Snapshot, 1);
    assert_eq!(codec.open(payload, &snap.file, offset), Err(FormatError::Unauthentic));
    // Cut anywhere: incomplete (a torn write), never garbage.
    for cut in 0..out.len() {
        assert!(format::read_frame(&out[..cut]).is_err(), "cut at {cut}");
    }
    // Any changed byte with the CRC fixed up (tampering, not a torn write): refused.
    for at in format::FRAME_HEADER_LEN..out.len() {
        let mut bad = out.clone();
        bad[at] ^= 0x01;
        let crc = crc32fast::hash(&bad[format::FRAME_HEADER_LEN..]);
        bad[4..8].copy_from_slice(&crc.to_le_bytes());
        let (p, _) = format::read_frame(&bad).unwrap();
        assert_eq!(codec.open(p, file, offset), Err(FormatError::Unauthentic), "byte {at}");
    }
}

#[test]
fn nonces_never_repeat_within_an_open_or_across_opens() {
    let mut seen = HashSet::new();
    // Two opens of the same key (a restart), many records each.
    for _open in 0..2 {
        let codec = sealed(7);
        for i in 0..5_000u32 {
            let (out, _) = batch(&codec, &i.to_le_bytes(), b"v");
            let (payload, _) = format::read_frame(&out).unwrap();
            let nonce: [u8; NONCE_LEN] = payload[..NONCE_LEN].try_into().unwrap();
            assert!(seen.insert(nonce), "nonce repeated at record {i}");
        }
        // Headers draw from the same nonces.
        let h = codec.header(FileType::Log, 1);
        let nonce: [u8; NONCE_LEN] = h[16..16 + NONCE_LEN].try_into().unwrap();
        assert!(seen.insert(nonce), "header nonce repeated");
    }
}

#[test]
fn headers_tell_the_mode_and_the_key() {
    let plain = Codec::plain();
    let one = sealed(1);
    let h = one.header(FileType::Snapshot, 9);
    assert_eq!(h.len(), format::SEALED_HEADER_LEN);
    assert_eq!(sealed(1).check_header(FileType::Snapshot, &h), Ok(9));
    assert_eq!(
        sealed(2).check_header(FileType::Snapshot, &h),
        Err(HeaderError::WrongKey)
    );
    assert_eq!(plain.check_header(FileType::Snapshot, &h), Err(HeaderError::Encrypted));
    assert_eq!(one.check_header(FileType::Log, &h), Err(HeaderError::NotOurs));
    let p = plain.header(FileType::Log, 3);
    assert_eq!(one.check_header(FileType::Log, &p), Err(HeaderError::NotEncrypted));
    assert_eq!(plain.check_header(FileType::Log, &p), Ok(3));
    // The sequence number is sealed too: a header moved to another file name is refused.
    let mut moved = h.clone();
    moved[8] ^= 1;
    assert_eq!(one.check_header(FileType::Snapshot, &moved), Err(HeaderError::WrongKey));
}

/// Distinctive keys and values, in the log and in a snapshot: none of them, nor the key
/// itself, appears anywhere in the data directory.
#[tokio::test]
async fn the_data_directory_holds_no_key_or_value_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = encrypted(dir.path(), 0xA5);
    o.segment_bytes = 2048;
    let needles: Vec<(String, String)> = (0..60)
        .map(|i| (format!("customer-{i:03}-name"), format!("card-number-4111-{i:04}")))
        .collect();
    {
        let store = open_with(o.clone());
        for (k, val) in &needles {
            put(&store, k.as_bytes(), rec(val.as_bytes(), v(1, 0))).await;
        }
    }
    assert!(!files(dir.path(), "snap-").is_empty(), "a snapshot was written too");
    let mut haystack = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        haystack.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    let found = |needle: &[u8]| haystack.windows(needle.len()).any(|w| w == needle);
    for (k, val) in &needles {
        assert!(!found(k.as_bytes()), "{k} is in the clear");
        assert!(!found(val.as_bytes()), "{val} is in the clear");
    }
    assert!(!found(&[0xA5; 32]), "the key is on disk");
    assert!(!found(b"customer-"), "a key prefix is in the clear");
    // The right key reads everything back.
    let store = open_with(o);
    for (k, val) in &needles {
        assert_eq!(get(&store, k.as_bytes()).await.unwrap().value, b(val.as_bytes()));
    }
}

#[tokio::test]
async fn a_wrong_key_no_key_or_an_unneeded_key_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with(encrypted(dir.path(), 1));
        put(&store, b"k", rec(b"v", v(1, 0))).await;
    }
    let wrong = open_err_with(encrypted(dir.path(), 2)).to_string();
    assert!(wrong.contains("/keys/2.key") && wrong.contains("wrong key"), "{wrong}");
    assert!(wrong.contains("log-"), "names the data file: {wrong}");
    let none = open_err(dir.path()).to_string();
    assert!(
        none.contains("is encrypted") && none.contains("--encryption-key-file"),
        "{none}"
    );
    // Nothing was changed by the refused opens.
    assert_eq!(
        get(&open_with(encrypted(dir.path(), 1)), b"k").await.unwrap().value,
        b(b"v")
    );

    let plain = tempfile::tempdir().unwrap();
    put(&open(plain.path()), b"k", rec(b"v", v(1, 0))).await;
    let unneeded = open_err_with(encrypted(plain.path(), 1)).to_string();
    assert!(
        unneeded.contains("is not encrypted") && unneeded.contains("stategate rekey"),
        "{unneeded}"
    );
}

/// Cut an encrypted log at every offset: each reopen serves a prefix of the history (a torn
/// sealed record is a torn tail, not corruption), and the store takes writes afterwards.
#[tokio::test]
async fn a_torn_sealed_tail_at_any_offset_leaves_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    const N: usize = 8;
    {
        let store = open_with(encrypted(dir.path(), 3));
        for i in 0..N {
            let value = vec![b'a' + i as u8; 30 * i];
            put(&store, format!("k{i}").as_bytes(), rec(&value, v(10 + i as u64, 0))).await;
        }
    }
    let seg = last_segment(dir.path());
    let ends = sealed_frame_ends(&seg);
    assert_eq!(ends.len(), N);
    let len = *ends.last().unwrap();
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
        let store =
            Store::new(DurableBackend::open(encrypted(dir.path(), 3)).unwrap_or_else(|e| panic!("cut at {cut}: {e}")));
        for i in 0..N {
            let got = get(&store, format!("k{i}").as_bytes()).await;
            if i < kept {
                let r = got.unwrap_or_else(|| panic!("cut at {cut}: k{i} is missing"));
                assert_eq!(r.value.len(), 30 * i, "cut at {cut}: k{i} whole");
            } else {
                assert_eq!(got, None, "cut at {cut}: k{i} was cut off");
            }
        }
    }
    let store = open_with(encrypted(dir.path(), 3));
    put(&store, b"after", rec(b"1", v(99, 0))).await;
    drop(store);
    assert_eq!(
        get(&open_with(encrypted(dir.path(), 3)), b"after").await.unwrap().value,
        b(b"1")
    );
}

/// A sealed record changed on disk (CRC fixed up) in the middle of the log is corruption.
#[tokio::test]
async fn a_tampered_record_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with(encrypted(dir.path(), 4));
        for i in 0..3u64 {
            put(&store, format!("k{i}").as_bytes(), rec(b"value", v(i + 1, 0))).await;
        }
    }
    let seg = last_segment(dir.path());
    let ends = sealed_frame_ends(&seg);
    let mut data = std::fs::read(&seg).unwrap();
    let (start, end) = (ends[0], ends[1]);
    data[end - 3] ^= 0x01;
    let crc = crc32fast::hash(&data[start + format::FRAME_HEADER_LEN..end]);
    data[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&seg, data).unwrap();
    let e = open_err_with(encrypted(dir.path(), 4));
    assert!(
        matches!(&e, StorageError::Corrupt(m) if m.contains("authenticate")),
        "{e}"
    );
}

#[test]
fn key_files_are_checked() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.key");
    std::fs::write(&path, [7u8; 32]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(EncryptionKey::from_file(&path).unwrap().path(), path);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = EncryptionKey::from_file(&path).unwrap_err().to_string();
    assert!(
        e.contains("k.key") && e.contains("chmod 600") && e.contains("0644"),
        "{e}"
    );
    std::fs::write(&path, b"too short\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = EncryptionKey::from_file(&path).unwrap_err().to_string();
    assert!(e.contains("exactly 32 bytes") && e.contains("holds 10"), "{e}");
    let e = EncryptionKey::from_file(&dir.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
}

/// `stategate rekey`: plain to encrypted, to another key, back to plain; every record stays.
#[tokio::test]
async fn rekey_moves_a_store_between_keys() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        for i in 0..50u64 {
            put(
                &store,
                format!("rk-{i}").as_bytes(),
                rec(b"rekeyed-value", v(100 + i, 0)),
            )
            .await;
        }
        del(&store, b"rk-0").await;
    }
    let check = async |o: DurableOptions| {
        let store = open_with(o);
        assert_eq!(get(&store, b"rk-0").await, None);
        assert_eq!(get(&store, b"rk-7").await, Some(rec(b"rekeyed-value", v(107, 0))));
        assert_eq!(store.backend().len().await.unwrap(), 49);
        let max = store.backend().max_version().await.unwrap().unwrap();
        assert!(max > v(149, 0), "the clock floor survives: {max}");
    };
    let report = rekey(dir.path(), None, Some(&key(1))).unwrap();
    assert_eq!(report.keys, 49);
    check(encrypted(dir.path(), 1)).await;
    assert!(open_err(dir.path()).to_string().contains("is encrypted"));
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        all.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    assert!(!all.windows(8).any(|w| w == b"rekeyed-"), "no plaintext after a rekey");

    rekey(dir.path(), Some(&key(1)), Some(&key(2))).unwrap();
    check(encrypted(dir.path(), 2)).await;
    assert!(
        open_err_with(encrypted(dir.path(), 1))
            .to_string()
            .contains("wrong key")
    );
    // The wrong old key is refused and changes nothing.
    assert!(rekey(dir.path(), Some(&key(1)), None).is_err());
    check(encrypted(dir.path(), 2)).await;

    rekey(dir.path(), Some(&key(2)), None).unwrap();
    check(options(dir.path())).await;
}

/// Reading a stopped store changes nothing, not even a torn tail.
#[tokio::test]
async fn a_read_only_load_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with(encrypted(dir.path(), 5));
        put(&store, b"a", rec(b"1", v(1, 0))).await;
        put(&store, b"b", rec(b"2", v(2, 0))).await;
    }
    let seg = last_segment(dir.path());
    let mut data = std::fs::read(&seg).unwrap();
    data.extend_from_slice(&[0u8; 100]);
    std::fs::write(&seg, &data).unwrap();
    let index = load_read_only(dir.path(), Some(&key(5))).unwrap();
    assert_eq!(index.key_count(), 2);
    assert_eq!(std::fs::read(&seg).unwrap(), data, "the torn tail is still there");
    assert!(
        load_read_only(dir.path(), None).is_err(),
        "an encrypted store needs its key"
    );
    let held = open_with(encrypted(dir.path(), 5));
    let busy = load_read_only(dir.path(), Some(&key(5))).unwrap_err().to_string();
    assert!(busy.contains("in use"), "{busy}");
    drop(held);
}
