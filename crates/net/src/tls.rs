//! TLS for every listener and every client connection.
//!
//! - One rustls crypto provider for the process: aws-lc-rs, the one rmqtt's TLS listener is
//!   built with. Two providers are compiled in (ring comes with quinn, a dependency of rmqtt),
//!   and rustls' `ServerConfig::builder()` / `ClientConfig::builder()` panic when more than one
//!   is compiled and none is installed, so [`install_provider`] runs first thing in `main`, and
//!   every configuration built here names the provider explicitly through [`provider`] (tests
//!   start the service in process, without `main`).
//! - Certificate and key loading (PEM files) with errors that name the file.
//! - [`CertReloader`]: the HTTP and gRPC listeners' certificate, swapped in place on SIGHUP or
//!   when the files change. Handshakes read the current certificate through rustls'
//!   `ResolvesServerCert`, so new connections see a new certificate and open connections keep
//!   theirs: nothing is dropped.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::sync::watch;

/// How often the certificate files are checked for a change. Polling `stat` (rather than
/// inotify) also sees a file replaced through a symbolic link swap, as Kubernetes updates a
/// mounted Secret, and costs two system calls a second.
const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Why a certificate, key or CA file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: PathBuf },
    #[error("the key in {key} cannot be used with the certificate in {cert}: {reason}")]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("CA certificates in {path}: {reason}")]
    BadCa { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Installs the process's crypto provider (aws-lc-rs) unless one is installed already.
pub fn install_provider() {
    if CryptoProvider::get_default().is_none() {
        // Another thread may install one first: either way exactly one is installed.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

/// The process's crypto provider (installed on first use when `main` has not done it).
pub fn provider() -> Arc<CryptoProvider> {
    install_provider();
    match CryptoProvider::get_default() {
        Some(p) => p.clone(),
        // Unreachable after install_provider; a fresh provider is still a correct answer.
        None => Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Every PEM certificate in `path`, in order (a chain: leaf first).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(certs)
}

/// The first private key in `path`.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey { path: path.to_owned() },
        other => TlsError::Read {
            path: path.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// A certificate chain and its key, checked to belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs(cert)?;
    let der = load_key(key)?;
    let mismatch = |reason: String| TlsError::KeyMismatch {
        cert: cert.to_owned(),
        key: key.to_owned(),
        reason,
    };
    // from_der also checks that the key is the certificate's (keys_match).
    CertifiedKey::from_der(chain, der, &provider()).map_err(|e| mismatch(e.to_string()))
}

/// Trust anchors from a PEM file of CA certificates.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::BadCa {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// The system's trusted roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` name others); unreadable
/// entries are skipped.
pub fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(cause = %e, "skipping a system CA certificate");
    }
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    tracing::debug!(added, ignored, "system CA certificates");
    roots
}

/// A client configuration that verifies servers against `ca_file`, or the system's roots.
/// `alpn`: protocols to offer (`h2` for gRPC).
pub fn client_config(ca_file: Option<&Path>, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = match ca_file {
        Some(p) => load_roots(p)?,
        None => system_roots(),
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    // `metadata` follows symbolic links: a swapped link target is a change.
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let inode = 0;
    Some(FileStamp {
        modified: m.modified().ok(),
        len: m.len(),
        inode,
    })
}

/// The server certificate of the HTTP and gRPC listeners, reloadable in place.
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// Stamps of (certificate, key) when last loaded or last tried.
    stamps: Mutex<(Option<FileStamp>, Option<FileStamp>)>,
    /// Count of successful reloads (0 = the certificate loaded at start).
    reloads: watch::Sender<u64>,
}

impl std::fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .field("reloads", &*self.reloads.borrow())
            .finish()
    }
}

impl CertReloader {
    /// Loads the certificate and key (an error here stops the service at startup).
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<CertReloader>, TlsError> {
        let stamps = (stamp(cert), stamp(key));
        let loaded = load_certified_key(cert, key)?;
        Ok(Arc::new(CertReloader {
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            current: RwLock::new(Arc::new(loaded)),
            stamps: Mutex::new(stamps),
            reloads: watch::channel(0).0,
        }))
    }

    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// Reads the files again and serves them to new connections. On an error the certificate
    /// in use stays (and the error is returned for the caller to log).
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamps = (stamp(&self.cert_path), stamp(&self.key_path));
        *self.stamps.lock().unwrap_or_else(|p| p.into_inner()) = stamps;
        let loaded = Arc::new(load_certified_key(&self.cert_path, &self.key_path)?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = loaded;
        self.reloads.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Whether either file differs from when it was last (re)loaded or tried.
    fn files_changed(&self) -> bool {
        let now = (stamp(&self.cert_path), stamp(&self.key_path));
        *self.stamps.lock().unwrap_or_else(|p| p.into_inner()) != now
    }

    /// Successful reloads so far; changes on every reload (tests and the broker wait on it).
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// A server configuration that serves this certificate, with `alpn` protocols.
    pub fn server_config(self: &Arc<Self>, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, TlsError> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// Reloads on SIGHUP and whenever a file changes, until `stop` changes.
    pub fn spawn_watcher(self: &Arc<Self>, mut stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        // Registered before returning, so a SIGHUP sent once the service runs never meets the
        // default action (which would end the process).
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FILE_CHECK_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hup.as_mut() {
                        Some(s) => s.recv().await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<Option<()>>();
                let why = tokio::select! {
                    _ = stop.changed() => return,
                    _ = hangup => "SIGHUP",
                    _ = tick.tick() => {
                        if !this.files_changed() {
                            continue;
                        }
                        "the files changed"
                    }
                };
                match this.reload() {
                    Ok(()) => tracing::info!(
                        cert = %this.cert_path.display(),
                        reloads = *this.reloads.borrow(),
                        why,
                        "TLS certificate reloaded"
                    ),
                    Err(e) => {
                        tracing::warn!(cause = %e, why, "TLS certificate not reloaded; the previous one stays in use")
                    }
                }
            }
        })
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// TLS to an MQTT broker (the service's connection to an external broker, the command-line
/// client's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttClientTls {
    /// CA certificates that verify the broker (`None`: the system's trusted roots).
    pub ca_file: Option<std::path::PathBuf>,
}

impl MqttClientTls {
    /// rumqttc's transport for this configuration (our rustls configuration, our provider).
    #[cfg(feature = "mqtt-client-tls")]
    pub fn transport(&self) -> Result<rumqttc::Transport, TlsError> {
        let config = client_config(self.ca_file.as_deref(), &[])?;
        Ok(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(
            config,
        )))
    }
}

#[cfg(test)]
mod tests;
