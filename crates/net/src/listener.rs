//! The listener layer of the HTTP and gRPC doors: plain or TLS, with bounded work.
//!
//! Every accepted connection first takes a slot of its door ([`ListenerLimits::max_connections`]).
//! Without a free slot the connection is closed at once: nothing is queued and no task is
//! spawned for it. With a slot, one task does the TLS handshake (bounded by
//! [`ListenerLimits::handshake_timeout`]) and then serves the connection; the slot is held by
//! the [`Connection`] and freed when it is dropped, whoever ends up owning it (our HTTP/1
//! server or tonic's HTTP/2 server).
//!
//! Per-request limits (requests and streams in flight) are in [`inflight`]; the HTTP/1 header
//! timeout is hyper's (`http.rs`), the gRPC one is [`Connection`]'s first-byte deadline.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

pub mod body_budget;
pub mod capacity;
pub mod inflight;

use capacity::Capacity;

/// How a door's listener bounds its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Most connections open at once (past it a new connection is closed right away).
    pub max_connections: usize,
    /// Longest a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// Longest a new connection may wait before sending its first bytes after the handshake
    /// (`None`: no deadline). The gRPC door sets it; hyper's header timeout covers HTTP/1.
    pub first_byte_timeout: Option<Duration>,
}

impl Default for ListenerLimits {
    fn default() -> ListenerLimits {
        ListenerLimits {
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            first_byte_timeout: None,
        }
    }
}

/// Counters of one listener (for the status route, logs and tests).
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Connections refused because every slot was taken.
    pub refused: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub failed_handshakes: AtomicU64,
}

/// A bound listener of one door: its socket, its TLS acceptor (if any) and its slots.
pub struct Listener {
    door: &'static str,
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ListenerLimits,
    slots: Arc<Capacity>,
    stats: Arc<ListenerStats>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("door", &self.door)
            .field("tls", &self.tls.is_some())
            .field("limits", &self.limits)
            .finish()
    }
}

impl Listener {
    /// `door` names the door in logs; `tls`: serve TLS with this configuration.
    pub fn new(
        door: &'static str,
        tcp: TcpListener,
        tls: Option<Arc<rustls::ServerConfig>>,
        limits: ListenerLimits,
    ) -> Listener {
        Listener {
            door,
            tcp,
            tls: tls.map(TlsAcceptor::from),
            limits: ListenerLimits {
                max_connections: limits.max_connections.max(1),
                ..limits
            },
            slots: Arc::new(Capacity::new(limits.max_connections)),
            stats: Arc::default(),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn stats(&self) -> Arc<ListenerStats> {
        self.stats.clone()
    }

    /// Connections open now (slots taken).
    pub fn open_connections(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let slots = self.slots.clone();
        move || slots.taken()
    }

    /// The connection slots, to change their number live ([`Capacity::resize`]).
    pub fn connection_slots(&self) -> Arc<Capacity> {
        self.slots.clone()
    }

    /// Accepts until `stop` changes; each admitted connection, once its handshake is done, is
    /// passed to `serve` on its own task. Dropping the returned future (or aborting its task)
    /// ends every connection task it started.
    pub async fn run<F, Fut>(self, mut stop: watch::Receiver<bool>, serve: F)
    where
        F: Fn(Connection) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let serve = Arc::new(serve);
        let mut tasks = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                _ = stop.changed() => break,
                // Reap finished connection tasks, so the set holds only live ones.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
                a = self.tcp.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors or a similar resource error: pause instead of
                    // spinning on an accept that keeps failing.
                    tracing::warn!(door = self.door, cause = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(slot) = self.slots.try_take() else {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(door = self.door, %peer, max = self.slots.max(), "connection refused: every slot is taken");
                // Dropping the socket closes it: the client sees the connection end at once.
                drop(tcp);
                continue;
            };
            // Small responses must not wait for Nagle's algorithm (40 ms stalls with delayed ACK).
            let _ = tcp.set_nodelay(true);
            let (tls, limits, stats, serve, door) = (
                self.tls.clone(),
                self.limits,
                self.stats.clone(),
                serve.clone(),
                self.door,
            );
            tasks.spawn(async move {
                let io = match tls {
                    None => Io::Plain(tcp),
                    Some(acceptor) => {
                        match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => Io::Tls(Box::new(tls)),
                            Ok(Err(e)) => {
                                stats.failed_handshakes.fetch_add(1, Ordering::Relaxed);
                                tracing::debug!(door, %peer, cause = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                stats.failed_handshakes.fetch_add(1, Ordering::Relaxed);
                                tracing::debug!(door, %peer, "TLS handshake timed out");
                                return;
                            }
                        }
                    }
                };
                let first_byte = limits.first_byte_timeout.map(|t| Box::pin(tokio::time::sleep(t)));
                serve(Connection {
                    io,
                    peer,
                    first_byte,
                    _slot: slot,
                })
                .await;
            });
        }
        // Stop accepting; the connection tasks end on their own `stop` handling, or when the
        // caller drops this future (the set aborts them).
        drop(self.tcp);
        while tasks.join_next().await.is_some() {}
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An admitted connection, after its TLS handshake. It holds its door's slot until dropped.
pub struct Connection {
    io: Io,
    peer: SocketAddr,
    /// Fires if no byte arrives in time; cleared by the first byte read.
    first_byte: Option<Pin<Box<Sleep>>>,
    _slot: capacity::Taken,
}

impl Connection {
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
}

impl AsyncRead for Connection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if let Some(deadline) = &mut this.first_byte {
            match &polled {
                Poll::Ready(Ok(())) if buf.filled().len() > before => this.first_byte = None,
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent nothing in time",
                    )));
                }
                _ => {}
            }
        }
        polled
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, data),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let tcp = match &self.io {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        };
        tonic::transport::server::TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: Some(self.peer),
        }
    }
}

#[cfg(test)]
mod tests;
