//! `--only component`: the Dapr pluggable state component on its Unix socket, called as daprd
//! calls it (Get, Set), next to a component that answers constants. The requests and the bare
//! component are the dapr benchmark's own (`benches/dapr/`), so both benchmarks measure the
//! same calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use stategate::config::{BrokerChoice, Config};
use stategate::storage::Store;

use super::load::{Load, Op, alternate, at_rest, op, print_against_first, print_at_rest};
use super::{Opts, serving};

#[path = "../dapr/bare.rs"]
mod bare;
// Transactions and the checks through daprd are the dapr benchmark's alone.
#[allow(dead_code)]
#[path = "../dapr/requests.rs"]
mod requests;

use requests::Client;

/// `op` as daprd sends it, counting the calls that failed (a failed call is fast, so it must
/// not pass unseen for a served one).
fn call(c: &Client, kind: requests::Op, failed: &Arc<AtomicU64>) -> Op {
    let (request, failed) = (requests::request(c, kind), failed.clone());
    op(move |i| {
        let (served, failed) = (request(i), failed.clone());
        async move {
            if !served.await {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

pub(crate) async fn run(o: &Opts) {
    println!(
        "\n== Dapr component socket: Get and Set as daprd sends them, 16 in flight at saturation, {} s per row",
        o.secs
    );
    let sockets = tempfile::tempdir().expect("tempdir");
    let (sg_path, bare_path) = (sockets.path().join("stategate.sock"), sockets.path().join("bare.sock"));
    let mut config = Config {
        http_listen: None,
        grpc_listen: None,
        // An MQTT broker cannot be turned off; this one is idle.
        broker: BrokerChoice::Embedded {
            listen: "127.0.0.1:0".parse().expect("addr"),
            client_path: false,
        },
        dapr_component_socket: Some(sg_path.clone()),
        ..Config::default()
    };
    config.mqtt.client_id = "stategate-bench-component".into();
    let running = serving(stategate::start(config, Store::memory()))
        .await
        .expect("stategate starts");
    let bare_socket = bare_path.clone();
    serving(async move { bare::serve(&bare_socket) }).await;
    let url = |p: &std::path::Path| format!("unix://{}", p.display());
    let (sg, bare) = (
        requests::connect(&url(&sg_path)).await,
        requests::connect(&url(&bare_path)).await,
    );
    // Every seeding call must succeed: this is the check that both sockets serve.
    requests::seed(&sg).await;
    requests::seed(&bare).await;
    print_at_rest(at_rest().await);
    let failed = Arc::new(AtomicU64::new(0));
    for load in [Load::Rate(1000), Load::Inflight(16)] {
        for (verb, kind) in [("Get", requests::Op::Get), ("Set", requests::Op::Set)] {
            let (b, s) = (format!("bare component {verb}"), format!("stategate {verb}"));
            let rows = [
                (b.as_str(), call(&bare, kind, &failed)),
                (s.as_str(), call(&sg, kind, &failed)),
            ];
            print_against_first(&alternate(o, load, &rows).await);
        }
    }
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        println!("({failed} calls failed: the rows above count them as served)");
    }
    serving(running.shutdown()).await;
}
