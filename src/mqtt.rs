//! The MQTT5 door: the Azure IoT Operations state store protocol.

pub mod payload;
