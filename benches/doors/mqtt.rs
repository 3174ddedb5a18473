//! `--only mqtt`: QoS 1 request/response through stategate next to an echo responder on the
//! same broker, on each way of serving.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use stategate::config::{BrokerChoice, Config};
use stategate::storage::Store;

use super::load::{Load, Op, alternate, at_rest, op, print_against_first, print_at_rest};
use super::mqtt_client::{ECHO_TOPIC, Requester, bench_key, echo_responder, mirror_subscriber, now_ts};
use super::{Opts, serving};

/// One way of serving MQTT requests, with an echo responder on the same broker.
struct MqttTarget {
    label: &'static str,
    running: stategate::Running,
    req: Requester,
    /// Messages the `state/#` subscriber received (mirrored target only).
    mirrored: Option<Arc<std::sync::atomic::AtomicU64>>,
}

/// Starts stategate on `broker` with the echo responder and a load client beside it, and fills
/// the GET keys.
async fn mqtt_target(label: &'static str, broker: BrokerChoice, n: usize, mirrored: bool) -> MqttTarget {
    let mut config = Config {
        http_listen: None,
        grpc_listen: None,
        broker,
        ..Config::default()
    };
    if mirrored {
        config.mqtt.state_topics = Some(stategate::mqtt::mirror::StateTopics {
            prefix: "state/".into(),
            set_by_publish: false,
            external_broker: false,
        });
    }
    config.mqtt.client_id = format!("stategate-bench-{n}");
    if std::env::var_os("BENCH_CLEAN_SESSION").is_some() {
        config.mqtt.session_expiry = Duration::ZERO;
    }
    let running = serving(stategate::start(config, Store::memory()))
        .await
        .expect("stategate starts");
    let (host, port) = {
        let (h, p) = running.mqtt_broker();
        (h.to_owned(), p)
    };
    println!("{label}: broker {host}:{port}");
    echo_responder(&host, port, n).await;
    let mirrored = match mirrored {
        true => Some(mirror_subscriber(&host, port, n).await),
        false => None,
    };
    let value = vec![b'v'; 100];
    let setup = Requester::connect(&format!("bench-setup-{n}"), &host, port).await;
    for i in 0..10_000u64 {
        let payload = stategate::resp3::encode_request([&b"SET"[..], &bench_key(i), &value]);
        setup
            .request(
                stategate::mqtt::INVOKE_TOPIC,
                i,
                payload,
                vec![("__ts".into(), now_ts())],
            )
            .await;
    }
    let req = Requester::connect(&format!("bench-load-{n}"), &host, port).await;
    MqttTarget {
        label,
        running,
        req,
        mirrored,
    }
}

pub(crate) async fn run(o: &Opts) {
    println!(
        "\n== MQTT: QoS 1 request/response, 16-byte keys, 100-byte values, {} s per row",
        o.secs
    );
    let mut targets = Vec::new();
    match &o.mqtt_url {
        Some(url) => {
            let a = stategate::config::ServeArgs {
                mqtt_url: Some(url.clone()),
                ..Default::default()
            };
            let broker = Config::from_args(a).expect("--mqtt-url").broker;
            targets.push(mqtt_target("client   ", broker, 0, false).await);
            println!("(the broker is another process: the serving CPU below leaves it out)");
        }
        None => {
            let paths = [
                ("in-broker", "inbroker", false, false),
                ("client   ", "client", true, false),
                ("mirrored ", "mirrored", false, true),
            ];
            for (n, (label, wanted, client_path, mirrored)) in paths.into_iter().enumerate() {
                if !o.paths.iter().any(|p| p == wanted) {
                    continue;
                }
                let broker = BrokerChoice::Embedded {
                    listen: "127.0.0.1:0".parse().expect("addr"),
                    client_path,
                };
                targets.push(mqtt_target(label, broker, n, mirrored).await);
            }
        }
    }
    print_at_rest(at_rest().await);
    let value = Bytes::from(vec![b'v'; 100]);
    let seq = Arc::new(AtomicU64::new(1 << 40));
    let loads = std::iter::once(Load::Rate(1000)).chain(o.inflight.iter().map(|&n| Load::Inflight(n)));
    for load in loads {
        for verb in ["GET", "SET"].into_iter().filter(|v| o.verbs.iter().any(|w| w == v)) {
            // Every target's echo and stategate, alternating round by round.
            let names: Vec<(String, String)> = targets
                .iter()
                .map(|t| (format!("echo      {verb}"), format!("{} {verb}", t.label)))
                .collect();
            let mut rows = Vec::new();
            for (t, (echo, sg)) in targets.iter().zip(&names) {
                for (topic, name) in [(ECHO_TOPIC, echo), (stategate::mqtt::INVOKE_TOPIC, sg)] {
                    rows.push((name.as_str(), request(&t.req, topic, verb, &value, &seq)));
                }
            }
            let measured = alternate(o, load, &rows).await;
            for pair in measured.chunks(2) {
                print_against_first(pair);
            }
        }
    }
    for t in targets {
        if let Some(n) = &t.mirrored {
            let n = n.load(std::sync::atomic::Ordering::Relaxed);
            println!(
                "{}: the state/# subscriber received {n} mirror messages",
                t.label.trim()
            );
        }
        serving(t.running.shutdown()).await;
    }
}

/// One request of `verb` to `topic`, each with its own correlation id.
fn request(r: &Requester, topic: &'static str, verb: &'static str, value: &Bytes, seq: &Arc<AtomicU64>) -> Op {
    let (r, value, seq) = (r.clone(), value.clone(), seq.clone());
    op(move |i| {
        let key = bench_key(i);
        let (payload, user) = if verb == "GET" {
            (stategate::resp3::encode_request([&b"GET"[..], &key]), vec![])
        } else {
            let p = stategate::resp3::encode_request([&b"SET"[..], &key, &value]);
            (p, vec![("__ts".into(), now_ts())])
        };
        let (r, id) = (r.clone(), seq.fetch_add(1, Ordering::Relaxed));
        async move { r.request(topic, id, payload, user).await }
    })
}
