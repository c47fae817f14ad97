//! `kubelet_container_log_filesystem_used_bytes` on `/metrics` (upstream
//! `pkg/kubelet/metrics/collectors/log_metrics.go`): the bytes each running container's
//! logs use, one gauge per container with `container`, `namespace`, `pod` and `uid`,
//! rendered at scrape time from the latest stats [`Collection`].
//!
//! Upstream's collector asks the stats provider for pod stats on every scrape (cAdvisor's
//! housekeeping keeps those fresh). Here the scrape reads what the stats provider already
//! has ([`StatsProvider::latest`](super::provider::StatsProvider::latest)): a recent
//! collection is rendered, none is never waited for (a registry's collectors cannot
//! wait), and the scrape counts as a reader, so housekeeping keeps collections coming.
//! The first scrape after a quiet spell therefore has no series; the next ones do.
//!
//! Containers whose log directory could not be listed, or has no files, have no series,
//! as upstream leaves out containers without `logs.usedBytes`.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use super::Collection;

/// The family's name.
pub const NAME: &str = "kubelet_container_log_filesystem_used_bytes";

/// The family's help text, with upstream's stability prefix.
pub const HELP: &str = "[ALPHA] Bytes used by the container's logs on the filesystem.";

/// Where the collector takes its collection from at scrape time (`None`: nothing recent).
pub type LatestCollection = Arc<dyn Fn() -> Option<Arc<Collection>> + Send + Sync>;

/// The label names, in the Go client's (sorted) order.
const LABELS: [&str; 4] = ["container", "namespace", "pod", "uid"];

/// Renders the family from the collection `latest` gives at scrape time.
pub struct LogMetricsCollector {
    latest: LatestCollection,
}

impl std::fmt::Debug for LogMetricsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMetricsCollector").finish_non_exhaustive()
    }
}

impl LogMetricsCollector {
    #[must_use]
    pub fn new(latest: LatestCollection) -> Self {
        Self { latest }
    }
}

impl Collector for LogMetricsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // The Go client announces nothing of a collector's family without samples.
        let Some(collection) = (self.latest)() else { return Ok(()) };
        let mut samples: Vec<([&str; 4], u64)> = collection
            .pods
            .iter()
            .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
            .filter_map(|(p, c)| {
                let bytes = c.logs.as_ref()?.usage?.bytes;
                Some(([c.name.as_str(), &p.namespace, &p.name, &p.uid], bytes))
            })
            .collect();
        if samples.is_empty() {
            return Ok(());
        }
        // The Go registry's order (by label values); of two equal label sets, the first.
        samples.sort_by(|a, b| a.0.cmp(&b.0));
        samples.dedup_by(|later, earlier| later.0 == earlier.0);
        let mut family = encoder.encode_descriptor(NAME, HELP, None, MetricType::Gauge)?;
        for (values, bytes) in &samples {
            let labels: [(&str, &str); 4] = std::array::from_fn(|i| (LABELS[i], values[i]));
            ConstGauge::new(*bytes).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::stats::synthetic::{self, Shape};

    fn scrape(latest: LatestCollection) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(LogMetricsCollector::new(latest)));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn one_gauge_per_container_with_logs_in_upstream_label_order() {
        let mut c = synthetic::collection(Shape { pods: 3, devices: 0, interfaces: 0 });
        c.pods[0].containers[0].logs.as_mut().unwrap().usage.as_mut().unwrap().bytes = 18;
        c.pods[0].uid = "UID_some_id".to_owned();
        c.pods[0].namespace = "some-namespace".to_owned();
        c.pods[0].name = "podName1".to_owned();
        c.pods[0].containers[0].name = "containerName1".to_owned();
        // No log files (an empty directory) or no log directory: no series.
        c.pods[1].containers[0].logs.as_mut().unwrap().usage = None;
        c.pods[2].containers[0].logs = None;
        let c = Arc::new(c);
        let text = scrape(Arc::new(move || Some(Arc::clone(&c))));
        assert_eq!(
            text,
            "# HELP kubelet_container_log_filesystem_used_bytes [ALPHA] Bytes used by the container's logs on the filesystem.\n\
             # TYPE kubelet_container_log_filesystem_used_bytes gauge\n\
             kubelet_container_log_filesystem_used_bytes{container=\"containerName1\",namespace=\"some-namespace\",pod=\"podName1\",uid=\"UID_some_id\"} 18\n"
        );
    }

    #[test]
    fn sorted_by_label_values_and_nothing_without_a_collection() {
        let c = Arc::new(synthetic::collection(Shape { pods: 12, devices: 0, interfaces: 0 }));
        let text = scrape(Arc::new(move || Some(Arc::clone(&c))));
        let pods: Vec<&str> =
            text.lines().filter_map(|l| l.split("pod=\"").nth(1)).map(|rest| rest.split('"').next().unwrap()).collect();
        let mut sorted = pods.clone();
        sorted.sort_unstable();
        assert_eq!((pods.len(), &pods), (12, &sorted));
        assert_eq!(scrape(Arc::new(|| None)), "");
    }
}
