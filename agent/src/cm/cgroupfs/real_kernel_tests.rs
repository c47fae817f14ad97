//! Real-kernel test: node, `QoS` and pod cgroups created, filled with a real process and
//! removed on this machine's cgroup hierarchies (v1 hybrid here, v2 where the host is), as
//! root, under a cgroup root unique to the test process. A drop guard removes everything the
//! test created, whatever happens; cgroups that existed before are never touched.
//!
//! It runs with the unit tests and fails with a clear message when not root; set
//! `SWIFTLET_REAL_CGROUPS_TEST=0` to skip it (it says so on stderr).

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{CgroupMode, CgroupfsPodContainerManager, cgroup_tree_post_order};
use crate::cm::{CgroupConfig, PodContainerManager};
use crate::types::pod_resources::test_pods::{ctr, pod};
use crate::types::qos::QosClass;

/// Removes the test's cgroup root from every hierarchy and kills the test's process.
struct Cleanup {
    roots: Vec<PathBuf>,
    child: Option<i32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(pid) = self.child {
            // Our own child: it is either still running or already reaped by the waiter.
            // SAFETY: plain integer syscall.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for root in &self.roots {
            if !root.exists() {
                continue;
            }
            let mut tree = Vec::new();
            cgroup_tree_post_order(root, &mut tree);
            for dir in tree {
                // A just-killed task can keep a cgroup busy for a moment.
                let removed = (0..50).any(|_| {
                    let ok = std::fs::remove_dir(&dir).is_ok() || !dir.exists();
                    if !ok {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    ok
                });
                if !removed {
                    eprintln!("real cgroup test cleanup: could not remove {}", dir.display());
                }
            }
        }
    }
}

fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_owned()
}

#[test]
fn real_pod_cgroups_on_this_host() {
    if std::env::var("SWIFTLET_REAL_CGROUPS_TEST").as_deref() == Ok("0") {
        eprintln!("SKIPPED real_pod_cgroups_on_this_host: SWIFTLET_REAL_CGROUPS_TEST=0");
        return;
    }
    assert_eq!(
        effective_uid(),
        Some(0),
        "the real cgroup test needs root (set SWIFTLET_REAL_CGROUPS_TEST=0 to skip it)"
    );
    let fs_root = Path::new("/sys/fs/cgroup");
    assert!(
        fs_root.join("memory").is_dir() || fs_root.join("cgroup.controllers").is_file(),
        "no cgroup v1 memory hierarchy nor cgroup v2 at /sys/fs/cgroup"
    );

    let root_name = format!("swiftlet-cm-test-{}", std::process::id());
    let cfg = CgroupConfig { cgroup_root: format!("/{root_name}"), pod_pids_limit: 4096, ..CgroupConfig::default() };
    let mut m = CgroupfsPodContainerManager::new(cfg).expect("manager on this host");
    m.remove_timeout = Duration::from_secs(5);
    let mode = m.cgroup_mode().expect("cgroups per QoS");
    let mounts = m.hierarchy_mounts();
    let mut cleanup = Cleanup { roots: mounts.iter().map(|h| h.join(&root_name)).collect(), child: None };

    // The operator's job: the cgroup root exists before the kubelet starts.
    assert!(m.ensure_node_cgroups().is_err(), "the root does not exist yet");
    for root in &cleanup.roots {
        std::fs::create_dir(root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    }
    m.ensure_node_cgroups().expect("node cgroups");
    m.ensure_node_cgroups().expect("node cgroups, again");

    let guaranteed =
        pod("11111111-0000-4000-8000-000000000001", vec![ctr("a", &[], &[("cpu", "500m"), ("memory", "256Mi")])]);
    let burstable =
        pod("11111111-0000-4000-8000-000000000002", vec![ctr("a", &[("cpu", "250m")], &[("memory", "128Mi")])]);
    let best_effort = pod("11111111-0000-4000-8000-000000000003", vec![ctr("a", &[], &[])]);
    for p in [&guaranteed, &burstable, &best_effort] {
        m.ensure_pod_cgroup(p).expect("pod cgroup");
        m.ensure_pod_cgroup(p).expect("pod cgroup, again");
    }
    m.update_qos_cgroups(std::slice::from_ref(&burstable)).expect("qos cgroups");

    let uid = |p: &k8s_openapi::api::core::v1::Pod| p.metadata.uid.clone().unwrap();
    let parent_of = |p: &k8s_openapi::api::core::v1::Pod| m.cgroup_parent(p);
    assert_eq!(parent_of(&burstable), format!("/{root_name}/kubepods/burstable/pod{}", uid(&burstable)));
    for mount in &mounts {
        for p in [&guaranteed, &burstable, &best_effort] {
            let dir = mount.join(parent_of(p).trim_start_matches('/'));
            assert!(dir.is_dir(), "{}", dir.display());
        }
    }
    let at = |mount: &Path, p: &k8s_openapi::api::core::v1::Pod, file: &str| {
        mount.join(parent_of(p).trim_start_matches('/')).join(file)
    };
    match mode {
        CgroupMode::Unified => {
            let h = &mounts[0];
            assert_eq!(read(&at(h, &guaranteed, "cpu.weight")), "20");
            assert_eq!(read(&at(h, &guaranteed, "cpu.max")), "50000 100000");
            assert_eq!(read(&at(h, &guaranteed, "memory.max")), (256 << 20).to_string());
            assert_eq!(read(&at(h, &burstable, "pids.max")), "4096");
        }
        CgroupMode::Hybrid | CgroupMode::Legacy => {
            let cpu = fs_root.join("cpu");
            let memory = fs_root.join("memory");
            assert_eq!(read(&at(&cpu, &guaranteed, "cpu.shares")), "512");
            assert_eq!(read(&at(&cpu, &guaranteed, "cpu.cfs_quota_us")), "50000");
            assert_eq!(read(&at(&cpu, &burstable, "cpu.shares")), "256");
            assert_eq!(read(&at(&cpu, &burstable, "cpu.cfs_quota_us")), "-1");
            assert_eq!(read(&at(&cpu, &best_effort, "cpu.shares")), "2");
            assert_eq!(read(&at(&memory, &guaranteed, "memory.limit_in_bytes")), (256 << 20).to_string());
            assert_eq!(read(&at(&memory, &burstable, "memory.limit_in_bytes")), (128 << 20).to_string());
            assert_eq!(read(&at(&fs_root.join("pids"), &burstable, "pids.max")), "4096");
            assert_eq!(
                read(&at(&fs_root.join("cpuset"), &guaranteed, "cpuset.cpus")),
                read(&fs_root.join("cpuset/cpuset.cpus"))
            );
            assert_eq!(read(&cpu.join(&root_name).join("kubepods/burstable/cpu.shares")), "256");
            assert_eq!(read(&cpu.join(&root_name).join("kubepods/besteffort/cpu.shares")), "2");
        }
    }
    for p in [&guaranteed, &burstable, &best_effort] {
        assert!(m.pod_cgroup_exists(&uid(p)));
    }
    let mut listed = m.list_pod_cgroups().unwrap();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            (uid(&guaranteed), QosClass::Guaranteed),
            (uid(&burstable), QosClass::Burstable),
            (uid(&best_effort), QosClass::BestEffort),
        ]
    );

    // A "container" cgroup under the burstable pod, holding a real process, as the runtime
    // would leave it behind.
    let mut child = Command::new("sleep").arg("300").stdin(Stdio::null()).spawn().expect("spawn sleep");
    let pid = child.id();
    cleanup.child = Some(i32::try_from(pid).unwrap());
    let (exited_tx, exited) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exited_tx.send(child.wait());
    });
    for mount in &mounts {
        let ctr_dir = at(mount, &burstable, "0123456789abcdef");
        std::fs::create_dir(&ctr_dir).unwrap_or_else(|e| panic!("{}: {e}", ctr_dir.display()));
        if mount.ends_with("cpuset") {
            // A cpuset cgroup needs cpus and mems before it can hold a task.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                std::fs::write(ctr_dir.join(f), read(&ctr_dir.parent().unwrap().join(f))).unwrap();
            }
        }
        std::fs::write(ctr_dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", ctr_dir.display()));
    }

    m.remove_pod_cgroup(&uid(&burstable)).expect("remove the pod cgroup with a process in it");
    let status = exited.recv_timeout(Duration::from_secs(10)).expect("the process exits").expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "killed by the manager");
    for mount in &mounts {
        assert!(!at(mount, &burstable, "").exists(), "{}", mount.display());
    }
    assert!(!m.pod_cgroup_exists(&uid(&burstable)));

    m.remove_pod_cgroup(&uid(&guaranteed)).unwrap();
    m.remove_pod_cgroup(&uid(&best_effort)).unwrap();
    m.remove_pod_cgroup(&uid(&best_effort)).unwrap();
    assert!(m.list_pod_cgroups().unwrap().is_empty());
    drop(cleanup);
    for mount in &mounts {
        assert!(!mount.join(&root_name).exists(), "cleaned up in {}", mount.display());
    }
}
