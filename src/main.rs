use clap::Parser;
use stategate::config::{Cli, CliCommand, Config};
use stategate::storage::{StorageKind, Store};
use tracing_subscriber::EnvFilter;

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
    let cli = Cli::parse();
    let args = match cli.command {
        Some(CliCommand::Client(cmd)) => std::process::exit(stategate::cli::run(cmd)),
        Some(CliCommand::Passwd(a)) => std::process::exit(stategate::access::passwd::run(&a)),
        Some(CliCommand::Serve(a)) => a,
        None => cli.serve,
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("stategate=info")))
        .init();
    let config = match Config::from_args(args) {
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
    if let Err(e) = runtime.block_on(serve(config)) {
        eprintln!("stategate: {e}");
        // A file that became unusable between the check and the start is still a usage error.
        let usage = matches!(
            e.downcast_ref::<stategate::StartError>(),
            Some(stategate::StartError::Access(_))
        );
        std::process::exit(if usage { EXIT_USAGE } else { 1 });
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let store = Store::open(&config.storage)
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
    let running = stategate::start(config, store).await?;
    let (host, port) = running.mqtt_broker();
    tracing::info!(host, port, "stategate is serving the state store over MQTT");
    let reloader = tokio::spawn(reload_on_hangup(running.access().clone()));
    shutdown_signal().await;
    reloader.abort();
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
}

/// SIGHUP re-reads the password, token and rules files; a bad file keeps the ones in force.
async fn reload_on_hangup(access: stategate::access::Access) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: the access files will not be reloaded");
            return;
        };
        while hup.recv().await.is_some() {
            if let Err(e) = access.reload() {
                tracing::error!(cause = %e, "reloading the access files failed; the previous ones stay in force");
            }
        }
    }
    #[cfg(not(unix))]
    let _ = access;
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
