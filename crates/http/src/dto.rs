//! JSON shapes of the Dapr HTTP state API. Only this module derives serde/utoipa traits.
//!
//! Requests decode as daprd's Go structs do where clients depend on it: JSON `null` for a map,
//! an object or a list is the empty one (Go's `encoding/json` leaves the field at its zero value;
//! the JavaScript SDK sends `"metadata": null`), and so is a `null` metadata value. Values stay
//! as their JSON text ([`RawValue`]), so numbers are never re-parsed and keep every digit.

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

/// `null` (or an absent field, with `#[serde(default)]`) as the empty value.
fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A JSON object, or `null` (or absent, with `#[serde(default)]`) for the empty value. Only an
/// object: serde alone would also read a struct from a JSON array, by position.
fn object_or_null<'de, D: Deserializer<'de>, T: serde::de::DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(v @ serde_json::Value::Object(_)) => serde_json::from_value(v).map_err(D::Error::custom),
        Some(_) => Err(D::Error::custom("expected a JSON object")),
    }
}

/// A whole number as JSON Schema's `integer` counts them: `5` or `5.0` (no fraction). serde
/// alone refuses `5.0` for an integer field, which the document allows.
fn whole<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<T, D::Error> {
    use serde::de::Error;
    let n = serde_json::Number::deserialize(d)?;
    let whole = if let Some(u) = n.as_u64() {
        Some(i128::from(u))
    } else if let Some(i) = n.as_i64() {
        Some(i128::from(i))
    } else {
        // A fraction-less double below 2^53 is exactly the integer it shows; beyond, it was
        // rounded when read (`-9223372036854775809` reads as `-2^63`): refused.
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0)
            .map(|f| f as i128)
    };
    whole
        .and_then(|w| T::try_from(w).ok())
        .ok_or_else(|| D::Error::custom(format!("{n} is not a whole number in range")))
}

/// [`whole`] from 0 to `i64::MAX` (an `int64` at least 0).
fn non_negative<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    use serde::de::Error;
    let n: i64 = whole(d)?;
    u64::try_from(n).map_err(|_| D::Error::custom(format!("{n} is negative")))
}

/// [`whole`] for an optional field (`null` is none).
fn whole_or_null<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<Option<T>, D::Error> {
    #[derive(Deserialize)]
    struct Whole<T: TryFrom<i128>>(#[serde(deserialize_with = "whole")] T);
    Ok(Option::<Whole<T>>::deserialize(d)?.map(|w| w.0))
}

/// A Dapr key (state key, lock resource id, election name, configuration key): not empty and
/// without `||`, the separator of prefixed stores' keys (the rule of
/// `dapr::StoreSpec::engine_key`, for every door).
#[derive(ToSchema)]
#[schema(value_type = String, pattern = r"^(\|?[^|])+\|?$|^\|$", example = "order-1")]
pub struct DaprKey(#[allow(dead_code)] String);

/// A version (HLC), as ETags, fencing tokens and event ids carry it:
/// `{ms}:{counter}:{node}`, decimal milliseconds and a counter up to 99999 (zero-padded as the
/// service writes them, or not), then a node that is neither empty nor holds `:` or a control
/// character. A fencing token may not be ahead of the service's clock by more than the allowed
/// skew (400).
#[derive(ToSchema)]
#[schema(
    value_type = String,
    pattern = r"^[0-9]{1,19}:[0-9]{1,5}:[^:\x00-\x1f\x7f-\x9f]+$",
    example = "001795380000000:00002:n1"
)]
pub struct Version(#[allow(dead_code)] String);

/// An ETag: a [`Version`], optionally in double quotes (as HTTP quotes ETags); empty is none.
#[derive(ToSchema)]
#[schema(
    value_type = String,
    pattern = r#"^("*[0-9]{1,19}:[0-9]{1,5}:[^:\x00-\x1f\x7f-\x9f]*[^:"\x00-\x1f\x7f-\x9f]"*)?$"#,
    example = "001795380000000:00002:n1"
)]
pub struct Etag(#[allow(dead_code)] String);

/// Metadata of a write (item metadata, a transaction's metadata, `metadata.<name>` query
/// parameters). Values may be `null` (read as `""`); names other than these are accepted and
/// ignored.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct WriteMetadata {
    /// Time to live in whole seconds, 1 to 3153600000 (100 years), or `-1` (or empty) for none.
    #[schema(
        pattern = r"^\s*(-0*1|\+?0*([1-9][0-9]{0,8}|[12][0-9]{9}|30[0-9]{8}|31[0-4][0-9]{7}|315[0-2][0-9]{6}|3153[0-5][0-9]{5}|3153600000))?\s*$",
        example = "60"
    )]
    #[schema(rename = "ttlInSeconds")]
    ttl_in_seconds: Option<String>,
    /// The fencing token the write is made under (a [`Version`]; the key then requires one).
    #[schema(rename = "fencingToken", required = false)]
    fencing_token: Version,
    /// `true` (any case): every read pushes the deadline out by the TTL again; needs
    /// `ttlInSeconds` (a stategate extension).
    #[schema(pattern = r"^\s*([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])?\s*$")]
    #[schema(rename = "ttlSliding")]
    ttl_sliding: Option<String>,
    /// `base64` (any case): the item's value is a JSON string holding the base64 (standard,
    /// padded) of the bytes to store (a stategate extension).
    #[schema(pattern = r"^[Bb][Aa][Ss][Ee]64$")]
    #[schema(rename = "contentEncoding", required = false)]
    content_encoding: String,
}

/// A string map where the map or any value may be `null` (a `null` value is `""`).
fn string_map<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<String, String>, D::Error> {
    let map = Option::<HashMap<String, Option<String>>>::deserialize(d)?.unwrap_or_default();
    Ok(map.into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect())
}

/// `options` of a state item.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StateOptions {
    /// `first-write` or `last-write` (default; also empty).
    #[schema(value_type = Option<String>, pattern = "^(first-write|last-write)?$")]
    pub concurrency: Option<String>,
    /// `eventual` or `strong` (the same here: writes are linearizable; also empty).
    #[schema(value_type = Option<String>, pattern = "^(eventual|strong)?$")]
    pub consistency: Option<String>,
}

/// One item of a save request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct SaveItem {
    #[schema(value_type = DaprKey, required = true)]
    pub key: Option<String>,
    /// Any JSON value; stored as its JSON text without the whitespace between tokens (numbers
    /// and strings exactly as sent). Absent or `null`: stored as `null`. With metadata
    /// `contentEncoding: base64`, a JSON string holding base64.
    #[schema(value_type = serde_json::Value)]
    #[serde(default)]
    pub value: Option<Box<RawValue>>,
    /// The ETag (an HLC version) the key must have; empty or `null`: none.
    #[schema(value_type = Option<Etag>)]
    pub etag: Option<String>,
    #[schema(value_type = Option<WriteMetadata>)]
    #[serde(default, deserialize_with = "string_map")]
    pub metadata: HashMap<String, String>,
    #[schema(value_type = Option<StateOptions>)]
    #[serde(default, deserialize_with = "object_or_null")]
    pub options: StateOptions,
    /// Accepted for daprd compatibility and type-checked as daprd's decoder does (a wrong type
    /// is a 400); the stored bytes say what they are.
    #[serde(rename = "contentType")]
    pub content_type: Option<String>,
}

/// Bulk get request.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct BulkGetRequest {
    /// `null`: none (the answer is `[]`). At most `--max-bulk-keys` (default 10000).
    #[schema(value_type = Option<Vec<DaprKey>>, required = true)]
    #[serde(deserialize_with = "null_as_empty")]
    pub keys: Vec<String>,
    /// Type-checked as daprd does (a wrong type is a 400), otherwise unused: every key is read
    /// from one engine.
    #[serde(default, deserialize_with = "whole_or_null")]
    pub parallelism: Option<i64>,
    /// Type-checked as daprd does (string values, or `null`); no read takes metadata.
    #[schema(value_type = Option<HashMap<String, Option<String>>>)]
    #[serde(default, deserialize_with = "string_map")]
    pub metadata: HashMap<String, String>,
}

/// One item of a bulk get answer. A missing key is `{"key": "..."}` alone.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BulkItem {
    pub key: String,
    /// The value: JSON as stored, or a base64 string (metadata `contentEncoding: base64`).
    #[schema(value_type = serde_json::Value)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Box<RawValue>>,
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
    #[schema(pattern = "^(upsert|delete)$")]
    pub operation: String,
    pub request: SaveItem,
}

/// Transaction request.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct TransactionRequest {
    /// `null`: none (nothing is done). At most `--max-transaction-ops` (default 100000).
    #[schema(value_type = Option<Vec<TransactionOperation>>, required = true)]
    #[serde(deserialize_with = "null_as_empty")]
    pub operations: Vec<TransactionOperation>,
    /// Metadata of every operation (it wins over an operation's own).
    #[schema(value_type = Option<WriteMetadata>)]
    #[serde(default, deserialize_with = "string_map")]
    pub metadata: HashMap<String, String>,
}

/// One query result.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueryItem {
    pub key: String,
    /// The value: JSON as stored, or a base64 string (metadata `contentEncoding: base64`).
    #[schema(value_type = serde_json::Value)]
    pub data: Box<RawValue>,
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

/// One server-sent event's data (`set`, `delete`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChangeEvent {
    pub key: String,
    /// The new value (on `set`).
    #[schema(value_type = serde_json::Value)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Box<RawValue>>,
    /// The key's version (for a change, equal to the event id).
    pub etag: String,
    /// `expired` when a delete came from expiry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HashMap<String, String>>,
    /// `true` on events sent while a snapshot is in progress (a key's current value, or a
    /// change that came meanwhile): no resume position, their event id repeats the one asked.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub snapshot: bool,
}

/// The `reset` event's data: the position asked for is not in the history kept; forget the
/// keys you know, a snapshot follows (`set` events, then `synced`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResetEvent {
    /// The version that was asked for (`Last-Event-ID` or `since`).
    pub since: String,
    pub message: String,
}

/// The `synced` event's data: the snapshot is complete. Its event id (also `since` here) is the
/// position to resume from; absent when the service keeps no history.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SyncedEvent {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
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

/// An `int32` as protojson reads it: a JSON number without a fraction, or a string holding one;
/// `null` is 0. Outside the int32 range is an error, as for daprd.
fn proto_int32<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    let n = match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => return Ok(0),
        Some(serde_json::Value::Number(n)) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e10)
                .map(|f| f as i64)
        }),
        Some(serde_json::Value::String(s)) => s.trim().parse::<i64>().ok(),
        Some(_) => None,
    };
    n.filter(|n| i32::try_from(*n).is_ok())
        .ok_or_else(|| D::Error::custom("expiryInSeconds is not a 32-bit integer"))
}

/// `POST /v1.0-alpha1/lock/{store}` body. Field names as daprd reads them (protojson: the JSON
/// names, or the proto names); unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct TryLockRequest {
    /// The lock's name (a key of the lock store).
    #[schema(value_type = DaprKey, required = true)]
    #[serde(rename = "resourceId", alias = "resource_id", default)]
    pub resource_id: Option<String>,
    /// Who takes it; stored as the key's value (an AIO leased lock's holder name).
    #[schema(value_type = String, required = true, min_length = 1)]
    #[serde(rename = "lockOwner", alias = "lock_owner", default)]
    pub lock_owner: Option<String>,
    /// How long the lock lasts, whole seconds (positive; a JSON number, or a string holding
    /// one, as protojson reads an int32).
    #[serde(
        rename = "expiryInSeconds",
        alias = "expiry_in_seconds",
        default,
        deserialize_with = "proto_int32"
    )]
    #[schema(value_type = i32, required = true, minimum = 1)]
    pub expiry_in_seconds: i64,
}

/// TryLock answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TryLockResponse {
    pub success: bool,
}

/// `POST /v1.0-alpha1/unlock/{store}` body.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct UnlockRequest {
    #[schema(value_type = DaprKey, required = true)]
    #[serde(rename = "resourceId", alias = "resource_id", default)]
    pub resource_id: Option<String>,
    #[schema(value_type = String, required = true, min_length = 1)]
    #[serde(rename = "lockOwner", alias = "lock_owner", default)]
    pub lock_owner: Option<String>,
}

/// Unlock answer: 0 SUCCESS, 1 LOCK_DOES_NOT_EXIST, 2 LOCK_BELONGS_TO_OTHERS, 3 INTERNAL_ERROR.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UnlockResponse {
    pub status: i32,
}

/// One configuration item.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConfigurationItem {
    /// The stored bytes as text (base64 with metadata `contentEncoding: base64` when not UTF-8;
    /// empty for a deleted key).
    pub value: String,
    /// The key's HLC version (for a deletion: the deletion's).
    pub version: String,
    /// `ttlExpireTime`, `contentEncoding`; `deleted` (and `expired`) on a deletion.
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub metadata: HashMap<String, String>,
}

/// A configuration subscription's event data (`subscribe`: the id alone; `update`: changed
/// items, as daprd posts them to an app).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConfigurationUpdate {
    pub id: String,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub items: HashMap<String, ConfigurationItem>,
}

/// Unsubscribe answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UnsubscribeResponse {
    pub ok: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
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
    /// Not stored: the key is protected by a fencing token the record does not match (send
    /// `overwriteFenced=true` to replace it anyway).
    #[serde(default)]
    pub fenced: u64,
    /// Not stored: expired already.
    pub expired: u64,
}

/// `POST /v1.0-alpha1/election/{store}/campaign` body (a stategate extension).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CampaignRequest {
    /// The election's name: a key of the lock store, the same key a lock on that name uses.
    #[schema(value_type = DaprKey)]
    pub name: String,
    /// Who campaigns, stored as the lease's value (an AIO leased lock's holder name): not
    /// empty, no newline.
    #[schema(pattern = "^[^\\n]+$")]
    pub holder: String,
    /// What the leader proclaims once elected.
    #[serde(default)]
    pub value: Option<String>,
    /// The lease's time to live, ms: 1 to 3153600000000 (100 years); the leader renews it
    /// before it runs out.
    #[schema(value_type = i64, minimum = 1, maximum = 3153600000000.0)]
    #[serde(rename = "ttlMs", deserialize_with = "non_negative")]
    pub ttl_ms: u64,
    /// How long to wait while someone else leads, ms (default 0: one attempt). The request
    /// timeout bounds it: a campaign answers before it.
    #[schema(value_type = i64, minimum = 0)]
    #[serde(rename = "waitMs", default, deserialize_with = "non_negative")]
    pub wait_ms: u64,
}

/// `POST /v1.0-alpha1/election/{store}/proclaim` body.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProclaimRequest {
    #[schema(value_type = DaprKey)]
    pub name: String,
    #[schema(pattern = "^[^\\n]+$")]
    pub holder: String,
    /// The fencing token campaign returned.
    #[schema(value_type = Version)]
    pub token: String,
    pub value: String,
}

/// `POST /v1.0-alpha1/election/{store}/resign` body.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResignRequest {
    #[schema(value_type = DaprKey)]
    pub name: String,
    #[schema(pattern = "^[^\\n]+$")]
    pub holder: String,
}

/// Who leads an election.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ElectionLeader {
    pub holder: String,
    /// What the leader proclaimed (absent: nothing, e.g. a leased-lock holder).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The leadership's fencing token (pass it as metadata `fencingToken` on state writes).
    pub token: String,
    /// The lease's current version (each renewal changes it).
    #[serde(rename = "leaseVersion")]
    pub lease_version: String,
    /// The lease's deadline (RFC 3339).
    #[serde(rename = "ttlExpireTime", skip_serializing_if = "Option::is_none")]
    pub ttl_expire_time: Option<String>,
    /// Elected by campaign; false for a lease taken as a leased lock (over MQTT, `stategate
    /// lock`, the Dapr lock API), whose token is the lease's current version.
    pub campaigned: bool,
}

/// Campaign's answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CampaignResponse {
    /// Whether the caller leads now.
    pub elected: bool,
    /// The caller when elected; otherwise who leads (null: nobody, just released).
    pub leader: Option<ElectionLeader>,
}

/// The leader route's answer, and each `leader` event of observe.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaderResponse {
    /// Null when nobody leads.
    pub leader: Option<ElectionLeader>,
}

/// Proclaim's and resign's answer: `SUCCESS`, `NO_LEADER` (nobody holds the lease) or
/// `NOT_LEADER` (someone else does, or the token belongs to an earlier leadership).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ElectionStatus {
    pub status: &'static str,
}

/// One record of `POST /v1.0-alpha1/stategate/import` (a line of the export): the document's
/// view of `dump::decode_line`, which reads it. Each record is one line of the body.
#[derive(ToSchema)]
#[schema(title = "ImportRecord")]
#[allow(dead_code)]
pub struct ImportRecord {
    /// The key: text, or with `key_base64` the base64 of its bytes; not empty.
    #[schema(min_length = 1)]
    key: String,
    /// `true`: `key` is base64 (a key that is not UTF-8).
    #[schema(required = false)]
    key_base64: bool,
    /// The value's bytes, base64 (standard alphabet, padded).
    #[schema(pattern = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$")]
    value: String,
    /// The record's version, kept as it is (not ahead of the service's clock by more than the
    /// allowed skew).
    #[schema(value_type = Version)]
    version: String,
    /// The fencing token protecting the key (same bound as `version`).
    #[schema(value_type = Option<Version>)]
    fencing_token: Option<String>,
    /// The absolute deadline, ms since the epoch (at most 100 years from now); already past:
    /// the record is counted as expired.
    #[schema(minimum = 0)]
    expires_at_ms: Option<u64>,
    /// A sliding expiry's time to live, ms (at least 1; needs `expires_at_ms`).
    #[schema(minimum = 1)]
    slide_ms: Option<u64>,
}
