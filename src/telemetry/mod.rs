//! Logs and traces: the `tracing` subscriber, and, with `--otlp-endpoint` (or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), OpenTelemetry export of the spans over OTLP/HTTP.
//!
//! Spans: `http` (one per request; a W3C `traceparent` from the caller becomes its parent),
//! `run` (app, user, session, run and invocation ids), `agent`, `chat` (a model call, with the
//! GenAI semantic-convention attributes `gen_ai.system`, `gen_ai.request.model` and token
//! usage), `execute_tool` and `commit`. Model and HTTP-tool requests carry the current span's
//! `traceparent`, so the trace continues in the provider's or the tool's own traces.
//!
//! Apart from export, the spans of recent runs can be kept in memory for ADK's web UI
//! ([`traces`], `--trace-spans`).

pub mod traces;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Where traces go.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The collector's base URL (`http://collector:4318`); `/v1/traces` is appended unless the
    /// URL already ends with it.
    pub endpoint: String,
    /// `http/protobuf` (default) or `http/json`.
    pub protocol: String,
}

/// Keeps the exporter alive; [`Telemetry::shutdown`] flushes what is buffered.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown() {
                eprintln!("trace export shutdown: {e}");
            }
        }
    }
}

/// The subscriber of a one-shot command (`migrate`, `prune`, `keys`): log lines to standard
/// error, so that standard output holds only the command's answer (the JSON a script reads;
/// a slow statement's warning there once broke `agentd prune`'s report under load).
pub fn init_cli() -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("agentd=info,tower_http=info"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .try_init()?;
    Ok(())
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber: log lines in `format`, filtered by `RUST_LOG`, plus the
/// OpenTelemetry layer when `otlp` is given (it sees every span at INFO and above, whatever
/// `RUST_LOG` says, so traces are whole even when logs are quiet), plus, when `keep_spans` is
/// more than 0, the layer that keeps the spans of recent runs ([`traces`]).
pub fn init(
    format: LogFormat,
    otlp: Option<&OtlpConfig>,
    keep_spans: usize,
) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("agentd=info,tower_http=info"));
    let fmt = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .boxed(),
    }
    .with_filter(filter);
    let Some(otlp) = otlp else {
        tracing_subscriber::registry()
            .with(fmt)
            .with(keep_layer(keep_spans))
            .init();
        return Ok(Telemetry { provider: None });
    };
    let protocol = match otlp.protocol.as_str() {
        "http/protobuf" | "" => Protocol::HttpBinary,
        "http/json" => Protocol::HttpJson,
        other => anyhow::bail!(
            "OTLP protocol {other:?} is not supported (use http/protobuf or http/json)"
        ),
    };
    let base = otlp.endpoint.trim_end_matches('/');
    let endpoint = if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| anyhow::anyhow!("cannot build the OTLP exporter: {e}"))?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "agentd".into());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("agentd");
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .with(keep_layer(keep_spans))
        .init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The layer that keeps runs' spans, when `spans` is more than 0: it sees agentd's own spans at
/// INFO and above, whatever `RUST_LOG` says.
fn keep_layer<S>(spans: usize) -> Option<impl Layer<S>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let agentd =
        tracing_subscriber::filter::Targets::new().with_target("agentd", tracing::Level::INFO);
    traces::keep(spans).map(|layer| layer.with_filter(agentd))
}

/// Makes the caller's `traceparent` (if any) the parent of `span`.
pub fn continue_trace(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let cx = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&opentelemetry_http::HeaderExtractor(headers))
    });
    // Without the OpenTelemetry layer (no --otlp-endpoint) there is nothing to attach to.
    let _ = span.set_parent(cx);
}

/// Adds the current span's `traceparent` to an outgoing request's headers.
pub fn inject_trace(headers: &mut reqwest::header::HeaderMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers))
    });
}
