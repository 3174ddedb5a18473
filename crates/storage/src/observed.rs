//! A backend wrapper that times every write (the storage write latency metric), whatever the
//! backend. Everything else passes straight through: every method of [`Backend`], those with
//! a default included, must be forwarded here (a default left in place would hide the inner
//! backend's own: its shared change log, its marks).

use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;

use super::{Backend, KeyPage, Record, StorageError, Store, Swap, SwapOutcome, Write, Written};
use crate::hlc::Hlc;
use crate::metrics::Metrics;

pub(super) struct Observed {
    inner: Store,
    metrics: Metrics,
}

impl Observed {
    pub(super) fn new(inner: Store, metrics: Metrics) -> Observed {
        Observed { inner, metrics }
    }
}

#[async_trait]
impl Backend for Observed {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        self.inner.backend().get(key).await
    }

    async fn get_many(
        &self,
        keys: &[Bytes],
        max_value_bytes: usize,
    ) -> Result<Option<Vec<Option<Record>>>, StorageError> {
        self.inner.backend().get_many(keys, max_value_bytes).await
    }

    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError> {
        let started = Instant::now();
        let outcome = self.inner.backend().swap_many(swaps, max_keys).await;
        self.metrics.storage_write(started);
        outcome
    }

    async fn write(&self, w: &Write<'_>) -> Result<Written, StorageError> {
        let started = Instant::now();
        let outcome = self.inner.backend().write(w).await;
        self.metrics.storage_write(started);
        outcome
    }

    fn clock(&self) -> Option<std::sync::Arc<dyn crate::hlc::Clock>> {
        self.inner.backend().clock()
    }

    async fn get_marked(
        &self,
        key: &[u8],
        request: Option<&[u8]>,
    ) -> Result<(Option<Record>, Option<Bytes>), StorageError> {
        self.inner.backend().get_marked(key, request).await
    }

    fn change_log(&self) -> Option<std::sync::Arc<dyn super::log::ChangeLog>> {
        self.inner.backend().change_log()
    }

    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError> {
        self.inner.backend().scan(after, examine, now_ms, keep).await
    }

    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError> {
        self.inner.backend().expired(now_ms, limit).await
    }

    async fn next_deadline(&self) -> Result<Option<u64>, StorageError> {
        self.inner.backend().next_deadline().await
    }

    async fn len(&self) -> Result<u64, StorageError> {
        self.inner.backend().len().await
    }

    async fn max_version(&self) -> Result<Option<Hlc>, StorageError> {
        self.inner.backend().max_version().await
    }

    async fn value_bytes(&self) -> Result<Option<u64>, StorageError> {
        self.inner.backend().value_bytes().await
    }

    fn persistent(&self) -> bool {
        self.inner.backend().persistent()
    }

    fn health(&self) -> super::StorageHealth {
        self.inner.backend().health()
    }

    fn health_changes(&self) -> Option<tokio::sync::watch::Receiver<super::StorageHealth>> {
        self.inner.backend().health_changes()
    }

    fn online_backup(&self) -> Option<&dyn super::OnlineBackup> {
        self.inner.backend().online_backup()
    }
}
