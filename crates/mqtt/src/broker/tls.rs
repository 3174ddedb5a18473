//! The embedded broker's TLS (MQTTS) listener, and its certificate reload.
//!
//! rmqtt reads the certificate files when a listener is bound and has no reload call. A reload
//! therefore binds a second listener on the same address (both sockets use SO_REUSEPORT), starts
//! it under a new listener id, then stops the old accept loop. Connections already open run on
//! their own tasks and keep their session and their TLS keys; only accepting moves. A connection
//! the kernel had queued on the old socket but not yet handed out is reset when that socket
//! closes (the client reconnects, as after any network error).

use std::net::SocketAddr;
use std::path::PathBuf;

use rmqtt::codec::cert::CertInfo;
use rmqtt::context::ServerContext;
use rmqtt::net::Builder;
use rmqtt::server::MqttServer;
use rmqtt::types::ListenerId;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{BrokerError, into_io_error};
use crate::CertIdentity;

/// The TLS listener's settings.
#[derive(Debug, Clone)]
pub struct BrokerTls {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by these CAs; the identity becomes the username.
    pub client_ca: Option<PathBuf>,
    pub identity: CertIdentity,
    /// Changes when the certificate files were reloaded (the HTTP/gRPC reloader's counter):
    /// the listener is then rebound with the new files.
    pub reloads: Option<watch::Receiver<u64>>,
}

/// Builds rmqtt's TLS listener settings on top of the plain listener's.
fn settings(base: &Builder, tls: &BrokerTls, laddr: SocketAddr) -> Builder {
    let mtls = tls.client_ca.is_some();
    Builder::clone(base)
        .name("stategate/tls")
        .laddr(laddr)
        .reuseport(Some(true))
        .tls_cert(Some(tls.cert.display().to_string()))
        .tls_key(Some(tls.key.display().to_string()))
        .tls_cross_certificate(mtls)
        .tls_client_ca_certs(tls.client_ca.as_ref().map(|p| p.display().to_string()))
        .cert_cn_as_username(mtls && tls.identity == CertIdentity::Cn)
        .cert_subject_dn_as_username(mtls && tls.identity == CertIdentity::Subject)
        // The certificate travels with CONNECT, so an authentication hook can tell a username
        // taken from a verified certificate from one a client typed.
        .collect_cert_info(mtls)
}

/// The identity a verified client certificate names: the field `--mqtt-tls-identity` chose,
/// exactly what rmqtt put in place of the CONNECT username when the field is there. `None` when
/// the certificate lacks it (say a SAN-only certificate with an empty subject): rmqtt then
/// leaves the username the client typed, so such a certificate must be refused. There is no
/// subjectAltName fallback: rmqtt hands over the parsed CN, subject, organisation and serial,
/// not the certificate itself.
pub(crate) fn cert_identity(cert: &CertInfo, field: CertIdentity) -> Option<&str> {
    let name = match field {
        CertIdentity::Cn => cert.common_name.as_deref()?,
        CertIdentity::Subject => cert.subject.as_str(),
    };
    (!name.is_empty()).then_some(name)
}

/// A running TLS listener.
pub(super) struct TlsListener {
    pub(super) local_addr: SocketAddr,
    task: JoinHandle<()>,
    /// Times the listener was rebound with reloaded files.
    pub(super) rebinds: watch::Receiver<u64>,
}

impl TlsListener {
    /// Binds and starts accepting; a reload task follows `tls.reloads`.
    pub(super) fn start(scx: &ServerContext, base: &Builder, tls: BrokerTls) -> Result<TlsListener, BrokerError> {
        let (server, local_addr, id) = bind(scx, base, &tls, tls.listen)?;
        let mtls = tls.client_ca.is_some();
        let (rebound, rebinds) = watch::channel(0u64);
        let scx = scx.clone();
        let base = base.clone();
        let task = tokio::spawn(async move {
            // The accept loop in use; aborted when replaced or when this task is aborted.
            let mut current = (Accepting(tokio::spawn(run(server))), id);
            let Some(mut reloads) = tls.reloads.clone() else {
                std::future::pending::<()>().await;
                return;
            };
            while reloads.changed().await.is_ok() {
                match bind(&scx, &base, &tls, local_addr) {
                    Ok((server, _, id)) => {
                        let previous = std::mem::replace(&mut current, (Accepting(tokio::spawn(run(server))), id));
                        // Dropping the old accept loop aborts it, which closes its socket.
                        drop(previous.0);
                        scx.listen_cfgs.remove(&previous.1);
                        rebound.send_modify(|n| *n += 1);
                        tracing::info!(%local_addr, "embedded broker: MQTTS listener serves the reloaded certificate");
                    }
                    Err(e) => tracing::warn!(
                        %local_addr,
                        cause = %e,
                        "embedded broker: reloaded certificate not used by the MQTTS listener; the previous one stays"
                    ),
                }
            }
            std::future::pending::<()>().await;
        });
        tracing::info!(%local_addr, mtls, "embedded broker MQTTS listener");
        Ok(TlsListener {
            local_addr,
            task,
            rebinds,
        })
    }

    pub(super) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An accept loop's task, aborted when dropped.
struct Accepting(JoinHandle<()>);

impl Drop for Accepting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run(server: MqttServer) {
    if let Err(err) = server.run().await {
        tracing::error!(cause = %err, "embedded broker MQTTS listener stopped");
    }
}

/// Binds a TLS listener at `laddr` under a listener id not in use.
fn bind(
    scx: &ServerContext,
    base: &Builder,
    tls: &BrokerTls,
    laddr: SocketAddr,
) -> Result<(MqttServer, SocketAddr, ListenerId), BrokerError> {
    let bind_error = |source: rmqtt::Error| BrokerError::Bind {
        addr: laddr,
        source: into_io_error(source),
    };
    let listener = settings(base, tls, laddr).bind().map_err(bind_error)?;
    let mut listener = listener.tls().map_err(|e| BrokerError::Tls {
        addr: laddr,
        reason: format!("{e:#}"),
    })?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    listener.cfg = std::sync::Arc::new(Builder::clone(&listener.cfg).laddr(local_addr));
    // rmqtt panics on a listener id already registered: take the first free one.
    let id = (1..=ListenerId::MAX)
        .find(|id| !scx.listen_cfgs.contains_key(id))
        .ok_or_else(|| bind_error(anyhow::anyhow!("no free listener id")))?;
    let server = MqttServer::new(scx.clone()).listener_by_id(listener, id).build();
    Ok((server, local_addr, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: Option<&str>, subject: &str) -> CertInfo {
        CertInfo {
            common_name: cn.map(str::to_owned),
            subject: subject.to_owned(),
            ..CertInfo::default()
        }
    }

    #[test]
    fn a_certificate_names_its_client_by_the_configured_field_or_nobody() {
        let named = cert(Some("sensor-1"), "CN=sensor-1, O=Plant");
        assert_eq!(cert_identity(&named, CertIdentity::Cn), Some("sensor-1"));
        assert_eq!(
            cert_identity(&named, CertIdentity::Subject),
            Some("CN=sensor-1, O=Plant")
        );
        // An empty subject (a SAN-only certificate), or an empty CN, names nobody.
        for nameless in [cert(None, ""), cert(Some(""), "CN=")] {
            assert_eq!(cert_identity(&nameless, CertIdentity::Cn), None);
        }
        assert_eq!(cert_identity(&cert(None, ""), CertIdentity::Subject), None);
        // Without a CN the subject mode still has a name; the CN mode does not.
        let org_only = cert(None, "O=Plant");
        assert_eq!(cert_identity(&org_only, CertIdentity::Cn), None);
        assert_eq!(cert_identity(&org_only, CertIdentity::Subject), Some("O=Plant"));
    }
}
