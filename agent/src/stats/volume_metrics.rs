//! `kubelet_volume_stats_*` on `/metrics` (upstream
//! `pkg/kubelet/metrics/collectors/volume_stats.go`): capacity, available and used bytes
//! and inodes of every volume that comes from a claim, labelled `namespace` and
//! `persistentvolumeclaim`, rendered at scrape time from the latest stats collection
//! as [`super::log_metrics`] does. A claim mounted by several pods is reported once.
//! Volumes not measured yet (no statvfs or no usage) have no series.

use std::collections::BTreeMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use super::log_metrics::LatestCollection;

/// The families: name, help, and how each value is taken from a volume's figures.
const FAMILIES: [(&str, &str); 6] = [
    ("kubelet_volume_stats_available_bytes", "[ALPHA] Number of available bytes in the volume"),
    ("kubelet_volume_stats_capacity_bytes", "[ALPHA] Capacity in bytes of the volume"),
    ("kubelet_volume_stats_inodes", "[ALPHA] Maximum number of inodes in the volume"),
    ("kubelet_volume_stats_inodes_free", "[ALPHA] Number of free inodes in the volume"),
    ("kubelet_volume_stats_inodes_used", "[ALPHA] Number of used inodes in the volume"),
    ("kubelet_volume_stats_used_bytes", "[ALPHA] Number of used bytes in the volume"),
];

/// Renders the families from the collection `latest` gives at scrape time.
pub struct VolumeStatsCollector {
    latest: LatestCollection,
}

impl std::fmt::Debug for VolumeStatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeStatsCollector").finish_non_exhaustive()
    }
}

impl VolumeStatsCollector {
    #[must_use]
    pub fn new(latest: LatestCollection) -> Self {
        Self { latest }
    }
}

impl Collector for VolumeStatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(collection) = (self.latest)() else { return Ok(()) };
        // (namespace, claim) → the six values in FAMILIES' order; the first pod wins.
        let mut claims: BTreeMap<(String, String), [u64; 6]> = BTreeMap::new();
        for v in collection.pods.iter().flat_map(|p| &p.volumes) {
            let (Some(pvc), Some(fs), Some(usage)) = (&v.pvc, v.fs, v.usage.usage) else { continue };
            let values = [fs.available, fs.capacity, fs.inodes, fs.inodes_free, usage.inodes, usage.bytes];
            claims.entry((pvc.namespace.clone(), pvc.name.clone())).or_insert(values);
        }
        if claims.is_empty() {
            return Ok(());
        }
        for (i, (name, help)) in FAMILIES.iter().enumerate() {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for ((namespace, claim), values) in &claims {
                let labels = [("namespace", namespace.as_str()), ("persistentvolumeclaim", claim.as_str())];
                ConstGauge::new(values[i]).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use prometheus_client::registry::Registry;

    use super::*;
    use crate::stats::collector::{UsageSample, VolumeSample};
    use crate::stats::fs::{DiskUsage, FsInfo};
    use crate::stats::summary::PvcReference;
    use crate::stats::synthetic::{self, Shape};

    fn scrape(latest: LatestCollection) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(VolumeStatsCollector::new(latest)));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        text
    }

    fn volume(name: &str, claim: Option<&str>) -> VolumeSample {
        VolumeSample {
            name: name.into(),
            local_ephemeral: false,
            pvc: claim.map(|c| PvcReference { name: c.into(), namespace: "ns".into() }),
            usage: UsageSample {
                time: std::time::SystemTime::UNIX_EPOCH,
                usage: Some(DiskUsage { bytes: 4096, inodes: 3 }),
            },
            fs: Some(FsInfo { capacity: 1 << 30, available: 1 << 29, usage: 1 << 29, inodes: 1000, inodes_free: 900 }),
        }
    }

    #[test]
    fn one_series_per_claim_and_none_for_other_volumes() {
        let mut c = synthetic::collection(Shape { pods: 2, devices: 0, interfaces: 0 });
        c.pods[0].volumes = vec![volume("data", Some("claim-a")), volume("scratch", None)];
        // The same claim in a second pod is reported once.
        c.pods[1].volumes = vec![volume("data", Some("claim-a"))];
        let c = Arc::new(c);
        let text = scrape(Arc::new(move || Some(Arc::clone(&c))));
        assert!(text.contains(
            "kubelet_volume_stats_capacity_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 1073741824\n"
        ));
        assert!(
            text.contains("kubelet_volume_stats_used_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 4096\n")
        );
        assert!(
            text.contains("kubelet_volume_stats_inodes_used{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 3\n")
        );
        assert!(text.contains("# TYPE kubelet_volume_stats_available_bytes gauge\n"));
        assert_eq!(text.matches("claim-a").count(), 6, "{text}");
    }

    #[test]
    fn nothing_without_claims_or_a_collection() {
        assert_eq!(scrape(Arc::new(|| None)), "");
        let mut c = synthetic::collection(Shape { pods: 1, devices: 0, interfaces: 0 });
        c.pods[0].volumes = vec![volume("scratch", None)];
        let c = Arc::new(c);
        assert_eq!(scrape(Arc::new(move || Some(Arc::clone(&c)))), "");
    }
}
