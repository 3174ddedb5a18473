//! The Azure IoT Operations SDK scenarios of `aio.rs`, unchanged, against three replicas on
//! one redis-server whose MQTT requests are spread by one Mosquitto's shared subscription
//! ([`Broker::RedisReplicas`]): every request of a scenario may be served by any replica, so
//! CRUD with versions, NX/NEX, fencing, KEYNOTIFY incl. expiry, SCAN paging and lease/lock
//! handover must behave as on one service.

use std::sync::Arc;

use stategate::config::Config;
use stategate::storage::Store;

use crate::redis::server::{Flavor, TestServer};
use crate::support::{ShiftedClock, unique_id};

/// The share group every replica joins.
const SHARE_GROUP: &str = "stategate";

/// Redis and the replicas beside the [`crate::support::TestEnv`]'s own service.
pub(crate) struct Replicas {
    others: Vec<stategate::Running>,
    _redis: TestServer,
}

impl Replicas {
    /// Starts Redis and two replicas configured as `config` (after the test's tweaks), each
    /// with its own node and MQTT client id; makes `config` the first replica's and returns
    /// the store it serves from. Every replica runs on `clock`, so a test moving time moves it
    /// for all.
    pub(crate) async fn start(config: &mut Config, clock: &Arc<ShiftedClock>) -> (Replicas, Store) {
        let redis = TestServer::start(Flavor::Redis);
        config.storage = crate::redis::redis_storage(&redis);
        config.mqtt.share_group = Some(SHARE_GROUP.into());
        let run = unique_id("replicas");
        let mut others = Vec::new();
        for n in 1..3 {
            let mut c = config.clone();
            c.node_id = format!("node-{n}");
            c.mqtt.client_id = format!("{run}-{n}");
            let store = Store::open(&c.storage).await.expect("open redis storage");
            let running = stategate::start_with_clock(c, store, clock.clone())
                .await
                .expect("a replica starts");
            others.push(running);
        }
        config.node_id = "node-0".into();
        config.mqtt.client_id = format!("{run}-0");
        let store = Store::open(&config.storage).await.expect("open redis storage");
        (Replicas { others, _redis: redis }, store)
    }

    pub(crate) fn wake_expiry(&self) {
        for r in &self.others {
            r.engine().wake_expiry();
        }
    }

    /// Stops the other replicas, after checking that each of them (and `first`, the
    /// [`crate::support::TestEnv`]'s) served requests: the shared subscription spread them.
    pub(crate) async fn stop(self, first: Option<&stategate::engine::Engine>) {
        let engines = first.into_iter().chain(self.others.iter().map(|r| r.engine()));
        for (n, engine) in engines.enumerate() {
            let calls = engine.storage_round_trips().map_or(0, |r| r.calls);
            assert!(calls > 0, "replica {n} served no request");
        }
        for r in self.others {
            r.shutdown().await;
        }
    }
}

mod scenarios {
    use crate::support::Broker;

    macro_rules! on_replicas {
        ($($name:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    crate::aio::$name(Broker::RedisReplicas).await
                }
            )*
        };
    }

    on_replicas!(
        crud_versions,
        set_conditions,
        fencing_tokens,
        observe_notifications,
        scan_pages,
        lease_lifecycle,
        lock_release_handover,
        lock_expiry_handover,
    );
}
