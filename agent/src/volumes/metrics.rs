//! The volume manager's families on `/metrics` (upstream `pkg/volume/util/metrics.go` and
//! `pkg/kubelet/volumemanager/metrics`):
//!
//! - `storage_operation_duration_seconds{volume_plugin,operation_name,status,migrated}`:
//!   each volume operation the node does, timed: `volume_mount` (a volume set up, or
//!   refreshed, for a pod; for CSI the stage and publish), `volume_unmount` (a volume
//!   of a pod torn down), `unmount_device` (a CSI volume unstaged) and `volume_fs_resize`
//!   (a CSI volume expanded on the node). `status` is `success` or `fail-unknown`,
//!   `migrated` always `false` (no in-tree plugin is migrated here); a CSI volume's plugin
//!   is `kubernetes.io/csi:<driver>`, as upstream names it.
//! - `volume_manager_total_volumes{plugin_name,state}`: the volumes of the pods on the node,
//!   counted at scrape time per plugin, `desired_state_of_world` (every volume a pod's
//!   containers use, set up or not) and `actual_state_of_world` (those set up).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, metric_families};

/// Upstream's buckets of `storage_operation_duration_seconds`.
pub const STORAGE_OPERATION_BUCKETS: [f64; 13] =
    [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0];

fn storage_histogram() -> Histogram {
    Histogram::new(STORAGE_OPERATION_BUCKETS)
}

/// Labels of `storage_operation_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageOperationLabels {
    pub volume_plugin: String,
    pub operation_name: &'static str,
    pub status: &'static str,
    pub migrated: &'static str,
}

metric_families! {
    /// The volume operation family.
    #[derive(Debug, Clone)]
    pub struct VolumeMetrics {
        /// `storage_operation_duration_seconds`.
        pub storage_operation_duration: HistogramFamily<StorageOperationLabels> = Family::new_with_constructor(storage_histogram),
            ("storage_operation_duration_seconds", "[BETA] Storage operation duration");
    }
}

impl VolumeMetrics {
    /// Records one operation.
    pub fn observe(&self, plugin: &str, operation: &'static str, ok: bool, took: Duration) {
        let labels = StorageOperationLabels {
            volume_plugin: plugin.to_owned(),
            operation_name: operation,
            status: if ok { "success" } else { "fail-unknown" },
            migrated: "false",
        };
        self.storage_operation_duration.get_or_create(&labels).observe(took.as_secs_f64());
    }
}

/// `volume_manager_total_volumes`, rendered at scrape time from the volume manager.
pub mod total_volumes {
    use std::sync::Arc;

    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
    use prometheus_client::metrics::MetricType;
    use prometheus_client::metrics::gauge::ConstGauge;

    use crate::volumes::VolumeManager;

    /// The family's name and help.
    pub const NAME: &str = "volume_manager_total_volumes";
    pub const HELP: &str = "[ALPHA] Number of volumes in Volume Manager";

    /// Renders the family from `volumes` at scrape time.
    #[derive(Debug)]
    pub struct TotalVolumesCollector {
        volumes: Arc<VolumeManager>,
    }

    impl TotalVolumesCollector {
        #[must_use]
        pub fn new(volumes: Arc<VolumeManager>) -> Self {
            Self { volumes }
        }
    }

    impl Collector for TotalVolumesCollector {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            let counts = self.volumes.volume_counts();
            if counts.is_empty() {
                return Ok(());
            }
            let mut family = encoder.encode_descriptor(NAME, HELP, None, MetricType::Gauge)?;
            for ((plugin, state), n) in &counts {
                let labels = [("plugin_name", plugin.as_str()), ("state", *state)];
                ConstGauge::new(*n).encode(family.encode_family(&labels)?)?;
            }
            Ok(())
        }
    }
}
