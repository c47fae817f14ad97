//! Container manager: `QoS` classes, resource math and pod cgroups (upstream `pkg/kubelet/cm`).
//!
//! Public API:
//! - [`qos_class`] / [`QosClass`]: a pod's `QoS` class (`GetPodQOS`);
//! - [`linux_container_resources`]: the CRI `LinuxContainerResources` of a container (cpu
//!   shares and CFS quota, memory limit, `oom_score_adj`, swap, huge pages);
//! - [`PodContainerManager`]: the pod cgroups (`kubepods/{burstable,besteffort}/pod<uid>`) and
//!   their limits, with [`CgroupfsPodContainerManager`] for the cgroupfs and systemd drivers
//!   on cgroup v1 (legacy or hybrid) and v2 (under systemd the cgroups are slices made
//!   through [`systemd_dbus`], named by [`systemd_names`]), and [`FakePodContainerManager`]
//!   for other modules' tests;
//! - [`pod_resources`]: pod request and limit totals (`PodRequests`/`PodLimits`);
//!   [`resources`]: the shares/quota/OOM math.
//!
//! Order of calls, as in the kubelet: [`PodContainerManager::ensure_node_cgroups`] once at
//! start; per pod, [`PodContainerManager::ensure_pod_cgroup`] before `RunPodSandbox` with
//! [`PodContainerManager::cgroup_parent`] as the sandbox's `cgroup_parent`;
//! [`PodContainerManager::update_qos_cgroups`] when the set of active pods changes;
//! [`PodContainerManager::remove_pod_cgroup`] once the pod's containers are gone (and for
//! orphans found by [`PodContainerManager::list_pod_cgroups`] during housekeeping).
//!
//! Node allocatable enforcement ([`allocatable`]) happens in
//! [`PodContainerManager::ensure_node_cgroups`], huge page (hugetlb) limits on `kubepods`,
//! the `QoS` cgroups (unbounded) and pod cgroups (the pod's huge page requests) too, where
//! the hugetlb controller is on. The resource managers: [`cpumanager`], [`memorymanager`],
//! [`devicemanager`] and the [`topology`] manager that aligns them at admission, over the
//! [`machine_topology`] read from sysfs. `MemoryQoS` is not implemented.
//!
//! Quantities, resource names and the critical pod tests this module uses are in the
//! [`crate::types`] leaf, which every module shares.

pub mod allocatable;
pub mod cgroupfs;
pub mod checkpoint;
pub mod container_lifecycle;
pub mod cpumanager;
pub mod devicemanager;
pub mod fake;
pub mod machine_topology;
pub mod memorymanager;
pub mod metrics;
pub mod resource_managers;
pub mod resources;
pub mod systemd_dbus;
pub mod systemd_names;
pub mod topology;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;

use crate::types::pod_resources;
use crate::types::qos::QosClass;

pub use cgroupfs::{CgroupMode, CgroupfsPodContainerManager};
pub use fake::FakePodContainerManager;
pub use resources::linux_container_resources;

/// Errors of the container manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cgroup operation failed.
    #[error(transparent)]
    Cgroup(#[from] cgroupfs::Error),
    /// Probing the host failed.
    #[error(transparent)]
    Resources(#[from] resources::Error),
    /// A quantity does not parse.
    #[error(transparent)]
    Quantity(#[from] crate::types::quantity::Error),
    /// A quantity in a pod spec does not parse.
    #[error(transparent)]
    InvalidQuantity(#[from] pod_resources::InvalidQuantity),
    /// Swap is on and `failSwapOn` is true (upstream's message).
    #[error(
        "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false. /proc/swaps contained: {lines:?}"
    )]
    SwapOn {
        /// The lines of `/proc/swaps`.
        lines: Vec<String>,
    },
    /// A failure injected into [`FakePodContainerManager`]; never produced otherwise.
    #[error("injected failure in {op}: {message}")]
    Injected {
        /// The operation that failed.
        op: &'static str,
        /// The injected message.
        message: String,
    },
}

/// `failSwapOn` (upstream's check in `NewContainerManager`): with the text of
/// `/proc/swaps`, swap is on when it has more lines than its header.
///
/// # Errors
/// [`Error::SwapOn`] when swap is on.
pub fn check_swap(proc_swaps: &str) -> Result<()> {
    let lines: Vec<String> = proc_swaps.trim().lines().map(str::to_owned).collect();
    if lines.len() > 1 {
        return Err(Error::SwapOn { lines });
    }
    Ok(())
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Pod cgroup settings (the `cgroup*` fields of `KubeletConfiguration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupConfig {
    /// `cgroupRoot`: the cgroup under which `kubepods` lives. Default `"/"`; an empty value
    /// means `"/"` (as the kubelet does when `cgroupsPerQOS` is on). It must exist already.
    pub cgroup_root: String,
    /// `cgroupsPerQOS`: create the `QoS` and pod cgroups. Default true. When false, the
    /// kubelet creates no cgroups at all: the sandbox's `cgroup_parent` is empty and the
    /// runtime places containers where it likes; every operation is a no-op.
    pub cgroups_per_qos: bool,
    /// `cgroupDriver`: `"cgroupfs"` (the default) or `"systemd"` (slices made through
    /// systemd's D-Bus API, [`systemd_dbus`]).
    pub cgroup_driver: String,
    /// `podPidsLimit`: maximum pids per pod; -1 (the default) or 0 for unlimited.
    pub pod_pids_limit: i64,
    /// Where the cgroup filesystems are mounted. Default `/sys/fs/cgroup`.
    pub fs_root: PathBuf,
    /// `cpuCFSQuota`: enforce cpu limits with CFS quota. Default true.
    pub cpu_cfs_quota: bool,
    /// Node allocatable enforcement ([`allocatable::plan`]). Default: none.
    pub enforcement: allocatable::Enforcement,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        Self {
            cgroup_root: "/".to_owned(),
            cgroups_per_qos: true,
            cgroup_driver: "cgroupfs".to_owned(),
            pod_pids_limit: -1,
            fs_root: PathBuf::from("/sys/fs/cgroup"),
            cpu_cfs_quota: true,
            enforcement: allocatable::Enforcement::default(),
        }
    }
}

/// Pod-level cgroup management (upstream `PodContainerManager` + the `QoS` container
/// manager). Operations touch the filesystem and may block briefly (removal waits up to a
/// couple of seconds for killed processes to leave): call them from a blocking context.
pub trait PodContainerManager: Send + Sync + std::fmt::Debug {
    /// Creates `<cgroupRoot>/kubepods` and its `burstable` and `besteffort` children in
    /// every hierarchy (enabling the v2 controllers on the way) and pins besteffort to the
    /// minimum cpu weight. Idempotent.
    fn ensure_node_cgroups(&self) -> Result<()>;

    /// The CRI `cgroup_parent` of the pod's sandbox (`/kubepods/burstable/pod<uid>`), or
    /// `""` when `cgroupsPerQOS` is off.
    fn cgroup_parent(&self, pod: &Pod) -> String;

    /// The cgroup path of a container of the pod whose cgroup is `pod_cgroup` (a
    /// [`Self::cgroup_parent`]): `<pod>/<id>` as runc names it under the cgroupfs driver.
    fn container_cgroup(&self, pod_cgroup: &str, container_id: &str) -> String {
        format!("{pod_cgroup}/{container_id}")
    }

    /// Creates the pod cgroup in every hierarchy with the pod's limits
    /// (`ResourceConfigForPod` and `podPidsLimit`). Idempotent: an existing pod cgroup is
    /// left as it is.
    fn ensure_pod_cgroup(&self, pod: &Pod) -> Result<()>;

    /// Kills every process left in the pod cgroup (and its container cgroups) and removes
    /// them all, in every hierarchy and whatever `QoS` class they sit under. Removing a pod
    /// cgroup that does not exist succeeds.
    fn remove_pod_cgroup(&self, uid: &str) -> Result<()>;

    /// Pod cgroups present on disk: `(pod uid, QoS class)` sorted by uid, for housekeeping
    /// of orphans (`GetAllPodsFromCgroups`).
    fn list_pod_cgroups(&self) -> Result<Vec<(String, QosClass)>>;

    /// Whether the pod's cgroup exists (in every hierarchy the kubelet checks). Always true
    /// when `cgroupsPerQOS` is off, as upstream.
    fn pod_cgroup_exists(&self, uid: &str) -> bool;

    /// Sets the `QoS` cgroups' cpu weights from the active pods: burstable gets the sum of
    /// the Burstable pods' cpu requests, besteffort the minimum (upstream
    /// `qosContainerManager.UpdateCgroups`).
    fn update_qos_cgroups(&self, active_pods: &[Pod]) -> Result<()>;

    /// The pod cgroup's cpu and memory settings now (upstream `GetPodCgroupConfig`, for
    /// in-place resize); `None` without a pod cgroup. Default: `None`.
    fn pod_cgroup_config(&self, _pod: &Pod) -> Result<Option<resources::PodResourceConfig>> {
        Ok(None)
    }

    /// The pod cgroup's settings as upstream reads them for the pod's `status.resources`
    /// (`GetPodCgroupConfig`): [`Self::pod_cgroup_config`], except that an unlimited
    /// memory on cgroup v1 is the kernel's number (9223372036854771712 with 4 KiB pages),
    /// which upstream shows as the pod's memory limit (v2's `max` it leaves out).
    fn pod_cgroup_status_config(&self, pod: &Pod) -> Result<Option<resources::PodResourceConfig>> {
        self.pod_cgroup_config(pod)
    }

    /// Writes the `Some` settings of `cfg` into the existing pod cgroup (upstream
    /// `SetPodCgroupConfig`, for in-place resize). Default: nothing.
    fn update_pod_cgroup(&self, _pod: &Pod, _cfg: &resources::PodResourceConfig) -> Result<()> {
        Ok(())
    }

    /// Bytes of memory the pod cgroup uses now (upstream `GetPodCgroupMemoryUsage`).
    /// Default: `None` (unknown).
    fn pod_memory_usage(&self, _pod: &Pod) -> Result<Option<u64>> {
        Ok(None)
    }
}

#[cfg(test)]
mod swap_tests {
    #[test]
    fn swap_is_on_when_proc_swaps_lists_a_device() {
        let header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        assert!(super::check_swap(header).is_ok());
        assert!(super::check_swap("").is_ok());
        let on = format!("{header}/swapfile                               file\t\t1048572\t\t0\t\t-2\n");
        let err = super::check_swap(&on).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false. \
                 /proc/swaps contained: [\"Filename"
            ),
            "{err}"
        );
    }
}
