use clap::Parser;
use stategate::config::{Cli, CliCommand, Config};
use stategate::storage::{StorageKind, Store};
use tracing_subscriber::EnvFilter;

/// Exit code for a bad command line or configuration (EX_USAGE).
const EXIT_USAGE: i32 = 64;

fn main() {
    // One rustls crypto provider for the whole process, before anything builds a TLS config.
    stategate::tls::install_provider();
    let cli = Cli::parse();
    let args = match cli.command {
        Some(CliCommand::Client(cmd)) => std::process::exit(stategate::cli::run(cmd)),
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
        std::process::exit(1);
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
    shutdown_signal().await;
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
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
