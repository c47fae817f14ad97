//! Starts the eBPF sensors (crate `swiftlet-ebpf`) for the evented PLEG and adapts their
//! events to [`KernelEvent`]s. Every failure comes back as a sentence for the log and
//! `/healthz`: the caller falls back to relisting and never crashes for lack of eBPF.

use std::sync::Arc;

use swiftlet_ebpf::{SensorConfig, SensorEvent, Sensors};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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

/// Converts a sensor event to the agent's [`KernelEvent`].
#[must_use]
pub fn convert(ev: SensorEvent) -> KernelEvent {
    let memcg = |t: &swiftlet_ebpf::TaskInfo| t.memcg.map_or(0, |c| c.id);
    match ev {
        SensorEvent::CgroupMkdir(c) => KernelEvent::CgroupMkdir {
            ktime_ns: c.ktime_ns,
            hierarchy_id: c.cgroup.hierarchy_id,
            cgroup_id: c.cgroup.id,
            path: c.path.to_string_lossy().into_owned(),
        },
        SensorEvent::CgroupRmdir(c) => KernelEvent::CgroupRmdir {
            ktime_ns: c.ktime_ns,
            hierarchy_id: c.cgroup.hierarchy_id,
            cgroup_id: c.cgroup.id,
            path: c.path.to_string_lossy().into_owned(),
        },
        SensorEvent::Exec { ktime_ns, task, ns_init, first_in_cgroup } => KernelEvent::Exec {
            ktime_ns,
            pid: task.tgid,
            cgroup2_id: task.cgroup2.id,
            memcg_id: memcg(&task),
            // The first exec in a container cgroup is its main process, also when the
            // container shares the host's or the pod's pid namespace.
            ns_init: ns_init || first_in_cgroup,
        },
        SensorEvent::Exit { ktime_ns, task, status, ns_init, main_process } => KernelEvent::Exit {
            ktime_ns,
            pid: task.tgid,
            cgroup2_id: task.cgroup2.id,
            memcg_id: memcg(&task),
            ns_init,
            main_process,
            exit_code: status.container_exit_code(),
            signal: status.signal().unwrap_or(0),
        },
        SensorEvent::OomKill { ktime_ns, victim, .. } => {
            KernelEvent::OomKill { ktime_ns, pid: victim.tgid, cgroup2_id: victim.cgroup2.id, memcg_id: memcg(&victim) }
        }
        SensorEvent::Reclaim { ktime_ns, task, scope, phase } => KernelEvent::Reclaim {
            ktime_ns,
            memcg_id: memcg(&task),
            begin: matches!(phase, swiftlet_ebpf::ReclaimPhase::Begin { .. }),
            direct: matches!(scope, swiftlet_ebpf::ReclaimScope::Direct),
        },
    }
}

/// Loads and attaches the sensors, watches the kubepods cgroups and starts the event
/// stream (until `shutdown`). Must run inside the tokio runtime.
pub fn start(dirs: &KubepodsDirs, shutdown: &CancellationToken) -> Result<Running, String> {
    let mut sensors = Sensors::load(&SensorConfig::default()).map_err(|e| e.to_string())?;
    let mut watched = 0;
    for dir in [&dirs.cgroup2, &dirs.memory_v1].into_iter().flatten() {
        sensors.watch_cgroup(dir).map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
        watched += 1;
    }
    if watched == 0 {
        return Err("no kubepods cgroup to watch (cgroupsPerQOS is off)".into());
    }
    let mut raw = sensors.take_event_stream(shutdown).map_err(|e| e.to_string())?;
    let sensors = Arc::new(sensors);
    let (tx, events) = mpsc::channel(4096);
    let keep = sensors.clone();
    tokio::spawn(async move {
        // `keep` holds the sensors (and so the programs) for as long as events flow.
        let _sensors = keep;
        while let Some(ev) = raw.recv().await {
            if tx.send(convert(ev)).await.is_err() {
                break;
            }
        }
    });
    Ok(Running { events, drops: Box::new(move || sensors.drops()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_hierarchy_is_read_from_proc() {
        // This host mounts memory on v1 (hybrid); a pure v2 host gives 0.
        let id = memory_hierarchy_id();
        let text = std::fs::read_to_string("/proc/cgroups").unwrap();
        let expected = text
            .lines()
            .find(|l| l.starts_with("memory"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|h| h.parse().ok())
            .unwrap_or(0);
        assert_eq!(id, expected);
    }
}
