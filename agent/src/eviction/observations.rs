//! What the eviction manager sees: a [`NodeSnapshot`] of the node's and pods' usage (the
//! part of upstream's Summary it reads), turned into [`Observations`] by the pure
//! [`make_observations`] (upstream `makeSignalObservations`).
//!
//! How each signal is observed, as upstream:
//! - `memory.available`: the node's `availableBytes`, i.e. capacity (`MemTotal`) −
//!   working set of the root cgroup, where working set = usage − `inactive_file`; its
//!   capacity is available + working set.
//! - `allocatableMemory.available`: the same numbers of the `pods` system container (the
//!   `kubepods` cgroup, whose limit is the node's allocatable memory).
//! - `nodefs.*`: the kubelet root filesystem; `imagefs.*`: the runtime's image
//!   filesystem; `containerfs.*`: the writable layers' filesystem (the image filesystem
//!   unless the runtime splits them, as upstream's CRI stats provider reports it).
//! - `pid.available`: `pid_max` − running processes, capacity `pid_max`.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use crate::stats::Summary;
use crate::stats::summary::{FsStats, MemoryStats, SYSTEM_CONTAINER_PODS};

use super::thresholds::Signal;
use crate::types::quantity::Quantity;

/// Memory of the node or of the pods cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySnapshot {
    /// Capacity − working set, floored at zero (the Summary's `availableBytes`).
    pub available_bytes: u64,
    /// Usage − `inactive_file`, floored at zero.
    pub working_set_bytes: u64,
    /// When read.
    pub time: Option<SystemTime>,
}

impl MemorySnapshot {
    /// From a capacity (or cgroup limit) and the cgroup's usage and inactive file pages.
    #[must_use]
    pub fn from_usage(capacity: u64, usage: u64, inactive_file: u64, time: Option<SystemTime>) -> Self {
        let working_set_bytes = usage.saturating_sub(inactive_file);
        Self { available_bytes: capacity.saturating_sub(working_set_bytes), working_set_bytes, time }
    }
}

/// A filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsSnapshot {
    /// Total bytes.
    pub capacity_bytes: Option<u64>,
    /// Bytes available to unprivileged users.
    pub available_bytes: Option<u64>,
    /// Total inodes.
    pub inodes: Option<u64>,
    /// Free inodes.
    pub inodes_free: Option<u64>,
    /// When measured.
    pub time: Option<SystemTime>,
}

/// Process ids of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidSnapshot {
    /// `kernel.pid_max` (or the lower `threads-max`).
    pub max_pid: i64,
    /// Running processes (tasks).
    pub running: i64,
    /// When read.
    pub time: Option<SystemTime>,
}

/// Disk usage of a container's writable layer, its logs, or a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsUsage {
    /// Bytes used.
    pub used_bytes: Option<u64>,
    /// Inodes used.
    pub inodes_used: Option<u64>,
}

/// One container's usage.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerUsage {
    /// Name in the pod spec.
    pub name: String,
    /// Working set bytes.
    pub memory_working_set_bytes: Option<u64>,
    /// The writable layer.
    pub rootfs: Option<FsUsage>,
    /// The container's log files.
    pub logs: Option<FsUsage>,
}

/// One volume's usage.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeUsage {
    /// Name in the pod spec (only `hostPath` and local ephemeral volumes of the spec count,
    /// as upstream's `localVolumeNames`).
    pub name: String,
    /// Its usage.
    pub usage: FsUsage,
}

/// One pod's usage (upstream `PodStats`, the fields eviction reads).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodUsage {
    /// The pod's UID.
    pub uid: String,
    /// Working set of the pod cgroup.
    pub memory_working_set_bytes: Option<u64>,
    /// Running containers, in the stats' order.
    pub containers: Vec<ContainerUsage>,
    /// Volumes.
    pub volumes: Vec<VolumeUsage>,
    /// Processes of the pod's containers.
    pub process_count: Option<u64>,
    /// The pod's ephemeral storage (writable layers, logs, local volumes).
    pub ephemeral_storage_used_bytes: Option<u64>,
}

/// What the eviction manager reads in one pass. `None` fields have no observation, and
/// thresholds of their signals are never met (upstream logs "no observation found").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSnapshot {
    /// The node (root cgroup, capacity `MemTotal`).
    pub memory: Option<MemorySnapshot>,
    /// The pods cgroup (`kubepods`, limit = allocatable memory).
    pub allocatable_memory: Option<MemorySnapshot>,
    /// The kubelet's root filesystem.
    pub node_fs: Option<FsSnapshot>,
    /// The image filesystem.
    pub image_fs: Option<FsSnapshot>,
    /// The writable layers' filesystem.
    pub container_fs: Option<FsSnapshot>,
    /// Process ids.
    pub pids: Option<PidSnapshot>,
    /// Pods that have stats.
    pub pods: Vec<PodUsage>,
}

fn memory_snapshot(m: Option<&MemoryStats>) -> Option<MemorySnapshot> {
    let m = m?;
    Some(MemorySnapshot {
        available_bytes: m.available_bytes?,
        working_set_bytes: m.working_set_bytes?,
        time: m.time.0,
    })
}

fn fs_snapshot(f: Option<&FsStats>) -> Option<FsSnapshot> {
    f.map(|f| FsSnapshot {
        capacity_bytes: f.capacity_bytes,
        available_bytes: f.available_bytes,
        inodes: f.inodes,
        inodes_free: f.inodes_free,
        time: f.time.0,
    })
}

fn fs_usage(f: Option<&FsStats>) -> Option<FsUsage> {
    f.map(|f| FsUsage { used_bytes: f.used_bytes, inodes_used: f.inodes_used })
}

impl NodeSnapshot {
    /// The snapshot of a full Summary (`/stats/summary`, not the CPU-and-memory one).
    ///
    /// Without `runtime.imageFs`, the image filesystem is taken to be the node's root
    /// filesystem unless `dedicated_image_fs` (where images live on the root filesystem,
    /// upstream's `imagefs.*` signals watch the root filesystem too); without
    /// `runtime.containerFs`, the writable layers live on the image filesystem, as
    /// upstream's CRI stats provider reports them.
    #[must_use]
    pub fn from_summary(summary: &Summary, dedicated_image_fs: bool) -> Self {
        let node = &summary.node;
        let node_fs = fs_snapshot(node.fs.as_ref());
        let runtime = node.runtime.as_ref();
        let image_fs =
            fs_snapshot(runtime.and_then(|r| r.image_fs.as_ref())).or(if dedicated_image_fs { None } else { node_fs });
        let container_fs = fs_snapshot(runtime.and_then(|r| r.container_fs.as_ref())).or(image_fs);
        let allocatable_memory = node
            .system_containers
            .iter()
            .find(|c| c.name == SYSTEM_CONTAINER_PODS)
            .and_then(|c| memory_snapshot(c.memory.as_ref()));
        let pids = node.rlimit.as_ref().and_then(|r| {
            Some(PidSnapshot { max_pid: r.max_pid?, running: r.num_of_running_processes?, time: r.time.0 })
        });
        let pod_usage = summary
            .pods
            .iter()
            .map(|p| PodUsage {
                uid: p.pod_ref.uid.clone(),
                memory_working_set_bytes: p.memory.as_ref().and_then(|m| m.working_set_bytes),
                containers: p
                    .containers
                    .iter()
                    .map(|c| ContainerUsage {
                        name: c.name.clone(),
                        memory_working_set_bytes: c.memory.as_ref().and_then(|m| m.working_set_bytes),
                        rootfs: fs_usage(c.rootfs.as_ref()),
                        logs: fs_usage(c.logs.as_ref()),
                    })
                    .collect(),
                volumes: p
                    .volume_stats
                    .iter()
                    .map(|v| VolumeUsage {
                        name: v.name.clone(),
                        usage: FsUsage { used_bytes: v.fs.used_bytes, inodes_used: v.fs.inodes_used },
                    })
                    .collect(),
                process_count: p.process_stats.as_ref().and_then(|s| s.process_count),
                ephemeral_storage_used_bytes: p.ephemeral_storage.as_ref().and_then(|e| e.used_bytes),
            })
            .collect();
        Self {
            memory: memory_snapshot(node.memory.as_ref()),
            allocatable_memory,
            node_fs,
            image_fs,
            container_fs,
            pids,
            pods: pod_usage,
        }
    }

    /// The pods' usage by UID (upstream `cachedStatsFunc`).
    #[must_use]
    pub fn pods_by_uid(&self) -> HashMap<&str, &PodUsage> {
        self.pods.iter().map(|p| (p.uid.as_str(), p)).collect()
    }
}

/// One signal's observation (`signalObservation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// What is available.
    pub available: Quantity,
    /// The total it is a part of (for percentage thresholds).
    pub capacity: Quantity,
    /// When the stats were read; `None` counts as always fresh.
    pub time: Option<SystemTime>,
}

/// Observations by signal.
pub type Observations = BTreeMap<Signal, Observation>;

fn memory_observation(m: &MemorySnapshot) -> Observation {
    Observation {
        available: Quantity::bytes(m.available_bytes),
        capacity: Quantity::bytes(m.available_bytes.saturating_add(m.working_set_bytes)),
        time: m.time,
    }
}

fn fs_observations(out: &mut Observations, fs: Option<&FsSnapshot>, bytes: Signal, inodes: Signal) {
    let Some(fs) = fs else { return };
    if let (Some(available), Some(capacity)) = (fs.available_bytes, fs.capacity_bytes) {
        out.insert(
            bytes,
            Observation { available: Quantity::bytes(available), capacity: Quantity::bytes(capacity), time: fs.time },
        );
    }
    if let (Some(free), Some(total)) = (fs.inodes_free, fs.inodes) {
        out.insert(
            inodes,
            Observation { available: Quantity::count(free), capacity: Quantity::count(total), time: fs.time },
        );
    }
}

/// The observations of a snapshot (`makeSignalObservations`).
#[must_use]
pub fn make_observations(snapshot: &NodeSnapshot) -> Observations {
    let mut out = Observations::new();
    if let Some(m) = &snapshot.memory {
        out.insert(Signal::MemoryAvailable, memory_observation(m));
    }
    if let Some(m) = &snapshot.allocatable_memory {
        out.insert(Signal::AllocatableMemoryAvailable, memory_observation(m));
    }
    fs_observations(&mut out, snapshot.node_fs.as_ref(), Signal::NodeFsAvailable, Signal::NodeFsInodesFree);
    fs_observations(&mut out, snapshot.image_fs.as_ref(), Signal::ImageFsAvailable, Signal::ImageFsInodesFree);
    fs_observations(
        &mut out,
        snapshot.container_fs.as_ref(),
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
    );
    if let Some(p) = &snapshot.pids {
        let format = crate::types::quantity::Format::DecimalSi;
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: Quantity::new(p.max_pid.saturating_sub(p.running), format),
                capacity: Quantity::new(p.max_pid, format),
                time: p.time,
            },
        );
    }
    out
}
