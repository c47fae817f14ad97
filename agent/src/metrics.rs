//! The kubelet's own metric families (`/metrics`), with the upstream names, types,
//! label names and buckets (see `shared/reference/kubelet-1.28/metrics.txt`).
//!
//! prometheus-client appends `_total` to counters when encoding, so counters are
//! registered without it. Help texts keep the upstream `[ALPHA]` prefix so that
//! tools that diff kubelet scrapes see the same families.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upstream counters whose names do not end in `_total` (the Go client writes a counter's
/// name as given; prometheus-client always appends `_total`).
pub const COUNTERS_WITHOUT_TOTAL: &[&str] = &[
    "kubelet_pleg_discard_events",
    "kubelet_evictions",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
];

/// Makes a Prometheus text exposition read as the Go client writes it, so existing
/// dashboards and alerts match: [`COUNTERS_WITHOUT_TOTAL`] get their upstream names back
/// (`HELP`, `TYPE` and sample lines), and `le` / `quantile` values are written as Go's
/// `strconv.FormatFloat(v, 'g', -1, 64)` does (`5`, not `5.0`; `1e+06`).
#[must_use]
pub fn with_upstream_counter_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    write_with_upstream_counter_names(&mut out, text);
    out
}

/// [`with_upstream_counter_names`] appending to `out`: one pass over the text, each line
/// copied as is unless it names one of [`COUNTERS_WITHOUT_TOTAL`] or has `le`/`quantile`
/// values to rewrite, which are written in place (no allocation per line).
pub fn write_with_upstream_counter_names(out: &mut String, text: &str) {
    out.reserve(text.len());
    for line in text.split_inclusive('\n') {
        match strip_total(line) {
            Some((prefix, name, rest)) => {
                out.push_str(prefix);
                out.push_str(name);
                if prefix.is_empty() {
                    push_with_go_float_labels(out, rest);
                } else {
                    out.push_str(rest);
                }
            }
            None => push_with_go_float_labels(out, line),
        }
    }
}

/// A `HELP`, `TYPE` or sample line of a counter in [`COUNTERS_WITHOUT_TOTAL`], split into
/// what comes before the name (`# HELP `, `# TYPE ` or nothing), the upstream name, and
/// what follows `_total`.
fn strip_total(line: &str) -> Option<(&'static str, &'static str, &str)> {
    let (prefix, named) = if let Some(r) = line.strip_prefix("# HELP ") {
        ("# HELP ", r)
    } else if let Some(r) = line.strip_prefix("# TYPE ") {
        ("# TYPE ", r)
    } else {
        ("", line)
    };
    COUNTERS_WITHOUT_TOTAL.iter().find_map(|name| {
        let rest = named.strip_prefix(name)?.strip_prefix("_total")?;
        rest.starts_with([' ', '{']).then_some((prefix, *name, rest))
    })
}

/// Appends `line` with its `le="…"` / `quantile="…"` values in Go's float format.
fn push_with_go_float_labels(out: &mut String, line: &str) {
    if line.starts_with('#') || !(line.contains("le=\"") || line.contains("quantile=\"")) {
        out.push_str(line);
        return;
    }
    let mut rest = line;
    while let Some((start, key_len)) =
        ["le=\"", "quantile=\""].iter().filter_map(|k| rest.find(k).map(|p| (p, k.len()))).min()
    {
        let value_start = start + key_len;
        let Some(len) = rest[value_start..].find('"') else { break };
        let value = &rest[value_start..value_start + len];
        out.push_str(&rest[..value_start]);
        match value.parse::<f64>() {
            Ok(v) if v.is_finite() => crate::types::prom_text::write_go_float(out, v),
            _ => out.push_str(value),
        }
        rest = &rest[value_start + len..];
    }
    out.push_str(rest);
}

/// In an `OpenMetrics` exposition, [`COUNTERS_WITHOUT_TOTAL`] are typed `unknown` with
/// samples under upstream's names (`OpenMetrics` counters must end in `_total`, and a
/// scraper would store them so): what Prometheus stores is then what it stores from the
/// upstream kubelet's text.
#[must_use]
pub fn openmetrics_with_upstream_counter_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    write_openmetrics_with_upstream_counter_names(&mut out, text);
    out
}

/// [`openmetrics_with_upstream_counter_names`] appending to `out`.
pub fn write_openmetrics_with_upstream_counter_names(out: &mut String, text: &str) {
    /// What becomes of a line naming one of [`COUNTERS_WITHOUT_TOTAL`].
    enum Fix<'a> {
        /// Its `TYPE` line: `unknown`.
        Type(&'static str),
        /// A `_total` sample: under the upstream name, followed by this.
        Sample(&'static str, &'a str),
        /// A `_created` sample: left out.
        Drop,
    }
    out.reserve(text.len());
    for line in text.split_inclusive('\n') {
        let mut fix = None;
        for name in COUNTERS_WITHOUT_TOTAL {
            let after = |suffix: &str| {
                line.strip_prefix(name).and_then(|r| r.strip_prefix(suffix)).filter(|r| r.starts_with([' ', '{']))
            };
            if line
                .strip_prefix("# TYPE ")
                .and_then(|r| r.strip_prefix(name))
                .is_some_and(|r| r.starts_with(" counter"))
            {
                fix = Some(Fix::Type(name));
            } else if let Some(rest) = after("_total") {
                fix = Some(Fix::Sample(name, rest));
            } else if after("_created").is_some() {
                fix = Some(Fix::Drop);
            }
        }
        match fix {
            None => out.push_str(line),
            Some(Fix::Type(name)) => {
                out.push_str("# TYPE ");
                out.push_str(name);
                out.push_str(" unknown\n");
            }
            Some(Fix::Sample(name, rest)) => {
                out.push_str(name);
                out.push_str(rest);
            }
            Some(Fix::Drop) => {}
        }
    }
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)`: the shortest digits, as `%e` when the
/// decimal exponent is below -4 or at least 6 (`1e+06`, `5e-05`), else plain (`3600`,
/// `0.005`).
#[must_use]
pub fn go_float(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` and `{}` both give the shortest round-trip digits.
    let e = format!("{v:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        format!("{v}")
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Upstream `podStartupDurationBuckets` (seconds), for the pod start histograms.
pub const POD_STARTUP_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// `metrics.DefBuckets` of the Prometheus Go client.
pub const DEF_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The exemplar of a traced observation: the trace it belongs to, under the label name
/// Prometheus and Grafana look for (`trace_id`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceExemplar {
    pub trace_id: String,
}

/// A histogram whose observations may carry a trace id as their bucket's exemplar.
/// `OpenMetrics` shows the exemplars; Prometheus text 0.0.4 has no place for them.
pub type TracedHistogram = HistogramWithExemplars<TraceExemplar>;

/// Label set `operation_type`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: String,
}

/// Label set `image_size_in_bytes` of `kubelet_image_pull_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageSizeLabels {
    pub image_size_in_bytes: String,
}

/// Upstream `imagePullDurationBuckets` (seconds).
pub const IMAGE_PULL_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
    3600.0,
];

/// Upstream `GetImageSizeBucket`: the label of the size range an image falls in.
#[must_use]
pub fn image_size_bucket(bytes: u64) -> &'static str {
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;
    const BUCKETS: [(u64, &str); 12] = [
        (0, "0-10MB"),
        (10 * MIB, "10MB-100MB"),
        (100 * MIB, "100MB-500MB"),
        (500 * MIB, "500MB-1GB"),
        (GIB, "1GB-5GB"),
        (5 * GIB, "5GB-10GB"),
        (10 * GIB, "10GB-20GB"),
        (20 * GIB, "20GB-30GB"),
        (30 * GIB, "30GB-40GB"),
        (40 * GIB, "40GB-60GB"),
        (60 * GIB, "60GB-100GB"),
        (100 * GIB, "GT100GB"),
    ];
    BUCKETS.iter().rev().find(|(low, _)| bytes >= *low).map_or("0-10MB", |(_, l)| l)
}

/// Label set `reason` of `kubelet_image_garbage_collected_total`: `age` or `space`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageGcReasonLabels {
    pub reason: String,
}

/// Label set of the `kubelet_http_*` families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub path: String,
    pub server_type: String,
    pub long_running: String,
}

/// Label set `runtime_handler` of `kubelet_run_podsandbox_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeHandlerLabels {
    pub runtime_handler: String,
}

/// Label set `container_state` of `kubelet_running_containers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabels {
    pub container_state: String,
}

/// Label set `container_type` of `kubelet_started_containers_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerTypeLabels {
    pub container_type: String,
}

/// Label set of `kubelet_started_containers_errors_total`: the failure's reason as `code`
/// (`ErrImagePull`, `CreateContainerConfigError`, `RunContainerError`, ...) and the
/// `container_type`, in the order the Go client writes them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartedContainerErrorLabels {
    pub code: String,
    pub container_type: String,
}

/// Label set `static` (whether the pod comes from a non-API source).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StaticLabels {
    pub r#static: String,
}

/// Label set `node` of `kubelet_node_name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

/// Label set of `kubelet_working_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkingPodLabels {
    pub lifecycle: String,
    pub config: String,
    pub r#static: String,
}

/// Label set `metric_source` of `kubelet_volume_metric_collection_duration_seconds`: how
/// a usage was measured (`du` here; upstream also `fsquota`, `block` and CSI driver names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MetricSourceLabels {
    pub metric_source: String,
}

/// Label set `kind` of `kubelet_evented_pleg_kernel_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KernelEventLabels {
    pub kind: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn exponential_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(count);
    let mut v = start;
    for _ in 0..count {
        out.push(v);
        v *= factor;
    }
    out
}

fn runtime_op_histogram() -> Histogram {
    // pkg/kubelet/metrics: prometheus.ExponentialBuckets(.005, 2.5, 14).
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}

/// Every `kubelet_*` family this agent serves on `/metrics`.
#[derive(Debug)]
pub struct KubeletMetrics {
    pub runtime_operations: Family<OperationLabels, Counter>,
    pub runtime_operations_errors: Family<OperationLabels, Counter>,
    pub runtime_operations_duration: HistogramFamily<OperationLabels>,
    pub pleg_relist_duration: Histogram,
    pub pleg_relist_interval: Histogram,
    pub pleg_last_seen: Gauge<f64, AtomicU64>,
    /// Graceful node shutdown (`crate::nodeshutdown`): start and end, Unix seconds.
    pub graceful_shutdown_start_time: Gauge<f64, AtomicU64>,
    pub graceful_shutdown_end_time: Gauge<f64, AtomicU64>,
    pub pleg_discard_events: Counter,
    pub pod_worker_duration: HistogramFamily<OperationLabels>,
    pub pod_worker_start_duration: Histogram,
    pub running_pods: Gauge,
    pub running_containers: Family<ContainerStateLabels, Gauge>,
    pub started_pods: Counter,
    pub started_pods_errors: Counter,
    pub started_containers: Family<ContainerTypeLabels, Counter>,
    pub started_containers_errors: Family<StartedContainerErrorLabels, Counter>,
    /// Ephemeral containers in the spec of the pods the pod manager holds (upstream
    /// `ManagedEphemeralContainers`, kept by the pod manager's updates).
    pub managed_ephemeral_containers: Gauge,
    pub desired_pods: Family<StaticLabels, Gauge>,
    pub active_pods: Family<StaticLabels, Gauge>,
    pub working_pods: Family<WorkingPodLabels, Gauge>,
    pub restarted_pods: Family<StaticLabels, Counter>,
    pub orphaned_runtime_pods: Counter,
    pub cgroup_manager_duration: HistogramFamily<OperationLabels>,
    pub node_name: Family<NodeLabels, Gauge>,
    pub containers_per_pod: Histogram,
    pub pod_status_sync_duration: Histogram,
    /// Mirror pods seen on the API watch.
    pub mirror_pods: Gauge,
    /// Requests to the HTTPS API, in flight, and their durations.
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_inflight_requests: Family<HttpLabels, Gauge>,
    pub http_requests_duration: HistogramFamily<HttpLabels>,
    /// `RunPodSandbox` durations by runtime handler (`""`: the default).
    pub run_podsandbox_duration: HistogramFamily<RuntimeHandlerLabels>,
    /// Lifecycle `httpGet` hooks that fell back from HTTPS to HTTP.
    pub lifecycle_handler_http_fallbacks: Counter,
    /// Image pulls by the image's size range.
    pub image_pull_duration: Family<ImageSizeLabels, Histogram>,
    /// Orphaned pods whose volumes the last housekeeping sweep cleaned up.
    pub orphan_pod_cleaned_volumes: Gauge,
    /// Orphaned pods whose volumes the last sweep failed to clean up.
    pub orphan_pod_cleaned_volumes_errors: Gauge,
    /// From the agent first seeing a pod to the pod running. The pod start histograms
    /// carry the pod's start trace as an exemplar ([`TraceExemplar`]; `OpenMetrics` only).
    pub pod_start_duration: TracedHistogram,
    /// Images removed by image GC, by reason (`age`, `space`); upstream since 1.30.
    pub image_garbage_collected: Family<ImageGcReasonLabels, Counter>,
    /// The pod startup latency SLI: creation → all containers started and observed,
    /// minus image pulling.
    pub pod_start_sli_duration: TracedHistogram,
    /// Creation → all containers started and observed, image pulls included.
    pub pod_start_total_duration: TracedHistogram,
    /// How long measuring a usage took, by how it was measured (`du`): volumes, logs,
    /// `etc-hosts` and writable layers (see `stats::collector`).
    pub volume_metric_collection_duration: HistogramFamily<MetricSourceLabels>,
    /// swiftlet: kernel events received from the eBPF sensors, by kind.
    pub evented_pleg_kernel_events: Family<KernelEventLabels, Counter>,
    /// swiftlet: kernel events lost because the ring buffer was full.
    pub evented_pleg_ringbuf_drops: Counter,
    /// swiftlet: changes the safety-net relist found that the kernel path missed.
    pub evented_pleg_relist_repairs: Counter,
    /// swiftlet: kernel timestamp of a container's exec/exit → event handed to its pod worker.
    pub evented_pleg_event_latency: Histogram,
    /// swiftlet: 1 while the evented (eBPF) PLEG runs, 0 when relisting alone.
    pub evented_pleg_active: Gauge,
}

impl KubeletMetrics {
    /// Creates the families and registers them into `registry`.
    pub fn new(registry: &mut Registry, node_name: &str) -> Self {
        let m = Self {
            runtime_operations: Family::default(),
            runtime_operations_errors: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(runtime_op_histogram),
            pleg_relist_duration: def_histogram(),
            pleg_relist_interval: def_histogram(),
            pleg_last_seen: Gauge::default(),
            graceful_shutdown_start_time: Gauge::default(),
            graceful_shutdown_end_time: Gauge::default(),
            pleg_discard_events: Counter::default(),
            pod_worker_duration: Family::new_with_constructor(def_histogram),
            pod_worker_start_duration: def_histogram(),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
            started_pods: Counter::default(),
            started_pods_errors: Counter::default(),
            started_containers: Family::default(),
            started_containers_errors: Family::default(),
            managed_ephemeral_containers: Gauge::default(),
            desired_pods: Family::default(),
            active_pods: Family::default(),
            working_pods: Family::default(),
            restarted_pods: Family::default(),
            orphaned_runtime_pods: Counter::default(),
            cgroup_manager_duration: Family::new_with_constructor(def_histogram),
            node_name: Family::default(),
            // pkg/kubelet/metrics: prometheus.ExponentialBuckets(1, 2, 5).
            containers_per_pod: Histogram::new(exponential_buckets(1.0, 2.0, 5)),
            pod_status_sync_duration: def_histogram(),
            mirror_pods: Gauge::default(),
            http_requests: Family::default(),
            http_inflight_requests: Family::default(),
            http_requests_duration: Family::new_with_constructor(def_histogram),
            run_podsandbox_duration: Family::new_with_constructor(def_histogram),
            lifecycle_handler_http_fallbacks: Counter::default(),
            image_pull_duration: Family::new_with_constructor(|| Histogram::new(IMAGE_PULL_BUCKETS)),
            orphan_pod_cleaned_volumes: Gauge::default(),
            orphan_pod_cleaned_volumes_errors: Gauge::default(),
            pod_start_duration: TracedHistogram::new(POD_STARTUP_BUCKETS.into_iter()),
            pod_start_sli_duration: TracedHistogram::new(POD_STARTUP_BUCKETS.into_iter()),
            pod_start_total_duration: TracedHistogram::new(POD_STARTUP_BUCKETS.into_iter()),
            image_garbage_collected: Family::default(),
            volume_metric_collection_duration: Family::new_with_constructor(def_histogram),
            evented_pleg_kernel_events: Family::default(),
            evented_pleg_ringbuf_drops: Counter::default(),
            evented_pleg_relist_repairs: Counter::default(),
            // 50 µs .. ~1.6 s: the kernel path lives in the sub-millisecond range.
            evented_pleg_event_latency: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            evented_pleg_active: Gauge::default(),
        };
        m.node_name.get_or_create(&NodeLabels { node: node_name.to_string() }).set(1);
        m.register(registry);
        m
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "kubelet_runtime_operations",
            "[ALPHA] Cumulative number of runtime operations by operation type",
            self.runtime_operations.clone(),
        );
        r.register(
            "kubelet_runtime_operations_errors",
            "[ALPHA] Cumulative number of runtime operation errors by operation type",
            self.runtime_operations_errors.clone(),
        );
        r.register(
            "kubelet_runtime_operations_duration_seconds",
            "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type",
            self.runtime_operations_duration.clone(),
        );
        r.register(
            "kubelet_pleg_relist_duration_seconds",
            "[ALPHA] Duration in seconds for relisting pods in PLEG",
            self.pleg_relist_duration.clone(),
        );
        r.register(
            "kubelet_pleg_relist_interval_seconds",
            "[ALPHA] Interval in seconds between relisting in PLEG",
            self.pleg_relist_interval.clone(),
        );
        r.register(
            "kubelet_pleg_last_seen_seconds",
            "[ALPHA] Timestamp in seconds when PLEG was last seen active",
            self.pleg_last_seen.clone(),
        );
        // Upstream's help of both says "start".
        r.register(
            "kubelet_graceful_shutdown_start_time_seconds",
            "[ALPHA] Last graceful shutdown start time since unix epoch in seconds",
            self.graceful_shutdown_start_time.clone(),
        );
        r.register(
            "kubelet_graceful_shutdown_end_time_seconds",
            "[ALPHA] Last graceful shutdown start time since unix epoch in seconds",
            self.graceful_shutdown_end_time.clone(),
        );
        r.register(
            "kubelet_pleg_discard_events",
            "[ALPHA] The number of discard events in PLEG",
            self.pleg_discard_events.clone(),
        );
        r.register(
            "kubelet_pod_worker_duration_seconds",
            "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            self.pod_worker_duration.clone(),
        );
        r.register(
            "kubelet_pod_worker_start_duration_seconds",
            "[ALPHA] Duration in seconds from kubelet seeing a pod to starting a worker",
            self.pod_worker_start_duration.clone(),
        );
        r.register(
            "kubelet_running_pods",
            "[ALPHA] Number of pods that have a running pod sandbox",
            self.running_pods.clone(),
        );
        r.register(
            "kubelet_running_containers",
            "[ALPHA] Number of containers currently running",
            self.running_containers.clone(),
        );
        r.register("kubelet_started_pods", "[ALPHA] Cumulative number of pods started", self.started_pods.clone());
        r.register(
            "kubelet_started_pods_errors",
            "[ALPHA] Cumulative number of errors when starting pods",
            self.started_pods_errors.clone(),
        );
        r.register(
            "kubelet_started_containers",
            "[ALPHA] Cumulative number of containers started",
            self.started_containers.clone(),
        );
        r.register(
            "kubelet_started_containers_errors",
            "[ALPHA] Cumulative number of errors when starting containers",
            self.started_containers_errors.clone(),
        );
        r.register(
            "kubelet_managed_ephemeral_containers",
            "[ALPHA] Current number of ephemeral containers in pods managed by this kubelet",
            self.managed_ephemeral_containers.clone(),
        );
        r.register(
            "kubelet_desired_pods",
            "[ALPHA] The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver",
            self.desired_pods.clone(),
        );
        r.register(
            "kubelet_active_pods",
            "[ALPHA] The number of pods the kubelet considers active and which are being considered when admitting new pods. static is true if the pod is not from the apiserver",
            self.active_pods.clone(),
        );
        r.register(
            "kubelet_working_pods",
            "[ALPHA] Number of pods the kubelet is actually running, broken down by lifecycle phase, whether the pod is desired, orphaned, or runtime only (also orphaned), and whether the pod is static",
            self.working_pods.clone(),
        );
        r.register(
            "kubelet_restarted_pods",
            "[ALPHA] Number of pods that have been restarted because they were deleted and recreated with the same UID while the kubelet was watching them (common for static pods, extremely uncommon for API pods)",
            self.restarted_pods.clone(),
        );
        r.register(
            "kubelet_orphaned_runtime_pods",
            "[ALPHA] Number of pods that have been detected in the container runtime without being already known to the pod worker",
            self.orphaned_runtime_pods.clone(),
        );
        r.register(
            "kubelet_cgroup_manager_duration_seconds",
            "[ALPHA] Duration in seconds for cgroup manager operations. Broken down by method",
            self.cgroup_manager_duration.clone(),
        );
        r.register("kubelet_node_name", "[ALPHA] The node's name. The count is always 1", self.node_name.clone());
        r.register(
            "kubelet_evented_pleg_kernel_events",
            "Kernel events received from swiftlet's eBPF sensors, by kind",
            self.evented_pleg_kernel_events.clone(),
        );
        r.register(
            "kubelet_evented_pleg_ringbuf_drops",
            "Kernel events lost because the eBPF ring buffer was full",
            self.evented_pleg_ringbuf_drops.clone(),
        );
        r.register(
            "kubelet_evented_pleg_relist_repairs",
            "Container state changes found by the safety-net relist that the kernel path missed",
            self.evented_pleg_relist_repairs.clone(),
        );
        r.register(
            "kubelet_evented_pleg_event_latency_seconds",
            "Time from the kernel seeing a container's init exec or exit to the event reaching its pod worker",
            self.evented_pleg_event_latency.clone(),
        );
        r.register(
            "kubelet_evented_pleg_active",
            "1 while the evented (eBPF) PLEG runs, 0 when the relisting PLEG runs alone",
            self.evented_pleg_active.clone(),
        );
        r.register(
            "kubelet_pod_status_sync_duration_seconds",
            "[ALPHA] Duration in seconds to sync a pod status update. Measures time from detection of a change to pod status until the API is successfully updated for that pod, even if multiple intevening changes to pod status occur",
            self.pod_status_sync_duration.clone(),
        );
        r.register(
            "kubelet_mirror_pods",
            "[ALPHA] The number of mirror pods the kubelet will try to create (one per admitted static pod)",
            self.mirror_pods.clone(),
        );
        r.register(
            "kubelet_http_requests",
            "[ALPHA] Number of the http requests received since the server started",
            self.http_requests.clone(),
        );
        r.register(
            "kubelet_http_inflight_requests",
            "[ALPHA] Number of the inflight http requests",
            self.http_inflight_requests.clone(),
        );
        r.register(
            "kubelet_http_requests_duration_seconds",
            "[ALPHA] Duration in seconds to serve http requests",
            self.http_requests_duration.clone(),
        );
        r.register(
            "kubelet_run_podsandbox_duration_seconds",
            "[ALPHA] Duration in seconds of the run_podsandbox operations. Broken down by RuntimeClass.Handler",
            self.run_podsandbox_duration.clone(),
        );
        r.register(
            "kubelet_lifecycle_handler_http_fallbacks",
            "[ALPHA] The number of times lifecycle handlers successfully fell back to http from https",
            self.lifecycle_handler_http_fallbacks.clone(),
        );
        r.register(
            "kubelet_image_pull_duration_seconds",
            "[ALPHA] Duration in seconds to pull an image",
            self.image_pull_duration.clone(),
        );
        r.register(
            "kubelet_orphan_pod_cleaned_volumes",
            "[ALPHA] The total number of orphaned Pods whose volumes were cleaned in the last periodic sweep.",
            self.orphan_pod_cleaned_volumes.clone(),
        );
        r.register(
            "kubelet_orphan_pod_cleaned_volumes_errors",
            "[ALPHA] The number of orphaned Pods whose volumes failed to be cleaned in the last periodic sweep.",
            self.orphan_pod_cleaned_volumes_errors.clone(),
        );
        r.register(
            "kubelet_image_garbage_collected",
            "[ALPHA] Total number of images garbage collected by the kubelet, whether through disk usage or image age",
            self.image_garbage_collected.clone(),
        );
        r.register(
            "kubelet_pod_start_duration_seconds",
            "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            self.pod_start_duration.clone(),
        );
        r.register(
            "kubelet_pod_start_sli_duration_seconds",
            "[ALPHA] Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
            self.pod_start_sli_duration.clone(),
        );
        r.register(
            "kubelet_pod_start_total_duration_seconds",
            "[ALPHA] Duration in seconds to start a pod since creation, including time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
            self.pod_start_total_duration.clone(),
        );
        r.register(
            "kubelet_volume_metric_collection_duration_seconds",
            "[ALPHA] Duration in seconds to calculate volume stats",
            self.volume_metric_collection_duration.clone(),
        );
        r.register(
            "kubelet_containers_per_pod_count",
            "[ALPHA] The number of containers per pod",
            self.containers_per_pod.clone(),
        );
    }

    /// Records one runtime (CRI) operation: count, duration, and error if any.
    pub fn observe_runtime_operation(&self, operation: &str, seconds: f64, failed: bool) {
        let labels = OperationLabels { operation_type: operation.to_string() };
        self.runtime_operations.get_or_create(&labels).inc();
        self.runtime_operations_duration.get_or_create(&labels).observe(seconds);
        if failed {
            self.runtime_operations_errors.get_or_create(&labels).inc();
        }
    }

    /// Records how long measuring a usage took, by how it was measured (upstream
    /// `CollectVolumeStatCalDuration`; `du` for the stats module's walks).
    pub fn observe_volume_stat_duration(&self, metric_source: &str, took: std::time::Duration) {
        let labels = MetricSourceLabels { metric_source: metric_source.to_owned() };
        self.volume_metric_collection_duration.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// A set of metrics registered nowhere, for unit tests of other modules.
    #[must_use]
    pub fn unregistered() -> Self {
        Self::new(&mut Registry::default(), "test-node")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_size_buckets_as_upstream() {
        assert_eq!(image_size_bucket(0), "0-10MB");
        assert_eq!(image_size_bucket(10 * 1024 * 1024 - 1), "0-10MB");
        assert_eq!(image_size_bucket(10 * 1024 * 1024), "10MB-100MB");
        assert_eq!(image_size_bucket(3 << 30), "1GB-5GB");
        assert_eq!(image_size_bucket(200 << 30), "GT100GB");
    }

    use super::*;

    #[test]
    fn families_have_upstream_names_and_counter_suffixes() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        m.observe_runtime_operation("list_podsandbox", 0.01, true);
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &reg).unwrap();
        assert!(out.contains("kubelet_runtime_operations_total{operation_type=\"list_podsandbox\"} 1"));
        assert!(out.contains("kubelet_runtime_operations_errors_total{operation_type=\"list_podsandbox\"} 1"));
        assert!(
            out.contains(
                "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.0125\",operation_type=\"list_podsandbox\"} 1"
            ) || out.contains(
                "kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"list_podsandbox\",le=\"0.0125\"} 1"
            )
        );
        assert!(out.contains("kubelet_node_name{node=\"node-a\"} 1"));
        assert!(out.contains("# TYPE kubelet_pleg_relist_duration_seconds histogram"));
    }

    /// Upstream `kubelet_*` and `process_*` families of `/metrics` that swiftlet does not
    /// serve, each with the reason (the README lists them too).
    const NOT_SERVED: &[(&str, &str)] = &[
        ("kubelet_evented_pleg_connection_error_count", "upstream's CRI-events PLEG; swiftlet's is eBPF"),
        ("kubelet_evented_pleg_connection_latency_seconds", "upstream's CRI-events PLEG; swiftlet's is eBPF"),
        ("kubelet_evented_pleg_connection_success_count", "upstream's CRI-events PLEG; swiftlet's is eBPF"),
    ];

    /// (family as upstream names it, type, label names) from an exposition.
    fn families(text: &str) -> std::collections::BTreeMap<String, (String, std::collections::BTreeSet<String>)> {
        let mut out = std::collections::BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                out.insert(name.to_string(), (kind.to_string(), std::collections::BTreeSet::new()));
            } else if !line.starts_with('#') && !line.is_empty() {
                let name_end = line.find(['{', ' ']).unwrap();
                let sample = &line[..name_end];
                let family = out
                    .keys()
                    .filter(|f| {
                        sample == f.as_str()
                            || ["_bucket", "_sum", "_count"].iter().any(|s| sample.strip_suffix(s) == Some(f.as_str()))
                    })
                    .max_by_key(|f| f.len())
                    .cloned();
                if let (Some(f), Some(labels)) = (family, line[name_end..].strip_prefix('{')) {
                    let labels = &labels[..labels.find('}').unwrap()];
                    for kv in labels.split(',').filter(|kv| !kv.is_empty()) {
                        let key = kv.split('=').next().unwrap();
                        out.get_mut(&f).unwrap().1.insert(key.to_string());
                    }
                }
            }
        }
        out
    }

    #[test]
    fn floats_are_written_as_go_writes_them() {
        for (v, go) in [
            (5.0, "5"),
            (0.005, "0.005"),
            (3600.0, "3600"),
            (100_000.0, "100000"),
            (1e6, "1e+06"),
            (1_234_567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00005, "5e-05"),
            (2.5, "2.5"),
            (-1.0, "-1"),
            (0.0, "0"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
        let text =
            "# TYPE h histogram\nh_bucket{le=\"5.0\"} 1\nh_bucket{op=\"x\",le=\"+Inf\"} 2\ns{quantile=\"0.5\"} 1\n";
        assert_eq!(
            with_upstream_counter_names(text),
            "# TYPE h histogram\nh_bucket{le=\"5\"} 1\nh_bucket{op=\"x\",le=\"+Inf\"} 2\ns{quantile=\"0.5\"} 1\n"
        );
    }

    #[test]
    fn openmetrics_keeps_upstream_names_of_counters_without_total() {
        let text = "# HELP kubelet_evictions x.\n# TYPE kubelet_evictions counter\nkubelet_evictions_total{eviction_signal=\"memory.available\"} 2\nkubelet_evictions_created{eviction_signal=\"memory.available\"} 1.5e9\n# EOF\n";
        assert_eq!(
            openmetrics_with_upstream_counter_names(text),
            "# HELP kubelet_evictions x.\n# TYPE kubelet_evictions unknown\nkubelet_evictions{eviction_signal=\"memory.available\"} 2\n# EOF\n"
        );
    }

    #[test]
    fn families_match_the_reference_inventory() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        let _resource_managers = crate::cm::metrics::ResourceManagerMetrics::new(&mut reg);
        reg.register_collector(Box::new(crate::process_metrics::ProcessCollector::default()));
        let collection = std::sync::Arc::new(crate::stats::synthetic::collection(crate::stats::synthetic::Shape {
            pods: 1,
            devices: 0,
            interfaces: 0,
        }));
        reg.register_collector(Box::new(crate::stats::log_metrics::LogMetricsCollector::new(std::sync::Arc::new(
            move || Some(std::sync::Arc::clone(&collection)),
        ))));
        // One sample in each labelled family, so that its label names show.
        m.observe_runtime_operation("list_podsandbox", 0.01, true);
        m.pod_worker_duration.get_or_create(&OperationLabels { operation_type: "sync".into() }).observe(0.1);
        m.cgroup_manager_duration.get_or_create(&OperationLabels { operation_type: "update".into() }).observe(0.1);
        m.running_containers.get_or_create(&ContainerStateLabels { container_state: "running".into() }).set(1);
        m.started_containers.get_or_create(&ContainerTypeLabels { container_type: "container".into() }).inc();
        m.started_containers_errors
            .get_or_create(&StartedContainerErrorLabels {
                code: "RunContainerError".into(),
                container_type: "container".into(),
            })
            .inc();
        for f in [&m.desired_pods, &m.active_pods] {
            f.get_or_create(&StaticLabels { r#static: "false".into() }).set(1);
        }
        m.restarted_pods.get_or_create(&StaticLabels { r#static: "false".into() }).inc();
        m.working_pods
            .get_or_create(&WorkingPodLabels {
                lifecycle: "sync".into(),
                config: "desired".into(),
                r#static: "false".into(),
            })
            .set(1);
        let http = HttpLabels {
            method: "GET".into(),
            path: "pods".into(),
            server_type: "readwrite".into(),
            long_running: "false".into(),
        };
        m.http_requests.get_or_create(&http).inc();
        m.http_inflight_requests.get_or_create(&http).set(0);
        m.http_requests_duration.get_or_create(&http).observe(0.01);
        m.run_podsandbox_duration.get_or_create(&RuntimeHandlerLabels { runtime_handler: String::new() }).observe(0.5);
        m.image_pull_duration.get_or_create(&ImageSizeLabels { image_size_in_bytes: "0-10MB".into() }).observe(1.0);
        m.observe_volume_stat_duration("du", std::time::Duration::from_millis(3));
        let mut ours = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut ours, &reg).unwrap();
        let ours = families(&with_upstream_counter_names(&ours));

        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/reference/kubelet-1.28/metrics.txt");
        let reference = std::fs::read_to_string(path).unwrap();
        let mut problems = Vec::new();
        for line in reference.lines().filter(|l| !l.starts_with('#')) {
            let cols: Vec<&str> = line.split('\t').collect();
            let (name, kind, labels) = (cols[0], cols[1], cols[2]);
            if !(name.starts_with("kubelet_") || name.starts_with("process_")) {
                continue;
            }
            let want: std::collections::BTreeSet<String> =
                labels.split(',').filter(|l| *l != "-" && *l != "le" && *l != "quantile").map(str::to_string).collect();
            match ours.get(name) {
                None if NOT_SERVED.iter().any(|(n, _)| *n == name) => {}
                None => problems.push(format!("{name}: not served and not listed as such")),
                Some((k, _)) if k != kind => problems.push(format!("{name}: type {k}, upstream {kind}")),
                Some((_, got)) => {
                    let got: std::collections::BTreeSet<String> = got.iter().filter(|l| *l != "le").cloned().collect();
                    if got != want {
                        problems.push(format!("{name}: labels {got:?}, upstream {want:?}"));
                    }
                }
            }
        }
        for (name, _) in NOT_SERVED {
            if ours.contains_key(*name) {
                problems.push(format!("{name} is served now: take it off NOT_SERVED and the README"));
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn counters_without_total_keep_upstream_names() {
        let text = "# HELP kubelet_pleg_discard_events_total [ALPHA] x.\n# TYPE kubelet_pleg_discard_events_total counter\nkubelet_pleg_discard_events_total 3\nkubelet_pleg_discard_events_totalx 1\nkubelet_started_pods_total 2\n";
        assert_eq!(
            with_upstream_counter_names(text),
            "# HELP kubelet_pleg_discard_events [ALPHA] x.\n# TYPE kubelet_pleg_discard_events counter\nkubelet_pleg_discard_events 3\nkubelet_pleg_discard_events_totalx 1\nkubelet_started_pods_total 2\n"
        );
    }

    /// The rewriting as it was first written (a `String` per line, `format!` per float),
    /// kept to check that the one-pass rewriting writes the same bytes.
    fn obvious_upstream_names(text: &str) -> String {
        let mut out = String::new();
        for line in text.split_inclusive('\n') {
            let mut line = line.to_owned();
            for name in COUNTERS_WITHOUT_TOTAL {
                for prefix in ["# HELP ", "# TYPE ", ""] {
                    if let Some(rest) = line.strip_prefix(&format!("{prefix}{name}_total"))
                        && rest.starts_with([' ', '{'])
                    {
                        line = format!("{prefix}{name}{rest}");
                    }
                }
            }
            if !line.starts_with('#') {
                let mut fixed = String::new();
                let mut rest = line.as_str();
                while let Some((start, key)) =
                    ["le=\"", "quantile=\""].iter().filter_map(|k| rest.find(k).map(|p| (p, k.len()))).min()
                {
                    let Some(len) = rest[start + key..].find('"') else { break };
                    let value = &rest[start + key..start + key + len];
                    fixed.push_str(&rest[..start + key]);
                    match value.parse::<f64>() {
                        Ok(v) if v.is_finite() => fixed.push_str(&go_float(v)),
                        _ => fixed.push_str(value),
                    }
                    rest = &rest[start + key + len..];
                }
                fixed.push_str(rest);
                line = fixed;
            }
            out.push_str(&line);
        }
        out
    }

    /// The `OpenMetrics` rewriting as first written.
    fn obvious_openmetrics_names(text: &str) -> String {
        let mut out = String::new();
        for line in text.split_inclusive('\n') {
            let mut fixed = None;
            for name in COUNTERS_WITHOUT_TOTAL {
                if line.starts_with(&format!("# TYPE {name} counter")) {
                    fixed = Some(format!("# TYPE {name} unknown\n"));
                } else if let Some(rest) =
                    line.strip_prefix(&format!("{name}_total")).filter(|r| r.starts_with([' ', '{']))
                {
                    fixed = Some(format!("{name}{rest}"));
                } else if line.strip_prefix(&format!("{name}_created")).is_some_and(|r| r.starts_with([' ', '{'])) {
                    fixed = Some(String::new());
                }
            }
            out.push_str(fixed.as_deref().unwrap_or(line));
        }
        out
    }

    #[test]
    fn one_pass_rewriting_writes_what_the_obvious_one_did() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        let eviction = crate::eviction::EvictionMetrics::new(&mut reg);
        eviction
            .evictions
            .get_or_create(&crate::eviction::metrics::SignalLabels { eviction_signal: "memory.available".into() })
            .inc();
        m.pleg_discard_events.inc();
        for (i, op) in ["list_podsandbox", "version", "image_status"].iter().enumerate() {
            m.observe_runtime_operation(op, 0.003 * i as f64, i == 1);
        }
        m.pod_start_duration.observe(1.5, Some(TraceExemplar { trace_id: "abc".into() }), None);
        m.evented_pleg_event_latency.observe(0.000_2);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &reg).unwrap();
        // Lines the registry does not write: a HELP text and labels that look like `le`,
        // an unclosed value, a TYPE line that only starts like a counter's.
        text.push_str("# HELP kubelet_evictions_total help with le=\"5.0\"\n");
        text.push_str(
            "x{file=\"5.0\",le=\"1e6\",quantile=\"0.50\"} 1\nx{handle=\"nan\",le=\"+Inf\"} 2\ny{le=\"3.0 1\n",
        );
        text.push_str("kubelet_evictions_total{le=\"2.0\"} 1\n# TYPE kubelet_evictions counterish\n");
        assert_eq!(with_upstream_counter_names(&text), obvious_upstream_names(&text));
        let mut open = String::new();
        prometheus_client::encoding::text::encode(&mut open, &reg).unwrap();
        open.push_str("# TYPE kubelet_evictions counterish\nkubelet_pleg_discard_events_created 1\n");
        assert_eq!(openmetrics_with_upstream_counter_names(&open), obvious_openmetrics_names(&open));
    }

    #[test]
    fn runtime_buckets_match_upstream() {
        let b = exponential_buckets(0.005, 2.5, 14);
        assert_eq!(b.len(), 14);
        assert!((b[13] - 0.005 * 2.5f64.powi(13)).abs() < 1e-9);
    }

    /// One sample in each labelled family, so that every family and its label names show.
    fn sample_every_family(m: &KubeletMetrics) {
        m.observe_runtime_operation("list_podsandbox", 0.01, true);
        m.pod_worker_duration.get_or_create(&OperationLabels { operation_type: "sync".into() }).observe(0.1);
        m.cgroup_manager_duration.get_or_create(&OperationLabels { operation_type: "update".into() }).observe(0.1);
        m.running_containers.get_or_create(&ContainerStateLabels { container_state: "running".into() }).set(1);
        m.started_containers.get_or_create(&ContainerTypeLabels { container_type: "container".into() }).inc();
        m.started_containers_errors
            .get_or_create(&StartedContainerErrorLabels {
                code: "RunContainerError".into(),
                container_type: "container".into(),
            })
            .inc();
        m.desired_pods.get_or_create(&StaticLabels { r#static: "false".into() }).set(1);
        m.active_pods.get_or_create(&StaticLabels { r#static: "true".into() }).set(2);
        m.restarted_pods.get_or_create(&StaticLabels { r#static: "false".into() }).inc();
        m.working_pods
            .get_or_create(&WorkingPodLabels {
                lifecycle: "sync".into(),
                config: "desired".into(),
                r#static: "false".into(),
            })
            .set(1);
        let http = HttpLabels {
            method: "GET".into(),
            path: "pods".into(),
            server_type: "readwrite".into(),
            long_running: "false".into(),
        };
        m.http_requests.get_or_create(&http).inc();
        m.http_inflight_requests.get_or_create(&http).set(0);
        m.http_requests_duration.get_or_create(&http).observe(0.01);
        m.run_podsandbox_duration.get_or_create(&RuntimeHandlerLabels { runtime_handler: String::new() }).observe(0.5);
        m.image_pull_duration.get_or_create(&ImageSizeLabels { image_size_in_bytes: "0-10MB".into() }).observe(1.0);
        m.image_garbage_collected.get_or_create(&ImageGcReasonLabels { reason: "age".into() }).inc();
        m.observe_volume_stat_duration("du", std::time::Duration::from_millis(3));
        m.evented_pleg_kernel_events.get_or_create(&KernelEventLabels { kind: "exit".into() }).inc();
    }

    /// The registry renders the families it rendered before the split into per-subsystem
    /// structs: names, types, help texts, label names and bucket layouts, line for line
    /// (sorted: the registration order is not part of what scrapers see).
    #[test]
    fn families_render_as_before_the_split() {
        let mut reg = Registry::default();
        let m = KubeletMetrics::new(&mut reg, "node-a");
        sample_every_family(&m);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &reg).unwrap();
        let sorted = |t: &str| {
            let mut lines: Vec<String> = t.lines().map(str::to_owned).collect();
            lines.sort();
            lines
        };
        let before = include_str!("kubelet_metrics.snapshot.txt");
        assert_eq!(sorted(&text), sorted(before));
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE ")).count(), 46);
    }
}
