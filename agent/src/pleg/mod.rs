//! The pod lifecycle event generator (`pkg/kubelet/pleg`): tells the sync loop that a
//! pod's containers changed state in the runtime.
//!
//! - [`relist::GenericPleg`] lists the runtime periodically and diffs (upstream's generic
//!   PLEG). Alone, at 1 s, it is the PLEG when eBPF is off or cannot load.
//! - [`evented::EventedPleg`] turns kernel events (container init exec/exit, seen by the
//!   eBPF sensors in microseconds) into lifecycle events — starts after confirming the new
//!   state with CRI, exits of a container's pid 1 at once, recorded in
//!   [`crate::container::exits::KernelExits`] for the pod status until containerd catches up — and keeps a
//!   slow relist (30 s) underneath as a safety net that repairs, counts and logs anything
//!   the kernel path missed.

pub mod evented;
pub mod metrics;
pub mod relist;
pub mod sensors;

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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

/// The PLEG boundary. The agent picks one PLEG at start-up and knows it only through this
/// trait: it starts it, and `/healthz` asks it whether it is healthy and what it is. What
/// a PLEG learns of the runtime goes to the [`crate::container::cache::RuntimeCache`]
/// (the listing, the kernel's exits), where the sync loop, the pod workers and the stats
/// read it; its events go to the sync loop's channel.
pub trait PodLifecycleEventGenerator: Send + Sync + std::fmt::Debug {
    /// `Err(reason)` when the PLEG has not been active for longer than its threshold.
    fn healthy(&self) -> Result<(), String>;
    /// The relist period in use.
    fn period(&self) -> Duration;
    /// Which PLEG runs and, when the kernel's events are not in use, why (the note of
    /// `/healthz`'s `pleg` check).
    fn describe(&self) -> String;
    /// The PLEG's task: sends events to `tx` until `shutdown`. Called once.
    fn start(&self, tx: mpsc::Sender<PodLifecycleEvent>, shutdown: CancellationToken) -> BoxFuture<'static, ()>;
}
