//! The pod workers' metric families: upstream's `kubelet_pod_worker_duration_seconds`
//! (by `operation_type`: `create`, `update`, `sync`), `kubelet_pod_worker_start_duration_seconds`,
//! `kubelet_restarted_pods_total{static}`, `kubelet_orphaned_runtime_pods_total`, and
//! `kubelet_cgroup_manager_duration_seconds{operation_type}` (the pod workers are what
//! drives the cgroup manager's create/update/destroy here).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, OperationLabels, StaticLabels, def_histogram, metric_families};

metric_families! {
    /// The pod worker families.
    #[derive(Debug)]
    pub struct PodWorkerMetrics {
        /// `kubelet_pod_worker_duration_seconds{operation_type}`: how long a pod sync took.
        pub pod_worker_duration: HistogramFamily<OperationLabels> = Family::new_with_constructor(def_histogram),
            ("kubelet_pod_worker_duration_seconds", "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync");
        /// `kubelet_pod_worker_start_duration_seconds`: from seeing a pod to starting its worker.
        pub pod_worker_start_duration: Histogram = def_histogram(),
            ("kubelet_pod_worker_start_duration_seconds", "[ALPHA] Duration in seconds from kubelet seeing a pod to starting a worker");
        /// `kubelet_restarted_pods_total{static}`: pods deleted and recreated with the same UID.
        pub restarted_pods: Family<StaticLabels, Counter> = Family::default(),
            ("kubelet_restarted_pods", "[ALPHA] Number of pods that have been restarted because they were deleted and recreated with the same UID while the kubelet was watching them (common for static pods, extremely uncommon for API pods)");
        /// `kubelet_orphaned_runtime_pods_total`: runtime pods no pod worker knew.
        pub orphaned_runtime_pods: Counter = Counter::default(),
            ("kubelet_orphaned_runtime_pods", "[ALPHA] Number of pods that have been detected in the container runtime without being already known to the pod worker");
        /// `kubelet_cgroup_manager_duration_seconds{operation_type}`: pod cgroup operations.
        pub cgroup_manager_duration: HistogramFamily<OperationLabels> = Family::new_with_constructor(def_histogram),
            ("kubelet_cgroup_manager_duration_seconds", "[ALPHA] Duration in seconds for cgroup manager operations. Broken down by method");
    }
}
