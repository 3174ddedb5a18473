//! JSON as Dapr clients send it and read it back: `null` where daprd's Go structs take a map,
//! an object or a list is the empty one (the JavaScript SDK sends `"metadata": null` on every
//! transaction); numbers survive exactly (a property test over random doubles and integers past
//! 2^53, through save, get, bulk get, query and SSE); and which malformed inputs fail a whole
//! request (before anything is written) and which only their item, as daprd decides.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;

use crate::support::{Broker, TestEnv, within};

async fn send(c: &reqwest::Client, url: String, body: &str) -> (u16, String) {
    let r = c
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("request");
    (r.status().as_u16(), r.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_is_the_empty_map_object_or_list() {
    let env = TestEnv::start(Broker::Embedded).await;
    let c = reqwest::Client::new();
    let state = format!("{}/v1.0/state/statestore", env.http());
    let cases = [
        // What @dapr/dapr 3.18 sends for a transaction without metadata.
        (
            "/transaction",
            r#"{"operations":[{"operation":"upsert","request":{"key":"t","value":1}}],"metadata":null}"#,
            204,
        ),
        ("/transaction", r#"{"operations":null,"metadata":null}"#, 204),
        ("/transaction", r#"null"#, 204),
        (
            "",
            r#"[{"key":"s","value":2,"etag":null,"metadata":null,"options":null}]"#,
            204,
        ),
        (
            "",
            r#"[{"key":"m","value":3,"metadata":{"ttlInSeconds":null},"options":{"concurrency":null}}]"#,
            204,
        ),
        ("", r#"null"#, 204),
        (
            "/bulk",
            r#"{"keys":["t","s","m"],"metadata":null,"parallelism":null}"#,
            200,
        ),
        ("/bulk", r#"{"keys":null}"#, 200),
        ("/bulk", r#"null"#, 200),
    ];
    for (route, body, want) in cases {
        let (status, text) = send(&c, format!("{state}{route}"), body).await;
        assert_eq!(status, want, "{route} {body}: {text}");
    }
    let (_, bulk) = send(&c, format!("{state}/bulk"), r#"{"keys":["t","s","m"],"metadata":null}"#).await;
    let items: Value = serde_json::from_str(&bulk).unwrap();
    let data: Vec<_> = items.as_array().unwrap().iter().map(|i| i["data"].clone()).collect();
    assert_eq!(data, [json!(1), json!(2), json!(3)]);
    assert!(
        items[2].get("metadata").is_none(),
        "a null ttlInSeconds set no TTL: {items}"
    );
    assert_eq!(send(&c, format!("{state}/bulk"), r#"{"keys":null}"#).await.1, "[]");
    // Still malformed: the wrong kind of value, not null.
    for (route, body) in [
        ("/transaction", r#"{"operations":{}}"#),
        ("", r#"[{"key":"x","metadata":[]}]"#),
    ] {
        assert_eq!(send(&c, format!("{state}{route}"), body).await.0, 400, "{body}");
    }
    env.stop().await;
}

#[derive(Deserialize)]
struct BulkItem {
    key: String,
    data: Box<RawValue>,
}

#[derive(Deserialize)]
struct QueryPage {
    results: Vec<BulkItem>,
}

/// JSON numbers: doubles as their shortest round-trip text, integers past 2^53 and past 2^64,
/// exponents, negative zero, and numbers inside documents.
fn number_text() -> BoxedStrategy<String> {
    prop_oneof![
        any::<f64>().prop_filter_map("finite", |f| f.is_finite().then(|| serde_json::to_string(&f).unwrap())),
        (1u64 << 53..u64::MAX).prop_map(|n| n.to_string()),
        (i64::MIN..-(1i64 << 53)).prop_map(|n| n.to_string()),
        "[1-9][0-9]{20,40}",
        "-?[1-9]\\.[0-9]{17,25}[eE][+-]?[0-9]{1,2}",
        Just("-0".to_owned()),
        Just("-0.0".to_owned()),
        Just("1E+2".to_owned()),
        Just("-1984.5926649180853".to_owned()),
    ]
    .boxed()
}

fn value_text() -> BoxedStrategy<String> {
    let n = number_text();
    prop_oneof![
        3 => n.clone(),
        1 => (n.clone(), n.clone()).prop_map(|(a, b)| format!("[{a},{{\"x\":{b},\"t\":true}},false,null]")),
        1 => n.prop_map(|a| format!("{{\"n\":{a},\"s\":\"{a}\"}}")),
    ]
    .boxed()
}

/// Saves the values in one request and reads each back through every read route: the text is
/// the one sent, digit for digit.
async fn round_trip(c: &reqwest::Client, base: &str, values: &[String]) -> Result<(), String> {
    let state = format!("{base}/v1.0/state/statestore");
    let mut sse = c
        .get(format!("{base}/v1.0-alpha1/state/statestore/subscribe?pattern=num-*"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let items: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{{\"key\":\"num-{i:03}\",\"value\":{v}}}"))
        .collect();
    let (status, text) = send(c, state.clone(), &format!("[{}]", items.join(","))).await;
    if status != 204 {
        return Err(format!("save: {status} {text}"));
    }
    let keys: Vec<String> = (0..values.len()).map(|i| format!("num-{i:03}")).collect();
    for (key, want) in keys.iter().zip(values) {
        let got = c
            .get(format!("{state}/{key}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if &got != want {
            return Err(format!("get {key}: {got} != {want}"));
        }
    }
    let (_, bulk) = send(c, format!("{state}/bulk"), &json!({"keys": keys}).to_string()).await;
    let bulk: Vec<BulkItem> = serde_json::from_str(&bulk).map_err(|e| e.to_string())?;
    for (item, want) in bulk.iter().zip(values) {
        if item.data.get() != want {
            return Err(format!("bulk {}: {} != {want}", item.key, item.data.get()));
        }
    }
    let (_, query) = send(c, format!("{base}/v1.0-alpha1/state/statestore/query"), "{}").await;
    let query: QueryPage = serde_json::from_str(&query).map_err(|e| e.to_string())?;
    for item in &query.results {
        let i: usize = item.key.trim_start_matches("num-").parse().unwrap();
        if item.data.get() != values[i] {
            return Err(format!("query {}: {} != {}", item.key, item.data.get(), values[i]));
        }
    }
    // SSE: every save's event carries the value's text.
    let mut text = String::new();
    let mut seen = 0;
    while seen < values.len() {
        let chunk = within("SSE", sse.chunk()).await.unwrap().expect("open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let ev: BulkItem = serde_json::from_str(data).map_err(|e| e.to_string())?;
            let i: usize = ev.key.trim_start_matches("num-").parse().unwrap();
            if ev.data.get() != values[i] {
                return Err(format!("sse {}: {} != {}", ev.key, ev.data.get(), values[i]));
            }
            seen += 1;
        }
    }
    // The next case starts from an empty store (the query reads every key).
    let ops: Vec<Value> = keys
        .iter()
        .map(|k| json!({"operation": "delete", "request": {"key": k}}))
        .collect();
    let (status, text) = send(
        c,
        format!("{state}/transaction"),
        &json!({"operations": ops}).to_string(),
    )
    .await;
    if status != 204 {
        return Err(format!("clean-up: {status} {text}"));
    }
    Ok(())
}

#[test]
fn numbers_survive_exactly_through_every_read() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let env = rt.block_on(TestEnv::start(Broker::Embedded));
    let base = env.http();
    let c = reqwest::Client::new();
    let config = Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]));
    let result = runner.run(&proptest::collection::vec(value_text(), 1..40), |values| {
        rt.block_on(round_trip(&c, &base, &values)).map_err(TestCaseError::fail)
    });
    rt.block_on(env.stop());
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Malformed requests fail whole where daprd fails them whole (keys: empty or with `||`; a value
/// that cannot be decoded), before anything is written; item-level refusals (an invalid ETag)
/// leave the other items written, as daprd's bulk store operations do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_request_or_per_item_as_daprd() {
    let env = TestEnv::start(Broker::Embedded).await;
    let c = reqwest::Client::new();
    let state = format!("{}/v1.0/state/statestore", env.http());
    let missing = |key: &'static str| {
        let (c, state) = (c.clone(), state.clone());
        async move { c.get(format!("{state}/{key}")).send().await.unwrap().status() == 204 }
    };
    for body in [
        r#"[{"key":"good-1","value":1},{"key":"a||b","value":2}]"#,
        r#"[{"key":"good-1","value":1},{"key":"b64","value":"***","metadata":{"contentEncoding":"base64"}}]"#,
    ] {
        let (status, text) = send(&c, state.clone(), body).await;
        assert_eq!(status, 400, "{body}: {text}");
        assert!(missing("good-1").await, "nothing written: {body}");
    }
    let (status, text) = send(
        &c,
        state.clone(),
        r#"[{"key":"good-2","value":1},{"key":"e","value":2,"etag":"bad"}]"#,
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("ERR_STATE_SAVE"), "{text}");
    assert!(!missing("good-2").await, "an invalid ETag fails only its item");

    let mut d = rpb::dapr_client::DaprClient::connect(env.grpc()).await.unwrap();
    let item = |key: &str| common::StateItem {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    let save = rpb::SaveStateRequest {
        store_name: "statestore".into(),
        states: vec![item("grpc-good"), item("x||y")],
    };
    let status = within("SaveState", d.save_state(save)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(missing("grpc-good").await);
    let saved = rpb::SaveStateRequest {
        store_name: "statestore".into(),
        states: vec![item("grpc-good")],
    };
    within("SaveState", d.save_state(saved)).await.unwrap();
    let del = rpb::DeleteBulkStateRequest {
        store_name: "statestore".into(),
        states: vec![item("grpc-good"), item("")],
    };
    let status = within("DeleteBulkState", d.delete_bulk_state(del)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        !missing("grpc-good").await,
        "a bad key in a bulk delete deletes nothing"
    );
    env.stop().await;
}
