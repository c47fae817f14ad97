//! The status manager's metric family: upstream's `kubelet_pod_status_sync_duration_seconds`,
//! observed by [`super::api::ApiStatusManager`] when a status update reaches the API.

use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{def_histogram, metric_families};

metric_families! {
    /// The status manager family.
    #[derive(Debug)]
    pub struct StatusMetrics {
        /// `kubelet_pod_status_sync_duration_seconds`: from a status change to the API having it.
        pub pod_status_sync_duration: Histogram = def_histogram(),
            ("kubelet_pod_status_sync_duration_seconds", "[ALPHA] Duration in seconds to sync a pod status update. Measures time from detection of a change to pod status until the API is successfully updated for that pod, even if multiple intevening changes to pod status occur");
    }
}
