use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::*;

/// A listener whose connections echo one line; returns its address and the stop sender.
async fn echo(limits: ListenerLimits) -> (SocketAddr, watch::Sender<bool>, Arc<ListenerStats>) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = Listener::new("test", tcp, None, limits);
    let addr = listener.local_addr().unwrap();
    let stats = listener.stats();
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(listener.run(stop_rx, |mut conn: Connection| async move {
        let mut buf = [0u8; 64];
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    }));
    (addr, stop, stats)
}

async fn round_trip(s: &mut TcpStream) -> bool {
    if s.write_all(b"ping").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.is_ok() && &buf == b"ping"
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_at_once_and_slots_come_back() {
    let (addr, _stop, stats) = echo(ListenerLimits {
        max_connections: 2,
        ..ListenerLimits::default()
    })
    .await;
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    assert!(round_trip(&mut a).await && round_trip(&mut b).await);
    // The third is accepted by the kernel, then closed by us without a byte.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 1];
    assert!(matches!(c.read(&mut buf).await, Ok(0) | Err(_)));
    assert_eq!(stats.refused.load(Ordering::Relaxed), 1);
    // The admitted ones are still served; once one leaves, a new one gets its slot.
    assert!(round_trip(&mut a).await);
    drop(b);
    loop {
        let mut d = TcpStream::connect(addr).await.unwrap();
        if round_trip(&mut d).await {
            break;
        }
        // The slot frees when the server task sees b's close: retry until it has.
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_silent_connection_is_closed_by_the_first_byte_deadline() {
    tokio::time::pause();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = Listener::new(
        "test",
        tcp,
        None,
        ListenerLimits {
            first_byte_timeout: Some(Duration::from_secs(5)),
            ..ListenerLimits::default()
        },
    );
    let addr = listener.local_addr().unwrap();
    let (_stop, stop_rx) = watch::channel(false);
    let (tx, mut ended) = mpsc::unbounded_channel();
    tokio::spawn(listener.run(stop_rx, move |mut conn: Connection| {
        let tx = tx.clone();
        async move {
            let mut buf = [0u8; 8];
            let _ = tx.send(conn.read(&mut buf).await.map_err(|e| e.kind()));
        }
    }));
    let _silent = TcpStream::connect(addr).await.unwrap();
    // Paused time jumps to the deadline once every task waits.
    assert_eq!(ended.recv().await.unwrap(), Err(std::io::ErrorKind::TimedOut));
    let mut talking = TcpStream::connect(addr).await.unwrap();
    talking.write_all(b"x").await.unwrap();
    assert_eq!(ended.recv().await.unwrap(), Ok(1));
}
