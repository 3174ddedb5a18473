//! The application's requests, the same for every target: Dapr's runtime gRPC API
//! (GetState, SaveState, ExecuteStateTransaction) on the store `statestore`, 16-byte keys
//! with 100-byte values. A request counts as served only if it succeeded (and a GET found
//! its value), so a path that fails fast cannot look fast.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use tonic::transport::Channel;

pub type Client = rpb::dapr_client::DaprClient<Channel>;

/// The store name both component files use and stategate's own door serves by default.
pub const STORE: &str = "statestore";
/// GET reads, SET and transactions write, these many keys (seeded first).
pub const KEYS: u64 = 10_000;
pub const VALUE_LEN: usize = 100;
/// Upserts in one transaction.
pub const TX_OPS: u64 = 5;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    Get,
    Set,
    Tx,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "GET",
            Op::Set => "SET",
            Op::Tx => "TX5",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        match s.to_uppercase().as_str() {
            "GET" => Some(Op::Get),
            "SET" => Some(Op::Set),
            "TX" | "TX5" => Some(Op::Tx),
            _ => None,
        }
    }
}

pub fn key(i: u64) -> String {
    format!("key-{:012}", i % KEYS)
}

fn item(key: String) -> common::StateItem {
    common::StateItem {
        key,
        value: vec![b'v'; VALUE_LEN],
        ..Default::default()
    }
}

pub async fn connect(url: String) -> Client {
    let ch = tonic::transport::Endpoint::from_shared(url.clone())
        .expect("a gRPC url")
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    Client::new(ch)
}

/// The request `op` makes for its `i`th call, as a future of "served".
pub fn request(
    c: &Client,
    op: Op,
) -> impl Fn(u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync + 'static {
    let c = c.clone();
    move |i| {
        let mut c = c.clone();
        Box::pin(async move {
            match op {
                Op::Get => c
                    .get_state(rpb::GetStateRequest {
                        store_name: STORE.into(),
                        key: key(i),
                        ..Default::default()
                    })
                    .await
                    .is_ok_and(|r| r.get_ref().data.len() == VALUE_LEN),
                Op::Set => c
                    .save_state(rpb::SaveStateRequest {
                        store_name: STORE.into(),
                        states: vec![item(key(i))],
                    })
                    .await
                    .is_ok(),
                Op::Tx => c
                    .execute_state_transaction(rpb::ExecuteStateTransactionRequest {
                        store_name: STORE.into(),
                        operations: (0..TX_OPS)
                            .map(|j| rpb::TransactionalStateOperation {
                                operation_type: "upsert".into(),
                                request: Some(item(key(i * TX_OPS + j))),
                            })
                            .collect(),
                        metadata: HashMap::new(),
                    })
                    .await
                    .is_ok(),
            }
        })
    }
}

/// Writes every key GET reads, 100 per request.
pub async fn seed(c: &Client) {
    let mut c = c.clone();
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
        c.save_state(rpb::SaveStateRequest {
            store_name: STORE.into(),
            states: chunk.iter().map(|&i| item(key(i))).collect(),
        })
        .await
        .unwrap_or_else(|e| panic!("seeding failed: {e}"));
    }
}

async fn get(c: &Client, store: &str, key: &str) -> Vec<u8> {
    c.clone()
        .get_state(rpb::GetStateRequest {
            store_name: store.into(),
            key: key.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("GetState {key}: {e}"))
        .into_inner()
        .data
}

/// A write read back through `c`; and when `c` is a daprd in front of stategate, read from
/// stategate's own door through `behind`'s store, whose key prefix is daprd's (`<app id>||`),
/// which proves the requests measured really reach stategate and not some other store.
pub async fn check(label: &str, c: &Client, behind: Option<(&Client, &str)>) {
    let value = format!("checked through {label}").into_bytes();
    c.clone()
        .save_state(rpb::SaveStateRequest {
            store_name: STORE.into(),
            states: vec![common::StateItem {
                key: "bench-check".into(),
                value: value.clone(),
                ..Default::default()
            }],
        })
        .await
        .unwrap_or_else(|e| panic!("{label}: SaveState: {e}"));
    assert_eq!(get(c, STORE, "bench-check").await, value, "{label}: read back");
    if let Some((direct, store)) = behind {
        let stored = get(direct, store, "bench-check").await;
        assert_eq!(stored, value, "{label}: the key is not in stategate");
    }
}
