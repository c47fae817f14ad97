//! The pod sources' metric family: upstream's `kubelet_mirror_pods`, set from the API
//! watch ([`super::api`]).

use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::metric_families;

metric_families! {
    /// The pod source family.
    #[derive(Debug)]
    pub struct SourceMetrics {
        /// `kubelet_mirror_pods`: mirror pods seen on the API watch.
        pub mirror_pods: Gauge = Gauge::default(),
            ("kubelet_mirror_pods", "[ALPHA] The number of mirror pods the kubelet will try to create (one per admitted static pod)");
    }
}
