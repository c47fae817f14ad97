//! Logging and OpenTelemetry traces.
//!
//! **Logging**: a `tracing` subscriber whose verbosity follows the kubelet's `--v` (0–10)
//! unless `RUST_LOG` is set, as text or JSON on stderr.
//!
//! **Traces** (only when `KubeletConfiguration` `tracing` is set, as upstream): spans go
//! through `tracing-opentelemetry` to an OTLP gRPC exporter (tonic) at `tracing.endpoint`
//! (default `localhost:4317`, plain text; see [`CollectorEndpoint`] for the forms). The
//! sampler is upstream's: parent-based, and for root spans a trace-id ratio of
//! `samplingRatePerMillion` / 10⁶ (default 0: a trace starts only when a caller sent a
//! sampled parent). The resource carries `service.name=kubelet` (upstream's name, so
//! existing trace queries and dashboards find the node agent) and `host.name` = the node
//! name, plus the SDK's `telemetry.sdk.*` and whatever `OTEL_RESOURCE_ATTRIBUTES` adds.
//! Spans are queued (2048 at most, then dropped) and exported in batches by the SDK's own
//! thread, so a slow, failing or absent collector costs the agent nothing but those
//! spans; [`Telemetry::shutdown`] exports what is queued at exit, within
//! [`SHUTDOWN_TIMEOUT`].
//!
//! Which spans are exported: only those with target [`SPAN_TARGET`], built by the
//! functions here so names and attributes match upstream: [`sync_pod_span`],
//! [`sync_terminating_pod_span`], [`sync_terminated_pod_span`] (`pkg/kubelet` `syncPod`,
//! ...) and [`cri_span`] (what otelgrpc records for each CRI call). Other `tracing` spans
//! (`pod_worker`, `sync_loop`, ...) only give log lines their context, and the trace
//! spans are kept out of the log lines. CRI requests carry the W3C `traceparent` of
//! their span ([`PropagateTraceContext`]), as upstream's otelgrpc interceptor sends.

mod endpoint;
#[cfg(any(test, feature = "test-collector"))]
pub mod test_collector;
#[cfg(test)]
mod tests;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use opentelemetry::KeyValue;
use opentelemetry::propagation::{Injector, TextMapPropagator as _};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider};
use tracing::Span;
use tracing::field::Empty;
use tracing_subscriber::filter::{FilterExt as _, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

pub use crate::types::collector_endpoint::{CollectorEndpoint, DEFAULT_ENDPOINT};

/// The `tracing` target of the spans that are exported (and kept out of the logs).
pub const SPAN_TARGET: &str = "otel";

/// `service.name` of the resource: upstream's `componentKubelet`.
pub const SERVICE_NAME: &str = "kubelet";

/// The instrumentation scope: upstream's kubelet tracer name.
const INSTRUMENTATION_SCOPE: &str = "k8s.io/kubernetes/pkg/kubelet";

/// How long one export may take before it is abandoned.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Spans waiting for export; more are dropped (the SDK default, as Go's).
const MAX_QUEUE_SIZE: usize = 2048;

/// How long [`Telemetry::shutdown`] waits for the last export: short, since SIGTERM must
/// end the agent within 2 s (see `agent::SHUTDOWN_GRACE`); a collector that cannot take
/// the last batch in that time loses it.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_millis(500);

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `tracing.endpoint` is unusable (validated configurations never have one; this
    /// guards other callers).
    #[error("tracing.endpoint: {0}")]
    Endpoint(String),
    /// The channel to the collector could not be built (e.g. TLS setup).
    #[error("tracing.endpoint {endpoint}: {source}")]
    Channel {
        /// The endpoint.
        endpoint: String,
        /// What failed.
        #[source]
        source: tonic::transport::Error,
    },
    /// The OTLP exporter could not be built.
    #[error("building the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What trace export needs: `KubeletConfiguration` `tracing` and the node name (built by
/// `settings::tracing`; no `tracing` there means no traces at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingSettings {
    /// `tracing.endpoint`. Default: [`DEFAULT_ENDPOINT`].
    pub endpoint: CollectorEndpoint,
    /// `tracing.samplingRatePerMillion` (0..=1 000 000). Default: 0.
    pub sampling_rate_per_million: u32,
    /// `host.name` of the resource.
    pub node_name: String,
}

impl TracingSettings {
    /// Upstream's sampler: follow the parent's decision; roots by trace-id ratio (never
    /// at rate 0).
    fn sampler(&self) -> Sampler {
        let root = match self.sampling_rate_per_million {
            0 => Sampler::AlwaysOff,
            rate => Sampler::TraceIdRatioBased(f64::from(rate) / 1_000_000.0),
        };
        Sampler::ParentBased(Box::new(root))
    }
}

/// The installed telemetry: keep it for the life of the process and call
/// [`Telemetry::shutdown`] at exit.
#[derive(Debug, Default)]
#[must_use = "call shutdown() at exit so that queued spans are exported"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// The export pipeline for `settings`, without installing anything. Must be called
    /// within a tokio runtime (the gRPC channel's tasks run there); it does not connect:
    /// a collector that is down is not an error.
    pub fn exporting(settings: &TracingSettings) -> Result<Self> {
        let channel = endpoint::channel(&settings.endpoint, EXPORT_TIMEOUT)
            .map_err(|source| Error::Channel { endpoint: settings.endpoint.to_string(), source })?;
        let exporter = {
            use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_channel(channel)
                .with_timeout(EXPORT_TIMEOUT)
                .build()?
        };
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(BatchConfigBuilder::default().with_max_queue_size(MAX_QUEUE_SIZE).build())
            .build();
        let resource = Resource::builder()
            .with_service_name(SERVICE_NAME)
            .with_attribute(KeyValue::new("host.name", settings.node_name.clone()))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_sampler(settings.sampler())
            .with_resource(resource)
            .with_span_processor(processor)
            .build();
        Ok(Self { provider: Some(provider) })
    }

    /// Whether spans are exported.
    #[must_use]
    pub fn tracing_enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// The layer that turns [`SPAN_TARGET`] spans into OpenTelemetry spans (`None` when
    /// tracing is off).
    #[must_use]
    pub fn layer<S>(&self) -> Option<impl Layer<S> + use<S>>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let tracer = self.provider.as_ref()?.tracer(INSTRUMENTATION_SCOPE);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Only the attributes upstream records: no code locations, targets, thread
            // ids or busy/idle times.
            .with_location(false)
            .with_target(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            // Parents come from the `tracing` span tree alone (the nearest trace span),
            // not from a thread-local OpenTelemetry context that entering would set.
            .with_context_activation(false);
        Some(layer.with_filter(Targets::new().with_target(SPAN_TARGET, LevelFilter::TRACE)))
    }

    /// Exports the queued spans now (blocking; tests and callers that must not lose
    /// them). Errors are logged.
    pub fn flush(&self) {
        if let Some(provider) = &self.provider
            && let Err(error) = provider.force_flush()
        {
            tracing::warn!(%error, "exporting spans");
        }
    }

    /// Exports the queued spans and stops the exporter, waiting at most
    /// [`SHUTDOWN_TIMEOUT`]. Blocking: call it outside async code, while the tokio
    /// runtime that [`init`] ran in is still alive (after `block_on` returns).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT)
        {
            tracing::warn!(%error, "stopping the span exporter");
        }
    }
}

/// Maps klog verbosity to a filter: 0–1 info, 2–4 debug for swiftlet, 5+ trace.
#[must_use]
pub fn filter_for_verbosity(v: u8) -> String {
    match v {
        0 | 1 => "info".into(),
        2..=4 => "info,swiftlet=debug".into(),
        _ => "debug,swiftlet=trace".into(),
    }
}

/// Installs the global subscriber (once; later calls install nothing) and, when
/// `tracing` is given, the OTLP export. With `tracing`, call it within the tokio runtime
/// the agent runs in (e.g. under `Runtime::enter`).
pub fn init(verbosity: u8, json: bool, tracing: Option<&TracingSettings>) -> Result<Telemetry> {
    let telemetry = match tracing {
        Some(settings) => Telemetry::exporting(settings)?,
        None => Telemetry::default(),
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter_for_verbosity(verbosity)));
    // Colours only for a terminal: log files and journald must not get escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = subscriber(filter, json, ansi, std::io::stderr, &telemetry).try_init();
    if let Some(settings) = tracing {
        tracing::info!(
            endpoint = %settings.endpoint,
            sampling_rate_per_million = settings.sampling_rate_per_million,
            "exporting OpenTelemetry traces"
        );
    }
    Ok(telemetry)
}

/// The agent's subscriber: log lines (text or JSON) to `writer` as `filter` allows, and
/// the trace layer of `telemetry`.
fn subscriber<W>(
    filter: EnvFilter,
    json: bool,
    ansi: bool,
    writer: W,
    telemetry: &Telemetry,
) -> impl tracing::Subscriber + Send + Sync + use<W>
where
    W: for<'writer> tracing_subscriber::fmt::MakeWriter<'writer> + Send + Sync + 'static,
{
    // Trace spans stay out of the log lines: their attributes would repeat on every line.
    let not_traces = Targets::new().with_default(LevelFilter::TRACE).with_target(SPAN_TARGET, LevelFilter::OFF);
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi);
    let fmt = if json { fmt.json().boxed() } else { fmt.boxed() };
    tracing_subscriber::registry().with(fmt.with_filter(filter.and(not_traces))).with(telemetry.layer())
}

/// `syncPod` (upstream `Kubelet.SyncPod`): `update_type` is `create`, `update`, `sync`
/// or `kill`.
#[must_use]
pub fn sync_pod_span(uid: &str, pod: Option<&Pod>, update_type: &str) -> Span {
    pod_sync_span("syncPod", uid, pod, Some(update_type))
}

/// `syncTerminatingPod` (upstream `Kubelet.SyncTerminatingPod`).
#[must_use]
pub fn sync_terminating_pod_span(uid: &str, pod: Option<&Pod>) -> Span {
    pod_sync_span("syncTerminatingPod", uid, pod, None)
}

/// `syncTerminatedPod` (upstream `Kubelet.SyncTerminatedPod`).
#[must_use]
pub fn sync_terminated_pod_span(uid: &str, pod: Option<&Pod>) -> Span {
    pod_sync_span("syncTerminatedPod", uid, pod, None)
}

/// One of the pod worker's sync spans, named `name`, with the pod's attributes and, for
/// `syncPod`, `k8s.pod.update_type`.
fn pod_sync_span(name: &'static str, uid: &str, pod: Option<&Pod>, update_type: Option<&str>) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "pod_sync",
        otel.name = name,
        k8s.pod.uid = uid,
        k8s.pod = Empty,
        k8s.pod.name = Empty,
        k8s.pod.update_type = Empty,
        k8s.namespace.name = Empty,
    );
    if let Some(update_type) = update_type {
        span.record("k8s.pod.update_type", update_type);
    }
    record_pod(&span, pod);
    span
}

/// The root of a pod's start trace (beyond upstream, see [`crate::pod_startup`]): from
/// the agent first seeing the pod to its `Ready` condition. A root whatever span is
/// current, so that it is sampled on its own.
pub fn pod_startup_span(pod: &Pod) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        parent: None,
        "podStartup",
        k8s.pod.uid = pod.metadata.uid.as_deref().unwrap_or_default(),
        k8s.pod = Empty,
        k8s.pod.name = Empty,
        k8s.namespace.name = Empty,
        k8s.pod.start.outcome = Empty,
    );
    record_pod(&span, Some(pod));
    span
}

/// One step of a pod start, a child of the current trace span: `admitPod`,
/// `waitForAttachAndMount` (volume setup), `ensureImageExists` (the image, pulled or
/// not: `container.image.name`), `startContainer` (create, start and postStart of one
/// container); `container` names the container (`k8s.container.name`) or is empty.
pub fn pod_step_span(step: &'static str, container: &str, image: &str) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "pod_step",
        otel.name = step,
        k8s.container.name = Empty,
        container.image.name = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    );
    if !container.is_empty() {
        span.record("k8s.container.name", container);
    }
    if !image.is_empty() {
        span.record("container.image.name", image);
    }
    span
}

/// Marks `span` as failed with `message` (the OpenTelemetry span status).
pub fn record_error(span: &Span, message: &str) {
    span.record("otel.status_code", "error");
    span.record("otel.status_description", message);
}

/// Makes `span`'s trace parent `parent` (the `tracing` tree, and so the log context,
/// stays as it is). Call before `span` is first entered.
pub fn set_trace_parent(span: &Span, parent: &Span) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() || parent.is_disabled() {
        return;
    }
    // Fails only when no OpenTelemetry layer is installed (tracing is off): nothing to do.
    let _ = span.set_parent(parent.context());
}

/// The trace id of `span` (lowercase hex) when it is recorded and sampled.
#[must_use]
pub fn sampled_trace_id(span: &Span) -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    (span_context.is_valid() && span_context.is_sampled()).then(|| span_context.trace_id().to_string())
}

/// Adds the event `name` with `attributes` to `span`, at `when`.
pub fn add_span_event(span: &Span, name: &'static str, when: std::time::SystemTime, attributes: Vec<KeyValue>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if !span.is_disabled() {
        span.add_event_with_timestamp(name, when, attributes);
    }
}

/// `k8s.pod` (`namespace/name`, as `klog.KObj`), `k8s.pod.name`, `k8s.namespace.name`.
/// A pod the agent only knows from the runtime (an orphan) has its UID alone.
fn record_pod(span: &Span, pod: Option<&Pod>) {
    let Some(meta) = pod.map(|p| &p.metadata) else { return };
    if span.is_disabled() {
        return;
    }
    let name = meta.name.as_deref().unwrap_or_default();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let object = if namespace.is_empty() { name.to_owned() } else { format!("{namespace}/{name}") };
    span.record("k8s.pod", object.as_str());
    span.record("k8s.pod.name", name);
    span.record("k8s.namespace.name", namespace);
}

/// A client span for one gRPC call, as otelgrpc records it: named after the full method
/// (`runtime.v1.RuntimeService/RunPodSandbox`), kind client, `rpc.system=grpc`,
/// `rpc.service`, `rpc.method`; [`record_grpc_status`] adds the outcome.
pub fn cri_span(full_method: &'static str) -> Span {
    let (service, method) = full_method.split_once('/').unwrap_or(("", full_method));
    tracing::info_span!(
        target: SPAN_TARGET,
        "grpc_client",
        otel.name = full_method,
        otel.kind = "client",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Records a call's gRPC status on its [`cri_span`]: `rpc.grpc.status_code` always, and
/// for anything but OK the span status error with the status message, as otelgrpc.
pub fn record_grpc_status(span: &Span, code: tonic::Code, message: &str) {
    span.record("rpc.grpc.status_code", i64::from(code as i32));
    if code != tonic::Code::Ok {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", message);
    }
}

/// Writes the W3C `traceparent` (and `tracestate`) of the current span into `metadata`;
/// nothing when no trace is being recorded.
pub fn inject_trace_context(metadata: &mut tonic::metadata::MetadataMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let current = Span::current();
    if current.is_disabled() {
        return;
    }
    let context = current.context();
    if context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&context, &mut MetadataInjector(metadata));
    }
}

/// A tonic interceptor that sends the current span's trace context with each request,
/// as otelgrpc does for the kubelet's CRI client.
#[derive(Debug, Clone, Copy, Default)]
pub struct PropagateTraceContext;

impl tonic::service::Interceptor for PropagateTraceContext {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        inject_trace_context(request.metadata_mut());
        Ok(request)
    }
}

/// gRPC metadata as an OpenTelemetry propagation carrier.
struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}
