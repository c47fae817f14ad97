//! Builds the CPU, memory and topology managers from their settings (upstream
//! `NewContainerManager`'s part for them), so that the agent's wiring stays a few lines.
//! `settings::resource_managers` takes the settings from the `KubeletConfiguration`.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;

use crate::cm::cpumanager::{ActivePods, CpuManager, CpuManagerConfig};
use crate::cm::machine_topology::MachineTopology;
use crate::cm::memorymanager::{MemoryManager, MemoryManagerConfig};
use crate::cm::metrics::ResourceManagerMetrics;
use crate::cm::topology::{TopologyManager, TopologyManagerConfig};

/// A resource manager that cannot start; the agent does not start either.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The machine's topology could not be read.
    #[error("machine topology: {0}")]
    Topology(#[from] crate::cm::machine_topology::Error),
    /// The CPU manager refused the configuration or its checkpoint.
    #[error("CPU manager: {0}")]
    Cpu(#[from] crate::cm::cpumanager::Error),
    /// The memory manager refused the configuration or its checkpoint.
    #[error("memory manager: {0}")]
    Memory(#[from] crate::cm::memorymanager::Error),
    /// The topology manager refused the configuration.
    #[error("topology manager: {0}")]
    TopologyManager(String),
}

/// The managers, wired to each other.
#[derive(Debug)]
pub struct ResourceManagers {
    /// The CPU manager (hint provider, container lifecycle hook, reconcile loop).
    pub cpu: Arc<CpuManager>,
    /// The memory manager (hint provider, container lifecycle hook).
    pub memory: Arc<MemoryManager>,
    /// The topology manager (admission), with both registered as hint providers.
    pub topology: TopologyManager,
}

/// What the three managers are built from.
#[derive(Debug, Clone)]
pub struct ResourceManagerSettings {
    /// The CPU manager's (`cpuManager*`, `reservedSystemCPUs`, `kubeReserved` +
    /// `systemReserved` cpu, `topologyManagerPolicy`, feature gates).
    pub cpu: CpuManagerConfig,
    /// The memory manager's (`memoryManagerPolicy`, `reservedMemory`, and the node
    /// allocatable reservation: `kubeReserved` + `systemReserved` + the hard
    /// `memory.available` eviction threshold).
    pub memory: MemoryManagerConfig,
    /// The topology manager's (`topologyManager*`, feature gates).
    pub topology: TopologyManagerConfig,
}

impl ResourceManagerSettings {
    /// Whether no manager has a policy that places anything (then the machine topology is
    /// not needed).
    fn places_nothing(&self) -> bool {
        matches!(self.cpu.policy.as_str(), "" | "none")
            && matches!(self.memory.policy.as_str(), "" | "None")
            && matches!(self.topology.policy.as_str(), "" | "none")
    }
}

/// Reads the machine below `sysfs` and builds the managers.
///
/// # Errors
/// [`Error`] with the manager's upstream message (checkpoint policy mismatch, bad
/// `reservedSystemCPUs`, static policy without reserved CPUs, `reservedMemory` not
/// matching node allocatable, unknown policy options, ...).
pub fn build(
    settings: &ResourceManagerSettings,
    root_dir: &Path,
    sysfs: &Path,
    registry: &mut Registry,
) -> Result<ResourceManagers, Error> {
    let topo = match MachineTopology::detect(sysfs, &Path::new("/proc").join("meminfo")) {
        Ok(t) => t,
        // Without a policy that places anything the topology is not needed.
        Err(e) if settings.places_nothing() => {
            tracing::warn!(error = %e, "cannot read the machine topology; the resource managers have nothing to place");
            MachineTopology::default()
        }
        Err(e) => return Err(e.into()),
    };
    let metrics = Arc::new(ResourceManagerMetrics::new(registry));
    let cpu = Arc::new(CpuManager::new(&settings.cpu, topo.clone(), root_dir, Some(metrics.clone()))?);
    let memory = Arc::new(MemoryManager::new(&settings.memory, &topo, root_dir)?);
    let mut topology =
        TopologyManager::new(&settings.topology, &topo, Some(metrics)).map_err(Error::TopologyManager)?;
    topology.add_hint_provider(cpu.clone());
    topology.add_hint_provider(memory.clone());
    Ok(ResourceManagers { cpu, memory, topology })
}

/// The active pods: known to the pod manager and not in a terminal phase; `None` until
/// every pod source has delivered its pods.
#[must_use]
pub fn active_pods(pods: crate::pod_manager::PodManager, status: Arc<dyn crate::status::StatusProvider>) -> ActivePods {
    Arc::new(move || -> Option<Vec<Pod>> {
        if !pods.sources_ready() {
            return None;
        }
        let active = pods
            .pods()
            .into_iter()
            .filter(|p| {
                let u = p.metadata.uid.as_deref().unwrap_or_default();
                !status.get(u).is_some_and(|s| matches!(s.phase.as_deref(), Some("Succeeded" | "Failed")))
            })
            .map(Arc::unwrap_or_clone)
            .collect();
        Some(active)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::KubeletConfiguration;

    fn sysfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let topo = MachineTopology::synthetic(1, 1, 2, 1, 1 << 30);
        crate::cm::machine_topology::tests::write_sysfs(dir.path(), &topo);
        dir
    }

    #[test]
    fn absurd_reservations_saturate_instead_of_overflowing() {
        // The sums beside the subtractions the fuzz target `config` caught overflowing in
        // `allocatable::plan`: kube + system reserved (+ the hard eviction threshold).
        let sys = sysfs();
        let root = tempfile::tempdir().unwrap();
        let huge = BTreeMap::from([
            ("cpu".into(), "9e15".into()),
            ("memory".into(), "8Ei".into()),
            ("hugepages-2Mi".into(), "8Ei".into()),
        ]);
        let mut kc = KubeletConfiguration {
            kube_reserved: huge.clone(),
            system_reserved: huge.clone(),
            reserved_memory: vec![crate::config::MemoryReservation { numa_node: 0, limits: huge.clone() }],
            ..KubeletConfiguration::default()
        };
        kc.reserved_memory.push(kc.reserved_memory[0].clone());
        kc.eviction_hard.insert("memory.available".into(), "8Ei".into());
        assert!(
            build(&crate::settings::resource_managers(&kc), root.path(), sys.path(), &mut Registry::default()).is_ok()
        );
    }

    #[test]
    fn builds_the_managers_or_names_the_one_that_refuses() {
        let sys = sysfs();
        let root = tempfile::tempdir().unwrap();
        let mut kc = KubeletConfiguration {
            cpu_manager_policy: "static".into(),
            reserved_system_cpus: "0".into(),
            topology_manager_policy: "single-numa-node".into(),
            ..KubeletConfiguration::default()
        };
        let m =
            build(&crate::settings::resource_managers(&kc), root.path(), sys.path(), &mut Registry::default()).unwrap();
        assert_eq!(m.cpu.reserved().to_string(), "0");
        assert_eq!(m.topology.policy(), crate::cm::topology::Policy::SingleNumaNode);
        assert!(root.path().join("cpu_manager_state").exists());
        assert!(root.path().join("memory_manager_state").exists());
        drop(m);
        kc.reserved_system_cpus = String::new();
        let other = tempfile::tempdir().unwrap();
        let e = build(&crate::settings::resource_managers(&kc), other.path(), sys.path(), &mut Registry::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "CPU manager: [cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
        );
        kc.kube_reserved.insert("cpu".into(), "200m".into());
        kc.topology_manager_policy_options.insert("bogus".into(), "1".into());
        let e = build(&crate::settings::resource_managers(&kc), other.path(), sys.path(), &mut Registry::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "topology manager: unknown Topology Manager Policy option: \"bogus\"");
        kc.topology_manager_policy_options.clear();
        kc.memory_manager_policy = "Static".into();
        let e = build(&crate::settings::resource_managers(&kc), other.path(), sys.path(), &mut Registry::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("memory manager: [memorymanager] the total amount \"0\""), "{e}");
        let e = build(
            &crate::settings::resource_managers(&kc),
            other.path(),
            Path::new("/nonexistent"),
            &mut Registry::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("machine topology: reading /nonexistent/devices/system/cpu/online"), "{e}");
        // With nothing to place, an unreadable topology is only a warning.
        let plain = KubeletConfiguration::default();
        let fresh = tempfile::tempdir().unwrap();
        assert!(
            build(
                &crate::settings::resource_managers(&plain),
                fresh.path(),
                Path::new("/nonexistent"),
                &mut Registry::default()
            )
            .is_ok()
        );
    }
}
