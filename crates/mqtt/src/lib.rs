//! The MQTT5 door: the Azure IoT Operations state store protocol.
//!
//! - [`request`]: the envelope and the pure request handler (unit-tested without a broker).
//! - [`payload`]: engine replies and errors as RESP bytes.
//! - [`service`]: the connection to a broker: one task polls and only forwards, others execute,
//!   answer, acknowledge in receive order, and publish KEYNOTIFY notifications.
//! - [`mirror`]: state as MQTT topics (`--state-topics`), retained, and set by publish.
//! - `broker`: the embedded rmqtt broker (feature `embedded-broker`).

use stategate_access as access;
use stategate_engine as engine;
use stategate_hlc as hlc;
use stategate_net::tls;
use stategate_resp3 as resp3;
#[cfg(test)]
use stategate_storage as storage;
use stategate_telemetry::metrics;

#[cfg(feature = "embedded-broker")]
pub mod broker;
#[cfg(feature = "embedded-broker")]
pub mod brokerauth;
mod dedup;
pub mod door;
#[cfg(feature = "embedded-broker")]
pub mod inbroker;
pub mod mirror;
mod observe;
pub mod payload;
pub mod request;
pub mod service;

pub use crate::resp3::envelope::{INVOKE_TOPIC, NOTIFY_TOPIC_PREFIX};

/// Which part of a client certificate names an MQTT client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CertIdentity {
    /// The subject's common name.
    Cn,
    /// The whole subject distinguished name.
    Subject,
}
