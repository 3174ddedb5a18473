//! The flags of `stategate serve` (each also a `STATEGATE_*` variable and a key of the
//! configuration file), before validation: [`super::Config::from_args`] turns them into
//! settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};

use super::*;

/// Flags of `stategate serve`. Each one is also a key of the configuration file (its long
/// name), found by [`file`] from clap's own description: add a flag here and it is settable
/// from the file, printed by `config default` and checked by the deploy-file test.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// A TOML configuration file; flags and environment variables override what it sets.
    #[arg(long, env = "STATEGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to log: a level (`error`, `warn`, `info`, `debug`, `trace`) for stategate's own
    /// records, or a full filter such as `stategate=debug,rmqtt=info`. Absent: env RUST_LOG,
    /// else `info`.
    #[arg(long, env = "STATEGATE_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// How log records are written to stderr: `text` (colours only on a terminal) or `json`
    /// (one object per line).
    #[arg(long, env = "STATEGATE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// Serve Prometheus metrics at `/metrics` on this address too (its own port, no token),
    /// besides the HTTP door's `/metrics`. `off`: only on the HTTP door.
    #[arg(long, env = "STATEGATE_METRICS_LISTEN", default_value = "off")]
    pub metrics_listen: String,
    /// Record no metrics (`/metrics` answers 404).
    #[arg(long, env = "STATEGATE_NO_METRICS")]
    pub no_metrics: bool,
    /// On SIGTERM or Ctrl-C: how long in-flight requests may take to finish, and the embedded
    /// broker's clients to take the answers queued for them, before the service stops anyway
    /// (a second signal stops it at once), e.g. `10s`.
    #[arg(long, env = "STATEGATE_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// External MQTT broker, `mqtt://host:port`. Absent: run the embedded broker.
    #[arg(long, env = "STATEGATE_MQTT_URL")]
    pub mqtt_url: Option<String>,
    /// Where the embedded broker listens. An address other than loopback opens the broker to
    /// the network, without authentication.
    #[arg(long, env = "STATEGATE_MQTT_LISTEN", default_value = "127.0.0.1:1883")]
    pub mqtt_listen: SocketAddr,
    /// The service's MQTT client id.
    #[arg(long, env = "STATEGATE_MQTT_CLIENT_ID", default_value = "stategate")]
    pub mqtt_client_id: String,
    /// Subscribe as `$share/<group>/...` so several replicas share the requests.
    #[arg(long, env = "STATEGATE_MQTT_SHARE_GROUP")]
    pub mqtt_share_group: Option<String>,
    /// Node id in every version this service issues (no `:`).
    #[arg(long, env = "STATEGATE_NODE_ID", default_value = "stategate")]
    pub node_id: String,
    /// Most keys stored (unlimited when absent).
    #[arg(long, env = "STATEGATE_MAX_KEYS")]
    pub max_keys: Option<u64>,
    /// Largest value, bytes.
    #[arg(long, env = "STATEGATE_MAX_VALUE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_value_bytes: usize,
    /// Largest key, bytes.
    #[arg(long, env = "STATEGATE_MAX_KEY_BYTES", default_value_t = 64 * 1024)]
    pub max_key_bytes: usize,
    /// Largest MQTT packet accepted or sent, bytes (must exceed the largest value).
    #[arg(long, env = "STATEGATE_MQTT_MAX_PACKET_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub mqtt_max_packet_bytes: u32,
    /// Keys examined per SCAN page.
    #[arg(long, env = "STATEGATE_SCAN_PAGE", default_value_t = 1000)]
    pub scan_page: usize,
    /// Most keys one MGET reads (its answer also holds at most --max-value-bytes plus 1 KiB,
    /// versions and framing included).
    #[arg(long, env = "STATEGATE_MAX_MGET_KEYS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_mget_keys: u64,
    /// How far past its time to live a read pushes a sliding deadline, in percent of it: a key
    /// read without pause is written once per this share of its TTL, and expires between TTL
    /// and TTL + this share after its last read (0: a write on every read, exact).
    #[arg(long, env = "STATEGATE_SLIDING_TTL_SLACK_PERCENT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub sliding_ttl_slack_percent: u32,
    /// Most keys one client may observe with KEYNOTIFY.
    #[arg(long, env = "STATEGATE_MAX_OBSERVED_KEYS", default_value_t = 10_000)]
    pub max_observed_keys: usize,
    /// With an external broker (which does not report disconnects): seconds without a request
    /// after which a client's KEYNOTIFY registrations are dropped. 0 = never.
    #[arg(long, env = "STATEGATE_OBSERVER_IDLE_SECS", default_value_t = 86_400)]
    pub observer_idle_secs: u64,
    /// Most KEYNOTIFY registrations of all clients together; past it a registration is refused
    /// with the quota error.
    #[arg(long, env = "STATEGATE_MAX_OBSERVERS_TOTAL", default_value_t = 1_000_000)]
    pub max_observers_total: usize,
    /// Bytes of KEYNOTIFY notifications waiting to be sent; past it new ones are dropped,
    /// counted and logged (observers miss them).
    #[arg(long, env = "STATEGATE_KEYNOTIFY_QUEUE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub keynotify_queue_bytes: usize,
    /// Changes the watch history keeps (what SSE and gRPC Watch readers are served from, and
    /// resume from: SSE Last-Event-ID, gRPC since_version); a reader that falls further behind
    /// gets the `overflow` event, one that resumes from before it a reset and a snapshot.
    #[arg(long, env = "STATEGATE_WATCH_HISTORY_EVENTS", default_value_t = 65_536)]
    pub watch_history_events: usize,
    /// Heap bytes the watch history keeps: each change's copies of its key and value, its event
    /// and ring slot (the newest change is always kept).
    #[arg(long, env = "STATEGATE_WATCH_HISTORY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub watch_history_bytes: usize,
    /// Seconds the watch history keeps a change.
    #[arg(long, env = "STATEGATE_WATCH_HISTORY_SECS", default_value_t = 600)]
    pub watch_history_secs: u64,
    /// Where the HTTP door (Dapr state API) listens; `off` disables it. An address other than
    /// loopback opens the API to the network (set --api-token).
    #[arg(long, env = "STATEGATE_HTTP_LISTEN", default_value = "127.0.0.1:3500")]
    pub http_listen: String,
    /// Web origins (`scheme://host[:port]`) whose pages may call the HTTP door, besides the
    /// service's own (the console); `*` allows every origin. A request carrying another
    /// `Origin` (browsers send it on cross-site requests) is refused with 403.
    #[arg(long, env = "STATEGATE_HTTP_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub http_allowed_origins: Vec<String>,
    /// Host names (without port) the HTTP door answers besides the loopback ones while it
    /// listens on loopback (a DNS-rebinding name is refused with 403); `*` turns the check off.
    #[arg(long, env = "STATEGATE_HTTP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub http_allowed_hosts: Vec<String>,
    /// Require header/metadata `dapr-api-token` with this value on HTTP and gRPC (health exempt).
    #[arg(long, env = "STATEGATE_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// A Dapr state store name, optionally with its key prefix: `name`, `name=none`,
    /// `name=name` or `name=<literal>` (repeatable; default `statestore=none`).
    #[arg(long = "state-store", env = "STATEGATE_STATE_STORES", value_delimiter = ',')]
    pub state_stores: Vec<String>,
    /// A Dapr lock store name, with its key prefix as for --state-store (repeatable; default
    /// `lockstore=none`, so Dapr locks and Azure IoT Operations leased locks share names).
    #[arg(long = "lock-store", env = "STATEGATE_LOCK_STORES", value_delimiter = ',')]
    pub lock_stores: Vec<String>,
    /// A Dapr configuration store name, with its key prefix as for --state-store (repeatable;
    /// default `configstore=none`: the same keys as the default state store).
    #[arg(
        long = "configuration-store",
        env = "STATEGATE_CONFIGURATION_STORES",
        value_delimiter = ','
    )]
    pub configuration_stores: Vec<String>,
    /// Most keys one bulk get or one configuration get may return (a configuration get of
    /// every key of a store with more keys is refused with a 400 / INVALID_ARGUMENT).
    #[arg(long, env = "STATEGATE_MAX_BULK_KEYS", default_value_t = 10_000)]
    pub max_bulk_keys: usize,
    /// Longest an election campaign waits for the lease, e.g. `30s`, whatever its `waitMs` /
    /// `wait_ms` asks (a waiting campaign holds a request slot and a watch); a capped campaign
    /// answers not elected, with who leads, and the client campaigns again.
    #[arg(long, env = "STATEGATE_ELECTION_MAX_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub election_max_wait: Duration,
    /// Largest HTTP request body, bytes.
    #[arg(long, env = "STATEGATE_HTTP_BODY_LIMIT", default_value_t = 4 * 1024 * 1024)]
    pub http_body_limit: usize,
    /// How long an online backup (`stategate backup`) waits for its client to take the next
    /// chunk, e.g. `30s`; past it the backup ends, the files it holds open are let go and the
    /// copy is cut short.
    #[arg(long, env = "STATEGATE_BACKUP_SEND_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub backup_send_timeout: Duration,
    /// Most operations in one transaction.
    #[arg(long, env = "STATEGATE_MAX_TRANSACTION_OPS", default_value_t = 100_000)]
    pub max_transaction_ops: usize,
    /// Where records are stored: `durable` (on disk under --data-dir), `memory` (lost when
    /// the process stops; for tests and caches), or a Redis/Valkey server shared by replicas:
    /// `redis://[user:password@]host:port[/db]` (`rediss://` for TLS), or the primary that
    /// Sentinel names: `redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]`.
    #[arg(long, env = "STATEGATE_STORAGE", default_value = "durable", hide_env_values = true)]
    pub storage: StorageKind,
    /// Prefix of every Redis key the store uses.
    #[arg(long, env = "STATEGATE_REDIS_PREFIX", default_value = "stategate:")]
    pub redis_prefix: String,
    /// Bound on each Redis call in milliseconds (connecting, reconnecting, answering): past it
    /// the request fails with "unavailable" (MQTT __stat=503, HTTP 503, gRPC UNAVAILABLE).
    #[arg(long, env = "STATEGATE_REDIS_TIMEOUT_MS", default_value_t = 1000)]
    pub redis_timeout_ms: u64,
    /// After each write, wait until this many Redis replicas have it (Redis WAIT) before
    /// answering; fewer within --redis-timeout-ms fails the request. 0 = do not wait.
    #[arg(long, env = "STATEGATE_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// Seconds to wait at startup for Redis to answer before giving up (exit status 1).
    #[arg(long, env = "STATEGATE_REDIS_STARTUP_WAIT_SECS", default_value_t = 60)]
    pub redis_startup_wait_secs: u64,
    /// About how many entries the change log shared by replicas on Redis keeps (Redis trims it
    /// approximately). A replica cut off from Redis for longer than these entries take to be
    /// written ends its watchers' streams with `overflow` instead of skipping changes.
    #[arg(long, env = "STATEGATE_REDIS_CHANGE_LOG_LEN", default_value_t = 100_000)]
    pub redis_change_log_len: u64,
    /// Milliseconds after which a replica on Redis that stopped renewing its membership (it
    /// died, or lost Redis) is dropped: another replica then sends the KEYNOTIFY notifications
    /// it owed, from the last point it recorded. Each replica renews every fifth of this.
    #[arg(long, env = "STATEGATE_REDIS_MEMBER_TIMEOUT_MS", default_value_t = 5000)]
    pub redis_member_timeout_ms: u64,
    /// Bytes of records a replica on Redis keeps from the change log and its reads, so that a
    /// write needs one round trip (the swap checks that the record is current); 0 = none
    /// (every write reads first: two round trips).
    #[arg(long, env = "STATEGATE_REDIS_RECORD_CACHE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub redis_record_cache_bytes: usize,
    /// The durable store's directory (created if missing; one process at a time).
    #[arg(long, env = "STATEGATE_DATA_DIR", default_value = "./stategate-data")]
    pub data_dir: PathBuf,
    /// When a write is acknowledged: `always` (after fdatasync, shared by concurrent writes;
    /// nothing acknowledged is ever lost), `batch` (after write, fdatasync every 50 ms; a power
    /// loss can lose the last 50 ms), `never` (after write; a power loss can lose what the OS had
    /// not written back). A process crash loses nothing acknowledged in any mode.
    #[arg(long, env = "STATEGATE_FSYNC", default_value = "always")]
    pub fsync: FsyncMode,
    /// A file of exactly 32 random bytes (`head -c 32 /dev/urandom > FILE; chmod 600 FILE`):
    /// the durable store seals every log record and snapshot chunk with it (XChaCha20-Poly1305),
    /// so the data directory shows no key or value. The file must not be accessible to other
    /// users. Changing keys: `stategate rekey` on the stopped store.
    #[arg(long, env = "STATEGATE_ENCRYPTION_KEY_FILE")]
    pub encryption_key_file: Option<PathBuf>,
    /// Log bytes after which the durable store starts a new segment and writes a snapshot (or
    /// half the last snapshot, if more). For tests: small values make compaction constant.
    #[arg(long, env = "STATEGATE_SEGMENT_BYTES", default_value_t = 64 * 1024 * 1024, hide = true)]
    pub segment_bytes: u64,
    /// Seconds the broker keeps the service's MQTT session (and queues requests for it) while
    /// it is disconnected; 0 = a clean session on every connect. Default: 3600, or 0 with
    /// --mqtt-share-group (a broker keeps routing a share of the group's requests to a member's
    /// offline session, where they wait unanswered until it comes back).
    #[arg(long, env = "STATEGATE_MQTT_SESSION_EXPIRY_SECS")]
    pub mqtt_session_expiry_secs: Option<u64>,
    /// Most MQTT requests executing at once; past that a request is answered `__stat=503`.
    #[arg(long, env = "STATEGATE_MQTT_MAX_INFLIGHT", default_value_t = 8192)]
    pub mqtt_max_inflight: usize,
    /// Most bytes of MQTT request payloads executing at once; past that, `__stat=503`.
    #[arg(long, env = "STATEGATE_MQTT_MAX_INFLIGHT_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub mqtt_max_inflight_bytes: usize,
    /// Most requests of one MQTT client executing at once. In the embedded broker a client past
    /// it waits (its packets are not read meanwhile); through a client connection it is
    /// answered `__stat=503`. One client's backlog never delays another's requests.
    #[arg(long, env = "STATEGATE_MQTT_MAX_INFLIGHT_PER_CLIENT", default_value_t = 256)]
    pub mqtt_max_inflight_per_client: usize,
    /// Embedded broker: answers waiting in one client's session for it to take them (its
    /// receive window is full: it does not read). Past it the client's requests are answered
    /// `__stat=503` without running, so a client that does not read cannot make the service hold
    /// its answers: at most this many times the largest answer per client.
    #[arg(long, env = "STATEGATE_MQTT_MAX_QUEUED_ANSWERS", default_value_t = 64)]
    pub mqtt_max_queued_answers: usize,
    /// Bytes of answers kept to resend on a QoS 1 redelivery (also at most 100,000 answers,
    /// each for 60 s).
    #[arg(long, env = "STATEGATE_MQTT_RESPONSE_CACHE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub mqtt_response_cache_bytes: usize,
    /// With the embedded broker, serve through an MQTT client connection of our own instead of
    /// inside the broker (slower: two more loopback hops per request; for comparison and tests).
    #[arg(long, env = "STATEGATE_MQTT_CLIENT_PATH")]
    pub mqtt_client_path: bool,
    /// Mirror every key on the MQTT topic `<prefix><key>`, retained, QoS 1: each change is
    /// published there, a delete or expiry clears it (e.g. `state/`; off unless given; see
    /// docs/state-topics.md). Give every replica the same prefix.
    #[arg(long, env = "STATEGATE_STATE_TOPICS", value_name = "PREFIX")]
    pub state_topics: Option<String>,
    /// With --state-topics and the embedded broker serving in-broker: a QoS 1 publish to
    /// `<prefix><key>/set` sets the key to the payload, answered only by the PUBACK reason code.
    #[arg(long, env = "STATEGATE_STATE_TOPICS_SET")]
    pub state_topics_set: bool,
    /// Where the gRPC door (statestore.v1, Dapr runtime state RPCs, health, reflection)
    /// listens; `off` disables it. Beyond loopback it is open to the network (set --api-token).
    #[arg(long, env = "STATEGATE_GRPC_LISTEN", default_value = "127.0.0.1:50001")]
    pub grpc_listen: String,
    /// Do not serve the web console at `/ui` on the HTTP door.
    #[arg(long, env = "STATEGATE_NO_UI")]
    pub no_ui: bool,
    /// MQTT users and password hashes (`user:$argon2id$...` lines; write them with `stategate
    /// passwd`). Set: the embedded broker refuses clients without a valid username and password.
    /// Reloaded on SIGHUP.
    #[arg(long, env = "STATEGATE_MQTT_AUTH_FILE")]
    pub mqtt_auth_file: Option<PathBuf>,
    /// Per-key access rules (TOML: who may read, write, observe which keys). Absent: everyone
    /// who can connect may do everything. Reloaded on SIGHUP.
    #[arg(long, env = "STATEGATE_ACL_FILE")]
    pub acl_file: Option<PathBuf>,
    /// Principals whose compiled rules are kept in memory (the least used are dropped past
    /// it, and compiled again when they return).
    #[arg(long, env = "STATEGATE_ACL_CACHE_PRINCIPALS", default_value_t = crate::access::rules::DEFAULT_CACHED_PRINCIPALS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub acl_cache_principals: usize,
    /// Named HTTP/gRPC tokens, `name:token` per line (each name a principal for the rules).
    /// Set: every HTTP/gRPC call needs one of them in `dapr-api-token`. Reloaded on SIGHUP.
    #[arg(long, env = "STATEGATE_API_TOKEN_FILE")]
    pub api_token_file: Option<PathBuf>,
    /// External broker only: take a request's `__srcId` as the caller's client id for the
    /// rules. Only safe when the broker's own ACLs make every client publish its real id.
    #[arg(long, env = "STATEGATE_MQTT_TRUST_SRC_ID")]
    pub mqtt_trust_src_id: bool,
    /// Embedded broker: a client id must be the client's identity (its username or certificate
    /// identity), or start with it and `:` (`sensor-1:logger`); others get CONNACK Not
    /// authorized. Makes `{clientId}` and `client_ids` rules as safe as `{username}` ones.
    /// Needs `--mqtt-auth-file` or `--mqtt-tls-client-ca` (verified identities).
    #[arg(long, env = "STATEGATE_MQTT_BIND_CLIENT_ID")]
    pub mqtt_bind_client_id: bool,
    /// Requests per second one principal may make (MQTT, HTTP, gRPC together); past it MQTT
    /// `__stat=429`, HTTP 429, gRPC RESOURCE_EXHAUSTED. 0 = unlimited.
    #[arg(long, env = "STATEGATE_RATE_LIMIT", default_value_t = 0)]
    pub rate_limit: u32,
    /// Requests one principal may make at once above --rate-limit (0 = the rate).
    #[arg(long, env = "STATEGATE_RATE_LIMIT_BURST", default_value_t = 0)]
    pub rate_limit_burst: u32,
    /// Change streams (SSE, gRPC Watch) one principal may hold open; past it HTTP 429, gRPC
    /// RESOURCE_EXHAUSTED. 0 = unlimited.
    #[arg(long, env = "STATEGATE_MAX_STREAMS_PER_PRINCIPAL", default_value_t = 64)]
    pub max_streams_per_principal: usize,
    /// Serve the Dapr pluggable state component API on this Unix socket, e.g.
    /// `/tmp/dapr-components-sockets/stategate.sock` (daprd's component type `state.stategate`).
    #[arg(long, env = "STATEGATE_DAPR_COMPONENT_SOCKET")]
    pub dapr_component_socket: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub net: NetArgs,
}

impl Default for ServeArgs {
    fn default() -> ServeArgs {
        // The flag defaults are the one source of truth.
        Cli::parse_from(["stategate"]).serve
    }
}
