//! The MQTT envelope of the Azure IoT Operations state store protocol, around the RESP3
//! payloads of this crate: topics and user properties, as the service and the command-line
//! client both speak them (no I/O, no MQTT library).

use bytes::Bytes;

/// The topic requests arrive on.
pub const INVOKE_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
/// Notifications go below this prefix; no response may be published there.
pub const NOTIFY_TOPIC_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

pub const PROP_STATUS: &str = "__stat";
pub const PROP_STATUS_MESSAGE: &str = "__stMsg";
pub const PROP_PROTOCOL_VERSION: &str = "__protVer";
pub const PROP_SOURCE_ID: &str = "__srcId";
pub const PROP_TIMESTAMP: &str = "__ts";
pub const PROP_FENCING_TOKEN: &str = "__ft";
/// Sent by the AIO SDKs on SET when the caller asks for the key to be persisted.
pub const PROP_PERSISTENCE: &str = "aio-persistence";
pub const PROP_PROPERTY_NAME: &str = "__propName";
pub const PROP_SUPPORTED_MAJOR: &str = "__supProtMajVer";
pub const PROP_REQUEST_PROTOCOL_VERSION: &str = "__requestProtVer";
pub const PROTOCOL_VERSION: &str = "1.0";
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// The topic a KEYNOTIFY notification for `key` goes to, for observer `client`.
pub fn notify_topic(client: &str, key: &[u8]) -> String {
    format!(
        "{NOTIFY_TOPIC_PREFIX}/{}/command/notify/{}",
        notify_topic_client_level(client),
        hex::encode_upper(key)
    )
}

/// The level of a notification topic that names its observer.
pub fn notify_topic_client_level(client: &str) -> String {
    hex::encode_upper(client.as_bytes())
}

/// A notification payload: `NOTIFY SET VALUE <v>` or `NOTIFY DELETE`.
pub fn notify_payload(value: Option<&Bytes>) -> Bytes {
    match value {
        Some(v) => crate::encode_request([&b"NOTIFY"[..], b"SET", b"VALUE", v]),
        None => crate::encode_request([&b"NOTIFY"[..], b"DELETE"]),
    }
}
