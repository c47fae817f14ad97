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
            pid1: ns_init,
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

/// Loads and attaches the sensors with a ring buffer of `ring_buffer_bytes`
/// (`--evented-pleg-ring-buffer-bytes`), watches the kubepods cgroups and starts the
/// event stream (until `shutdown`). Must run inside the tokio runtime.
pub fn start(dirs: &KubepodsDirs, ring_buffer_bytes: u32, shutdown: &CancellationToken) -> Result<Running, String> {
    let config = SensorConfig { ring_buffer_bytes, ..SensorConfig::default() };
    let mut sensors = Sensors::load(&config).map_err(|e| e.to_string())?;
    let mut watched = 0;
    for dir in [&dirs.cgroup2, &dirs.memory_v1].into_iter().flatten() {
        sensors.watch_cgroup(dir).map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
        watched += 1;
    }
    if watched == 0 {
        return Err("no kubepods cgroup to watch (cgroupsPerQOS is off)".into());
    }
    // After the watch, so a container started in between is either adopted here or has
    // its first exec seen by the sensors (adopting it as well names the same process).
    let adopted: usize =
        [&dirs.cgroup2, &dirs.memory_v1].into_iter().flatten().map(|root| adopt_running(&mut sensors, root)).sum();
    if adopted > 0 {
        tracing::info!(cgroups = adopted, "told the sensors the main process of every container already running");
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

/// Tells the sensors the main process of every container cgroup under `root` (a watched
/// kubepods directory) that already has processes: the containers an earlier agent
/// started. Without it, the first exec the sensors see in such a cgroup (an exec probe,
/// say) would pass for the container's main process, and the real one's exit would only
/// be seen by the relist when the container shares a pid namespace. Returns how many
/// cgroups were adopted; a cgroup that cannot be is logged and left to CRI.
fn adopt_running(sensors: &mut Sensors, root: &std::path::Path) -> usize {
    let mut adopted = 0;
    for found in super::evented::existing_cgroups(root) {
        if found.owner.container_id.is_none() {
            continue;
        }
        let path = &found.path;
        let Some(main) = main_process(path) else { continue };
        let result = swiftlet_ebpf::CgroupId::of_dir(path)
            .map_err(|e| e.to_string())
            .and_then(|cgroup| sensors.adopt_cgroup(cgroup, main).map_err(|e| e.to_string()));
        match result {
            Ok(()) => adopted += 1,
            Err(error) => {
                tracing::warn!(cgroup = %path.display(), main, %error, "cannot adopt a running container's cgroup");
            }
        }
    }
    adopted
}

/// A container cgroup's main process: of the processes in it, the one that started
/// first (the runtime's init, which exec'd the container's command; everything else in
/// the cgroup is its descendant or was exec'd into it later). Ties on the start time
/// (clock ticks) go to the lower pid. `None` for an empty or vanished cgroup.
fn main_process(dir: &std::path::Path) -> Option<u32> {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
    procs
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((start_time(&stat)?, pid))
        })
        .min()
        .map(|(_, pid)| pid)
}

/// Field 22 of `/proc/<pid>/stat` (`starttime`, clock ticks since boot). The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after its last `)`.
fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state).
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_counted_after_the_command_name() {
        let stat = "4242 (my (odd) cmd) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1024 10";
        assert_eq!(start_time(stat), Some(987_654));
        assert_eq!(start_time("1 (x) S 0"), None);
        assert_eq!(start_time("garbage"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(start_time(&own).is_some_and(|t| t > 0));
    }

    #[test]
    fn the_main_process_is_the_one_that_started_first() {
        // This test's own process started before the child it spawns, and both sit in
        // a fake "cgroup" whose cgroup.procs lists them (child first).
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = std::process::id();
        std::fs::write(dir.path().join("cgroup.procs"), format!("{}\n{me}\n", child.id())).unwrap();
        let main = main_process(dir.path());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(main, Some(me));
        std::fs::write(dir.path().join("cgroup.procs"), "").unwrap();
        assert_eq!(main_process(dir.path()), None);
        assert_eq!(main_process(&dir.path().join("gone")), None);
    }

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
