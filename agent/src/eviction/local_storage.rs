//! Local storage limit evictions (upstream `localStorageEviction`, on while
//! `localStorageCapacityIsolation` is true, the default): on every pass, whatever the node's
//! thresholds, a pod is evicted at once when
//! 1. an `emptyDir` volume with a `sizeLimit` uses more than it (its volume stats),
//! 2. the pod's ephemeral storage (writable layers, logs, local volumes: the Summary's
//!    `ephemeral-storage`) exceeds the sum of its containers' `ephemeral-storage` limits
//!    (`PodLimits`: sidecars add up, init containers raise the floor, overhead added), or
//! 3. a container's logs — plus its writable layer when the image filesystem is the node
//!    filesystem — exceed its own `ephemeral-storage` limit;
//!
//! checked in that order, the first that applies deciding the message. Critical pods are
//! never evicted. These evictions have no `DisruptionTarget` condition and no event
//! annotations, and count in `kubelet_evictions` under the pseudo-signals
//! `emptydirfs.limit`, `ephemeralpodfs.limit` and `ephemeralcontainerfs.limit`, as
//! upstream.

use k8s_openapi::api::core::v1::Pod;

use super::observations::PodUsage;
use crate::types::pod_resources;
use crate::types::quantity::{Format, Quantity};
use crate::types::resource_names::EPHEMERAL_STORAGE;

/// Which limit a pod went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalStorageLimit {
    /// An `emptyDir`'s `sizeLimit`.
    EmptyDir,
    /// The pod's total `ephemeral-storage` limit.
    Pod,
    /// A container's `ephemeral-storage` limit.
    Container,
}

impl LocalStorageLimit {
    /// The `eviction_signal` label of `kubelet_evictions`.
    #[must_use]
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::EmptyDir => "emptydirfs.limit",
            Self::Pod => "ephemeralpodfs.limit",
            Self::Container => "ephemeralcontainerfs.limit",
        }
    }
}

/// A pod over one of its local storage limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub limit: LocalStorageLimit,
    /// The eviction message (upstream's wording, trailing space included).
    pub message: String,
}

/// Go's `%q` of a plain string.
fn quoted(s: &str) -> String {
    format!("{s:?}")
}

fn parse(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<Quantity> {
    Quantity::parse(&q.0).ok()
}

/// The first limit of `pod` that its `usage` exceeds, if any (see the module docs).
/// `dedicated_image_fs`: the writable layers are on another filesystem than the node's,
/// so they do not count against a container's limit.
#[must_use]
pub fn violation(pod: &Pod, usage: &PodUsage, dedicated_image_fs: bool) -> Option<Violation> {
    empty_dir(pod, usage).or_else(|| pod_total(pod, usage)).or_else(|| container(pod, usage, dedicated_image_fs))
}

fn empty_dir(pod: &Pod, usage: &PodUsage) -> Option<Violation> {
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    volumes.iter().find_map(|v| {
        let limit = parse(v.empty_dir.as_ref()?.size_limit.as_ref()?)?;
        if limit <= Quantity::ZERO {
            return None;
        }
        let used = usage.volumes.iter().find(|u| u.name == v.name)?.usage.used_bytes?;
        (Quantity::bytes(used) > limit).then(|| Violation {
            limit: LocalStorageLimit::EmptyDir,
            message: format!(
                "Usage of EmptyDir volume {} exceeds the limit {}. ",
                quoted(&v.name),
                quoted(&limit.to_string())
            ),
        })
    })
}

/// The format of the first `ephemeral-storage` limit among the pod's containers (the
/// receiver of upstream's sum, whose format the total keeps).
fn first_limit_format(pod: &Pod) -> Format {
    let spec = pod.spec.as_ref();
    let containers = spec
        .and_then(|s| s.init_containers.as_deref())
        .into_iter()
        .flatten()
        .chain(spec.map(|s| s.containers.as_slice()).unwrap_or_default());
    containers
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(EPHEMERAL_STORAGE))
        .find_map(parse)
        .map_or(Format::BinarySi, Quantity::format)
}

fn pod_total(pod: &Pod, usage: &PodUsage) -> Option<Violation> {
    let limits = pod_resources::pod_limits(pod);
    let limit = limits.get(EPHEMERAL_STORAGE)?;
    let limit = Quantity::new(limit.value_saturating(), first_limit_format(pod));
    let used = Quantity::bytes(usage.ephemeral_storage_used_bytes.unwrap_or(0));
    (used > limit).then(|| Violation {
        limit: LocalStorageLimit::Pod,
        message: format!("Pod ephemeral local storage usage exceeds the total limit of containers {limit}. "),
    })
}

fn container(pod: &Pod, usage: &PodUsage, dedicated_image_fs: bool) -> Option<Violation> {
    let containers = &pod.spec.as_ref()?.containers;
    usage.containers.iter().find_map(|stats| {
        let spec = containers.iter().find(|c| c.name == stats.name)?;
        let limit = parse(spec.resources.as_ref()?.limits.as_ref()?.get(EPHEMERAL_STORAGE)?)?;
        if limit.is_zero() {
            return None;
        }
        let mut used = stats.logs.as_ref().and_then(|l| l.used_bytes).unwrap_or(0);
        if !dedicated_image_fs {
            used = used.saturating_add(stats.rootfs.as_ref().and_then(|r| r.used_bytes).unwrap_or(0));
        }
        (Quantity::bytes(used) > limit).then(|| Violation {
            limit: LocalStorageLimit::Container,
            message: format!(
                "Container {} exceeded its local ephemeral storage limit {}. ",
                stats.name,
                quoted(&limit.to_string())
            ),
        })
    })
}
