//! A test PKI made in the test: a CA, server and client certificates (rcgen), written as PEM
//! files in a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A certificate and its key as PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA certificate to `dir/<stem>.pem`.
    pub fn write(&self, dir: &Path, stem: &str) -> PathBuf {
        let p = dir.join(format!("{stem}.pem"));
        std::fs::write(&p, &self.pem).unwrap();
        p
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self, dir: &Path, stem: &str) -> Pair {
        self.issue(dir, stem, "localhost", true, false)
    }

    /// A server certificate that expired in 2021.
    pub fn expired_server(&self, dir: &Path, stem: &str) -> Pair {
        self.issue(dir, stem, "localhost", true, true)
    }

    /// A client certificate whose subject common name is `cn`.
    pub fn client(&self, dir: &Path, stem: &str, cn: &str) -> Pair {
        self.issue(dir, stem, cn, false, false)
    }

    /// A client certificate with an empty subject (no common name): its only name is the
    /// subjectAltName `san`, as RFC 5280 allows.
    pub fn client_without_subject(&self, dir: &Path, stem: &str, san: &str) -> Pair {
        let mut params = CertificateParams::new(vec![san.to_owned()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        write_pair(dir, stem, cert.pem(), key.serialize_pem())
    }

    fn issue(&self, dir: &Path, stem: &str, cn: &str, server: bool, expired: bool) -> Pair {
        let sans = if server {
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
        } else {
            vec![]
        };
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name = dn(cn);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        write_pair(dir, stem, cert.pem(), key.serialize_pem())
    }
}

/// A self-signed server certificate for localhost (no CA vouches for it).
pub fn self_signed_server(dir: &Path, stem: &str) -> Pair {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    write_pair(dir, stem, ck.cert.pem(), ck.signing_key.serialize_pem())
}

fn write_pair(dir: &Path, stem: &str, cert_pem: String, key_pem: String) -> Pair {
    let (cert, key) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
    // Written aside and renamed, as a certificate manager replaces files: a reader never sees
    // half a file.
    let (tmp_c, tmp_k) = (
        dir.join(format!(".{stem}.crt.tmp")),
        dir.join(format!(".{stem}.key.tmp")),
    );
    std::fs::write(&tmp_c, &cert_pem).unwrap();
    std::fs::write(&tmp_k, key_pem).unwrap();
    std::fs::rename(&tmp_k, &key).unwrap();
    std::fs::rename(&tmp_c, &cert).unwrap();
    Pair { cert, key, cert_pem }
}

fn dn(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

/// The DER of the first certificate in a PEM string.
pub fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
}
