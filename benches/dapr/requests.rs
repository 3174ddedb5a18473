//! The application's requests, the same for every target: Dapr's runtime gRPC API
//! (GetState, SaveState, ExecuteStateTransaction) on the store `statestore`, 16-byte keys
//! with 100-byte values; or, to take a pluggable component's share apart, the same calls as
//! daprd makes them to the component (Get, Set, Transact) on its Unix socket. A request counts
//! as served only if it succeeded (and a GET found its value), so a path that fails fast cannot
//! look fast.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::components::v1 as cpb;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use tonic::transport::Channel;

pub type Runtime = rpb::dapr_client::DaprClient<Channel>;

#[derive(Clone)]
pub enum Client {
    /// Dapr's runtime API: daprd's, or stategate's own door.
    Runtime(Runtime),
    /// A pluggable component's socket, called as daprd calls it.
    Component(cpb::state_store_client::StateStoreClient<Channel>, Transactions),
}

type Transactions = cpb::transactional_state_store_client::TransactionalStateStoreClient<Channel>;

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

async fn channel(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("a gRPC url")
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// `http://host:port` for the runtime API, `unix:///path` for a component socket.
pub async fn connect(url: &str) -> Client {
    let ch = channel(url).await;
    if url.starts_with("unix:") {
        Client::Component(
            cpb::state_store_client::StateStoreClient::new(ch.clone()),
            Transactions::new(ch),
        )
    } else {
        Client::Runtime(Runtime::new(ch))
    }
}

fn set_request(key: String) -> cpb::SetRequest {
    cpb::SetRequest {
        key,
        value: vec![b'v'; VALUE_LEN],
        ..Default::default()
    }
}

/// `op` as daprd sends it to a component (it has already added its key prefix; here none).
async fn component_call(
    mut c: cpb::state_store_client::StateStoreClient<Channel>,
    mut tx: Transactions,
    op: Op,
    i: u64,
) -> bool {
    use cpb::transactional_state_operation::Request as TxOp;
    match op {
        Op::Get => c
            .get(cpb::GetRequest {
                key: key(i),
                ..Default::default()
            })
            .await
            .is_ok_and(|r| r.get_ref().data.len() == VALUE_LEN),
        Op::Set => c.set(set_request(key(i))).await.is_ok(),
        Op::Tx => tx
            .transact(cpb::TransactionalStateRequest {
                operations: (0..TX_OPS)
                    .map(|j| cpb::TransactionalStateOperation {
                        request: Some(TxOp::Set(set_request(key(i * TX_OPS + j)))),
                    })
                    .collect(),
                metadata: HashMap::new(),
            })
            .await
            .is_ok(),
    }
}

/// The request `op` makes for its `i`th call, as a future of "served".
pub fn request(
    c: &Client,
    op: Op,
) -> impl Fn(u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync + 'static {
    let c = c.clone();
    move |i| {
        let mut c = match &c {
            Client::Runtime(c) => c.clone(),
            Client::Component(s, t) => return Box::pin(component_call(s.clone(), t.clone(), op, i)),
        };
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
    let mut c = match c {
        Client::Runtime(c) => c.clone(),
        Client::Component(c, _) => {
            let mut c = c.clone();
            for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
                c.bulk_set(cpb::BulkSetRequest {
                    items: chunk.iter().map(|&i| set_request(key(i))).collect(),
                    options: None,
                })
                .await
                .unwrap_or_else(|e| panic!("seeding failed: {e}"));
            }
            return;
        }
    };
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
        c.save_state(rpb::SaveStateRequest {
            store_name: STORE.into(),
            states: chunk.iter().map(|&i| item(key(i))).collect(),
        })
        .await
        .unwrap_or_else(|e| panic!("seeding failed: {e}"));
    }
}

async fn get(c: &Runtime, store: &str, key: &str) -> Vec<u8> {
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

/// A write read back through `c` (unless `keeps` is false: the bare component answers a
/// constant); and when `c` is a daprd in front of stategate, read from stategate's own door
/// through `behind`'s store, whose key prefix is daprd's (`<app id>||`), which proves the
/// requests measured really reach stategate and not some other store.
pub async fn check(label: &str, c: &Client, keeps: bool, behind: Option<(&Runtime, &str)>) {
    // A component socket is checked by seeding it (each seed request must succeed).
    let Client::Runtime(c) = c else { return };
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
    let read = get(c, STORE, "bench-check").await;
    if keeps {
        assert_eq!(read, value, "{label}: read back");
    }
    if let Some((direct, store)) = behind {
        let stored = get(direct, store, "bench-check").await;
        assert_eq!(stored, value, "{label}: the key is not in stategate");
    }
}
