//! The eviction manager's metric families: upstream's `kubelet_evictions` (a counter whose
//! name has no `_total`, listed in [`crate::metrics::COUNTERS_WITHOUT_TOTAL`]) and
//! `kubelet_eviction_stats_age_seconds`, and swiftlet's own
//! `swiftlet_eviction_signal_to_decision_seconds`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, def_histogram, metric_families};

/// Label `eviction_signal` (`memory.available`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub eviction_signal: String,
}

/// Label `source` of a kernel pressure signal (`psi`, `memcg`, `ebpf_reclaim`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

/// 100 µs .. ~3.3 s: a kernel-signalled decision should take milliseconds.
fn decision_histogram() -> Histogram {
    Histogram::new((0..16).map(|i| 0.000_1 * 2_f64.powi(i)))
}

metric_families! {
    /// The eviction families.
    #[derive(Debug, Clone)]
    pub struct EvictionMetrics {
        /// `kubelet_evictions{eviction_signal}`: pods evicted.
        pub evictions: Family<SignalLabels, Counter> = Family::default(),
            ("kubelet_evictions", "[ALPHA] Cumulative number of pod evictions by eviction signal");
        /// `kubelet_eviction_stats_age_seconds{eviction_signal}`: age of the stats an
        /// eviction was decided on.
        pub stats_age: HistogramFamily<SignalLabels> = Family::new_with_constructor(def_histogram),
            ("kubelet_eviction_stats_age_seconds", "[ALPHA] Time between when stats are collected, and when pod is evicted based on those stats by eviction signal");
        /// `swiftlet_eviction_signal_to_decision_seconds{source}`: from a kernel pressure
        /// signal to the eviction decision it led to.
        pub signal_to_decision: HistogramFamily<SourceLabels> = Family::new_with_constructor(decision_histogram),
            ("swiftlet_eviction_signal_to_decision_seconds", "Time from a kernel pressure signal to the eviction decision it triggered");
    }
}
