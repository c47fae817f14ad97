//! One collection pass: what runs ([`Inventory`]) in, raw numbers ([`Collection`]) out.
//!
//! Each cgroup's files are read once per pass, each pod's network namespace once, each
//! log directory listed once (its files `lstat`ed, as upstream does on every request);
//! writable layers and volumes are never walked by a pass: their `du` comes from the
//! [`FsUsageCache`], which walks them in the background (see [`Collector::fs_usage`];
//! upstream measures volumes and cAdvisor's writable layers once a minute too). A
//! container's writable layer is the `upperdir` of the overlay mounted at `/` in its mount
//! namespace (`/proc/<pid>/mountinfo` of one of its processes), looked up once per
//! container, unless the inventory names it. The node's filesystems for
//! `/metrics/cadvisor` are cAdvisor's partitions of the agent's mount table, read once (as
//! cAdvisor does at start), with `statvfs` and `/proc/diskstats` on every pass. What only
//! `/metrics/cadvisor` shows is read for its rows alone (the root, pod and container
//! cgroups; not the system containers): block I/O counters, the spec files, and
//! cAdvisor's process stats, a walk of the `/proc/<pid>/fd` of each cgroup's own
//! processes (see [`super::processes`]; the root's root process is pid 1, a container's
//! the first of its `cgroup.procs`, a pod has none). CPU rates (`usageNanoCores`) are
//! computed against the sample
//! kept from the previous pass of the same cgroup: the first pass of a cgroup has none, as
//! upstream's CRI stats provider; a pass sooner than [`CollectorConfig::rate_min_window`]
//! after the kept sample reuses the last rate without replacing the sample (upstream's
//! non-updating `getContainerUsageNanoCores`), so on-demand passes between periodic ones do
//! not shrink the window. State for cgroups and paths not seen in a pass is dropped.
//!
//! With the agent's metrics ([`CollectorConfig::metrics`]), every measurement upstream
//! makes with `fs.DiskUsage` (volumes, log files, `etc-hosts`) is timed into
//! `kubelet_volume_metric_collection_duration_seconds{metric_source="du"}`: here the walks
//! of volumes and writable layers (which upstream has the runtime measure), each log
//! directory's listing (upstream: one walk per log file) and each `etc-hosts`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::cgroup::{
    CgroupHierarchies, CgroupReader, CgroupStats, CpuUsage, DeviceIo, MemoryUsage, ReadOptions, join, read_into,
};
use super::fs::{self, DiskUsage, FsInfo};
use super::mounts::{self, DiskStats, Partition};
use super::processes::{FdCounter, ProcessStats, parse_max_open_files};
use super::procfs::{Interface, Procfs};
use super::summary::PvcReference;
use super::usage_cache::{FsUsageCache, FsUsageConfig};

/// What runs on the node: the input of a collection. Built by the caller from its pod
/// manager and runtime cache (no CRI stats calls); containers should be the running ones
/// only (upstream drops terminated containers from stats).
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// The node's name.
    pub node_name: String,
    /// The cgroup holding all pods (`/kubepods`), reported as the `pods` system
    /// container; `None` when `cgroupsPerQOS` is off.
    pub pods_cgroup: Option<String>,
    /// Further system containers (`kubelet`, `runtime`, `misc`) by cgroup.
    pub system_containers: Vec<SystemContainerInventory>,
    /// A path on the node's root filesystem as the kubelet sees it: its root directory
    /// (`/var/lib/kubelet`). Its filesystem is `node.fs` and the capacity side of logs and
    /// ephemeral storage.
    pub root_fs_path: PathBuf,
    /// The runtime's image filesystem (from CRI `ImageFsInfo`, which the caller may cache).
    pub image_fs: Option<ImageFsInventory>,
    /// The pods.
    pub pods: Vec<PodInventory>,
}

/// A system container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemContainerInventory {
    /// `kubelet`, `runtime` or `misc` (see `SYSTEM_CONTAINER_*`).
    pub name: String,
    /// Its cgroup path.
    pub cgroup: String,
    /// Its start time when known (the kubelet's: the agent's start); otherwise the
    /// cgroup directory's modification time when first seen.
    pub start_time: Option<SystemTime>,
}

/// The image filesystem as CRI `ImageFsInfo` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFsInventory {
    /// The filesystem's mount point (`fs_id.mountpoint`), for `statvfs`.
    pub mountpoint: PathBuf,
    /// Bytes used by images.
    pub used_bytes: Option<u64>,
    /// Inodes used by images.
    pub inodes_used: Option<u64>,
    /// When the runtime measured it; the collection time if unknown.
    pub time: Option<SystemTime>,
}

/// A pod with at least a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInventory {
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The pod cgroup (`/kubepods/burstable/pod<uid>`).
    pub cgroup: String,
    /// The sandbox's creation time (CRI `PodSandbox.created_at`): the pod's `startTime`.
    pub start_time: Option<SystemTime>,
    /// The sandbox id.
    pub sandbox_id: String,
    /// The sandbox's cgroup; one of its processes names the pod's network namespace.
    pub sandbox_cgroup: Option<String>,
    /// The pod log directory (`/var/log/pods/<ns>_<name>_<uid>`): files directly in it
    /// count towards ephemeral storage.
    pub log_dir: Option<PathBuf>,
    /// The pod's `etc-hosts` file (`<root>/pods/<uid>/etc-hosts`), if the kubelet made one.
    pub etc_hosts: Option<PathBuf>,
    /// Volumes to measure.
    pub volumes: Vec<VolumeInventory>,
    /// Running containers.
    pub containers: Vec<ContainerInventory>,
}

/// A running container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerInventory {
    /// Name in the pod spec.
    pub name: String,
    /// Runtime id.
    pub id: String,
    /// Cgroup path.
    pub cgroup: String,
    /// Creation time (CRI `Container.created_at`): the container's `startTime`.
    pub start_time: Option<SystemTime>,
    /// Image reference.
    pub image: String,
    /// The container's log directory (`<pod log dir>/<container name>`).
    pub log_dir: Option<PathBuf>,
    /// The writable layer's directory (the snapshot's upper dir), when the caller knows
    /// it; otherwise the collector finds it from one of the container's processes.
    pub writable_layer: Option<PathBuf>,
}

/// A pod volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeInventory {
    /// Name in the pod spec.
    pub name: String,
    /// Its directory on the node.
    pub path: PathBuf,
    /// A local ephemeral volume (emptyDir on disk, configMap, gitRepo: upstream
    /// `IsLocalEphemeralVolume`), counted in the pod's ephemeral storage.
    pub local_ephemeral: bool,
    /// The claim, for a persistent volume.
    pub pvc: Option<PvcReference>,
    /// A CSI volume: measured by its driver ([`super::VolumeStatsSource`]), not walked.
    pub driver: Option<DriverVolume>,
}

/// A CSI volume, as its driver knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DriverVolume {
    /// The driver's name.
    pub driver: String,
    /// The volume's id (`volumeHandle`).
    pub volume_id: String,
}

/// Settings of a [`Collector`].
#[derive(Debug, Clone)]
pub struct CollectorConfig {
    /// Where the cgroups are.
    pub cgroups: CgroupHierarchies,
    /// procfs (`/proc`).
    pub proc_root: PathBuf,
    /// sysfs (`/sys`), for the block devices.
    pub sys_root: PathBuf,
    /// How often writable layers and volumes are walked (in the background).
    pub fs_usage: FsUsageConfig,
    /// The shortest window a CPU rate is computed over. Default 1 s.
    pub rate_min_window: Duration,
    /// The agent's metrics: the duration of every `du` (writable layers, volumes,
    /// `etc-hosts`) and log directory listing goes to
    /// `kubelet_volume_metric_collection_duration_seconds{metric_source="du"}`. Default
    /// none.
    pub metrics: Option<Arc<super::metrics::VolumeStatMetrics>>,
}

impl CollectorConfig {
    /// Defaults for `hierarchies` and `/proc`.
    #[must_use]
    pub fn new(cgroups: CgroupHierarchies) -> Self {
        Self {
            cgroups,
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            fs_usage: FsUsageConfig::default(),
            rate_min_window: Duration::from_secs(1),
            metrics: None,
        }
    }
}

/// A network namespace's interfaces at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSample {
    /// When read.
    pub time: SystemTime,
    /// Interfaces in `/proc/net/dev` order, without the ignored ones.
    pub interfaces: Vec<Interface>,
}

/// A filesystem's `statvfs` at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSample {
    /// When read.
    pub time: SystemTime,
    /// The numbers.
    pub info: FsInfo,
}

/// One of cAdvisor's partitions of the node, for `/metrics/cadvisor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesystemSample {
    /// The `device` label ([`Partition::device`]).
    pub device: String,
    /// Its `statvfs`.
    pub info: FsInfo,
    /// Its `/proc/diskstats` row, when it is a disk cAdvisor reads.
    pub disk: Option<DiskStats>,
}

/// A `du` at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageSample {
    /// When measured.
    pub time: SystemTime,
    /// What is used; `None` when there was nothing to measure (a log directory without
    /// files).
    pub usage: Option<DiskUsage>,
}

/// The image filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageFsSample {
    /// When measured.
    pub time: SystemTime,
    /// Its `statvfs`, when the mount point could be examined.
    pub info: Option<FsInfo>,
    /// Bytes used by images.
    pub used_bytes: Option<u64>,
    /// Inodes used by images.
    pub inodes_used: Option<u64>,
}

/// Swap of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapSample {
    /// When read.
    pub time: SystemTime,
    /// Swap in use.
    pub usage: u64,
    /// Swap free.
    pub available: u64,
}

/// Process limits of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlimitSample {
    /// When read.
    pub time: SystemTime,
    /// Task ceiling.
    pub max_pid: Option<i64>,
    /// Tasks.
    pub tasks: Option<i64>,
}

/// Node-level numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSample {
    /// Boot time.
    pub boot_time: Option<SystemTime>,
    /// The root cgroup (CPU from `cpuacct.usage`/`cpu.stat`, memory from the root's
    /// files), with `/proc/stat` and `/proc/meminfo` filling what the root cgroup lacks,
    /// and node PSI from `/proc/pressure`.
    pub stats: CgroupStats,
    /// `MemTotal`.
    pub memory_capacity: Option<u64>,
    /// Swap.
    pub swap: Option<SwapSample>,
    /// Interfaces of the host network namespace.
    pub network: Option<NetworkSample>,
    /// The root filesystem.
    pub fs: Option<FsSample>,
    /// The image filesystem.
    pub image_fs: Option<ImageFsSample>,
    /// Process limits.
    pub rlimit: Option<RlimitSample>,
    /// cAdvisor's partitions of the node (the `container_fs_*` rows of `/`), by device.
    pub filesystems: Vec<FilesystemSample>,
}

/// A system container.
#[derive(Debug, Clone, PartialEq)]
pub struct SystemContainerSample {
    /// Its name (`pods`, `kubelet`, ...).
    pub name: String,
    /// Its start time.
    pub start_time: Option<SystemTime>,
    /// Its cgroup.
    pub stats: CgroupStats,
}

/// A container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSample {
    /// Name.
    pub name: String,
    /// Runtime id.
    pub id: String,
    /// Image.
    pub image: String,
    /// Creation time.
    pub start_time: Option<SystemTime>,
    /// Its cgroup path (from the inventory).
    pub cgroup: String,
    /// Its cgroup.
    pub stats: CgroupStats,
    /// The writable layer, when its directory is known and was measured.
    pub rootfs: Option<UsageSample>,
    /// Its log files, when the log directory exists.
    pub logs: Option<UsageSample>,
}

/// A volume.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeSample {
    /// Name.
    pub name: String,
    /// Counted in ephemeral storage.
    pub local_ephemeral: bool,
    /// The claim.
    pub pvc: Option<PvcReference>,
    /// Its `du`.
    pub usage: UsageSample,
    /// Its filesystem.
    pub fs: Option<FsInfo>,
}

/// A pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSample {
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Sandbox creation time.
    pub start_time: Option<SystemTime>,
    /// The pod cgroup's path (from the inventory).
    pub cgroup: String,
    /// The pod cgroup, `None` if it could not be read.
    pub stats: Option<CgroupStats>,
    /// The pod's network namespace.
    pub network: Option<NetworkSample>,
    /// Containers whose cgroups could be read (vanished ones are left out).
    pub containers: Vec<ContainerSample>,
    /// Volumes that could be measured.
    pub volumes: Vec<VolumeSample>,
    /// Files directly in the pod log directory.
    pub logs: Option<UsageSample>,
    /// The `etc-hosts` file.
    pub etc_hosts: Option<UsageSample>,
}

/// The result of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Collection {
    /// The node's name.
    pub node_name: String,
    /// When the pass started.
    pub time: SystemTime,
    /// Node-level numbers.
    pub node: NodeSample,
    /// System containers (`pods` first).
    pub system_containers: Vec<SystemContainerSample>,
    /// Pods with at least one readable container, in inventory order.
    pub pods: Vec<PodSample>,
    /// Made lean ([`Collector::set_lean`]): for the eviction manager only.
    pub lean: bool,
}

/// The clock of a collector (injectable for tests).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

#[derive(Debug, Clone, Copy)]
struct CpuRecord {
    time: SystemTime,
    total_ns: u64,
    nano_cores: Option<u64>,
}

/// A container's writable layer as found in its mount table.
#[derive(Debug, Clone)]
struct LayerRecord {
    /// The upper directory, `None` when not found.
    path: Option<PathBuf>,
    /// When looked up.
    checked: SystemTime,
}

/// Collects stats; keeps the state that spans passes (previous CPU samples, the `du`
/// cache, writable layer paths, first-seen start times, the node's partitions). Blocking
/// file I/O: call [`Collector::collect`] from a blocking context (`spawn_blocking`), every
/// 10 s (the eviction manager's period upstream) and, if wanted, on demand.
pub struct Collector {
    config: CollectorConfig,
    reader: CgroupReader,
    clock: Clock,
    cpu: HashMap<String, CpuRecord>,
    usage: Arc<FsUsageCache>,
    layers: HashMap<String, LayerRecord>,
    start_times: HashMap<String, SystemTime>,
    partitions: Option<Vec<Partition>>,
    block_devices: Option<HashMap<(u32, u32), String>>,
    /// Whether a writable layer that could not be found was logged as a warning (once;
    /// the others at debug).
    layer_warned: bool,
    /// Walks the descriptors of the cgroups' processes (its buffers kept between passes).
    fds: FdCounter,
    /// The pids of the cgroup being walked (kept between cgroups and passes).
    pids: Vec<u32>,
    /// Whether collections walk the processes (see [`Collector::set_process_walk`]).
    walk_processes: bool,
    /// Whether collections are lean (see [`Collector::set_lean`]).
    lean: bool,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("config", &self.config)
            .field("cpu_records", &self.cpu.len())
            .field("fs_usage", &self.usage)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

/// The key of the node's CPU record when it comes from `/proc/stat`.
const PROC_STAT_KEY: &str = "\0/proc/stat";

/// What is read of a cgroup that is a row of `/metrics/cadvisor` (the root, pods and
/// containers) besides what `/stats/summary` needs: block I/O counters and the spec files.
/// System containers are read without them; their processes are not walked either.
const CADVISOR_ROW: ReadOptions = ReadOptions { procs: false, io: true, spec: true, memory_only: false };
/// What a lean collection reads of a pod's or container's cgroup (see [`Collector::set_lean`]).
const LEAN: ReadOptions = ReadOptions { procs: false, io: false, spec: false, memory_only: true };

impl Collector {
    /// A collector using the system clock.
    #[must_use]
    pub fn new(config: CollectorConfig) -> Self {
        Self::with_clock(config, Arc::new(SystemTime::now))
    }

    /// Whether the next collections walk the cgroups' processes for their descriptors,
    /// sockets and open-files limit (`container_file_descriptors`, `container_sockets`,
    /// `container_ulimits_soft`); on by default. Nothing but `/metrics/cadvisor` shows
    /// them, and on a node whose root cgroup holds busy processes (an API server, etcd,
    /// the runtime) the walk is the largest part of a collection: the stats provider
    /// turns it off for the eviction manager's collections while nobody scrapes.
    pub fn set_process_walk(&mut self, on: bool) {
        self.walk_processes = on;
    }

    /// Whether the next collections are lean: only what the eviction manager reads
    /// (memory usage and working set, task and process counts, disk usage, the node's
    /// memory, filesystems and pids), a third of a full collection's reads. A lean
    /// collection has no CPU, limits, pressure, network, block I/O or spec figures and
    /// leaves the CPU samples of the last full one alone, so the next full collection's
    /// rates span the time since that one. Off by default; the stats provider makes the
    /// eviction manager's collections lean while nobody reads the stats.
    pub fn set_lean(&mut self, on: bool) {
        self.lean = on;
    }

    /// A collector using `clock` for every timestamp (tests).
    #[must_use]
    pub fn with_clock(config: CollectorConfig, clock: Clock) -> Self {
        let reader = CgroupReader::new(config.cgroups.clone());
        let fds = FdCounter::new(&config.proc_root);
        let usage =
            Arc::new(FsUsageCache::new(config.fs_usage, Arc::clone(&clock)).with_metrics(config.metrics.clone()));
        Self {
            config,
            reader,
            clock,
            cpu: HashMap::new(),
            usage,
            layers: HashMap::new(),
            start_times: HashMap::new(),
            partitions: None,
            block_devices: None,
            layer_warned: false,
            fds,
            pids: Vec::new(),
            walk_processes: true,
            lean: false,
        }
    }

    /// The `du` cache of writable layers and volumes: run [`FsUsageCache::run`] in the
    /// background (or call [`FsUsageCache::refresh_due`]) or these stay unmeasured.
    #[must_use]
    pub fn fs_usage(&self) -> Arc<FsUsageCache> {
        Arc::clone(&self.usage)
    }

    /// The settings.
    #[must_use]
    pub const fn config(&self) -> &CollectorConfig {
        &self.config
    }

    /// One pass over what `inventory` describes.
    pub fn collect(&mut self, inventory: &Inventory) -> Collection {
        let collection = self.collect_once(inventory);
        // The directories of containers and processes that are gone are closed.
        super::cgroup::sweep_open_dirs();
        collection
    }

    fn collect_once(&mut self, inventory: &Inventory) -> Collection {
        if self.lean {
            // The CPU samples stay for the next full collection.
            let kept = std::mem::take(&mut self.cpu);
            let mut collection = self.collect_pass(inventory);
            self.cpu = kept;
            collection.lean = true;
            return collection;
        }
        self.collect_pass(inventory)
    }

    fn collect_pass(&mut self, inventory: &Inventory) -> Collection {
        let time = (self.clock)();
        let mut seen_cgroups: HashSet<String> = HashSet::new();
        let mut seen_paths: HashSet<PathBuf> = HashSet::new();

        let node = self.collect_node(inventory, time, &mut seen_cgroups);

        let mut system_containers = Vec::new();
        let mut system_cgroups: HashSet<&str> = HashSet::new();
        let pods_sc = inventory.pods_cgroup.as_ref().map(|cg| SystemContainerInventory {
            name: super::summary::SYSTEM_CONTAINER_PODS.to_owned(),
            cgroup: cg.clone(),
            start_time: None,
        });
        for sc in pods_sc.iter().chain(&inventory.system_containers) {
            system_cgroups.insert(sc.cgroup.as_str());
            let now = (self.clock)();
            let opts = if self.lean { LEAN } else { ReadOptions::default() };
            let Some(mut stats) = self.reader.read(&sc.cgroup, now, opts) else { continue };
            self.rate(&sc.cgroup, &mut stats, &mut seen_cgroups);
            let start_time = sc.start_time.or_else(|| self.first_seen(&sc.cgroup));
            system_containers.push(SystemContainerSample { name: sc.name.clone(), start_time, stats });
        }
        self.start_times.retain(|k, _| system_cgroups.contains(k.as_str()));

        let mut pods = Vec::with_capacity(inventory.pods.len());
        for pod in &inventory.pods {
            if let Some(p) = self.collect_pod(pod, &mut seen_cgroups, &mut seen_paths) {
                pods.push(p);
            }
        }

        self.cpu.retain(|k, _| seen_cgroups.contains(k));
        self.usage.retain(&seen_paths);
        let ids: HashSet<&str> = inventory.pods.iter().flat_map(|p| &p.containers).map(|c| c.id.as_str()).collect();
        self.layers.retain(|id, _| ids.contains(id.as_str()));
        Collection { node_name: inventory.node_name.clone(), time, node, system_containers, pods, lean: false }
    }

    fn collect_node(&mut self, inventory: &Inventory, time: SystemTime, seen: &mut HashSet<String>) -> NodeSample {
        let opts = if self.lean { LEAN } else { CADVISOR_ROW };
        let mut stats = self.reader.read("/", time, opts).unwrap_or_else(|| CgroupStats::empty(time));
        // cAdvisor's root container has pid 1 as its root process.
        stats.process_stats = self.process_stats("/", Some(1));
        let proc_root = self.config.proc_root.clone();
        let mut procfs = Procfs::new(&proc_root, self.reader.buffer());
        let stat = procfs.stat();
        let meminfo = procfs.meminfo();
        let cpu_key = if stats.cpu.is_some() {
            "/"
        } else {
            stats.cpu = stat.and_then(|s| s.busy_ns).map(|total_ns| CpuUsage {
                total_ns,
                user_ns: stat.and_then(|s| s.user_ns),
                system_ns: stat.and_then(|s| s.system_ns),
                ..CpuUsage::default()
            });
            PROC_STAT_KEY
        };
        if stats.memory.is_none() {
            stats.memory = meminfo.and_then(|m| {
                let usage = m.total?.saturating_sub(m.free?);
                Some(MemoryUsage {
                    usage,
                    working_set: Some(m.inactive_file.map_or(usage, |i| usage.saturating_sub(i))),
                    inactive_file: m.inactive_file,
                    rss: m.anon,
                    ..MemoryUsage::default()
                })
            });
        }
        // The node's pressure is the system-wide one.
        for (resource, slot) in
            [("cpu", &mut stats.cpu_pressure), ("memory", &mut stats.memory_pressure), ("io", &mut stats.io_pressure)]
        {
            if let Some(p) = procfs.pressure(resource).filter(|_| !self.lean) {
                *slot = Some(p);
            }
        }
        let swap = meminfo.and_then(|m| {
            let (total, free) = (m.swap_total?, m.swap_free?);
            Some(SwapSample { time, usage: total.saturating_sub(free), available: free })
        });
        let network = if self.lean {
            None
        } else {
            procfs
                .net_dev(Some(1))
                .or_else(|| procfs.net_dev(None))
                .map(|interfaces| NetworkSample { time: (self.clock)(), interfaces })
        };
        let rlimit_time = (self.clock)();
        let rlimit = RlimitSample { time: rlimit_time, max_pid: procfs.max_pid(), tasks: procfs.tasks() };
        let rlimit = (rlimit.max_pid.is_some() || rlimit.tasks.is_some()).then_some(rlimit);
        self.rate(cpu_key, &mut stats, seen);

        let fs = match fs::statvfs(&inventory.root_fs_path) {
            Ok(info) => Some(FsSample { time: (self.clock)(), info }),
            Err(e) => {
                tracing::debug!(path = %inventory.root_fs_path.display(), error = %e, "stats: statvfs of the root filesystem failed");
                None
            }
        };
        let image_fs = inventory.image_fs.as_ref().map(|i| ImageFsSample {
            time: i.time.unwrap_or(time),
            info: fs::statvfs(&i.mountpoint).ok(),
            used_bytes: i.used_bytes,
            inodes_used: i.inodes_used,
        });
        let filesystems = if self.lean { Vec::new() } else { self.filesystems() };
        self.name_devices(&mut stats.io, true);
        NodeSample {
            boot_time: stat.and_then(|s| s.boot_time),
            stats,
            memory_capacity: meminfo.and_then(|m| m.total),
            swap,
            network,
            fs,
            image_fs,
            rlimit,
            filesystems,
        }
    }

    /// cAdvisor's partitions (read once) with their `statvfs` and disk statistics now.
    fn filesystems(&mut self) -> Vec<FilesystemSample> {
        let proc_root = self.config.proc_root.clone();
        let partitions = self.partitions.get_or_insert_with(|| {
            let path = proc_root.join("self/mountinfo");
            match std::fs::read_to_string(&path) {
                Ok(text) => mounts::partitions(&mounts::parse_mountinfo(&text)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "stats: no mount table; no filesystem rows in /metrics/cadvisor");
                    Vec::new()
                }
            }
        });
        if partitions.is_empty() {
            return Vec::new();
        }
        let disks = std::fs::read_to_string(proc_root.join("diskstats"))
            .map(|t| mounts::parse_diskstats(&t))
            .unwrap_or_default();
        partitions
            .iter()
            .filter_map(|p| match fs::statvfs(&p.mount_point) {
                Ok(info) => Some(FilesystemSample {
                    device: p.device.clone(),
                    info,
                    disk: mounts::disk_stats_of(&disks, p).copied(),
                }),
                Err(e) => {
                    tracing::debug!(mount = %p.mount_point.display(), error = %e, "stats: statvfs failed");
                    None
                }
            })
            .collect()
    }

    /// Names the devices of block I/O rows as cAdvisor does: the node's own rows look in
    /// its partitions first, then in the machine's disks; other cgroups the other way round.
    fn name_devices(&mut self, io: &mut [DeviceIo], node: bool) {
        if io.is_empty() {
            return;
        }
        let sys_block = self.config.sys_root.join("block");
        let disks = self.block_devices.get_or_insert_with(|| mounts::block_devices(&sys_block));
        let partitions = self.partitions.as_deref().unwrap_or_default();
        for d in io {
            let disk = || disks.get(&(d.major, d.minor)).cloned();
            let part =
                || partitions.iter().find(|p| p.major == d.major && p.minor == d.minor).map(|p| p.device.clone());
            d.device = if node { part().or_else(disk) } else { disk().or_else(part) }.unwrap_or_default();
        }
    }

    /// The writable layer of a container: the inventory's, else the overlay upper dir of
    /// the root mount of one of its processes (looked up once; a failed look-up is retried
    /// after the `du` interval).
    fn writable_layer(&mut self, c: &ContainerInventory, pid: Option<u32>) -> Option<PathBuf> {
        if let Some(p) = &c.writable_layer {
            return Some(p.clone());
        }
        let now = (self.clock)();
        let retry = self.config.fs_usage.interval;
        match self.layers.get(&c.id) {
            Some(r) if r.path.is_some() => return r.path.clone(),
            Some(r) if now.duration_since(r.checked).is_ok_and(|age| age < retry) => return None,
            _ => {}
        }
        let pid = pid?;
        let path = self.config.proc_root.join(pid.to_string()).join("mountinfo");
        let (found, why) = match read_into(self.reader.buffer(), &path) {
            None => (None, "its mount table cannot be read"),
            Some(text) => match mounts::root_overlay_upperdir(text) {
                None => (None, "its root is not an overlay with an upper dir"),
                Some(upper) if upper.is_dir() => (Some(upper), ""),
                Some(_) => (None, "its overlay upper dir is not visible from the agent"),
            },
        };
        if found.is_none() {
            if self.layer_warned {
                tracing::debug!(container = %c.id, pid, reason = why, "stats: writable layer not found");
            } else {
                self.layer_warned = true;
                tracing::warn!(
                    container = %c.id,
                    pid,
                    reason = why,
                    "stats: writable layer of a container not found; its rootfs usage is left out (further ones are logged at debug)"
                );
            }
        }
        self.layers.insert(c.id.clone(), LayerRecord { path: found.clone(), checked: now });
        found
    }

    fn collect_pod(
        &mut self,
        pod: &PodInventory,
        seen_cgroups: &mut HashSet<String>,
        seen_paths: &mut HashSet<PathBuf>,
    ) -> Option<PodSample> {
        let mut containers = Vec::with_capacity(pod.containers.len());
        for c in &pod.containers {
            let now = (self.clock)();
            // A container that exited and was removed since the inventory was taken.
            let opts = if self.lean { LEAN } else { CADVISOR_ROW };
            let Some(mut stats) = self.reader.read(&c.cgroup, now, ReadOptions { procs: true, ..opts }) else {
                continue;
            };
            stats.process_stats = self.process_stats(&c.cgroup, stats.first_pid);
            self.rate(&c.cgroup, &mut stats, seen_cgroups);
            self.name_devices(&mut stats.io, false);
            let rootfs = self.writable_layer(c, stats.first_pid).and_then(|p| {
                let sample = self.usage.get(&p);
                seen_paths.insert(p);
                sample
            });
            let logs = c.log_dir.as_deref().and_then(|d| self.files(d));
            containers.push(ContainerSample {
                name: c.name.clone(),
                id: c.id.clone(),
                image: c.image.clone(),
                start_time: c.start_time,
                cgroup: c.cgroup.clone(),
                stats,
                rootfs,
                logs,
            });
        }
        // Upstream lists pods from their containers' stats: no running container, no pod.
        if containers.is_empty() {
            return None;
        }
        let now = (self.clock)();
        let mut stats = self.reader.read(&pod.cgroup, now, if self.lean { LEAN } else { CADVISOR_ROW });
        if let Some(s) = stats.as_mut() {
            // A pod cgroup has no root process (cAdvisor's raw handler, pid 0).
            s.process_stats = self.process_stats(&pod.cgroup, None);
            self.rate(&pod.cgroup, s, seen_cgroups);
            self.name_devices(&mut s.io, false);
        }

        let pid = pod
            .sandbox_cgroup
            .as_deref()
            .and_then(|cg| self.first_pid(cg))
            .or_else(|| containers.iter().find_map(|c| c.stats.first_pid));
        let network = pid.filter(|_| !self.lean).and_then(|pid| {
            let time = (self.clock)();
            let proc_root = self.config.proc_root.clone();
            Procfs::new(&proc_root, self.reader.buffer())
                .net_dev(Some(pid))
                .map(|interfaces| NetworkSample { time, interfaces })
        });

        let mut volumes = Vec::with_capacity(pod.volumes.len());
        for v in &pod.volumes {
            seen_paths.insert(v.path.clone());
            // Not measured yet, or not measurable: left out.
            let (usage, fs) = if let Some(driver) = &v.driver {
                let Some((usage, fs)) = self.usage.get_from_driver(&v.path, driver) else { continue };
                (usage, Some(fs))
            } else {
                let Some(usage) = self.usage.get(&v.path) else { continue };
                (usage, fs::statvfs(&v.path).ok())
            };
            volumes.push(VolumeSample {
                name: v.name.clone(),
                local_ephemeral: v.local_ephemeral,
                pvc: v.pvc.clone(),
                usage,
                fs,
            });
        }
        let logs = pod.log_dir.as_deref().and_then(|d| self.files(d));
        let etc_hosts = pod.etc_hosts.as_deref().and_then(|p| {
            let time = (self.clock)();
            let started = std::time::Instant::now();
            let usage = fs::disk_usage(p);
            self.observe_du(started);
            usage.ok().map(|u| UsageSample { time, usage: Some(u) })
        });
        Some(PodSample {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            start_time: pod.start_time,
            cgroup: pod.cgroup.clone(),
            stats,
            network,
            containers,
            volumes,
            logs,
            etc_hosts,
        })
    }

    /// Sets the CPU rate of `stats` from the record of `key` and updates the record.
    fn rate(&mut self, key: &str, stats: &mut CgroupStats, seen: &mut HashSet<String>) {
        let Some(cpu) = stats.cpu.as_mut() else { return };
        seen.insert(key.to_owned());
        let fresh = CpuRecord { time: stats.time, total_ns: cpu.total_ns, nano_cores: None };
        let Some(prev) = self.cpu.get_mut(key) else {
            self.cpu.insert(key.to_owned(), fresh);
            return;
        };
        let window = stats.time.duration_since(prev.time).ok().filter(|_| cpu.total_ns >= prev.total_ns);
        match window {
            // The counter went back (a new cgroup at the same path) or the clock did.
            None => *prev = fresh,
            Some(w) if w < self.config.rate_min_window || w.is_zero() => cpu.nano_cores = prev.nano_cores,
            Some(w) => {
                let nano_cores = ((cpu.total_ns - prev.total_ns) as f64 / w.as_nanos() as f64 * 1e9) as u64;
                cpu.nano_cores = Some(nano_cores);
                *prev = CpuRecord { nano_cores: Some(nano_cores), ..fresh };
            }
        }
    }

    /// The start time of a system container: its cgroup directory's modification time
    /// the first time it is seen (cAdvisor's creation time of raw cgroups).
    fn first_seen(&mut self, cgroup: &str) -> Option<SystemTime> {
        if let Some(t) = self.start_times.get(cgroup) {
            return Some(*t);
        }
        let t = std::fs::metadata(self.reader.primary_dir(cgroup)).and_then(|m| m.modified()).ok()?;
        self.start_times.insert(cgroup.to_owned(), t);
        Some(t)
    }

    /// cAdvisor's process stats of a cgroup: the descriptors and sockets of its own
    /// processes and the open-files limit of `root_pid`; `None` when its processes cannot
    /// be listed.
    fn process_stats(&mut self, cgroup: &str, root_pid: Option<u32>) -> Option<ProcessStats> {
        if !self.walk_processes {
            return None;
        }
        let mut pids = std::mem::take(&mut self.pids);
        let listed = self.reader.pids(cgroup, &mut pids);
        let counts = listed.then(|| self.fds.count(&pids));
        self.pids = pids;
        let counts = counts?;
        let max_open_files = root_pid.and_then(|pid| {
            let path = self.config.proc_root.join(pid.to_string()).join("limits");
            read_into(self.reader.buffer(), &path).and_then(parse_max_open_files)
        });
        Some(ProcessStats { fds: counts.fds, sockets: counts.sockets, max_open_files })
    }

    /// The first process of a cgroup.
    fn first_pid(&mut self, cgroup: &str) -> Option<u32> {
        let dir = match self.reader.hierarchies() {
            CgroupHierarchies::V1 { memory, .. } => join(memory, cgroup),
            CgroupHierarchies::V2 { root } => join(root, cgroup),
        };
        let text = read_into(self.reader.buffer(), &dir.join("cgroup.procs"))?;
        text.lines().find_map(|l| l.trim().parse().ok())
    }

    /// Observes a measurement begun at `started` as upstream's `fs.DiskUsage` does.
    fn observe_du(&self, started: std::time::Instant) {
        if let Some(m) = &self.config.metrics {
            m.observe_volume_stat_duration(fs::DU, started.elapsed());
        }
    }

    /// The files directly in a log directory, measured now; `None` if the directory
    /// cannot be read.
    fn files(&self, dir: &Path) -> Option<UsageSample> {
        let time = (self.clock)();
        let started = std::time::Instant::now();
        let usage = fs::files_usage(dir);
        self.observe_du(started);
        match usage {
            Ok(usage) => Some(UsageSample { time, usage }),
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::debug!(path = %dir.display(), error = %e, "stats: cannot list a log directory");
                }
                None
            }
        }
    }
}
