//! Node-pressure eviction (upstream `pkg/kubelet/eviction`): eviction signals and
//! thresholds, observations, node pressure conditions, node-level reclaim, pod ranking,
//! the eviction itself, and admission under pressure.
//!
//! | file | owns | upstream |
//! |---|---|---|
//! | [`thresholds`] | signals, thresholds, parsing the `eviction*` settings | `ParseThresholdConfig`, `api/types.go` |
//! | [`observations`] | [`NodeSnapshot`] (what stats give) → [`Observations`] | `makeSignalObservations` |
//! | [`evaluate`] | thresholds met, grace periods, conditions, transition period | `helpers.go` |
//! | [`ranking`] | pod order for memory, disk, PIDs | `rank*` |
//! | [`messages`] | `Evicted` message and annotations, `DisruptionTarget`, `Admit` | `evictionMessage`, `Admit` |
//! | [`manager`] | [`EvictionManager`]: `synchronize`, the loop, the injected traits | `eviction_manager.go` |
//! | [`metrics`] | `kubelet_evictions`, `kubelet_eviction_stats_age_seconds`, swiftlet's decision latency | `pkg/kubelet/metrics` |
//!
//! Quantities printed as Go prints them ([`crate::types::quantity::Quantity`]) and the
//! critical pod test ([`crate::types::pod::is_critical_pod`]) come from the
//! [`crate::types`] leaf.
//!
//! # Wiring (what the agent does)
//! 1. **Config**: `EvictionConfig::from_settings` of `settings::eviction(&kc)` after validation; an
//!    error names each bad `setting[signal]` (exit with the usage code, as for other bad
//!    config).
//! 2. **Stats** — implement [`StatsSource`]:
//!    - `snapshot()`: a *fresh* full collection (not one reused from the last second:
//!      a pass whose stats are no newer than the previous pass's does not evict), then
//!      [`NodeSnapshot::from_summary`]`(&collection.summary(), dedicated)`. The Summary must
//!      carry `node.memory` (root cgroup, limit `MemTotal`), the `pods` system container
//!      (`Inventory::pods_cgroup`), `node.fs`, `node.runtime.imageFs` (fill
//!      `Inventory::image_fs` from CRI `ImageFsInfo`; without it the image filesystem is
//!      taken to be the root filesystem), `node.rlimit`, and per pod the memory working
//!      set, containers' `rootfs`/`logs`, volumes and `process_stats`.
//!    - `has_dedicated_image_fs()`: whether the `ImageFsInfo` mount point is on another
//!      device (`st_dev`) than the kubelet root directory.
//! 3. **Pods** — implement [`ActivePods`]: `active_pods()` = the pod manager's pods that
//!    are admitted and not terminal/terminating (upstream `GetActivePods`);
//!    `pod_cleaned_up(pod)` = the pod worker finished it (no running containers, volumes
//!    unmounted, cgroup removed: upstream `podResourcesAreReclaimed`).
//! 4. **Kill** — implement [`PodKiller`]: `kill_pod(eviction)` sends
//!    `WorkType::Kill { grace: Some(eviction.grace_period_seconds) }` to the pod's worker
//!    (0 must mean "kill now", not "use the pod's grace period") and waits for the
//!    containers to stop (bounded; e.g. grace + 10 s). The status the worker then
//!    reports must be the eviction's: call [`Eviction::apply_to_status`] on the generated
//!    status (phase `Failed`, reason `Evicted`, message, condition `DisruptionTarget`
//!    `True`/`TerminationByKubelet` with the same message), and keep it on every later
//!    status update of that pod: a pod is evicted once and stays `Failed`.
//! 5. **Reclaim** — implement [`NodeReclaimer`] with the container GC's "remove every
//!    dead container and sandbox" (no age/count limits, all sources deleted or not) and
//!    the image GC's "remove every unused image".
//! 6. **Events and metrics**: pass the agent's [`EventRecorder`](crate::events::EventRecorder)
//!    and `EvictionMetrics::new(&mut registry)` on the `/metrics` registry
//!    (`kubelet_evictions` is already in [`crate::metrics::COUNTERS_WITHOUT_TOTAL`]).
//! 7. **Spawn**: `let (pressure, rx) = crate::pressure::PressureSignals::channel();`
//!    `tracker.spawn(manager.clone().run(rx, shutdown.clone()).instrument(span))`; give
//!    `pressure` (cloneable) to the PSI / memcg / eBPF watchers of [`crate::pressure`],
//!    which send a signal whenever memory pressure rises; each signal runs a pass at once.
//! 8. **Node status**: `MemoryPressure` / `DiskPressure` / `PIDPressure` are
//!    `manager.is_under_*_pressure()`; the node status module turns them into
//!    conditions (reasons `KubeletHasInsufficientMemory`, ...) and the
//!    `node.kubernetes.io/*-pressure` taints are the node lifecycle controller's.
//! 9. **Admission**: call `manager.admit(&pod)` among the admit handlers; a refusal
//!    fails the pod with reason `Evicted` and message `The node had condition:
//!    [MemoryPressure]. `.
//!
//! # Differences from upstream
//! - Kernel signals ([`crate::pressure`]: PSI triggers, memcg thresholds, eBPF reclaim)
//!   start a pass at once; periodic passes still run every 10 s.
//! - Under disk pressure, pods are ranked by disk usages measured at most 5 s before
//!   (what the background `du` walks have not measured since is walked first): upstream
//!   ranks by walks up to two minutes old and can pick a pod that wrote nothing lately
//!   over the one filling the disk.
//! - Split image/container filesystems (`KubeletSeparateDiskGC`) are not supported:
//!   `containerfs.*` thresholds follow `nodefs.*` or `imagefs.*`.
//! - Swap is not added to `memory.available`.
//! - Hard evictions use grace period 0 (current upstream passes 1, because its pod
//!   worker reads 0 as "the pod's own"); soft ones min(pod's, `evictionMaxPodGracePeriod`),
//!   which is what upstream's pod worker makes of the override.
//! - Event annotations are returned in [`Eviction::annotations`] but not recorded, as the
//!   agent's `EventRecorder` has no annotations.
//! - Ties in ranking keep the active pods' order (upstream's sort is not stable).

pub mod adapters;
pub mod evaluate;
pub mod local_storage;
pub mod manager;
pub mod messages;
pub mod metrics;
pub mod observations;
pub mod ranking;
pub mod thresholds;

#[cfg(test)]
mod tests;

pub use manager::{
    ActivePods, BoxError, Dependencies, Eviction, EvictionManager, MONITORING_INTERVAL, NodeReclaimer, PodKiller,
    StatsSource, Trigger,
};
pub use messages::{REASON, admit};
pub use metrics::EvictionMetrics;
pub use observations::{
    ContainerUsage, FsSnapshot, FsUsage, MemorySnapshot, NodeSnapshot, Observation, Observations, PidSnapshot,
    PodUsage, VolumeUsage, make_observations,
};
pub use thresholds::{EvictionConfig, NodeCondition, Resource, Signal, Threshold, ThresholdValue};
