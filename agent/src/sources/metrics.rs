//! The pod sources' metric family: upstream's `kubelet_mirror_pods`, set from the API
//! watch ([`super::api`]).

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The pod source family.
#[derive(Debug)]
pub struct SourceMetrics {
    /// `kubelet_mirror_pods`: mirror pods seen on the API watch.
    pub mirror_pods: Gauge,
}

impl SourceMetrics {
    /// Creates the families and registers them into `registry` (the `/metrics` one).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kubelet_mirror_pods",
            "[ALPHA] The number of mirror pods the kubelet will try to create (one per admitted static pod)",
            m.mirror_pods.clone(),
        );
        m
    }
}

impl Default for SourceMetrics {
    /// Families registered nowhere (tests, or when metrics are off).
    fn default() -> Self {
        Self { mirror_pods: Gauge::default() }
    }
}
