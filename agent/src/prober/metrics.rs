//! The `/metrics/probes` registry: the same three families as the kubelet's (see
//! `shared/reference/kubelet-1.28/metrics-probes.txt`):
//!
//! - `prober_probe_total` (counter; prometheus-client appends `_total`, so it is
//!   registered as `prober_probe`), by `probe_type` (`Liveness`, `Readiness`,
//!   `Startup`), `result` (`successful`, `failed`, `unknown`), `container`, `pod`,
//!   `namespace`, `pod_uid`;
//! - `prober_probe_duration_seconds` (histogram with the Prometheus default buckets,
//!   as upstream sets none), by `probe_type`, `container`, `pod`, `namespace`, observed
//!   for successful probes only;
//! - `process_start_time_seconds` (gauge), which the Go client adds to every registry.
//!
//! prometheus-client ends every help text with a period, so the upstream texts are
//! registered without theirs. Label fields are declared in alphabetical order so that the text output orders
//! them as the Go client does. A worker removes its series when it stops, as upstream.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ProbeType;
use crate::metrics::{HistogramFamily, def_histogram};

/// `result` label value of a successful probe.
pub const RESULT_SUCCESSFUL: &str = "successful";
/// `result` label value of a failed probe.
pub const RESULT_FAILED: &str = "failed";
/// `result` label value of a probe with an unknown result.
pub const RESULT_UNKNOWN: &str = "unknown";

/// Labels of `prober_probe_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeTotalLabels {
    pub container: String,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub probe_type: String,
    pub result: String,
}

/// Labels of `prober_probe_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeDurationLabels {
    pub container: String,
    pub namespace: String,
    pub pod: String,
    pub probe_type: String,
}

/// The probe metric families and their registry.
#[derive(Debug)]
pub struct ProberMetrics {
    registry: Arc<Registry>,
    pub probe_total: Family<ProbeTotalLabels, Counter>,
    pub probe_duration: HistogramFamily<ProbeDurationLabels>,
    pub process_start_time: Gauge<f64, AtomicU64>,
}

impl Default for ProberMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProberMetrics {
    /// Creates the families in a registry of their own; `process_start_time_seconds`
    /// is this process's start time.
    #[must_use]
    pub fn new() -> Self {
        let probe_total = Family::<ProbeTotalLabels, Counter>::default();
        let probe_duration: HistogramFamily<ProbeDurationLabels> = Family::new_with_constructor(def_histogram);
        let process_start_time = Gauge::<f64, AtomicU64>::default();
        process_start_time.set(process_start_time_seconds());
        let mut registry = Registry::default();
        registry.register(
            "prober_probe",
            "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result",
            probe_total.clone(),
        );
        registry.register(
            "prober_probe_duration_seconds",
            "[ALPHA] Duration in seconds for a probe response",
            probe_duration.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "[ALPHA] Start time of the process since unix epoch in seconds",
            process_start_time.clone(),
        );
        Self { registry: Arc::new(registry), probe_total, probe_duration, process_start_time }
    }

    /// The registry to serve at `/metrics/probes`.
    #[must_use]
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The registry in the Prometheus text format (0.0.4, as the kubelet serves it).
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// The label sets of one worker.
#[derive(Debug)]
pub(super) struct WorkerLabels {
    successful: ProbeTotalLabels,
    failed: ProbeTotalLabels,
    unknown: ProbeTotalLabels,
    duration: ProbeDurationLabels,
}

impl WorkerLabels {
    pub(super) fn new(probe_type: ProbeType, container: &str, pod: &str, namespace: &str, pod_uid: &str) -> Self {
        let total = |result: &str| ProbeTotalLabels {
            container: container.to_string(),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            pod_uid: pod_uid.to_string(),
            probe_type: probe_type.as_str().to_string(),
            result: result.to_string(),
        };
        Self {
            successful: total(RESULT_SUCCESSFUL),
            failed: total(RESULT_FAILED),
            unknown: total(RESULT_UNKNOWN),
            duration: ProbeDurationLabels {
                container: container.to_string(),
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                probe_type: probe_type.as_str().to_string(),
            },
        }
    }

    /// Counts one probe: `Some(true)` successful, `Some(false)` failed, `None` unknown.
    /// Durations are kept for successful and unknown probes, as upstream.
    pub(super) fn observe(&self, m: &ProberMetrics, success: Option<bool>, elapsed: Duration) {
        match success {
            Some(true) => {
                m.probe_total.get_or_create(&self.successful).inc();
                m.probe_duration.get_or_create(&self.duration).observe(elapsed.as_secs_f64());
            }
            Some(false) => {
                m.probe_total.get_or_create(&self.failed).inc();
            }
            None => {
                m.probe_total.get_or_create(&self.unknown).inc();
                m.probe_duration.get_or_create(&self.duration).observe(elapsed.as_secs_f64());
            }
        }
    }

    /// Removes the worker's series.
    pub(super) fn remove(&self, m: &ProberMetrics) {
        m.probe_total.remove(&self.successful);
        m.probe_total.remove(&self.failed);
        m.probe_total.remove(&self.unknown);
        m.probe_duration.remove(&self.duration);
    }
}

/// This process's start time in seconds since the epoch, from `/proc` as the Go
/// client's process collector computes it; the current time if `/proc` cannot say.
fn process_start_time_seconds() -> f64 {
    proc_start_time()
        .unwrap_or_else(|| SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()))
}

fn proc_start_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) start with field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let start_ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| boot + start_ticks / ticks as f64)
}
