//! The MQTT5 door: the Azure IoT Operations state store protocol.
//!
//! - [`request`]: the envelope and the pure request handler (unit-tested without a broker).
//! - [`payload`]: engine replies and errors as RESP bytes.
//! - [`service`]: the connection to a broker: one task polls and only forwards, others execute,
//!   answer, acknowledge in receive order, and publish KEYNOTIFY notifications.
//! - `broker`: the embedded rmqtt broker (feature `embedded-broker`).

#[cfg(feature = "embedded-broker")]
pub mod broker;
#[cfg(feature = "embedded-broker")]
pub mod brokerauth;
mod dedup;
pub mod door;
#[cfg(feature = "embedded-broker")]
pub mod inbroker;
mod observe;
pub mod payload;
pub mod request;
pub mod service;

/// The topic requests arrive on.
pub const INVOKE_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
/// Notifications go below this prefix; no response may be published there.
pub const NOTIFY_TOPIC_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";
