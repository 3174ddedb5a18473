//! The one integration test binary: real brokers, real ports, real peer clients.

mod mqtt;
mod support;
