//! The gRPC doors over a real port and a real Unix socket, through the generated tonic clients:
//! `statestore.v1.StateStore` (every RPC, Watch included), `dapr.proto.runtime.v1.Dapr` (every
//! state RPC and its status codes), health and reflection, the Dapr pluggable state component
//! API on its Unix socket (with its error contract), Watch across doors (MQTT and HTTP writes),
//! and the official Python Dapr SDK as a peer, cross-checked over MQTT with the official Azure
//! IoT Operations Rust SDK.
//!
//! Synchronisation: every wait is on an answer or a stream event, bounded by `support::WAIT`. A
//! Watch subscription is live once `watch()` returned: the server subscribes to the change feed
//! before it sends the response headers that `watch()` waits for.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stategate::grpc::pb::dapr::proto::common::v1 as common;
use stategate::grpc::pb::dapr::proto::components::v1 as cpb;
use stategate::grpc::pb::dapr::proto::runtime::v1 as rpb;
use stategate::grpc::pb::statestore::v1 as npb;
use stategate::hlc::Hlc;
use tokio::process::Command;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_types::{ErrorDetail, StatusExt};

use crate::support::{Broker, RawClient, Storage, TestEnv, WAIT, now_ts, prop, unique_id};

const STORE: &str = "statestore";

mod across;
mod component;
mod native;
mod peers;
mod reflection;
mod runtime;

pub(crate) use peers::{dapr_sdk_python, describe, pip_install, run_bounded};
// What one topic's tests lend the others (helpers are `pub(super)`).
use component::*;
use native::*;
use reflection::*;
use runtime::*;

type Native = npb::state_store_client::StateStoreClient<Channel>;
type Dapr = rpb::dapr_client::DaprClient<Channel>;

/// Awaits `f`, failing the test with `what` if it takes longer than `WAIT`.
async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

async fn channel(env: &TestEnv) -> Channel {
    within(
        "a gRPC connection",
        Endpoint::from_shared(env.grpc()).unwrap().connect(),
    )
    .await
    .expect("the gRPC door accepts connections")
}

async fn clients(env: &TestEnv) -> (Native, Dapr) {
    let ch = channel(env).await;
    (Native::new(ch.clone()), Dapr::new(ch))
}

/// The RPC must fail with `code`, and its message must contain `text`.
#[track_caller]
fn expect_status<T: std::fmt::Debug>(r: Result<tonic::Response<T>, Status>, code: Code, text: &str) -> Status {
    match r {
        Ok(v) => panic!("expected {code:?} ({text:?}), got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "status {s:?}");
            assert!(
                s.message().contains(text),
                "message {:?} should contain {text:?}",
                s.message()
            );
            s
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn hlc(s: &str) -> Hlc {
    s.parse().unwrap_or_else(|_| panic!("{s:?} is not a version"))
}

/// A version string `ms` milliseconds from now (negative: in the past).
fn token_at(offset_ms: i64, counter: u32) -> String {
    let ms = now_ms().saturating_add_signed(offset_ms);
    format!("{ms:015}:{counter:05}:client")
}
