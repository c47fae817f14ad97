//! `/metrics/cadvisor`: the container and machine metrics the kubelet serves from its
//! embedded cAdvisor (`google/cadvisor` `metrics/prometheus.go` with the kubelet's label
//! function `containerPrometheusLabelsFunc`), rendered from a [`Collection`] as
//! Prometheus text exposition 0.0.4.
//!
//! # What upstream does, and what is kept
//! - Every `container_*` family carries `container, id, image, name, namespace, pod`
//!   (plus `cpu`, `interface`, `failure_type`/`scope` where cAdvisor adds them): `id` is
//!   the cgroup path, `name` the runtime id, `image` the image reference, `container` the
//!   container name; a pod cgroup row has `pod`/`namespace` of its pod (the kubelet's
//!   "associate pod cgroup with pod") and empty `container`, `image`, `name`; the node's
//!   root cgroup row has `id="/"` and all other labels empty.
//! - `container_*` samples carry the stats' time as a millisecond timestamp, as
//!   cAdvisor's `NewMetricWithTimestamp`; the spec families (`container_spec_*`,
//!   `container_start_time_seconds`) and the scrape-error and `machine_*` families carry
//!   none. `container_last_seen` is the collection time in whole seconds.
//! - `container_cpu_usage_seconds_total` has `cpu="total"` (cAdvisor without per-CPU
//!   usage); `container_memory_failures_total` has `failure_type` `pgfault`/`pgmajfault`
//!   and `scope` `container`/`hierarchy`.
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
//! - Unlimited memory and swap limits are reported as `0` (cAdvisor reports the raw
//!   cgroup value, e.g. `1.8446744073709552e+19` for v2 `max`).
//! - `cadvisor_version_info` has empty `cadvisorRevision`, `cadvisorVersion` and
//!   `dockerVersion` (there is no cAdvisor); kernel and OS versions are the host's.
//! - The families listed in [`NOT_RENDERED`] are left out (not even announced): the
//!   collection has no data for them. cAdvisor's other disk families
//!   (`container_fs_reads_bytes_total`, `container_fs_writes_bytes_total`,
//!   `container_blkio_device_usage_total`) are not in kubelet 1.28's reference capture and
//!   not rendered; neither are block I/O rows from the BFQ debug or CFQ statistics (sectors,
//!   merges, service and wait times, queue) that cAdvisor would add where a kernel has them.
//! - The partitions are those of the agent's mount table at its first collection (cAdvisor:
//!   when the kubelet starts); mounts made later (pod volumes, sandbox `shm`) get no row
//!   until the agent restarts, as upstream.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::cgroup::CgroupStats;
use super::collector::{Collection, FilesystemSample, NetworkSample};
use super::resource_metrics::{write_family_header, write_sample};

pub use super::resource_metrics::CONTENT_TYPE;

/// One metric family of the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// Name.
    pub name: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Label names, sorted.
    pub labels: &'static [&'static str],
}

const C: &[&str] = &["container", "id", "image", "name", "namespace", "pod"];
const C_CPU: &[&str] = &["container", "cpu", "id", "image", "name", "namespace", "pod"];
const C_DEV: &[&str] = &["container", "device", "id", "image", "name", "namespace", "pod"];
const C_NET: &[&str] = &["container", "id", "image", "interface", "name", "namespace", "pod"];
const C_FAIL: &[&str] = &["container", "failure_type", "id", "image", "name", "namespace", "pod", "scope"];
const MACHINE: &[&str] = &["boot_id", "machine_id", "system_uuid"];
const VERSION: &[&str] = &["cadvisorRevision", "cadvisorVersion", "dockerVersion", "kernelVersion", "osVersion"];

const fn fam(name: &'static str, kind: &'static str, labels: &'static [&'static str], help: &'static str) -> Family {
    Family { name, kind, help, labels }
}

/// Every family the endpoint renders, sorted by name (help texts and label sets of
/// kubelet 1.28's cAdvisor).
pub const FAMILIES: [Family; 49] = [
    fam(
        "cadvisor_version_info",
        "gauge",
        VERSION,
        "A metric with a constant '1' value labeled by kernel version, OS version, docker version, cadvisor version & cadvisor revision.",
    ),
    fam("container_cpu_system_seconds_total", "counter", C, "Cumulative system cpu time consumed in seconds."),
    fam("container_cpu_usage_seconds_total", "counter", C_CPU, "Cumulative cpu time consumed in seconds."),
    fam("container_cpu_user_seconds_total", "counter", C, "Cumulative user cpu time consumed in seconds."),
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
    fam("container_spec_memory_limit_bytes", "gauge", C, "Memory limit for the container."),
    fam("container_spec_memory_swap_limit_bytes", "gauge", C, "Memory swap limit for the container."),
    fam("container_start_time_seconds", "gauge", C, "Start time of the container since unix epoch in seconds."),
    fam("container_threads", "gauge", C, "Number of threads running inside the container"),
    fam("machine_cpu_cores", "gauge", MACHINE, "Number of logical CPU cores."),
    fam("machine_cpu_physical_cores", "gauge", MACHINE, "Number of physical CPU cores."),
    fam("machine_cpu_sockets", "gauge", MACHINE, "Number of CPU sockets."),
    fam("machine_memory_bytes", "gauge", MACHINE, "Amount of memory installed on the machine."),
    fam("machine_scrape_error", "gauge", &[], "1 if there was an error while getting machine metrics, 0 otherwise."),
];

/// Families of kubelet 1.28's `/metrics/cadvisor` that are not rendered, with the reason.
pub const NOT_RENDERED: [(&str, &str); 11] = [
    ("container_cpu_load_average_10s", "needs cAdvisor's netlink task stats; not collected"),
    ("container_file_descriptors", "needs a walk of every process's /proc/<pid>/fd; not collected"),
    ("container_sockets", "needs a walk of every process's /proc/<pid>/fd; not collected"),
    ("container_spec_cpu_period", "cpu.cfs_period_us / cpu.max are not read by the collector"),
    ("container_spec_cpu_shares", "cpu.shares / cpu.weight are not read by the collector"),
    (
        "container_spec_memory_reservation_limit_bytes",
        "memory.soft_limit_in_bytes / memory.low are not read by the collector",
    ),
    ("container_tasks_state", "needs cAdvisor's netlink task stats; not collected"),
    ("container_threads_max", "pids.max is not read by the collector"),
    ("container_ulimits_soft", "needs /proc/<pid>/limits of each container's root process; not collected"),
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

#[derive(Debug)]
struct Sample {
    labels: BTreeMap<&'static str, String>,
    value: f64,
    timestamp_ms: Option<i64>,
}

fn millis(t: SystemTime) -> Option<i64> {
    t.duration_since(UNIX_EPOCH).ok().and_then(|d| i64::try_from(d.as_millis()).ok())
}

fn seconds_f64(t: SystemTime) -> Option<f64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs_f64())
}

/// The identity labels of one cgroup row.
struct Row<'a> {
    id: &'a str,
    name: &'a str,
    image: &'a str,
    container: &'a str,
    pod: &'a str,
    namespace: &'a str,
}

impl Row<'_> {
    fn labels(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("container", self.container.to_owned()),
            ("id", self.id.to_owned()),
            ("image", self.image.to_owned()),
            ("name", self.name.to_owned()),
            ("namespace", self.namespace.to_owned()),
            ("pod", self.pod.to_owned()),
        ])
    }
}

struct Out {
    samples: Vec<Vec<Sample>>,
}

impl Out {
    fn push(&mut self, family: &str, labels: BTreeMap<&'static str, String>, value: f64, ts: Option<i64>) {
        let i = FAMILIES.iter().position(|f| f.name == family).expect("known family");
        self.samples[i].push(Sample { labels, value, timestamp_ms: ts });
    }

    fn with(
        mut labels: BTreeMap<&'static str, String>,
        extra: &[(&'static str, &str)],
    ) -> BTreeMap<&'static str, String> {
        for (k, v) in extra {
            labels.insert(k, (*v).to_owned());
        }
        labels
    }

    fn row(&mut self, row: &Row<'_>, stats: &CgroupStats, start: Option<SystemTime>, seen: SystemTime) {
        let base = row.labels();
        let ts = millis(stats.time);
        if let Some(cpu) = &stats.cpu {
            let secs = |ns: u64| ns as f64 / 1e9;
            self.push(
                "container_cpu_usage_seconds_total",
                Self::with(base.clone(), &[("cpu", "total")]),
                secs(cpu.total_ns),
                ts,
            );
            if let Some(u) = cpu.user_ns {
                self.push("container_cpu_user_seconds_total", base.clone(), secs(u), ts);
            }
            if let Some(s) = cpu.system_ns {
                self.push("container_cpu_system_seconds_total", base.clone(), secs(s), ts);
            }
        }
        if let Some(m) = &stats.memory {
            self.push("container_memory_usage_bytes", base.clone(), m.usage as f64, ts);
            let optional = [
                ("container_memory_working_set_bytes", m.working_set),
                ("container_memory_rss", m.rss),
                ("container_memory_cache", m.cache),
                ("container_memory_mapped_file", m.mapped_file),
                ("container_memory_max_usage_bytes", m.max_usage),
                ("container_memory_failcnt", m.failcnt),
                ("container_memory_swap", m.swap),
                ("container_oom_events_total", m.oom_kills),
            ];
            for (family, value) in optional {
                if let Some(v) = value {
                    self.push(family, base.clone(), v as f64, ts);
                }
            }
            for (kind, value) in [("pgfault", m.pgfault), ("pgmajfault", m.pgmajfault)] {
                let Some(v) = value else { continue };
                for scope in ["container", "hierarchy"] {
                    let labels = Self::with(base.clone(), &[("failure_type", kind), ("scope", scope)]);
                    self.push("container_memory_failures_total", labels, v as f64, ts);
                }
            }
            self.push("container_spec_memory_limit_bytes", base.clone(), m.limit.unwrap_or(0) as f64, None);
            self.push("container_spec_memory_swap_limit_bytes", base.clone(), m.swap_limit.unwrap_or(0) as f64, None);
        }
        if let Some(p) = stats.processes {
            self.push("container_processes", base.clone(), p as f64, ts);
        }
        if let Some(t) = stats.tasks {
            self.push("container_threads", base.clone(), t as f64, ts);
        }
        if let Some(secs) = start.and_then(seconds_f64) {
            self.push("container_start_time_seconds", base.clone(), secs, None);
        }
        if let Some(secs) = seen.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs()) {
            self.push("container_last_seen", base, secs as f64, ts);
        }
    }

    /// Block I/O rows of a cgroup (cAdvisor's `DiskIo.IoServiced`): one per device.
    fn io(&mut self, row: &Row<'_>, stats: &CgroupStats) {
        let ts = millis(stats.time);
        for d in &stats.io {
            let labels = Self::with(row.labels(), &[("device", d.device.as_str())]);
            self.push("container_fs_reads_total", labels.clone(), d.reads as f64, ts);
            self.push("container_fs_writes_total", labels, d.writes as f64, ts);
        }
    }

    /// The node's filesystem rows (cAdvisor's `Filesystem` stats of `/`): usage from
    /// `statvfs`, counters from `/proc/diskstats` (zero for a filesystem without a disk
    /// row). Times are the kernel's milliseconds divided by 10^9, as cAdvisor divides them.
    fn filesystems(&mut self, row: &Row<'_>, filesystems: &[FilesystemSample], time: SystemTime) {
        let ts = millis(time);
        let ms = |v: u64| v as f64 / 1e9;
        for f in filesystems {
            let labels = Self::with(row.labels(), &[("device", f.device.as_str())]);
            let d = f.disk.unwrap_or_default();
            let values = [
                ("container_fs_inodes_free", f.info.inodes_free as f64),
                ("container_fs_inodes_total", f.info.inodes as f64),
                ("container_fs_limit_bytes", f.info.capacity as f64),
                ("container_fs_usage_bytes", f.info.usage as f64),
                ("container_fs_reads_total", d.reads_completed as f64),
                ("container_fs_sector_reads_total", d.sectors_read as f64),
                ("container_fs_reads_merged_total", d.reads_merged as f64),
                ("container_fs_read_seconds_total", ms(d.read_time_ms)),
                ("container_fs_writes_total", d.writes_completed as f64),
                ("container_fs_sector_writes_total", d.sectors_written as f64),
                ("container_fs_writes_merged_total", d.writes_merged as f64),
                ("container_fs_write_seconds_total", ms(d.write_time_ms)),
                ("container_fs_io_current", d.io_in_progress as f64),
                ("container_fs_io_time_seconds_total", ms(d.io_time_ms)),
                ("container_fs_io_time_weighted_seconds_total", ms(d.weighted_io_time_ms)),
            ];
            for (family, v) in values {
                self.push(family, labels.clone(), v, ts);
            }
        }
    }

    fn network(&mut self, row: &Row<'_>, net: &NetworkSample) {
        let ts = millis(net.time);
        for i in &net.interfaces {
            let labels = Self::with(row.labels(), &[("interface", i.name.as_str())]);
            let values = [
                ("container_network_receive_bytes_total", i.rx_bytes),
                ("container_network_receive_errors_total", i.rx_errors),
                ("container_network_receive_packets_dropped_total", i.rx_dropped),
                ("container_network_receive_packets_total", i.rx_packets),
                ("container_network_transmit_bytes_total", i.tx_bytes),
                ("container_network_transmit_errors_total", i.tx_errors),
                ("container_network_transmit_packets_dropped_total", i.tx_dropped),
                ("container_network_transmit_packets_total", i.tx_packets),
            ];
            for (family, v) in values {
                self.push(family, labels.clone(), v as f64, ts);
            }
        }
    }
}

/// Renders the endpoint from `collection`, reading the machine facts from the host.
#[must_use]
pub fn render(collection: &Collection) -> String {
    render_with(collection, &MachineInfo::read())
}

/// Renders the endpoint from `collection` and the given machine facts.
#[must_use]
pub fn render_with(collection: &Collection, machine: &MachineInfo) -> String {
    let mut out = Out { samples: FAMILIES.iter().map(|_| Vec::new()).collect() };
    let seen = collection.time;

    let root = Row { id: "/", name: "", image: "", container: "", pod: "", namespace: "" };
    out.row(&root, &collection.node.stats, collection.node.boot_time, seen);
    // Block I/O rows first: on a device name clash the registry keeps the first.
    out.io(&root, &collection.node.stats);
    out.filesystems(&root, &collection.node.filesystems, collection.node.stats.time);
    if let Some(net) = &collection.node.network {
        out.network(&root, net);
    }
    for pod in &collection.pods {
        let row =
            Row { id: &pod.cgroup, name: "", image: "", container: "", pod: &pod.name, namespace: &pod.namespace };
        if let Some(stats) = &pod.stats {
            out.row(&row, stats, pod.start_time, seen);
            out.io(&row, stats);
        }
        if let Some(net) = &pod.network {
            out.network(&row, net);
        }
        for c in &pod.containers {
            let row = Row {
                id: &c.cgroup,
                name: &c.id,
                image: &c.image,
                container: &c.name,
                pod: &pod.name,
                namespace: &pod.namespace,
            };
            out.row(&row, &c.stats, c.start_time, seen);
            out.io(&row, &c.stats);
        }
    }
    out.push("container_scrape_error", BTreeMap::new(), 0.0, None);

    let version = BTreeMap::from([
        ("cadvisorRevision", String::new()),
        ("cadvisorVersion", String::new()),
        ("dockerVersion", String::new()),
        ("kernelVersion", machine.kernel_version.clone()),
        ("osVersion", machine.os_version.clone()),
    ]);
    out.push("cadvisor_version_info", version, 1.0, None);
    let ids = BTreeMap::from([
        ("boot_id", machine.boot_id.clone()),
        ("machine_id", machine.machine_id.clone()),
        ("system_uuid", machine.system_uuid.clone()),
    ]);
    let machine_values = [
        ("machine_cpu_cores", machine.cpu_cores),
        ("machine_cpu_physical_cores", machine.cpu_physical_cores),
        ("machine_cpu_sockets", machine.cpu_sockets),
        ("machine_memory_bytes", collection.node.memory_capacity),
    ];
    for (family, value) in machine_values {
        if let Some(v) = value {
            out.push(family, ids.clone(), v as f64, None);
        }
    }
    out.push("machine_scrape_error", BTreeMap::new(), 0.0, None);

    write_text(&FAMILIES, out.samples)
}

fn write_text(families: &[Family], samples: Vec<Vec<Sample>>) -> String {
    let mut text = String::with_capacity(4096 + samples.iter().map(Vec::len).sum::<usize>() * 200);
    let mut order: Vec<usize> = (0..families.len()).collect();
    order.sort_by_key(|&i| families[i].name);
    let mut samples: Vec<Option<Vec<Sample>>> = samples.into_iter().map(Some).collect();
    for i in order {
        let family = &families[i];
        let mut rows = samples[i].take().unwrap_or_default();
        let key =
            |s: &Sample| family.labels.iter().map(|l| s.labels.get(l).cloned().unwrap_or_default()).collect::<Vec<_>>();
        rows.sort_by_cached_key(key);
        rows.dedup_by(|later, earlier| later.labels == earlier.labels);
        write_family_header(&mut text, family.name, family.help, family.kind);
        for row in &rows {
            let labels = family.labels.iter().map(|name| (*name, row.labels.get(*name).map_or("", String::as_str)));
            write_sample(&mut text, family.name, labels, row.value, row.timestamp_ms);
        }
    }
    text
}
