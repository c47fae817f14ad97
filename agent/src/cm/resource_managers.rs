//! Builds the CPU, memory and topology managers from the `KubeletConfiguration` (upstream
//! `NewContainerManager`'s part for them), so that the agent's wiring stays a few lines.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;

use crate::cm::cpumanager::{ActivePods, CpuManager, CpuManagerConfig};
use crate::cm::machine_topology::MachineTopology;
use crate::cm::memorymanager::{MemoryManager, MemoryManagerConfig};
use crate::cm::metrics::ResourceManagerMetrics;
use crate::cm::topology::{TopologyManager, TopologyManagerConfig};
use crate::config::KubeletConfiguration;
use crate::types::quantity;

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

fn milli_cpu(list: &BTreeMap<String, String>) -> i64 {
    list.get("cpu").and_then(|q| quantity::parse_milli_cpu(q).ok()).unwrap_or(0)
}

fn bytes(list: &BTreeMap<String, String>, key: &str) -> u64 {
    list.get(key).and_then(|q| quantity::parse_bytes(q).ok()).unwrap_or(0).max(0) as u64
}

/// Reads the machine below `sysfs` and builds the managers.
///
/// # Errors
/// [`Error`] with the manager's upstream message (checkpoint policy mismatch, bad
/// `reservedSystemCPUs`, static policy without reserved CPUs, `reservedMemory` not
/// matching node allocatable, unknown policy options, ...).
pub fn build(
    kc: &KubeletConfiguration,
    root_dir: &Path,
    sysfs: &Path,
    registry: &mut Registry,
) -> Result<ResourceManagers, Error> {
    let topo = match MachineTopology::detect(sysfs, &Path::new("/proc").join("meminfo")) {
        Ok(t) => t,
        // Without a policy that places anything the topology is not needed.
        Err(e)
            if matches!(kc.cpu_manager_policy.as_str(), "" | "none")
                && matches!(kc.memory_manager_policy.as_str(), "" | "None")
                && matches!(kc.topology_manager_policy.as_str(), "" | "none") =>
        {
            tracing::warn!(error = %e, "cannot read the machine topology; the resource managers have nothing to place");
            MachineTopology::default()
        }
        Err(e) => return Err(e.into()),
    };
    let metrics = Arc::new(ResourceManagerMetrics::new(registry));
    let cpu = Arc::new(CpuManager::new(
        &CpuManagerConfig {
            policy: kc.cpu_manager_policy.clone(),
            options: kc.cpu_manager_policy_options.clone(),
            reserved_system_cpus: kc.reserved_system_cpus.clone(),
            reserved_milli_cpu: milli_cpu(&kc.kube_reserved).saturating_add(milli_cpu(&kc.system_reserved)),
            topology_policy: kc.topology_manager_policy.clone(),
            feature_gates: kc.feature_gates.clone(),
            reconcile_period: kc.cpu_manager_reconcile_period.to_std(),
        },
        topo.clone(),
        root_dir,
        Some(metrics.clone()),
    )?);
    let mut reserved_memory: BTreeMap<usize, BTreeMap<String, u64>> = BTreeMap::new();
    for r in &kc.reserved_memory {
        let node = reserved_memory.entry(r.numa_node.max(0) as usize).or_default();
        for kind in r.limits.keys() {
            let total = node.entry(kind.clone()).or_default();
            *total = total.saturating_add(bytes(&r.limits, kind));
        }
    }
    // Node allocatable's reservation per memory type (upstream's
    // nodeAllocatableReservation): kube + system reserved, plus the hard eviction
    // threshold for memory (absolute only: a percentage is not a size).
    let eviction = kc.eviction_hard.get("memory.available").filter(|v| !v.ends_with('%'));
    let mut node_allocatable_reservation = BTreeMap::new();
    for kind in kc.kube_reserved.keys().chain(kc.system_reserved.keys()).filter(|k| k.starts_with("hugepages-")) {
        node_allocatable_reservation
            .insert(kind.clone(), bytes(&kc.kube_reserved, kind).saturating_add(bytes(&kc.system_reserved, kind)));
    }
    // Saturating, as in `allocatable::plan`: reservations are not bounded by validation.
    let memory = bytes(&kc.kube_reserved, "memory")
        .saturating_add(bytes(&kc.system_reserved, "memory"))
        .saturating_add(eviction.and_then(|v| quantity::parse_bytes(v).ok()).unwrap_or(0).max(0) as u64);
    if memory > 0 {
        node_allocatable_reservation.insert("memory".to_owned(), memory);
    }
    let memory = Arc::new(MemoryManager::new(
        &MemoryManagerConfig {
            policy: kc.memory_manager_policy.clone(),
            reserved_memory,
            node_allocatable_reservation,
        },
        &topo,
        root_dir,
    )?);
    let mut topology = TopologyManager::new(
        &TopologyManagerConfig {
            policy: kc.topology_manager_policy.clone(),
            scope: kc.topology_manager_scope.clone(),
            options: kc.topology_manager_policy_options.clone(),
            feature_gates: kc.feature_gates.clone(),
        },
        &topo,
        Some(metrics),
    )
    .map_err(Error::TopologyManager)?;
    topology.add_hint_provider(cpu.clone());
    topology.add_hint_provider(memory.clone());
    Ok(ResourceManagers { cpu, memory, topology })
}

/// Upstream's `server.go`: `reservedSystemCPUs` replaces the cpu of `kubeReserved` and
/// `systemReserved` (systemReserved.cpu becomes the number of reserved CPUs), so node
/// allocatable matches the CPUs pods can use.
pub fn apply_reserved_system_cpus(kc: &mut KubeletConfiguration) {
    let Ok(set) = crate::types::cpuset::CpuSet::parse(&kc.reserved_system_cpus) else { return };
    if set.is_empty() {
        return;
    }
    kc.kube_reserved.remove("cpu");
    kc.system_reserved.insert("cpu".into(), set.len().to_string());
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
            .collect();
        Some(active)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let topo = MachineTopology::synthetic(1, 1, 2, 1, 1 << 30);
        crate::cm::machine_topology::tests::write_sysfs(dir.path(), &topo);
        dir
    }

    #[test]
    fn reserved_system_cpus_replace_the_reserved_cpu() {
        let mut kc = KubeletConfiguration {
            reserved_system_cpus: "0,2-3".into(),
            kube_reserved: BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]),
            ..KubeletConfiguration::default()
        };
        apply_reserved_system_cpus(&mut kc);
        assert_eq!(kc.kube_reserved, BTreeMap::from([("memory".into(), "1Gi".into())]));
        assert_eq!(kc.system_reserved, BTreeMap::from([("cpu".into(), "3".into())]));
        let mut plain = KubeletConfiguration::default();
        apply_reserved_system_cpus(&mut plain);
        assert!(plain.system_reserved.is_empty());
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
        assert!(build(&kc, root.path(), sys.path(), &mut Registry::default()).is_ok());
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
        let m = build(&kc, root.path(), sys.path(), &mut Registry::default()).unwrap();
        assert_eq!(m.cpu.reserved().to_string(), "0");
        assert_eq!(m.topology.policy(), crate::cm::topology::Policy::SingleNumaNode);
        assert!(root.path().join("cpu_manager_state").exists());
        assert!(root.path().join("memory_manager_state").exists());
        drop(m);
        kc.reserved_system_cpus = String::new();
        let other = tempfile::tempdir().unwrap();
        let e = build(&kc, other.path(), sys.path(), &mut Registry::default()).unwrap_err().to_string();
        assert_eq!(
            e,
            "CPU manager: [cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
        );
        kc.kube_reserved.insert("cpu".into(), "200m".into());
        kc.topology_manager_policy_options.insert("bogus".into(), "1".into());
        let e = build(&kc, other.path(), sys.path(), &mut Registry::default()).unwrap_err().to_string();
        assert_eq!(e, "topology manager: unknown Topology Manager Policy option: \"bogus\"");
        kc.topology_manager_policy_options.clear();
        kc.memory_manager_policy = "Static".into();
        let e = build(&kc, other.path(), sys.path(), &mut Registry::default()).unwrap_err().to_string();
        assert!(e.starts_with("memory manager: [memorymanager] the total amount \"0\""), "{e}");
        let e = build(&kc, other.path(), Path::new("/nonexistent"), &mut Registry::default()).unwrap_err().to_string();
        assert!(e.starts_with("machine topology: reading /nonexistent/devices/system/cpu/online"), "{e}");
        // With nothing to place, an unreadable topology is only a warning.
        let plain = KubeletConfiguration::default();
        let fresh = tempfile::tempdir().unwrap();
        assert!(build(&plain, fresh.path(), Path::new("/nonexistent"), &mut Registry::default()).is_ok());
    }
}
