//! Garbage collection of dead containers and sandboxes (upstream `kuberuntime_gc.go`).
//!
//! Every [`CONTAINER_GC_PERIOD`] (1 min, upstream's `ContainerGCPeriod`), once every pod
//! source has reported:
//! - dead containers (not running, created at least `min_age` ago) are grouped per
//!   (pod, container name), newest first. The groups of pods that are gone (neither
//!   desired nor with a pod worker) are removed entirely; of the others, at most
//!   `max_per_pod_container` (1) dead containers are kept per group — the newest, whose
//!   state the pod status shows as `lastState`; then, if `max_containers` ≥ 0 and more
//!   dead containers remain on the node, each group is cut to `max_containers / groups`
//!   (at least 1) and then the oldest go until the total fits;
//! - sandboxes: of a pod that is gone, every sandbox that is not ready and has no
//!   containers; of the others, all but the newest such.
//!
//! A container's log file is removed with it, as upstream's `removeContainerLog`. Running
//! containers and containers without the kubelet's labels are never touched. Errors are
//! logged per container and the pass goes on.

mod containers;

pub use containers::{ContainerGc, PodPresence};

/// Upstream `ContainerGCPeriod`.
pub const CONTAINER_GC_PERIOD: std::time::Duration = std::time::Duration::from_mins(1);

/// Upstream's `GCPolicy` (flags `--minimum-container-ttl-duration`,
/// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// Minimum age of a dead container before it may go. Default 0.
    pub min_age: std::time::Duration,
    /// Dead containers kept per (pod, container); below 0: no limit. Default 1.
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node; below 0: no limit. Default -1.
    pub max_containers: i32,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        Self { min_age: std::time::Duration::ZERO, max_per_pod_container: 1, max_containers: -1 }
    }
}
