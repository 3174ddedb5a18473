//! The one integration test binary: real brokers, real ports, real peer clients.

mod aio;
mod cli;
mod configuration;
mod console;
mod dapr_conformance;
mod dapr_json;
mod durability;
mod grpc;
mod http;
mod http_fuzz;
mod inbroker;
mod lock;
mod mqtt;
mod openapi;
mod pysdk;
mod redis;
mod support;
mod watch;
