//! The eviction manager's metric families: upstream's `kubelet_evictions` (a counter whose
//! name has no `_total`, listed in [`crate::metrics::COUNTERS_WITHOUT_TOTAL`]) and
//! `kubelet_eviction_stats_age_seconds`, and swiftlet's own
//! `swiftlet_eviction_signal_to_decision_seconds`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::DEF_BUCKETS;

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

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}

/// 100 µs .. ~3.3 s: a kernel-signalled decision should take milliseconds.
fn decision_histogram() -> Histogram {
    Histogram::new((0..16).map(|i| 0.000_1 * 2_f64.powi(i)))
}

/// The eviction families.
#[derive(Debug, Clone)]
pub struct EvictionMetrics {
    /// `kubelet_evictions{eviction_signal}`: pods evicted.
    pub evictions: Family<SignalLabels, Counter>,
    /// `kubelet_eviction_stats_age_seconds{eviction_signal}`: age of the stats an
    /// eviction was decided on.
    pub stats_age: HistogramFamily<SignalLabels>,
    /// `swiftlet_eviction_signal_to_decision_seconds{source}`: from a kernel pressure
    /// signal to the eviction decision it led to.
    pub signal_to_decision: HistogramFamily<SourceLabels>,
}

impl EvictionMetrics {
    /// Creates the families and registers them into `registry` (the `/metrics` one).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kubelet_evictions",
            "[ALPHA] Cumulative number of pod evictions by eviction signal",
            m.evictions.clone(),
        );
        registry.register(
            "kubelet_eviction_stats_age_seconds",
            "[ALPHA] Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
            m.stats_age.clone(),
        );
        registry.register(
            "swiftlet_eviction_signal_to_decision_seconds",
            "Time from a kernel pressure signal to the eviction decision it triggered",
            m.signal_to_decision.clone(),
        );
        m
    }
}

impl Default for EvictionMetrics {
    /// Families registered nowhere (tests, or when metrics are off).
    fn default() -> Self {
        Self {
            evictions: Family::default(),
            stats_age: Family::new_with_constructor(def_histogram),
            signal_to_decision: Family::new_with_constructor(decision_histogram),
        }
    }
}
