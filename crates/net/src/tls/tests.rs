use std::path::Path;

use super::*;

/// A self-signed certificate for `name`, written as `<stem>.crt` and `<stem>.key` in `dir`.
fn write_self_signed(dir: &Path, stem: &str, name: &str) -> (PathBuf, PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    let (cert, key) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

fn leaf(r: &CertReloader) -> Vec<u8> {
    r.current.read().unwrap().cert[0].to_vec()
}

#[test]
fn loads_a_certificate_and_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_self_signed(dir.path(), "a", "localhost");
    let ck = load_certified_key(&cert, &key).unwrap();
    assert_eq!(ck.cert.len(), 1);
    assert_eq!(load_roots(&cert).unwrap().len(), 1);
}

#[test]
fn bad_files_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_a, _) = write_self_signed(dir.path(), "a", "localhost");
    let (_, key_b) = write_self_signed(dir.path(), "b", "localhost");
    let err = load_certified_key(&cert_a, &key_b).unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    let err = load_certified_key(&cert_a, &cert_a).unwrap_err();
    assert!(matches!(err, TlsError::NoKey { .. }), "{err}");
    let missing = dir.path().join("missing.pem");
    let err = load_certs(&missing).unwrap_err().to_string();
    assert!(err.contains("missing.pem"), "{err}");
    std::fs::write(&missing, "not pem").unwrap();
    assert!(matches!(load_certs(&missing), Err(TlsError::NoCertificate { .. })));
}

#[test]
fn reload_swaps_the_certificate_and_keeps_it_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_self_signed(dir.path(), "live", "localhost");
    let r = CertReloader::load(&cert, &key).unwrap();
    let reloads = r.reloads();
    let first = leaf(&r);
    assert!(!r.files_changed());

    // A new pair in place: seen as a change, served after the reload.
    let (c2, k2) = write_self_signed(dir.path(), "next", "localhost");
    std::fs::rename(&c2, &cert).unwrap();
    std::fs::rename(&k2, &key).unwrap();
    assert!(r.files_changed());
    r.reload().unwrap();
    assert!(!r.files_changed());
    let second = leaf(&r);
    assert_ne!(first, second);
    assert_eq!(*reloads.borrow(), 1);

    // A broken key: the reload fails and the certificate in use stays.
    std::fs::write(&key, "garbage").unwrap();
    assert!(r.reload().is_err());
    assert_eq!(leaf(&r), second);
    assert_eq!(*reloads.borrow(), 1);
}
