//! `dapr.proto.runtime.v1.Dapr`: the state RPCs Dapr SDKs call. Every rule comes from
//! [`crate::dapr`], shared with the HTTP door.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tonic::{Request, Response, Status};

use super::error::{Surface, from_dapr};
use super::pb::dapr::proto::common::v1 as common;
use super::pb::dapr::proto::runtime::v1 as pb;
use crate::dapr::{self, DaprError, DeleteItem, SaveItem, TxItem, query};
use crate::engine::Engine;
use crate::http::HttpSettings;

pub struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) settings: Arc<HttpSettings>,
}

const RUNTIME: Surface = Surface::Runtime { transaction: false };

fn err(e: DaprError) -> Status {
    from_dapr(RUNTIME, e)
}

/// gRPC values are stored verbatim, unless metadata `contentType` is JSON: then compacted.
pub(crate) fn stored_value(value: Vec<u8>, metadata: &HashMap<String, String>) -> Result<Bytes, DaprError> {
    let json = metadata
        .get("contentType")
        .is_some_and(|c| c.split(';').next().is_some_and(|m| m.trim() == "application/json"));
    if !json {
        return Ok(Bytes::from(value));
    }
    let v: serde_json::Value = serde_json::from_slice(&value)
        .map_err(|e| DaprError::Malformed(format!("contentType is application/json but the value is not: {e}")))?;
    serde_json::to_vec(&v)
        .map(Bytes::from)
        .map_err(|e| DaprError::Malformed(e.to_string()))
}

fn save_item(item: common::StateItem) -> Result<SaveItem, DaprError> {
    let (conc, cons) = match &item.options {
        Some(o) => (
            dapr::concurrency_from_proto(o.concurrency)?,
            dapr::consistency_from_proto(o.consistency)?,
        ),
        None => (None, None),
    };
    Ok(SaveItem {
        value: stored_value(item.value, &item.metadata)?,
        key: item.key,
        etag: item.etag.map(|e| e.value),
        metadata: item.metadata,
        concurrency: conc,
        consistency: cons,
    })
}

fn delete_item(item: common::StateItem) -> Result<DeleteItem, DaprError> {
    let (conc, cons) = match &item.options {
        Some(o) => (
            dapr::concurrency_from_proto(o.concurrency)?,
            dapr::consistency_from_proto(o.consistency)?,
        ),
        None => (None, None),
    };
    Ok(DeleteItem {
        key: item.key,
        etag: item.etag.map(|e| e.value),
        metadata: item.metadata,
        concurrency: conc,
        consistency: cons,
    })
}

impl Runtime {
    fn store(&self, name: &str) -> Result<&dapr::StoreSpec, Status> {
        self.settings.stores.get(name).map_err(err)
    }
}

#[tonic::async_trait]
impl pb::dapr_server::Dapr for Runtime {
    async fn get_state(&self, req: Request<pb::GetStateRequest>) -> Result<Response<pb::GetStateResponse>, Status> {
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        dapr::consistency_from_proto(r.consistency).map_err(err)?;
        let entry = dapr::get(&self.engine, store, &r.key).await.map_err(err)?;
        Ok(Response::new(match entry {
            None => pb::GetStateResponse::default(),
            Some(e) => pb::GetStateResponse {
                data: e.value.to_vec(),
                etag: e.version.to_string(),
                metadata: dapr::ttl_metadata(e.expires_at_ms),
            },
        }))
    }

    async fn get_bulk_state(
        &self,
        req: Request<pb::GetBulkStateRequest>,
    ) -> Result<Response<pb::GetBulkStateResponse>, Status> {
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        if r.keys.len() > self.settings.max_bulk_keys {
            return Err(Status::invalid_argument(format!(
                "a bulk get may name at most {} keys",
                self.settings.max_bulk_keys
            )));
        }
        let mut items = Vec::with_capacity(r.keys.len());
        for key in r.keys {
            items.push(match dapr::get(&self.engine, store, &key).await {
                Ok(Some(e)) => pb::BulkStateItem {
                    key,
                    data: e.value.to_vec(),
                    etag: e.version.to_string(),
                    error: String::new(),
                    metadata: dapr::ttl_metadata(e.expires_at_ms),
                },
                Ok(None) => pb::BulkStateItem {
                    key,
                    ..Default::default()
                },
                Err(DaprError::Engine(e)) => return Err(super::error::from_engine(RUNTIME, e)),
                Err(e) => pb::BulkStateItem {
                    key,
                    error: e.to_string(),
                    ..Default::default()
                },
            });
        }
        Ok(Response::new(pb::GetBulkStateResponse { items }))
    }

    async fn save_state(&self, req: Request<pb::SaveStateRequest>) -> Result<Response<()>, Status> {
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let items = r
            .states
            .into_iter()
            .map(save_item)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        dapr::save_each(&self.engine, store, &items).await.map_err(err)?;
        Ok(Response::new(()))
    }

    async fn query_state_alpha1(
        &self,
        req: Request<pb::QueryStateRequest>,
    ) -> Result<Response<pb::QueryStateResponse>, Status> {
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let q: serde_json::Value = serde_json::from_str(&r.query)
            .map_err(|e| Status::invalid_argument(format!("failed parsing query: {e}")))?;
        let q = query::Query::parse(&q).map_err(err)?;
        let page = query::run(&self.engine, store, &q).await.map_err(err)?;
        Ok(Response::new(pb::QueryStateResponse {
            results: page
                .rows
                .into_iter()
                .map(|row| pb::QueryStateItem {
                    key: row.key,
                    data: row.value.to_vec(),
                    etag: row.etag,
                    error: String::new(),
                })
                .collect(),
            token: page.token.unwrap_or_default(),
            metadata: HashMap::new(),
        }))
    }

    async fn delete_state(&self, req: Request<pb::DeleteStateRequest>) -> Result<Response<()>, Status> {
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let item = delete_item(common::StateItem {
            key: r.key,
            value: Vec::new(),
            etag: r.etag,
            metadata: r.metadata,
            options: r.options,
        })
        .map_err(err)?;
        dapr::delete(&self.engine, store, &item).await.map_err(err)?;
        Ok(Response::new(()))
    }

    async fn delete_bulk_state(&self, req: Request<pb::DeleteBulkStateRequest>) -> Result<Response<()>, Status> {
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let items = r
            .states
            .into_iter()
            .map(delete_item)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        dapr::delete_each(&self.engine, store, &items).await.map_err(err)?;
        Ok(Response::new(()))
    }

    async fn execute_state_transaction(
        &self,
        req: Request<pb::ExecuteStateTransactionRequest>,
    ) -> Result<Response<()>, Status> {
        let tx = Surface::Runtime { transaction: true };
        let r = req.into_inner();
        let store = self.settings.stores.get(&r.store_name).map_err(|e| from_dapr(tx, e))?;
        let mut items = Vec::with_capacity(r.operations.len());
        for op in r.operations {
            let Some(mut request) = op.request else {
                return Err(Status::invalid_argument("a transaction operation has no request"));
            };
            for (k, v) in &r.metadata {
                request.metadata.entry(k.clone()).or_insert_with(|| v.clone());
            }
            items.push(match op.operation_type.as_str() {
                "upsert" => TxItem::Upsert(save_item(request).map_err(|e| from_dapr(tx, e))?),
                "delete" => TxItem::Delete(delete_item(request).map_err(|e| from_dapr(tx, e))?),
                other => return Err(from_dapr(tx, DaprError::UnsupportedOperation(other.to_owned()))),
            });
        }
        dapr::transact(&self.engine, store, &items, self.settings.max_transaction_ops)
            .await
            .map_err(|e| from_dapr(tx, e))?;
        Ok(Response::new(()))
    }

    async fn get_metadata(
        &self,
        _req: Request<pb::GetMetadataRequest>,
    ) -> Result<Response<pb::GetMetadataResponse>, Status> {
        Ok(Response::new(pb::GetMetadataResponse {
            id: self.settings.app_id.clone(),
            registered_components: self
                .settings
                .stores
                .names()
                .map(|name| pb::RegisteredComponents {
                    name: name.to_owned(),
                    r#type: "state.stategate".into(),
                    version: "v1".into(),
                    capabilities: dapr::FEATURES.iter().map(|f| f.to_string()).collect(),
                })
                .collect(),
            extended_metadata: HashMap::new(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            enabled_features: Vec::new(),
        }))
    }
}
