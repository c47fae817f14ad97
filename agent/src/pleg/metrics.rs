//! The PLEG's metric families. The relisting PLEG ([`super::relist`]) records upstream's
//! `kubelet_pleg_relist_duration_seconds`, `kubelet_pleg_relist_interval_seconds`,
//! `kubelet_pleg_last_seen_seconds`, `kubelet_pleg_discard_events` (a counter without
//! `_total`, listed in [`crate::metrics::COUNTERS_WITHOUT_TOTAL`]), and, as upstream's
//! generic PLEG does after each relist, `kubelet_running_pods` and
//! `kubelet_running_containers{container_state}`. The evented (eBPF) PLEG
//! ([`super::evented`]) records swiftlet's `kubelet_evented_pleg_kernel_events_total{kind}`,
//! `kubelet_evented_pleg_ringbuf_drops_total`, `kubelet_evented_pleg_relist_repairs_total`,
//! `kubelet_evented_pleg_runtime_events_total{kind,first}`,
//! `kubelet_evented_pleg_runtime_event_lag_seconds{kind}` and `kubelet_evented_pleg_active`; the sync loop observes
//! `kubelet_evented_pleg_event_latency_seconds` when an event reaches a pod worker.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, def_histogram, exponential_buckets, metric_families};

/// Label set `container_state` of `kubelet_running_containers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabels {
    pub container_state: String,
}

/// Labels of `kubelet_evented_pleg_runtime_events_total`: the runtime's event type and
/// which source reported the change first (`kernel`, `runtime`, or `none`: a change that
/// is not news, e.g. an older state).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeEventLabels {
    pub kind: String,
    pub first: String,
}

/// Label set `kind` of `kubelet_evented_pleg_runtime_event_lag_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeEventKindLabels {
    pub kind: String,
}

fn runtime_event_lag_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

/// Label set `kind` of `kubelet_evented_pleg_kernel_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KernelEventLabels {
    pub kind: String,
}

metric_families! {
    /// The PLEG families.
    #[derive(Debug)]
    pub struct PlegMetrics {
        /// `kubelet_pleg_relist_duration_seconds`: how long a relist took.
        pub pleg_relist_duration: Histogram = def_histogram(),
            ("kubelet_pleg_relist_duration_seconds", "[ALPHA] Duration in seconds for relisting pods in PLEG");
        /// `kubelet_pleg_relist_interval_seconds`: time between relists.
        pub pleg_relist_interval: Histogram = def_histogram(),
            ("kubelet_pleg_relist_interval_seconds", "[ALPHA] Interval in seconds between relisting in PLEG");
        /// `kubelet_pleg_last_seen_seconds`: when the PLEG last relisted, Unix seconds.
        pub pleg_last_seen: Gauge<f64, AtomicU64> = Gauge::default(),
            ("kubelet_pleg_last_seen_seconds", "[ALPHA] Timestamp in seconds when PLEG was last seen active");
        /// `kubelet_pleg_discard_events`: events dropped because the channel was full.
        pub pleg_discard_events: Counter = Counter::default(),
            ("kubelet_pleg_discard_events", "[ALPHA] The number of discard events in PLEG");
        /// `kubelet_running_pods`: pods with a running sandbox.
        pub running_pods: Gauge = Gauge::default(),
            ("kubelet_running_pods", "[ALPHA] Number of pods that have a running pod sandbox");
        /// `kubelet_running_containers{container_state}`: containers by state.
        pub running_containers: Family<ContainerStateLabels, Gauge> = Family::default(),
            ("kubelet_running_containers", "[ALPHA] Number of containers currently running");
        /// swiftlet: kernel events received from the eBPF sensors, by kind.
        pub evented_pleg_kernel_events: Family<KernelEventLabels, Counter> = Family::default(),
            ("kubelet_evented_pleg_kernel_events", "Kernel events received from swiftlet's eBPF sensors, by kind");
        /// swiftlet: CRI `GetContainerEvents` events (runtimes that have it), by type and by
        /// which source told the change first: what the runtime's stream adds to the kernel's.
        pub evented_pleg_runtime_events: Family<RuntimeEventLabels, Counter> = Family::default(),
            ("kubelet_evented_pleg_runtime_events", "Container events from the runtime's CRI event stream, by type and by which source reported the change first");
        /// swiftlet: kernel events lost because the ring buffer was full.
        pub evented_pleg_ringbuf_drops: Counter = Counter::default(),
            ("kubelet_evented_pleg_ringbuf_drops", "Kernel events lost because the eBPF ring buffer was full");
        /// swiftlet: changes the safety-net relist found that the kernel path missed.
        pub evented_pleg_relist_repairs: Counter = Counter::default(),
            ("kubelet_evented_pleg_relist_repairs", "Container state changes found by the safety-net relist that the kernel path missed");
        /// swiftlet: kernel timestamp of a container's exec/exit → event handed to its pod worker.
        // 50 µs .. ~1.6 s: the kernel path lives in the sub-millisecond range.
        pub evented_pleg_event_latency: Histogram = Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            ("kubelet_evented_pleg_event_latency_seconds", "Time from the kernel seeing a container's init exec or exit to the event reaching its pod worker");
        /// swiftlet: how long after the kernel the runtime's event stream told the same start
        /// or stop, by the event's `kind` (`started`, `stopped`): what waiting for the
        /// runtime's stream instead of the kernel would cost.
        // 100 µs .. ~13 s.
        pub evented_pleg_runtime_event_lag: HistogramFamily<RuntimeEventKindLabels> = Family::new_with_constructor(runtime_event_lag_histogram),
            ("kubelet_evented_pleg_runtime_event_lag_seconds", "Time from the kernel seeing a container's start or stop to the runtime's CRI event stream telling it");
        /// swiftlet: 1 while the evented (eBPF) PLEG runs, 0 when relisting alone.
        pub evented_pleg_active: Gauge = Gauge::default(),
            ("kubelet_evented_pleg_active", "1 while the evented (eBPF) PLEG runs, 0 when the relisting PLEG runs alone");
    }
}
