//! The one integration test binary: real brokers, real ports, real peer clients.

mod aio;
mod cli;
mod dapr_conformance;
mod durability;
mod grpc;
mod http;
mod http_fuzz;
mod mqtt;
mod openapi;
mod support;
