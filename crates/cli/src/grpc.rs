//! The gRPC door: `statestore.v1.StateStore`, which carries every operation natively (values
//! as bytes, versions, NX/NEX, `if_version`, TTLs in ms, fencing tokens, a streaming Watch).

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use super::args::ConnectArgs;
use super::{
    CliError, Condition, DelOutcome, Door, Event, Exit, Found, MAX_MESSAGE_BYTES, ScanPage, SetOutcome, WATCH_BUFFER,
    Watch, Write, base_url, ttl_ms,
};
use stategate_proto::statestore::v1 as pb;

type Client = pb::state_store_client::StateStoreClient<Channel>;

pub struct GrpcDoor {
    client: Client,
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
    timeout: Duration,
    url: String,
}

fn status_error(s: &Status) -> CliError {
    let exit = match s.code() {
        Code::InvalidArgument | Code::OutOfRange | Code::Unimplemented => Exit::Usage,
        Code::FailedPrecondition | Code::Aborted | Code::AlreadyExists => Exit::Conflict,
        Code::PermissionDenied | Code::Unauthenticated => Exit::NotAuthorized,
        Code::NotFound => Exit::NotFound,
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss => Exit::Unavailable,
    };
    CliError::new(exit, format!("the gRPC door answered {:?}: {}", s.code(), s.message()))
}

impl GrpcDoor {
    /// Connects (bounded by the timeout), so an unreachable service is reported at once.
    pub async fn connect(url: &str, c: &ConnectArgs) -> Result<GrpcDoor, CliError> {
        let url = base_url(url, "--grpc")?;
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| CliError::usage(format!("--grpc {url:?}: {e}")))?
            .connect_timeout(c.timeout)
            .tcp_nodelay(true);
        let connecting = async {
            if url.starts_with("https://") {
                let connector = tls_connector(super::tls_client_config(c, &[b"h2"])?);
                endpoint
                    .connect_with_connector(connector)
                    .await
                    .map_err(|e| CliError::unavailable(format!("cannot reach {url}: {}", error_chain(&e))))
            } else {
                endpoint
                    .connect()
                    .await
                    .map_err(|e| CliError::unavailable(format!("cannot reach {url}: {}", error_chain(&e))))
            }
        };
        let channel = match tokio::time::timeout(c.timeout, connecting).await {
            Ok(Ok(ch)) => ch,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(CliError::unavailable(format!("timed out connecting to {url}"))),
        };
        let token = match c.api_token.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => Some(
                t.parse()
                    .map_err(|_| CliError::usage("--api-token must be printable ASCII"))?,
            ),
        };
        let client = Client::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(GrpcDoor {
            client,
            token,
            timeout: c.timeout,
            url,
        })
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("dapr-api-token", t.clone());
        }
        r
    }

    /// Runs one unary call within the timeout.
    async fn call<T>(&self, f: impl Future<Output = Result<tonic::Response<T>, Status>>) -> Result<T, CliError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(status_error(&s)),
            Err(_) => Err(CliError::unavailable(format!(
                "timed out after {} waiting for {}",
                humantime::format_duration(self.timeout),
                self.url
            ))),
        }
    }
}

fn version(v: String) -> Option<String> {
    (!v.is_empty()).then_some(v)
}

#[async_trait::async_trait]
impl Door for GrpcDoor {
    async fn get(&self, key: &Bytes) -> Result<Option<Found>, CliError> {
        let mut c = self.client.clone();
        let r = self
            .call(c.get(self.request(pb::GetRequest { key: key.to_vec() })))
            .await?;
        Ok(r.found.then(|| Found {
            value: Bytes::from(r.value),
            version: version(r.version),
        }))
    }

    async fn mget(&self, keys: &[Bytes]) -> Result<Vec<Option<Found>>, CliError> {
        let mut c = self.client.clone();
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        let asked = keys.len();
        let r = self.call(c.get_many(self.request(pb::GetManyRequest { keys }))).await?;
        if r.items.len() != asked {
            return Err(CliError::unavailable(format!(
                "the service answered {} items for {asked} keys",
                r.items.len()
            )));
        }
        Ok(r.items
            .into_iter()
            .map(|i| {
                i.found.then(|| Found {
                    value: Bytes::from(i.value),
                    version: version(i.version),
                })
            })
            .collect())
    }

    async fn set(&self, w: &Write) -> Result<SetOutcome, CliError> {
        let (condition, if_version) = match &w.condition {
            Condition::Always => (pb::SetCondition::Unspecified, String::new()),
            Condition::Nx => (pb::SetCondition::Nx, String::new()),
            Condition::Nex => (pb::SetCondition::Nex, String::new()),
            Condition::IfVersion(v) => (pb::SetCondition::Unspecified, v.clone()),
        };
        let req = pb::SetRequest {
            key: w.key.to_vec(),
            value: w.value.to_vec(),
            condition: condition as i32,
            ttl_ms: w.ttl.map_or(0, ttl_ms),
            ttl_sliding: w.sliding,
            fencing_token: w.fencing.clone().unwrap_or_default(),
            timestamp: String::new(),
            if_version,
        };
        let mut c = self.client.clone();
        let r = self.call(c.set(self.request(req))).await?;
        Ok(if r.applied {
            SetOutcome::Applied {
                version: version(r.version),
            }
        } else {
            SetOutcome::NotApplied
        })
    }

    async fn del(&self, key: &Bytes, if_version: Option<&str>, fencing: Option<&str>) -> Result<DelOutcome, CliError> {
        let req = pb::DelRequest {
            key: key.to_vec(),
            fencing_token: fencing.unwrap_or_default().to_owned(),
            if_version: if_version.unwrap_or_default().to_owned(),
        };
        let mut c = self.client.clone();
        let r = self.call(c.del(self.request(req))).await?;
        Ok(if r.deleted {
            DelOutcome::Deleted
        } else {
            DelOutcome::Absent
        })
    }

    async fn vdel(&self, key: &Bytes, value: &Bytes, fencing: Option<&str>) -> Result<DelOutcome, CliError> {
        let req = pb::VDelRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            fencing_token: fencing.unwrap_or_default().to_owned(),
        };
        let mut c = self.client.clone();
        let r = self.call(c.v_del(self.request(req))).await?;
        match pb::DeleteOutcome::try_from(r.outcome) {
            Ok(pb::DeleteOutcome::Deleted) => Ok(DelOutcome::Deleted),
            Ok(pb::DeleteOutcome::Absent) => Ok(DelOutcome::Absent),
            Ok(pb::DeleteOutcome::ValueMismatch) => Ok(DelOutcome::Mismatch),
            Ok(pb::DeleteOutcome::Unspecified) | Err(_) => {
                Err(CliError::unavailable(format!("unexpected VDel outcome {}", r.outcome)))
            }
        }
    }

    async fn scan_page(&self, pattern: &str, token: Option<Bytes>) -> Result<ScanPage, CliError> {
        let req = pb::ScanRequest {
            pattern: pattern.to_owned(),
            continuation_token: token
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default(),
        };
        let mut c = self.client.clone();
        let r = self.call(c.scan(self.request(req))).await?;
        Ok(ScanPage {
            keys: r.keys.into_iter().map(Bytes::from).collect(),
            token: (!r.continuation_token.is_empty()).then(|| Bytes::from(r.continuation_token)),
        })
    }

    async fn watch(&self, keys: &[Bytes], patterns: &[String], since: Option<&str>) -> Result<Watch, CliError> {
        let req = pb::WatchRequest {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
            patterns: patterns.to_vec(),
            since_version: since.unwrap_or_default().to_owned(),
            snapshot: false,
        };
        let mut c = self.client.clone();
        // Bounded until the answer's headers: the service has subscribed by then.
        let mut stream = self.call(c.watch(self.request(req))).await?;
        let (tx, events) = mpsc::channel(WATCH_BUFFER);
        let task = tokio::spawn(async move {
            loop {
                let item = match stream.message().await {
                    Ok(Some(ev)) => match to_event(ev) {
                        Some(e) => Ok(e),
                        None => continue,
                    },
                    Ok(None) => Err(CliError::unavailable("the service ended the watch")),
                    Err(s) => Err(status_error(&s)),
                };
                let end = item.is_err() || matches!(item, Ok(Event::Overflow));
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(Watch {
            events,
            keys: Vec::new(),
            task: Some(task),
        })
    }
}

fn to_event(ev: pb::WatchEvent) -> Option<Event> {
    let key = Bytes::from(ev.key);
    let version = ev.version;
    match pb::watch_event::Kind::try_from(ev.kind) {
        Ok(pb::watch_event::Kind::Set) => Some(Event::Set {
            key,
            value: Bytes::from(ev.value),
            version,
        }),
        Ok(pb::watch_event::Kind::Delete) => Some(Event::Delete { key, version }),
        Ok(pb::watch_event::Kind::Expire) => Some(Event::Expire { key, version }),
        Ok(pb::watch_event::Kind::Overflow) => Some(Event::Overflow),
        Ok(pb::watch_event::Kind::Reset) => Some(Event::Reset),
        Ok(pb::watch_event::Kind::Synced) => Some(Event::Synced {
            version: (!version.is_empty()).then_some(version),
        }),
        Ok(pb::watch_event::Kind::Unspecified) | Err(_) => None,
    }
}

/// An error with its causes (a TLS verification failure sits a few levels down).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// Connects gRPC over TLS: TCP, then a rustls handshake offering `h2` (tonic is built without
/// its own TLS; the process's one crypto provider does the work).
fn tls_connector(
    config: std::sync::Arc<rustls::ClientConfig>,
) -> impl tower::Service<
    http::Uri,
    Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Future<
        Output = std::io::Result<hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>>,
    > + Send,
> + Send
+ Clone
+ 'static {
    let connector = tokio_rustls::TlsConnector::from(config);
    tower::service_fn(move |uri: http::Uri| {
        let connector = connector.clone();
        async move {
            let host = uri
                .host()
                .ok_or_else(|| std::io::Error::other("the URL has no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tls = connector.connect(name, tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        }
    })
}
