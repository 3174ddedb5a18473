//! Replicas whose clocks differ, on one Redis (issue 28): 25 s ahead, on time and 25 s behind,
//! inside the protocol's 60 s allowance. A key's versions, and so the fencing tokens a lock
//! hands out, never go backwards whichever replica writes, the key's deletion and expiry
//! included: the slower replicas' clocks pass every version they read from the log, and the
//! swap refuses a creation below the highest removal (`Written::Behind`), which the writer's
//! clock takes in before it decides again.

use super::*;

const SKEW_MS: u64 = 25_000;

async fn skewed(server: &TestServer) -> [Fx; 3] {
    let fast = replica(server, "fast", Limits::default()).await;
    fast.clock.advance(SKEW_MS);
    let on_time = replica(server, "on-time", Limits::default()).await;
    let slow = replica(server, "slow", Limits::default()).await;
    slow.clock.set(T0 - SKEW_MS);
    [fast, on_time, slow]
}

fn version(r: &Response) -> Hlc {
    r.version.clone().expect("a version")
}

#[tokio::test]
async fn a_key_deleted_through_a_fast_clock_is_created_again_with_a_later_version() {
    let server = TestServer::start(Flavor::Redis);
    let [fast, on_time, slow] = skewed(&server).await;
    let mut last = Hlc::new(0, 0, "none");
    // A lock taken and released through each replica in turn, fastest clock first.
    for (round, holder) in [&fast, &slow, &on_time, &fast, &on_time, &slow].into_iter().enumerate() {
        let owner = format!("owner-{round}");
        let taken = holder.ok(&["SET", "lock", &owner, "NX", "PX", "1000"]).await;
        assert_eq!(taken.reply, Reply::Ok, "round {round}");
        let token = version(&taken);
        assert!(token > last, "round {round}: token {token} after {last}");
        let released = holder.ok(&["VDEL", "lock", &owner]).await;
        let removal = version(&released);
        assert!(removal > token, "round {round}: removal {removal} after {token}");
        last = removal;
    }
}

#[tokio::test]
async fn a_key_expired_through_a_fast_clock_is_created_again_with_a_later_version() {
    let server = TestServer::start(Flavor::Redis);
    let [fast, _on_time, slow] = skewed(&server).await;
    let taken = slow.ok(&["SET", "lock", "old", "NX", "PX", "1000"]).await;
    // The fast replica finds the lock due (its clock is 50 s ahead of the slow one's) and
    // removes it with a version from its own clock.
    assert_eq!(fast.engine.expire_due(10).await.unwrap(), 1);
    let retaken = slow.ok(&["SET", "lock", "new", "NX", "PX", "1000"]).await;
    assert_eq!(retaken.reply, Reply::Ok);
    assert!(version(&retaken) > version(&taken));
    let expiry = Hlc::new(T0 + SKEW_MS, 0, "fast");
    assert!(
        version(&retaken) > expiry,
        "{} is not past the fast clock's removal",
        version(&retaken)
    );
}
