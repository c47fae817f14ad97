//! The CRI client's metric families, recorded by [`super::cri::RemoteRuntime`] around
//! each call: upstream's `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_errors_total` and
//! `kubelet_runtime_operations_duration_seconds`, all by `operation_type`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, OperationLabels, exponential_buckets, metric_families};

fn runtime_op_histogram() -> Histogram {
    // pkg/kubelet/metrics: prometheus.ExponentialBuckets(.005, 2.5, 14).
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

metric_families! {
    /// The CRI operation families.
    #[derive(Debug)]
    pub struct RuntimeOperationMetrics {
        /// `kubelet_runtime_operations_total{operation_type}`: CRI calls made.
        pub runtime_operations: Family<OperationLabels, Counter> = Family::default(),
            ("kubelet_runtime_operations", "[ALPHA] Cumulative number of runtime operations by operation type");
        /// `kubelet_runtime_operations_errors_total{operation_type}`: CRI calls that failed.
        pub runtime_operations_errors: Family<OperationLabels, Counter> = Family::default(),
            ("kubelet_runtime_operations_errors", "[ALPHA] Cumulative number of runtime operation errors by operation type");
        /// `kubelet_runtime_operations_duration_seconds{operation_type}`: how long CRI calls took.
        pub runtime_operations_duration: HistogramFamily<OperationLabels> = Family::new_with_constructor(runtime_op_histogram),
            ("kubelet_runtime_operations_duration_seconds", "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type");
    }
}

impl RuntimeOperationMetrics {
    /// Records one runtime (CRI) operation: count, duration, and error if any.
    pub fn observe_runtime_operation(&self, operation: &str, seconds: f64, failed: bool) {
        let labels = OperationLabels { operation_type: operation.to_string() };
        self.runtime_operations.get_or_create(&labels).inc();
        self.runtime_operations_duration.get_or_create(&labels).observe(seconds);
        if failed {
            self.runtime_operations_errors.get_or_create(&labels).inc();
        }
    }
}
