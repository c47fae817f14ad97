//! The device manager's `kubelet_*` families (upstream `pkg/kubelet/metrics`):
//! registrations and `Allocate` latency per resource.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label set `resource_name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource_name: String,
}

fn def_histogram() -> Histogram {
    Histogram::new(crate::metrics::DEF_BUCKETS)
}

/// `kubelet_device_plugin_registration_total` and
/// `kubelet_device_plugin_alloc_duration_seconds`.
#[derive(Clone, Debug)]
pub struct DevicePluginMetrics {
    pub registrations: Family<ResourceLabels, Counter>,
    pub alloc_duration: Family<ResourceLabels, Histogram, fn() -> Histogram>,
}

impl Default for DevicePluginMetrics {
    /// Families registered nowhere (tests).
    fn default() -> Self {
        Self { registrations: Family::default(), alloc_duration: Family::new_with_constructor(def_histogram) }
    }
}

impl DevicePluginMetrics {
    /// Creates the families and registers them into `registry` (the `/metrics` one).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kubelet_device_plugin_registration",
            "[ALPHA] Cumulative number of device plugin registrations. Broken down by resource name",
            m.registrations.clone(),
        );
        registry.register(
            "kubelet_device_plugin_alloc_duration_seconds",
            "[ALPHA] Duration in seconds to serve a device plugin Allocation request. Broken down by resource name",
            m.alloc_duration.clone(),
        );
        m
    }

    pub(super) fn labels(resource: &str) -> ResourceLabels {
        ResourceLabels { resource_name: resource.to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_upstream_names() {
        let mut reg = Registry::default();
        let m = DevicePluginMetrics::new(&mut reg);
        m.registrations.get_or_create(&DevicePluginMetrics::labels("example.com/dev")).inc();
        m.alloc_duration.get_or_create(&DevicePluginMetrics::labels("example.com/dev")).observe(0.02);
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &reg).unwrap();
        assert!(out.contains("kubelet_device_plugin_registration_total{resource_name=\"example.com/dev\"} 1"), "{out}");
        assert!(out.contains("# TYPE kubelet_device_plugin_alloc_duration_seconds histogram"), "{out}");
        assert!(
            out.contains(
                "kubelet_device_plugin_alloc_duration_seconds_bucket{le=\"0.025\",resource_name=\"example.com/dev\"} 1"
            ) || out.contains(
                "kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name=\"example.com/dev\",le=\"0.025\"} 1"
            ),
            "{out}"
        );
    }
}
