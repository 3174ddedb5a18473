//! Durability of the real binary: `kill -9` in the middle of a write load, and logs cut at
//! arbitrary offsets. Each test spawns `stategate` on its own data directory and free port.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use stategate::hlc::Hlc;
use stategate::resp3::Frame;
use tokio::sync::mpsc;

use crate::support::{INVOKE, WAIT, now_ts, prop, uuid_like};

/// Requests in flight during the crash test.
const IN_FLIGHT: usize = 64;
/// Keys per in-flight slot: a key has at most one request in flight, so its acknowledged
/// writes are ordered.
const KEYS_PER_SLOT: usize = 4;
const VALUE_LEN: usize = 100;

/// Only the MQTT door, on a port the embedded broker picks (the service logs it): the other
/// doors' fixed default ports would collide between tests. Durable storage with fsync always,
/// whatever the environment says. No colours in the log, which the tests read.
const SERVICE_ENV: [(&str, &str); 7] = [
    ("STATEGATE_HTTP_LISTEN", "off"),
    ("STATEGATE_GRPC_LISTEN", "off"),
    ("STATEGATE_STORAGE", "durable"),
    ("STATEGATE_FSYNC", "always"),
    // Small log segments: snapshots run all the time, so kills land in the middle of them too.
    ("STATEGATE_SEGMENT_BYTES", "65536"),
    ("RUST_LOG", "stategate=info"),
    ("NO_COLOR", "1"),
];

/// The service's own word that it serves: logged once every door is ready.
const SERVING: &str = "stategate is serving the state store over MQTT";
/// Logged by the MQTT door once its request subscription is acknowledged.
const SUBSCRIBED: &str = "mqtt: subscribed";
/// ... or, with the embedded broker, its hooks serve requests (no subscription of its own).
const IN_BROKER: &str = "serving the state store inside the embedded broker";

/// The service as a child process. Dropping it kills it without waiting: call [`Service::kill`]
/// before starting another on the same directory.
struct Service {
    child: tokio::process::Child,
}

impl Service {
    /// Spawns the binary on `dir` and waits for its log line saying it serves (after the line
    /// saying its MQTT subscription is acknowledged); that line names the port. The log (on
    /// stderr, with fatal errors) is copied to `<dir>.log` by a task until the process exits;
    /// stdout (nothing is expected there) goes there directly.
    async fn start(dir: &Path) -> (Service, Pipe) {
        Service::start_with(dir, &[]).await
    }

    /// [`Service::start`] with more environment variables.
    async fn start_with(dir: &Path, env: &[(&str, &std::ffi::OsStr)]) -> (Service, Pipe) {
        let errors = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.with_extension("log"))
            .expect("service log");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
            .args(["--mqtt-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir)
            .envs(SERVICE_ENV)
            .envs(env.iter().copied())
            .stdout(errors)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn stategate");
        let log = child.stderr.take().expect("stategate's stderr");
        let (port_tx, port) = tokio::sync::oneshot::channel();
        tokio::spawn(copy_log(log, dir.with_extension("log"), port_tx));
        let port = match tokio::time::timeout(3 * WAIT, port).await {
            Ok(Ok(Ok(port))) => port,
            Ok(Ok(Err(line))) => panic!(
                "stategate serves without its MQTT subscription: {line}\n{}",
                log_tail(dir)
            ),
            Ok(Err(_)) => panic!("stategate exited during startup; its log ends with:\n{}", log_tail(dir)),
            Err(_) => panic!("stategate did not start in time; its log ends with:\n{}", log_tail(dir)),
        };
        let pipe = Pipe::connect(port).await.expect("a connection to the service");
        (Service { child }, pipe)
    }

    /// SIGKILL: no shutdown code runs. Returns once the process is gone.
    async fn kill(&mut self) {
        let _ = self.child.start_kill();
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("stategate exits after SIGKILL")
            .expect("wait for stategate");
    }
}

/// Appends the service's log lines to `path`; sends the port from the line saying it serves
/// (`Err(line)` if that came before the MQTT subscription was acknowledged).
async fn copy_log(
    log: tokio::process::ChildStderr,
    path: PathBuf,
    port: tokio::sync::oneshot::Sender<Result<u16, String>>,
) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .await
        .expect("service log");
    let mut lines = tokio::io::BufReader::new(log).lines();
    let mut port = Some(port);
    let mut subscribed = false;
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = file.write_all(format!("{line}\n").as_bytes()).await;
        subscribed |= line.contains(SUBSCRIBED) || line.contains(IN_BROKER);
        if line.contains(SERVING)
            && let Some(tx) = port.take()
        {
            let found = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("port=")?.parse().ok())
                .ok_or_else(|| line.clone());
            let _ = tx.send(if subscribed { found } else { Err(line.clone()) });
        }
    }
}

fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
    let mut tail: Vec<&str> = log.lines().rev().take(10).collect();
    tail.reverse();
    tail.join("\n")
}

/// A raw MQTT5 client that keeps many requests in flight; nothing here panics on a dead peer.
struct Pipe {
    client: AsyncClient,
    responses: mpsc::UnboundedReceiver<Publish>,
    topic: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request's outcome.
#[derive(Debug)]
struct Answer {
    frame: Frame,
    version: Option<Hlc>,
}

impl Pipe {
    async fn connect(port: u16) -> Option<Pipe> {
        let id = crate::support::unique_id("durability");
        let mut o = MqttOptions::new(&id, "127.0.0.1", port);
        o.set_max_packet_size(Some(1024 * 1024));
        o.set_keep_alive(Duration::from_secs(30));
        o.set_clean_start(true);
        let (client, mut eventloop) = AsyncClient::new(o, 4096);
        let (tx, responses) = mpsc::unbounded_channel();
        let (ready_tx, mut ready) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ready_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        let topic = format!("clients/{id}/durability/response");
        client.subscribe(&topic, QoS::AtLeastOnce).await.ok()?;
        // Bounded by WAIT like every other wait here: a loaded machine may take seconds to
        // answer the first SUBSCRIBE of a service that just started.
        tokio::time::timeout(WAIT, ready.recv()).await.ok()??;
        Some(Pipe {
            client,
            responses,
            topic,
            task,
        })
    }

    /// Publishes a request; returns its correlation data.
    async fn send(&self, args: &[&[u8]]) -> Option<Bytes> {
        let corr = Bytes::from(uuid_like());
        let props = PublishProperties {
            response_topic: Some(self.topic.clone()),
            correlation_data: Some(corr.clone()),
            user_properties: vec![
                ("__srcId".into(), "durability-test".into()),
                ("__protVer".into(), "1.0".into()),
                ("__ts".into(), now_ts()),
            ],
            message_expiry_interval: Some(30),
            ..Default::default()
        };
        let payload = stategate::resp3::encode_request(args);
        self.client
            .publish_with_properties(INVOKE, QoS::AtLeastOnce, false, payload, props)
            .await
            .ok()?;
        Some(corr)
    }

    /// The next answer, with its correlation data; `None` if the connection is gone or quiet.
    async fn next(&mut self) -> Option<(Bytes, Answer)> {
        self.next_within(WAIT).await
    }

    async fn next_within(&mut self, wait: Duration) -> Option<(Bytes, Answer)> {
        let p = tokio::time::timeout(wait, self.responses.recv()).await.ok()??;
        let corr = p.properties.as_ref()?.correlation_data.clone()?;
        let frame = stategate::resp3::decode(&p.payload).ok()?;
        let version = prop(&p, "__ts").and_then(|v| v.parse().ok());
        Some((corr, Answer { frame, version }))
    }

    /// One request and its answer, or `None` after `wait`.
    async fn request(&mut self, args: &[&[u8]], wait: Duration) -> Option<Answer> {
        let corr = self.send(args).await?;
        loop {
            let (c, a) = self.next_within(wait).await?;
            if c == corr {
                return Some(a);
            }
        }
    }

    async fn get(&mut self, key: &[u8]) -> Option<Answer> {
        self.request(&[b"GET", key], WAIT).await
    }

    async fn set(&mut self, key: &[u8], value: &[u8]) -> Option<Answer> {
        self.request(&[b"SET", key, value], WAIT).await
    }
}

/// A small deterministic generator, seeded per run (the seed is printed to replay a failure).
struct Rng(u64);

impl Rng {
    fn from_time() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        eprintln!("durability seed: {seed}");
        Rng(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn key(slot: usize, j: usize) -> String {
    format!("crash-{slot:02}-{j}")
}

/// `key:seq:` padded with `x`: a value that shows whether it is whole.
fn value(key: &str, seq: u64) -> Vec<u8> {
    let mut v = format!("{key}:{seq}:").into_bytes();
    v.resize(VALUE_LEN, b'x');
    v
}

fn parse_value(key: &str, v: &[u8]) -> Option<u64> {
    let rest = v.strip_prefix(format!("{key}:").as_bytes())?;
    let colon = rest.iter().position(|&c| c == b':')?;
    let seq = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
    (v == value(key, seq).as_slice()).then_some(seq)
}

/// What the client knows about a key.
#[derive(Debug, Default, Clone)]
struct KeyState {
    /// The last sequence number sent.
    sent: u64,
    /// The last acknowledged write: sequence number and version.
    acked: Option<(u64, Hlc)>,
}

/// Keeps IN_FLIGHT SETs going until the connection dies (or a bound is reached). Every
/// acknowledged write is recorded in `keys` as it arrives.
async fn load(pipe: &mut Pipe, keys: &mut HashMap<String, KeyState>, acks: &mut u64) {
    let mut slots: HashMap<Bytes, (usize, String, u64)> = HashMap::new();
    let mut turn = vec![0usize; IN_FLIGHT];
    // The slot's next key and sequence number.
    fn send(slot: usize, keys: &mut HashMap<String, KeyState>, turn: &mut [usize]) -> (usize, String, u64) {
        let k = key(slot, turn[slot] % KEYS_PER_SLOT);
        turn[slot] += 1;
        let st = keys.entry(k.clone()).or_default();
        st.sent += 1;
        (slot, k, st.sent)
    }
    for slot in 0..IN_FLIGHT {
        let (slot, k, seq) = send(slot, keys, &mut turn);
        let Some(corr) = pipe.send(&[b"SET", k.as_bytes(), &value(&k, seq)]).await else {
            return;
        };
        slots.insert(corr, (slot, k, seq));
    }
    // Bounded: the caller kills the service well before this.
    for _ in 0..1_000_000 {
        let Some((corr, answer)) = pipe.next().await else {
            return;
        };
        let Some((slot, k, seq)) = slots.remove(&corr) else {
            continue;
        };
        match (&answer.frame, answer.version) {
            (Frame::Simple(ok), Some(version)) if ok == "OK" => {
                let st = keys.entry(k).or_default();
                st.acked = Some((seq, version));
                *acks += 1;
            }
            other => panic!("unexpected answer to SET {k}: {other:?}"),
        }
        let (slot, k, seq) = send(slot, keys, &mut turn);
        let Some(corr) = pipe.send(&[b"SET", k.as_bytes(), &value(&k, seq)]).await else {
            return;
        };
        slots.insert(corr, (slot, k, seq));
    }
}

/// Every acknowledged write is there, with its version or a later one, and whole.
async fn verify(pipe: &mut Pipe, keys: &HashMap<String, KeyState>) {
    let mut pending: HashMap<Bytes, &str> = HashMap::new();
    for k in keys.keys() {
        let corr = pipe.send(&[b"GET", k.as_bytes()]).await.expect("send GET");
        pending.insert(corr, k);
    }
    while !pending.is_empty() {
        let (corr, answer) = pipe.next().await.expect("an answer to every GET");
        let Some(k) = pending.remove(&corr) else { continue };
        let st = &keys[k];
        match (answer.frame, st.acked.as_ref()) {
            (Frame::Bulk(v), _) => {
                let seq = parse_value(k, &v).unwrap_or_else(|| panic!("{k}: a value that is not whole: {v:?}"));
                assert!(seq <= st.sent, "{k}: seq {seq} was never sent (last {})", st.sent);
                if let Some((acked_seq, acked_version)) = st.acked.as_ref() {
                    assert!(
                        seq >= *acked_seq,
                        "{k}: seq {seq} is older than acknowledged {acked_seq}"
                    );
                    let version = answer.version.unwrap_or_else(|| panic!("{k}: no version"));
                    assert!(
                        version >= *acked_version,
                        "{k}: version {version} is older than acknowledged {acked_version}"
                    );
                }
            }
            (Frame::Null, None) => {}
            (other, acked) => panic!("{k}: {other:?}, but {acked:?} was acknowledged"),
        }
    }
}

fn data_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    (tmp, dir)
}

/// Drives SETs with many in flight, kills the service with SIGKILL at a random moment,
/// restarts it and checks every acknowledged write; several times on one data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_write() {
    let (_tmp, dir) = data_dir();
    kill_9_rounds(&dir, &[]).await;
}

/// The same with encryption at rest: sealed records torn by the kill are cut like plain ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_write_when_encrypted() {
    let (tmp, dir) = data_dir();
    let key = key_file(tmp.path());
    kill_9_rounds(&dir, &[("STATEGATE_ENCRYPTION_KEY_FILE", key.as_os_str())]).await;
    assert_no_plaintext(&dir, b"crash-");
}

/// A key file of 32 random bytes, readable by its owner only.
pub fn key_file(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("store.key");
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).expect("random key");
    std::fs::write(&path, key).expect("write the key file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    path
}

/// No file of the data directory holds `needle`.
pub fn assert_no_plaintext(dir: &Path, needle: &[u8]) {
    for entry in std::fs::read_dir(dir).expect("data dir") {
        let path = entry.expect("entry").path();
        let data = std::fs::read(&path).expect("read a data file");
        assert!(
            !data.windows(needle.len()).any(|w| w == needle),
            "{} holds {:?} in the clear",
            path.display(),
            String::from_utf8_lossy(needle)
        );
    }
}

async fn kill_9_rounds(dir: &Path, env: &[(&str, &std::ffi::OsStr)]) {
    let dir = dir.to_path_buf();
    let mut rng = Rng::from_time();
    let mut keys: HashMap<String, KeyState> = HashMap::new();
    let mut total = 0;
    for round in 0..8 {
        let (mut service, mut pipe) = Service::start_with(&dir, env).await;
        verify(&mut pipe, &keys).await;
        // One write first, so that every round has an acknowledged write to check.
        let k = format!("round-{round}");
        let a = pipe.set(k.as_bytes(), &value(&k, 1)).await.expect("a SET answer");
        let version = a.version.expect("a version");
        keys.insert(
            k,
            KeyState {
                sent: 1,
                acked: Some((1, version)),
            },
        );

        let mut acks = 0;
        let kill_after = Duration::from_millis(100 + rng.below(900));
        tokio::select! {
            _ = load(&mut pipe, &mut keys, &mut acks) => panic!("the load ended before the kill"),
            _ = tokio::time::sleep(kill_after) => {}
        }
        service.kill().await;
        eprintln!("round {round}: killed after {kill_after:?} with {acks} SETs acknowledged");
        total += acks;
    }
    let (_service, mut pipe) = Service::start_with(&dir, env).await;
    verify(&mut pipe, &keys).await;
    let files: Vec<String> = std::fs::read_dir(&dir)
        .expect("data dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    eprintln!("{total} acknowledged SETs checked; data dir now: {files:?}");
}

/// Writes a history, then cuts the log at arbitrary offsets: the service starts every time and
/// serves a prefix of the history, and keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_anywhere_serves_a_prefix() {
    const N: usize = 30;
    let (tmp, dir) = data_dir();
    let key = |i: usize| format!("torn-{i:02}");
    {
        let (mut service, mut pipe) = Service::start(&dir).await;
        for i in 0..N {
            let a = pipe
                .set(key(i).as_bytes(), &value(&key(i), i as u64))
                .await
                .expect("SET");
            assert_eq!(a.frame, Frame::Simple("OK".into()));
        }
        service.kill().await;
    }
    let log = std::fs::read_dir(&dir)
        .expect("data dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a log segment");
    let pristine = std::fs::read(&log).expect("read log");
    let mut rng = Rng::from_time();
    let mut cuts: Vec<usize> = vec![0, 10, 16, pristine.len() - 1];
    cuts.extend((0..5).map(|_| 16 + rng.below((pristine.len() - 16) as u64) as usize));
    let mut prefixes = Vec::new();
    for cut in cuts {
        std::fs::write(&log, &pristine[..cut]).expect("cut the log");
        let (mut service, mut pipe) = Service::start(&dir).await;
        let mut present = Vec::new();
        for i in 0..N {
            let a = pipe.get(key(i).as_bytes()).await.expect("GET");
            match a.frame {
                Frame::Bulk(v) => {
                    assert_eq!(parse_value(&key(i), &v), Some(i as u64), "cut {cut}: {} whole", key(i));
                    present.push(i);
                }
                Frame::Null => {}
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        let m = present.len();
        assert_eq!(
            present,
            (0..m).collect::<Vec<_>>(),
            "cut {cut}: a prefix of the history"
        );
        if cut == pristine.len() - 1 {
            assert_eq!(m, N - 1, "only the last write was cut");
        }
        // The store takes writes after the cut.
        let a = pipe.set(b"after-cut", b"1").await.expect("SET after the cut");
        assert_eq!(a.frame, Frame::Simple("OK".into()));
        prefixes.push((cut, m));
        // Gone before the next start takes the directory.
        service.kill().await;
    }
    eprintln!("cuts and the prefixes served: {prefixes:?}");
    drop(tmp);
}

/// A damaged record in the middle of the log stops the service at startup with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruption_in_the_middle_is_a_startup_error() {
    let (_tmp, dir) = data_dir();
    {
        let (mut service, mut pipe) = Service::start(&dir).await;
        for i in 0..10 {
            let k = format!("c{i}");
            pipe.set(k.as_bytes(), &value(&k, 1)).await.expect("SET");
        }
        service.kill().await;
    }
    let log = std::fs::read_dir(&dir)
        .expect("data dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a log segment");
    let mut data = std::fs::read(&log).expect("read");
    let middle = data.len() / 2;
    data[middle] ^= 0xff;
    std::fs::write(&log, data).expect("write");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args(["--mqtt-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&dir)
        .envs(SERVICE_ENV)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn stategate");
    // Its exit, awaited; a service that starts anyway is killed (on drop) when the wait ends.
    let out = tokio::time::timeout(3 * WAIT, child.wait_with_output())
        .await
        .expect("stategate started on a corrupt log")
        .expect("wait for stategate");
    let (status, stderr) = (out.status, String::from_utf8_lossy(&out.stderr).into_owned());
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("storage is corrupt"), "{stderr}");
    assert!(
        stderr.contains(&*log.file_name().expect("name").to_string_lossy()),
        "{stderr}"
    );
}

/// A stopped service closes its store, so the same process can open the directory again (with
/// the embedded broker too: rmqtt keeps its hooks after it stops, and they must not keep the
/// engine alive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_service_releases_its_data_dir() {
    use stategate::storage::durable::{DurableBackend, DurableOptions};

    use crate::support::{Broker, Storage, TestEnv};

    for broker in [Broker::Mosquitto, Broker::Embedded] {
        let env = TestEnv::start_on(broker, Storage::Durable, |_| {}).await;
        let dir = env.stop_keeping_data().await.expect("a data dir");
        if let Err(e) = DurableBackend::open(DurableOptions::new(dir.path())) {
            panic!("{broker:?}: the stopped service still holds its store: {e}");
        }
    }
}
