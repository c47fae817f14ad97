//! Node allocatable enforcement (upstream `enforceNodeAllocatableCgroups` in
//! `pkg/kubelet/cm/node_container_manager_linux.go`).
//!
//! With `pods` in `enforceNodeAllocatable` (the default) the `kubepods` cgroup is limited to
//! what the node leaves to pods: capacity − `kubeReserved` − `systemReserved` (the hard
//! eviction thresholds are *not* subtracted here; they only lower the allocatable the node
//! status reports). That is `cpu.shares` (v2: `cpu.weight`) of the allocatable CPUs, a memory
//! limit and a pids limit (`pid_max` − reserved pids). With `kube-reserved` /
//! `system-reserved`, the `kubeReservedCgroup` / `systemReservedCgroup` — which must exist
//! already — get the reserved amounts as their limits. A missing reserved cgroup stops the
//! agent at start, as upstream (`"/system.slice" cgroup does not exist`).
//!
//! `kubepods` also gets a hugetlb limit per page size: the preallocated huge pages of that
//! size minus the reserved `hugepages-<size>` (written only where the hugetlb controller is
//! on).

use std::collections::BTreeMap;

use super::resources::{
    HugepageLimits, PodResourceConfig, hugepage_resource_name, hugepage_unit_size, milli_cpu_to_shares,
};
use crate::types::quantity::{parse_bytes, parse_milli_cpu};

/// The node allocatable settings: the `KubeletConfiguration` fields of the same names (as
/// `settings::allocatable` takes them from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatableSettings {
    /// `kubeReserved`: resource name (`cpu`, `memory`, `pid`, `hugepages-<size>`) →
    /// quantity, as written.
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved`, as `kube_reserved`.
    pub system_reserved: BTreeMap<String, String>,
    /// `kubeReservedCgroup`.
    pub kube_reserved_cgroup: String,
    /// `systemReservedCgroup`.
    pub system_reserved_cgroup: String,
    /// `enforceNodeAllocatable`: `pods`, `kube-reserved`, `system-reserved`.
    pub enforce_node_allocatable: Vec<String>,
    /// `cgroupsPerQOS`: without it there is no `kubepods` cgroup to limit.
    pub cgroups_per_qos: bool,
}

/// What to write where (see the module docs). `Default`: nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enforcement {
    /// Limits of the `kubepods` cgroup, with `pods` enforced.
    pub pods: Option<PodResourceConfig>,
    /// (`kubeReservedCgroup`, its limits), with `kube-reserved` enforced.
    pub kube_reserved: Option<(String, PodResourceConfig)>,
    /// (`systemReservedCgroup`, its limits), with `system-reserved` enforced.
    pub system_reserved: Option<(String, PodResourceConfig)>,
}

/// What the machine has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub cpus: u64,
    pub memory_bytes: u64,
    /// `/proc/sys/kernel/pid_max`, if known.
    pub max_pid: Option<i64>,
    /// Huge pages: page size in bytes → bytes preallocated.
    pub hugepages: BTreeMap<u64, u64>,
}

impl Capacity {
    /// This machine's, with the facts the node already read.
    #[must_use]
    pub fn detect(cpus: u64, memory_bytes: u64, hugepages: BTreeMap<u64, u64>) -> Self {
        let max_pid = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok());
        Self { cpus, memory_bytes, max_pid, hugepages }
    }
}

/// Reserved amounts of one of `kubeReserved` / `systemReserved`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reserved {
    milli_cpu: i64,
    memory: i64,
    pids: i64,
}

fn reserved(map: &BTreeMap<String, String>) -> Reserved {
    Reserved {
        milli_cpu: map.get("cpu").and_then(|v| parse_milli_cpu(v).ok()).unwrap_or(0).max(0),
        memory: map.get("memory").and_then(|v| parse_bytes(v).ok()).unwrap_or(0).max(0),
        pids: map.get("pid").and_then(|v| v.trim().parse::<i64>().ok()).unwrap_or(0).max(0),
    }
}

/// The limits of a reserved cgroup (upstream `getCgroupConfig` of the reservation): only
/// what is reserved is limited.
fn reserved_config(r: Reserved, map: &BTreeMap<String, String>) -> PodResourceConfig {
    PodResourceConfig {
        cpu_shares: map.contains_key("cpu").then(|| milli_cpu_to_shares(r.milli_cpu)),
        memory_limit: map.contains_key("memory").then_some(r.memory),
        pids_limit: map.contains_key("pid").then_some(r.pids),
        ..PodResourceConfig::default()
    }
}

/// The enforcement the settings ask for on a machine of `capacity`.
#[must_use]
pub fn plan(settings: &AllocatableSettings, capacity: &Capacity) -> Enforcement {
    let kube = reserved(&settings.kube_reserved);
    let system = reserved(&settings.system_reserved);
    let enforced = |key: &str| settings.enforce_node_allocatable.iter().any(|k| k == key);
    let total_milli = i64::try_from(capacity.cpus.saturating_mul(1000)).unwrap_or(i64::MAX);
    let memory = i64::try_from(capacity.memory_bytes).unwrap_or(i64::MAX);
    let pods = (enforced("pods") && settings.cgroups_per_qos).then(|| PodResourceConfig {
        // Saturating: reservations are not bounded by validation (nor upstream's), and more
        // than the machine has leaves pods nothing.
        cpu_shares: Some(milli_cpu_to_shares(
            total_milli.saturating_sub(kube.milli_cpu).saturating_sub(system.milli_cpu).max(0),
        )),
        memory_limit: Some(memory.saturating_sub(kube.memory).saturating_sub(system.memory).max(0)),
        pids_limit: capacity.max_pid.map(|max| max.saturating_sub(kube.pids).saturating_sub(system.pids).max(0)),
        hugepage_limits: Some(HugepageLimits {
            sizes: capacity
                .hugepages
                .iter()
                .filter_map(|(&size, &total)| {
                    let name = hugepage_resource_name(size);
                    let reserved = |m: &BTreeMap<String, String>| {
                        m.get(&name).and_then(|v| parse_bytes(v).ok()).unwrap_or(0).max(0)
                    };
                    let total = i64::try_from(total).unwrap_or(i64::MAX);
                    Some((
                        hugepage_unit_size(size)?,
                        total
                            .saturating_sub(reserved(&settings.kube_reserved))
                            .saturating_sub(reserved(&settings.system_reserved))
                            .max(0),
                    ))
                })
                .collect(),
            others: 0,
        }),
        ..PodResourceConfig::default()
    });
    Enforcement {
        pods,
        kube_reserved: enforced("kube-reserved")
            .then(|| (settings.kube_reserved_cgroup.clone(), reserved_config(kube, &settings.kube_reserved))),
        system_reserved: enforced("system-reserved")
            .then(|| (settings.system_reserved_cgroup.clone(), reserved_config(system, &settings.system_reserved))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KubeletConfiguration;

    const GI: i64 = 1 << 30;

    fn machine() -> Capacity {
        Capacity {
            cpus: 4,
            memory_bytes: 16 << 30,
            max_pid: Some(4_194_304),
            hugepages: BTreeMap::from([(2 << 20, 8 << 20), (1 << 30, 0)]),
        }
    }

    #[test]
    fn pods_get_capacity_minus_reservations() {
        let kc = KubeletConfiguration {
            kube_reserved: BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]),
            system_reserved: BTreeMap::from([
                ("memory".into(), "512Mi".into()),
                ("pid".into(), "1000".into()),
                ("hugepages-2Mi".into(), "2Mi".into()),
            ]),
            ..KubeletConfiguration::default()
        };
        let e = plan(&crate::settings::allocatable(&kc), &machine());
        assert_eq!(
            e.pods,
            Some(PodResourceConfig {
                cpu_shares: Some(3584),
                memory_limit: Some(16 * GI - GI - GI / 2),
                pids_limit: Some(4_193_304),
                hugepage_limits: Some(HugepageLimits {
                    sizes: BTreeMap::from([("2MB".into(), 6 << 20), ("1GB".into(), 0)]),
                    others: 0
                }),
                ..PodResourceConfig::default()
            })
        );
        assert_eq!((e.kube_reserved, e.system_reserved), (None, None), "only pods is enforced by default");
    }

    #[test]
    fn reserved_cgroups_get_what_is_reserved() {
        let kc = KubeletConfiguration {
            kube_reserved: BTreeMap::from([("cpu".into(), "1".into())]),
            system_reserved: BTreeMap::from([("memory".into(), "1Gi".into())]),
            kube_reserved_cgroup: "/kube.slice".into(),
            system_reserved_cgroup: "/system.slice".into(),
            enforce_node_allocatable: vec!["kube-reserved".into(), "system-reserved".into()],
            ..KubeletConfiguration::default()
        };
        let e = plan(&crate::settings::allocatable(&kc), &machine());
        assert_eq!(e.pods, None);
        assert_eq!(
            e.kube_reserved,
            Some(("/kube.slice".into(), PodResourceConfig { cpu_shares: Some(1024), ..PodResourceConfig::default() }))
        );
        assert_eq!(
            e.system_reserved,
            Some((
                "/system.slice".into(),
                PodResourceConfig { memory_limit: Some(GI), ..PodResourceConfig::default() }
            ))
        );
    }

    #[test]
    fn absurd_reservations_leave_pods_nothing_instead_of_overflowing() {
        // Caught by the fuzz target `config` (the input is in its corpus): kube + system
        // reserved beyond i64 overflowed the subtractions (a panic in debug builds, wrapped
        // limits in release).
        let huge = BTreeMap::from([
            ("cpu".into(), "9e15".into()),
            ("memory".into(), "8Ei".into()),
            ("pid".into(), "9223372036854775807".into()),
            ("hugepages-2Mi".into(), "8Ei".into()),
        ]);
        let kc = KubeletConfiguration {
            kube_reserved: huge.clone(),
            system_reserved: huge,
            ..KubeletConfiguration::default()
        };
        assert_eq!(
            plan(&crate::settings::allocatable(&kc), &machine()).pods,
            Some(PodResourceConfig {
                cpu_shares: Some(milli_cpu_to_shares(0)),
                memory_limit: Some(0),
                pids_limit: Some(0),
                hugepage_limits: Some(HugepageLimits {
                    sizes: BTreeMap::from([("2MB".into(), 0), ("1GB".into(), 0)]),
                    others: 0
                }),
                ..PodResourceConfig::default()
            })
        );
    }

    #[test]
    fn nothing_without_enforcement_or_qos_cgroups() {
        let none = KubeletConfiguration { enforce_node_allocatable: vec!["none".into()], ..Default::default() };
        assert_eq!(plan(&crate::settings::allocatable(&none), &machine()), Enforcement::default());
        let no_qos = KubeletConfiguration { cgroups_per_qos: false, ..Default::default() };
        assert_eq!(plan(&crate::settings::allocatable(&no_qos), &machine()).pods, None);
    }
}
