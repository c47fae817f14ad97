//! Node-wide numbers from procfs: `/proc/stat` (CPU, boot time), `/proc/meminfo`
//! (capacity, swap, the memory fallback), `/proc/<pid>/net/dev` (interfaces of a network
//! namespace), `/proc/loadavg` and `/proc/sys/kernel/{pid_max,threads-max}` (rlimit),
//! `/proc/pressure/*` (node PSI). The procfs root is injectable for tests.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::cgroup::{NANOS_PER_USER_HZ_TICK, parse_u64, read_into};

/// Interface name prefixes cAdvisor leaves out of network stats (`lo`, host-side veths,
/// docker and nerdctl bridges).
pub const IGNORED_INTERFACE_PREFIXES: [&str; 4] = ["lo", "veth", "docker", "nerdctl"];

/// The kubelet's default interface name (`defaultNetworkInterfaceName`), whose counters
/// are also inlined at the top of [`super::summary::NetworkStats`].
pub const DEFAULT_INTERFACE: &str = "eth0";

/// The node's CPU time and boot time from `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStat {
    /// Busy CPU time of all CPUs (user + nice + system + irq + softirq + steal), ns.
    pub busy_ns: Option<u64>,
    /// User time (user + nice), ns.
    pub user_ns: Option<u64>,
    /// System time (system + irq + softirq), ns.
    pub system_ns: Option<u64>,
    /// Boot time (`btime`).
    pub boot_time: Option<SystemTime>,
}

/// Parses `/proc/stat`.
#[must_use]
pub fn parse_stat(text: &str) -> ProcStat {
    let mut out = ProcStat::default();
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        match fields.next() {
            Some("cpu") => {
                let v: Vec<u64> = fields.map(|f| f.parse().unwrap_or(0)).collect();
                let at = |i: usize| v.get(i).copied().unwrap_or(0);
                if v.len() >= 4 {
                    let ns = |ticks: u64| ticks.saturating_mul(NANOS_PER_USER_HZ_TICK);
                    out.user_ns = Some(ns(at(0) + at(1)));
                    out.system_ns = Some(ns(at(2) + at(5) + at(6)));
                    out.busy_ns = Some(ns(at(0) + at(1) + at(2) + at(5) + at(6) + at(7)));
                }
            }
            Some("btime") => {
                out.boot_time = fields.next().and_then(|s| s.parse().ok()).map(|s| UNIX_EPOCH + Duration::from_secs(s));
            }
            _ => {}
        }
    }
    out
}

/// The `/proc/meminfo` fields used, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`: the machine's memory capacity.
    pub total: Option<u64>,
    /// `MemFree`.
    pub free: Option<u64>,
    /// `Inactive(file)`.
    pub inactive_file: Option<u64>,
    /// `AnonPages`.
    pub anon: Option<u64>,
    /// `SwapTotal`.
    pub swap_total: Option<u64>,
    /// `SwapFree`.
    pub swap_free: Option<u64>,
}

/// Parses `/proc/meminfo` (values in kB).
#[must_use]
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut out = MemInfo::default();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else { continue };
        let slot = match key {
            "MemTotal" => &mut out.total,
            "MemFree" => &mut out.free,
            "Inactive(file)" => &mut out.inactive_file,
            "AnonPages" => &mut out.anon,
            "SwapTotal" => &mut out.swap_total,
            "SwapFree" => &mut out.swap_free,
            _ => continue,
        };
        *slot = rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|kb| kb.saturating_mul(1024));
    }
    out
}

/// Counters of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Name.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Sent packets dropped.
    pub tx_dropped: u64,
}

/// Parses `/proc/<pid>/net/dev`, in file order, without the ignored interfaces.
#[must_use]
pub fn parse_net_dev(text: &str) -> Vec<Interface> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let name = name.trim();
            if IGNORED_INTERFACE_PREFIXES.iter().any(|p| name.starts_with(p)) {
                return None;
            }
            let v: Vec<u64> = rest.split_ascii_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
            if v.len() < 12 {
                return None;
            }
            Some(Interface {
                name: name.to_owned(),
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
                tx_dropped: v[11],
            })
        })
        .collect()
}

/// The number of tasks from `/proc/loadavg` (`running/total`: the total).
#[must_use]
pub fn parse_loadavg_tasks(text: &str) -> Option<i64> {
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.1.parse().ok()
}

/// Reads procfs files under one root with a shared buffer.
#[derive(Debug)]
pub struct Procfs<'a> {
    root: &'a Path,
    buf: &'a mut String,
}

impl<'a> Procfs<'a> {
    /// A reader of `root` (normally `/proc`) using `buf` as scratch space.
    pub fn new(root: &'a Path, buf: &'a mut String) -> Self {
        Self { root, buf }
    }

    /// `/proc/stat`.
    pub fn stat(&mut self) -> Option<ProcStat> {
        read_into(self.buf, &self.root.join("stat")).map(parse_stat)
    }

    /// `/proc/meminfo`.
    pub fn meminfo(&mut self) -> Option<MemInfo> {
        read_into(self.buf, &self.root.join("meminfo")).map(parse_meminfo)
    }

    /// The interfaces of `pid`'s network namespace (`/proc/<pid>/net/dev`), or of the
    /// procfs reader's own namespace (`/proc/net/dev`) for `None`.
    pub fn net_dev(&mut self, pid: Option<u32>) -> Option<Vec<Interface>> {
        let path = match pid {
            Some(pid) => self.root.join(pid.to_string()).join("net/dev"),
            None => self.root.join("net/dev"),
        };
        read_into(self.buf, &path).map(parse_net_dev)
    }

    /// The task ceiling: the smaller of `kernel.pid_max` and `kernel.threads-max`
    /// (upstream `pidlimit.Stats`).
    pub fn max_pid(&mut self) -> Option<i64> {
        ["sys/kernel/pid_max", "sys/kernel/threads-max"]
            .iter()
            .filter_map(|f| read_into(self.buf, &self.root.join(f)).and_then(parse_u64))
            .map(|v| v as i64)
            .min()
    }

    /// The number of tasks (`/proc/loadavg`).
    pub fn tasks(&mut self) -> Option<i64> {
        read_into(self.buf, &self.root.join("loadavg")).and_then(parse_loadavg_tasks)
    }

    /// `/proc/pressure/<resource>`.
    pub fn pressure(&mut self, resource: &str) -> Option<super::cgroup::Pressure> {
        read_into(self.buf, &self.root.join("pressure").join(resource)).and_then(super::cgroup::parse_pressure)
    }
}
