//! The pod lifecycle event generator (`pkg/kubelet/pleg`): tells the sync loop that a
//! pod's containers changed state in the runtime. [`relist::GenericPleg`] lists the
//! runtime every second and diffs; it is the safety net under the eBPF-driven PLEG
//! (next issue) and the only PLEG when eBPF cannot load.

pub mod relist;

use std::time::Duration;

/// Kind of a lifecycle event (upstream `PodLifeCycleEventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodLifecycleEventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
    PodSync,
}

/// A change in one pod: `data` is the container (or sandbox) id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    pub pod_uid: String,
    pub kind: PodLifecycleEventType,
    pub data: String,
}

/// The PLEG boundary: events go to a channel given at construction; the sync loop and
/// `/healthz` ask whether it is healthy.
pub trait PodLifecycleEventGenerator: Send + Sync + std::fmt::Debug {
    /// `Err(reason)` when the PLEG has not been active for longer than its threshold.
    fn healthy(&self) -> Result<(), String>;
    /// The configured relist period.
    fn period(&self) -> Duration;
}
