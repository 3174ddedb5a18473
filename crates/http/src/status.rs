//! The service status (a stategate extension): version, uptime, storage, key count, doors and
//! MQTT connections. The web console's status panel reads it.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::extract::State;

use super::AppState;
use super::dto;
use super::error::{ApiError, ErrorBody, Op};

/// Counts the clients connected to the embedded MQTT broker.
pub type ClientCounter = Arc<dyn Fn() -> usize + Send + Sync>;

/// What the status reports beyond the engine, filled in once every door is bound.
#[derive(Clone)]
pub struct ServiceInfo {
    started: Instant,
    started_at: SystemTime,
    /// The node id in every version issued.
    pub node_id: String,
    pub storage: dto::StorageStatus,
    pub doors: Vec<dto::DoorStatus>,
    /// `embedded` or `external`.
    pub mqtt_broker: String,
    /// `None` when the broker cannot tell (an external one).
    pub mqtt_clients: Option<ClientCounter>,
}

impl std::fmt::Debug for ServiceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceInfo")
            .field("doors", &self.doors)
            .finish_non_exhaustive()
    }
}

impl Default for ServiceInfo {
    fn default() -> ServiceInfo {
        ServiceInfo {
            started: Instant::now(),
            started_at: SystemTime::now(),
            node_id: "stategate".into(),
            storage: dto::StorageStatus {
                kind: "memory".into(),
                data_dir: None,
                fsync: None,
                redis: None,
            },
            doors: Vec::new(),
            mqtt_broker: "external".into(),
            mqtt_clients: None,
        }
    }
}

impl ServiceInfo {
    /// Starts the uptime clock now.
    pub fn new(node_id: &str, storage: dto::StorageStatus, mqtt_broker: &str) -> ServiceInfo {
        ServiceInfo {
            node_id: node_id.to_owned(),
            storage,
            mqtt_broker: mqtt_broker.to_owned(),
            ..ServiceInfo::default()
        }
    }

    /// Adds a door to the list.
    pub fn door(&mut self, name: &str, address: impl std::fmt::Display, detail: &str) {
        self.doors.push(dto::DoorStatus {
            name: name.to_owned(),
            address: address.to_string(),
            detail: detail.to_owned(),
        });
    }
}

/// Status of the service (stategate extension; needs the api token like every data route).
#[utoipa::path(
    get,
    path = "/v1.0-alpha1/stategate/status",
    tag = "stategate",
    responses(
        (status = 200, body = dto::Status),
        (status = 500, body = ErrorBody, description = "the key count could not be read"),
    )
)]
pub async fn status(State(st): State<AppState>) -> Result<axum::Json<dto::Status>, ApiError> {
    let info = &st.info;
    let keys = st
        .engine
        .key_count()
        .await
        .map_err(|e| ApiError::from_engine(Op::Get, e))?;
    let started_ms = info
        .started_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Ok(axum::Json(dto::Status {
        version: env!("CARGO_PKG_VERSION").into(),
        node_id: info.node_id.clone(),
        uptime_seconds: info.started.elapsed().as_secs(),
        started_at: crate::dapr::rfc3339(started_ms),
        storage: info.storage.clone(),
        keys,
        doors: info.doors.clone(),
        mqtt_broker: info.mqtt_broker.clone(),
        mqtt_connected_clients: info.mqtt_clients.as_ref().map(|count| count() as u64),
        keynotify_registrations: st.engine.registrations() as u64,
        keynotify_dropped: st.engine.keynotify_dropped(),
        watch_history: {
            let (changes, bytes) = st.engine.feed_held();
            dto::HistoryStatus {
                changes: changes as u64,
                bytes: bytes as u64,
            }
        },
    }))
}
