//! The floor behind daprd for actors and workflows: a pluggable state component that keeps its
//! state in a `HashMap` under one mutex and does nothing else a store does (no durability, no
//! history, no TTL, no limits, no metrics, no spans). A component answering constants cannot
//! stand in here, because daprd reads back an actor's state and a workflow's history to take the
//! next step; this one is the least a correct component does. ETags (a counter per write) and
//! all-or-nothing transactions are kept, so that daprd gets the answers it relies on.
//!
//! Behind daprd it shows what daprd, the scheduler and the component socket cost with a store
//! that costs next to nothing: where stategate's row equals it, the store is not the limit.
//!
//! It runs as a process of its own (the bench re-runs itself with `--serve-floor SOCKET`), so
//! its CPU time is counted as the other stores' is.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use stategate::grpc::pb::DESCRIPTOR_SET;
use stategate::grpc::pb::dapr::proto::components::v1 as cpb;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

type Answer<T> = Result<Response<T>, Status>;

struct Item {
    data: Vec<u8>,
    version: u64,
}

#[derive(Default)]
struct Items {
    map: HashMap<String, Item>,
    /// The last version handed out; versions are the ETags.
    last: u64,
}

/// A write checked and ready to apply.
enum Write {
    Set(String, Vec<u8>),
    Delete(String),
}

impl Items {
    /// The ETag rule of Dapr's state API: a non-empty ETag must name the key's current version;
    /// without one, a first-write set fails on an existing key.
    fn check(&self, key: &str, etag: Option<&cpb::Etag>, first_write: bool) -> Result<(), Status> {
        let current = self.map.get(key).map(|i| i.version);
        match etag.map(|e| e.value.as_str()).filter(|v| !v.is_empty()) {
            Some(v) => {
                let want: u64 = v
                    .parse()
                    .map_err(|_| Status::invalid_argument(format!("etag {v:?} is not one of this store's")))?;
                if current == Some(want) {
                    Ok(())
                } else {
                    Err(Status::failed_precondition(format!("etag mismatch for key {key:?}")))
                }
            }
            None if first_write && current.is_some() => {
                Err(Status::failed_precondition(format!("first-write: key {key:?} exists")))
            }
            None => Ok(()),
        }
    }

    fn set(&self, r: cpb::SetRequest) -> Result<Write, Status> {
        let first_write = r
            .options
            .as_ref()
            .is_some_and(|o| o.concurrency == cpb::state_options::StateConcurrency::ConcurrencyFirstWrite as i32);
        self.check(&r.key, r.etag.as_ref(), first_write)?;
        Ok(Write::Set(r.key, r.value))
    }

    fn delete(&self, r: cpb::DeleteRequest) -> Result<Write, Status> {
        self.check(&r.key, r.etag.as_ref(), false)?;
        Ok(Write::Delete(r.key))
    }

    /// Applies `w` and returns what it replaced, for an undo.
    fn apply(&mut self, w: Write) -> (String, Option<Item>) {
        match w {
            Write::Set(key, data) => {
                self.last += 1;
                let old = self.map.insert(
                    key.clone(),
                    Item {
                        data,
                        version: self.last,
                    },
                );
                (key, old)
            }
            Write::Delete(key) => {
                let old = self.map.remove(&key);
                (key, old)
            }
        }
    }

    fn get(&self, key: &str) -> Option<(Vec<u8>, cpb::Etag)> {
        self.map.get(key).map(|i| {
            (
                i.data.clone(),
                cpb::Etag {
                    value: i.version.to_string(),
                },
            )
        })
    }
}

#[derive(Clone, Default)]
pub struct Floor(Arc<Mutex<Items>>);

impl Floor {
    fn items(&self) -> MutexGuard<'_, Items> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[tonic::async_trait]
impl cpb::state_store_server::StateStore for Floor {
    async fn init(&self, _r: Request<cpb::InitRequest>) -> Answer<cpb::InitResponse> {
        Ok(Response::new(cpb::InitResponse {}))
    }
    async fn features(&self, _r: Request<cpb::FeaturesRequest>) -> Answer<cpb::FeaturesResponse> {
        // What daprd needs for an actor state store.
        let features = ["ETAG", "TRANSACTIONAL"].map(String::from).to_vec();
        Ok(Response::new(cpb::FeaturesResponse { features }))
    }
    async fn delete(&self, r: Request<cpb::DeleteRequest>) -> Answer<cpb::DeleteResponse> {
        let mut items = self.items();
        let w = items.delete(r.into_inner())?;
        items.apply(w);
        Ok(Response::new(cpb::DeleteResponse {}))
    }
    async fn get(&self, r: Request<cpb::GetRequest>) -> Answer<cpb::GetResponse> {
        let found = self.items().get(&r.get_ref().key);
        let (data, etag) = found.map_or((Vec::new(), None), |(d, e)| (d, Some(e)));
        Ok(Response::new(cpb::GetResponse {
            data,
            etag,
            ..Default::default()
        }))
    }
    async fn set(&self, r: Request<cpb::SetRequest>) -> Answer<cpb::SetResponse> {
        let mut items = self.items();
        let w = items.set(r.into_inner())?;
        items.apply(w);
        Ok(Response::new(cpb::SetResponse {}))
    }
    async fn ping(&self, _r: Request<cpb::PingRequest>) -> Answer<cpb::PingResponse> {
        Ok(Response::new(cpb::PingResponse {}))
    }
    async fn bulk_delete(&self, r: Request<cpb::BulkDeleteRequest>) -> Answer<cpb::BulkDeleteResponse> {
        let mut items = self.items();
        for d in r.into_inner().items {
            let w = items.delete(d)?;
            items.apply(w);
        }
        Ok(Response::new(cpb::BulkDeleteResponse {}))
    }
    async fn bulk_get(&self, r: Request<cpb::BulkGetRequest>) -> Answer<cpb::BulkGetResponse> {
        let items = self.items();
        let items = r
            .into_inner()
            .items
            .into_iter()
            .map(|g| {
                let (data, etag) = items.get(&g.key).map_or((Vec::new(), None), |(d, e)| (d, Some(e)));
                cpb::BulkStateItem {
                    key: g.key,
                    data,
                    etag,
                    ..Default::default()
                }
            })
            .collect();
        Ok(Response::new(cpb::BulkGetResponse { items }))
    }
    async fn bulk_set(&self, r: Request<cpb::BulkSetRequest>) -> Answer<cpb::BulkSetResponse> {
        let mut items = self.items();
        for s in r.into_inner().items {
            let w = items.set(s)?;
            items.apply(w);
        }
        Ok(Response::new(cpb::BulkSetResponse {}))
    }
}

#[tonic::async_trait]
impl cpb::transactional_state_store_server::TransactionalStateStore for Floor {
    /// All or nothing: each operation is checked against the state the earlier ones left, and
    /// a refused one undoes those already applied.
    async fn transact(&self, r: Request<cpb::TransactionalStateRequest>) -> Answer<cpb::TransactionalStateResponse> {
        use cpb::transactional_state_operation::Request as Op;
        let mut items = self.items();
        let mut undo = Vec::new();
        for op in r.into_inner().operations {
            let checked = match op.request {
                Some(Op::Set(s)) => items.set(s),
                Some(Op::Delete(d)) => items.delete(d),
                None => Err(Status::invalid_argument("a transaction operation has no request")),
            };
            match checked {
                Ok(w) => undo.push(items.apply(w)),
                Err(e) => {
                    for (key, old) in undo.into_iter().rev() {
                        match old {
                            Some(item) => items.map.insert(key, item),
                            None => items.map.remove(&key),
                        };
                    }
                    return Err(e);
                }
            }
        }
        Ok(Response::new(cpb::TransactionalStateResponse {}))
    }
}

/// Serves the floor component on `socket` until the process is killed. daprd discovers a
/// socket's component types through gRPC reflection, so that is served too.
pub fn serve(socket: &Path) -> ! {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(socket).expect("bind the floor component's socket");
        let services = [
            cpb::state_store_server::SERVICE_NAME,
            cpb::transactional_state_store_server::SERVICE_NAME,
        ];
        let reflection = || {
            services.iter().fold(
                tonic_reflection::server::Builder::configure().register_encoded_file_descriptor_set(DESCRIPTOR_SET),
                |b, s| b.with_service_name(*s),
            )
        };
        let floor = Floor::default();
        tonic::transport::Server::builder()
            .add_service(cpb::state_store_server::StateStoreServer::new(floor.clone()))
            .add_service(cpb::transactional_state_store_server::TransactionalStateStoreServer::new(floor))
            .add_service(reflection().build_v1().expect("reflection"))
            .add_service(reflection().build_v1alpha().expect("reflection"))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
    });
    eprintln!("the floor component stopped: {result:?}");
    std::process::exit(1)
}
