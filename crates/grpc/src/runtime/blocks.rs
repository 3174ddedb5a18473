//! The lock and configuration RPCs of `dapr.proto.runtime.v1.Dapr` (each configuration RPC also
//! under its `...Alpha1` name, which older SDKs call). Rules from [`crate::dapr::lock`] and
//! [`crate::dapr::configuration`], shared with the HTTP door.

use std::collections::HashMap;
use std::pin::Pin;

use tokio_stream::{Stream, StreamExt};
use tonic::metadata::MetadataValue;
use tonic::{Response, Status};

use super::{Runtime, err};
use crate::access::{Grant, Op};
use crate::dapr::configuration::{self as config, ConfigItem};
use crate::dapr::lock::{self, TryLock};
use crate::engine::watch::{Start, WatchItem};
use crate::pb::dapr::proto::common::v1 as common;
use crate::pb::dapr::proto::runtime::v1 as pb;

/// The response metadata carrying a lock's fencing token (HTTP: header `metadata.fencingToken`).
pub const FENCING_TOKEN_METADATA: &str = "metadata.fencingtoken";

pub type ConfigurationStream = Pin<Box<dyn Stream<Item = Result<pb::SubscribeConfigurationResponse, Status>> + Send>>;

fn item(i: ConfigItem) -> common::ConfigurationItem {
    common::ConfigurationItem {
        value: i.value,
        version: i.version,
        metadata: i.metadata,
    }
}

impl Runtime {
    fn lock_store(&self, name: &str) -> Result<&crate::dapr::StoreSpec, Status> {
        self.settings.lock_stores.get_kind(name, "lock").map_err(err)
    }

    fn configuration_store(&self, name: &str) -> Result<&crate::dapr::StoreSpec, Status> {
        self.settings
            .configuration_stores
            .get_kind(name, "configuration")
            .map_err(err)
    }

    pub(super) async fn do_try_lock(
        &self,
        grant: &Grant,
        r: pb::TryLockRequest,
    ) -> Result<Response<pb::TryLockResponse>, Status> {
        let store = self.lock_store(&r.store_name)?;
        let req = TryLock {
            resource_id: r.resource_id,
            owner: r.lock_owner,
            expiry_in_seconds: i64::from(r.expiry_in_seconds),
        };
        let locked = lock::try_lock(&self.engine, grant, store, &req).await.map_err(err)?;
        let mut resp = Response::new(pb::TryLockResponse {
            success: locked.success,
        });
        if let Some(token) = locked.fencing_token
            && let Ok(v) = MetadataValue::try_from(token.to_string())
        {
            resp.metadata_mut().insert(FENCING_TOKEN_METADATA, v);
        }
        Ok(resp)
    }

    pub(super) async fn do_unlock(
        &self,
        grant: &Grant,
        r: pb::UnlockRequest,
    ) -> Result<Response<pb::UnlockResponse>, Status> {
        let store = self.lock_store(&r.store_name)?;
        let status = lock::unlock(&self.engine, grant, store, &r.resource_id, &r.lock_owner)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::UnlockResponse { status: status as i32 }))
    }

    pub(super) async fn do_get_configuration(
        &self,
        grant: &Grant,
        r: pb::GetConfigurationRequest,
    ) -> Result<Response<pb::GetConfigurationResponse>, Status> {
        let store = self.configuration_store(&r.store_name)?;
        let items = config::get(
            &self.engine,
            grant,
            store,
            r.keys,
            self.settings.max_bulk_keys,
            self.engine.limits().scan_page.saturating_mul(10),
        )
        .await
        .map_err(err)?;
        Ok(Response::new(pb::GetConfigurationResponse {
            items: items.into_iter().map(|(k, v)| (k, item(v))).collect(),
        }))
    }

    /// The first message carries the subscription id alone; then one message per change
    /// (deletes and expiries included), until the client goes away or unsubscribes. A
    /// subscriber that falls behind the history kept gets ABORTED.
    pub(super) async fn do_subscribe_configuration(
        &self,
        grant: Grant,
        r: pb::SubscribeConfigurationRequest,
    ) -> Result<Response<ConfigurationStream>, Status> {
        let store = self.configuration_store(&r.store_name)?.clone();
        let keys = config::subscription_keys(&store, &r.keys).map_err(err)?;
        let slot = self
            .settings
            .access
            .open_stream(grant.principal())
            .map_err(|e| err(e.into()))?;
        // Only keys the caller may read, by the rules in force when each is sent.
        let caller = grant.clone();
        let watch = store
            .watch(keys, &[])
            .map_err(err)?
            .and(move |k| grant.may(Op::Read, k));
        let subscription = self.settings.subscriptions.open(caller.principal());
        let id = subscription.id().to_owned();
        let first = pb::SubscribeConfigurationResponse {
            id: id.clone(),
            items: HashMap::new(),
        };
        let changes = self.engine.watch(watch, Start::Live).filter_map(move |w| {
            // The stream holds its slot of the caller's stream limit until it ends.
            let _open = &slot;
            match w {
                WatchItem::Change { event, .. } => {
                    let c = &event.change;
                    Some(Ok(pb::SubscribeConfigurationResponse {
                        id: id.clone(),
                        items: HashMap::from([(store.dapr_key(&c.key), item(config::item_of_change(c)))]),
                    }))
                }
                WatchItem::Overflow { missed } => Some(Err(Status::aborted(format!(
                    "the subscriber fell behind and missed {missed} changes; subscribe again"
                )))),
                WatchItem::Failed(e) => Some(Err(err(e.into()))),
                // A live watch has no snapshot.
                WatchItem::Snapshot { .. } | WatchItem::Reset | WatchItem::Synced { .. } => None,
            }
        });
        // Unsubscribe ends it, and so does a reload that removes the caller's token
        // (UNAUTHENTICATED last).
        let ending = caller.clone();
        let changes = futures_util::StreamExt::take_until(changes, async move {
            tokio::select! {
                () = subscription.stopped() => {}
                () = ending.revoked() => {}
            }
        });
        let last = tokio_stream::once(()).filter_map(move |()| {
            caller
                .is_revoked()
                .then(|| Err(Status::unauthenticated("the token of this stream was revoked")))
        });
        let stream = tokio_stream::once(Ok(first)).chain(changes).chain(last);
        Ok(Response::new(Box::pin(stream)))
    }

    pub(super) fn do_unsubscribe_configuration(
        &self,
        grant: &Grant,
        r: pb::UnsubscribeConfigurationRequest,
    ) -> Result<Response<pb::UnsubscribeConfigurationResponse>, Status> {
        // As daprd, an unknown id is `ok: false`; so is another caller's subscription.
        let ok = self.settings.subscriptions.close(&r.id, grant.principal());
        Ok(Response::new(pb::UnsubscribeConfigurationResponse {
            ok,
            message: if ok {
                String::new()
            } else {
                format!(
                    "failed to unsubscribe to configuration request {}: subscription does not exist",
                    r.id
                )
            },
        }))
    }
}
