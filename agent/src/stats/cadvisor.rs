//! `/metrics/cadvisor`: the container and machine metrics the kubelet serves from its
//! embedded cAdvisor (`google/cadvisor` `metrics/prometheus.go` with the kubelet's label
//! function `containerPrometheusLabelsFunc`), rendered from a [`Collection`] as
//! Prometheus text exposition 0.0.4.
//!
//! # What upstream does, and what is kept
//! - Every `container_*` family carries `container, id, image, name, namespace, pod`
//!   (plus `cpu`, `interface`, `failure_type`/`scope`, `state`, `ulimit` where cAdvisor
//!   adds them): `id` is the cgroup path, `name` the runtime id, `image` the image
//!   reference, `container` the container name; a pod cgroup row has `pod`/`namespace`
//!   of its pod (the kubelet's "associate pod cgroup with pod") and empty `container`,
//!   `image`, `name`; the node's root cgroup row has `id="/"` and all other labels empty.
//! - `container_*` samples carry the stats' time as a millisecond timestamp, as
//!   cAdvisor's `NewMetricWithTimestamp`; the spec families (`container_spec_*`,
//!   `container_start_time_seconds`) and the scrape-error and `machine_*` families carry
//!   none. `container_last_seen` is the collection time in whole seconds.
//! - `container_cpu_usage_seconds_total` has `cpu="total"` (cAdvisor without per-CPU
//!   usage); `container_memory_failures_total` has `failure_type` `pgfault`/`pgmajfault`
//!   and `scope` `container`/`hierarchy`.
//! - The spec families as cAdvisor's `container/common` `GetSpec` reads them (see
//!   [`super::cgroup::CgroupSpec`]): `container_spec_cpu_period` and
//!   `container_spec_cpu_shares` on every row whose cgroup has a cpu controller directory
//!   (cAdvisor's `HasCpu`; v1 `cpu.cfs_period_us` and `cpu.shares`, v2 the period of
//!   `cpu.max` and `cpu.weight` converted back to shares with cAdvisor's formula, so
//!   1024 shares that runc wrote as weight 39 read 998; the v2 root has neither file and
//!   reads 0 and 0, as upstream); `container_spec_memory_reservation_limit_bytes` beside
//!   the other memory spec families (v1 `memory.soft_limit_in_bytes`, v2 `memory.min`;
//!   unlimited as 0, as cAdvisor's `specMemoryValue`).
//! - `container_threads_max` is `pids.max` with `max` as 0 (runc's "no limit", the
//!   "infinity if value is zero" of its help), 0 where the cgroup has none (the root).
//! - `container_file_descriptors` and `container_sockets` count the descriptors of the
//!   cgroup's own processes ([`super::processes`]) on every row whose processes could be
//!   listed, as cAdvisor's process stats: the root row counts the processes left in the
//!   root cgroup, a pod cgroup (which has no process of its own) 0.
//!   `container_ulimits_soft{ulimit="max_open_files"}` (cAdvisor's only exported limit;
//!   -1 for unlimited) is the root process's: pid 1 for the root row, a container's
//!   process for its row, none for pods (cAdvisor's raw handler has no pid for them).
//! - `container_cpu_load_average_10s` and `container_tasks_state` (one sample per `state`:
//!   [`TASK_STATES`]) are 0 on every row: cAdvisor fills them only from its netlink load
//!   reader, which it starts only with `--enable_load_reader` (off by default, and the
//!   kubelet does not set it), so the kubelet serves zeros; they are served the same, so
//!   that the series dashboards query exist.
//! - `machine_*` families carry `boot_id, machine_id, system_uuid` from
//!   `/proc/sys/kernel/random/boot_id`, `/etc/machine-id` and
//!   `/sys/class/dmi/id/product_uuid` (empty when unreadable).
//! - Filesystem families (`container_fs_*`, label `device`), as cAdvisor with the kubelet's
//!   containerd handler fills them (its `GetSpec` says `HasFilesystem: false` for
//!   containerd containers, so no container or pod has usage rows):
//!   - the root row `id="/"` has one row per cAdvisor partition (see
//!     [`super::mounts::partitions`]; taken from the mount table once, as cAdvisor does at
//!     start): `container_fs_limit_bytes` = capacity, `container_fs_usage_bytes` =
//!     capacity − free, `container_fs_inodes_total`/`_free` from `statvfs`, and every
//!     counter family from that device's `/proc/diskstats` row (0 without one, e.g.
//!     tmpfs). The `*_seconds_total` values are the kernel's milliseconds divided by 10^9,
//!     exactly as cAdvisor computes them (`float64(fs.ReadTime) / float64(time.Second)`),
//!     so they agree with upstream-fed dashboards rather than with their unit;
//!   - every cgroup row (root, pods, containers) whose block I/O controller has per-device
//!     counters also has `container_fs_reads_total`/`container_fs_writes_total` per device
//!     (cAdvisor's `DiskIo.IoServiced`; v1 `blkio.*io_serviced_recursive`, v2 `io.stat`
//!     `rios`/`wios`), the device named `/dev/<disk>` from `/sys/block` (the root row looks
//!     in its partitions first). On a clash with a filesystem row of the root the block
//!     I/O row is kept, as the Go registry keeps the first of two identical series.
//! - Every family in [`FAMILIES`] is announced with HELP/TYPE even without samples;
//!   families sorted by name, samples by label values, values as Go's `FormatFloat('g')`.
//!
//! # Deviations
//! - Only the root cgroup, pod cgroups and the running containers of the collection get
//!   rows; cAdvisor also reports the QoS-class cgroups (`burstable`, `besteffort`),
//!   system slices and the sandbox (pause) containers. Network families are on the pod
//!   rows (the pod's network namespace) and the root row (the host's), not repeated on
//!   each container.
//! - A container's `container_last_seen` is stamped with its stats' time and valued at
//!   the collection's start (cAdvisor: `time.Now()` at scrape time).
//! - `container_memory_failures_total` gives the same counter for both scopes (the
//!   collector reads one `pgfault`/`pgmajfault` per cgroup).
//! - The memory spec families are on every row with memory stats; cAdvisor leaves them
//!   out of the cgroup v2 root row, which has no `memory.max` (its `HasMemory`).
//! - Unlimited memory and swap limits are reported as `0` (cAdvisor reports the raw
//!   cgroup value, e.g. `1.8446744073709552e+19` for v2 `max`).
//! - `cadvisor_version_info` has empty `cadvisorRevision`, `cadvisorVersion` and
//!   `dockerVersion` (there is no cAdvisor); kernel and OS versions are the host's.
//! - A container's root process (the containerd task's pid upstream) is taken as the
//!   first process of its `cgroup.procs` (the inventory has no pid): its
//!   `container_ulimits_soft` is that process's limit, which the others inherit unless
//!   they change theirs.
//! - The v2 memory reservation is `memory.min`, as cAdvisor reads it now; earlier cAdvisor
//!   releases read `memory.high`, and which of the two the 1.28 kubelet's cAdvisor (v0.47)
//!   reads was not verified. Both read 0 for the kubelet's containers unless its
//!   `MemoryQoS` gate (alpha, off) sets them.
//! - The NVM machine families listed in [`NOT_RENDERED`] are left out (not even
//!   announced): there is no Intel NVM data. cAdvisor's other disk families
//!   (`container_fs_reads_bytes_total`, `container_fs_writes_bytes_total`,
//!   `container_blkio_device_usage_total`) are not in kubelet 1.28's reference capture and
//!   not rendered; neither are block I/O rows from the BFQ debug or CFQ statistics (sectors,
//!   merges, service and wait times, queue) that cAdvisor would add where a kernel has them.
//! - The partitions are those of the agent's mount table at its first collection (cAdvisor:
//!   when the kubelet starts); mounts made later (pod volumes, sandbox `shm`) get no row
//!   until the agent restarts, as upstream.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::cgroup::CgroupStats;
use super::collector::{Collection, FilesystemSample, NetworkSample};
use super::resource_metrics::{write_family_header, write_sample};
use crate::types::prom_text::{escape_label, write_go_float, write_i64};

pub use super::resource_metrics::{CONTENT_TYPE, Family};

/// The `state` values of `container_tasks_state`, as cAdvisor names them.
pub const TASK_STATES: [&str; 5] = ["sleeping", "running", "stopped", "uninterruptible", "iowaiting"];

const C: &[&str] = &["container", "id", "image", "name", "namespace", "pod"];
const C_CPU: &[&str] = &["container", "cpu", "id", "image", "name", "namespace", "pod"];
const C_DEV: &[&str] = &["container", "device", "id", "image", "name", "namespace", "pod"];
const C_NET: &[&str] = &["container", "id", "image", "interface", "name", "namespace", "pod"];
const C_FAIL: &[&str] = &["container", "failure_type", "id", "image", "name", "namespace", "pod", "scope"];
const C_STATE: &[&str] = &["container", "id", "image", "name", "namespace", "pod", "state"];
const C_ULIMIT: &[&str] = &["container", "id", "image", "name", "namespace", "pod", "ulimit"];
const MACHINE: &[&str] = &["boot_id", "machine_id", "system_uuid"];
const VERSION: &[&str] = &["cadvisorRevision", "cadvisorVersion", "dockerVersion", "kernelVersion", "osVersion"];

const fn fam(name: &'static str, kind: &'static str, labels: &'static [&'static str], help: &'static str) -> Family {
    Family { name, kind, help, labels }
}

/// Every family the endpoint renders, sorted by name (help texts and label sets of
/// kubelet 1.28's cAdvisor).
pub const FAMILIES: [Family; 58] = [
    fam(
        "cadvisor_version_info",
        "gauge",
        VERSION,
        "A metric with a constant '1' value labeled by kernel version, OS version, docker version, cadvisor version & cadvisor revision.",
    ),
    fam("container_cpu_load_average_10s", "gauge", C, "Value of container cpu load average over the last 10 seconds."),
    fam("container_cpu_system_seconds_total", "counter", C, "Cumulative system cpu time consumed in seconds."),
    fam("container_cpu_usage_seconds_total", "counter", C_CPU, "Cumulative cpu time consumed in seconds."),
    fam("container_cpu_user_seconds_total", "counter", C, "Cumulative user cpu time consumed in seconds."),
    fam("container_file_descriptors", "gauge", C, "Number of open file descriptors for the container."),
    fam("container_fs_inodes_free", "gauge", C_DEV, "Number of available Inodes"),
    fam("container_fs_inodes_total", "gauge", C_DEV, "Number of Inodes"),
    fam("container_fs_io_current", "gauge", C_DEV, "Number of I/Os currently in progress"),
    fam("container_fs_io_time_seconds_total", "counter", C_DEV, "Cumulative count of seconds spent doing I/Os"),
    fam("container_fs_io_time_weighted_seconds_total", "counter", C_DEV, "Cumulative weighted I/O time in seconds"),
    fam(
        "container_fs_limit_bytes",
        "gauge",
        C_DEV,
        "Number of bytes that can be consumed by the container on this filesystem.",
    ),
    fam("container_fs_read_seconds_total", "counter", C_DEV, "Cumulative count of seconds spent reading"),
    fam("container_fs_reads_merged_total", "counter", C_DEV, "Cumulative count of reads merged"),
    fam("container_fs_reads_total", "counter", C_DEV, "Cumulative count of reads completed"),
    fam("container_fs_sector_reads_total", "counter", C_DEV, "Cumulative count of sector reads completed"),
    fam("container_fs_sector_writes_total", "counter", C_DEV, "Cumulative count of sector writes completed"),
    fam(
        "container_fs_usage_bytes",
        "gauge",
        C_DEV,
        "Number of bytes that are consumed by the container on this filesystem.",
    ),
    fam("container_fs_write_seconds_total", "counter", C_DEV, "Cumulative count of seconds spent writing"),
    fam("container_fs_writes_merged_total", "counter", C_DEV, "Cumulative count of writes merged"),
    fam("container_fs_writes_total", "counter", C_DEV, "Cumulative count of writes completed"),
    fam("container_last_seen", "gauge", C, "Last time a container was seen by the exporter"),
    fam("container_memory_cache", "gauge", C, "Number of bytes of page cache memory."),
    fam("container_memory_failcnt", "counter", C, "Number of memory usage hits limits"),
    fam("container_memory_failures_total", "counter", C_FAIL, "Cumulative count of memory allocation failures."),
    fam("container_memory_mapped_file", "gauge", C, "Size of memory mapped files in bytes."),
    fam("container_memory_max_usage_bytes", "gauge", C, "Maximum memory usage recorded in bytes"),
    fam("container_memory_rss", "gauge", C, "Size of RSS in bytes."),
    fam("container_memory_swap", "gauge", C, "Container swap usage in bytes."),
    fam(
        "container_memory_usage_bytes",
        "gauge",
        C,
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
    ),
    fam("container_memory_working_set_bytes", "gauge", C, "Current working set in bytes."),
    fam("container_network_receive_bytes_total", "counter", C_NET, "Cumulative count of bytes received"),
    fam(
        "container_network_receive_errors_total",
        "counter",
        C_NET,
        "Cumulative count of errors encountered while receiving",
    ),
    fam(
        "container_network_receive_packets_dropped_total",
        "counter",
        C_NET,
        "Cumulative count of packets dropped while receiving",
    ),
    fam("container_network_receive_packets_total", "counter", C_NET, "Cumulative count of packets received"),
    fam("container_network_transmit_bytes_total", "counter", C_NET, "Cumulative count of bytes transmitted"),
    fam(
        "container_network_transmit_errors_total",
        "counter",
        C_NET,
        "Cumulative count of errors encountered while transmitting",
    ),
    fam(
        "container_network_transmit_packets_dropped_total",
        "counter",
        C_NET,
        "Cumulative count of packets dropped while transmitting",
    ),
    fam("container_network_transmit_packets_total", "counter", C_NET, "Cumulative count of packets transmitted"),
    fam("container_oom_events_total", "counter", C, "Count of out of memory events observed for the container"),
    fam("container_processes", "gauge", C, "Number of processes running inside the container."),
    fam("container_scrape_error", "gauge", &[], "1 if there was an error while getting container metrics, 0 otherwise"),
    fam("container_sockets", "gauge", C, "Number of open sockets for the container."),
    fam("container_spec_cpu_period", "gauge", C, "CPU period of the container."),
    fam("container_spec_cpu_shares", "gauge", C, "CPU share of the container."),
    fam("container_spec_memory_limit_bytes", "gauge", C, "Memory limit for the container."),
    fam("container_spec_memory_reservation_limit_bytes", "gauge", C, "Memory reservation limit for the container."),
    fam("container_spec_memory_swap_limit_bytes", "gauge", C, "Memory swap limit for the container."),
    fam("container_start_time_seconds", "gauge", C, "Start time of the container since unix epoch in seconds."),
    fam("container_tasks_state", "gauge", C_STATE, "Number of tasks in given state"),
    fam("container_threads", "gauge", C, "Number of threads running inside the container"),
    fam(
        "container_threads_max",
        "gauge",
        C,
        "Maximum number of threads allowed inside the container, infinity if value is zero",
    ),
    fam(
        "container_ulimits_soft",
        "gauge",
        C_ULIMIT,
        "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
    ),
    fam("machine_cpu_cores", "gauge", MACHINE, "Number of logical CPU cores."),
    fam("machine_cpu_physical_cores", "gauge", MACHINE, "Number of physical CPU cores."),
    fam("machine_cpu_sockets", "gauge", MACHINE, "Number of CPU sockets."),
    fam("machine_memory_bytes", "gauge", MACHINE, "Amount of memory installed on the machine."),
    fam("machine_scrape_error", "gauge", &[], "1 if there was an error while getting machine metrics, 0 otherwise."),
];

/// Families of kubelet 1.28's `/metrics/cadvisor` that are not rendered, with the reason.
pub const NOT_RENDERED: [(&str, &str); 2] = [
    ("machine_nvm_avg_power_budget_watts", "Intel NVM (ipmctl) only; no such data"),
    ("machine_nvm_capacity", "Intel NVM (ipmctl) only; no such data"),
];

/// Host facts for the `machine_*` and version families.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineInfo {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `/sys/class/dmi/id/product_uuid`.
    pub system_uuid: String,
    /// Logical CPUs (`processor` lines of `/proc/cpuinfo`).
    pub cpu_cores: Option<u64>,
    /// Distinct `(physical id, core id)` pairs of `/proc/cpuinfo`.
    pub cpu_physical_cores: Option<u64>,
    /// Distinct `physical id`s of `/proc/cpuinfo`.
    pub cpu_sockets: Option<u64>,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_version: String,
}

fn read_trimmed(path: &Path) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// Counts of `/proc/cpuinfo`: logical CPUs, physical cores, sockets.
#[must_use]
pub fn parse_cpuinfo(text: &str) -> (Option<u64>, Option<u64>, Option<u64>) {
    let mut logical = 0u64;
    let mut sockets = std::collections::BTreeSet::new();
    let mut cores = std::collections::BTreeSet::new();
    let mut physical = String::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => logical += 1,
            "physical id" => {
                value.clone_into(&mut physical);
                sockets.insert(value.to_owned());
            }
            "core id" => {
                cores.insert((physical.clone(), value.to_owned()));
            }
            _ => {}
        }
    }
    let nonzero = |n: u64| (n > 0).then_some(n);
    (nonzero(logical), nonzero(cores.len() as u64), nonzero(sockets.len() as u64))
}

impl MachineInfo {
    /// Reads the facts from the host (empty strings and `None` when unreadable).
    #[must_use]
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let (mut cpu_cores, cpu_physical_cores, cpu_sockets) = parse_cpuinfo(&cpuinfo);
        if cpu_cores.is_none() {
            cpu_cores = std::thread::available_parallelism().ok().map(|n| n.get() as u64);
        }
        let os_version = std::fs::read_to_string("/etc/os-release")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_default();
        Self {
            boot_id: read_trimmed(Path::new("/proc/sys/kernel/random/boot_id")),
            machine_id: read_trimmed(Path::new("/etc/machine-id")),
            system_uuid: read_trimmed(Path::new("/sys/class/dmi/id/product_uuid")),
            cpu_cores,
            cpu_physical_cores,
            cpu_sockets,
            kernel_version: read_trimmed(Path::new("/proc/sys/kernel/osrelease")),
            os_version,
        }
    }
}

fn millis(t: SystemTime) -> Option<i64> {
    t.duration_since(UNIX_EPOCH).ok().and_then(|d| i64::try_from(d.as_millis()).ok())
}

fn seconds_f64(t: SystemTime) -> Option<f64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs_f64())
}

/// The identity labels of a cgroup row, in this order (sorted, as in [`C`]).
const ROW_LABELS: [&str; 6] = ["container", "id", "image", "name", "namespace", "pod"];

/// The identity labels of one cgroup row: their values (the sort key) and, written once
/// for all the row's samples, `container="…",id="…",…,pod="…"` with each pair's span.
struct Row<'a> {
    values: [&'a str; 6],
    text: String,
    spans: [(u32, u32); 6],
    /// `groups[k]`: the index of the first row whose first `k + 1` values are this row's.
    /// Rows are sorted by their values, so comparing these compares those values.
    groups: [u32; 6],
}

impl<'a> Row<'a> {
    /// Row `index` of `[container, id, image, name, namespace, pod]`, sorted after
    /// `previous`.
    fn new(index: u32, values: [&'a str; 6], previous: Option<&Self>) -> Self {
        let mut groups = [index; 6];
        if let Some(p) = previous {
            let common = p.values.iter().zip(&values).take_while(|(a, b)| a == b).count();
            groups[..common].copy_from_slice(&p.groups[..common]);
        }
        let mut text = String::with_capacity(64 + values.iter().map(|v| v.len()).sum::<usize>());
        let mut spans = [(0, 0); 6];
        for (i, (name, value)) in ROW_LABELS.iter().zip(values).enumerate() {
            if i > 0 {
                text.push(',');
            }
            let start = text.len() as u32;
            text.push_str(name);
            text.push_str("=\"");
            escape_label(&mut text, value);
            text.push('"');
            spans[i] = (start, text.len() as u32);
        }
        Self { values, text, spans, groups }
    }

    /// The written pairs of row labels `from..to`.
    fn pairs(&self, from: usize, to: usize) -> &str {
        &self.text[self.spans[from].0 as usize..self.spans[to - 1].1 as usize]
    }
}

/// How a family's labels are made: runs of a row's identity labels, and up to two
/// labels of the sample's own (`cpu`, `device`, `interface`, `failure_type`, `scope`).
#[derive(Debug, Clone, Copy)]
enum Part {
    Row { from: usize, to: usize },
    Extra { slot: usize, name: &'static str },
}

/// The parts of a family with row labels, in label order; `None` for the families
/// without (`machine_*`, `cadvisor_version_info`, the scrape errors).
fn plan(family: &Family) -> Option<Vec<Part>> {
    if !family.labels.contains(&"id") {
        return None;
    }
    let mut parts: Vec<Part> = Vec::new();
    let mut slot = 0;
    for name in family.labels {
        if let Some(i) = ROW_LABELS.iter().position(|l| l == name) {
            match parts.last_mut() {
                Some(Part::Row { to, .. }) if *to == i => *to = i + 1,
                _ => parts.push(Part::Row { from: i, to: i + 1 }),
            }
        } else {
            parts.push(Part::Extra { slot, name });
            slot += 1;
        }
    }
    debug_assert!(slot <= 2, "{}: at most two labels besides the row's", family.name);
    Some(parts)
}

/// The index of a family in [`FAMILIES`], at compile time.
const fn family_index(name: &str) -> usize {
    let mut i = 0;
    while i < FAMILIES.len() {
        let (a, b) = (FAMILIES[i].name.as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut k = 0;
            while k < a.len() && a[k] == b[k] {
                k += 1;
            }
            if k == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not in FAMILIES");
}

/// `family!("name")`: the family's index, checked at compile time.
macro_rules! family {
    ($name:literal) => {
        const { family_index($name) }
    };
}

/// A sample of a family with row labels.
#[derive(Debug, Clone, Copy)]
struct Sample<'a> {
    row: u32,
    extra: [&'a str; 2],
    value: f64,
    timestamp_ms: Option<i64>,
}

/// A sample of a family without row labels.
struct PlainSample {
    labels: Vec<(&'static str, String)>,
    value: f64,
}

struct Out<'a> {
    rows: Vec<Row<'a>>,
    /// By family, samples with row labels.
    samples: Vec<Vec<Sample<'a>>>,
    /// By family, samples without.
    plain: Vec<Vec<PlainSample>>,
}

impl<'a> Out<'a> {
    fn push(&mut self, family: usize, row: u32, extra: [&'a str; 2], value: f64, timestamp_ms: Option<i64>) {
        self.samples[family].push(Sample { row, extra, value, timestamp_ms });
    }

    fn push_plain(&mut self, family: usize, labels: Vec<(&'static str, String)>, value: f64) {
        self.plain[family].push(PlainSample { labels, value });
    }

    fn row(&mut self, row: u32, stats: &CgroupStats, start: Option<SystemTime>, seen: SystemTime) {
        let ts = millis(stats.time);
        let none = [""; 2];
        if let Some(cpu) = &stats.cpu {
            let secs = |ns: u64| ns as f64 / 1e9;
            self.push(family!("container_cpu_usage_seconds_total"), row, ["total", ""], secs(cpu.total_ns), ts);
            if let Some(u) = cpu.user_ns {
                self.push(family!("container_cpu_user_seconds_total"), row, none, secs(u), ts);
            }
            if let Some(s) = cpu.system_ns {
                self.push(family!("container_cpu_system_seconds_total"), row, none, secs(s), ts);
            }
        }
        if let Some(m) = &stats.memory {
            self.push(family!("container_memory_usage_bytes"), row, none, m.usage as f64, ts);
            let optional = [
                (family!("container_memory_working_set_bytes"), m.working_set),
                (family!("container_memory_rss"), m.rss),
                (family!("container_memory_cache"), m.cache),
                (family!("container_memory_mapped_file"), m.mapped_file),
                (family!("container_memory_max_usage_bytes"), m.max_usage),
                (family!("container_memory_failcnt"), m.failcnt),
                (family!("container_memory_swap"), m.swap),
                (family!("container_oom_events_total"), m.oom_kills),
            ];
            for (family, value) in optional {
                if let Some(v) = value {
                    self.push(family, row, none, v as f64, ts);
                }
            }
            for (kind, value) in [("pgfault", m.pgfault), ("pgmajfault", m.pgmajfault)] {
                let Some(v) = value else { continue };
                for scope in ["container", "hierarchy"] {
                    self.push(family!("container_memory_failures_total"), row, [kind, scope], v as f64, ts);
                }
            }
            let limit = m.limit.unwrap_or(0) as f64;
            self.push(family!("container_spec_memory_limit_bytes"), row, none, limit, None);
            let swap_limit = m.swap_limit.unwrap_or(0) as f64;
            self.push(family!("container_spec_memory_swap_limit_bytes"), row, none, swap_limit, None);
            if let Some(spec) = &stats.spec {
                let reservation = spec.memory_reservation.unwrap_or(0) as f64;
                self.push(family!("container_spec_memory_reservation_limit_bytes"), row, none, reservation, None);
            }
        }
        if let Some(spec) = &stats.spec {
            if let Some(cpu) = spec.cpu {
                self.push(family!("container_spec_cpu_period"), row, none, cpu.period as f64, None);
                self.push(family!("container_spec_cpu_shares"), row, none, cpu.shares as f64, None);
            }
            let threads_max = spec.threads_max.unwrap_or(0) as f64;
            self.push(family!("container_threads_max"), row, none, threads_max, ts);
        }
        if let Some(p) = &stats.process_stats {
            self.push(family!("container_file_descriptors"), row, none, p.fds as f64, ts);
            self.push(family!("container_sockets"), row, none, p.sockets as f64, ts);
            if let Some(soft) = p.max_open_files {
                self.push(family!("container_ulimits_soft"), row, ["max_open_files", ""], soft as f64, ts);
            }
        }
        // The kubelet's cAdvisor has no load reader (`--enable_load_reader` is off): these
        // are always zero upstream, and served so that the series exist.
        self.push(family!("container_cpu_load_average_10s"), row, none, 0.0, ts);
        for state in TASK_STATES {
            self.push(family!("container_tasks_state"), row, [state, ""], 0.0, ts);
        }
        if let Some(p) = stats.processes {
            self.push(family!("container_processes"), row, none, p as f64, ts);
        }
        if let Some(t) = stats.tasks {
            self.push(family!("container_threads"), row, none, t as f64, ts);
        }
        if let Some(secs) = start.and_then(seconds_f64) {
            self.push(family!("container_start_time_seconds"), row, none, secs, None);
        }
        if let Some(secs) = seen.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs()) {
            self.push(family!("container_last_seen"), row, none, secs as f64, ts);
        }
    }

    /// Block I/O rows of a cgroup (cAdvisor's `DiskIo.IoServiced`): one per device.
    fn io(&mut self, row: u32, stats: &'a CgroupStats) {
        let ts = millis(stats.time);
        for d in &stats.io {
            let device = [d.device.as_str(), ""];
            self.push(family!("container_fs_reads_total"), row, device, d.reads as f64, ts);
            self.push(family!("container_fs_writes_total"), row, device, d.writes as f64, ts);
        }
    }

    /// The node's filesystem rows (cAdvisor's `Filesystem` stats of `/`): usage from
    /// `statvfs`, counters from `/proc/diskstats` (zero for a filesystem without a disk
    /// row). Times are the kernel's milliseconds divided by 10^9, as cAdvisor divides them.
    fn filesystems(&mut self, row: u32, filesystems: &'a [FilesystemSample], time: SystemTime) {
        let ts = millis(time);
        let ms = |v: u64| v as f64 / 1e9;
        for f in filesystems {
            let device = [f.device.as_str(), ""];
            let d = f.disk.unwrap_or_default();
            let values = [
                (family!("container_fs_inodes_free"), f.info.inodes_free as f64),
                (family!("container_fs_inodes_total"), f.info.inodes as f64),
                (family!("container_fs_limit_bytes"), f.info.capacity as f64),
                (family!("container_fs_usage_bytes"), f.info.usage as f64),
                (family!("container_fs_reads_total"), d.reads_completed as f64),
                (family!("container_fs_sector_reads_total"), d.sectors_read as f64),
                (family!("container_fs_reads_merged_total"), d.reads_merged as f64),
                (family!("container_fs_read_seconds_total"), ms(d.read_time_ms)),
                (family!("container_fs_writes_total"), d.writes_completed as f64),
                (family!("container_fs_sector_writes_total"), d.sectors_written as f64),
                (family!("container_fs_writes_merged_total"), d.writes_merged as f64),
                (family!("container_fs_write_seconds_total"), ms(d.write_time_ms)),
                (family!("container_fs_io_current"), d.io_in_progress as f64),
                (family!("container_fs_io_time_seconds_total"), ms(d.io_time_ms)),
                (family!("container_fs_io_time_weighted_seconds_total"), ms(d.weighted_io_time_ms)),
            ];
            for (family, v) in values {
                self.push(family, row, device, v, ts);
            }
        }
    }

    fn network(&mut self, row: u32, net: &'a NetworkSample) {
        let ts = millis(net.time);
        for i in &net.interfaces {
            let interface = [i.name.as_str(), ""];
            let values = [
                (family!("container_network_receive_bytes_total"), i.rx_bytes),
                (family!("container_network_receive_errors_total"), i.rx_errors),
                (family!("container_network_receive_packets_dropped_total"), i.rx_dropped),
                (family!("container_network_receive_packets_total"), i.rx_packets),
                (family!("container_network_transmit_bytes_total"), i.tx_bytes),
                (family!("container_network_transmit_errors_total"), i.tx_errors),
                (family!("container_network_transmit_packets_dropped_total"), i.tx_dropped),
                (family!("container_network_transmit_packets_total"), i.tx_packets),
            ];
            for (family, v) in values {
                self.push(family, row, interface, v as f64, ts);
            }
        }
    }
}

/// What one cgroup row reports.
struct RowSource<'a> {
    /// `[container, id, image, name, namespace, pod]`.
    labels: [&'a str; 6],
    stats: Option<&'a CgroupStats>,
    start: Option<SystemTime>,
    network: Option<&'a NetworkSample>,
    /// The node's partitions and their time (the root row only).
    filesystems: Option<(&'a [FilesystemSample], SystemTime)>,
}

/// Renders the endpoint from `collection`, reading the machine facts from the host.
#[must_use]
pub fn render(collection: &Collection) -> String {
    render_with(collection, &MachineInfo::read())
}

/// Renders the endpoint from `collection` and the given machine facts.
///
/// Each row's identity labels are escaped and written once; samples refer to their row,
/// so that sorting and writing allocate nothing per sample. Rows are visited in label
/// order, which leaves most families already sorted, and samples compare their rows by
/// rank (see `Row`) rather than by label values.
#[must_use]
pub fn render_with(collection: &Collection, machine: &MachineInfo) -> String {
    let seen = collection.time;
    let node = &collection.node;
    let mut sources = Vec::with_capacity(1 + collection.pods.iter().map(|p| 1 + p.containers.len()).sum::<usize>());
    sources.push(RowSource {
        labels: ["", "/", "", "", "", ""],
        stats: Some(&node.stats),
        start: node.boot_time,
        network: node.network.as_ref(),
        filesystems: Some((&node.filesystems, node.stats.time)),
    });
    for pod in &collection.pods {
        sources.push(RowSource {
            labels: ["", &pod.cgroup, "", "", &pod.namespace, &pod.name],
            stats: pod.stats.as_ref(),
            start: pod.start_time,
            network: pod.network.as_ref(),
            filesystems: None,
        });
        for c in &pod.containers {
            sources.push(RowSource {
                labels: [&c.name, &c.cgroup, &c.image, &c.id, &pod.namespace, &pod.name],
                stats: Some(&c.stats),
                start: c.start_time,
                network: None,
                filesystems: None,
            });
        }
    }
    // Stable: of two rows with the same labels, the first keeps its samples.
    sources.sort_by(|a, b| a.labels.cmp(&b.labels));

    let mut out = Out {
        rows: Vec::with_capacity(sources.len()),
        samples: FAMILIES.iter().map(|_| Vec::new()).collect(),
        plain: FAMILIES.iter().map(|_| Vec::new()).collect(),
    };
    for (i, source) in sources.iter().enumerate() {
        let row = i as u32;
        let labels = Row::new(row, source.labels, out.rows.last());
        out.rows.push(labels);
        if let Some(stats) = source.stats {
            out.row(row, stats, source.start, seen);
            // Block I/O rows first: on a device name clash the registry keeps the first.
            out.io(row, stats);
        }
        if let Some((filesystems, time)) = source.filesystems {
            out.filesystems(row, filesystems, time);
        }
        if let Some(net) = source.network {
            out.network(row, net);
        }
    }
    out.push_plain(family!("container_scrape_error"), Vec::new(), 0.0);
    let version = vec![
        ("cadvisorRevision", String::new()),
        ("cadvisorVersion", String::new()),
        ("dockerVersion", String::new()),
        ("kernelVersion", machine.kernel_version.clone()),
        ("osVersion", machine.os_version.clone()),
    ];
    out.push_plain(family!("cadvisor_version_info"), version, 1.0);
    let ids = vec![
        ("boot_id", machine.boot_id.clone()),
        ("machine_id", machine.machine_id.clone()),
        ("system_uuid", machine.system_uuid.clone()),
    ];
    let machine_values = [
        (family!("machine_cpu_cores"), machine.cpu_cores),
        (family!("machine_cpu_physical_cores"), machine.cpu_physical_cores),
        (family!("machine_cpu_sockets"), machine.cpu_sockets),
        (family!("machine_memory_bytes"), node.memory_capacity),
    ];
    for (family, value) in machine_values {
        if let Some(v) = value {
            out.push_plain(family, ids.clone(), v as f64);
        }
    }
    out.push_plain(family!("machine_scrape_error"), Vec::new(), 0.0);

    write_text(out)
}

/// The order of two samples of a family by their label values, in label order. A row
/// part compares the rows' groups: the parts before it were equal, so the rows' values
/// before it are.
fn compare(parts: &[Part], rows: &[Row<'_>], a: &Sample<'_>, b: &Sample<'_>) -> std::cmp::Ordering {
    let (ga, gb) = (&rows[a.row as usize].groups, &rows[b.row as usize].groups);
    for part in parts {
        let order = match *part {
            Part::Row { to, .. } => ga[to - 1].cmp(&gb[to - 1]),
            Part::Extra { slot, .. } => a.extra[slot].cmp(b.extra[slot]),
        };
        if order.is_ne() {
            return order;
        }
    }
    std::cmp::Ordering::Equal
}

fn write_text(mut out: Out<'_>) -> String {
    let mut order: Vec<usize> = (0..FAMILIES.len()).collect();
    order.sort_by_key(|&i| FAMILIES[i].name);
    let plans: Vec<Option<Vec<Part>>> = FAMILIES.iter().map(plan).collect();
    let rows = &out.rows;
    // About the text's length (more unless label values need escaping), so that writing
    // does not reallocate.
    let mut capacity = 4096;
    for (family, samples) in FAMILIES.iter().zip(&out.samples) {
        capacity += family.help.len() + 2 * family.name.len() + 32;
        for s in samples {
            capacity += family.name.len() + rows[s.row as usize].text.len() + s.extra[0].len() + s.extra[1].len() + 80;
        }
    }
    let mut text = String::with_capacity(capacity);
    for i in order {
        let family = &FAMILIES[i];
        write_family_header(&mut text, family.name, family.help, family.kind);
        if let Some(parts) = &plans[i] {
            let samples = &mut out.samples[i];
            samples.sort_by(|a, b| compare(parts, rows, a, b));
            samples.dedup_by(|later, earlier| compare(parts, rows, later, earlier).is_eq());
            for s in samples.iter() {
                write_row_sample(&mut text, family.name, parts, &rows[s.row as usize], s);
            }
        } else {
            let samples = &mut out.plain[i];
            samples.sort_by(|a, b| a.labels.cmp(&b.labels));
            samples.dedup_by(|later, earlier| later.labels == earlier.labels);
            for s in samples.iter() {
                let labels = s.labels.iter().map(|(name, value)| (*name, value.as_str()));
                write_sample(&mut text, family.name, labels, s.value, None);
            }
        }
    }
    text
}

/// `name{labels} value [timestamp]` of a sample with row labels.
fn write_row_sample(text: &mut String, name: &str, parts: &[Part], row: &Row<'_>, s: &Sample<'_>) {
    text.push_str(name);
    text.push('{');
    for (k, part) in parts.iter().enumerate() {
        if k > 0 {
            text.push(',');
        }
        match *part {
            Part::Row { from, to } => text.push_str(row.pairs(from, to)),
            Part::Extra { slot, name } => {
                text.push_str(name);
                text.push_str("=\"");
                escape_label(text, s.extra[slot]);
                text.push('"');
            }
        }
    }
    text.push_str("} ");
    write_go_float(text, s.value);
    if let Some(ts) = s.timestamp_ms {
        text.push(' ');
        write_i64(text, ts);
    }
    text.push('\n');
}
