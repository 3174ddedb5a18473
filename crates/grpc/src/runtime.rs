//! `dapr.proto.runtime.v1.Dapr`: the state, lock and configuration RPCs Dapr SDKs call (lock
//! and configuration in `runtime/blocks.rs`). Every rule comes from [`crate::dapr`], shared
//! with the HTTP door.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::error::{Surface, from_dapr};
use super::grant_of;
use super::pb::dapr::proto::common::v1 as common;
use super::pb::dapr::proto::runtime::v1 as pb;
use crate::dapr::DaprSettings;
use crate::dapr::{self, DaprError, DeleteItem, SaveItem, TxItem, query};
use crate::engine::Engine;

mod blocks;

pub struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) settings: Arc<DaprSettings>,
}

const RUNTIME: Surface = Surface::Runtime { transaction: false };

fn err(e: DaprError) -> Status {
    from_dapr(RUNTIME, e)
}

fn options(o: &Option<common::StateOptions>) -> Result<(Option<String>, Option<String>), DaprError> {
    o.as_ref().map_or(Ok((None, None)), |o| {
        dapr::options_from_proto(o.concurrency, o.consistency)
    })
}

fn save_item(item: common::StateItem) -> Result<SaveItem, DaprError> {
    let (conc, cons) = options(&item.options)?;
    Ok(SaveItem {
        value: dapr::stored_value(item.value, &item.metadata)?,
        key: item.key,
        etag: item.etag.map(|e| e.value),
        metadata: item.metadata,
        concurrency: conc,
        consistency: cons,
    })
}

fn delete_item(item: common::StateItem) -> Result<DeleteItem, DaprError> {
    let (conc, cons) = options(&item.options)?;
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
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        dapr::consistency_from_proto(r.consistency).map_err(err)?;
        let entry = dapr::get(&self.engine, &grant, store, &r.key).await.map_err(err)?;
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
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let entries = dapr::bulk_get(&self.engine, &grant, store, r.keys, self.settings.max_bulk_keys)
            .await
            .map_err(err)?;
        let items = entries
            .into_iter()
            .map(|b| match b.entry {
                Some(e) => pb::BulkStateItem {
                    key: b.key,
                    data: e.value.to_vec(),
                    etag: e.version.to_string(),
                    error: String::new(),
                    metadata: dapr::ttl_metadata(e.expires_at_ms),
                },
                None => pb::BulkStateItem {
                    key: b.key,
                    error: b.error.unwrap_or_default(),
                    ..Default::default()
                },
            })
            .collect();
        Ok(Response::new(pb::GetBulkStateResponse { items }))
    }

    async fn save_state(&self, req: Request<pb::SaveStateRequest>) -> Result<Response<()>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let items = r
            .states
            .into_iter()
            .map(save_item)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        dapr::save_each(&self.engine, &grant, store, &items)
            .await
            .map_err(err)?;
        Ok(Response::new(()))
    }

    async fn query_state_alpha1(
        &self,
        req: Request<pb::QueryStateRequest>,
    ) -> Result<Response<pb::QueryStateResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let q: serde_json::Value = serde_json::from_str(&r.query)
            .map_err(|e| Status::invalid_argument(format!("failed parsing query: {e}")))?;
        let q = query::Query::parse(&q).map_err(err)?;
        let page = query::run(&self.engine, &grant, store, &q).await.map_err(err)?;
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
        let grant = grant_of(&req)?;
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
        dapr::delete(&self.engine, &grant, store, &item).await.map_err(err)?;
        Ok(Response::new(()))
    }

    async fn delete_bulk_state(&self, req: Request<pb::DeleteBulkStateRequest>) -> Result<Response<()>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let store = self.store(&r.store_name)?;
        let items = r
            .states
            .into_iter()
            .map(delete_item)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        dapr::delete_each(&self.engine, &grant, store, &items)
            .await
            .map_err(err)?;
        Ok(Response::new(()))
    }

    async fn execute_state_transaction(
        &self,
        req: Request<pb::ExecuteStateTransactionRequest>,
    ) -> Result<Response<()>, Status> {
        let tx = Surface::Runtime { transaction: true };
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let store = self.settings.stores.get(&r.store_name).map_err(|e| from_dapr(tx, e))?;
        let mut items = Vec::with_capacity(r.operations.len());
        for op in r.operations {
            let Some(mut request) = op.request else {
                return Err(Status::invalid_argument("a transaction operation has no request"));
            };
            dapr::merge_request_metadata(&mut request.metadata, &r.metadata);
            items.push(match op.operation_type.as_str() {
                "upsert" => TxItem::Upsert(save_item(request).map_err(|e| from_dapr(tx, e))?),
                "delete" => TxItem::Delete(delete_item(request).map_err(|e| from_dapr(tx, e))?),
                other => return Err(from_dapr(tx, DaprError::UnsupportedOperation(other.to_owned()))),
            });
        }
        dapr::transact(&self.engine, &grant, store, &items, self.settings.max_transaction_ops)
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
            registered_components: dapr::components(
                &self.settings.stores,
                &self.settings.lock_stores,
                &self.settings.configuration_stores,
            )
            .into_iter()
            .map(|c| pb::RegisteredComponents {
                name: c.name,
                r#type: c.kind.into(),
                version: c.version.into(),
                capabilities: c.capabilities,
            })
            .collect(),
            extended_metadata: HashMap::new(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            enabled_features: Vec::new(),
        }))
    }

    async fn get_configuration_alpha1(
        &self,
        req: Request<pb::GetConfigurationRequest>,
    ) -> Result<Response<pb::GetConfigurationResponse>, Status> {
        let grant = grant_of(&req)?;
        self.do_get_configuration(&grant, req.into_inner()).await
    }

    async fn get_configuration(
        &self,
        req: Request<pb::GetConfigurationRequest>,
    ) -> Result<Response<pb::GetConfigurationResponse>, Status> {
        let grant = grant_of(&req)?;
        self.do_get_configuration(&grant, req.into_inner()).await
    }

    type SubscribeConfigurationAlpha1Stream = blocks::ConfigurationStream;

    async fn subscribe_configuration_alpha1(
        &self,
        req: Request<pb::SubscribeConfigurationRequest>,
    ) -> Result<Response<Self::SubscribeConfigurationAlpha1Stream>, Status> {
        let grant = grant_of(&req)?;
        self.do_subscribe_configuration(grant, req.into_inner()).await
    }

    type SubscribeConfigurationStream = blocks::ConfigurationStream;

    async fn subscribe_configuration(
        &self,
        req: Request<pb::SubscribeConfigurationRequest>,
    ) -> Result<Response<Self::SubscribeConfigurationStream>, Status> {
        let grant = grant_of(&req)?;
        self.do_subscribe_configuration(grant, req.into_inner()).await
    }

    async fn unsubscribe_configuration_alpha1(
        &self,
        req: Request<pb::UnsubscribeConfigurationRequest>,
    ) -> Result<Response<pb::UnsubscribeConfigurationResponse>, Status> {
        let grant = grant_of(&req)?;
        self.do_unsubscribe_configuration(&grant, req.into_inner())
    }

    async fn unsubscribe_configuration(
        &self,
        req: Request<pb::UnsubscribeConfigurationRequest>,
    ) -> Result<Response<pb::UnsubscribeConfigurationResponse>, Status> {
        let grant = grant_of(&req)?;
        self.do_unsubscribe_configuration(&grant, req.into_inner())
    }

    async fn try_lock_alpha1(&self, req: Request<pb::TryLockRequest>) -> Result<Response<pb::TryLockResponse>, Status> {
        let grant = grant_of(&req)?;
        self.do_try_lock(&grant, req.into_inner()).await
    }

    async fn unlock_alpha1(&self, req: Request<pb::UnlockRequest>) -> Result<Response<pb::UnlockResponse>, Status> {
        let grant = grant_of(&req)?;
        self.do_unlock(&grant, req.into_inner()).await
    }
}
