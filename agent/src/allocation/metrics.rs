//! The resize metric families of upstream 1.33+ (`pkg/kubelet/metrics`), all ALPHA:
//! `kubelet_container_requested_resizes_total{resource,requirement,operation}`,
//! `kubelet_pod_resize_duration_milliseconds{success}`,
//! `kubelet_pod_infeasible_resizes_total{reason_detail}`,
//! `kubelet_pod_pending_resizes{reason}`, `kubelet_pod_in_progress_resizes` and
//! `kubelet_pod_deferred_accepted_resizes_total{retry_trigger}`.

use k8s_openapi::api::core::v1::ResourceRequirements;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, metric_families};

use super::ResourceValues;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestedLabels {
    pub resource: String,
    pub requirement: String,
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SuccessLabels {
    pub success: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonDetailLabels {
    pub reason_detail: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    pub retry_trigger: String,
}

/// Upstream's buckets for the resize duration, in milliseconds.
fn duration_histogram() -> Histogram {
    Histogram::new([
        10.0, 50.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 30000.0, 60000.0, 120_000.0, 300_000.0,
        600_000.0,
    ])
}

metric_families! {
    /// The resize families (cheap to clone: every family is shared).
    #[derive(Clone, Debug)]
    pub struct ResizeMetrics {
        pub requested: Family<RequestedLabels, Counter> = Family::default(),
            ("kubelet_container_requested_resizes", "[ALPHA] Number of requested resizes, counted at the container level. Different resources on the same container are counted separately. The 'requirement' label refers to 'memory' or 'limits'; the 'operation' label can be one of 'add', 'remove', 'increase' or 'decrease'");
        pub duration: HistogramFamily<SuccessLabels> = Family::new_with_constructor(duration_histogram),
            ("kubelet_pod_resize_duration_milliseconds", "[ALPHA] Duration in milliseconds to actuate a pod resize");
        pub infeasible: Family<ReasonDetailLabels, Counter> = Family::default(),
            ("kubelet_pod_infeasible_resizes", "[ALPHA] Number of infeasible resizes for pods");
        pub pending: Family<ReasonLabels, Gauge> = Family::default(),
            ("kubelet_pod_pending_resizes", "[ALPHA] Number of pending resizes for pods");
        pub in_progress: Gauge = Gauge::default(),
            ("kubelet_pod_in_progress_resizes", "[ALPHA] Number of in-progress resizes for pods");
        pub deferred_accepted: Family<TriggerLabels, Counter> = Family::default(),
            ("kubelet_pod_deferred_accepted_resizes", "[ALPHA] Cumulative number of resizes that were accepted after being deferred");
    }
}

impl ResizeMetrics {
    /// Counts the changes from `old` to `new` of one container (upstream
    /// `recordContainerResizeOperations`).
    pub fn count_requested(&self, old: &ResourceRequirements, new: &ResourceRequirements) {
        let (o, n) = (ResourceValues::of(Some(old)), ResourceValues::of(Some(new)));
        for (resource, requirement, before, after) in [
            ("cpu", "requests", o.cpu_request, n.cpu_request),
            ("cpu", "limits", o.cpu_limit, n.cpu_limit),
            ("memory", "requests", o.memory_request, n.memory_request),
            ("memory", "limits", o.memory_limit, n.memory_limit),
        ] {
            let operation = match (before, after) {
                (b, a) if b == a => continue,
                (0, _) => "add",
                (_, 0) => "remove",
                (b, a) if a > b => "increase",
                _ => "decrease",
            };
            self.requested
                .get_or_create(&RequestedLabels {
                    resource: resource.into(),
                    requirement: requirement.into(),
                    operation: operation.into(),
                })
                .inc();
        }
    }

    pub(super) fn infeasible(&self, detail: &str) {
        self.infeasible.get_or_create(&ReasonDetailLabels { reason_detail: detail.into() }).inc();
    }

    pub(super) fn deferred_accepted(&self, trigger: &str) {
        self.deferred_accepted.get_or_create(&TriggerLabels { retry_trigger: trigger.into() }).inc();
    }

    pub(super) fn set_gauges(&self, infeasible: i64, deferred: i64, in_progress: i64) {
        self.pending.get_or_create(&ReasonLabels { reason: "infeasible".into() }).set(infeasible);
        self.pending.get_or_create(&ReasonLabels { reason: "deferred".into() }).set(deferred);
        self.in_progress.set(in_progress);
    }

    /// Observes one actuation (`doPodResizeAction`).
    pub fn observe_duration(&self, elapsed: std::time::Duration, success: bool) {
        self.duration
            .get_or_create(&SuccessLabels { success: success.to_string() })
            .observe(elapsed.as_secs_f64() * 1000.0);
    }
}
