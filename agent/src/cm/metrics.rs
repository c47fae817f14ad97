//! Metric families of the CPU and topology managers (upstream `pkg/kubelet/metrics`),
//! served on `/metrics` next to [`crate::agent::metrics::KubeletMetrics`].

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{exponential_buckets, metric_families};

metric_families! {
    /// The resource managers' families.
    #[derive(Debug)]
    pub struct ResourceManagerMetrics {
        /// `kubelet_cpu_manager_pinning_requests_total`.
        pub cpu_manager_pinning_requests: Counter = Counter::default(),
            ("kubelet_cpu_manager_pinning_requests", "[ALPHA] The number of cpu core allocations which required pinning.");
        /// `kubelet_cpu_manager_pinning_errors_total`.
        pub cpu_manager_pinning_errors: Counter = Counter::default(),
            ("kubelet_cpu_manager_pinning_errors", "[ALPHA] The number of cpu core allocations which required pinning failed.");
        /// `kubelet_topology_manager_admission_requests_total`.
        pub topology_manager_admission_requests: Counter = Counter::default(),
            ("kubelet_topology_manager_admission_requests", "[ALPHA] The number of admission requests where resources have to be aligned.");
        /// `kubelet_topology_manager_admission_errors_total`.
        pub topology_manager_admission_errors: Counter = Counter::default(),
            ("kubelet_topology_manager_admission_errors", "[ALPHA] The number of admission request failures where resources could not be aligned.");
        /// `kubelet_topology_manager_admission_duration_ms`.
        // Upstream: prometheus.ExponentialBuckets(.05, 2, 15).
        pub topology_manager_admission_duration: Histogram = Histogram::new(exponential_buckets(0.05, 2.0, 15)),
            ("kubelet_topology_manager_admission_duration_ms", "[ALPHA] Duration in milliseconds to serve a pod admission request.");
    }
}
