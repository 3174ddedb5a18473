//! The real binary on `redis+sentinel://`: a primary, a replica and two sentinels (real
//! `redis-server` processes, sentinels with `--sentinel`) on free loopback ports. Writes go on
//! while `SENTINEL FAILOVER` moves the primary; with `--redis-wait-replicas 1` every
//! acknowledged write is on the new primary afterwards, every refused one was a 503, and the
//! service answers again without a restart.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::redis::server::{Flavor, TestServer};
use crate::support::{WAIT, free_port};

const SERVICE: &str = "stategate-primary";

/// How long a failover may take: Sentinel promotes within a few seconds, and the service
/// follows within its call bound.
const FAILOVER_WITHIN: Duration = Duration::from_secs(30);

/// A sentinel monitoring `SERVICE`; killed on drop.
struct Sentinel {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    async fn start(primary: u16) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        // Sentinel rewrites its configuration file, so it must be its own and writable.
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n\
                 sentinel down-after-milliseconds {SERVICE} 2000\n\
                 sentinel failover-timeout {SERVICE} 10000\n",
                dir = dir.path().display()
            ),
        )
        .unwrap();
        let child = Command::new(Flavor::Redis.binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        let sentinel = Sentinel { port, child, _dir: dir };
        // It answers once it runs; it knows the replicas once it has read the primary's INFO.
        poll("the sentinel knows the replica", WAIT, || async {
            let replicas: Vec<Vec<String>> = sentinel
                .ask(redis::cmd("SENTINEL").arg("replicas").arg(SERVICE))
                .await
                .ok()?;
            let healthy = replicas.iter().filter(|fields| {
                let flags = field(fields, "flags").unwrap_or_default();
                flags == "slave"
            });
            (healthy.count() == 1).then_some(())
        })
        .await;
        sentinel
    }

    async fn ask<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port))?;
        let mut c = client.get_multiplexed_async_connection().await?;
        cmd.query_async(&mut c).await
    }

    /// The port of the primary it names.
    async fn primary(&self) -> Option<u16> {
        let named: Option<(String, u16)> = self
            .ask(redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(SERVICE))
            .await
            .ok()?;
        named.map(|(_, port)| port)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `name` in a flat `[name, value, ...]` reply.
fn field(fields: &[String], name: &str) -> Option<String> {
    fields.chunks(2).find(|p| p[0] == name).map(|p| p[1].clone())
}

/// Polls an outside process (there is no event to await) until `check` answers, at most
/// `patience`.
async fn poll<T, F, Fut>(what: &str, patience: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let give_up = Instant::now() + patience;
    loop {
        if let Some(done) = check().await {
            return done;
        }
        assert!(Instant::now() < give_up, "{what}: not within {patience:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn raw(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Makes `replica` follow `primary` and waits until its link is up.
async fn follow(replica: &TestServer, primary: &TestServer) {
    let mut r = raw(replica.port).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query_async(&mut r)
        .await
        .unwrap();
    poll("the replica syncs", WAIT, || {
        let mut r = r.clone();
        async move {
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut r).await.ok()?;
            info.contains("master_link_status:up").then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_loses_no_acknowledged_write_and_the_service_follows() {
    // reqwest's TLS takes the process's provider; no service runs in this process to install it.
    stategate::tls::install_provider();
    let primary = TestServer::start(Flavor::Redis);
    // One replica, so `WAIT 1` means "on every replica Sentinel could promote". (With two,
    // a write to the old primary after the promotion is still confirmed by the other replica,
    // which then resyncs from the new primary and drops it: this test caught exactly that.)
    // After the failover `WAIT 1` is met again once Sentinel has turned the old primary into
    // a replica of the new one, some seconds later: writes are refused with 503 until then.
    let replica = TestServer::start(Flavor::Redis);
    follow(&replica, &primary).await;
    let sentinels = [Sentinel::start(primary.port).await, Sentinel::start(primary.port).await];

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stategate.log");
    let http = free_port();
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/{SERVICE}",
        sentinels[0].port, sentinels[1].port
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(["--storage", &url])
        .args(["--redis-wait-replicas", "1", "--redis-timeout-ms", "1000"])
        .args(["--http-listen", &format!("127.0.0.1:{http}"), "--grpc-listen", "off"])
        .args(["--mqtt-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "stategate=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn stategate");
    let state = format!("http://127.0.0.1:{http}/v1.0/state/statestore");
    let c = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let give_up = Instant::now() + WAIT;
    while c
        .get(format!("http://127.0.0.1:{http}/v1.0/healthz"))
        .send()
        .await
        .is_err()
    {
        let exited = child.try_wait().unwrap();
        if exited.is_some() || Instant::now() > give_up {
            let _ = child.kill();
            panic!(
                "stategate did not serve ({exited:?}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        // Polling a child process: no event to await.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A writer that never stops on its own: one key per write, every answer recorded.
    let answers: Arc<Mutex<Vec<(u32, u16)>>> = Default::default();
    let writer = {
        let (c, state, answers) = (c.clone(), state.clone(), answers.clone());
        tokio::spawn(async move {
            for i in 0.. {
                let status = c
                    .post(&state)
                    .json(&json!([{"key": format!("k{i}"), "value": i}]))
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16());
                answers.lock().unwrap().push((i, status));
            }
        })
    };
    let acked = |answers: &Mutex<Vec<(u32, u16)>>| answers.lock().unwrap().iter().filter(|a| a.1 == 204).count();
    poll("writes before the failover", WAIT, || async {
        (acked(&answers) >= 20).then_some(())
    })
    .await;

    // The failover: one sentinel promotes a replica; every sentinel then names it.
    let _: () = sentinels[0]
        .ask(redis::cmd("SENTINEL").arg("FAILOVER").arg(SERVICE))
        .await
        .expect("SENTINEL FAILOVER");
    let promoted = poll("the sentinels name a new primary", FAILOVER_WITHIN, || async {
        let (a, b) = (sentinels[0].primary().await?, sentinels[1].primary().await?);
        (a == b && a != primary.port).then_some(a)
    })
    .await;
    assert_eq!(promoted, replica.port);

    // The service answers again by itself: 20 writes in a row acknowledged after the switch.
    let switched = answers.lock().unwrap().len();
    poll("the service writes again", FAILOVER_WITHIN, || async {
        let answers = answers.lock().unwrap();
        let after = &answers[switched.min(answers.len())..];
        let in_a_row = after.iter().rev().take_while(|a| a.1 == 204).count();
        (in_a_row >= 20).then_some(())
    })
    .await;
    writer.abort();
    let _ = writer.await;

    let answers = answers.lock().unwrap().clone();
    let refused: Vec<_> = answers.iter().filter(|a| a.1 != 204).collect();
    assert!(
        refused.iter().all(|a| a.1 == 503),
        "a write was refused with something else than 503: {refused:?}"
    );
    // Every acknowledged write is on the new primary (read directly, and through the service).
    let mut on_new = raw(promoted).await;
    for (i, _) in answers.iter().filter(|a| a.1 == 204) {
        let stored: Option<String> = redis::cmd("HGET")
            .arg(format!("stategate:r:k{i}"))
            .arg("v")
            .query_async(&mut on_new)
            .await
            .unwrap();
        assert_eq!(stored, Some(i.to_string()), "acknowledged k{i} lost in the failover");
    }
    let last = answers.iter().rev().find(|a| a.1 == 204).unwrap().0;
    let r = c.get(format!("{state}/k{last}")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), last.to_string());
    // The service moved because the sentinels named another primary, not only because the old
    // one refused writes (without WAIT, writes there would be lost).
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("sentinel names another redis primary"),
        "the primary watcher did not act: {text}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
