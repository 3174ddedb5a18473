//! The configuration file (`--config FILE`, env `STATEGATE_CONFIG`): TOML whose keys are the
//! long names of the `serve` flags (`max-keys = 1000`, `http-listen = "0.0.0.0:3500"`).
//!
//! There is no second list of settings to keep in sync with the flags: a key is looked up among
//! the flags clap knows, its value is checked by that flag's own parser, and it is applied only
//! where clap says the flag came from neither the command line nor the environment
//! (`ArgMatches::value_source`). Precedence is therefore flags > environment > file > defaults
//! for every flag, including those added later.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};

use super::{Cli, CliCommand, ServeArgs};

/// The flag naming the file; it cannot itself be set in a file.
pub const CONFIG_FLAG: &str = "config";

/// A configuration file that cannot be used: always names the file, and the setting if one.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{}: cannot read the configuration file: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a valid TOML configuration file: {message}", file.display())]
    Syntax { file: PathBuf, message: String },
    #[error("{}: unknown setting `{field}` (settings are the `stategate serve` flags without `--`; see `stategate config default`)", file.display())]
    Unknown { file: PathBuf, field: String },
    #[error("{}: setting `{field}`: {message}", file.display())]
    BadValue {
        file: PathBuf,
        field: String,
        message: String,
    },
}

/// `serve` flags after layering the file under the command line and the environment.
#[derive(Debug, Clone)]
pub struct Layered {
    pub args: ServeArgs,
    /// The file in use, if any.
    pub file: Option<PathBuf>,
    /// Settings the file supplied (those the command line or environment did not override).
    pub from_file: BTreeSet<String>,
    /// Every setting's value as given (flag, environment, file or default), to tell what a
    /// reload changed.
    pub values: BTreeMap<String, Vec<String>>,
}

impl Layered {
    /// Settings whose value differs in `other`.
    pub fn changed(&self, other: &Layered) -> Vec<String> {
        let keys: BTreeSet<&String> = self.values.keys().chain(other.values.keys()).collect();
        keys.into_iter()
            .filter(|k| self.values.get(*k) != other.values.get(*k))
            .cloned()
            .collect()
    }
}

fn values(m: &ArgMatches) -> BTreeMap<String, Vec<String>> {
    let m = serve_matches(m);
    let cmd = serve_command();
    settings(&cmd)
        .filter_map(|a| {
            let raw = m.get_raw(a.get_id().as_str())?;
            let key = a.get_long()?.to_owned();
            Some((key, raw.map(|v| v.to_string_lossy().into_owned()).collect()))
        })
        .collect()
}

/// The `serve` command as clap sees it: its arguments are the settings.
pub fn serve_command() -> Command {
    let mut cli = Cli::command();
    cli.build();
    cli.find_subcommand("serve").cloned().unwrap_or(cli)
}

/// The arguments that are settings: every `serve` flag but `--config`, `--help`, `--version`.
pub fn settings(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(|a| {
        let id = a.get_id().as_str();
        a.get_long().is_some() && id != CONFIG_FLAG && id != "help" && id != "version"
    })
}

/// The `serve` matches within a parse of the whole command line (`stategate [serve] ...`).
fn serve_matches(m: &ArgMatches) -> &ArgMatches {
    match m.subcommand() {
        Some(("serve", sub)) => sub,
        _ => m,
    }
}

/// Parses `argv` (program name first) and layers the configuration file it names (flag
/// `--config` or env `STATEGATE_CONFIG`) under it. `argv` must be a `serve` command line.
pub fn layer(argv: &[OsString]) -> Result<Layered, LayerError> {
    let matches = Cli::command().try_get_matches_from(argv).map_err(LayerError::Cli)?;
    let serve = serve_matches(&matches);
    let Some(file) = serve.get_one::<PathBuf>(CONFIG_FLAG).cloned() else {
        return Ok(Layered {
            args: serve_args(&matches).map_err(LayerError::Cli)?,
            file: None,
            from_file: BTreeSet::new(),
            values: values(&matches),
        });
    };
    let text = std::fs::read_to_string(&file).map_err(|source| FileError::Read {
        file: file.clone(),
        source,
    })?;
    let (extra, from_file) = file_flags(&file, &text, serve)?;
    let mut all = argv.to_vec();
    all.extend(extra);
    let matches = Cli::command().try_get_matches_from(&all).map_err(LayerError::Cli)?;
    Ok(Layered {
        args: serve_args(&matches).map_err(LayerError::Cli)?,
        file: Some(file),
        from_file,
        values: values(&matches),
    })
}

/// Why layering failed: the command line itself, or the file.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error(transparent)]
    Cli(clap::Error),
    #[error(transparent)]
    File(#[from] FileError),
}

fn serve_args(m: &ArgMatches) -> Result<ServeArgs, clap::Error> {
    match Cli::from_arg_matches(m)? {
        Cli {
            command: Some(CliCommand::Serve(a)),
            ..
        } => Ok(a),
        Cli { serve, .. } => Ok(serve),
    }
}

/// The flags the file adds to the command line, and the settings they carry. Every key and
/// value is checked here (unknown key, wrong type, a value the flag's parser refuses), also
/// those the command line or environment override: a broken file is refused whole.
fn file_flags(file: &Path, text: &str, given: &ArgMatches) -> Result<(Vec<OsString>, BTreeSet<String>), FileError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| FileError::Syntax {
        file: file.to_owned(),
        message: e.to_string().trim_end().replace('\n', " "),
    })?;
    let cmd = serve_command();
    let mut extra = Vec::new();
    let mut from_file = BTreeSet::new();
    for (key, value) in &table {
        let bad = |message: String| FileError::BadValue {
            file: file.to_owned(),
            field: key.clone(),
            message,
        };
        let arg = settings(&cmd)
            .find(|a| a.get_long() == Some(key.as_str()))
            .ok_or_else(|| FileError::Unknown {
                file: file.to_owned(),
                field: key.clone(),
            })?;
        let values = file_values(arg, value).map_err(bad)?;
        for v in values.iter().flatten() {
            check_value(arg, key, v).map_err(|e| bad(clap_message(&e)))?;
        }
        let overridden = matches!(
            given.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if overridden {
            continue;
        }
        from_file.insert(key.clone());
        for v in values {
            extra.push(OsString::from(format!("--{key}")));
            if let Some(v) = v {
                extra.push(OsString::from(v));
            }
        }
    }
    Ok((extra, from_file))
}

/// Runs the flag's own parser on `value` (the environment and the flags it requires left
/// out: a `requires` naming an argument this one-argument command lacks is a clap error).
fn check_value(arg: &Arg, key: &str, value: &str) -> Result<(), clap::Error> {
    let alone = Command::new("stategate").no_binary_name(true).arg(
        arg.clone()
            .env(None)
            .default_value(None)
            .required(false)
            .requires(clap::builder::Resettable::<clap::Id>::Reset),
    );
    alone
        .try_get_matches_from([format!("--{key}"), value.to_owned()])
        .map(|_| ())
}

/// A TOML value as flag occurrences: `Some(value)` for a flag with a value, `None` for a
/// switch that is on. A switch that is off adds nothing.
fn file_values(arg: &Arg, value: &toml::Value) -> Result<Vec<Option<String>>, String> {
    let switch = matches!(arg.get_action(), ArgAction::SetTrue);
    let many = matches!(arg.get_action(), ArgAction::Append);
    match value {
        toml::Value::Boolean(on) if switch => Ok(if *on { vec![None] } else { vec![] }),
        _ if switch => Err("expected true or false".into()),
        toml::Value::Array(items) if many => items.iter().map(|v| scalar(v).map(Some)).collect(),
        toml::Value::Array(_) => Err("expected a single value, not a list".into()),
        other => scalar(other).map(|v| vec![Some(v)]),
    }
}

fn scalar(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Datetime(_) | toml::Value::Array(_) | toml::Value::Table(_) => {
            Err("expected a string, a number or a boolean".into())
        }
    }
}

/// clap's message without its `error:` prefix and usage lines.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_owned()
}

/// The commented configuration file with every setting at its default (`config default`).
pub fn default_file() -> String {
    let cmd = serve_command();
    let mut out = String::from(
        "# stategate configuration file (TOML), for `stategate serve --config FILE` or env STATEGATE_CONFIG.\n\
         # Every key is a `stategate serve` flag without its leading `--`; each is shown here with its\n\
         # default. Precedence: command-line flags > environment variables > this file > defaults.\n\
         # An unknown key or a bad value stops the service at startup (exit status 64).\n\
         # SIGHUP re-reads this file: log-level and the settings marked `live` apply at once; the\n\
         # others are reported and take effect at the next start.\n",
    );
    for arg in settings(&cmd) {
        let Some(key) = arg.get_long() else { continue };
        out.push('\n');
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        for line in help.lines() {
            let _ = writeln!(out, "# {line}").map(|_| ());
        }
        if let Some(env) = arg.get_env() {
            let _ = writeln!(out, "# env: {}", env.to_string_lossy());
        }
        if super::LIVE_SETTINGS.contains(&key) {
            out.push_str("# live: SIGHUP applies a change at once\n");
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let _ = match (arg.get_action(), defaults.as_slice()) {
            (ArgAction::SetTrue, _) => writeln!(out, "{key} = false"),
            (_, []) => writeln!(out, "# {key} =   (not set)"),
            (ArgAction::Append, d) => {
                let items: Vec<String> = d.iter().map(|v| toml_scalar(v)).collect();
                writeln!(out, "{key} = [{}]", items.join(", "))
            }
            (_, [d]) => writeln!(out, "{key} = {}", toml_scalar(d)),
            (_, d) => writeln!(out, "{key} = {}", toml_scalar(&d.join(","))),
        };
    }
    out
}

/// A default as TOML: integers bare, anything else a quoted string.
fn toml_scalar(v: &str) -> String {
    match v.parse::<i64>() {
        Ok(i) => i.to_string(),
        Err(_) => toml::Value::String(v.to_owned()).to_string(),
    }
}
