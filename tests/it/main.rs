//! The one integration test binary: real brokers, real ports, real peer clients.

mod aio;
mod cli;
mod console;
mod dapr_conformance;
mod deploy;
mod durability;
mod grpc;
mod http;
mod http_fuzz;
mod inbroker;
mod mqtt;
mod openapi;
mod ops;
mod redis;
mod support;
