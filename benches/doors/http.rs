//! `--only http`: the Dapr state API over HTTP next to a bare axum handler.

use std::sync::Arc;

use bytes::Bytes;
use stategate::config::{BrokerChoice, Config};
use stategate::storage::Store;

use super::load::{Load, alternate, at_rest, op, print_against_first, print_at_rest};
use super::{Opts, serving};

pub(crate) async fn run(o: &Opts) {
    println!(
        "\n== HTTP: Dapr state API, 16 connections at saturation, {} s per row",
        o.secs
    );
    let mut config = Config {
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        grpc_listen: None,
        broker: BrokerChoice::Embedded {
            listen: "127.0.0.1:0".parse().expect("addr"),
            client_path: false,
        },
        ..Config::default()
    };
    config.mqtt.client_id = "stategate-bench-http".into();
    let running = serving(stategate::start(config, Store::memory()))
        .await
        .expect("stategate starts");
    let base = format!("http://{}", running.http_addr().expect("http"));

    // The baseline: a bare axum handler returning a constant body.
    let bare_addr = serving(async {
        let bare = axum::Router::new().route(
            "/get",
            axum::routing::get(|| async { ([("content-type", "application/json")], "\"constant-value\"") }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, bare).await });
        addr
    })
    .await;

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    let value = serde_json::json!("v".repeat(100));
    let body = serde_json::to_vec(&serde_json::json!([{"key": "key-000000000001", "value": value}])).expect("json");
    client
        .post(format!("{base}/v1.0/state/statestore"))
        .body(body.clone())
        .send()
        .await
        .expect("seed");

    let get_url: Arc<str> = Arc::from(format!("{base}/v1.0/state/statestore/key-000000000001"));
    let bare_url: Arc<str> = Arc::from(format!("http://{bare_addr}/get"));
    let save_url: Arc<str> = Arc::from(format!("{base}/v1.0/state/statestore"));
    let body = Bytes::from(body);
    let get = |u: &Arc<str>| {
        let (c, u) = (client.clone(), u.clone());
        op(move |_i: u64| {
            let (c, u) = (c.clone(), u.clone());
            async move {
                if let Ok(r) = c.get(&*u).send().await {
                    let _ = r.bytes().await;
                }
            }
        })
    };
    let save = |u: &Arc<str>, b: &Bytes| {
        let (c, u, b) = (client.clone(), u.clone(), b.clone());
        op(move |_i: u64| {
            let (c, u, b) = (c.clone(), u.clone(), b.clone());
            async move {
                if let Ok(r) = c.post(&*u).body(b).send().await {
                    let _ = r.bytes().await;
                }
            }
        })
    };
    print_at_rest(at_rest().await);
    for load in [Load::Rate(1000), Load::Inflight(16)] {
        let rows = [
            ("bare axum GET", get(&bare_url)),
            ("stategate GET", get(&get_url)),
            ("stategate SAVE", save(&save_url, &body)),
        ];
        print_against_first(&alternate(o, load, &rows).await);
    }
    println!("(Dapr sidecar published: HTTP GET p50 0.73 ms, p90 1.60 ms, p99 1.97 ms at 1,000/s)");
    serving(running.shutdown()).await;
}
