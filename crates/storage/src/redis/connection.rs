//! How the backend reaches the Redis primary: a fixed address (`redis://`, `rediss://`) or
//! the primary that Sentinel names (`redis+sentinel://`, `rediss+sentinel://`), resolved again
//! every time the connection is replaced, so the service follows a failover (redis-rs's own
//! Sentinel clients resolve once and stay on the old primary). Every call is bounded, counted
//! and mapped to a [`StorageError`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{TcpSettings, socket2};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, ServerErrorKind, Value};

use super::{LuaScript, Shared};
use crate::secret::percent_decode;
use crate::{RedisUrl, RoundTrips, StorageError};

/// Where the primary is. One per backend, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Target {
    Direct(redis::Client),
    /// Asked of the sentinels each time a connection is made, and watched (see
    /// [`Shared::watch_primary`]).
    Sentinel(SentinelTarget),
}

/// The sentinels and what is needed to connect to the primary they name.
pub(super) struct SentinelTarget {
    sentinel: tokio::sync::Mutex<Sentinel>,
    service: String,
    node: SentinelNodeConnectionInfo,
    /// A client per sentinel, and the connection the watcher asks on.
    sentinels: Vec<redis::Client>,
    asking: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
}

/// The connection in use and the client it came from (the log reader opens its own).
pub(super) struct Connection {
    pub(super) manager: ConnectionManager,
    pub(super) client: redis::Client,
    /// Counts replacements, so that many calls failing together replace it once, and the log
    /// reader knows when its own connection belongs to a replaced primary.
    pub(super) generation: u64,
}

/// Who waited for a round trip (see [`RoundTrips`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    Call,
    Background,
}

/// The round trip counters.
#[derive(Debug, Default)]
pub(super) struct Counters {
    calls: AtomicU64,
    background: AtomicU64,
}

impl Counters {
    pub(super) fn add(&self, purpose: Purpose, n: u64) {
        match purpose {
            Purpose::Call => self.calls.fetch_add(n, Ordering::Relaxed),
            Purpose::Background => self.background.fetch_add(n, Ordering::Relaxed),
        };
    }

    pub(super) fn get(&self) -> RoundTrips {
        RoundTrips {
            calls: self.calls.load(Ordering::Relaxed),
            background: self.background.load(Ordering::Relaxed),
        }
    }
}

/// The connection slot: empty until the first call, and again after a call failed as
/// unavailable.
#[derive(Default)]
pub(super) struct Slot {
    current: RwLock<Option<Arc<Connection>>>,
    /// Held while a connection is made (one resolution at a time); the last generation.
    connecting: tokio::sync::Mutex<u64>,
}

impl Target {
    /// The target of `url`, with `tcp` for every connection to a data node.
    pub(super) fn new(url: &RedisUrl, tcp: TcpSettings) -> Result<Target, StorageError> {
        if url.is_sentinel() {
            let spec = SentinelSpec::parse(url)?;
            let sentinel =
                Sentinel::build(spec.sentinels.clone()).map_err(|e| StorageError::Backend(format!("{url}: {e}")))?;
            let sentinels = spec
                .sentinels
                .iter()
                .map(|s| {
                    let info = s.as_str().into_connection_info()?.set_tcp_settings(tcp.clone());
                    redis::Client::open(info)
                })
                .collect::<Result<_, _>>()
                .map_err(|e| StorageError::Backend(format!("{url}: {e}")))?;
            let mut redis = redis::RedisConnectionInfo::default().set_db(spec.db);
            if let Some(user) = &spec.username {
                redis = redis.set_username(user);
            }
            if let Some(password) = &spec.password {
                redis = redis.set_password(password);
            }
            let mut node = SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(redis)
                .set_tcp_settings(tcp);
            if spec.tls {
                node = node.set_tls_mode(redis::TlsMode::Secure);
            }
            return Ok(Target::Sentinel(SentinelTarget {
                sentinel: tokio::sync::Mutex::new(sentinel),
                service: spec.service,
                node,
                sentinels,
                asking: Default::default(),
            }));
        }
        let info = url.expose().into_connection_info().map_err(|e| {
            // The parser's message can quote the URL: name the URL ourselves, password hidden.
            StorageError::Backend(format!(
                "{url} is not a redis URL (redis://[user:password@]host:port[/db], rediss://..., or redis+sentinel://host:port[,host:port...]/service[/db]): {:?}",
                e.kind()
            ))
        })?;
        let client = redis::Client::open(info.set_tcp_settings(tcp))
            .map_err(|e| StorageError::Backend(format!("{url}: {e}")))?;
        Ok(Target::Direct(client))
    }

    /// A client for the primary now.
    async fn resolve(&self) -> Result<redis::Client, StorageError> {
        match self {
            Target::Direct(client) => Ok(client.clone()),
            Target::Sentinel(s) => {
                let SentinelTarget {
                    sentinel,
                    service,
                    node,
                    ..
                } = s;
                let client = sentinel
                    .lock()
                    .await
                    .async_master_for(service, Some(node))
                    .await
                    .map_err(|e| {
                        // No sentinel reachable, or none names a primary that answers as one
                        // (a failover in progress): both pass.
                        StorageError::Unavailable(format!("no primary for {service:?} from the sentinels: {e}"))
                    })?;
                tracing::info!(service, primary = ?client.get_connection_info().addr(), "redis primary resolved through sentinel");
                Ok(client)
            }
        }
    }
}

impl Shared {
    /// With Sentinel, checks every `every` that the connection is to the primary the sentinels
    /// name, for as long as the backend lives. A failover whose old primary still runs (a
    /// forced one, or a network split) makes no call fail until Sentinel demotes it, which can
    /// take seconds; writes acknowledged there meanwhile would be lost when it resyncs as a
    /// replica. So the connection is replaced as soon as a sentinel names another primary.
    pub(super) async fn watch_primary(backend: std::sync::Weak<Shared>, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            let Some(shared) = backend.upgrade() else { return };
            let Target::Sentinel(target) = &shared.target else {
                return;
            };
            let SentinelTarget {
                service,
                sentinels,
                asking,
                ..
            } = target;
            let Some(current) = shared.slot.current.read().unwrap_or_else(|e| e.into_inner()).clone() else {
                continue;
            };
            let (host, port) = match current.client.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(h, p) | redis::ConnectionAddr::TcpTls { host: h, port: p, .. } => {
                    (h.clone(), *p)
                }
                _ => continue,
            };
            let named = tokio::time::timeout(shared.timeout, ask_primary(service, sentinels, asking)).await;
            shared.counters.add(Purpose::Background, 1);
            match named {
                Ok(Some((h, p))) if (h.as_str(), p) != (host.as_str(), port) => {
                    tracing::warn!(service, from = %format!("{host}:{port}"), to = %format!("{h}:{p}"), "sentinel names another redis primary: reconnecting");
                    shared.replace_connection(current.generation);
                }
                Ok(_) => {}
                Err(_) => *asking.lock().await = None,
            }
        }
    }

    /// The connection to use, made when the slot is empty. A call that fails as unavailable
    /// (timed out, refused, loading, read-only...) empties the slot, once per generation
    /// however many calls fail together: a manager can stay stuck on a connection that died
    /// silently, or on a reconnection that failed in a way it does not retry (a server still
    /// loading), and after a failover only a new connection reaches the new primary. The next
    /// call resolves the primary again (Sentinel) and connects on first use.
    pub(super) async fn connection(&self) -> Result<Arc<Connection>, StorageError> {
        if let Some(c) = self.slot.current.read().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let mut generation = self.slot.connecting.lock().await;
        if let Some(c) = self.slot.current.read().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let client = self.target.resolve().await?;
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), self.manager_config.clone())
            .map_err(|e| StorageError::Backend(format!("{}: {e}", self.url)))?;
        *generation += 1;
        let c = Arc::new(Connection {
            manager,
            client,
            generation: *generation,
        });
        *self.slot.current.write().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        tracing::debug!(url = %self.url, generation = *generation, "new redis connection manager");
        Ok(c)
    }

    /// The generation of the connection in use (0: none).
    pub(super) fn generation(&self) -> u64 {
        self.slot
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |c| c.generation)
    }

    fn replace_connection(&self, failed: u64) {
        let mut current = self.slot.current.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| c.generation == failed) {
            *current = None;
        }
    }

    /// Runs `call` on the current connection within the timeout (connecting included).
    pub(super) async fn bounded<T, F, Fut>(&self, purpose: Purpose, call: F) -> Result<T, StorageError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, StorageError>>,
    {
        self.counters.add(purpose, 1);
        let mut used = None;
        let attempt = async {
            let connection = self.connection().await?;
            used = Some(connection.generation);
            call(connection.manager.clone()).await
        };
        let result = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(StorageError::Unavailable(format!(
                "no answer from redis within {:?}",
                self.timeout
            ))),
        };
        if let (Err(StorageError::Unavailable(_)), Some(generation)) = (&result, used) {
            self.replace_connection(generation);
        }
        result
    }

    pub(super) async fn query<T: FromRedisValue + Send>(&self, purpose: Purpose, cmd: &Cmd) -> Result<T, StorageError> {
        self.bounded(purpose, |mut c| async move {
            cmd.query_async(&mut c).await.map_err(storage_error)
        })
        .await
    }

    /// Runs a pipeline whose first command is `EVALSHA` of `script`; on `NOSCRIPT` loads the
    /// script and runs it again (one bound for the whole exchange). Returns every reply.
    pub(super) async fn eval_pipeline(
        &self,
        purpose: Purpose,
        script: &LuaScript,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<Value>, StorageError> {
        self.bounded(purpose, |mut c| async move {
            match pipe.query_async::<Vec<Value>>(&mut c).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.counters.add(purpose, 2);
                    script
                        .load()
                        .query_async::<String>(&mut c)
                        .await
                        .map_err(storage_error)?;
                    pipe.query_async(&mut c).await.map_err(storage_error)
                }
                other => other.map_err(storage_error),
            }
        })
        .await
    }
}

/// The primary's address as the first sentinel that answers names it.
async fn ask_primary(
    service: &str,
    sentinels: &[redis::Client],
    asking: &tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
) -> Option<(String, u16)> {
    let mut slot = asking.lock().await;
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("get-master-addr-by-name").arg(service);
    if let Some(c) = slot.as_mut() {
        match cmd.query_async::<Option<(String, u16)>>(c).await {
            Ok(named) => return named,
            Err(_) => *slot = None,
        }
    }
    for sentinel in sentinels {
        let Ok(mut c) = sentinel.get_multiplexed_async_connection().await else {
            continue;
        };
        if let Ok(named) = cmd.query_async::<Option<(String, u16)>>(&mut c).await {
            *slot = Some(c);
            return named;
        }
    }
    None
}

/// The parts of a `redis+sentinel://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentinelSpec {
    /// `redis://host:port` (or `rediss://`) of each sentinel.
    pub(super) sentinels: Vec<String>,
    pub(super) service: String,
    pub(super) db: i64,
    /// Credentials for the data nodes (the sentinels are asked without).
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) tls: bool,
}

/// Sentinel's port when a host names none.
const SENTINEL_PORT: u16 = 26379;

impl SentinelSpec {
    /// `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/service[/db]`;
    /// `rediss+sentinel://` for TLS to sentinels and data nodes. Credentials may be
    /// percent-encoded.
    pub(super) fn parse(url: &RedisUrl) -> Result<SentinelSpec, StorageError> {
        let bad = |why: &str| {
            StorageError::Backend(format!(
                "{url}: {why} (expected redis+sentinel://[user:password@]host:port[,host:port...]/service[/db])"
            ))
        };
        let text = url.expose();
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let tls = scheme.eq_ignore_ascii_case("rediss+sentinel");
        let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no service name"))?;
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (username, password) = match credentials {
            None => (None, None),
            Some(c) => {
                let (user, password) = match c.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (c, None),
                };
                let user = percent_decode(user).ok_or_else(|| bad("a malformed user name"))?;
                let password = password
                    .map(|p| percent_decode(p).ok_or_else(|| bad("a malformed password")))
                    .transpose()?;
                ((!user.is_empty()).then_some(user), password)
            }
        };
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            let (name, port) = split_host_port(host).ok_or_else(|| bad(&format!("bad sentinel address {host:?}")))?;
            let scheme = if tls { "rediss" } else { "redis" };
            let name = if name.contains(':') {
                format!("[{name}]")
            } else {
                name.to_owned()
            };
            sentinels.push(format!("{scheme}://{name}:{}", port.unwrap_or(SENTINEL_PORT)));
        }
        let mut parts = path.split('/');
        let service = percent_decode(parts.next().unwrap_or("")).ok_or_else(|| bad("a malformed service name"))?;
        if service.is_empty() {
            return Err(bad("no service name"));
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(n) => n.parse().map_err(|_| bad("the database is not a number"))?,
        };
        if parts.next().is_some() {
            return Err(bad("too many path parts"));
        }
        Ok(SentinelSpec {
            sentinels,
            service,
            db,
            username,
            password,
            tls,
        })
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = port.map(str::parse).transpose().ok()?;
    Some((host, port))
}

/// TCP_NODELAY (requests are small and latency-bound; redis 1.x leaves Nagle on), and a dead
/// peer noticed by the kernel: unacknowledged data or unanswered keepalives for longer than
/// the call bound (at least 1 s, so ordinary retransmissions do not count) close the socket,
/// which makes the connection manager reconnect.
pub(super) fn tcp_settings(timeout: Duration) -> TcpSettings {
    let patience = timeout.max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new().with_time(patience).with_interval(patience);
    let settings = TcpSettings::default().set_nodelay(true).set_keepalive(keepalive);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(patience);
    settings
}

/// The manager's own bounds are the same as ours; it retries a lost connection a few times in
/// the background, and we replace it after a failure (see [`Shared::connection`]).
pub(super) fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(timeout)
        .set_number_of_retries(4)
}

/// `rediss://`: redis-rs builds its rustls configuration with the process's default provider,
/// the one `tls` installs for every TLS user.
pub(super) fn install_crypto_provider() {
    crate::tls::install_provider();
}

/// A Redis failure as a storage error: what passes by itself (no connection, a server that is
/// loading, busy, read-only during a failover) is `Unavailable`; out of memory is `Full`;
/// anything else is a fault.
pub(super) fn storage_error(e: RedisError) -> StorageError {
    // A pipeline's error carries the server's code inside: look there too.
    let code = e.code().map(str::to_owned).or_else(|| {
        e.clone()
            .into_server_errors()
            .and_then(|errors| errors.first().map(|(_, error)| error.code().to_owned()))
    });
    let passing = match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => true,
        _ => matches!(code.as_deref(), Some("BUSY" | "NOREPLICAS" | "READONLY" | "LOADING")),
    };
    if passing {
        StorageError::Unavailable(e.to_string())
    } else if code.as_deref() == Some("OOM") {
        StorageError::Full(e.to_string())
    } else {
        StorageError::Backend(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> Result<SentinelSpec, StorageError> {
        let crate::StorageKind::Redis(url) = url.parse().expect("a storage url") else {
            panic!("not redis: {url}");
        };
        SentinelSpec::parse(&url)
    }

    #[test]
    fn sentinel_urls_parse() {
        let s = spec("redis+sentinel://app:p%40ss@10.0.0.1,10.0.0.2:26380,[::1]:5/mymaster/2").unwrap();
        assert_eq!(
            s,
            SentinelSpec {
                sentinels: vec![
                    "redis://10.0.0.1:26379".into(),
                    "redis://10.0.0.2:26380".into(),
                    "redis://[::1]:5".into()
                ],
                service: "mymaster".into(),
                db: 2,
                username: Some("app".into()),
                password: Some("p@ss".into()),
                tls: false,
            }
        );
        let s = spec("rediss+sentinel://:secret@h:1/svc").unwrap();
        assert_eq!((s.username, s.password.as_deref(), s.tls), (None, Some("secret"), true));
        assert_eq!(s.sentinels, vec!["rediss://h:1".to_owned()]);
        for broken in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:x/svc",
            "redis+sentinel://h:1,/svc",
            "redis+sentinel://h:1/svc/zero",
            "redis+sentinel://h:1/svc/0/more",
            "redis+sentinel://u:%zz@h:1/svc",
        ] {
            let e = spec(broken).expect_err(broken);
            assert!(e.to_string().contains("expected redis+sentinel://"), "{broken}: {e}");
        }
    }
}
