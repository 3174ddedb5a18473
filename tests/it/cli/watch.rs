//! `stategate watch` against the real binary: changes made through other doors, on every door.

use serde_json::Value;

use super::{Live, Ran, b64, doors, expect, run};
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

/// `watch --since V` over HTTP and gRPC prints the changes after V, then live ones; when the
/// history no longer holds V it prints `reset`, the watched keys' current values and `synced`
/// with the version to resume from. Over MQTT `--since` is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_since_resumes_or_resets() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.limits.feed.max_events = 6).await;
    let [mqtt, http, grpc] = doors(&env).map(|(_, d)| d);
    let version = |ran: Ran| ran.json()[0]["version"].as_str().expect("version").to_owned();
    let v1 = version(expect(run(&["set", "r1", "a", "--json"], &http, None).await, 0, "set"));
    let v2 = version(expect(run(&["set", "r1", "b", "--json"], &grpc, None).await, 0, "set"));
    let v3 = version(expect(run(&["set", "r2", "c", "--json"], &mqtt, None).await, 0, "set"));
    let events = |evs: &[Value]| -> Vec<(String, String)> {
        evs.iter()
            .map(|e| {
                (
                    e["event"].as_str().unwrap().to_owned(),
                    e["version"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    for door in [&http, &grpc] {
        let mut w = Live::spawn(&["watch", "r1", "r2", "--since", &v1, "--json"], door);
        let got = [w.json().await, w.json().await];
        assert_eq!(
            events(&got),
            [("set".into(), v2.clone()), ("set".into(), v3.clone())],
            "{door:?}"
        );
        assert_eq!(got[0]["value"], "b");
        w.signal("INT");
        assert_eq!(w.exit_code().await, 0);
    }
    // Past the history kept: a reset, the current values, then the resume position.
    for i in 0..8 {
        expect(run(&["set", "other", &i.to_string()], &http, None).await, 0, "churn");
    }
    let mut r2 = v3;
    for door in [&http, &grpc] {
        let mut w = Live::spawn(&["watch", "r1", "r2", "--since", &v1, "--json"], door);
        assert_eq!(w.json().await["event"], "reset");
        let snapshot = [w.json().await, w.json().await];
        assert_eq!(
            events(&snapshot),
            [("set".into(), v2.clone()), ("set".into(), r2.clone())]
        );
        let synced = w.json().await;
        assert_eq!(synced["event"], "synced");
        let resume = synced["version"].as_str().expect("a resume position").to_owned();
        w.signal("INT");
        assert_eq!(w.exit_code().await, 0);
        // From `synced`, nothing is repeated: the next change is the first line.
        let v4 = version(expect(run(&["set", "r2", "d", "--json"], &http, None).await, 0, "set"));
        let mut w = Live::spawn(&["watch", "r1", "r2", "--since", &resume, "--json"], door);
        assert_eq!(events(&[w.json().await]), [("set".into(), v4.clone())]);
        r2 = v4;
        w.signal("INT");
        assert_eq!(w.exit_code().await, 0);
    }
    let refused = run(&["watch", "r1", "--since", &v1], &mqtt, None).await;
    let refused = expect(refused, 2, "--since over MQTT");
    assert!(
        refused.stderr.contains("--since needs --http or --grpc"),
        "{}",
        refused.stderr
    );
    env.stop().await;
}
