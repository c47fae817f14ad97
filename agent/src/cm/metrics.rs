//! Metric families of the CPU and topology managers (upstream `pkg/kubelet/metrics`),
//! served on `/metrics` next to [`crate::agent::metrics::KubeletMetrics`].

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The resource managers' families.
#[derive(Debug)]
pub struct ResourceManagerMetrics {
    /// `kubelet_cpu_manager_pinning_requests_total`.
    pub cpu_manager_pinning_requests: Counter,
    /// `kubelet_cpu_manager_pinning_errors_total`.
    pub cpu_manager_pinning_errors: Counter,
    /// `kubelet_topology_manager_admission_requests_total`.
    pub topology_manager_admission_requests: Counter,
    /// `kubelet_topology_manager_admission_errors_total`.
    pub topology_manager_admission_errors: Counter,
    /// `kubelet_topology_manager_admission_duration_ms`.
    pub topology_manager_admission_duration: Histogram,
}

impl ResourceManagerMetrics {
    /// Creates the families and registers them into `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        // Upstream: prometheus.ExponentialBuckets(.05, 2, 15).
        let buckets = (0..15).map(|i| 0.05 * f64::from(2u32.pow(i)));
        let m = Self {
            cpu_manager_pinning_requests: Counter::default(),
            cpu_manager_pinning_errors: Counter::default(),
            topology_manager_admission_requests: Counter::default(),
            topology_manager_admission_errors: Counter::default(),
            topology_manager_admission_duration: Histogram::new(buckets),
        };
        registry.register(
            "kubelet_cpu_manager_pinning_requests",
            "[ALPHA] The number of cpu core allocations which required pinning.",
            m.cpu_manager_pinning_requests.clone(),
        );
        registry.register(
            "kubelet_cpu_manager_pinning_errors",
            "[ALPHA] The number of cpu core allocations which required pinning failed.",
            m.cpu_manager_pinning_errors.clone(),
        );
        registry.register(
            "kubelet_topology_manager_admission_requests",
            "[ALPHA] The number of admission requests where resources have to be aligned.",
            m.topology_manager_admission_requests.clone(),
        );
        registry.register(
            "kubelet_topology_manager_admission_errors",
            "[ALPHA] The number of admission request failures where resources could not be aligned.",
            m.topology_manager_admission_errors.clone(),
        );
        registry.register(
            "kubelet_topology_manager_admission_duration_ms",
            "[ALPHA] Duration in milliseconds to serve a pod admission request.",
            m.topology_manager_admission_duration.clone(),
        );
        m
    }
}
