//! The sync loop's housekeeping metric families: upstream's `kubelet_desired_pods{static}`,
//! `kubelet_active_pods{static}`, `kubelet_working_pods{lifecycle,config,static}`,
//! `kubelet_managed_ephemeral_containers`, `kubelet_orphan_pod_cleaned_volumes` and
//! `kubelet_orphan_pod_cleaned_volumes_errors`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::{StaticLabels, metric_families};

/// Label set of `kubelet_working_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkingPodLabels {
    pub lifecycle: String,
    pub config: String,
    pub r#static: String,
}

metric_families! {
    /// The sync loop families.
    #[derive(Debug)]
    pub struct SyncLoopMetrics {
        /// `kubelet_managed_ephemeral_containers`: ephemeral containers in the spec of the pods the
        /// pod manager holds (upstream `ManagedEphemeralContainers`).
        pub managed_ephemeral_containers: Gauge = Gauge::default(),
            ("kubelet_managed_ephemeral_containers", "[ALPHA] Current number of ephemeral containers in pods managed by this kubelet");
        /// `kubelet_desired_pods{static}`: pods the kubelet is told to run.
        pub desired_pods: Family<StaticLabels, Gauge> = Family::default(),
            ("kubelet_desired_pods", "[ALPHA] The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver");
        /// `kubelet_active_pods{static}`: pods considered when admitting new ones.
        pub active_pods: Family<StaticLabels, Gauge> = Family::default(),
            ("kubelet_active_pods", "[ALPHA] The number of pods the kubelet considers active and which are being considered when admitting new pods. static is true if the pod is not from the apiserver");
        /// `kubelet_working_pods{lifecycle,config,static}`: pods the pod workers hold.
        pub working_pods: Family<WorkingPodLabels, Gauge> = Family::default(),
            ("kubelet_working_pods", "[ALPHA] Number of pods the kubelet is actually running, broken down by lifecycle phase, whether the pod is desired, orphaned, or runtime only (also orphaned), and whether the pod is static");
        /// `kubelet_orphan_pod_cleaned_volumes`: orphaned pods whose volumes the last housekeeping
        /// sweep cleaned up.
        pub orphan_pod_cleaned_volumes: Gauge = Gauge::default(),
            ("kubelet_orphan_pod_cleaned_volumes", "[ALPHA] The total number of orphaned Pods whose volumes were cleaned in the last periodic sweep.");
        /// `kubelet_orphan_pod_cleaned_volumes_errors`: orphaned pods whose volumes the last sweep
        /// failed to clean up.
        pub orphan_pod_cleaned_volumes_errors: Gauge = Gauge::default(),
            ("kubelet_orphan_pod_cleaned_volumes_errors", "[ALPHA] The number of orphaned Pods whose volumes failed to be cleaned in the last periodic sweep.");
    }
}
