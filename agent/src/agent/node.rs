//! The node's resources: swap check, container resource options, the machine, the
//! resource managers and the node's cgroups.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use super::Error;
use crate::cm::{CgroupfsPodContainerManager, PodContainerManager};
use crate::config::Config;

/// The node's resources: what the machine is, the resource managers and the cgroups.
pub(super) struct NodeResources {
    pub(super) machine: crate::node::MachineFacts,
    /// Hint providers of the topology manager (admission) and container lifecycle hooks
    /// of the runtime manager (container creation).
    pub(super) managers: crate::cm::resource_managers::ResourceManagers,
    pub(super) cm: Arc<dyn PodContainerManager>,
    pub(super) kubepods_dirs: crate::cm::cgroupfs::KubepodsDirs,
    /// Node allocatable is enforced on the pods' cgroup.
    pub(super) allocatable_enforced: bool,
}

/// Checks swap, sets the host's container resource options, detects the machine, builds
/// the resource managers and makes the node's cgroups (before any pod's).
pub(super) fn resources(cfg: &Config, registry: &mut Registry) -> Result<NodeResources, Error> {
    let kc = &cfg.kubelet;
    if kc.fail_swap_on {
        // No /proc/swaps: no swap (as upstream's `IsSwapOn`).
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_else(|e| {
            tracing::warn!(error = %e, "failSwapOn: cannot read /proc/swaps; assuming swap is off");
            String::new()
        });
        crate::cm::check_swap(&swaps)?;
    }
    // Container resources follow cpuCFSQuota, singleProcessOOMKill and swapBehavior.
    crate::cm::resources::ContainerResourceOptions::init_host(&crate::settings::container_resources(kc));
    // What the node is, once: node allocatable below and the Node object (API mode).
    let machine = crate::node::MachineFacts::detect(&cfg.root_dir);
    let managers = crate::cm::resource_managers::build(
        &crate::settings::resource_managers(kc),
        &cfg.root_dir,
        std::path::Path::new("/sys"),
        registry,
    )?;
    let enforcement = crate::cm::allocatable::plan(
        &crate::settings::allocatable(kc),
        &crate::cm::allocatable::Capacity::detect(machine.cpus, machine.memory_bytes, machine.hugepages.clone()),
    );
    let cgroups = CgroupfsPodContainerManager::new(crate::settings::cgroups(kc, enforcement))?.with_unquoted_pods({
        let cpu = managers.cpu.clone();
        Arc::new(move |uid| cpu.pod_runs_without_quota(uid))
    });
    let kubepods_dirs = cgroups.kubepods_dirs();
    let allocatable_enforced = cgroups.config().enforcement.pods.is_some();
    let cm: Arc<dyn PodContainerManager> = Arc::new(cgroups);
    cm.ensure_node_cgroups()?;
    Ok(NodeResources { machine, managers, cm, kubepods_dirs, allocatable_enforced })
}
