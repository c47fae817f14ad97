//! The runtime manager's metric families: upstream's `kubelet_started_pods_total`,
//! `kubelet_started_pods_errors_total`, `kubelet_started_containers_total{container_type}`,
//! `kubelet_started_containers_errors_total{code,container_type}`,
//! `kubelet_run_podsandbox_duration_seconds{runtime_handler}`,
//! `kubelet_lifecycle_handler_http_fallbacks_total`, `kubelet_containers_per_pod_count` and
//! the image volume counters `kubelet_image_volume_requested_total`,
//! `kubelet_image_volume_mounted_succeed_total` and `kubelet_image_volume_mounted_errors_total`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, def_histogram, exponential_buckets, metric_families};

/// Label set `runtime_handler` of `kubelet_run_podsandbox_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeHandlerLabels {
    pub runtime_handler: String,
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

metric_families! {
    /// The runtime manager families.
    #[derive(Debug)]
    pub struct RuntimeMetrics {
        /// `kubelet_started_pods_total`: sandboxes started.
        pub started_pods: Counter = Counter::default(),
            ("kubelet_started_pods", "[ALPHA] Cumulative number of pods started");
        /// `kubelet_started_pods_errors_total`: sandboxes that failed to start.
        pub started_pods_errors: Counter = Counter::default(),
            ("kubelet_started_pods_errors", "[ALPHA] Cumulative number of errors when starting pods");
        /// `kubelet_started_containers_total{container_type}`: containers started.
        pub started_containers: Family<ContainerTypeLabels, Counter> = Family::default(),
            ("kubelet_started_containers", "[ALPHA] Cumulative number of containers started");
        /// `kubelet_started_containers_errors_total{code,container_type}`: containers that failed to start.
        pub started_containers_errors: Family<StartedContainerErrorLabels, Counter> = Family::default(),
            ("kubelet_started_containers_errors", "[ALPHA] Cumulative number of errors when starting containers");
        /// `kubelet_run_podsandbox_duration_seconds{runtime_handler}`: `RunPodSandbox` durations
        /// by runtime handler (`""`: the default).
        pub run_podsandbox_duration: HistogramFamily<RuntimeHandlerLabels> = Family::new_with_constructor(def_histogram),
            ("kubelet_run_podsandbox_duration_seconds", "[ALPHA] Duration in seconds of the run_podsandbox operations. Broken down by RuntimeClass.Handler");
        /// `kubelet_lifecycle_handler_http_fallbacks_total`: lifecycle `httpGet` hooks that fell
        /// back from HTTPS to HTTP.
        pub lifecycle_handler_http_fallbacks: Counter = Counter::default(),
            ("kubelet_lifecycle_handler_http_fallbacks", "[ALPHA] The number of times lifecycle handlers successfully fell back to http from https");
        /// `kubelet_image_volume_requested_total`: image volumes of the containers whose start
        /// was attempted.
        pub image_volume_requested: Counter = Counter::default(),
            ("kubelet_image_volume_requested", "[BETA] Number of requested image volumes");
        /// `kubelet_image_volume_mounted_succeed_total`: image volume mounts of those starts
        /// the runtime did not refuse.
        pub image_volume_mounted_succeeded: Counter = Counter::default(),
            ("kubelet_image_volume_mounted_succeed", "[BETA] Number of successful image volume mounts");
        /// `kubelet_image_volume_mounted_errors_total`: image volume mounts the runtime refused.
        pub image_volume_mounted_errors: Counter = Counter::default(),
            ("kubelet_image_volume_mounted_errors", "[BETA] Number of failed image volume mounts");
        /// `kubelet_containers_per_pod_count`: containers per pod (registered as upstream does;
        /// nothing observes it yet).
        // pkg/kubelet/metrics: prometheus.ExponentialBuckets(1, 2, 5).
        pub containers_per_pod: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 5)),
            ("kubelet_containers_per_pod_count", "[ALPHA] The number of containers per pod");
    }
}
