//! stategate: one state store engine served over MQTT5 (the Azure IoT Operations state store
//! protocol), HTTP and gRPC.
//!
//! Layout (dependencies point downwards only):
//! - [`mqtt`]: the MQTT5 door (request/response envelope, notifications, embedded broker).
//! - [`resp3`]: the sans-I/O payload codec the MQTT door speaks.
//! - [`engine`]: commands, rules, versions, fencing, expiry, change feed.
//! - [`storage`]: records behind a conditional-swap interface.
//! - [`hlc`]: hybrid logical clocks.

pub mod engine;
pub mod hlc;
pub mod mqtt;
pub mod resp3;
pub mod storage;
