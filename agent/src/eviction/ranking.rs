//! Ranking pods for eviction (`rankMemoryPressure`, `rankDiskPressureFunc`,
//! `rankPIDPressure`): the first pod of the ranked list is evicted first.
//!
//! - memory: pods whose usage exceeds their request first, then lower priority, then
//!   larger usage above request;
//! - disk (bytes or inodes): the same, with the disk usage the signal's filesystem holds
//!   (container writable layers, logs, local volumes) and the `ephemeral-storage` request;
//! - PIDs: lower priority first, then more processes.
//!
//! A pod without stats ranks before pods with stats in every usage comparison, as
//! upstream ("prioritize evicting the pod for which no stats were found"). Ties keep the
//! order of the input (the sort is stable; upstream's is not).

use crate::types::pod::uid as pod_uid;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::BuildHasher;

use k8s_openapi::api::core::v1::Pod;

use crate::types::pod_resources::{self, ResourceList};

use super::observations::{FsUsage, PodUsage};
use super::thresholds::{Resource, Signal};
use crate::types::quantity::Quantity;

/// Which usage counts towards a filesystem (`fsStatsType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsStatsType {
    /// Container writable layers.
    Root,
    /// Container logs.
    Logs,
    /// `hostPath` and local ephemeral volumes.
    LocalVolumeSource,
    /// Images (counted by upstream's list but measured nowhere per pod).
    Images,
}

/// How pods are ranked for a signal (`buildSignalToRankFunc` without split image and
/// container filesystems).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// `rankMemoryPressure`.
    Memory,
    /// `rankPIDPressure`.
    Pids,
    /// `rankDiskPressureFunc(stats, resource)`.
    Disk {
        /// What counts.
        stats: &'static [FsStatsType],
        /// Bytes (`ephemeral-storage`) or inodes.
        resource: Resource,
    },
}

const ALL_FS: &[FsStatsType] =
    &[FsStatsType::Images, FsStatsType::Root, FsStatsType::Logs, FsStatsType::LocalVolumeSource];
const NODE_FS_WITH_IMAGE_FS: &[FsStatsType] = &[FsStatsType::Logs, FsStatsType::LocalVolumeSource];
const IMAGE_FS: &[FsStatsType] = &[FsStatsType::Root, FsStatsType::Images];

impl Ranking {
    /// The ranking of `signal`.
    #[must_use]
    pub fn for_signal(signal: Signal, dedicated_image_fs: bool) -> Self {
        let resource = signal.resource();
        match signal {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Self::Memory,
            Signal::PidAvailable => Self::Pids,
            Signal::NodeFsAvailable | Signal::NodeFsInodesFree if dedicated_image_fs => {
                Self::Disk { stats: NODE_FS_WITH_IMAGE_FS, resource }
            }
            Signal::ImageFsAvailable
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsAvailable
            | Signal::ContainerFsInodesFree
                if dedicated_image_fs =>
            {
                Self::Disk { stats: IMAGE_FS, resource }
            }
            _ => Self::Disk { stats: ALL_FS, resource },
        }
    }
}

/// `PodPriority`: `spec.priority`, 0 when unset.
#[must_use]
pub fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pod's request of `resource` (`GetResourceRequestQuantity`), zero if none.
#[must_use]
pub fn pod_request(requests: &ResourceList, resource: &str) -> Quantity {
    let units = pod_resources::get(requests, resource).value_saturating();
    Quantity::new(units, crate::types::quantity::Format::BinarySi)
}

/// `cmpBool`: `true` first.
fn cmp_bool(a: bool, b: bool) -> Ordering {
    match (a, b) {
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        _ => Ordering::Equal,
    }
}

/// Volumes of the spec that count as local disk (`localVolumeNames`).
fn local_volume_names(pod: &Pod) -> Vec<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter(|v| {
            let local_ephemeral = v.git_repo.is_some()
                || v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref().unwrap_or_default().is_empty())
                || v.config_map.is_some();
            v.host_path.is_some() || local_ephemeral
        })
        .map(|v| v.name.as_str())
        .collect()
}

fn add_usage(bytes: &mut u64, inodes: &mut u64, usage: Option<&FsUsage>) {
    if let Some(u) = usage {
        *bytes = bytes.saturating_add(u.used_bytes.unwrap_or(0));
        *inodes = inodes.saturating_add(u.inodes_used.unwrap_or(0));
    }
}

/// `podDiskUsage`: (bytes, inodes) of what `stats` counts.
#[must_use]
pub fn pod_disk_usage(pod: &Pod, usage: &PodUsage, stats: &[FsStatsType]) -> (u64, u64) {
    let (mut bytes, mut inodes) = (0, 0);
    for c in &usage.containers {
        if stats.contains(&FsStatsType::Root) {
            add_usage(&mut bytes, &mut inodes, c.rootfs.as_ref());
        }
        if stats.contains(&FsStatsType::Logs) {
            add_usage(&mut bytes, &mut inodes, c.logs.as_ref());
        }
    }
    if stats.contains(&FsStatsType::LocalVolumeSource) {
        for name in local_volume_names(pod) {
            add_usage(&mut bytes, &mut inodes, usage.volumes.iter().find(|v| v.name == name).map(|v| &v.usage));
        }
    }
    (bytes, inodes)
}

/// One pod with what its ranking needs.
struct Candidate<'a> {
    pod: &'a Pod,
    stats: Option<&'a PodUsage>,
    requests: ResourceList,
}

/// Which of two pods goes first by a usage of theirs: pods without stats first, then
/// those whose `usage` is positive (`exceeds`), or the larger `usage` (`!exceeds`).
fn by_usage(
    a: &Candidate<'_>,
    b: &Candidate<'_>,
    usage: impl Fn(&Candidate<'_>, &PodUsage) -> Quantity,
    exceeds: bool,
) -> Ordering {
    let (Some(sa), Some(sb)) = (a.stats, b.stats) else {
        return cmp_bool(a.stats.is_none(), b.stats.is_none());
    };
    let (ua, ub) = (usage(a, sa), usage(b, sb));
    if exceeds {
        let positive = |q: Quantity| !q.is_negative() && !q.is_zero();
        cmp_bool(positive(ua), positive(ub))
    } else {
        ub.cmp(&ua)
    }
}

fn memory_above_request(c: &Candidate<'_>, s: &PodUsage) -> Quantity {
    Quantity::bytes(s.memory_working_set_bytes.unwrap_or(0)) - pod_request(&c.requests, Resource::Memory.as_str())
}

fn disk_usage(c: &Candidate<'_>, s: &PodUsage, stats: &[FsStatsType], resource: Resource) -> Quantity {
    let (bytes, inodes) = pod_disk_usage(c.pod, s, stats);
    if resource == Resource::Inodes { Quantity::count(inodes) } else { Quantity::bytes(bytes) }
}

fn priority(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    pod_priority(a.pod).cmp(&pod_priority(b.pod))
}

/// Ranks `pods` for `ranking` with the stats of `usage` (by pod UID); returns them in
/// eviction order.
#[must_use]
pub fn rank<'a, S: BuildHasher, P: std::borrow::Borrow<Pod>>(
    pods: &'a [P],
    usage: &HashMap<&str, &'a PodUsage, S>,
    ranking: Ranking,
) -> Vec<&'a Pod> {
    let mut candidates: Vec<Candidate<'a>> = pods
        .iter()
        .map(std::borrow::Borrow::borrow)
        .map(|pod| Candidate {
            pod,
            stats: usage.get(pod_uid(pod)).copied(),
            requests: pod_resources::pod_requests(pod),
        })
        .collect();
    match ranking {
        Ranking::Memory => candidates.sort_by(|a, b| {
            by_usage(a, b, memory_above_request, true)
                .then_with(|| priority(a, b))
                .then_with(|| by_usage(a, b, memory_above_request, false))
        }),
        Ranking::Pids => candidates.sort_by(|a, b| {
            priority(a, b).then_with(|| by_usage(a, b, |_, s| Quantity::count(s.process_count.unwrap_or(0)), false))
        }),
        Ranking::Disk { stats, resource } => {
            // Exceeding compares usage with the request of the measured resource (none
            // for inodes); the usage order subtracts the ephemeral-storage request even
            // for inodes, as upstream does.
            let above_own_request = move |c: &Candidate<'_>, s: &PodUsage| {
                disk_usage(c, s, stats, resource) - pod_request(&c.requests, resource.as_str())
            };
            let above_storage_request = move |c: &Candidate<'_>, s: &PodUsage| {
                disk_usage(c, s, stats, resource) - pod_request(&c.requests, Resource::EphemeralStorage.as_str())
            };
            candidates.sort_by(|a, b| {
                by_usage(a, b, above_own_request, true)
                    .then_with(|| priority(a, b))
                    .then_with(|| by_usage(a, b, above_storage_request, false))
            });
        }
    }
    candidates.into_iter().map(|c| c.pod).collect()
}
