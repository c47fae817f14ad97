//! Cgroup operations against fixture trees (hybrid v1 and unified v2).

use super::fixture::Fixture;
use super::*;
use crate::cm::{CgroupConfig, Error as CmError};
use crate::types::pod_resources::test_pods::{ctr, pod};

const HYBRID_HIERARCHIES: usize = 10;

pub(super) fn guaranteed(uid: &str) -> Pod {
    pod(uid, vec![ctr("a", &[], &[("cpu", "500m"), ("memory", "256Mi")])])
}

pub(super) fn burstable(uid: &str) -> Pod {
    pod(uid, vec![ctr("a", &[("cpu", "250m"), ("memory", "64Mi")], &[("memory", "128Mi")])])
}

pub(super) fn best_effort(uid: &str) -> Pod {
    pod(uid, vec![ctr("a", &[], &[])])
}

pub(super) fn cgroup_err(err: CmError) -> Error {
    match err {
        CmError::Cgroup(e) => e,
        other => panic!("not a cgroup error: {other}"),
    }
}

#[test]
fn construction_validates_config() {
    let f = Fixture::hybrid();
    let build = |cfg| CgroupfsPodContainerManager::build(cfg, Some(&f.mountinfo), Box::new(sys::RealSys));
    assert!(build(CgroupConfig { cgroup_driver: "systemd".into(), ..f.config() }).is_ok());
    let err = build(CgroupConfig { cgroup_driver: "lxc".into(), ..f.config() }).unwrap_err();
    assert_eq!(err.to_string(), "invalid cgroupDriver \"lxc\": must be \"cgroupfs\" or \"systemd\"");
    let err = build(CgroupConfig { cgroup_root: "/a/../b".into(), ..f.config() }).unwrap_err();
    assert!(err.to_string().starts_with("invalid cgroupRoot \"/a/../b\""), "{err}");
    let err = build(CgroupConfig { fs_root: "/nowhere".into(), ..f.config() }).unwrap_err();
    assert_eq!(err.to_string(), "no cgroup hierarchies are mounted under /nowhere");
    // The driver check also guards the public constructors.
    let err = CgroupfsPodContainerManager::new(CgroupConfig { cgroup_driver: "lxc".into(), ..CgroupConfig::default() })
        .unwrap_err();
    assert!(matches!(err, Error::InvalidDriver { .. }));
    assert_eq!(f.manager().cgroup_mode(), Some(CgroupMode::Hybrid));
}

#[test]
fn required_controllers() {
    let f = Fixture::hybrid();
    let without_memory: String =
        f.mountinfo.lines().filter(|l| !l.ends_with(",memory")).flat_map(|l| [l, "\n"]).collect();
    let err =
        CgroupfsPodContainerManager::build(f.config(), Some(&without_memory), Box::new(sys::RealSys)).unwrap_err();
    assert!(err.to_string().starts_with("cgroup v1 controller memory is not mounted under "), "{err}");
    let f = Fixture::unified_with("cpu io pids");
    let err = CgroupfsPodContainerManager::build(f.config(), Some(&f.mountinfo), Box::new(sys::RealSys)).unwrap_err();
    assert!(err.to_string().starts_with("cgroup v2 controller memory is not available in "), "{err}");
}

#[test]
fn cgroup_parent_names() {
    let f = Fixture::hybrid();
    let m = f.manager();
    assert_eq!(m.cgroup_parent(&guaranteed("g1")), "/kubepods/podg1");
    assert_eq!(m.cgroup_parent(&burstable("b1")), "/kubepods/burstable/podb1");
    assert_eq!(m.cgroup_parent(&best_effort("e1")), "/kubepods/besteffort/pode1");
    for root in ["/custom/root", "custom/root/", "//custom//root"] {
        let m = f.manager_with(CgroupConfig { cgroup_root: root.into(), ..f.config() });
        assert_eq!(m.cgroup_parent(&burstable("b1")), "/custom/root/kubepods/burstable/podb1", "{root}");
    }
    let m = f.manager_with(CgroupConfig { cgroup_root: String::new(), ..f.config() });
    assert_eq!(m.cgroup_parent(&guaranteed("g1")), "/kubepods/podg1", "an empty root is /");
}

#[test]
fn cgroups_per_qos_off_is_a_no_op() {
    let f = Fixture::hybrid();
    let m = f.manager_with(CgroupConfig { cgroups_per_qos: false, ..f.config() });
    assert_eq!(m.cgroup_mode(), None);
    assert_eq!(m.cgroup_parent(&guaranteed("g1")), "");
    m.ensure_node_cgroups().unwrap();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    assert!(m.pod_cgroup_exists("g1"));
    assert!(m.list_pod_cgroups().unwrap().is_empty());
    m.remove_pod_cgroup("g1").unwrap();
    m.update_qos_cgroups(&[burstable("b")]).unwrap();
    assert!(!f.path("memory", "kubepods").exists());
}

#[test]
fn hybrid_node_cgroups() {
    let f = Fixture::hybrid();
    let m = f.node_manager();
    assert_eq!(f.hierarchy_dirs().len(), HYBRID_HIERARCHIES);
    assert_eq!(m.hierarchy_mounts().len(), HYBRID_HIERARCHIES);
    for h in f.hierarchy_dirs() {
        for rel in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
            assert!(f.path(h, rel).is_dir(), "{h}/{rel}");
        }
    }
    assert_eq!(f.read("cpu", "kubepods/besteffort/cpu.shares"), "2");
    assert_eq!(f.read("cpu", "kubepods/burstable/cpu.shares"), "1024", "burstable is set by update_qos_cgroups");
    for rel in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
        assert_eq!(f.read("cpuset", &format!("{rel}/cpuset.cpus")), "0-1", "{rel}");
        assert_eq!(f.read("cpuset", &format!("{rel}/cpuset.mems")), "0", "{rel}");
    }
    // The hybrid cgroup2 mount gets directories only.
    assert_eq!(f.read("unified", "kubepods/cgroup.procs"), "");
    assert_eq!(f.read("unified", "cgroup.subtree_control"), "");
    m.ensure_node_cgroups().unwrap();
}

#[test]
fn cgroup_root_must_exist() {
    let f = Fixture::hybrid();
    let m = f.manager_with(CgroupConfig { cgroup_root: "/swiftlet".into(), ..f.config() });
    let err = cgroup_err(m.ensure_node_cgroups().unwrap_err());
    assert!(matches!(err, Error::CgroupRootMissing { .. }));
    assert!(err.to_string().contains("/swiftlet does not exist"), "{err}");
    for h in f.hierarchy_dirs() {
        f.mkdir(&f.path(h, "swiftlet"));
    }
    m.ensure_node_cgroups().unwrap();
    assert_eq!(f.read("cpuset", "swiftlet/cpuset.cpus"), "0-1", "an empty cpuset root inherits too");
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    assert!(f.path("memory", "swiftlet/kubepods/podg1").is_dir());
}

#[test]
fn hybrid_pod_cgroups_and_limits() {
    let f = Fixture::hybrid();
    let m = f.node_manager();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    m.ensure_pod_cgroup(&burstable("b1")).unwrap();
    m.ensure_pod_cgroup(&best_effort("e1")).unwrap();
    for h in f.hierarchy_dirs() {
        for rel in ["kubepods/podg1", "kubepods/burstable/podb1", "kubepods/besteffort/pode1"] {
            assert!(f.path(h, rel).is_dir(), "{h}/{rel}");
        }
    }
    // Guaranteed: shares, quota and memory limit.
    assert_eq!(f.read("cpu", "kubepods/podg1/cpu.shares"), "512");
    assert_eq!(f.read("cpu", "kubepods/podg1/cpu.cfs_period_us"), "100000");
    assert_eq!(f.read("cpu", "kubepods/podg1/cpu.cfs_quota_us"), "50000");
    assert_eq!(f.read("memory", "kubepods/podg1/memory.limit_in_bytes"), (256 << 20).to_string());
    assert_eq!(f.read("pids", "kubepods/podg1/pids.max"), "max", "no podPidsLimit");
    assert_eq!(f.read("cpuset", "kubepods/podg1/cpuset.cpus"), "0-1");
    // Burstable: shares from requests, memory limit declared, no cpu limit → no quota.
    assert_eq!(f.read("cpu", "kubepods/burstable/podb1/cpu.shares"), "256");
    assert_eq!(f.read("cpu", "kubepods/burstable/podb1/cpu.cfs_quota_us"), "-1");
    assert_eq!(f.read("memory", "kubepods/burstable/podb1/memory.limit_in_bytes"), (128 << 20).to_string());
    // BestEffort: minimum shares only.
    assert_eq!(f.read("cpu", "kubepods/besteffort/pode1/cpu.shares"), "2");
    assert_eq!(f.read("memory", "kubepods/besteffort/pode1/memory.limit_in_bytes"), "9223372036854771712");

    // Idempotent, and an existing pod cgroup is left alone.
    std::fs::write(f.path("cpu", "kubepods/podg1/cpu.shares"), "777").unwrap();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    assert_eq!(f.read("cpu", "kubepods/podg1/cpu.shares"), "777");
    // A hierarchy missing the pod cgroup gets it back, with limits.
    f.sys.rmdir(&f.path("memory", "kubepods/podg1")).unwrap();
    assert!(!m.pod_cgroup_exists("g1"));
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    assert_eq!(f.read("memory", "kubepods/podg1/memory.limit_in_bytes"), (256 << 20).to_string());
    assert!(m.pod_cgroup_exists("g1"));
}

#[test]
fn pids_limit_and_cfs_quota_off() {
    let f = Fixture::hybrid();
    let m = f.node_manager_with(CgroupConfig { pod_pids_limit: 1024, cpu_cfs_quota: false, ..f.config() });
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    assert_eq!(f.read("pids", "kubepods/podg1/pids.max"), "1024");
    assert_eq!(f.read("cpu", "kubepods/podg1/cpu.cfs_quota_us"), "-1");
}

#[test]
fn pod_cgroup_needs_node_cgroups_and_a_sane_uid() {
    let f = Fixture::hybrid();
    let m = f.manager();
    let err = cgroup_err(m.ensure_pod_cgroup(&guaranteed("g1")).unwrap_err());
    assert!(matches!(err, Error::ParentMissing { .. }), "{err}");
    assert!(err.to_string().contains("kubepods does not exist"), "{err}");
    m.ensure_node_cgroups().unwrap();
    for uid in ["", "..", "a/b"] {
        let err = cgroup_err(m.ensure_pod_cgroup(&guaranteed(uid)).unwrap_err());
        assert!(matches!(err, Error::InvalidPodUid { .. }), "{uid}: {err}");
        assert!(m.remove_pod_cgroup(uid).is_err());
        assert!(!m.pod_cgroup_exists(uid));
    }
}

#[test]
fn listing_and_existence() {
    let f = Fixture::hybrid();
    let m = f.node_manager();
    assert!(m.list_pod_cgroups().unwrap().is_empty());
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    m.ensure_pod_cgroup(&burstable("b1")).unwrap();
    m.ensure_pod_cgroup(&best_effort("e1")).unwrap();
    // Noise the scan must skip: a bare "pod", a non-pod cgroup, a file.
    f.mkdir(&f.path("cpu", "kubepods/pod"));
    f.mkdir(&f.path("cpu", "kubepods/burstable/not-a-pod"));
    std::fs::write(f.path("cpu", "kubepods/besteffort/podfile"), "").unwrap();
    // An orphan present in one hierarchy only is still found.
    f.mkdir(&f.path("pids", "kubepods/burstable/podorphan"));
    assert_eq!(
        m.list_pod_cgroups().unwrap(),
        vec![
            ("b1".to_owned(), QosClass::Burstable),
            ("e1".to_owned(), QosClass::BestEffort),
            ("g1".to_owned(), QosClass::Guaranteed),
            ("orphan".to_owned(), QosClass::Burstable),
        ]
    );
    assert!(m.pod_cgroup_exists("g1"));
    assert!(m.pod_cgroup_exists("b1"));
    assert!(!m.pod_cgroup_exists("orphan"), "missing from the checked hierarchies");
    assert!(!m.pod_cgroup_exists("nope"));
    // Hierarchies outside upstream's allow-list do not count.
    f.sys.rmdir(&f.path("freezer", "kubepods/besteffort/pode1")).unwrap();
    f.sys.rmdir(&f.path("unified", "kubepods/besteffort/pode1")).unwrap();
    assert!(m.pod_cgroup_exists("e1"));
}

#[test]
fn removal_kills_and_removes_depth_first() {
    let f = Fixture::hybrid();
    let m = f.node_manager();
    m.ensure_pod_cgroup(&burstable("b1")).unwrap();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    // Container cgroups the runtime would have created, with processes left behind.
    let ctr = "0123456789abcdef";
    for h in f.hierarchy_dirs() {
        f.mkdir(&f.path(h, &format!("kubepods/burstable/podb1/{ctr}")));
    }
    std::fs::write(f.path("memory", &format!("kubepods/burstable/podb1/{ctr}/cgroup.procs")), "4242\n4243\n").unwrap();
    std::fs::write(f.path("cpu", &format!("kubepods/burstable/podb1/{ctr}/cgroup.procs")), "4242\n4243\n").unwrap();
    std::fs::write(f.path("pids", "kubepods/burstable/podb1/cgroup.procs"), "4244\n").unwrap();
    m.remove_pod_cgroup("b1").unwrap();
    assert_eq!(f.sys.killed(), vec![4242, 4243, 4244], "each process signalled once");
    for h in f.hierarchy_dirs() {
        assert!(!f.path(h, "kubepods/burstable/podb1").exists(), "{h}");
        assert!(f.path(h, "kubepods/podg1").exists(), "{h}: other pods stay");
    }
    assert!(!m.pod_cgroup_exists("b1"));
    m.remove_pod_cgroup("b1").unwrap();
    m.remove_pod_cgroup("never-existed").unwrap();
    assert_eq!(m.list_pod_cgroups().unwrap(), vec![("g1".to_owned(), QosClass::Guaranteed)]);
}

#[test]
fn removal_reports_the_busy_path() {
    let f = Fixture::hybrid();
    let m = f.node_manager();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    std::fs::write(f.path("memory", "kubepods/podg1/cgroup.procs"), "5000\n").unwrap();
    f.sys.make_unkillable(5000);
    let err = cgroup_err(m.remove_pod_cgroup("g1").unwrap_err());
    let busy = f.path("memory", "kubepods/podg1");
    assert!(matches!(&err, Error::Remove { path, .. } if *path == busy), "{err}");
    assert!(err.to_string().contains(&busy.display().to_string()), "{err}");
    assert!(f.sys.killed().iter().filter(|p| **p == 5000).count() > 1, "killed again while waiting");
}

#[test]
fn removal_never_signals_init_or_itself() {
    let f = Fixture::hybrid();
    let m = f.node_manager();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    let own = std::process::id();
    std::fs::write(f.path("memory", "kubepods/podg1/cgroup.procs"), format!("0\n1\n{own}\n")).unwrap();
    assert!(m.remove_pod_cgroup("g1").is_err());
    assert!(f.sys.killed().is_empty());
}

#[test]
fn unified_node_cgroups_enable_controllers() {
    let f = Fixture::unified();
    let m = f.manager();
    assert_eq!(m.cgroup_mode(), Some(CgroupMode::Unified));
    m.ensure_node_cgroups().unwrap();
    let all = "+cpu +cpuset +hugetlb +io +memory +pids";
    assert_eq!(f.read("", "cgroup.subtree_control"), all);
    for rel in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
        assert_eq!(f.read("", &format!("{rel}/cgroup.subtree_control")), all, "{rel}");
    }
    assert_eq!(f.read("", "kubepods/besteffort/cpu.weight"), "1");
    // Idempotent: nothing to enable the second time.
    m.ensure_node_cgroups().unwrap();
    assert_eq!(f.read("", "kubepods/cgroup.subtree_control"), all);
}

#[test]
fn unified_enables_only_what_is_offered_and_keeps_what_is_there() {
    let f = Fixture::unified_with("cpu memory pids rdma");
    std::fs::write(f.path("", "cgroup.subtree_control"), "rdma").unwrap();
    f.manager().ensure_node_cgroups().unwrap();
    assert_eq!(f.read("", "cgroup.subtree_control"), "+cpu +memory +pids +rdma");
    assert_eq!(f.read("", "kubepods/cgroup.subtree_control"), "+cpu +memory +pids");
}

#[test]
fn unified_hugetlb_limits() {
    use crate::cm::allocatable::Enforcement;
    use crate::cm::resources::{HugepageLimits, PodResourceConfig};
    let f = Fixture::unified();
    let pods = PodResourceConfig {
        hugepage_limits: Some(HugepageLimits { sizes: [("2MB".to_owned(), 8 << 20)].into(), others: 0 }),
        ..PodResourceConfig::default()
    };
    let m = f.manager_with(CgroupConfig {
        enforcement: Enforcement { pods: Some(pods), ..Enforcement::default() },
        ..f.config()
    });
    m.ensure_node_cgroups().unwrap();
    // kubepods: allocatable per size; the QoS cgroups: unbounded.
    assert_eq!(f.read("", "kubepods/hugetlb.2MB.max"), (8 << 20).to_string());
    assert_eq!(f.read("", "kubepods/hugetlb.1GB.max"), "0");
    assert_eq!(f.read("", "kubepods/hugetlb.2MB.rsvd.max"), "max", "reservation limits untouched");
    for qos in ["burstable", "besteffort"] {
        assert_eq!(f.read("", &format!("kubepods/{qos}/hugetlb.2MB.max")), "max", "{qos}");
    }
    // A pod: its huge page requests, every other size 0.
    let mut g = pod("h1", vec![ctr("a", &[], &[("cpu", "1"), ("memory", "64Mi"), ("hugepages-2Mi", "4Mi")])]);
    g.metadata.uid = Some("h1".into());
    m.ensure_pod_cgroup(&g).unwrap();
    assert_eq!(f.read("", "kubepods/podh1/hugetlb.2MB.max"), (4 << 20).to_string());
    assert_eq!(f.read("", "kubepods/podh1/hugetlb.1GB.max"), "0");
    m.ensure_pod_cgroup(&burstable("b1")).unwrap();
    assert_eq!(f.read("", "kubepods/burstable/podb1/hugetlb.2MB.max"), "0");
}

#[test]
fn pods_with_exclusive_cpus_get_no_cfs_quota() {
    let f = Fixture::unified();
    let m = f.manager().with_unquoted_pods(std::sync::Arc::new(|uid| uid == "g1"));
    m.ensure_node_cgroups().unwrap();
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    m.ensure_pod_cgroup(&guaranteed("g2")).unwrap();
    assert_eq!(f.read("", "kubepods/podg1/cpu.max"), "max 100000");
    assert_eq!(f.read("", "kubepods/podg2/cpu.max"), "50000 100000");
}

#[test]
fn unified_pod_limits() {
    let f = Fixture::unified();
    let m = f.node_manager_with(CgroupConfig { pod_pids_limit: 100, ..f.config() });
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    m.ensure_pod_cgroup(&burstable("b1")).unwrap();
    m.ensure_pod_cgroup(&best_effort("e1")).unwrap();
    assert_eq!(f.read("", "kubepods/podg1/cpu.weight"), "20", "512 shares");
    assert_eq!(f.read("", "kubepods/podg1/cpu.max"), "50000 100000");
    assert_eq!(f.read("", "kubepods/podg1/memory.max"), (256 << 20).to_string());
    assert_eq!(f.read("", "kubepods/podg1/pids.max"), "100");
    assert_eq!(f.read("", "kubepods/burstable/podb1/cpu.weight"), "10", "256 shares");
    assert_eq!(f.read("", "kubepods/burstable/podb1/cpu.max"), "max 100000", "untouched without cpu limits");
    assert_eq!(f.read("", "kubepods/burstable/podb1/memory.max"), (128 << 20).to_string());
    assert_eq!(f.read("", "kubepods/besteffort/pode1/cpu.weight"), "1");
    assert_eq!(f.read("", "kubepods/besteffort/pode1/memory.max"), "max");
    assert_eq!(m.cgroup_parent(&guaranteed("g1")), "/kubepods/podg1");
    assert!(m.pod_cgroup_exists("b1"));
    m.remove_pod_cgroup("b1").unwrap();
    assert!(!f.path("", "kubepods/burstable/podb1").exists());
    assert_eq!(
        m.list_pod_cgroups().unwrap(),
        vec![("e1".to_owned(), QosClass::BestEffort), ("g1".to_owned(), QosClass::Guaranteed)]
    );
}

/// Under the cgroupfs driver `_` is an ordinary character, in the root and in a pod
/// uid: no systemd slice name is ever made of them.
#[test]
fn underscores_are_fine_under_cgroupfs() {
    let f = Fixture::unified();
    let m = f.manager_with(CgroupConfig { cgroup_root: "/my_root".into(), ..f.config() });
    std::fs::write(f.path("", "cgroup.subtree_control"), "+cpu +memory").unwrap();
    f.mkdir(&f.path("", "my_root"));
    m.ensure_node_cgroups().unwrap();
    m.ensure_pod_cgroup(&guaranteed("g_1")).unwrap();
    assert_eq!(f.read("", "my_root/kubepods/podg_1/memory.max"), (256 << 20).to_string());
    assert_eq!(m.list_pod_cgroups().unwrap(), [("g_1".to_owned(), QosClass::Guaranteed)]);
}

#[test]
fn unified_nested_cgroup_root() {
    let f = Fixture::unified();
    let m = f.manager_with(CgroupConfig { cgroup_root: "/a/b".into(), ..f.config() });
    assert!(m.ensure_node_cgroups().is_err());
    // The operator creates the root; controllers are enabled all the way down.
    std::fs::write(f.path("", "cgroup.subtree_control"), "+cpu +memory").unwrap();
    f.mkdir(&f.path("", "a"));
    std::fs::write(f.path("", "a/cgroup.subtree_control"), "+cpu +memory").unwrap();
    f.mkdir(&f.path("", "a/b"));
    m.ensure_node_cgroups().unwrap();
    assert_eq!(f.read("", "a/cgroup.subtree_control"), "+cpu +memory", "a only offers what / enabled");
    assert_eq!(f.read("", "cgroup.subtree_control"), "+cpu +cpuset +hugetlb +io +memory +pids");
    m.ensure_pod_cgroup(&guaranteed("g1")).unwrap();
    assert_eq!(f.read("", "a/b/kubepods/podg1/memory.max"), (256 << 20).to_string());
}

#[test]
fn failed_limits_undo_the_pod_cgroup() {
    let f = Fixture::unified();
    let m = f.node_manager();
    // Someone disabled memory below burstable: memory.max will be missing.
    std::fs::write(f.path("", "kubepods/burstable/cgroup.subtree_control"), "+cpu").unwrap();
    let err = cgroup_err(m.ensure_pod_cgroup(&burstable("b1")).unwrap_err());
    assert!(matches!(&err, Error::Write { path, .. } if path.ends_with("podb1/memory.max")), "{err}");
    assert!(!f.path("", "kubepods/burstable/podb1").exists(), "rolled back");
}

#[test]
fn qos_cgroup_weights_follow_burstable_requests() {
    let pods = [burstable("b1"), pod("b2", vec![ctr("a", &[("cpu", "1")], &[])]), guaranteed("g1"), best_effort("e1")];
    let f = Fixture::hybrid();
    let m = f.node_manager();
    m.update_qos_cgroups(&pods).unwrap();
    assert_eq!(f.read("cpu", "kubepods/burstable/cpu.shares"), "1280", "250m + 1 cpu");
    assert_eq!(f.read("cpu", "kubepods/besteffort/cpu.shares"), "2");
    m.update_qos_cgroups(&[]).unwrap();
    assert_eq!(f.read("cpu", "kubepods/burstable/cpu.shares"), "2");

    let f = Fixture::unified();
    let m = f.manager();
    let err = cgroup_err(m.update_qos_cgroups(&pods).unwrap_err());
    assert!(matches!(err, Error::ParentMissing { .. }));
    m.ensure_node_cgroups().unwrap();
    m.update_qos_cgroups(&pods).unwrap();
    assert_eq!(f.read("", "kubepods/burstable/cpu.weight"), "49");
}

#[test]
fn node_allocatable_is_enforced_on_kubepods_and_reserved_cgroups() {
    use crate::cm::allocatable::Enforcement;
    let f = Fixture::hybrid();
    let limits = |shares, memory, pids| PodResourceConfig {
        cpu_shares: shares,
        memory_limit: memory,
        pids_limit: pids,
        ..PodResourceConfig::default()
    };
    let enforcement = Enforcement {
        pods: Some(limits(Some(3584), Some(8 << 30), Some(4_000_000))),
        kube_reserved: None,
        system_reserved: Some(("/system.slice".into(), limits(None, Some(1 << 30), None))),
    };
    let m = f.manager_with(CgroupConfig { enforcement, ..f.config() });
    let err = cgroup_err(m.ensure_node_cgroups().unwrap_err());
    assert!(
        err.to_string().starts_with(
            "Failed to enforce System Reserved Cgroup Limits on \"/system.slice\": \"/system.slice\" cgroup does not exist"
        ),
        "{err}"
    );
    for h in f.hierarchy_dirs() {
        f.mkdir(&f.path(h, "system.slice"));
    }
    m.ensure_node_cgroups().unwrap();
    assert_eq!(f.read("cpu", "kubepods/cpu.shares"), "3584");
    assert_eq!(f.read("memory", "kubepods/memory.limit_in_bytes"), (8u64 << 30).to_string());
    assert_eq!(f.read("pids", "kubepods/pids.max"), "4000000");
    assert_eq!(f.read("memory", "system.slice/memory.limit_in_bytes"), (1u64 << 30).to_string());
}
