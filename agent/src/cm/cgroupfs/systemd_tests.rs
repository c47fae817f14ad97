//! `cgroupDriver: systemd` against fixture trees, with a systemd stand-in that makes a
//! slice's cgroup where systemd would (the controllers it manages on v1, the unified
//! hierarchy) and records every call. The real systemd is the node container's, in the
//! end-to-end suite (`tests/tests/systemd_node.rs`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::fixture::Fixture;
use super::sys::CgroupSys as _;
use super::tests::{best_effort, burstable, cgroup_err, guaranteed};
use super::*;
use crate::cm::CgroupConfig;
use crate::cm::systemd_dbus::{self as dbus, Property};

/// v1 hierarchies whose cgroups systemd makes for a slice with accounting on.
const SYSTEMD_V1: [&str; 6] = ["blkio", "cpu", "cpuacct", "memory", "pids", "systemd"];

#[derive(Debug)]
struct FakeSystemd {
    fixture_root: PathBuf,
    sys: Arc<sys::FixtureSys>,
    unified: bool,
    active: Mutex<BTreeSet<String>>,
    calls: Mutex<Vec<String>>,
}

impl FakeSystemd {
    fn new(f: &Fixture) -> Arc<Self> {
        Arc::new(Self {
            fixture_root: f.fs_root.clone(),
            sys: Arc::clone(&f.sys),
            unified: !f.fs_root.join("unified").exists(),
            active: Mutex::default(),
            calls: Mutex::default(),
        })
    }

    fn dirs(&self, unit: &str) -> Vec<PathBuf> {
        let rel = systemd_names::expand_slice(unit).expect("a slice");
        let rel = rel.trim_start_matches('/');
        if self.unified {
            vec![self.fixture_root.join(rel)]
        } else {
            SYSTEMD_V1.iter().chain(["unified"].iter()).map(|h| self.fixture_root.join(h).join(rel)).collect()
        }
    }

    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

fn show(props: &[Property]) -> String {
    let shown: Vec<String> = props
        .iter()
        .filter(|p| !dbus::slice_properties("x", "y").iter().any(|s| s.name() == p.name()))
        .map(|p| match p {
            Property::U64(n, v) if *v == u64::MAX => format!("{n}=infinity"),
            Property::U64(n, v) => format!("{n}={v}"),
            Property::Bool(n, v) => format!("{n}={v}"),
            Property::Str(n, v) => format!("{n}={v}"),
            Property::Strs(n, v) => format!("{n}={}", v.join(",")),
        })
        .collect();
    shown.join(" ")
}

impl dbus::SystemdUnits for FakeSystemd {
    fn start_slice(&self, name: &str, parent: &str, props: &[Property]) -> Result<bool, dbus::Error> {
        self.calls.lock().unwrap().push(format!("start {name} in {parent}: {}", show(props)));
        if !self.active.lock().unwrap().insert(name.to_owned()) {
            return Ok(false);
        }
        for dir in self.dirs(name) {
            if self.unified {
                // systemd delegates the accounted controllers down to the new slice.
                let parent = dir.parent().expect("a parent");
                let offered = std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap();
                let wanted: Vec<String> = offered
                    .split_whitespace()
                    .filter(|c| ["cpu", "io", "memory", "pids"].contains(c))
                    .map(|c| format!("+{c}"))
                    .collect();
                std::fs::write(parent.join("cgroup.subtree_control"), wanted.join(" ")).unwrap();
            }
            self.sys.mkdir(&dir).unwrap_or_else(|e| panic!("systemd would have made {}: {e}", dir.display()));
        }
        Ok(true)
    }

    fn set_properties(&self, name: &str, props: &[Property]) -> Result<(), dbus::Error> {
        self.calls.lock().unwrap().push(format!("set {name}: {}", show(props)));
        Ok(())
    }

    fn stop_unit(&self, name: &str) -> Result<(), dbus::Error> {
        self.calls.lock().unwrap().push(format!("stop {name}"));
        if self.active.lock().unwrap().remove(name) {
            for dir in self.dirs(name) {
                // systemd removes what it made, children first; what it cannot stays.
                let mut tree = Vec::new();
                cgroup_tree_post_order(&dir, &mut tree);
                for d in tree {
                    let _ = self.sys.rmdir(&d);
                }
            }
        }
        Ok(())
    }
}

fn systemd_manager(f: &Fixture, cfg: CgroupConfig) -> (CgroupfsPodContainerManager, Arc<FakeSystemd>) {
    let units = FakeSystemd::new(f);
    let m = f.manager_with(CgroupConfig { cgroup_driver: "systemd".into(), ..cfg }).with_systemd_units(units.clone());
    (m, units)
}

/// v1 hierarchies the kubelet leaves to systemd under its driver.
const LEFT_TO_SYSTEMD: [&str; 2] = ["devices", "freezer"];

const G: &str = "kubepods.slice/kubepods-pod12_ab.slice";
const B: &str = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb1.slice";

/// A container's scope is named after the runtime's prefix, found on disk once and
/// remembered: a scope not made yet (or gone) is named the same way without a probe.
#[test]
fn container_scopes_take_the_runtimes_prefix_found_once() {
    let f = Fixture::hybrid();
    let (m, _) = systemd_manager(&f, f.config());
    let pod = format!("/{B}");
    // Nothing on disk yet: containerd's name, not remembered.
    assert_eq!(m.container_cgroup(&pod, "c0"), format!("{pod}/cri-containerd-c0.scope"));
    let first = m.hierarchies().first().unwrap().mount.clone();
    std::fs::create_dir_all(first.join(format!("{B}/crio-c1.scope"))).unwrap();
    assert_eq!(m.container_cgroup(&pod, "c1"), format!("{pod}/crio-c1.scope"));
    assert_eq!(m.container_cgroup(&pod, "c2"), format!("{pod}/crio-c2.scope"), "the prefix found is kept");
}

#[test]
fn pods_are_slices_named_as_upstream() {
    let f = Fixture::hybrid();
    let (m, _) = systemd_manager(&f, f.config());
    assert_eq!(m.cgroup_parent(&guaranteed("12-ab")), format!("/{G}"));
    assert_eq!(m.cgroup_parent(&burstable("b1")), format!("/{B}"));
    assert_eq!(
        m.cgroup_parent(&best_effort("e-1")),
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pode_1.slice"
    );
    let dirs = m.kubepods_dirs();
    assert_eq!(dirs.cgroup2, Some(f.path("unified", "kubepods.slice")));
    assert_eq!(dirs.memory_v1, Some(f.path("memory", "kubepods.slice")));
    // `_` cannot be told from an escaped `-`: refused, in the root too.
    let err = cgroup_err(m.ensure_pod_cgroup(&guaranteed("a_b")).unwrap_err());
    assert!(matches!(err, Error::InvalidPodUid { .. }), "{err}");
    assert_eq!(m.cgroup_parent(&guaranteed("a_b")), "");
    let err = CgroupfsPodContainerManager::build(
        CgroupConfig { cgroup_driver: "systemd".into(), cgroup_root: "/my_root".into(), ..f.config() },
        Some(&f.mountinfo),
        Box::new(sys::RealSys),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "invalid cgroupRoot \"/my_root\": must not contain _ with cgroupDriver systemd");
}

#[test]
fn node_cgroups_are_started_as_slices_then_limited_in_every_hierarchy() {
    let f = Fixture::hybrid();
    let (m, systemd) = systemd_manager(&f, f.config());
    m.ensure_node_cgroups().unwrap();
    assert_eq!(
        systemd.calls(),
        [
            "start kubepods.slice in -.slice: ",
            "start kubepods-burstable.slice in kubepods.slice: ",
            "start kubepods-besteffort.slice in kubepods.slice: CPUShares=2",
        ]
    );
    // systemd made the managed hierarchies' cgroups; the manager made cpuset's, with
    // the parent's cpus, and left devices and freezer to systemd.
    for h in f.hierarchy_dirs() {
        let made = f.path(h, "kubepods.slice/kubepods-besteffort.slice").is_dir();
        assert_eq!(made, !LEFT_TO_SYSTEMD.contains(&h), "{h}");
    }
    assert_eq!(f.read("cpuset", "kubepods.slice/kubepods-burstable.slice/cpuset.cpus"), "0-1");
    assert_eq!(f.read("cpu", "kubepods.slice/kubepods-besteffort.slice/cpu.shares"), "2");
    // Again (an agent restart): existing slices get today's limits.
    m.ensure_node_cgroups().unwrap();
    assert_eq!(
        systemd.calls(),
        [
            "start kubepods.slice in -.slice: ",
            "set kubepods.slice: ",
            "start kubepods-burstable.slice in kubepods.slice: ",
            "set kubepods-burstable.slice: ",
            "start kubepods-besteffort.slice in kubepods.slice: CPUShares=2",
            "set kubepods-besteffort.slice: CPUShares=2",
        ]
    );
}

#[test]
fn pod_slices_carry_the_pod_limits_and_go_with_the_pod() {
    let f = Fixture::hybrid();
    let (m, systemd) = systemd_manager(&f, CgroupConfig { pod_pids_limit: 100, ..f.config() });
    m.ensure_node_cgroups().unwrap();
    systemd.calls();
    m.ensure_pod_cgroup(&guaranteed("12-ab")).unwrap();
    m.ensure_pod_cgroup(&burstable("b1")).unwrap();
    assert_eq!(
        systemd.calls(),
        [
            "start kubepods-pod12_ab.slice in kubepods.slice: CPUShares=512 CPUQuotaPeriodUSec=100000 \
             CPUQuotaPerSecUSec=500000 MemoryLimit=268435456 TasksMax=100",
            "start kubepods-burstable-podb1.slice in kubepods-burstable.slice: CPUShares=256 \
             MemoryLimit=134217728 TasksMax=100",
        ]
    );
    for h in f.hierarchy_dirs() {
        assert_eq!(f.path(h, G).is_dir(), !LEFT_TO_SYSTEMD.contains(&h), "{h}/{G}");
    }
    assert_eq!(f.read("cpu", &format!("{G}/cpu.cfs_quota_us")), "50000");
    assert_eq!(f.read("memory", &format!("{B}/memory.limit_in_bytes")), (128 << 20).to_string());
    assert_eq!(f.read("pids", &format!("{G}/pids.max")), "100");
    assert_eq!(f.read("cpuset", &format!("{G}/cpuset.cpus")), "0-1");

    // Found again by name, the uid unescaped.
    assert_eq!(
        m.list_pod_cgroups().unwrap(),
        [("12-ab".to_owned(), QosClass::Guaranteed), ("b1".to_owned(), QosClass::Burstable)]
    );
    assert!(m.pod_cgroup_exists("12-ab"));

    // An existing pod slice is left as it is (a resize may have changed it).
    std::fs::write(f.path("cpu", &format!("{G}/cpu.shares")), "777").unwrap();
    m.ensure_pod_cgroup(&guaranteed("12-ab")).unwrap();
    assert_eq!(
        systemd.calls(),
        ["start kubepods-pod12_ab.slice in kubepods.slice: CPUShares=512 \
         CPUQuotaPeriodUSec=100000 CPUQuotaPerSecUSec=500000 MemoryLimit=268435456 TasksMax=100"]
    );
    assert_eq!(f.read("cpu", &format!("{G}/cpu.shares")), "777");

    // Resize: systemd is told, and the files are written.
    m.update_pod_cgroup(
        &guaranteed("12-ab"),
        &PodResourceConfig { memory_limit: Some(300 << 20), ..Default::default() },
    )
    .unwrap();
    assert_eq!(systemd.calls(), ["set kubepods-pod12_ab.slice: MemoryLimit=314572800"]);
    assert_eq!(f.read("memory", &format!("{G}/memory.limit_in_bytes")), (300 << 20).to_string());

    // Removal: processes killed, the unit stopped, what systemd did not make removed.
    std::fs::write(f.path("cpu", &format!("{G}/cgroup.procs")), "4242\n").unwrap();
    m.remove_pod_cgroup("12-ab").unwrap();
    assert_eq!(systemd.calls(), ["stop kubepods-pod12_ab.slice"]);
    assert_eq!(f.sys.killed(), [4242]);
    for h in f.hierarchy_dirs() {
        assert!(!f.path(h, G).exists(), "{h}/{G} left");
    }
    assert!(!m.pod_cgroup_exists("12-ab"));
    m.remove_pod_cgroup("12-ab").unwrap();
    assert!(systemd.calls().is_empty(), "nothing left to stop");
}

#[test]
fn unified_slices_use_the_v2_properties() {
    let f = Fixture::unified();
    let (m, systemd) = systemd_manager(&f, f.config());
    m.ensure_node_cgroups().unwrap();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    let calls = systemd.calls();
    assert_eq!(calls[2], "start kubepods-besteffort.slice in kubepods.slice: CPUWeight=1");
    assert_eq!(
        calls[3],
        "start kubepods-podg1.slice in kubepods.slice: CPUWeight=20 CPUQuotaPeriodUSec=100000 \
         CPUQuotaPerSecUSec=500000 MemoryMax=268435456"
    );
    assert_eq!(f.read("", "kubepods.slice/kubepods-podg1.slice/cpu.max"), "50000 100000");
    assert!(f.read("", "kubepods.slice/cgroup.subtree_control").contains("memory"));
}

#[test]
fn qos_weights_and_node_allocatable_reach_systemd() {
    let f = Fixture::hybrid();
    let pods_limits = PodResourceConfig { memory_limit: Some(1 << 30), ..PodResourceConfig::default() };
    let enforcement = crate::cm::allocatable::Enforcement {
        pods: Some(pods_limits),
        ..crate::cm::allocatable::Enforcement::default()
    };
    let (m, systemd) = systemd_manager(&f, CgroupConfig { enforcement, ..f.config() });
    m.ensure_node_cgroups().unwrap();
    assert_eq!(systemd.calls()[0], "start kubepods.slice in -.slice: MemoryLimit=1073741824");
    assert_eq!(f.read("memory", "kubepods.slice/memory.limit_in_bytes"), (1u64 << 30).to_string());
    m.update_qos_cgroups(&[burstable("b1"), burstable("b2"), best_effort("e1")]).unwrap();
    assert_eq!(
        systemd.calls(),
        ["set kubepods-burstable.slice: CPUShares=512", "set kubepods-besteffort.slice: CPUShares=2"]
    );
    assert_eq!(f.read("cpu", "kubepods.slice/kubepods-burstable.slice/cpu.shares"), "512");
}

/// systemd removes a slice's cgroups in v1 hierarchies it does not use when it realizes
/// the slice again (seen with systemd 252: `devices`); a pod cgroup still gets its place.
#[test]
fn a_trimmed_qos_cgroup_comes_back_for_the_next_pod() {
    let f = Fixture::hybrid();
    let (m, _) = systemd_manager(&f, f.config());
    m.ensure_node_cgroups().unwrap();
    f.sys.rmdir(&f.path("cpuset", "kubepods.slice/kubepods-burstable.slice")).unwrap();
    m.ensure_pod_cgroup(&burstable("b1")).unwrap();
    assert_eq!(f.read("cpuset", &format!("{B}/cpuset.cpus")), "0-1");
    assert!(m.pod_cgroup_exists("b1"));
}
