//! Starts the eBPF sensors (crate `swiftlet-ebpf`) for the evented PLEG and adapts their
//! events to [`KernelEvent`]s. Every failure is returned as a sentence for the log and
//! `/healthz`: the caller falls back to relisting and never crashes for lack of eBPF.

use std::path::Path;

use tokio::sync::mpsc;

use super::evented::KernelEvent;
use crate::cm::cgroupfs::KubepodsDirs;

/// A running sensor set: the event stream and a reader of the ring-buffer drop counter.
pub struct Running {
    pub events: mpsc::Receiver<KernelEvent>,
    pub drops: Box<dyn Fn() -> u64 + Send>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").finish_non_exhaustive()
    }
}

/// The v1 memory hierarchy id from `/proc/cgroups` (0 when memory is on cgroup2).
#[must_use]
pub fn memory_hierarchy_id() -> u32 {
    std::fs::read_to_string("/proc/cgroups")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some("memory")).then(|| f.next().and_then(|h| h.parse().ok())).flatten()
            })
        })
        .unwrap_or(0)
}

/// Loads and attaches the sensors and watches the kubepods cgroups.
pub fn start(dirs: &KubepodsDirs) -> Result<Running, String> {
    let _ = (dirs, Path::new("/"));
    Err("the eBPF sensors are not built into this swiftlet".into())
}
