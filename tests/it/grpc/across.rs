//! Watch across doors: MQTT, HTTP and Dapr writes seen by one Watch.

use super::*;

/// A Watch stream sees changes made over MQTT, over HTTP and over the Dapr gRPC API, with the
/// versions those writers were told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_mqtt_http_and_dapr_writes() {
    use npb::watch_event::Kind;
    let env = TestEnv::start(Broker::Embedded).await;
    let (mut n, mut d) = clients(&env).await;
    let http = reqwest::Client::new();
    let base = format!("{}/v1.0/state/{STORE}", env.http());
    let mut mqtt = RawClient::connect(env.broker_port, &unique_id("grpc-x")).await;
    let mut w = watch(&mut n, &[], &["x-*"]).await;

    // MQTT SET and DEL.
    let r = mqtt
        .request(&[b"SET", b"x-mqtt", b"\xffraw"], &[("__ts", &now_ts())])
        .await;
    assert_eq!(&r.payload[..], b"+OK\r\n");
    let v = prop(&r, "__ts").expect("__ts").to_owned();
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-mqtt", Kind::Set, b"\xffraw");
    assert_eq!(e.version, v);
    // A write outside the pattern is not delivered: the next event is the one after it.
    native_set(&mut n, set_req(b"y-skip", b"s")).await;
    let r = mqtt.request(&[b"DEL", b"x-mqtt"], &[("__ts", &now_ts())]).await;
    assert_eq!(&r.payload[..], b":1\r\n");
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-mqtt", Kind::Delete, b"");
    if let Some(ts) = prop(&r, "__ts") {
        assert_eq!(e.version, ts, "DEL's __ts is the deletion's version");
    }
    assert!(hlc(&e.version) > hlc(&v));

    // HTTP save and delete.
    let resp = http
        .post(&base)
        .json(&serde_json::json!([{"key": "x-http", "value": {"n": 1}}]))
        .send()
        .await
        .expect("HTTP save");
    assert_eq!(resp.status(), reqwest::StatusCode::NO_CONTENT);
    let etag = http
        .get(format!("{base}/x-http"))
        .send()
        .await
        .expect("HTTP get")
        .headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-http", Kind::Set, br#"{"n":1}"#);
    assert_eq!(e.version, etag);
    let resp = http
        .delete(format!("{base}/x-http"))
        .header("If-Match", &etag)
        .send()
        .await
        .expect("HTTP delete");
    assert_eq!(resp.status(), reqwest::StatusCode::NO_CONTENT);
    let e = next_event(&mut w).await;
    assert_event(&e, b"x-http", Kind::Delete, b"");
    assert!(hlc(&e.version) > hlc(&etag));

    // Dapr gRPC: a transaction's changes arrive in order; a key it sets and deletes while
    // absent before is left as it was, and nobody hears of it.
    within(
        "ExecuteStateTransaction",
        d.execute_state_transaction(tx_req(vec![
            upsert("x-t0", b"0"),
            upsert("x-t1", b"1"),
            upsert("x-t2", b"2"),
            delete_op("x-t1"),
            delete_op("x-t0"),
        ])),
    )
    .await
    .expect("transaction");
    let t2 = get_state(&mut d, "x-t2").await.etag;
    let e2 = next_event(&mut w).await;
    assert_event(&e2, b"x-t2", Kind::Set, b"2");
    assert_eq!(e2.version, t2);
    // A key that existed before: its set and its delete both arrive, in order.
    d.save_state(save_req(vec![item("x-t3", b"old")]))
        .await
        .expect("save x-t3");
    let before = next_event(&mut w).await;
    assert_event(&before, b"x-t3", Kind::Set, b"old");
    within(
        "ExecuteStateTransaction",
        d.execute_state_transaction(tx_req(vec![upsert("x-t3", b"3"), delete_op("x-t3")])),
    )
    .await
    .expect("transaction");
    let e3 = next_event(&mut w).await;
    assert_event(&e3, b"x-t3", Kind::Set, b"3");
    let e4 = next_event(&mut w).await;
    assert_event(&e4, b"x-t3", Kind::Delete, b"");
    assert!(hlc(&e4.version) > hlc(&e3.version));
    env.stop().await;
}
