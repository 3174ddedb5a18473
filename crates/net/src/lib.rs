//! What every door and client uses to reach the network, knowing no door: TLS (the crypto
//! provider, certificates and their reload) and the listeners of the HTTP and gRPC doors (TLS,
//! connection and in-flight limits, byte budgets), request ids, and broker URLs.

pub mod listener;
pub mod request_id;
pub mod tls;
pub mod url;
