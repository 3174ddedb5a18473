//! Loopback ports for the processes tests and benchmarks start. std only: `tests/it` and the
//! benchmarks include this file through `#[path]`, and so does `server.rs`.

use std::net::TcpListener;

/// A loopback port nothing listens on, for a process the test starts next (bound, then
/// released).
///
/// Picked below the kernel's ephemeral range (`ip_local_port_range`), not with a bind to port 0:
/// the kernel gives ephemeral ports to every outgoing connection and every bind to port 0 on the
/// machine, so one of those could take the port between this pick and the child's bind, or while
/// a killed server is down before its restart on the same port. Below the range only another
/// explicit pick can, and this process never hands a port out twice; the start is random so
/// that two suites on one machine rarely try the same ports. Falls back to port 0 when the range
/// leaves no room below it.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    const LOWEST: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    // In u32: with a range that starts high, `start + i` passes u16::MAX.
    let span = u32::from(ephemeral_low.saturating_sub(LOWEST));
    if span >= 1_000 {
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        let given = given.get_or_insert_with(HashSet::new);
        let start = (RandomState::new().hash_one(std::process::id()) % u64::from(span)) as u32;
        for i in 0..span {
            // Below `ephemeral_low`, a u16.
            let port = LOWEST + ((start + i) % span) as u16;
            if given.contains(&port) {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}
