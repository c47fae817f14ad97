//! Where the machine's CPU went during a burst: the agent, the control plane, the runtime,
//! the pods' own processes, the bench, and the rest (kernel threads, interrupts, whatever
//! else runs), from two readings of every process in `/proc` and of `/proc/stat`.
//!
//! On this machine kind a burst of pod starts is CPU-bound: the runtime's own burst (no
//! agent, no API server work) shows how fast the runtime goes with the cores to itself,
//! and whatever an agent's burst adds — its own CPU, the API server's and etcd's work for
//! its requests — comes out of the runtime's share. This split is the profile of a burst
//! row's distance from the floor.
//!
//! A process's CPU is its own (`utime + stime`, all threads) and that of its children it
//! has waited for (`cutime + cstime`): runc's and the CNI plugins' short lives land in the
//! shim's and containerd's. A process that started in the window counts whole; one that
//! ended in it without a parent here to wait for it is not seen (its CPU is in the rest).

use std::{collections::HashMap, fs};

use super::procfs;

/// One process as read from `/proc/<pid>/stat`.
#[derive(Debug, Clone, PartialEq)]
struct Proc {
    comm: String,
    ppid: i32,
    /// Start time (ticks after boot): a pid seen twice with another start is another process.
    start: u64,
    /// Own CPU plus the CPU of waited-for children (ticks).
    ticks: u64,
}

/// Parses the fields [`Proc`] keeps from a `/proc/<pid>/stat` text (the command name is in
/// parentheses and may hold anything, so fields are counted from the last `)`).
fn parse_stat(stat: &str) -> Option<Proc> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let f: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: field 3 (state) is f[0]; ppid (4), utime (14), stime (15),
    // cutime (16), cstime (17), starttime (22).
    let num = |field: usize| -> Option<u64> { f.get(field - 3)?.parse().ok() };
    let ticks = num(14)? + num(15)? + num(16)? + num(17)?;
    Some(Proc { comm, ppid: i32::try_from(num(4)?).ok()?, start: num(22)?, ticks })
}

/// Every process and the machine's busy time, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    procs: HashMap<i32, Proc>,
    /// The machine's busy ticks (all CPUs: everything but idle and iowait).
    busy: u64,
    /// `CLOCK_MONOTONIC`, ns.
    at: u64,
}

impl Snapshot {
    pub fn take() -> Self {
        let mut procs = HashMap::new();
        if let Ok(dir) = fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
                if let Some(p) = fs::read_to_string(format!("/proc/{pid}/stat")).ok().as_deref().and_then(parse_stat) {
                    procs.insert(pid, p);
                }
            }
        }
        let busy = procfs::machine_cpu_times().map_or(0, |t| procfs::busy_ticks(&t));
        Self { procs, busy, at: procfs::monotonic_ns() }
    }
}

/// Who a process works for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Agent,
    ControlPlane,
    Runtime,
    Pods,
    Bench,
    Other,
}

/// The control plane's processes (`comm` is cut to 15 bytes: `kube-controller`).
const CONTROL_PLANE: [&str; 4] = ["kube-apiserver", "etcd", "kube-controller", "kube-scheduler"];

fn is_shim(comm: &str) -> bool {
    comm.starts_with("containerd-shim")
}

/// Which part `pid` belongs to in `procs`: the control plane by name; containerd, its
/// shims and runc as the runtime; the agent and the bench with their other children; a
/// shim's other descendants (the sandboxes' pause and the containers) as the pods.
fn part_of(procs: &HashMap<i32, Proc>, pid: i32, agent: Option<i32>, bench: i32) -> Part {
    let Some(p) = procs.get(&pid) else { return Part::Other };
    if Some(pid) == agent {
        return Part::Agent;
    }
    // By name before parentage: the bench may have started the test bed itself.
    if CONTROL_PLANE.contains(&p.comm.as_str()) {
        return Part::ControlPlane;
    }
    if p.comm == "containerd" || is_shim(&p.comm) || p.comm.starts_with("runc") {
        return Part::Runtime;
    }
    if Some(p.ppid) == agent {
        return Part::Agent;
    }
    if pid == bench || p.ppid == bench {
        return Part::Bench;
    }
    // Up the parents (a bounded walk: pids can form no cycle, but a racing read could).
    let mut cur = p.ppid;
    for _ in 0..64 {
        match procs.get(&cur) {
            Some(a) if is_shim(&a.comm) => return Part::Pods,
            Some(a) if a.ppid > 1 => cur = a.ppid,
            _ => break,
        }
    }
    Part::Other
}

/// CPU-seconds of each part over a window (a burst), and the window itself.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Split {
    /// The window's length, s.
    pub wall: f64,
    /// The machine's busy CPU-seconds (of `wall` × the CPUs).
    pub busy: f64,
    pub agent: f64,
    /// kube-apiserver, etcd, controller-manager and scheduler.
    pub control_plane: f64,
    /// containerd, its shims and runc (CNI plugins are containerd's children).
    pub runtime: f64,
    /// The pods' own processes (pause and the containers).
    pub pods: f64,
    /// The bench itself (its watch, its requests; the CRI calls of the floor).
    pub bench: f64,
}

impl Split {
    /// The CPU of each part from `before` to `after`; `agent` is the agent's pid (none
    /// for the runtime's floor).
    pub fn between(before: &Snapshot, after: &Snapshot, agent: Option<i32>) -> Self {
        let bench = i32::try_from(std::process::id()).unwrap_or(-1);
        let tick = 1.0 / procfs::clock_ticks_per_sec() as f64;
        let mut s = Self {
            wall: after.at.saturating_sub(before.at) as f64 / 1e9,
            busy: after.busy.saturating_sub(before.busy) as f64 * tick,
            ..Self::default()
        };
        for (pid, p) in &after.procs {
            let was = before.procs.get(pid).filter(|b| b.start == p.start).map_or(0, |b| b.ticks);
            let secs = p.ticks.saturating_sub(was) as f64 * tick;
            match part_of(&after.procs, *pid, agent, bench) {
                Part::Agent => s.agent += secs,
                Part::ControlPlane => s.control_plane += secs,
                Part::Runtime => s.runtime += secs,
                Part::Pods => s.pods += secs,
                Part::Bench => s.bench += secs,
                Part::Other => {}
            }
        }
        s
    }

    /// The busy CPU no part above accounts for (kernel threads, interrupts, the rest).
    pub fn other(&self) -> f64 {
        (self.busy - self.agent - self.control_plane - self.runtime - self.pods - self.bench).max(0.0)
    }

    /// The mean of several windows (rounds); `None` for none.
    pub fn mean(splits: &[Self]) -> Option<Self> {
        let n = splits.len() as f64;
        (n > 0.0).then(|| {
            let sum = |f: fn(&Self) -> f64| splits.iter().map(f).sum::<f64>() / n;
            Self {
                wall: sum(|s| s.wall),
                busy: sum(|s| s.busy),
                agent: sum(|s| s.agent),
                control_plane: sum(|s| s.control_plane),
                runtime: sum(|s| s.runtime),
                pods: sum(|s| s.pods),
                bench: sum(|s| s.bench),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: i32, comm: &str, parent: i32, own: u64, waited: u64, start: u64) -> String {
        format!(
            "{pid} ({comm}) S {parent} 1 1 0 -1 4194560 0 0 0 0 {own} 5 {waited} 1 20 0 1 0 {start} 100 10 \
             18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0"
        )
    }

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parentheses() {
        let p = parse_stat(&stat(42, "a (b) c", 7, 100, 30, 999)).unwrap();
        assert_eq!(p, Proc { comm: "a (b) c".into(), ppid: 7, start: 999, ticks: 100 + 5 + 30 + 1 });
        assert_eq!(parse_stat("42 (x) S 7"), None);
    }

    fn snapshot(procs: &[(i32, &str, i32, u64, u64)], busy: u64, at_s: u64) -> Snapshot {
        Snapshot {
            procs: procs
                .iter()
                .map(|&(pid, comm, ppid, ticks, start)| (pid, Proc { comm: comm.into(), ppid, start, ticks }))
                .collect(),
            busy,
            at: at_s * 1_000_000_000,
        }
    }

    #[test]
    fn each_process_counts_for_whom_it_works() {
        let hz = procfs::clock_ticks_per_sec();
        let bench = i32::try_from(std::process::id()).unwrap();
        let before = snapshot(
            &[
                (100, "swiftlet", 1, 10 * hz, 5),
                (200, "kube-apiserver", 1, 50 * hz, 5),
                (300, "containerd", 1, 20 * hz, 5),
                // Gone by the end: its CPU is not seen.
                (400, "kworker/0:1", 2, 3 * hz, 5),
                // Its pid is another process's at the end.
                (500, "mount", 100, hz, 5),
            ],
            1000 * hz,
            10,
        );
        let after = snapshot(
            &[
                (100, "swiftlet", 1, 12 * hz, 5),
                // The bench brought the test bed up: its processes are the bench's children.
                (200, "kube-apiserver", bench, 53 * hz, 5),
                (201, "etcd", bench, hz, 6),
                (300, "containerd", bench, 24 * hz, 5),
                (600, "containerd-shim", 1, 2 * hz, 7),
                (601, "pause", 600, hz, 8),
                (602, "sh", 600, hz, 8),
                (603, "sleep", 602, hz, 9),
                (500, "iptables", 100, hz, 50),
                (bench, "xtask", 1, hz, 3),
                (700, "sshd", 1, hz, 2),
            ],
            1020 * hz,
            20,
        );
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} != {b}");
        let s = Split::between(&before, &after, Some(100));
        close(s.wall, 10.0);
        close(s.busy, 20.0);
        // Its own 2 s and its new child's 1 s.
        close(s.agent, 3.0);
        close(s.control_plane, 4.0);
        close(s.runtime, 6.0);
        close(s.pods, 3.0);
        close(s.bench, 1.0);
        close(s.other(), 3.0);
        // The floor has no agent: its pid is nobody's.
        let floor = Split::between(&before, &after, None);
        close(floor.agent, 0.0);
        close(Split::mean(&[s, floor]).unwrap().agent, 1.5);
        assert_eq!(Split::mean(&[]), None);
    }
}
