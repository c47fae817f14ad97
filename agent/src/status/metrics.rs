//! The status manager's metric family: upstream's `kubelet_pod_status_sync_duration_seconds`,
//! observed by [`super::api::ApiStatusManager`] when a status update reaches the API.

use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::metric_families;

/// Upstream's buckets for `kubelet_pod_status_sync_duration_seconds` (not the default ones).
pub const SYNC_DURATION_BUCKETS: [f64; 11] = [0.010, 0.050, 0.100, 0.500, 1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0];

metric_families! {
    /// The status manager family.
    #[derive(Debug)]
    pub struct StatusMetrics {
        /// `kubelet_pod_status_sync_duration_seconds`: from the first status change not yet
        /// written to the API having the pod's status (upstream carries the time of a pod's
        /// very first status into every later sync, so its figures grow with the pod's
        /// age; the time of the change being written is what the help text promises).
        pub pod_status_sync_duration: Histogram = Histogram::new(SYNC_DURATION_BUCKETS),
            ("kubelet_pod_status_sync_duration_seconds", "[ALPHA] Duration in seconds to sync a pod status update. Measures time from detection of a change to pod status until the API is successfully updated for that pod, even if multiple intevening changes to pod status occur");
    }
}
