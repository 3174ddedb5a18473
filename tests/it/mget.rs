//! MGET over MQTT (a stategate extension) never shows half of a transaction: a writer moves
//! units between two keys in Dapr transactions over HTTP (their sum stays 100) while an MQTT
//! client reads both with MGET as fast as it can; every answer sums to 100. On memory, on
//! durable storage, and on three replicas sharing one Redis (where the MGET is served by any
//! replica while the transactions go through another).

use crate::support::{Broker, RawClient, Storage, TestEnv, unique_id};

async fn mget_never_sees_half_a_transaction_on(broker: Broker, storage: Storage) {
    let env = TestEnv::start_on(broker, storage, |_| {}).await;
    let url = format!("{}/v1.0/state/statestore", env.http());
    let http = reqwest::Client::new();
    let upserts = |x: i64| {
        serde_json::json!({"operations": [
            {"operation": "upsert", "request": {"key": "x", "value": x}},
            {"operation": "upsert", "request": {"key": "y", "value": 100 - x}},
        ]})
    };
    let status = http
        .post(format!("{url}/transaction"))
        .json(&upserts(50))
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "{status}");
    let writer = tokio::spawn(async move {
        for i in 0..150i64 {
            let r = http
                .post(format!("{url}/transaction"))
                .json(&upserts(i % 100))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.status());
        }
    });
    let mut client = RawClient::connect(env.broker_port, &unique_id("mget")).await;
    let mut reads = 0u32;
    while !writer.is_finished() || reads < 10 {
        let answer = client.request(&[b"MGET", b"x", b"y"], &[]).await;
        let frame = stategate::resp3::decode(&answer.payload).expect("an RESP3 answer");
        let stategate::resp3::Frame::Array(items) = frame else {
            panic!("MGET answers an array: {frame:?}");
        };
        let mut sum = 0i64;
        for item in items {
            let stategate::resp3::Frame::Array(pair) = item else {
                panic!("both keys exist: {item:?}");
            };
            let stategate::resp3::Frame::Bulk(value) = &pair[0] else {
                panic!("a value first: {pair:?}");
            };
            sum += std::str::from_utf8(value).unwrap().parse::<i64>().unwrap();
        }
        assert_eq!(sum, 100, "a torn read after {reads} reads");
        reads += 1;
    }
    writer.await.unwrap();
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mget_never_sees_half_a_transaction_on_memory() {
    mget_never_sees_half_a_transaction_on(Broker::Embedded, Storage::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mget_never_sees_half_a_transaction_on_durable_storage() {
    mget_never_sees_half_a_transaction_on(Broker::Embedded, Storage::Durable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mget_never_sees_half_a_transaction_on_redis_replicas() {
    mget_never_sees_half_a_transaction_on(Broker::RedisReplicas, Storage::Memory).await;
}
