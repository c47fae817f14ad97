//! The pod start metric families, observed by [`super::PodStartupTracker`]: upstream's
//! `kubelet_pod_start_duration_seconds`, `kubelet_pod_start_sli_duration_seconds` and
//! `kubelet_pod_start_total_duration_seconds`, with upstream's `podStartupDurationBuckets`.
//! Each carries the pod's start trace as an exemplar ([`TracedHistogram`]; `OpenMetrics`
//! only).

use crate::metrics::{POD_STARTUP_BUCKETS, TracedHistogram, metric_families};

metric_families! {
    /// The pod start families.
    #[derive(Debug)]
    pub struct PodStartupMetrics {
        /// `kubelet_pod_start_duration_seconds`: from the agent first seeing a pod to the pod
        /// running.
        pub pod_start_duration: TracedHistogram = TracedHistogram::new(POD_STARTUP_BUCKETS.into_iter()),
            ("kubelet_pod_start_duration_seconds", "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run");
        /// `kubelet_pod_start_sli_duration_seconds`: the pod startup latency SLI, creation → all
        /// containers started and observed, minus image pulling.
        pub pod_start_sli_duration: TracedHistogram = TracedHistogram::new(POD_STARTUP_BUCKETS.into_iter()),
            ("kubelet_pod_start_sli_duration_seconds", "[ALPHA] Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch");
        /// `kubelet_pod_start_total_duration_seconds`: creation → all containers started and
        /// observed, image pulls included.
        pub pod_start_total_duration: TracedHistogram = TracedHistogram::new(POD_STARTUP_BUCKETS.into_iter()),
            ("kubelet_pod_start_total_duration_seconds", "[ALPHA] Duration in seconds to start a pod since creation, including time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch");
    }
}
