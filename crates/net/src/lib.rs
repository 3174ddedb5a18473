//! What every door and client uses to reach the network, knowing no door: TLS (the crypto
//! provider, certificates and their reload).

pub mod tls;
