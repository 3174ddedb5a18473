//! `--only http`: the Dapr state API over HTTP next to a bare axum handler.

use std::sync::Arc;

use bytes::Bytes;
use stategate::config::{BrokerChoice, Config};
use stategate::storage::Store;

use super::Opts;
use super::load::{closed_loop, fixed_rate};

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
    let running = stategate::start(config, Store::memory())
        .await
        .expect("stategate starts");
    let base = format!("http://{}", running.http_addr().expect("http"));

    // The baseline: a bare axum handler returning a constant body.
    let bare = axum::Router::new().route(
        "/get",
        axum::routing::get(|| async { ([("content-type", "application/json")], "\"constant-value\"") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let bare_addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, bare).await });

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
    let get = |c: reqwest::Client, u: Arc<str>| {
        move |_i: u64| {
            let (c, u) = (c.clone(), u.clone());
            async move {
                if let Ok(r) = c.get(&*u).send().await {
                    let _ = r.bytes().await;
                }
            }
        }
    };
    let save = |c: reqwest::Client, u: Arc<str>, b: Bytes| {
        move |_i: u64| {
            let (c, u, b) = (c.clone(), u.clone(), b.clone());
            async move {
                if let Ok(r) = c.post(&*u).body(b).send().await {
                    let _ = r.bytes().await;
                }
            }
        }
    };
    let bare_fixed = fixed_rate(
        "bare axum GET @1000/s".into(),
        1000,
        o,
        get(client.clone(), bare_url.clone()),
    )
    .await;
    let get_fixed = fixed_rate(
        "stategate GET @1000/s".into(),
        1000,
        o,
        get(client.clone(), get_url.clone()),
    )
    .await;
    let save_fixed = fixed_rate(
        "stategate SAVE @1000/s".into(),
        1000,
        o,
        save(client.clone(), save_url.clone(), body.clone()),
    )
    .await;
    bare_fixed.print(None);
    get_fixed.print(Some(&bare_fixed));
    save_fixed.print(Some(&bare_fixed));
    let bare_sat = closed_loop("bare axum GET x16".into(), 16, o, get(client.clone(), bare_url)).await;
    let get_sat = closed_loop("stategate GET x16".into(), 16, o, get(client.clone(), get_url)).await;
    let save_sat = closed_loop("stategate SAVE x16".into(), 16, o, save(client.clone(), save_url, body)).await;
    bare_sat.print(None);
    get_sat.print(Some(&bare_sat));
    save_sat.print(Some(&bare_sat));
    println!("(Dapr sidecar published: HTTP GET p50 0.73 ms, p90 1.60 ms, p99 1.97 ms at 1,000/s)");
    running.shutdown().await;
}
