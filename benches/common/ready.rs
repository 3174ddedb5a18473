//! Waiting for another process to serve: no event tells this process that a child is ready, so
//! these poll.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Polls `ready` until it holds; panics naming `what` past `limit`.
pub fn until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} was not ready within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether stategate's HTTP door on `port` answers `GET /readyz` with 200: storage open, every
/// door serving (on the client path: subscribed).
pub fn http_ready(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let req = "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let mut answer = String::new();
    s.write_all(req.as_bytes()).is_ok() && s.read_to_string(&mut answer).is_ok() && answer.starts_with("HTTP/1.1 200")
}
