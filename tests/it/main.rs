//! The one integration test binary: real brokers, real ports, real peer clients.

mod access_rules;
mod aio;
mod cli;
mod console;
mod dapr_conformance;
mod deploy;
mod disk_full;
mod durability;
mod grpc;
mod http;
mod http_fuzz;
mod inbroker;
mod mqtt;
mod mqtt_auth;
mod openapi;
mod ops;
mod redis;
mod resources;
mod scaleout;
mod support;
mod transfer;
