//! JSON shapes of the Dapr HTTP state API. Only this module derives serde/utoipa traits.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `options` of a state item.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StateOptions {
    /// `first-write` or `last-write` (default).
    pub concurrency: Option<String>,
    /// `eventual` or `strong`.
    pub consistency: Option<String>,
}

/// One item of a save request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct SaveItem {
    pub key: Option<String>,
    /// Any JSON value; stored as its compact JSON text.
    #[schema(value_type = Object)]
    #[serde(default)]
    pub value: serde_json::Value,
    /// The ETag (an HLC version) the key must have.
    pub etag: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub options: StateOptions,
    /// Accepted for daprd compatibility and type-checked as daprd's decoder does (a wrong type
    /// is a 400); the stored bytes say what they are.
    #[serde(rename = "contentType")]
    pub content_type: Option<String>,
}

/// Bulk get request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct BulkGetRequest {
    pub keys: Vec<String>,
    /// Type-checked as daprd does (a wrong type is a 400), otherwise unused: every key is read
    /// from one engine.
    pub parallelism: Option<i64>,
    /// Type-checked as daprd does; no read takes metadata.
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

/// One item of a bulk get answer. A missing key is `{"key": "..."}` alone.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BulkItem {
    pub key: String,
    #[schema(value_type = Object)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HashMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One transaction operation.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct TransactionOperation {
    /// `upsert` or `delete`.
    pub operation: String,
    pub request: SaveItem,
}

/// Transaction request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct TransactionRequest {
    pub operations: Vec<TransactionOperation>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

/// One query result.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueryItem {
    pub key: String,
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
    pub etag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HashMap<String, String>>,
}

/// Query answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueryResponse {
    pub results: Vec<QueryItem>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// A store in the metadata answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ComponentMetadata {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub version: String,
    pub capabilities: Vec<String>,
}

/// `/v1.0/metadata` answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Metadata {
    pub id: String,
    #[serde(rename = "runtimeVersion")]
    pub runtime_version: String,
    pub components: Vec<ComponentMetadata>,
}

/// One server-sent event's data.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChangeEvent {
    pub key: String,
    /// The new value (on `set`).
    #[schema(value_type = Object)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// The new version (equals the event id).
    pub etag: String,
    /// `expired` when a delete came from expiry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HashMap<String, String>>,
}

/// A page of key names (`GET /v1.0-alpha1/state/{store}/keys`, a stategate extension).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct KeysPage {
    /// Dapr keys (without the store's prefix), in key order.
    pub keys: Vec<String>,
    /// Pass as `token` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Where the service stores its records (status).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StorageStatus {
    /// `memory`, `durable` or `redis`.
    pub kind: String,
    /// The durable store's directory.
    #[serde(rename = "dataDir", skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
    /// The durable store's `--fsync` mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsync: Option<String>,
    /// The Redis server (any password masked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<String>,
}

/// One door of the service (status).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DoorStatus {
    /// `mqtt`, `http`, `grpc` or `dapr-component`.
    pub name: String,
    /// Where it listens (`host:port`, or a Unix socket path); for MQTT with an external
    /// broker, the broker it connects to.
    pub address: String,
    /// What is served there.
    pub detail: String,
}

/// `/v1.0-alpha1/stategate/status` answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Status {
    /// The stategate version.
    pub version: String,
    /// The node id in every version this service issues.
    #[serde(rename = "nodeId")]
    pub node_id: String,
    /// Seconds since the service started.
    #[serde(rename = "uptimeSeconds")]
    pub uptime_seconds: u64,
    /// When the service started (RFC 3339, UTC).
    #[serde(rename = "startedAt")]
    pub started_at: String,
    pub storage: StorageStatus,
    /// Keys stored, across every store (keys expired but not yet swept included).
    pub keys: u64,
    pub doors: Vec<DoorStatus>,
    /// `embedded` or `external`.
    #[serde(rename = "mqttBroker")]
    pub mqtt_broker: String,
    /// MQTT connections to the embedded broker; `null` when the broker is external and cannot
    /// tell.
    #[serde(rename = "mqttConnectedClients")]
    pub mqtt_connected_clients: Option<u64>,
    /// KEYNOTIFY registrations of all clients.
    #[serde(rename = "keynotifyRegistrations")]
    pub keynotify_registrations: u64,
    /// KEYNOTIFY notifications dropped so far because the send queue was full.
    #[serde(rename = "keynotifyDropped")]
    pub keynotify_dropped: u64,
    /// Changes and bytes the watch history holds.
    #[serde(rename = "watchHistory")]
    pub watch_history: HistoryStatus,
}

/// What the watch history holds (status).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HistoryStatus {
    pub changes: u64,
    pub bytes: u64,
}

/// `POST /v1.0-alpha1/stategate/import` answer: what happened to the records sent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ImportReport {
    /// Stored (new keys, or replacing an older version; with `overwrite`, a newer one too).
    pub imported: u64,
    /// Already stored with exactly the same version: left alone.
    pub unchanged: u64,
    /// Not stored: the store holds a newer version (send `overwrite=true` to replace it).
    #[serde(rename = "keptNewer")]
    pub kept_newer: u64,
    /// Not stored: expired already.
    pub expired: u64,
}
