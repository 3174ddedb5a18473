use std::ffi::OsString;
use std::sync::Arc;

use clap::Parser;
use stategate::config::{Cli, CliCommand, Config, ConfigCommand, LIVE_SETTINGS, LayerError, Layered, file};
use stategate::storage::{StorageKind, Store};
use stategate::telemetry::LogControl;

/// Exit code for a bad command line or configuration (EX_USAGE).
const EXIT_USAGE: i32 = 64;

/// glibc raises its mmap threshold each time a large block is freed, after which large blocks
/// (values, request bodies) come from the heap and their memory is kept after they are freed:
/// measured, a service that held 1 MiB values went from 24 to 127 MiB and stayed there once
/// every value was deleted. A fixed threshold keeps blocks of 128 KiB and more in their own
/// mappings, returned on free (42 MiB after the same run, the watch history's 16 MiB included).
/// mimalloc (164 MiB) and jemalloc with its defaults (119 MiB) kept more. See ARCHITECTURE.md.
fn return_large_blocks_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

fn main() {
    // One rustls crypto provider for the whole process, before anything builds a TLS config.
    stategate::tls::install_provider();
    return_large_blocks_to_the_os();
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = Cli::parse_from(&argv);
    match cli.command {
        Some(CliCommand::Client(cmd)) => std::process::exit(stategate::cli::run(cmd)),
        Some(CliCommand::Passwd(a)) => std::process::exit(stategate::access::passwd::run(&a)),
        Some(CliCommand::Config(ConfigCommand::Default)) => {
            print!("{}", file::default_file());
            return;
        }
        Some(CliCommand::Serve(_)) | None => {}
    }
    let (config, layered) = match load(&argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stategate: {e}");
            std::process::exit(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stategate: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    // Inside the runtime: the OTLP exporter (feature `otlp`) needs one.
    let logs = {
        let _entered = runtime.enter();
        stategate::telemetry::init(&config.ops.log_filter, config.ops.log_format)
    };
    if let Err(e) = runtime.block_on(serve(argv, config, layered, logs)) {
        eprintln!("stategate: {e}");
        // A file that became unusable between the check and the start is still a usage error.
        let usage = matches!(
            e.downcast_ref::<stategate::StartError>(),
            Some(stategate::StartError::Access(_))
        );
        std::process::exit(if usage { EXIT_USAGE } else { 1 });
    }
}

/// The configuration from the command line, the environment and the configuration file.
/// Errors name the file and the setting when the file supplied it.
fn load(argv: &[OsString]) -> Result<(Config, Layered), String> {
    let layered = match file::layer(argv) {
        Ok(l) => l,
        Err(LayerError::Cli(e)) => return Err(e.to_string().lines().next().unwrap_or_default().to_owned()),
        Err(LayerError::File(e)) => return Err(e.to_string()),
    };
    let config = Config::from_args(layered.args.clone()).map_err(|e| match (&layered.file, e.setting()) {
        (Some(f), Some(setting)) if layered.from_file.contains(setting) => {
            format!("{}: setting `{setting}`: {e}", f.display())
        }
        _ => e.to_string(),
    })?;
    Ok((config, layered))
}

async fn serve(argv: Vec<OsString>, config: Config, mut layered: Layered, logs: LogControl) -> anyhow::Result<()> {
    // Before anything listens: a signal that arrives during startup must not kill the process.
    let mut signals = Signals::new()?;
    let metrics = stategate::metrics::Metrics::enabled(config.ops.metrics);
    let clock = Arc::new(stategate::hlc::SystemClock);
    let store = Store::open_observed(&config.storage, clock.clone(), &metrics)
        .await
        .map_err(|e| match &config.storage.kind {
            StorageKind::Durable => anyhow::anyhow!("opening storage in {}: {e}", config.storage.data_dir.display()),
            StorageKind::Memory => anyhow::anyhow!("opening storage: {e}"),
            // The URL's Display hides its password.
            StorageKind::Redis(url) => anyhow::anyhow!("opening storage at {url}: {e}"),
        })?;
    if config.storage.kind == StorageKind::Memory {
        tracing::warn!("storage is in memory: every record is lost when the process stops");
    }
    // Replicas sharing a store take the time from it (Redis: the server's clock), so that a
    // deadline or a version means the same to each of them whatever their own clocks say.
    let clock: Arc<dyn stategate::hlc::Clock> = store.backend().clock().unwrap_or(clock);
    let running = stategate::start_observed(config, store, clock, metrics).await?;
    let (host, port) = running.mqtt_broker();
    tracing::info!(host, port, "stategate is serving the state store over MQTT");
    while signals.next().await == Signal::Reload {
        reload(&argv, &running, &logs, &mut layered);
    }
    tracing::info!("shutting down: finishing requests in flight (a second signal stops at once)");
    tokio::select! {
        _ = running.shutdown() => {}
        _ = signals.next_stop() => {
            tracing::warn!("second signal: stopping without finishing requests in flight");
            std::process::exit(1);
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// SIGHUP: re-reads the access files (passwords, tokens, rules) and the configuration file.
/// The log level changes at once; parts that follow the configuration get the new one; a change
/// to anything else is reported as needing a restart. A file that no longer loads changes
/// nothing (each keeps what is in force).
fn reload(argv: &[OsString], running: &stategate::Running, logs: &LogControl, layered: &mut Layered) {
    if let Err(e) = running.access().reload() {
        tracing::error!(cause = %e, "reloading the access files failed; the previous ones stay in force");
    }
    let (config, now) = match load(argv) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(cause = %e, "configuration not reloaded; the running one stays");
            return;
        }
    };
    let changed = layered.changed(&now);
    *layered = now;
    let (live, restart): (Vec<&str>, Vec<&str>) = changed
        .iter()
        .map(String::as_str)
        .partition(|s| LIVE_SETTINGS.contains(s));
    if !restart.is_empty() {
        tracing::warn!(settings = ?restart, "changed settings that take effect at the next start");
    }
    // Said under the old level, so that a reload to a quieter level is still on record.
    tracing::info!(applied = ?live, "configuration reloaded");
    if let Err(e) = logs.set_filter(&config.ops.log_filter) {
        tracing::error!(cause = %e, "log level not changed");
    }
    running.reload(config);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Reload,
    Stop,
}

/// SIGHUP, SIGTERM and SIGINT (Ctrl-C).
struct Signals {
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    /// Kept for the whole run (not one `ctrl_c()` per wait), so that no signal is missed
    /// between two waits.
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                hup: signal(SignalKind::hangup())?,
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) -> Signal {
        // Biased: a SIGHUP sent before a SIGTERM is handled before it.
        #[cfg(unix)]
        tokio::select! {
            biased;
            _ = self.hup.recv() => Signal::Reload,
            _ = self.term.recv() => Signal::Stop,
            _ = self.int.recv() => Signal::Stop,
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Stop
        }
    }

    async fn next_stop(&mut self) {
        while self.next().await != Signal::Stop {}
    }
}
