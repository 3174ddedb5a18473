//! `stategate lock` against the real binary: exclusion and handover between holders on
//! different doors, expiry of a killed holder's lease, signals, a lost lease.

use tokio::io::AsyncWriteExt;

use super::{Live, doors, expect, run};
use crate::support::{Broker, TestEnv};

/// The command a lock runs in these tests: prints who it is and its fencing token, then waits
/// for a line on stdin (or its end) and exits with `code`.
fn holder_command(who: &str, code: u8) -> String {
    format!("echo \"{who} $STATEGATE_FENCING_TOKEN\"; read line; exit {code}")
}

fn token_of(line: &str, who: &str) -> stategate::hlc::Hlc {
    let t = line
        .strip_prefix(&format!("{who} "))
        .unwrap_or_else(|| panic!("{line:?} is not {who}'s"));
    t.parse().unwrap_or_else(|_| panic!("{t:?} is not a fencing token"))
}

/// `lock -- COMMAND` excludes a second `lock` (on another door: both take the lease the same
/// way), which waits and runs once the first command ends and releases; the first exits with
/// its command's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_excludes_a_second_holder_until_release() {
    let env = TestEnv::start(Broker::Embedded).await;
    let [mqtt, http, grpc] = doors(&env).map(|(_, d)| d);
    for (first, second) in [(&mqtt, &http), (&grpc, &mqtt), (&http, &grpc)] {
        let a_cmd = holder_command("a", 7);
        let mut a = Live::spawn(
            &["lock", "job", "--ttl", "3s", "--holder", "a", "--", "sh", "-c", &a_cmd],
            first,
        );
        let ta = token_of(&a.line().await, "a");
        expect(
            run(
                &["lock", "job", "--ttl", "3s", "--holder", "c", "--wait", "0s"],
                second,
                None,
            )
            .await,
            1,
            "held",
        );
        let b_cmd = holder_command("b", 0);
        let mut b = Live::spawn(
            &[
                "lock", "job", "--ttl", "3s", "--holder", "b", "--wait", "30s", "-v", "--", "sh", "-c", &b_cmd,
            ],
            second,
        );
        let waiting = b.stderr_until("waiting:").await;
        assert!(waiting.contains("held by a"), "{waiting}");
        // A's command ends: A releases and exits with the command's status; B takes over.
        a.stdin.take().unwrap().write_all(b"done\n").await.unwrap();
        assert_eq!(a.exit_code().await, 7);
        let tb = token_of(&b.line().await, "b");
        assert!(tb > ta, "the new fencing token {tb} is later than {ta}");
        drop(b.stdin.take());
        assert_eq!(b.exit_code().await, 0);
        expect(run(&["get", "job"], first, None).await, 1, "released");
    }
    env.stop().await;
}

/// A holder killed with SIGKILL never releases: its lease expires and the waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_hands_over_when_a_killed_holders_lease_expires() {
    let env = TestEnv::start(Broker::Embedded).await;
    let [mqtt, http, _] = doors(&env).map(|(_, d)| d);
    let a_cmd = holder_command("a", 0);
    let mut a = Live::spawn(
        &[
            "lock", "crash", "--ttl", "1s", "--holder", "a", "--", "sh", "-c", &a_cmd,
        ],
        &mqtt,
    );
    let ta = token_of(&a.line().await, "a");
    let b_cmd = holder_command("b", 0);
    let mut b = Live::spawn(
        &[
            "lock", "crash", "--ttl", "1s", "--holder", "b", "--wait", "30s", "-v", "--", "sh", "-c", &b_cmd,
        ],
        &http,
    );
    b.stderr_until("waiting:").await;
    a.signal("KILL");
    assert_ne!(a.exit_code().await, 0);
    // A's command still runs (an orphan reading stdin) but its lease is no longer renewed.
    let tb = token_of(&b.line().await, "b");
    assert!(tb > ta);
    expect(run(&["get", "crash"], &mqtt, None).await, 0, "held by b")
        .text()
        .contains('b');
    drop(b.stdin.take());
    assert_eq!(b.exit_code().await, 0);
    drop(a.stdin.take());
    env.stop().await;
}

/// Signals sent to `lock` reach its command (stdin is not a terminal here), which then exits
/// with its own status and the lease is released; a lease taken away while the command runs
/// stops the command and exits 3; a command that cannot start exits 2 and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_passes_signals_on_and_reports_a_lost_lease() {
    let env = TestEnv::start(Broker::Embedded).await;
    let [mqtt, http, grpc] = doors(&env).map(|(_, d)| d);
    // The background sleep keeps `wait` interruptible; its output goes nowhere.
    let trapping = "trap 'echo interrupted; exit 9' INT; echo \"a $STATEGATE_FENCING_TOKEN\"; \
                    sleep 30 >/dev/null 2>&1 & wait";
    let mut a = Live::spawn(
        &[
            "lock", "sig", "--ttl", "5s", "--holder", "a", "--", "sh", "-c", trapping,
        ],
        &grpc,
    );
    token_of(&a.line().await, "a");
    a.signal("INT");
    assert_eq!(a.line().await, "interrupted");
    assert_eq!(a.exit_code().await, 9);
    expect(
        run(&["get", "sig"], &grpc, None).await,
        1,
        "released after the command ended",
    );

    let a_cmd = holder_command("a", 0);
    let mut a = Live::spawn(
        &["lock", "lost", "--ttl", "1s", "--holder", "a", "--", "sh", "-c", &a_cmd],
        &mqtt,
    );
    token_of(&a.line().await, "a");
    // Someone deletes the lease and another holder takes it: A's next renewal finds it gone.
    expect(run(&["del", "lost"], &http, None).await, 0, "del");
    expect(
        run(&["lock", "lost", "--ttl", "1h", "--holder", "x"], &http, None).await,
        0,
        "x takes it",
    );
    assert_eq!(a.exit_code().await, 3, "a lost lease exits 3");
    let holder = expect(run(&["get", "lost"], &mqtt, None).await, 0, "still x's");
    assert_eq!(holder.text(), "x\n");

    let ran = run(
        &[
            "lock",
            "nocmd",
            "--ttl",
            "5s",
            "--holder",
            "a",
            "--",
            "/nonexistent/command",
        ],
        &http,
        None,
    )
    .await;
    assert_eq!(ran.code, 2, "{ran:?}");
    assert!(ran.stderr.contains("/nonexistent/command"), "{}", ran.stderr);
    expect(run(&["get", "nocmd"], &http, None).await, 1, "released");
    env.stop().await;
}
