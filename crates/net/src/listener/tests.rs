//! The listener over real loopback sockets, on the real clock: `Listener` takes a bound
//! `TcpListener`, so there is no in-memory stream to hand it. Paused time would let tokio jump
//! to a deadline whenever every task waits, even while the kernel is still carrying bytes;
//! instead each test waits for events (an answer, a connection task's end) and every wait is
//! bounded by [`within`], so a listener that misbehaves fails the test at the step it stopped
//! at instead of hanging it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::*;

/// Longest any one step may take: far past what loopback needs, short enough to fail soon.
const STEP: Duration = Duration::from_secs(10);

/// `fut`, or a failure naming `what` once [`STEP`] has passed.
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {STEP:?}"))
}

/// A listener whose connections echo what they get. Each connection task reports its peer on
/// the returned channel once it has dropped its [`Connection`] (so its slot is free again).
async fn echo(
    limits: ListenerLimits,
) -> (
    SocketAddr,
    watch::Sender<bool>,
    Arc<ListenerStats>,
    mpsc::UnboundedReceiver<SocketAddr>,
) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = Listener::new("test", tcp, None, limits);
    let addr = listener.local_addr().unwrap();
    let stats = listener.stats();
    let (stop, stop_rx) = watch::channel(false);
    let (ended_tx, ended) = mpsc::unbounded_channel();
    tokio::spawn(listener.run(stop_rx, move |mut conn: Connection| {
        let ended = ended_tx.clone();
        async move {
            let mut buf = [0u8; 64];
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let peer = conn.peer();
            drop(conn);
            let _ = ended.send(peer);
        }
    }));
    (addr, stop, stats, ended)
}

/// Whether `s` is served: "ping" comes back. `false` when the connection is closed.
async fn round_trip(s: &mut TcpStream) -> bool {
    within("an echo", async {
        if s.write_all(b"ping").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.is_ok() && &buf == b"ping"
    })
    .await
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_at_once_and_slots_come_back() {
    let (addr, _stop, stats, mut ended) = echo(ListenerLimits {
        max_connections: 2,
        ..ListenerLimits::default()
    })
    .await;
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    assert!(round_trip(&mut a).await && round_trip(&mut b).await);
    // The third is accepted by the kernel, then closed by us without a byte (a listener that
    // queued or served it instead would leave this read waiting).
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 1];
    let read = within("the refused connection's close", c.read(&mut buf)).await;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert_eq!(stats.refused.load(Ordering::Relaxed), 1);
    // The admitted ones are still served; once one leaves, a new one gets its slot.
    assert!(round_trip(&mut a).await);
    let b_addr = b.local_addr().unwrap();
    drop(b);
    // b's task sees the close and drops its connection, freeing the slot, before it reports.
    let gone = within("b's connection task to end", ended.recv()).await;
    assert_eq!(gone, Some(b_addr));
    let mut d = TcpStream::connect(addr).await.unwrap();
    assert!(
        round_trip(&mut d).await,
        "the slot b freed was not given to a new connection"
    );
    assert_eq!(stats.refused.load(Ordering::Relaxed), 1, "nothing else was refused");
}

/// What a connection task of [`first_byte`] reports.
#[derive(Debug, PartialEq)]
enum Read {
    /// Its read was polled and found no byte: it waits (for bytes, or for the deadline).
    Waiting,
    Done(Result<usize, std::io::ErrorKind>),
}

/// A listener with a first-byte deadline whose connection tasks do one read and report it.
async fn first_byte(timeout: Duration) -> (SocketAddr, watch::Sender<bool>, mpsc::UnboundedReceiver<Read>) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = Listener::new(
        "test",
        tcp,
        None,
        ListenerLimits {
            first_byte_timeout: Some(timeout),
            ..ListenerLimits::default()
        },
    );
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let (tx, reads) = mpsc::unbounded_channel();
    tokio::spawn(listener.run(stop_rx, move |mut conn: Connection| {
        let tx = tx.clone();
        async move {
            let mut buf = [0u8; 8];
            let mut read = std::pin::pin!(conn.read(&mut buf));
            let first = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
            let result = match first {
                Poll::Ready(r) => r,
                Poll::Pending => {
                    let _ = tx.send(Read::Waiting);
                    read.await
                }
            };
            let _ = tx.send(Read::Done(result.map_err(|e| e.kind())));
        }
    }));
    (addr, stop, reads)
}

#[tokio::test]
async fn a_silent_connection_is_closed_by_the_first_byte_deadline() {
    const DEADLINE: Duration = Duration::from_millis(100);
    let (addr, _stop, mut reads) = first_byte(DEADLINE).await;
    let connected = std::time::Instant::now();
    let _silent = TcpStream::connect(addr).await.unwrap();
    let mut got = within("the silent connection's deadline", reads.recv()).await;
    if got == Some(Read::Waiting) {
        got = within("the silent connection's deadline", reads.recv()).await;
    }
    assert_eq!(got, Some(Read::Done(Err(std::io::ErrorKind::TimedOut))));
    // Its deadline started after the connect began, and a tokio timer never fires early.
    assert!(
        connected.elapsed() >= DEADLINE,
        "closed after {:?}, before its deadline",
        connected.elapsed()
    );
}

#[tokio::test]
async fn a_connection_that_talks_before_its_deadline_is_read() {
    // How long a byte takes over loopback has no bound, so the deadline here is far past the
    // test's own (`STEP`): no race decides the outcome. The byte is sent only once the
    // server's read has found nothing and waits, so the waiting path is the one checked.
    let (addr, _stop, mut reads) = first_byte(Duration::from_secs(3600)).await;
    let mut talking = TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        within("the talking connection's read", reads.recv()).await,
        Some(Read::Waiting)
    );
    talking.write_all(b"x").await.unwrap();
    let got = within("the talking connection's byte", reads.recv()).await;
    assert_eq!(got, Some(Read::Done(Ok(1))));
}
