//! The pod lifecycle event generator (`pkg/kubelet/pleg`): tells the sync loop that a
//! pod's containers changed state in the runtime.
//!
//! - [`relist::GenericPleg`] lists the runtime periodically and diffs (upstream's generic
//!   PLEG). Alone, at 1 s, it is the PLEG when eBPF is off or cannot load.
//! - [`evented::EventedPleg`] turns kernel events (container init exec/exit, seen by the
//!   eBPF sensors in microseconds) into lifecycle events — starts after confirming the new
//!   state with CRI, exits of a container's pid 1 at once, recorded in
//!   [`exits::KernelExits`] for the pod status until containerd catches up — and keeps a
//!   slow relist (30 s) underneath as a safety net that repairs, counts and logs anything
//!   the kernel path missed.

pub mod evented;
pub mod exits;
pub mod relist;
pub mod sensors;
pub mod starts;

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
    /// When the kernel saw the change (`CLOCK_MONOTONIC` ns), for events from the eBPF
    /// sensors; `None` for relist events.
    pub kernel_time_ns: Option<u64>,
}

/// The PLEG boundary: events go to a channel given at construction; the sync loop and
/// `/healthz` ask whether it is healthy.
pub trait PodLifecycleEventGenerator: Send + Sync + std::fmt::Debug {
    /// `Err(reason)` when the PLEG has not been active for longer than its threshold.
    fn healthy(&self) -> Result<(), String>;
    /// The configured relist period.
    fn period(&self) -> Duration;
}
