//! The pod workers' metric families: upstream's `kubelet_pod_worker_duration_seconds`
//! (by `operation_type`: `create`, `update`, `sync`), `kubelet_pod_worker_start_duration_seconds`,
//! `kubelet_restarted_pods_total{static}`, `kubelet_orphaned_runtime_pods_total`, and
//! `kubelet_cgroup_manager_duration_seconds{operation_type}` (the pod workers are what
//! drives the cgroup manager's create/update/destroy here).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{HistogramFamily, OperationLabels, StaticLabels, def_histogram};

/// The pod worker families.
#[derive(Debug)]
pub struct PodWorkerMetrics {
    /// `kubelet_pod_worker_duration_seconds{operation_type}`: how long a pod sync took.
    pub pod_worker_duration: HistogramFamily<OperationLabels>,
    /// `kubelet_pod_worker_start_duration_seconds`: from seeing a pod to starting its worker.
    pub pod_worker_start_duration: Histogram,
    /// `kubelet_restarted_pods_total{static}`: pods deleted and recreated with the same UID.
    pub restarted_pods: Family<StaticLabels, Counter>,
    /// `kubelet_orphaned_runtime_pods_total`: runtime pods no pod worker knew.
    pub orphaned_runtime_pods: Counter,
    /// `kubelet_cgroup_manager_duration_seconds{operation_type}`: pod cgroup operations.
    pub cgroup_manager_duration: HistogramFamily<OperationLabels>,
}

impl PodWorkerMetrics {
    /// Creates the families and registers them into `registry` (the `/metrics` one).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kubelet_pod_worker_duration_seconds",
            "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            m.pod_worker_duration.clone(),
        );
        registry.register(
            "kubelet_pod_worker_start_duration_seconds",
            "[ALPHA] Duration in seconds from kubelet seeing a pod to starting a worker",
            m.pod_worker_start_duration.clone(),
        );
        registry.register(
            "kubelet_restarted_pods",
            "[ALPHA] Number of pods that have been restarted because they were deleted and recreated with the same UID while the kubelet was watching them (common for static pods, extremely uncommon for API pods)",
            m.restarted_pods.clone(),
        );
        registry.register(
            "kubelet_orphaned_runtime_pods",
            "[ALPHA] Number of pods that have been detected in the container runtime without being already known to the pod worker",
            m.orphaned_runtime_pods.clone(),
        );
        registry.register(
            "kubelet_cgroup_manager_duration_seconds",
            "[ALPHA] Duration in seconds for cgroup manager operations. Broken down by method",
            m.cgroup_manager_duration.clone(),
        );
        m
    }
}

impl Default for PodWorkerMetrics {
    /// Families registered nowhere (tests, or when metrics are off).
    fn default() -> Self {
        Self {
            pod_worker_duration: Family::new_with_constructor(def_histogram),
            pod_worker_start_duration: def_histogram(),
            restarted_pods: Family::default(),
            orphaned_runtime_pods: Counter::default(),
            cgroup_manager_duration: Family::new_with_constructor(def_histogram),
        }
    }
}
