//! Per-container, per-pod and node stats from cgroup and proc files (upstream
//! `pkg/kubelet/stats` with cAdvisor's cgroup readers), and the two endpoints built on
//! them: `/stats/summary` (the Summary API, [`summary`]) and `/metrics/resource`
//! ([`resource_metrics`]).
//!
//! # Use
//! 1. Build a [`Collector`] once from a [`CollectorConfig`] ([`CgroupHierarchies::detect`]
//!    on `/sys/fs/cgroup`, procfs at `/proc`), and spawn [`FsUsageCache::run`] of its
//!    [`Collector::fs_usage`]: the background walks of writable layers and volumes (a pass
//!    only reads that cache).
//! 2. Every 10 s (upstream's eviction-manager period, which is what updates
//!    `usageNanoCores` upstream) and, if wanted, on demand: describe what runs in an
//!    [`Inventory`] (pods, their cgroups, sandbox and running containers, log directories,
//!    volumes: all things the agent already knows, no CRI stats call) and call
//!    [`Collector::collect`] from a blocking context. It returns a [`Collection`] of raw
//!    numbers; keep the latest one (behind an `Arc`) for the endpoints and the eviction
//!    manager.
//! 3. `/stats/summary`: serialize [`Collection::summary`] with `serde_json` (compact, as
//!    upstream), or [`Collection::cpu_and_memory_summary`] when the query has
//!    `only_cpu_and_memory=true` ([`only_cpu_and_memory`] parses the query as upstream).
//! 4. `/metrics/resource`: [`Collection::resource_metrics`] (or
//!    [`resource_metrics::render`]`(None)` when no collection is available, which reports
//!    `scrape_error 1`), served as [`resource_metrics::CONTENT_TYPE`].
//! 5. `/metrics/cadvisor`: [`Collection::cadvisor_metrics`] ([`cadvisor`]).
//! 6. `/metrics`: register a [`log_metrics::LogMetricsCollector`] over
//!    [`provider::StatsProvider::latest`] (`kubelet_container_log_filesystem_used_bytes`),
//!    and give the collector the agent's metrics ([`CollectorConfig::metrics`]) for
//!    `kubelet_volume_metric_collection_duration_seconds`.
//!
//! [`synthetic`] makes collections of any size without a host, for the renderers'
//! benchmark (`agent/benches/metrics_render.rs`) and tests.
//!
//! # Upstream behaviour kept
//! Upstream (1.28, containerd) takes container CPU/memory from cAdvisor's cgroup reads,
//! the writable layer from CRI `ListContainerStats`, pod CPU/memory/swap from the pod
//! cgroup, network from the sandbox's network namespace, log and volume usage from `du`,
//! node numbers from the root cgroup, `node.fs` from `statvfs` of the kubelet's root
//! directory and `node.runtime.imageFs` from CRI `ImageFsInfo` (usage) plus `statvfs` of
//! its mount point (capacity); `runtime.containerFs` does not exist in 1.28. The same sources are read here directly, in one
//! pass (see [`cgroup`] for what each number is, [`build`] for how the Summary is filled).
//! Containers and pods that vanished between the inventory and the read are left out, as
//! upstream's stats list only what it could read; pods without a running container are
//! left out, as upstream's CRI provider lists pods from their containers.
//!
//! # Deviations
//! - `usageNanoCores` is computed between two passes of this collector (not cAdvisor's
//!   own housekeeping samples) and is absent on a cgroup's first pass.
//! - The writable layer's usage is a `du` of the overlay upper directory of the
//!   container's root mount (what containerd's overlayfs snapshotter measures for
//!   `ListContainerStats`, without asking it), walked in the background at most every
//!   [`FsUsageConfig::interval`] plus jitter, so `rootfs.time` is that walk's; until the
//!   first walk (or with another snapshotter) `rootfs` has capacity only. Volumes are
//!   walked the same way. Logs are listed on every pass, as upstream.
//! - CSI volumes are measured as upstream's `metricsCsi`: by their driver's
//!   `NodeGetVolumeStats` ([`VolumeStatsSource`]), on the same background schedule as the
//!   walks (upstream's volume stat calculator: `volumeStatsAggPeriod` plus jitter), for
//!   filesystem and block volumes alike; a CSI volume whose driver lacks
//!   `GET_VOLUME_STATS`, is not registered or fails the call has no stats (upstream's
//!   `NotSupported` and error cases), nothing is walked for it.
//! - Without an `ImageFsInfo` answer the summary still succeeds, without
//!   `runtime.imageFs` (upstream fails the whole request).
//! - PSI (`psi`, `io`) is included wherever the kernel has pressure files, including the
//!   hybrid cgroup2 mount of v1 hosts; upstream gates it on `KubeletPSI` (1.33+) and reads
//!   it on v2 only.
//! - `/metrics/resource` adds the swap usage families of newer kubelets to the 1.28 set.
//! - Accelerators, user-defined metrics, volume health and `runtime.containerFs` (1.29+)
//!   are never filled.
//! - `kubelet_container_log_filesystem_used_bytes` is rendered from the latest collection
//!   if it is recent, never by collecting during the scrape (upstream lists pod stats per
//!   scrape): the first scrape after a quiet spell has none.

pub mod build;
pub mod cadvisor;
pub mod cgroup;
pub mod collector;
pub mod fs;
pub mod log_metrics;
pub mod metrics;
pub mod mounts;
pub mod processes;
pub mod procfs;
pub mod provider;
pub mod resource_metrics;
pub mod summary;
pub mod synthetic;
pub mod usage_cache;
pub mod volume_metrics;

#[cfg(test)]
mod tests;

pub use cgroup::{CgroupHierarchies, CgroupStats, CpuUsage, MemoryUsage};
pub use collector::{
    Collection, Collector, CollectorConfig, ContainerInventory, DriverVolume, ImageFsInventory, Inventory,
    PodInventory, SystemContainerInventory, VolumeInventory,
};
pub use summary::Summary;
pub use usage_cache::{DriverVolumeStats, FsUsageCache, FsUsageConfig, VolumeStatsSource};

impl Collection {
    /// The full Summary (`/stats/summary`).
    #[must_use]
    pub fn summary(&self) -> Summary {
        build::summary(self, true)
    }

    /// The CPU-and-memory Summary (`/stats/summary?only_cpu_and_memory=true`, and what
    /// `/metrics/resource` is built from): node, system containers, pods and containers
    /// with their names, start times, `cpu`, `memory` and `swap` only.
    #[must_use]
    pub fn cpu_and_memory_summary(&self) -> Summary {
        build::summary(self, false)
    }

    /// The `/metrics/resource` text.
    #[must_use]
    pub fn resource_metrics(&self) -> String {
        resource_metrics::render(Some(&self.cpu_and_memory_summary()))
    }

    /// The `/metrics/cadvisor` text ([`cadvisor::render`]; machine facts read from the
    /// host), served as [`cadvisor::CONTENT_TYPE`].
    #[must_use]
    pub fn cadvisor_metrics(&self) -> String {
        cadvisor::render(self)
    }
}

/// Whether a `/stats/summary` query string asks for CPU and memory only: exactly one
/// `only_cpu_and_memory` parameter whose value is `true` (upstream `handleSummary`).
#[must_use]
pub fn only_cpu_and_memory(query: Option<&str>) -> bool {
    let values: Vec<String> = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .filter(|(k, _)| k == "only_cpu_and_memory")
        .map(|(_, v)| v.into_owned())
        .collect();
    values.len() == 1 && values[0] == "true"
}
