//! `dapr.proto.components.v1`: stategate as a Dapr pluggable state component. daprd applies its
//! own key prefix (`appid||key`) before calling, so keys are used as given ([`StoreSpec::raw`]).

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::error::{Surface, from_dapr};
use super::pb::dapr::proto::components::v1 as pb;
use crate::access::Grant;
use crate::dapr::{self, DaprError, DeleteItem, SaveItem, StoreSpec, TxItem, query};
use crate::engine::Engine;

/// One component instance; every service of the component API shares it.
#[derive(Clone)]
pub struct Component {
    pub(crate) engine: Engine,
    pub(crate) store: Arc<StoreSpec>,
    pub(crate) max_transaction_ops: usize,
    pub(crate) max_bulk_keys: usize,
}

fn err(e: DaprError) -> Status {
    from_dapr(Surface::Component, e)
}

fn options(o: &Option<pb::StateOptions>) -> Result<(Option<String>, Option<String>), DaprError> {
    o.as_ref().map_or(Ok((None, None)), |o| {
        dapr::options_from_proto(o.concurrency, o.consistency)
    })
}

fn save_item(r: pb::SetRequest) -> Result<SaveItem, DaprError> {
    let (conc, cons) = options(&r.options)?;
    let mut metadata = r.metadata;
    if !r.content_type.is_empty() {
        metadata.entry("contentType".into()).or_insert(r.content_type);
    }
    Ok(SaveItem {
        value: dapr::stored_value(r.value, &metadata)?,
        key: r.key,
        etag: r.etag.map(|e| e.value),
        metadata,
        concurrency: conc,
        consistency: cons,
    })
}

fn delete_item(r: pb::DeleteRequest) -> Result<DeleteItem, DaprError> {
    let (conc, cons) = options(&r.options)?;
    Ok(DeleteItem {
        key: r.key,
        etag: r.etag.map(|e| e.value),
        metadata: r.metadata,
        concurrency: conc,
        consistency: cons,
    })
}

fn content_type(value: &[u8]) -> String {
    dapr::content_type_of(value).into()
}

impl Component {
    async fn get_one(&self, key: String) -> Result<pb::GetResponse, Status> {
        Ok(
            match dapr::get(&self.engine, &Grant::all(), &self.store, &key)
                .await
                .map_err(err)?
            {
                None => pb::GetResponse::default(),
                Some(e) => pb::GetResponse {
                    content_type: content_type(&e.value),
                    data: e.value.to_vec(),
                    etag: Some(pb::Etag {
                        value: e.version.to_string(),
                    }),
                    metadata: dapr::ttl_metadata(e.expires_at_ms),
                },
            },
        )
    }
}

#[tonic::async_trait]
impl pb::state_store_server::StateStore for Component {
    async fn init(&self, req: Request<pb::InitRequest>) -> Result<Response<pb::InitResponse>, Status> {
        let props = req.into_inner().metadata.map(|m| m.properties).unwrap_or_default();
        tracing::info!(properties = props.len(), "dapr component: init");
        Ok(Response::new(pb::InitResponse {}))
    }

    async fn features(&self, _req: Request<pb::FeaturesRequest>) -> Result<Response<pb::FeaturesResponse>, Status> {
        Ok(Response::new(pb::FeaturesResponse {
            features: dapr::FEATURES.iter().map(|f| f.to_string()).collect(),
        }))
    }

    async fn delete(&self, req: Request<pb::DeleteRequest>) -> Result<Response<pb::DeleteResponse>, Status> {
        let item = delete_item(req.into_inner()).map_err(err)?;
        dapr::delete(&self.engine, &Grant::all(), &self.store, &item)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::DeleteResponse {}))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let r = req.into_inner();
        dapr::consistency_from_proto(r.consistency).map_err(err)?;
        Ok(Response::new(self.get_one(r.key).await?))
    }

    async fn set(&self, req: Request<pb::SetRequest>) -> Result<Response<pb::SetResponse>, Status> {
        let item = save_item(req.into_inner()).map_err(err)?;
        dapr::save(&self.engine, &Grant::all(), &self.store, &item)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::SetResponse {}))
    }

    async fn ping(&self, _req: Request<pb::PingRequest>) -> Result<Response<pb::PingResponse>, Status> {
        Ok(Response::new(pb::PingResponse {}))
    }

    async fn bulk_delete(
        &self,
        req: Request<pb::BulkDeleteRequest>,
    ) -> Result<Response<pb::BulkDeleteResponse>, Status> {
        let items = req
            .into_inner()
            .items
            .into_iter()
            .map(delete_item)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        dapr::delete_each(&self.engine, &Grant::all(), &self.store, &items)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::BulkDeleteResponse {}))
    }

    async fn bulk_get(&self, req: Request<pb::BulkGetRequest>) -> Result<Response<pb::BulkGetResponse>, Status> {
        let keys = req.into_inner().items.into_iter().map(|g| g.key).collect();
        let entries = dapr::bulk_get(&self.engine, &Grant::all(), &self.store, keys, self.max_bulk_keys)
            .await
            .map_err(err)?;
        let items = entries
            .into_iter()
            .map(|b| match b.entry {
                Some(e) => pb::BulkStateItem {
                    key: b.key,
                    content_type: content_type(&e.value),
                    data: e.value.to_vec(),
                    etag: Some(pb::Etag {
                        value: e.version.to_string(),
                    }),
                    error: String::new(),
                    metadata: dapr::ttl_metadata(e.expires_at_ms),
                },
                None => pb::BulkStateItem {
                    key: b.key,
                    ..Default::default()
                },
            })
            .collect();
        Ok(Response::new(pb::BulkGetResponse { items }))
    }

    async fn bulk_set(&self, req: Request<pb::BulkSetRequest>) -> Result<Response<pb::BulkSetResponse>, Status> {
        let items = req
            .into_inner()
            .items
            .into_iter()
            .map(save_item)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        dapr::save_each(&self.engine, &Grant::all(), &self.store, &items)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::BulkSetResponse {}))
    }
}

#[tonic::async_trait]
impl pb::transactional_state_store_server::TransactionalStateStore for Component {
    async fn transact(
        &self,
        req: Request<pb::TransactionalStateRequest>,
    ) -> Result<Response<pb::TransactionalStateResponse>, Status> {
        use pb::transactional_state_operation::Request as Op;
        let r = req.into_inner();
        let mut items = Vec::with_capacity(r.operations.len());
        for op in r.operations {
            items.push(match op.request {
                Some(Op::Set(mut s)) => {
                    dapr::merge_request_metadata(&mut s.metadata, &r.metadata);
                    TxItem::Upsert(save_item(s).map_err(err)?)
                }
                Some(Op::Delete(mut d)) => {
                    dapr::merge_request_metadata(&mut d.metadata, &r.metadata);
                    TxItem::Delete(delete_item(d).map_err(err)?)
                }
                None => return Err(Status::invalid_argument("a transaction operation has no request")),
            });
        }
        dapr::transact(
            &self.engine,
            &Grant::all(),
            &self.store,
            &items,
            self.max_transaction_ops,
        )
        .await
        .map_err(err)?;
        Ok(Response::new(pb::TransactionalStateResponse {}))
    }
}

#[tonic::async_trait]
impl pb::queriable_state_store_server::QueriableStateStore for Component {
    async fn query(&self, req: Request<pb::QueryRequest>) -> Result<Response<pb::QueryResponse>, Status> {
        let q = req.into_inner().query.unwrap_or_default();
        // daprd sends each filter operator with its argument as JSON in Any.value.
        let mut filter = serde_json::Map::new();
        for (op, any) in q.filter {
            let arg: serde_json::Value = serde_json::from_slice(&any.value)
                .map_err(|e| Status::invalid_argument(format!("filter {op}: not JSON: {e}")))?;
            filter.insert(op, arg);
        }
        let sort: Vec<serde_json::Value> = q
            .sort
            .iter()
            .map(|s| {
                let order = if s.order == pb::sorting::Order::Desc as i32 {
                    "DESC"
                } else {
                    "ASC"
                };
                serde_json::json!({"key": s.key, "order": order})
            })
            .collect();
        let page = q.pagination.unwrap_or_default();
        let doc = serde_json::json!({
            "filter": serde_json::Value::Object(filter),
            "sort": sort,
            "page": {"limit": page.limit.max(0), "token": page.token},
        });
        let q = query::Query::parse(&doc).map_err(err)?;
        let page = query::run(&self.engine, &Grant::all(), &self.store, &q)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::QueryResponse {
            items: page
                .rows
                .into_iter()
                .map(|row| pb::QueryItem {
                    key: row.key,
                    content_type: content_type(&row.value),
                    data: row.value.to_vec(),
                    etag: Some(pb::Etag { value: row.etag }),
                    error: String::new(),
                })
                .collect(),
            token: page.token.unwrap_or_default(),
            metadata: HashMap::new(),
        }))
    }
}

#[tonic::async_trait]
impl pb::transactional_store_multi_max_size_server::TransactionalStoreMultiMaxSize for Component {
    async fn multi_max_size(
        &self,
        _req: Request<pb::MultiMaxSizeRequest>,
    ) -> Result<Response<pb::MultiMaxSizeResponse>, Status> {
        Ok(Response::new(pb::MultiMaxSizeResponse {
            max_size: self.max_transaction_ops as i64,
        }))
    }
}
