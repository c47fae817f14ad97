//! Resource math: CFS shares and quota, cgroup v2 weights, pod cgroup limits
//! (`ResourceConfigForPod`), and the per-container `LinuxContainerResources` sent over CRI
//! (`generateLinuxContainerResources`), including the OOM score adjustment policy.
//!
//! Upstream sources: `pkg/kubelet/cm/helpers_linux.go`, `pkg/kubelet/cm/cgroup_manager_linux.go`
//! (`getCPUWeight`), `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go` and
//! `pkg/kubelet/qos/policy.go`. Feature gates are taken at their 1.34+ defaults
//! (`PodLevelResources` and `SidecarContainers` on, `CustomCPUCFSQuotaPeriod`, `MemoryQoS`,
//! `InPlacePodVerticalScaling` status handling and the CPU manager not in play).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use k8s_cri::v1::{HugepageLimit, LinuxContainerResources};
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::types::pod::{is_critical_pod, is_node_critical_pod};
use crate::types::pod_resources::{self, ContainerKind};
use crate::types::qos::{QosClass, qos_class};
use crate::types::quantity;
use crate::types::resource_names::{CPU, HUGEPAGES_PREFIX, MEMORY};

/// Errors from probing the host for the facts container resources depend on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A host file could not be read.
    #[error("failed to read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `/proc/meminfo` has no usable `MemTotal` line.
    #[error("no MemTotal in {path}")]
    NoMemTotal {
        /// The file.
        path: PathBuf,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Smallest `cpu.shares` the kernel accepts.
pub const MIN_SHARES: u64 = 2;
/// Largest `cpu.shares` the kernel accepts.
pub const MAX_SHARES: u64 = 262_144;
/// Shares of one full CPU.
pub const SHARES_PER_CPU: i64 = 1024;
/// Milli-CPU in one CPU.
pub const MILLI_CPU_TO_CPU: i64 = 1000;
/// The CFS period the kubelet uses, in µs (100 ms).
pub const QUOTA_PERIOD: i64 = 100_000;
/// Smallest CFS quota the kernel accepts, in µs (1 ms).
pub const MIN_QUOTA_PERIOD: i64 = 1000;
/// Largest `cpu.weight` on cgroup v2.
pub const MAX_CPU_WEIGHT: u64 = 10_000;

/// Converts milli-CPU to `cpu.shares` (`MilliCPUToShares`): 0 → 2 (the kernel's floor, not
/// the runtime's "unset" 1024), clamped to `[2, 262144]`.
#[must_use]
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu == 0 {
        return MIN_SHARES;
    }
    // Multiply first to keep the rounding of upstream's integer math.
    let shares = milli_cpu.saturating_mul(SHARES_PER_CPU) / MILLI_CPU_TO_CPU;
    u64::try_from(shares).map_or(MIN_SHARES, |s| s.clamp(MIN_SHARES, MAX_SHARES))
}

/// Converts a milli-CPU limit to a CFS quota for `period` µs (`MilliCPUToQuota`): 0 when
/// there is no limit, at least 1 ms otherwise.
#[must_use]
pub fn milli_cpu_to_quota(milli_cpu: i64, period: i64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    (milli_cpu.saturating_mul(period) / MILLI_CPU_TO_CPU).max(MIN_QUOTA_PERIOD)
}

/// Converts `cpu.shares` to cgroup v2 `cpu.weight` the way the kubelet's cgroup manager
/// does (`getCPUWeight` / `CpuSharesToCpuWeight`, KEP-2254): linear from `[2, 262144]` to
/// `[1, 10000]`.
#[must_use]
pub fn cpu_shares_to_cpu_weight(shares: u64) -> u64 {
    if shares >= MAX_SHARES {
        return MAX_CPU_WEIGHT;
    }
    1 + (shares.max(MIN_SHARES) - MIN_SHARES) * 9999 / 262_142
}

/// The inverse of [`cpu_shares_to_cpu_weight`] (upstream `cpuWeightToCPUShares`), which
/// loses what the weight's coarse steps cannot hold.
#[must_use]
pub fn cpu_weight_to_cpu_shares(weight: u64) -> u64 {
    MIN_SHARES + weight.saturating_sub(1) * 262_142 / 9999
}

/// Limits for a pod cgroup (upstream `ResourceConfig` as filled by `ResourceConfigForPod`).
/// `None` leaves the kernel default in place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodResourceConfig {
    /// `cpu.shares` (v2: converted to `cpu.weight`).
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs; `-1` for unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes.
    pub memory_limit: Option<i64>,
    /// Maximum number of pids.
    pub pids_limit: Option<i64>,
    /// hugetlb limits; `None` leaves them alone.
    pub hugepage_limits: Option<HugepageLimits>,
}

/// hugetlb limits of a cgroup (upstream `ResourceConfig.HugePageLimit`): every page size the
/// kernel offers is written, those not in `sizes` get `others` (upstream: 0 for pods and
/// `kubepods`, unbounded for the `QoS` cgroups). A negative value means unbounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HugepageLimits {
    /// runc page size name (`"2MB"`, see [`hugepage_unit_size`]) → limit in bytes.
    pub sizes: BTreeMap<String, i64>,
    /// The limit of page sizes not in `sizes`.
    pub others: i64,
}

impl HugepageLimits {
    /// No limit on any page size (upstream `setHugePagesUnbounded`).
    #[must_use]
    pub fn unbounded() -> Self {
        Self { sizes: BTreeMap::new(), others: -1 }
    }

    /// The limit of page size `unit` (`"2MB"`).
    #[must_use]
    pub fn limit(&self, unit: &str) -> i64 {
        self.sizes.get(unit).copied().unwrap_or(self.others)
    }
}

/// The Kubernetes resource name of a huge page size in bytes (`hugepages-2Mi`, as
/// upstream's `HugePageResourceName(resource.NewQuantity(size, BinarySI))`).
#[must_use]
pub fn hugepage_resource_name(page_bytes: u64) -> String {
    format!("{}{}", HUGEPAGES_PREFIX, quantity::binary_si(page_bytes))
}

/// The huge pages of the host: page size in bytes → bytes preallocated
/// (`nr_hugepages` × size of each `<dir>/hugepages-<n>kB`), as cAdvisor's machine info.
#[must_use]
pub fn host_hugepages(dir: &Path) -> BTreeMap<u64, u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let kib: u64 = e.file_name().to_str()?.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
            let pages: u64 = std::fs::read_to_string(e.path().join("nr_hugepages")).ok()?.trim().parse().ok()?;
            let size = kib.checked_mul(1024)?;
            Some((size, size.saturating_mul(pages)))
        })
        .collect()
}

/// The pod cgroup's hugetlb limits: its huge page requests (upstream `HugePageLimits`),
/// every other size 0.
fn pod_hugepage_limits(requests: &pod_resources::ResourceList) -> HugepageLimits {
    let sizes = requests
        .iter()
        .filter_map(|(name, q)| {
            let size = quantity::parse(name.strip_prefix(HUGEPAGES_PREFIX)?).ok()?.value()?;
            Some((hugepage_unit_size(u64::try_from(size).ok()?)?, q.value_saturating()))
        })
        .collect();
    HugepageLimits { sizes, others: 0 }
}

/// Computes the pod cgroup limits (`ResourceConfigForPod`).
///
/// cpu shares come from the summed requests; quota and period only when every container
/// (and every init container, counted with the sidecars it runs beside) has a cpu limit, or
/// the pod has a pod-level one; the memory limit likewise. `enforce_cpu_limits = false`
/// (`cpuCFSQuota: false`) writes an unlimited quota. Huge page limits are the pod's huge page
/// requests (0 for other sizes). `MemoryQoS` is not applied.
#[must_use]
pub fn resource_config_for_pod(pod: &Pod, enforce_cpu_limits: bool) -> PodResourceConfig {
    let requests = pod_resources::pod_requests(pod);
    let mut cpu_limits_declared = true;
    let mut memory_limits_declared = true;
    let limits = pod_resources::pod_limits_with(pod, |limits, _kind: ContainerKind| {
        if pod_resources::get(limits, CPU).is_zero() {
            cpu_limits_declared = false;
        }
        if pod_resources::get(limits, MEMORY).is_zero() {
            memory_limits_declared = false;
        }
    });
    if pod_resources::is_pod_level_resources_set(pod) {
        let pod_limits = pod_resources::pod_level_limits(pod);
        cpu_limits_declared |= !pod_resources::get(&pod_limits, CPU).is_zero();
        memory_limits_declared |= !pod_resources::get(&pod_limits, MEMORY).is_zero();
    }
    let cpu_request = pod_resources::get(&requests, CPU).milli_value_saturating();
    let cpu_limit = pod_resources::get(&limits, CPU).milli_value_saturating();
    let memory_limit = pod_resources::get(&limits, MEMORY).value_saturating();

    let cpu_shares = milli_cpu_to_shares(cpu_request);
    let cpu_quota = if enforce_cpu_limits { milli_cpu_to_quota(cpu_limit, QUOTA_PERIOD) } else { -1 };
    let cpu_period = QUOTA_PERIOD.unsigned_abs();
    match qos_class(pod) {
        QosClass::Guaranteed => PodResourceConfig {
            cpu_shares: Some(cpu_shares),
            cpu_quota: Some(cpu_quota),
            cpu_period: Some(cpu_period),
            memory_limit: Some(memory_limit),
            pids_limit: None,
            hugepage_limits: Some(pod_hugepage_limits(&requests)),
        },
        QosClass::Burstable => PodResourceConfig {
            cpu_shares: Some(cpu_shares),
            cpu_quota: cpu_limits_declared.then_some(cpu_quota),
            cpu_period: cpu_limits_declared.then_some(cpu_period),
            memory_limit: memory_limits_declared.then_some(memory_limit),
            pids_limit: None,
            hugepage_limits: Some(pod_hugepage_limits(&requests)),
        },
        // Upstream leaves `HugePageLimit` empty, which its cgroup manager writes as 0 for
        // every size.
        QosClass::BestEffort => PodResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            hugepage_limits: Some(HugepageLimits::default()),
            ..PodResourceConfig::default()
        },
    }
}

/// The kubelet settings that shape container resources (as `settings::container_resources`
/// takes them from the `KubeletConfiguration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerResourceSettings {
    /// `cpuCFSQuota`.
    pub cpu_cfs_quota: bool,
    /// `singleProcessOOMKill`; `None` (unset) keeps the probed default (true on cgroup
    /// v1, false on v2).
    pub single_process_oom_kill: Option<bool>,
    /// `memorySwap.swapBehavior` is `LimitedSwap` and the `NodeSwap` feature gate is on
    /// (its default).
    pub limited_swap: bool,
}

/// Host facts and kubelet settings that shape the CRI container resources.
#[expect(clippy::struct_excessive_bools, reason = "independent host facts and kubelet switches, as upstream")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerResourceOptions {
    /// Node memory capacity in bytes (cAdvisor's `MemoryCapacity`: `MemTotal`).
    pub memory_capacity: i64,
    /// Huge page sizes to bound (`"1GB"`, `"2MB"`), sorted like runc's `HugePageSizes()`.
    /// Empty when the runtime cannot set hugetlb limits: see [`Self::detect`].
    pub hugepage_sizes: Vec<String>,
    /// The node runs cgroup v2 in unified mode.
    pub cgroup_v2: bool,
    /// The kernel can limit swap (v1 `memory.memsw.*`, v2 `memory.swap.max`).
    pub swap_controller_available: bool,
    /// `KubeletConfiguration` `cpuCFSQuota` (default true).
    pub cpu_cfs_quota: bool,
    /// `KubeletConfiguration` `singleProcessOOMKill` (default: true on v1, false on v2).
    pub single_process_oom_kill: bool,
    /// `memorySwap.swapBehavior` is `LimitedSwap` and the `NodeSwap` gate is on (its
    /// default): Burstable containers get a share of the node's swap (cgroup v2 only).
    pub limited_swap: bool,
    /// The node's swap in bytes (`SwapTotal`; cAdvisor's `SwapCapacity`).
    pub swap_capacity: i64,
}

impl Default for ContainerResourceOptions {
    /// A cgroup v1 node with unknown (maximal) memory, no huge pages and no swap control.
    fn default() -> Self {
        Self {
            memory_capacity: i64::MAX,
            hugepage_sizes: Vec::new(),
            cgroup_v2: false,
            swap_controller_available: false,
            cpu_cfs_quota: true,
            single_process_oom_kill: true,
            limited_swap: false,
            swap_capacity: 0,
        }
    }
}

/// The first `<key>:` line of `/proc/meminfo` text, in bytes.
fn meminfo_bytes(meminfo: &str, key: &str) -> Option<i64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let mut fields = line.split_whitespace();
    let kib: i64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => kib.checked_mul(1024),
        None => Some(kib),
        Some(_) => None,
    }
}

/// Where [`ContainerResourceOptions::detect_from`] looks.
#[derive(Debug, Clone)]
pub struct HostPaths {
    /// `/proc/meminfo`.
    pub meminfo: PathBuf,
    /// `/proc/self/mountinfo`.
    pub mountinfo: PathBuf,
    /// `/proc/self/cgroup`.
    pub self_cgroup: PathBuf,
    /// `/sys/kernel/mm/hugepages`.
    pub hugepages: PathBuf,
    /// `/sys/fs/cgroup`.
    pub cgroup_fs_root: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self {
            meminfo: "/proc/meminfo".into(),
            mountinfo: "/proc/self/mountinfo".into(),
            self_cgroup: "/proc/self/cgroup".into(),
            hugepages: "/sys/kernel/mm/hugepages".into(),
            cgroup_fs_root: "/sys/fs/cgroup".into(),
        }
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_owned(), source })
}

/// Parses `MemTotal` (kB) out of `/proc/meminfo` into bytes.
#[must_use]
pub fn parse_meminfo_total(meminfo: &str) -> Option<i64> {
    meminfo_bytes(meminfo, "MemTotal")
}

/// Formats a byte size the way runc names hugetlb files (`HugePageUnitSizeFromByteSize`):
/// 2097152 → `"2MB"`. `None` when it is not a whole number of the largest fitting unit.
#[must_use]
pub fn hugepage_unit_size(mut size: u64) -> Option<String> {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut idx = 0;
    while size != 0 && size.is_multiple_of(1024) && idx < UNITS.len() - 1 {
        size /= 1024;
        idx += 1;
    }
    (size <= 1024 || idx == UNITS.len() - 1).then(|| format!("{size}{}", UNITS[idx]))
}

/// Page sizes listed under `/sys/kernel/mm/hugepages` (`hugepages-2048kB` → `"2MB"`),
/// sorted by directory name like runc.
fn host_hugepage_sizes(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    names
        .iter()
        .filter_map(|n| n.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse::<u64>().ok())
        .filter_map(|kib| hugepage_unit_size(kib.checked_mul(1024)?))
        .collect()
}

impl ContainerResourceOptions {
    /// Probes this host (see [`Self::detect_from`]).
    pub fn detect() -> Result<Self> {
        Self::detect_from(&HostPaths::default())
    }

    /// Probes a host: memory capacity, cgroup mode, swap controller and huge page sizes.
    ///
    /// Huge page sizes are listed only when the runtime can act on them: a v1 `hugetlb`
    /// hierarchy is mounted, or v2 offers the `hugetlb` controller. Upstream lists them
    /// unconditionally, but runc then fails every container on hybrid hosts where hugetlb
    /// is bound to the cgroup2 mount ("cannot set hugetlb limit: container could not join
    /// or create cgroup", seen on these machines).
    pub fn detect_from(paths: &HostPaths) -> Result<Self> {
        let meminfo = read(&paths.meminfo)?;
        let memory_capacity =
            parse_meminfo_total(&meminfo).ok_or_else(|| Error::NoMemTotal { path: paths.meminfo.clone() })?;
        let mounts = super::cgroupfs::mounts::parse_mountinfo(&read(&paths.mountinfo)?);
        let layout = super::cgroupfs::mounts::CgroupLayout::from_mounts(&mounts, &paths.cgroup_fs_root).ok();
        let cgroup_v2 = layout.as_ref().is_some_and(super::cgroupfs::mounts::CgroupLayout::is_unified);
        let hugetlb = layout.as_ref().is_some_and(|l| l.has_controller("hugetlb"));
        let swap_controller_available = if cgroup_v2 {
            // memory.swap.max does not exist in the root cgroup: look at our own cgroup.
            let own = read(&paths.self_cgroup)
                .ok()
                .and_then(|s| s.lines().find_map(|l| l.strip_prefix("0::").map(str::to_owned)))
                .unwrap_or_default();
            paths.cgroup_fs_root.join(own.trim_start_matches('/')).join("memory.swap.max").exists()
        } else {
            layout
                .as_ref()
                .and_then(|l| l.v1_mount_of("memory"))
                .is_some_and(|m| m.join("memory.memsw.limit_in_bytes").exists())
        };
        Ok(Self {
            memory_capacity,
            hugepage_sizes: if hugetlb { host_hugepage_sizes(&paths.hugepages) } else { Vec::new() },
            cgroup_v2,
            swap_controller_available,
            cpu_cfs_quota: true,
            single_process_oom_kill: !cgroup_v2,
            limited_swap: false,
            swap_capacity: meminfo_bytes(&meminfo, "SwapTotal").unwrap_or(0),
        })
    }

    /// These options with the kubelet's settings applied: `cpuCFSQuota`,
    /// `singleProcessOOMKill` (when set), `LimitedSwap`.
    #[must_use]
    pub fn with_settings(mut self, settings: &ContainerResourceSettings) -> Self {
        self.cpu_cfs_quota = settings.cpu_cfs_quota;
        if let Some(single) = settings.single_process_oom_kill {
            self.single_process_oom_kill = single;
        }
        self.limited_swap = settings.limited_swap;
        self
    }

    /// Probes this host once and applies the settings, for every later
    /// [`Self::host`]; a no-op when the options are already fixed.
    pub fn init_host(settings: &ContainerResourceSettings) {
        let options = Self::probe().with_settings(settings);
        if HOST_OPTIONS.set(options).is_err() {
            tracing::warn!("container resource options were fixed before the configuration was applied");
        }
    }

    fn probe() -> Self {
        Self::detect().unwrap_or_else(|error| {
            tracing::error!(%error, "cannot probe node resources; using defaults for container resources");
            Self::default()
        })
    }

    /// The options of this host: as [`Self::init_host`] fixed them, else probed once
    /// with the kubelet defaults; on failure, logged once and [`Default`] is used
    /// (Burstable containers then get an OOM score adjustment of 999).
    pub fn host() -> &'static Self {
        HOST_OPTIONS.get_or_init(Self::probe)
    }
}

static HOST_OPTIONS: OnceLock<ContainerResourceOptions> = OnceLock::new();

/// OOM score adjustment of Guaranteed and node-critical containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// OOM score adjustment of `BestEffort` containers.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// OOM score adjustment the kubelet gives itself.
pub const KUBELET_OOM_SCORE_ADJ: i64 = -999;

fn is_sidecar(pod: &Pod, container: &Container) -> bool {
    pod_resources::is_restartable_init_container(container)
        && pod.spec.as_ref().is_some_and(|s| s.init_containers.iter().flatten().any(|c| c.name == container.name))
}

fn memory_request(c: &Container) -> i64 {
    pod_resources::get(&pod_resources::container_requests(c), MEMORY).value_saturating()
}

/// Pod-level memory request not claimed by containers, split evenly over all containers
/// (`remainingPodMemReqPerContainer`, KEP-2837).
fn remaining_pod_memory_request_per_container(pod: &Pod) -> i64 {
    let pod_request = pod_resources::get(&pod_resources::pod_level_requests(pod), MEMORY);
    if pod_request.is_zero() {
        return 0;
    }
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let containers = spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len);
    if containers == 0 {
        return 0;
    }
    // Aggregated container requests without the pod-level override or the overhead.
    let mut without_pod_level = pod.clone();
    if let Some(s) = without_pod_level.spec.as_mut() {
        s.resources = None;
        s.overhead = None;
    }
    let claimed = pod_resources::get(&pod_resources::pod_requests(&without_pod_level), MEMORY).value_saturating();
    (pod_request.value_saturating() - claimed) / containers as i64
}

/// The container's `oom_score_adj` (`GetContainerOOMScoreAdjust`).
///
/// Node-critical and Guaranteed: -997; `BestEffort`: 1000; Burstable:
/// `1000 - 1000 * memoryRequest / memoryCapacity` (plus an even share of any unclaimed
/// pod-level request; a sidecar never above the smallest regular container), clamped to
/// `[3, 999]` so Burstable stays between the other two.
#[must_use]
pub fn oom_score_adjust(pod: &Pod, container: &Container, memory_capacity: i64) -> i64 {
    if is_node_critical_pod(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos_class(pod) {
        QosClass::Guaranteed => return GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    let capacity = i128::from(memory_capacity.max(1));
    let score = |request: i64| -> i64 {
        let adj = 1000 - (1000 * i128::from(request)) / capacity;
        adj.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    };
    let pod_level = pod_resources::is_pod_level_requests_set(pod);
    let remaining = if pod_level { remaining_pod_memory_request_per_container(pod) } else { 0 };
    let mut adj = score(memory_request(container).saturating_add(remaining));
    if is_sidecar(pod, container) {
        let min_regular = pod.spec.as_ref().and_then(|s| s.containers.iter().map(memory_request).min());
        if let Some(min_regular) = min_regular {
            adj = adj.min(score(min_regular.saturating_add(remaining)));
        }
    }
    adj.clamp(1000 + GUARANTEED_OOM_SCORE_ADJ, BEST_EFFORT_OOM_SCORE_ADJ - 1)
}

/// Huge page limits for the container: every page size in `sizes` bounded to 0 unless the
/// container has a `hugepages-<size>` limit (`GetHugepageLimitsFromResources`).
fn hugepage_limits(container: &Container, sizes: &[String]) -> Vec<HugepageLimit> {
    let mut wanted = BTreeMap::new();
    for (name, q) in pod_resources::container_limits(container) {
        let Some(size) = name.strip_prefix(HUGEPAGES_PREFIX) else {
            continue;
        };
        let bytes = quantity::parse(size).ok().and_then(quantity::ParsedQuantity::value);
        let Some(bytes) = bytes.and_then(|b| u64::try_from(b).ok()) else {
            continue;
        };
        if let (Some(page), Some(limit)) = (hugepage_unit_size(bytes), q.value()) {
            wanted.insert(page, u64::try_from(limit).unwrap_or(0));
        }
    }
    sizes
        .iter()
        .map(|page| HugepageLimit { page_size: page.clone(), limit: wanted.get(page).copied().unwrap_or(0) })
        .collect()
}

/// The CRI resources of `container` in `pod`, with this host's facts
/// ([`ContainerResourceOptions::host`]).
#[must_use]
pub fn linux_container_resources(pod: &Pod, container: &Container) -> LinuxContainerResources {
    linux_container_resources_with(pod, container, ContainerResourceOptions::host())
}

/// The swap a container may use under `LimitedSwap` (upstream `GetContainerSwapBehavior` +
/// `calcSwapForBurstablePods`): only containers of Burstable, non-critical pods whose memory
/// request is set and below their limit, on cgroup v2, get
/// request / node memory × node swap; `None` means no swap.
fn limited_swap(pod: &Pod, container: &Container, options: &ContainerResourceOptions) -> Option<i64> {
    if !options.limited_swap || !options.cgroup_v2 || is_critical_pod(pod) || qos_class(pod) != QosClass::Burstable {
        return None;
    }
    let request = pod_resources::get(&pod_resources::container_requests(container), MEMORY);
    let limit = pod_resources::get(&pod_resources::container_limits(container), MEMORY);
    if (request.is_zero() && limit.is_zero()) || request == limit {
        return None;
    }
    let (request, node) = (request.value_saturating(), options.memory_capacity);
    if node <= 0 || request > node {
        tracing::error!(request, node, "cannot calculate swap allocation amount; disallowing swap");
        return None;
    }
    #[expect(clippy::cast_precision_loss, clippy::cast_possible_truncation, reason = "upstream computes in float64")]
    let swap = (request as f64 / node as f64 * options.swap_capacity as f64) as i64;
    Some(swap)
}

/// The CRI resources of `container` in `pod` (`generateLinuxContainerResources`).
///
/// - `cpu_shares`: from the cpu request, or from the cpu limit when there is no request
///   (2 when neither);
/// - `cpu_period` 100000 and `cpu_quota` from the limit (0 = none) when `cpuCFSQuota`;
/// - `memory_limit_in_bytes` from the limit (0 = none); a container without its own cpu or
///   memory limit inherits the pod-level one;
/// - `oom_score_adj` per [`oom_score_adjust`] (passed even where containerd runs with
///   `restrict_oom_score_adj`, which then raises it to its own floor);
/// - `hugepage_limits` per [`ContainerResourceOptions::hugepage_sizes`];
/// - swap, when the kernel has a swap controller: on v1 none
///   (`memory_swap_limit_in_bytes = memory_limit_in_bytes`); on v2 `memory.swap.max` is 0,
///   or a Burstable container's share of the node's swap under `LimitedSwap`;
/// - v2 unless `singleProcessOOMKill`: `memory.oom.group = 1`.
#[must_use]
pub fn linux_container_resources_with(
    pod: &Pod,
    container: &Container,
    options: &ContainerResourceOptions,
) -> LinuxContainerResources {
    let raw_requests = pod_resources::container_raw_requests(container);
    let limits = pod_resources::container_limits(container);
    let mut cpu_limit = pod_resources::get(&limits, CPU);
    let mut memory_limit = pod_resources::get(&limits, MEMORY);
    if pod_resources::is_pod_level_resources_set(pod) {
        let pod_limits = pod_resources::pod_level_limits(pod);
        if cpu_limit.is_zero() {
            cpu_limit = pod_resources::get(&pod_limits, CPU);
        }
        if memory_limit.is_zero() {
            memory_limit = pod_resources::get(&pod_limits, MEMORY);
        }
    }
    // Upstream checks for a missing request *key*: an explicit "0" request stays 0 (2
    // shares) even with a limit.
    let cpu_shares = match raw_requests.get(CPU) {
        Some(request) => milli_cpu_to_shares(request.milli_value_saturating()),
        None => milli_cpu_to_shares(cpu_limit.milli_value_saturating()),
    };
    let mut resources = LinuxContainerResources {
        cpu_shares: i64::try_from(cpu_shares).unwrap_or(i64::MAX),
        memory_limit_in_bytes: memory_limit.value_saturating(),
        ..LinuxContainerResources::default()
    };
    if options.cpu_cfs_quota {
        resources.cpu_period = QUOTA_PERIOD;
        resources.cpu_quota = milli_cpu_to_quota(cpu_limit.milli_value_saturating(), QUOTA_PERIOD);
    }
    resources.oom_score_adj = oom_score_adjust(pod, container, options.memory_capacity);
    resources.hugepage_limits = hugepage_limits(container, &options.hugepage_sizes);
    let mut unified = HashMap::new();
    if options.swap_controller_available {
        if options.cgroup_v2 {
            let swap = limited_swap(pod, container, options).unwrap_or(0);
            unified.insert("memory.swap.max".to_owned(), swap.to_string());
        } else {
            // No swap beyond the memory limit (upstream: swap needs cgroup v2).
            resources.memory_swap_limit_in_bytes = resources.memory_limit_in_bytes;
        }
    }
    if options.cgroup_v2 && !options.single_process_oom_kill {
        // Kill the whole container on OOM rather than one process of it.
        unified.insert("memory.oom.group".to_owned(), "1".to_owned());
    }
    resources.unified = unified;
    resources
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::pod::CONFIG_SOURCE_ANNOTATION;
    use crate::types::pod_resources::test_pods::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use std::fmt::Write as _;

    const GIB: i64 = 1 << 30;

    #[test]
    fn shares() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(2), 2);
        assert_eq!(milli_cpu_to_shares(3), 3);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(500), 512);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(256_000), 262_144);
        assert_eq!(milli_cpu_to_shares(300_000), 262_144);
        assert_eq!(milli_cpu_to_shares(i64::MAX), 262_144);
        assert_eq!(milli_cpu_to_shares(-5), 2);
    }

    #[test]
    fn quota() {
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD), 0);
        assert_eq!(milli_cpu_to_quota(1, QUOTA_PERIOD), 1000, "at least 1ms");
        assert_eq!(milli_cpu_to_quota(9, QUOTA_PERIOD), 1000);
        assert_eq!(milli_cpu_to_quota(10, QUOTA_PERIOD), 1000);
        assert_eq!(milli_cpu_to_quota(11, QUOTA_PERIOD), 1100);
        assert_eq!(milli_cpu_to_quota(250, QUOTA_PERIOD), 25_000);
        assert_eq!(milli_cpu_to_quota(1000, QUOTA_PERIOD), 100_000);
        assert_eq!(milli_cpu_to_quota(2500, QUOTA_PERIOD), 250_000);
        assert_eq!(milli_cpu_to_quota(200, 50_000), 10_000);
    }

    #[test]
    fn limited_swap_gives_burstable_containers_their_share() {
        let v2 = ContainerResourceOptions {
            memory_capacity: 8 * GIB,
            cgroup_v2: true,
            swap_controller_available: true,
            limited_swap: true,
            swap_capacity: 4 * GIB,
            ..ContainerResourceOptions::default()
        };
        let swap = |p: &Pod, o: &ContainerResourceOptions| {
            linux_container_resources_with(p, &p.spec.as_ref().unwrap().containers[0], o).unified["memory.swap.max"]
                .clone()
        };
        // Burstable, request 1Gi of 8Gi: an eighth of the 4Gi swap.
        let b = pod("b", vec![ctr("a", &[("memory", "1Gi")], &[("memory", "2Gi")])]);
        assert_eq!(swap(&b, &v2), (GIB / 2).to_string());
        // Request equal to the limit, no memory request, Guaranteed, critical: none.
        let eq = pod("e", vec![ctr("a", &[("cpu", "100m"), ("memory", "1Gi")], &[("memory", "1Gi")])]);
        let none = pod("n", vec![ctr("a", &[("cpu", "100m")], &[])]);
        let g = pod("g", vec![ctr("a", &[], &[("cpu", "1"), ("memory", "1Gi")])]);
        let mut critical = b.clone();
        critical.spec.as_mut().unwrap().priority = Some(2_000_000_000);
        for p in [&eq, &none, &g, &critical] {
            assert_eq!(swap(p, &v2), "0", "{:?}", p.metadata.name);
        }
        // NoSwap (the default behaviour): none.
        assert_eq!(swap(&b, &ContainerResourceOptions { limited_swap: false, ..v2.clone() }), "0");
        // cgroup v1: never, the swap limit is the memory limit.
        let v1 = ContainerResourceOptions { cgroup_v2: false, ..v2 };
        let r = linux_container_resources_with(&b, &b.spec.as_ref().unwrap().containers[0], &v1);
        assert_eq!(r.memory_swap_limit_in_bytes, 2 * GIB);
    }

    #[test]
    fn the_configuration_shapes_the_host_options() {
        let kc = crate::config::KubeletConfiguration {
            cpu_cfs_quota: false,
            single_process_oom_kill: Some(false),
            memory_swap: crate::config::MemorySwapConfiguration { swap_behavior: "LimitedSwap".into() },
            ..crate::config::KubeletConfiguration::default()
        };
        let o = ContainerResourceOptions::default().with_settings(&crate::settings::container_resources(&kc));
        assert!(!o.cpu_cfs_quota && !o.single_process_oom_kill && o.limited_swap);
        let mut gated = kc.clone();
        gated.feature_gates.insert("NodeSwap".into(), false);
        assert!(
            !ContainerResourceOptions::default()
                .with_settings(&crate::settings::container_resources(&gated))
                .limited_swap
        );
        let unset = crate::config::KubeletConfiguration::default();
        let o = ContainerResourceOptions { single_process_oom_kill: false, ..ContainerResourceOptions::default() }
            .with_settings(&crate::settings::container_resources(&unset));
        assert!(o.cpu_cfs_quota && !o.single_process_oom_kill && !o.limited_swap, "defaults keep the probed values");
    }

    #[test]
    fn host_hugepages_reads_preallocated_pages() {
        let dir = tempfile::tempdir().unwrap();
        for (name, nr) in [("hugepages-2048kB", "3\n"), ("hugepages-1048576kB", "0\n"), ("stray", "1\n")] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("nr_hugepages"), nr).unwrap();
        }
        assert_eq!(host_hugepages(dir.path()), BTreeMap::from([(2 << 20, 6 << 20), (1 << 30, 0)]));
        assert!(host_hugepages(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn weights() {
        assert_eq!(cpu_shares_to_cpu_weight(2), 1);
        assert_eq!(cpu_shares_to_cpu_weight(1024), 39);
        assert_eq!(cpu_shares_to_cpu_weight(102), 4);
        assert_eq!(cpu_shares_to_cpu_weight(262_143), 9999);
        assert_eq!(cpu_shares_to_cpu_weight(262_144), 10_000);
        assert_eq!(cpu_shares_to_cpu_weight(0), 1);
    }

    #[test]
    fn pod_config_per_qos() {
        let guaranteed = pod("g", vec![ctr("a", &[], &[("cpu", "500m"), ("memory", "256Mi")])]);
        assert_eq!(
            resource_config_for_pod(&guaranteed, true),
            PodResourceConfig {
                cpu_shares: Some(512),
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory_limit: Some(256 << 20),
                pids_limit: None,
                hugepage_limits: Some(HugepageLimits::default()),
            }
        );
        let best_effort = pod("b", vec![ctr("a", &[], &[])]);
        assert_eq!(
            resource_config_for_pod(&best_effort, true),
            PodResourceConfig {
                cpu_shares: Some(2),
                hugepage_limits: Some(HugepageLimits::default()),
                ..PodResourceConfig::default()
            }
        );
        // Burstable: all containers limit cpu, one lacks a memory limit.
        let burstable = pod(
            "u",
            vec![
                ctr("a", &[("cpu", "100m")], &[("cpu", "1"), ("memory", "1Gi")]),
                ctr("b", &[("cpu", "200m")], &[("cpu", "1")]),
            ],
        );
        assert_eq!(
            resource_config_for_pod(&burstable, true),
            PodResourceConfig {
                cpu_shares: Some(milli_cpu_to_shares(300)),
                cpu_quota: Some(200_000),
                cpu_period: Some(100_000),
                memory_limit: None,
                pids_limit: None,
                hugepage_limits: Some(HugepageLimits::default()),
            }
        );
        // Burstable without cpu limits anywhere: shares only.
        let requests_only = pod("u", vec![ctr("a", &[("cpu", "250m"), ("memory", "64Mi")], &[])]);
        assert_eq!(
            resource_config_for_pod(&requests_only, true),
            PodResourceConfig {
                cpu_shares: Some(256),
                hugepage_limits: Some(HugepageLimits::default()),
                ..PodResourceConfig::default()
            }
        );
        // Huge page requests become the pod's hugetlb limits (`hugepages-2Mi` → `2MB`).
        let huge = pod("h", vec![ctr("a", &[], &[("cpu", "1"), ("memory", "1Gi"), ("hugepages-2Mi", "6Mi")])]);
        assert_eq!(
            resource_config_for_pod(&huge, true).hugepage_limits,
            Some(HugepageLimits { sizes: [("2MB".to_owned(), 6 << 20)].into(), others: 0 })
        );
        assert_eq!(hugepage_resource_name(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepage_resource_name(1 << 30), "hugepages-1Gi");
        assert_eq!(hugepage_resource_name(64 << 10), "hugepages-64Ki");
        // cpuCFSQuota=false: the quota is explicitly unlimited.
        assert_eq!(resource_config_for_pod(&guaranteed, false).cpu_quota, Some(-1));
    }

    #[test]
    fn pod_config_init_containers_and_pod_level() {
        // An init container without a memory limit drops the pod memory limit.
        let p = pod_with_init(
            "u",
            vec![ctr("init", &[("cpu", "100m")], &[("cpu", "1")])],
            vec![ctr("a", &[("cpu", "100m")], &[("cpu", "1"), ("memory", "1Gi")])],
        );
        let cfg = resource_config_for_pod(&p, true);
        assert_eq!(cfg.memory_limit, None);
        assert_eq!(cfg.cpu_quota, Some(100_000), "max(init, sum) of limits");
        // Pod-level limits declare limits even when containers have none.
        let p = with_pod_resources(
            pod("u", vec![ctr("a", &[], &[])]),
            &[("cpu", "500m"), ("memory", "128Mi")],
            &[("cpu", "2"), ("memory", "1Gi")],
        );
        let cfg = resource_config_for_pod(&p, true);
        assert_eq!(cfg.cpu_shares, Some(512));
        assert_eq!(cfg.cpu_quota, Some(200_000));
        assert_eq!(cfg.memory_limit, Some(GIB));
    }

    fn opts() -> ContainerResourceOptions {
        ContainerResourceOptions { memory_capacity: 10 * GIB, ..ContainerResourceOptions::default() }
    }

    #[test]
    fn container_resources_basic() {
        let c = ctr("a", &[("cpu", "250m"), ("memory", "1Gi")], &[("cpu", "500m"), ("memory", "2Gi")]);
        let p = pod("u", vec![c.clone()]);
        let r = linux_container_resources_with(&p, &c, &opts());
        assert_eq!(r.cpu_shares, 256);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.memory_limit_in_bytes, 2 * GIB);
        assert_eq!(r.oom_score_adj, 900, "1000 - 1000 * 1Gi / 10Gi");
        assert!(r.hugepage_limits.is_empty());
        assert!(r.unified.is_empty());
        assert_eq!(r.memory_swap_limit_in_bytes, 0);
    }

    #[test]
    fn container_resources_defaults() {
        // No request: shares from the limit. No limit: 2 shares, quota 0, period still set.
        let c = ctr("a", &[], &[("cpu", "2")]);
        let r = linux_container_resources_with(&pod("u", vec![c.clone()]), &c, &opts());
        assert_eq!((r.cpu_shares, r.cpu_quota, r.cpu_period), (2048, 200_000, 100_000));
        let c = ctr("a", &[], &[]);
        let r = linux_container_resources_with(&pod("u", vec![c.clone()]), &c, &opts());
        assert_eq!((r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit_in_bytes), (2, 0, 100_000, 0));
        assert_eq!(r.oom_score_adj, 1000);
        // An explicit zero request is kept.
        let c = ctr("a", &[("cpu", "0")], &[("cpu", "1")]);
        let r = linux_container_resources_with(&pod("u", vec![c.clone()]), &c, &opts());
        assert_eq!(r.cpu_shares, 2);
        // cpuCFSQuota=false: neither period nor quota.
        let c = ctr("a", &[], &[("cpu", "1")]);
        let off = ContainerResourceOptions { cpu_cfs_quota: false, ..opts() };
        let r = linux_container_resources_with(&pod("u", vec![c.clone()]), &c, &off);
        assert_eq!((r.cpu_quota, r.cpu_period), (0, 0));
    }

    #[test]
    fn container_resources_pod_level_fallback() {
        let c = ctr("a", &[], &[]);
        let p = with_pod_resources(pod("u", vec![c.clone()]), &[], &[("cpu", "1"), ("memory", "1Gi")]);
        let r = linux_container_resources_with(&p, &c, &opts());
        assert_eq!((r.cpu_quota, r.memory_limit_in_bytes, r.cpu_shares), (100_000, GIB, 1024));
    }

    #[test]
    fn container_resources_swap_oom_group_hugepages() {
        let c = ctr("a", &[("memory", "1Gi")], &[("memory", "1Gi"), ("hugepages-2Mi", "4Mi")]);
        let p = pod("u", vec![c.clone()]);
        let v1 = ContainerResourceOptions {
            swap_controller_available: true,
            hugepage_sizes: vec!["1GB".into(), "2MB".into()],
            ..opts()
        };
        let r = linux_container_resources_with(&p, &c, &v1);
        assert_eq!(r.memory_swap_limit_in_bytes, GIB);
        assert!(r.unified.is_empty());
        assert_eq!(
            r.hugepage_limits,
            vec![
                HugepageLimit { page_size: "1GB".into(), limit: 0 },
                HugepageLimit { page_size: "2MB".into(), limit: 4 << 20 },
            ]
        );
        let v2 = ContainerResourceOptions { cgroup_v2: true, single_process_oom_kill: false, ..v1 };
        let r = linux_container_resources_with(&p, &c, &v2);
        assert_eq!(r.memory_swap_limit_in_bytes, 0);
        assert_eq!(r.unified.get("memory.swap.max").map(String::as_str), Some("0"));
        assert_eq!(r.unified.get("memory.oom.group").map(String::as_str), Some("1"));
    }

    #[test]
    fn oom_score() {
        let cap = 10 * GIB;
        let g = ctr("a", &[], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(oom_score_adjust(&pod("u", vec![g.clone()]), &g, cap), -997);
        let be = ctr("a", &[], &[]);
        assert_eq!(oom_score_adjust(&pod("u", vec![be.clone()]), &be, cap), 1000);
        // Burstable edge cases: no memory request → 1000 → 999; all memory → 3.
        let b = ctr("a", &[("cpu", "1")], &[]);
        assert_eq!(oom_score_adjust(&pod("u", vec![b.clone()]), &b, cap), 999);
        let huge = ctr("a", &[("memory", "20Gi")], &[]);
        assert_eq!(oom_score_adjust(&pod("u", vec![huge.clone()]), &huge, cap), 3);
        let tenth = ctr("a", &[("memory", "1Gi")], &[]);
        assert_eq!(oom_score_adjust(&pod("u", vec![tenth.clone()]), &tenth, cap), 900);
        let tiny = ctr("a", &[("memory", "1")], &[]);
        assert_eq!(oom_score_adjust(&pod("u", vec![tiny.clone()]), &tiny, cap), 999);
        // Status QoS wins: a spec that computes Burstable but says Guaranteed.
        let mut p = pod("u", vec![tenth.clone()]);
        p.status = Some(PodStatus { qos_class: Some("Guaranteed".into()), ..PodStatus::default() });
        assert_eq!(oom_score_adjust(&p, &tenth, cap), -997);
    }

    #[test]
    fn oom_score_node_critical() {
        let b = ctr("a", &[("memory", "1Gi")], &[]);
        let mut p = pod("u", vec![b.clone()]);
        let spec = p.spec.as_mut().unwrap();
        spec.priority_class_name = Some("system-node-critical".into());
        assert_eq!(oom_score_adjust(&p, &b, 10 * GIB), 900, "the class alone is not enough");
        p.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        assert_eq!(oom_score_adjust(&p, &b, 10 * GIB), -997);
        let mut static_pod = pod("u", vec![b.clone()]);
        static_pod.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        static_pod.metadata.annotations = Some([(CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned())].into());
        assert!(is_critical_pod(&static_pod));
        assert_eq!(oom_score_adjust(&static_pod, &b, 10 * GIB), -997);
        static_pod.metadata.annotations = Some([(CONFIG_SOURCE_ANNOTATION.to_owned(), "api".to_owned())].into());
        assert!(!is_critical_pod(&static_pod));
    }

    #[test]
    fn oom_score_sidecar_not_above_regular() {
        let cap = 10 * GIB;
        let s = sidecar("s", &[("memory", "100Mi")], &[]);
        let a = ctr("a", &[("memory", "2Gi")], &[]);
        let b = ctr("b", &[("memory", "1Gi")], &[]);
        let p = pod_with_init("u", vec![s.clone()], vec![a.clone(), b.clone()]);
        assert_eq!(oom_score_adjust(&p, &a, cap), 800);
        assert_eq!(oom_score_adjust(&p, &b, cap), 900);
        assert_eq!(oom_score_adjust(&p, &s, cap), 900, "the sidecar is scored like the smallest regular container");
        let big_sidecar = sidecar("s", &[("memory", "3Gi")], &[]);
        let p = pod_with_init("u", vec![big_sidecar.clone()], vec![a.clone(), b]);
        assert_eq!(oom_score_adjust(&p, &big_sidecar, cap), 700, "its own request when larger");
    }

    #[test]
    fn oom_score_pod_level_remaining_request() {
        let cap = 10 * GIB;
        let a = ctr("a", &[("memory", "1Gi")], &[]);
        let b = ctr("b", &[], &[]);
        let p = with_pod_resources(pod("u", vec![a.clone(), b.clone()]), &[("memory", "3Gi")], &[]);
        // 2Gi unclaimed, 1Gi each.
        assert_eq!(oom_score_adjust(&p, &a, cap), 800);
        assert_eq!(oom_score_adjust(&p, &b, cap), 900);
    }

    #[test]
    fn meminfo_and_hugepage_names() {
        let meminfo = "MemTotal:       24684092 kB\nMemFree:        1 kB\n";
        assert_eq!(parse_meminfo_total(meminfo), Some(24_684_092 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(hugepage_unit_size(2048 * 1024).as_deref(), Some("2MB"));
        assert_eq!(hugepage_unit_size(1_048_576 * 1024).as_deref(), Some("1GB"));
        assert_eq!(hugepage_unit_size(64 * 1024).as_deref(), Some("64KB"));
        assert_eq!(hugepage_unit_size(3000), None);
    }

    #[test]
    fn detect_from_fixture_host() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let cg = root.join("cgroup");
        for sub in ["memory", "cpu", "unified"] {
            std::fs::create_dir_all(cg.join(sub)).unwrap();
        }
        std::fs::write(cg.join("memory/memory.memsw.limit_in_bytes"), "").unwrap();
        std::fs::write(cg.join("unified/cgroup.controllers"), "hugetlb\n").unwrap();
        std::fs::create_dir_all(root.join("hugepages/hugepages-2048kB")).unwrap();
        std::fs::create_dir_all(root.join("hugepages/hugepages-1048576kB")).unwrap();
        std::fs::write(root.join("meminfo"), "MemTotal: 1024 kB\n").unwrap();
        let c = cg.display();
        std::fs::write(
            root.join("mountinfo"),
            format!(
                "32 31 0:29 / {c}/cpu rw - cgroup cgroup rw,cpu\n\
                 35 31 0:32 / {c}/memory rw - cgroup cgroup rw,memory\n\
                 41 31 0:38 / {c}/unified rw - cgroup2 cgroup2 rw\n"
            ),
        )
        .unwrap();
        std::fs::write(root.join("self_cgroup"), "0::/\n").unwrap();
        let paths = HostPaths {
            meminfo: root.join("meminfo"),
            mountinfo: root.join("mountinfo"),
            self_cgroup: root.join("self_cgroup"),
            hugepages: root.join("hugepages"),
            cgroup_fs_root: cg.clone(),
        };
        let o = ContainerResourceOptions::detect_from(&paths).unwrap();
        assert_eq!(o.memory_capacity, 1024 * 1024);
        assert!(!o.cgroup_v2);
        assert!(o.swap_controller_available);
        assert!(o.single_process_oom_kill);
        assert!(o.hugepage_sizes.is_empty(), "hugetlb lives on the cgroup2 mount of a hybrid host");
        // With a v1 hugetlb hierarchy, the host's page sizes are listed, sorted by name.
        std::fs::create_dir_all(cg.join("hugetlb")).unwrap();
        let mut mountinfo = std::fs::read_to_string(&paths.mountinfo).unwrap();
        writeln!(mountinfo, "42 31 0:39 / {c}/hugetlb rw - cgroup cgroup rw,hugetlb").unwrap();
        std::fs::write(&paths.mountinfo, mountinfo).unwrap();
        let o = ContainerResourceOptions::detect_from(&paths).unwrap();
        assert_eq!(o.hugepage_sizes, vec!["1GB".to_owned(), "2MB".to_owned()]);
    }

    #[test]
    fn detect_this_host() {
        // These machines are hybrid v1 with swap accounting compiled in.
        let o = ContainerResourceOptions::detect().unwrap();
        assert!(o.memory_capacity > 0);
    }
}
