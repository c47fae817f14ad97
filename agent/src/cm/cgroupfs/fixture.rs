//! Fixture cgroup trees in a tempdir that mimic a hybrid v1 node (this machine's layout)
//! and a unified v2 node, with the mountinfo text that describes them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::mounts::{CgroupLayout, parse_mountinfo};
use super::sys::FixtureSys;
use super::sys::fixture::v1_files;
use super::{CgroupfsPodContainerManager, sys::CgroupSys};
use crate::cm::{CgroupConfig, PodContainerManager as _};

/// The v1 hierarchies of these machines: (directory, super options).
const HYBRID_V1: &[(&str, &str)] = &[
    ("blkio", "blkio"),
    ("cpu", "cpu"),
    ("cpuacct", "cpuacct"),
    ("cpuset", "cpuset"),
    ("devices", "devices"),
    ("freezer", "freezer"),
    ("memory", "memory"),
    ("pids", "pids"),
    ("systemd", "xattr,name=systemd"),
];

/// Controllers a unified root offers.
pub(crate) const V2_CONTROLLERS: &str = "cpuset cpu io memory hugetlb pids rdma misc";

#[derive(Debug)]
pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub fs_root: PathBuf,
    pub mountinfo: String,
    pub sys: Arc<FixtureSys>,
}

fn write(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

impl Fixture {
    /// A hybrid node: v1 hierarchies, `name=systemd`, and a cgroup2 mount at `unified`.
    pub fn hybrid() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fs_root = dir.path().join("cgroup");
        let mut mountinfo = String::new();
        for (i, (name, options)) in HYBRID_V1.iter().enumerate() {
            let mount = fs_root.join(name);
            std::fs::create_dir_all(&mount).unwrap();
            write(&mount.join("cgroup.procs"), "");
            write(&mount.join("tasks"), "");
            for (file, content) in v1_files(name) {
                write(&mount.join(file), content);
            }
            if *name == "cpuset" {
                write(&mount.join("cpuset.cpus"), "0-1\n");
                write(&mount.join("cpuset.mems"), "0\n");
            }
            writeln!(
                mountinfo,
                "{} 31 0:{} / {} rw,relatime - cgroup cgroup rw,{options}",
                32 + i,
                29 + i,
                mount.display()
            )
            .unwrap();
        }
        let unified = fs_root.join("unified");
        std::fs::create_dir_all(&unified).unwrap();
        for file in ["cgroup.procs", "cgroup.subtree_control"] {
            write(&unified.join(file), "");
        }
        write(&unified.join("cgroup.controllers"), "hugetlb\n");
        writeln!(mountinfo, "41 31 0:38 / {} rw,relatime - cgroup2 cgroup2 rw", unified.display()).unwrap();
        Self::finish(dir, fs_root, mountinfo)
    }

    /// A unified node offering `controllers` at the root.
    pub fn unified_with(controllers: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fs_root = dir.path().join("cgroup");
        std::fs::create_dir_all(&fs_root).unwrap();
        write(&fs_root.join("cgroup.controllers"), &format!("{controllers}\n"));
        write(&fs_root.join("cgroup.subtree_control"), "");
        write(&fs_root.join("cgroup.procs"), "");
        let mountinfo = format!("30 23 0:26 / {} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", fs_root.display());
        Self::finish(dir, fs_root, mountinfo)
    }

    /// A unified node offering the usual controllers.
    pub fn unified() -> Self {
        Self::unified_with(V2_CONTROLLERS)
    }

    fn finish(dir: tempfile::TempDir, fs_root: PathBuf, mountinfo: String) -> Self {
        let layout = CgroupLayout::from_mounts(&parse_mountinfo(&mountinfo), &fs_root).unwrap();
        Self { _dir: dir, fs_root, mountinfo, sys: Arc::new(FixtureSys::new(layout)) }
    }

    pub fn config(&self) -> CgroupConfig {
        CgroupConfig { fs_root: self.fs_root.clone(), ..CgroupConfig::default() }
    }

    pub fn manager_with(&self, cfg: CgroupConfig) -> CgroupfsPodContainerManager {
        let mut m = CgroupfsPodContainerManager::build(cfg, Some(&self.mountinfo), Box::new(Arc::clone(&self.sys)))
            .expect("manager");
        m.set_remove_timeout(std::time::Duration::from_millis(100));
        m
    }

    pub fn manager(&self) -> CgroupfsPodContainerManager {
        self.manager_with(self.config())
    }

    /// A manager whose node cgroups (`kubepods` and the quality-of-service ones) are set up.
    pub fn node_manager(&self) -> CgroupfsPodContainerManager {
        self.node_manager_with(self.config())
    }

    /// [`Self::node_manager`] with `cfg`.
    pub fn node_manager_with(&self, cfg: CgroupConfig) -> CgroupfsPodContainerManager {
        let m = self.manager_with(cfg);
        m.ensure_node_cgroups().unwrap();
        m
    }

    /// Creates a cgroup as the kernel would (control files included).
    pub fn mkdir(&self, path: &Path) {
        self.sys.mkdir(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
    }

    /// `<fs_root>/<hierarchy>/<rel>`; for unified nodes pass `""` as the hierarchy.
    pub fn path(&self, hierarchy: &str, rel: &str) -> PathBuf {
        let base = if hierarchy.is_empty() { self.fs_root.clone() } else { self.fs_root.join(hierarchy) };
        base.join(rel.trim_start_matches('/'))
    }

    pub fn read(&self, hierarchy: &str, rel: &str) -> String {
        let p = self.path(hierarchy, rel);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_owned()
    }

    /// Every hierarchy directory of the fixture (v1 ones and the cgroup2 one).
    pub fn hierarchy_dirs(&self) -> Vec<&'static str> {
        if self.fs_root.join("unified").exists() {
            HYBRID_V1.iter().map(|(d, _)| *d).chain(["unified"]).collect()
        } else {
            vec![""]
        }
    }
}
