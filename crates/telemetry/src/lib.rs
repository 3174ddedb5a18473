//! What the service tells its operators, knowing nothing of the engine or the doors: logs,
//! metrics ([`metrics`]: the parts report through [`metrics::GaugeSource`]) and the masking of
//! secrets in what is logged ([`secret`]).
//!
//! Logs: `tracing` records to stderr as text (colours only on a terminal) or JSON lines, with a
//! filter that SIGHUP can change (`--log-level`). With the cargo feature `otlp`, spans are also
//! exported over OTLP/gRPC (see [`otlp`]).
//!
//! Every door's per-request span is at `debug` under the target [`REQUEST_SPANS`], so the
//! default filter (`info`) does not build one per request: measured on the HTTP door, the span
//! was about a sixth of the door's own CPU per GET (its fields are formatted when it opens).
//! `--log-level info,stategate::request=debug` turns them on; with OTLP export on they are on.

pub mod metrics;
pub mod secret;

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

/// How log records are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The target of every door's per-request span (`request`, with `door`, `command`,
/// `request_id`, `outcome`...), at `debug`.
pub const REQUEST_SPANS: &str = "stategate::request";

/// Changes the log filter of the running process.
pub struct LogControl {
    filter: reload::Handle<EnvFilter, Registry>,
    /// Spans are exported (OTLP): every filter also turns the request spans on.
    exporting: bool,
}

impl std::fmt::Debug for LogControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogControl")
    }
}

impl LogControl {
    /// Applies a new filter (validated by the configuration already).
    pub fn set_filter(&self, filter: &str) -> Result<(), String> {
        let f = EnvFilter::try_new(with_request_spans(filter, self.exporting)).map_err(|e| e.to_string())?;
        self.filter.reload(f).map_err(|e| e.to_string())
    }
}

/// Installs the global subscriber, with `log_filter` (a tracing filter) and `format`. Call
/// once, before the runtime starts.
pub fn init(log_filter: &str, format: LogFormat) -> LogControl {
    #[cfg(feature = "otlp")]
    let exported = otlp::layer();
    #[cfg(feature = "otlp")]
    let exporting = exported.is_some();
    #[cfg(not(feature = "otlp"))]
    let exporting = false;
    let filter = EnvFilter::try_new(with_request_spans(log_filter, exporting))
        .unwrap_or_else(|_| EnvFilter::new("stategate=info"));
    let (filter, handle) = reload::Layer::new(filter);
    let output = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // A log file or a pipe gets no escape codes.
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(filter).with(output);
    #[cfg(feature = "otlp")]
    let registry = registry.with(exported);
    if registry.try_init().is_err() {
        eprintln!("stategate: a log subscriber was already installed");
    }
    LogControl {
        filter: handle,
        exporting,
    }
}

/// `filter`, with the request spans on when spans are exported: a trace without its requests
/// would be of little use.
fn with_request_spans(filter: &str, exporting: bool) -> String {
    match exporting {
        true => format!("{filter},{REQUEST_SPANS}=debug"),
        false => filter.to_owned(),
    }
}

/// OTLP trace export (cargo feature `otlp`): set `OTEL_EXPORTER_OTLP_ENDPOINT` (the SDK's own
/// variables apply: `OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_TIMEOUT`, ...). Without the variable
/// nothing is exported.
#[cfg(feature = "otlp")]
pub mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer;

    pub fn layer<S>() -> Option<Box<dyn Layer<S> + Send + Sync>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT")?;
        let exporter = match opentelemetry_otlp::SpanExporter::builder().with_tonic().build() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("stategate: OTLP exporter: {e}");
                return None;
            }
        };
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("stategate")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("stategate");
        opentelemetry::global::set_tracer_provider(provider);
        Some(tracing_opentelemetry::layer().with_tracer(tracer).boxed())
    }
}
