//! The syscall layer under the cgroupfs manager: mkdir, rmdir and kill.
//!
//! Control files are read and written with plain file I/O, which behaves the same on
//! cgroupfs and on a fixture tree. Creating and removing cgroups and killing processes do
//! not (on cgroupfs a new directory comes with its control files, and rmdir removes a
//! directory that still "contains" them), so they go through [`CgroupSys`]: [`RealSys`] on a
//! node, `FixtureSys` in unit tests.

use std::fmt;
use std::io;
use std::path::Path;

/// Creating and removing cgroup directories and killing their processes.
pub(crate) trait CgroupSys: Send + Sync + fmt::Debug {
    /// Creates one cgroup directory (not its parents); `AlreadyExists` if it exists.
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    /// Removes one empty cgroup directory; `EBUSY` while it has processes or children.
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// Sends SIGKILL to `pid`; `ESRCH` if it is gone.
    fn kill(&self, pid: i32) -> io::Result<()>;
}

impl<T: CgroupSys + ?Sized> CgroupSys for std::sync::Arc<T> {
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        (**self).mkdir(path)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        (**self).rmdir(path)
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        (**self).kill(pid)
    }
}

/// The kernel.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RealSys;

impl CgroupSys for RealSys {
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }
}

#[cfg(test)]
pub(crate) use fixture::FixtureSys;

#[cfg(test)]
pub(crate) mod fixture {
    //! A cgroupfs look-alike on a tempdir: mkdir creates the control files the kernel
    //! would, rmdir refuses populated or parent cgroups and removes the control files, and
    //! kill "exits" a process by removing it from every `cgroup.procs`.

    use std::collections::BTreeSet;
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use super::CgroupSys;
    use crate::cm::cgroupfs::mounts::{CgroupLayout, HierarchyKind};

    #[derive(Debug)]
    pub(crate) struct FixtureSys {
        layout: CgroupLayout,
        state: Mutex<State>,
    }

    #[derive(Debug, Default)]
    struct State {
        killed: Vec<i32>,
        unkillable: BTreeSet<i32>,
    }

    fn busy() -> io::Error {
        io::Error::from_raw_os_error(libc::EBUSY)
    }

    fn read_set(path: &Path) -> BTreeSet<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
            .map(|c| c.trim_start_matches('+').to_owned())
            .collect()
    }

    /// Control files a fresh cgroup has for each controller (name, initial content).
    pub(crate) fn v1_files(controller: &str) -> &'static [(&'static str, &'static str)] {
        match controller {
            "cpu" => &[("cpu.shares", "1024\n"), ("cpu.cfs_period_us", "100000\n"), ("cpu.cfs_quota_us", "-1\n")],
            "memory" => &[("memory.limit_in_bytes", "9223372036854771712\n")],
            "pids" => &[("pids.max", "max\n")],
            "cpuset" => &[("cpuset.cpus", "\n"), ("cpuset.mems", "\n")],
            _ => &[],
        }
    }

    pub(crate) fn v2_files(controller: &str) -> &'static [(&'static str, &'static str)] {
        match controller {
            "cpu" => &[("cpu.weight", "100\n"), ("cpu.max", "max 100000\n")],
            "memory" => &[("memory.max", "max\n")],
            "pids" => &[("pids.max", "max\n")],
            "cpuset" => &[("cpuset.cpus", "\n"), ("cpuset.mems", "\n")],
            "io" => &[("io.weight", "default 100\n")],
            "hugetlb" => &[
                ("hugetlb.2MB.max", "max\n"),
                ("hugetlb.2MB.rsvd.max", "max\n"),
                ("hugetlb.1GB.max", "max\n"),
                ("hugetlb.1GB.rsvd.max", "max\n"),
            ],
            _ => &[],
        }
    }

    impl FixtureSys {
        pub(crate) fn new(layout: CgroupLayout) -> Self {
            Self { layout, state: Mutex::default() }
        }

        /// Pids that ignore SIGKILL (a task stuck in D state, say).
        pub(crate) fn make_unkillable(&self, pid: i32) {
            self.state.lock().unwrap().unkillable.insert(pid);
        }

        pub(crate) fn killed(&self) -> Vec<i32> {
            self.state.lock().unwrap().killed.clone()
        }

        fn hierarchy_of(&self, path: &Path) -> Option<&HierarchyKind> {
            self.layout.hierarchies.iter().find(|h| path.starts_with(&h.mount)).map(|h| &h.kind)
        }

        fn walk_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
            out.push(dir.to_owned());
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    Self::walk_dirs(&entry.path(), out);
                }
            }
        }
    }

    impl CgroupSys for FixtureSys {
        fn mkdir(&self, path: &Path) -> io::Result<()> {
            std::fs::create_dir(path)?;
            let mut files: Vec<(String, String)> = vec![("cgroup.procs".into(), String::new())];
            match self.hierarchy_of(path) {
                Some(HierarchyKind::V1(controllers)) => {
                    files.push(("tasks".into(), String::new()));
                    for c in controllers {
                        files.extend(v1_files(c).iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())));
                    }
                }
                Some(HierarchyKind::Unified(_)) => {
                    let enabled =
                        path.parent().map(|p| read_set(&p.join("cgroup.subtree_control"))).unwrap_or_default();
                    files.push(("cgroup.subtree_control".into(), String::new()));
                    let list: Vec<_> = enabled.iter().map(String::as_str).collect();
                    files.push(("cgroup.controllers".into(), format!("{}\n", list.join(" "))));
                    for c in &enabled {
                        files.extend(v2_files(c).iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())));
                    }
                }
                Some(HierarchyKind::HybridUnified) | None => {}
            }
            for (name, content) in files {
                std::fs::write(path.join(name), content)?;
            }
            Ok(())
        }

        fn rmdir(&self, path: &Path) -> io::Result<()> {
            let mut subdirs = Vec::new();
            let mut files = Vec::new();
            for entry in std::fs::read_dir(path)? {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    subdirs.push(entry.path());
                } else {
                    files.push(entry.path());
                }
            }
            let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
            if !subdirs.is_empty() || !procs.trim().is_empty() {
                return Err(busy());
            }
            for f in files {
                std::fs::remove_file(f)?;
            }
            std::fs::remove_dir(path)
        }

        fn kill(&self, pid: i32) -> io::Result<()> {
            let mut state = self.state.lock().unwrap();
            state.killed.push(pid);
            if state.unkillable.contains(&pid) {
                return Ok(());
            }
            let mut found = false;
            for h in &self.layout.hierarchies {
                let mut dirs = Vec::new();
                Self::walk_dirs(&h.mount, &mut dirs);
                for dir in dirs {
                    let procs = dir.join("cgroup.procs");
                    let Ok(text) = std::fs::read_to_string(&procs) else {
                        continue;
                    };
                    let kept: Vec<&str> = text.lines().filter(|l| l.trim() != pid.to_string()).collect();
                    if kept.len() != text.lines().count() {
                        found = true;
                        std::fs::write(&procs, kept.iter().flat_map(|l| [*l, "\n"]).collect::<String>())?;
                    }
                }
            }
            if found { Ok(()) } else { Err(io::Error::from_raw_os_error(libc::ESRCH)) }
        }
    }
}
