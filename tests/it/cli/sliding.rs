//! Sliding expiry and MGET through the real client on every door: `set --sliding` saves a key
//! whose deadline every read (through any door) pushes out; `mget` reads several keys as of one
//! moment over MQTT and gRPC, and says why not over HTTP. The service's clock is moved by the
//! test (`TestEnv::advance`), so deadlines pass without waiting.

use super::{doors, expect, run};
use crate::support::{Broker, TestEnv};

/// Set on one door with a 10 s sliding TTL, read on another every 9 s: alive at 27 s; then no
/// read for 12 s: gone. A plain TTL set beside it is gone at 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_ttl_is_pushed_out_by_reads_on_every_door() {
    let env = TestEnv::start(Broker::Embedded).await;
    let all = doors(&env);
    for (i, (writer, write_door)) in all.iter().enumerate() {
        let (reader, read_door) = &all[(i + 1) % all.len()];
        let key = format!("session-{writer}");
        let plain = format!("plain-{writer}");
        let what = format!("set on {writer}, read on {reader}");
        expect(
            run(&["set", &key, "v", "--ttl", "10s", "--sliding"], write_door, None).await,
            0,
            &what,
        );
        expect(
            run(&["set", &plain, "v", "--ttl", "10s"], write_door, None).await,
            0,
            &what,
        );
        let version = run(&["get", &key, "--json"], read_door, None).await.json()[0]["version"].clone();
        for _ in 0..3 {
            env.advance(9_000);
            let got = expect(run(&["get", &key, "--json"], read_door, None).await, 0, &what);
            assert_eq!(got.json()[0]["value"], "v", "{what}");
            assert_eq!(got.json()[0]["version"], version, "{what}: a read changes no version");
        }
        expect(run(&["get", &plain, "--json"], read_door, None).await, 1, &what);
        env.advance(12_000);
        expect(run(&["get", &key, "--json"], read_door, None).await, 1, &what);
    }
    // --sliding alone is refused before anything is sent.
    let (_, mqtt) = &all[0];
    let refused = expect(
        run(&["set", "k", "v", "--sliding"], mqtt, None).await,
        2,
        "--sliding without a TTL",
    );
    assert!(refused.stderr.contains("--sliding needs --ttl"), "{}", refused.stderr);
    env.stop().await;
}

/// `mget` prints one line per key in order, `get`'s JSON for each, and exits 1 when any key is
/// absent; over HTTP it is a usage error (no point-in-time read there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mget_reads_several_keys_over_mqtt_and_grpc() {
    let env = TestEnv::start(Broker::Embedded).await;
    let [(_, mqtt), (_, http), (_, grpc)] = doors(&env);
    expect(run(&["set", "a", "1"], &mqtt, None).await, 0, "set a");
    expect(run(&["set", "b", "two words"], &mqtt, None).await, 0, "set b");
    for door in [&mqtt, &grpc] {
        let got = expect(run(&["mget", "a", "b", "--json"], door, None).await, 0, "mget");
        let lines = got.json();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            (lines[0]["key"].clone(), lines[0]["value"].clone()),
            ("a".into(), "1".into())
        );
        assert_eq!(
            (lines[1]["key"].clone(), lines[1]["value"].clone()),
            ("b".into(), "two words".into())
        );
        assert!(lines.iter().all(|l| l["version"].is_string()), "{lines:?}");
        let human = expect(
            run(&["mget", "b", "missing", "a"], door, None).await,
            1,
            "mget with a miss",
        );
        assert_eq!(human.text(), "b\ttwo words\na\t1\n");
        assert!(human.stderr.contains("not found: missing"), "{}", human.stderr);
    }
    let refused = expect(run(&["mget", "a"], &http, None).await, 2, "mget over HTTP");
    assert!(
        refused.stderr.contains("mget needs MQTT or --grpc"),
        "{}",
        refused.stderr
    );
    env.stop().await;
}
