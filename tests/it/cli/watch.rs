//! `stategate watch` against the real binary: changes made through other doors, on every door.

use serde_json::Value;

use super::{Live, b64, doors, expect, run};
use crate::support::{Broker, TestEnv};

/// `watch` on each door prints the changes other doors make (an expiry included), the same
/// events with the same versions, and exits 0 on SIGINT. MQTT cannot tell an expiry from a
/// delete (KEYNOTIFY does not say): it prints `delete` where the others print `expire`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_changes_made_through_other_doors_until_sigint() {
    let env = TestEnv::start(Broker::Embedded).await;
    let [mqtt, http, grpc] = doors(&env).map(|(_, d)| d);
    let mut watchers = [
        ("mqtt", Live::spawn(&["watch", "w1", "w2", "--json", "-v"], &mqtt)),
        (
            "http",
            Live::spawn(&["watch", "--pattern", "w*", "--json", "-v"], &http),
        ),
        ("grpc", Live::spawn(&["watch", "w1", "w2", "--json", "-v"], &grpc)),
    ];
    for (_, w) in &mut watchers {
        w.stderr_until("watching").await;
    }
    let all: Vec<u8> = (0..=255).collect();
    expect(run(&["set", "w1", "hello"], &http, None).await, 0, "set over HTTP");
    expect(run(&["set", "w2", "-"], &grpc, Some(&all)).await, 0, "set over gRPC");
    expect(run(&["del", "w1"], &mqtt, None).await, 0, "del over MQTT");
    expect(
        run(&["set", "w2", "brief", "--px", "100"], &mqtt, None).await,
        0,
        "set with a TTL",
    );
    let mut seen = Vec::new();
    for (name, w) in &mut watchers {
        let mut events = Vec::new();
        for _ in 0..5 {
            events.push(w.json().await);
        }
        seen.push((*name, events));
    }
    let (_, reference) = &seen[2];
    let kinds = |evs: &Vec<Value>| -> Vec<(String, String, Option<String>)> {
        evs.iter()
            .map(|e| {
                (
                    e["event"].as_str().unwrap().to_owned(),
                    e["key"].as_str().unwrap().to_owned(),
                    e["value"].as_str().map(str::to_owned),
                )
            })
            .collect()
    };
    let expected = vec![
        ("set".into(), "w1".into(), Some("hello".into())),
        ("set".into(), "w2".into(), Some(b64(&all))),
        ("delete".into(), "w1".into(), None),
        ("set".into(), "w2".into(), Some("brief".into())),
        ("expire".into(), "w2".into(), None),
    ];
    assert_eq!(kinds(reference), expected, "gRPC watch");
    assert_eq!(reference[1]["value_base64"], true);
    assert_eq!(kinds(&seen[1].1), expected, "HTTP watch");
    let mut over_mqtt = expected.clone();
    over_mqtt[4].0 = "delete".into();
    assert_eq!(kinds(&seen[0].1), over_mqtt, "MQTT watch: an expiry is a delete");
    for (name, events) in &seen {
        let versions: Vec<&Value> = events.iter().map(|e| &e["version"]).collect();
        let want: Vec<&Value> = reference.iter().map(|e| &e["version"]).collect();
        assert_eq!(versions, want, "{name}: the same versions on every door");
    }
    for (name, w) in &mut watchers {
        w.signal("INT");
        assert_eq!(w.exit_code().await, 0, "{name} exits 0 on SIGINT");
    }
    env.stop().await;
}
