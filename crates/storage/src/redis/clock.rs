//! The time replicas on one Redis agree on: the server's clock, as `TIME` answers it, carried
//! forward between readings by this process's monotonic clock.
//!
//! Why not each replica's own wall clock: a deadline written by one replica is compared with
//! the clock of another (any replica's expiry driver may remove the key, any replica's read
//! decides whether it is expired), and versions issued by one are compared with versions
//! issued by another. Replicas whose clocks differ by 25 s granted a lock that another
//! replica's expiry driver removed at once, and issued fencing tokens lower than tokens issued
//! before. With one time for all, a deadline is the same instant to every replica.
//!
//! Why the monotonic clock between readings: the wall clock of the process may be stepped
//! (NTP, an operator, a faked clock); `Instant` is not. A reading stands for the midpoint of
//! its round trip, so it is off by up to half of it: a reading that waited for a paused or busy
//! server would move the time ahead by half the wait (the fault tests found a replica's time
//! 0.7 s ahead after Redis was paused for 1.5 s, and a lease ending that much early). So a
//! reading replaces the estimate only when its round trip is short ([`FINE_RTT`]) or when it
//! cannot be the estimated time (the server's clock moved: stepped, or another server after a
//! failover). The time never goes backwards: after a failover to a primary whose clock is
//! behind, it stands still until that clock catches up (versions keep increasing meanwhile by
//! their counter).

use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::hlc::Clock;

/// How often the server's clock is read again.
pub(super) const REFRESH: Duration = Duration::from_secs(1);

/// A reading whose round trip took at most this long is taken as it is (off by at most half).
pub(super) const FINE_RTT: Duration = Duration::from_millis(10);

/// How far a slow reading may fall outside the estimate of its round trip before it is taken as
/// the server's clock having moved.
const AGREES_WITHIN_MS: u64 = 5;

/// The server's time in ms since the epoch, estimated as `offset + elapsed since origin`.
#[derive(Debug)]
pub struct ServerClock {
    origin: Instant,
    /// The server's time at `origin`, in ms (from the latest reading).
    offset_ms: AtomicI64,
    /// The latest time answered: answers never go backwards.
    last_ms: AtomicU64,
}

impl ServerClock {
    /// A clock set from one reading: the server said `server_ms` at `at`.
    pub(super) fn new(server_ms: u64, at: Instant) -> ServerClock {
        let clock = ServerClock {
            origin: at,
            offset_ms: AtomicI64::new(0),
            last_ms: AtomicU64::new(0),
        };
        clock.set(server_ms, at);
        clock
    }

    /// Takes a new reading: the server said `server_ms` at `at`.
    pub(super) fn set(&self, server_ms: u64, at: Instant) {
        let since_origin = at.saturating_duration_since(self.origin).as_millis() as i64;
        let offset = i64::try_from(server_ms)
            .unwrap_or(i64::MAX)
            .saturating_sub(since_origin);
        self.offset_ms.store(offset, Ordering::Release);
    }

    /// Takes a reading whose request was sent at `sent` and answered at `answered`: adopted if
    /// the round trip was short, or if the server's time lies outside what the estimate says
    /// for that round trip; otherwise the estimate, which agrees with it, stands.
    pub(super) fn reading(&self, server_ms: u64, sent: Instant, answered: Instant) {
        let rtt = answered.saturating_duration_since(sent);
        let (earliest, latest) = (self.estimate_at(sent), self.estimate_at(answered));
        let agrees = server_ms.saturating_add(AGREES_WITHIN_MS) >= earliest
            && server_ms <= latest.saturating_add(AGREES_WITHIN_MS);
        if rtt <= FINE_RTT || !agrees {
            self.set(server_ms, sent + rtt / 2);
        }
    }

    fn estimate(&self) -> u64 {
        self.estimate_at(Instant::now())
    }

    fn estimate_at(&self, at: Instant) -> u64 {
        let elapsed = at.saturating_duration_since(self.origin).as_millis() as i64;
        self.offset_ms.load(Ordering::Acquire).saturating_add(elapsed).max(0) as u64
    }
}

impl Clock for ServerClock {
    fn now_ms(&self) -> u64 {
        let estimate = self.estimate();
        self.last_ms.fetch_max(estimate, Ordering::AcqRel).max(estimate)
    }
}

/// One reading of `TIME`: the server's ms, when the request was sent and when it was answered.
pub(super) async fn read(shared: &super::Shared) -> Result<(u64, Instant, Instant), crate::StorageError> {
    let sent = Instant::now();
    let (secs, micros): (u64, u64) = shared.query(super::Purpose::Background, &redis::cmd("TIME")).await?;
    let answered = Instant::now();
    Ok((secs.saturating_mul(1000).saturating_add(micros / 1000), sent, answered))
}

/// Reads the server's clock every [`REFRESH`] while the backend lives. A failed reading keeps
/// the last one (the monotonic clock carries it on).
pub(super) async fn refresh(shared: Weak<super::Shared>, clock: Arc<ServerClock>) {
    loop {
        tokio::time::sleep(REFRESH).await;
        let Some(shared) = shared.upgrade() else { return };
        match read(&shared).await {
            Ok((ms, sent, answered)) => clock.reading(ms, sent, answered),
            Err(e) => tracing::debug!(cause = %e, "reading the redis server's clock failed; keeping the last reading"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_runs_on_from_the_latest_reading() {
        let t0 = Instant::now();
        let c = ServerClock::new(1_000_000, t0);
        let now = c.now_ms();
        assert!((1_000_000..1_000_000 + 60_000).contains(&now), "{now}");
        // A later reading moves the estimate.
        c.set(5_000_000, Instant::now());
        assert!(c.now_ms() >= 5_000_000);
    }

    #[test]
    fn a_slow_reading_that_agrees_leaves_the_estimate_alone() {
        let t0 = Instant::now();
        let c = ServerClock::new(1_000_000, t0);
        // The server was paused for 1.4 s: asked at t0 + 1 s, it answered with its time at
        // the end of the pause. Its midpoint would put the time 0.7 s ahead.
        let sent = t0 + Duration::from_secs(1);
        let answered = sent + Duration::from_millis(1400);
        c.reading(1_000_000 + 2_400, sent, answered);
        assert_eq!(c.estimate_at(answered), 1_000_000 + 2_400);
    }

    #[test]
    fn a_reading_the_estimate_cannot_explain_is_taken() {
        let t0 = Instant::now();
        let c = ServerClock::new(1_000_000, t0);
        // Another primary, whose clock is a minute ahead, answered slowly.
        let sent = t0 + Duration::from_secs(1);
        let answered = sent + Duration::from_millis(400);
        c.reading(1_061_400, sent, answered);
        assert_eq!(
            c.estimate_at(answered),
            1_061_400 + 200,
            "the midpoint stands for the reading"
        );
        // A quick reading is taken as it is.
        let sent = answered;
        c.reading(1_061_405, sent, sent + Duration::from_millis(2));
        assert_eq!(c.estimate_at(sent + Duration::from_millis(1)), 1_061_405);
    }

    #[test]
    fn answers_never_go_backwards() {
        let c = ServerClock::new(5_000_000, Instant::now());
        let before = c.now_ms();
        // A primary whose clock is a minute behind after a failover.
        c.set(5_000_000 - 60_000, Instant::now());
        assert!(c.now_ms() >= before);
    }
}
