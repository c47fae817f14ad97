//! The stats module's metric family: upstream's
//! `kubelet_volume_metric_collection_duration_seconds{metric_source}`, how long measuring a
//! usage took (`du` walks of volumes, logs, `etc-hosts` and writable layers; see
//! [`super::collector`] and [`super::usage_cache`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;

use crate::metrics::{HistogramFamily, def_histogram, metric_families};

/// Label set `metric_source` of `kubelet_volume_metric_collection_duration_seconds`: how
/// a usage was measured (`du` here; upstream also `fsquota`, `block` and CSI driver names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MetricSourceLabels {
    pub metric_source: String,
}

metric_families! {
    /// The usage measurement family.
    #[derive(Debug)]
    pub struct VolumeStatMetrics {
        /// `kubelet_volume_metric_collection_duration_seconds{metric_source}`.
        pub volume_metric_collection_duration: HistogramFamily<MetricSourceLabels> = Family::new_with_constructor(def_histogram),
            ("kubelet_volume_metric_collection_duration_seconds", "[ALPHA] Duration in seconds to calculate volume stats");
    }
}

impl VolumeStatMetrics {
    /// Records how long measuring a usage took, by how it was measured (upstream
    /// `CollectVolumeStatCalDuration`; `du` for the stats module's walks).
    pub fn observe_volume_stat_duration(&self, metric_source: &str, took: std::time::Duration) {
        let labels = MetricSourceLabels { metric_source: metric_source.to_owned() };
        self.volume_metric_collection_duration.get_or_create(&labels).observe(took.as_secs_f64());
    }
}
