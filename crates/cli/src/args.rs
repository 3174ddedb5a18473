//! The client subcommands' command line. Every option is also an environment variable
//! `STATEGATE_*`; keys and values are taken as bytes (arguments need not be UTF-8).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, Subcommand};

use crate::hlc::Hlc;

/// The exit code table, shown by `--help` of every client command.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  key not found, or a condition not met (NX, NEX, VDEL value, lock held)
  2  usage error (bad arguments, or input the service refused as malformed)
  3  conflict (version mismatch, fencing token refused)
  4  not authorized
  5  service unreachable, timed out, busy or failing";

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Print the value of a key.
    #[command(after_help = EXIT_CODES)]
    Get(GetArgs),
    /// Print several keys as of one moment (never half of a transaction): MQTT or --grpc.
    #[command(after_help = EXIT_CODES)]
    Mget(MgetArgs),
    /// Set a key (value from the argument, stdin with `-`, or --file).
    #[command(after_help = EXIT_CODES)]
    Set(SetArgs),
    /// Delete a key.
    #[command(after_help = EXIT_CODES)]
    Del(DelArgs),
    /// Delete a key only if it holds exactly VALUE.
    #[command(after_help = EXIT_CODES)]
    Vdel(VdelArgs),
    /// List the keys matching a glob pattern (every page, printed as it arrives).
    #[command(after_help = EXIT_CODES)]
    Scan(ScanArgs),
    /// Print changes to keys as they happen, until Ctrl-C (exit 0).
    #[command(after_help = EXIT_CODES)]
    Watch(WatchArgs),
    /// Take a lease named NAME as the Azure IoT Operations leased lock does; run COMMAND under it.
    #[command(after_help = LOCK_HELP)]
    Lock(LockArgs),
    /// Release a lease taken by `lock` (only if HOLDER holds it).
    #[command(after_help = EXIT_CODES)]
    Unlock(UnlockArgs),
    /// Campaign to lead the election NAME (its lease, shared with `lock`); run COMMAND while
    /// leading. `--leader`: print who leads.
    #[command(after_help = ELECT_HELP)]
    Elect(ElectArgs),
    /// Write every live record (key, value, version, fencing token, deadline) as JSON lines,
    /// from a running service (--http), a stopped data directory (--data-dir) or Redis (--redis).
    #[command(after_help = TRANSFER_EXIT_CODES)]
    Export(ExportArgs),
    /// Load records written by `export` into a running service (--http), a stopped data
    /// directory (--data-dir) or Redis (--redis), keeping their versions and deadlines.
    #[command(after_help = TRANSFER_EXIT_CODES)]
    Import(ImportArgs),
    /// Copy a running durable store, consistent at one point of its log, into a new directory
    /// (a data directory: start a service on it to restore).
    #[command(after_help = TRANSFER_EXIT_CODES)]
    Backup(BackupArgs),
    /// Rewrite a stopped durable store under another encryption key (or none).
    #[command(after_help = TRANSFER_EXIT_CODES)]
    Rekey(RekeyArgs),
}

/// Exit codes of export, import, backup and rekey.
pub const TRANSFER_EXIT_CODES: &str = "\
Exit codes:
  0  done
  2  usage error (bad arguments, a line that is not a record, a record the store refuses)
  3  import: some records were not imported, the store holds newer versions (see --overwrite)
     or keys protected by a fencing token the records do not match (see --overwrite-fenced)
  4  not authorized
  5  service or storage unreachable, failing, or the copy was cut short";

/// Where `export` and `import` find the records: exactly one of --http, --data-dir, --redis.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Store")]
pub struct StoreArgs {
    /// A running service's HTTP door, e.g. http://127.0.0.1:3500.
    #[arg(long, env = "STATEGATE_HTTP", value_name = "URL", conflicts_with_all = ["data_dir", "redis"])]
    pub http: Option<String>,
    /// Sent as `dapr-api-token` with --http.
    #[arg(long, env = "STATEGATE_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// With --http: bound on connecting and on each wait for data, e.g. 500ms, 10s.
    #[arg(long, env = "STATEGATE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// A durable store's directory, used directly (not while a service has it open).
    #[arg(long, env = "STATEGATE_DATA_DIR", conflicts_with = "redis")]
    pub data_dir: Option<PathBuf>,
    /// With --data-dir: the store's encryption key file.
    #[arg(long, env = "STATEGATE_ENCRYPTION_KEY_FILE")]
    pub encryption_key_file: Option<PathBuf>,
    /// A Redis or Valkey server, used directly: redis://[user:password@]host:port[/db].
    #[arg(long, env = "STATEGATE_REDIS_URL", hide_env_values = true)]
    pub redis: Option<String>,
    /// With --redis: the prefix of the store's Redis keys.
    #[arg(long, env = "STATEGATE_REDIS_PREFIX", default_value = "stategate:")]
    pub redis_prefix: String,
}

#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// Where to write the lines (`-`: stdout). An existing file is not overwritten.
    #[arg(long, short = 'o', env = "STATEGATE_OUTPUT", default_value = "-")]
    pub output: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// The file `export` wrote (`-`: stdin).
    pub file: PathBuf,
    /// Also replace keys that hold a newer version than the record's (the key's version goes
    /// back to the imported one).
    #[arg(long, env = "STATEGATE_OVERWRITE", value_parser = BoolishValueParser::new())]
    pub overwrite: bool,
    /// Also replace keys protected by a fencing token (a lock's) that the record's token does
    /// not match: takes the lock's protection away from its holder. Over --http the caller
    /// needs the `admin` permission, like any import.
    #[arg(long, env = "STATEGATE_OVERWRITE_FENCED", value_parser = BoolishValueParser::new())]
    pub overwrite_fenced: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Clone, Args)]
pub struct BackupArgs {
    /// The directory to create (or an empty one) for the copy.
    #[arg(long, env = "STATEGATE_BACKUP_TO")]
    pub to: PathBuf,
    /// The running service's HTTP door, e.g. http://127.0.0.1:3500.
    #[arg(
        long,
        env = "STATEGATE_HTTP",
        value_name = "URL",
        default_value = "http://127.0.0.1:3500"
    )]
    pub http: String,
    /// Sent as `dapr-api-token`.
    #[arg(long, env = "STATEGATE_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Bound on connecting and on each wait for data, e.g. 500ms, 10s.
    #[arg(long, env = "STATEGATE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct RekeyArgs {
    /// The stopped store's directory.
    #[arg(long, env = "STATEGATE_DATA_DIR")]
    pub data_dir: PathBuf,
    /// The key the store is encrypted with now (absent: it is not encrypted).
    #[arg(long, env = "STATEGATE_ENCRYPTION_KEY_FILE")]
    pub encryption_key_file: Option<PathBuf>,
    /// The key to encrypt it with from now on.
    #[arg(
        long,
        env = "STATEGATE_NEW_ENCRYPTION_KEY_FILE",
        required_unless_present = "decrypt",
        conflicts_with = "decrypt"
    )]
    pub new_encryption_key_file: Option<PathBuf>,
    /// Store it unencrypted from now on.
    #[arg(long, env = "STATEGATE_DECRYPT", value_parser = BoolishValueParser::new())]
    pub decrypt: bool,
}

const LOCK_HELP: &str = "\
With a COMMAND: waits for the lease (up to --wait), renews it every ttl/3 while COMMAND runs with
the fencing token in STATEGATE_FENCING_TOKEN, releases it when COMMAND ends, and exits with
COMMAND's status (128+N if a signal N ended it). SIGTERM, and SIGINT when stdin is not a
terminal, are passed on to COMMAND. If the lease is lost (another holder took it after a renewal
failed), COMMAND gets SIGTERM and lock exits 3.
Without a COMMAND: takes the lease, prints the fencing token and exits 0; the lease lasts until
its ttl runs out or `stategate unlock`.
Keep --timeout well below the ttl: a renewal that takes longer than the ttl loses the lease.

Exit codes:
  0  done (without COMMAND), else COMMAND's status
  1  the lease is held by another holder (and --wait ran out)
  2  usage error, or COMMAND cannot be started
  3  the lease was lost while COMMAND ran
  4  not authorized
  5  service unreachable, timed out, busy or failing";

const ELECT_HELP: &str = "\
Campaigns by taking the lease NAME as `lock` does (waiting up to --wait while another holder
leads), records the leadership in NAME.proclaimed (with --value), runs COMMAND with the fencing
token in STATEGATE_FENCING_TOKEN, renews the lease every ttl/3, and resigns when COMMAND ends,
exiting with COMMAND's status. If leadership is lost (the lease deleted or taken after a renewal
failed), COMMAND gets SIGTERM (SIGKILL 10 s later) and elect exits 3. See docs/election.md.

Exit codes:
  0  COMMAND's status; with --leader: someone leads
  1  another holder leads (and --wait ran out); with --leader: nobody leads
  2  usage error, or COMMAND cannot be started
  3  leadership was lost while COMMAND ran
  4  not authorized
  5  service unreachable, timed out, busy or failing";

/// Which door to use and how to reach it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnectArgs {
    /// The MQTT broker the state store listens on (the default door):
    /// `mqtt[s]://[user[:password]@]host[:port]` (mqtts: TLS, verified).
    #[arg(long, env = "STATEGATE_MQTT_URL", default_value = "mqtt://127.0.0.1:1883")]
    pub mqtt_url: String,
    /// MQTT client id (default: stategate-cli-<random>).
    #[arg(long, env = "STATEGATE_CLIENT_ID")]
    pub client_id: Option<String>,
    /// CA certificates (PEM) that verify the service's certificate over mqtts://, https:// and
    /// gRPC TLS (default: the system's trusted roots).
    #[arg(long, env = "STATEGATE_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Use the HTTP door (Dapr state API) at this URL instead of MQTT, e.g. http://127.0.0.1:3500
    /// (https:// for TLS).
    #[arg(long, env = "STATEGATE_HTTP", value_name = "URL", conflicts_with = "grpc")]
    pub http: Option<String>,
    /// Use the gRPC door (statestore.v1) at this URL instead of MQTT, e.g. http://127.0.0.1:50001
    /// (https:// for TLS).
    #[arg(long, env = "STATEGATE_GRPC", value_name = "URL")]
    pub grpc: Option<String>,
    /// Dapr state store name (HTTP door).
    #[arg(long, env = "STATEGATE_STORE", default_value = "statestore")]
    pub store: String,
    /// Sent as `dapr-api-token` on HTTP and gRPC.
    #[arg(long, env = "STATEGATE_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Bound on every request (and on connecting), e.g. 500ms, 10s.
    #[arg(long, env = "STATEGATE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// How results are printed.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// One JSON object per line (bytes that are not UTF-8 as base64, flagged `<field>_base64`).
    #[arg(long, env = "STATEGATE_JSON", value_parser = BoolishValueParser::new(), conflicts_with = "raw")]
    pub json: bool,
    /// Exact bytes: `get` prints the value only, with no newline added; keys unescaped.
    #[arg(long, env = "STATEGATE_RAW", value_parser = BoolishValueParser::new())]
    pub raw: bool,
    /// Also print versions and progress on stderr.
    #[arg(short, long, env = "STATEGATE_VERBOSE", value_parser = BoolishValueParser::new())]
    pub verbose: bool,
}

#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    /// The key (any bytes; over HTTP it must be UTF-8 text).
    pub key: OsString,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct MgetArgs {
    /// The keys (any bytes), read together; exit 1 when any is absent.
    #[arg(required = true)]
    pub keys: Vec<OsString>,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct SetArgs {
    /// The key (any bytes; over HTTP it must be UTF-8 text).
    pub key: OsString,
    /// The value; `-` reads it from stdin, byte for byte.
    #[arg(required_unless_present = "file")]
    pub value: Option<OsString>,
    /// Read the value from this file (`-`: stdin).
    #[arg(long, short = 'f', env = "STATEGATE_FILE", conflicts_with = "value")]
    pub file: Option<PathBuf>,
    /// Only if the key does not exist.
    #[arg(long, env = "STATEGATE_NX", value_parser = BoolishValueParser::new(), conflicts_with_all = ["nex", "if_version"])]
    pub nx: bool,
    /// Only if the key does not exist or already holds this value (HTTP: emulated, see docs/cli.md).
    #[arg(long, env = "STATEGATE_NEX", value_parser = BoolishValueParser::new(), conflicts_with = "if_version")]
    pub nex: bool,
    /// Expire after this many milliseconds (HTTP: rounded up to whole seconds).
    #[arg(long, env = "STATEGATE_PX", value_name = "MS", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "ttl")]
    pub px: Option<u64>,
    /// Expire after this long, e.g. 1500ms, 10s, 1h (HTTP: rounded up to whole seconds).
    #[arg(long, env = "STATEGATE_TTL", value_parser = parse_ttl)]
    pub ttl: Option<Duration>,
    /// The TTL slides: every read of the key, through any door, pushes its deadline out by the
    /// TTL again (a stategate extension; needs --ttl or --px).
    #[arg(long, env = "STATEGATE_SLIDING", value_parser = BoolishValueParser::new())]
    pub sliding: bool,
    /// Only if the key exists with exactly this version (HTTP and gRPC only).
    #[arg(long, env = "STATEGATE_IF_VERSION", value_name = "VERSION", value_parser = parse_version)]
    pub if_version: Option<Hlc>,
    /// The fencing token protecting the key (`stategate lock` sets it for its command).
    #[arg(long, env = "STATEGATE_FENCING_TOKEN", value_name = "TOKEN", value_parser = parse_version)]
    pub fencing_token: Option<Hlc>,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct DelArgs {
    /// The key (any bytes; over HTTP it must be UTF-8 text).
    pub key: OsString,
    /// Only if the key exists with exactly this version (HTTP and gRPC only).
    #[arg(long, env = "STATEGATE_IF_VERSION", value_name = "VERSION", value_parser = parse_version)]
    pub if_version: Option<Hlc>,
    /// The fencing token protecting the key.
    #[arg(long, env = "STATEGATE_FENCING_TOKEN", value_name = "TOKEN", value_parser = parse_version)]
    pub fencing_token: Option<Hlc>,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct VdelArgs {
    /// The key (any bytes; over HTTP it must be UTF-8 text).
    pub key: OsString,
    /// The value the key must hold; `-` reads it from stdin.
    pub value: OsString,
    /// The fencing token protecting the key.
    #[arg(long, env = "STATEGATE_FENCING_TOKEN", value_name = "TOKEN", value_parser = parse_version)]
    pub fencing_token: Option<Hlc>,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ScanArgs {
    /// Glob: `*`, `?`, `[a-z]`, `[!x]`.
    #[arg(default_value = "*")]
    pub pattern: String,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Keys to watch. None and no --pattern: every key (HTTP and gRPC only).
    pub keys: Vec<OsString>,
    /// Also watch the keys matching this glob (repeatable; HTTP and gRPC only).
    #[arg(long, env = "STATEGATE_PATTERN")]
    pub pattern: Vec<String>,
    /// Resume after the change with this version (the last `version` a watch printed, or its
    /// `synced` version): every change since, then live ones. When the service no longer has
    /// that history it says `reset` and prints every watched key's current value first.
    /// HTTP and gRPC only (MQTT notifications have no history).
    #[arg(long, env = "STATEGATE_SINCE")]
    pub since: Option<String>,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct LockArgs {
    /// The lease's name: the key that holds it.
    pub name: OsString,
    /// How long the lease lasts without renewal, e.g. 10s (HTTP: rounded up to whole seconds).
    #[arg(long, env = "STATEGATE_TTL", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Who takes the lease: the value stored under NAME. Must be unique among holders.
    #[arg(long, env = "STATEGATE_HOLDER")]
    pub holder: OsString,
    /// How long to wait while another holder has the lease: a duration, or `forever`.
    #[arg(long, env = "STATEGATE_WAIT", default_value = "forever", value_parser = parse_wait)]
    pub wait: Wait,
    /// The command to run under the lease.
    #[arg(last = true)]
    pub command: Vec<OsString>,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct UnlockArgs {
    /// The lease's name.
    pub name: OsString,
    /// The holder that took the lease.
    #[arg(long, env = "STATEGATE_HOLDER")]
    pub holder: OsString,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ElectArgs {
    /// The election's name: the key of its lease.
    pub name: OsString,
    /// Who campaigns: the value stored under NAME. Must be unique among contenders.
    #[arg(long, env = "STATEGATE_HOLDER", required_unless_present = "leader")]
    pub holder: Option<OsString>,
    /// How long the lease lasts without renewal (renewed every ttl/3).
    #[arg(long, env = "STATEGATE_TTL", default_value = "10s", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// What the leader proclaims (read back with --leader, the election API's leader and observe).
    #[arg(long, env = "STATEGATE_ELECT_VALUE")]
    pub value: Option<OsString>,
    /// How long to wait while another holder leads: a duration, or `forever`.
    #[arg(long, env = "STATEGATE_WAIT", default_value = "forever", value_parser = parse_wait)]
    pub wait: Wait,
    /// Print who leads NAME (and what it proclaimed) instead of campaigning.
    #[arg(long, conflicts_with_all = ["holder", "value", "command"])]
    pub leader: bool,
    /// The command to run while leading.
    #[arg(last = true, required_unless_present = "leader")]
    pub command: Vec<OsString>,
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// How long `lock` waits for a lease another holder has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Forever,
    AtMost(Duration),
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (examples: 500ms, 10s, 2m)"))
}

/// A time to live: at least one millisecond.
fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) {
        return Err("must be at least 1ms".into());
    }
    Ok(d)
}

fn parse_wait(s: &str) -> Result<Wait, String> {
    match s.trim() {
        "forever" => Ok(Wait::Forever),
        other => parse_duration(other).map(Wait::AtMost),
    }
}

fn parse_version(s: &str) -> Result<Hlc, String> {
    s.trim()
        .parse()
        .map_err(|_| "not a version (expected <ms>:<counter>:<node>, as printed by `get -v`)".to_owned())
}

/// The bytes of a command-line argument (on Unix exactly what was passed).
pub fn arg_bytes(arg: &OsString) -> Vec<u8> {
    arg.as_encoded_bytes().to_vec()
}

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    Arg(Vec<u8>),
    Stdin,
    File(PathBuf),
}

impl ValueSource {
    /// `-` as the value or the file means stdin.
    pub fn of(value: Option<&OsString>, file: Option<&PathBuf>) -> Option<ValueSource> {
        match (value, file) {
            (Some(v), _) if v == "-" => Some(ValueSource::Stdin),
            (Some(v), _) => Some(ValueSource::Arg(arg_bytes(v))),
            (None, Some(f)) if f.as_os_str() == "-" => Some(ValueSource::Stdin),
            (None, Some(f)) => Some(ValueSource::File(f.clone())),
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The client commands as the binary mounts them (flattened among its subcommands).
    #[derive(Debug, Parser)]
    struct Commands {
        #[command(subcommand)]
        command: ClientCommand,
    }

    fn parse(args: &[&str]) -> Result<ClientCommand, clap::Error> {
        Commands::try_parse_from(std::iter::once("stategate").chain(args.iter().copied())).map(|c| c.command)
    }

    #[test]
    fn set_options_parse() {
        let ClientCommand::Set(a) = parse(&["set", "k", "v", "--nx", "--ttl", "1500ms", "--json"]).unwrap() else {
            panic!("set")
        };
        assert_eq!(a.key, "k");
        assert_eq!(a.value.as_deref(), Some("v".as_ref()));
        assert!(a.nx && !a.nex && a.output.json);
        assert_eq!(a.ttl, Some(Duration::from_millis(1500)));
        assert_eq!(a.connect.mqtt_url, "mqtt://127.0.0.1:1883");
        assert_eq!(a.connect.timeout, Duration::from_secs(10));
        let ClientCommand::Set(a) = parse(&["set", "k", "--file", "-", "--px", "20"]).unwrap() else {
            panic!("set")
        };
        assert_eq!(
            ValueSource::of(a.value.as_ref(), a.file.as_ref()),
            Some(ValueSource::Stdin)
        );
        assert_eq!(a.px, Some(20));
    }

    #[test]
    fn conflicting_or_bad_options_are_usage_errors() {
        for bad in [
            &["set", "k", "v", "--nx", "--nex"][..],
            &["set", "k", "v", "--px", "5", "--ttl", "5s"],
            &["set", "k", "v", "--px", "0"],
            &["set", "k", "v", "--ttl", "0s"],
            &["set", "k"],
            &["set", "k", "v", "--file", "f"],
            &["set", "k", "v", "--if-version", "yesterday"],
            &["set", "k", "v", "--nx", "--if-version", "1:0:n"],
            &["get", "k", "--json", "--raw"],
            &["get", "k", "--http", "http://h", "--grpc", "http://g"],
            &["get", "k", "--timeout", "soon"],
            &["lock", "n", "--holder", "h"],
            &["lock", "n", "--ttl", "1s", "--holder", "h", "--wait", "later"],
        ] {
            let err = parse(bad).expect_err(&format!("{bad:?} must be refused"));
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn lock_takes_a_command_after_double_dash() {
        let ClientCommand::Lock(a) = parse(&[
            "lock", "job", "--ttl", "3s", "--holder", "me", "--wait", "2s", "--", "sh", "-c", "echo --x",
        ])
        .unwrap() else {
            panic!("lock")
        };
        assert_eq!(a.wait, Wait::AtMost(Duration::from_secs(2)));
        assert_eq!(a.command, ["sh", "-c", "echo --x"]);
        let ClientCommand::Lock(a) = parse(&["lock", "job", "--ttl", "3s", "--holder", "me"]).unwrap() else {
            panic!("lock")
        };
        assert_eq!(a.wait, Wait::Forever);
        assert!(a.command.is_empty());
    }

    #[test]
    fn value_sources() {
        let dash = OsString::from("-");
        let v = OsString::from("abc");
        let f = PathBuf::from("in.bin");
        assert_eq!(ValueSource::of(Some(&dash), None), Some(ValueSource::Stdin));
        assert_eq!(ValueSource::of(Some(&v), None), Some(ValueSource::Arg(b"abc".to_vec())));
        assert_eq!(ValueSource::of(None, Some(&f)), Some(ValueSource::File(f.clone())));
        assert_eq!(ValueSource::of(None, None), None);
    }
}
