//! Which cgroup hierarchies a node has: parsed from `/proc/self/mountinfo`.
//!
//! Three layouts exist in the wild and all are handled:
//! - **unified** (cgroup v2 only): one `cgroup2` mount at the cgroup fs root
//!   (`/sys/fs/cgroup`), controllers listed in its `cgroup.controllers`;
//! - **hybrid** (these machines): one `cgroup` (v1) mount per controller set under the fs
//!   root, a `name=systemd` v1 hierarchy, and a `cgroup2` mount at `<root>/unified` that the
//!   runtime also creates container cgroups in (it has no controllers we use);
//! - **legacy**: v1 mounts only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`, reduced to what cgroup detection needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// Where it is mounted (unescaped).
    pub point: PathBuf,
    /// Filesystem type (`cgroup`, `cgroup2`, ...).
    pub fstype: String,
    /// Superblock options: for v1 cgroups, the controllers and `name=...`.
    pub super_options: Vec<String>,
    /// The optional fields: propagation (`shared:N`, `master:N`, `unbindable`), none for
    /// a private mount.
    pub optional: Vec<String>,
}

/// Undoes the octal escapes (`\040` for a space) of mountinfo paths.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mount-point options [optional...] - fstype source super
            let (left, right) = line.split_once(" - ")?;
            let mut left = left.split(' ');
            let mount_point = left.nth(4)?;
            // After the mount options (the sixth field), up to the separator.
            let optional = left.skip(1).filter(|f| !f.is_empty()).map(str::to_owned).collect();
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let super_options = right.next().unwrap_or("").split(',').map(str::to_owned).collect();
            Some(Mount { point: unescape(mount_point).into(), fstype: fstype.to_owned(), super_options, optional })
        })
        .collect()
}

/// The v1 controllers runc creates cgroups for (its `fs` subsystem list).
pub(crate) const KNOWN_V1_CONTROLLERS: &[&str] = &[
    "cpuset",
    "cpu",
    "cpuacct",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "perf_event",
    "hugetlb",
    "pids",
    "blkio",
    "rdma",
    "misc",
];

/// The named v1 hierarchy runc also joins.
pub(crate) const SYSTEMD_HIERARCHY: &str = "name=systemd";

/// The cgroup version a node runs, as the kubelet sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// cgroup v1 only.
    Legacy,
    /// cgroup v1 for controllers, plus a controller-less cgroup2 mount.
    Hybrid,
    /// cgroup v2 only.
    Unified,
}

/// What a hierarchy is and therefore what the manager does in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HierarchyKind {
    /// A v1 hierarchy: its controllers (and `name=systemd` for the named one).
    V1(BTreeSet<String>),
    /// The cgroup2 hierarchy of a unified node: controllers offered by the root.
    Unified(BTreeSet<String>),
    /// The cgroup2 mount of a hybrid node: directories only.
    HybridUnified,
}

/// One mounted hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hierarchy {
    /// Its mount point.
    pub mount: PathBuf,
    /// Its kind.
    pub kind: HierarchyKind,
}

impl Hierarchy {
    /// Whether the hierarchy has `controller` (v1: mounted with it; unified: offered).
    pub fn has(&self, controller: &str) -> bool {
        match &self.kind {
            HierarchyKind::V1(c) | HierarchyKind::Unified(c) => c.contains(controller),
            HierarchyKind::HybridUnified => false,
        }
    }
}

/// All cgroup hierarchies of a node under one cgroup fs root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupLayout {
    /// The version.
    pub mode: CgroupMode,
    /// The hierarchies, v1 ones sorted by mount point, any cgroup2 one last.
    pub hierarchies: Vec<Hierarchy>,
}

/// Errors detecting the layout.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Nothing cgroup-like is mounted under the fs root.
    #[error("no cgroup hierarchies are mounted under {fs_root}")]
    NoCgroupMounts {
        /// The fs root looked at.
        fs_root: PathBuf,
    },
    /// The unified root's `cgroup.controllers` could not be read.
    #[error("failed to read {path}: {source}")]
    ReadControllers {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl CgroupLayout {
    /// Picks the cgroup mounts at or under `fs_root`. When one hierarchy is mounted
    /// twice, the shortest mount point wins, as in the kubelet.
    pub fn from_mounts(mounts: &[Mount], fs_root: &Path) -> Result<Self, LayoutError> {
        let under_root = |m: &&Mount| m.point.starts_with(fs_root);
        if let Some(unified) = mounts.iter().filter(under_root).find(|m| m.fstype == "cgroup2" && m.point == fs_root) {
            let path = unified.point.join("cgroup.controllers");
            let text =
                std::fs::read_to_string(&path).map_err(|source| LayoutError::ReadControllers { path, source })?;
            let controllers = text.split_whitespace().map(str::to_owned).collect();
            return Ok(Self {
                mode: CgroupMode::Unified,
                hierarchies: vec![Hierarchy {
                    mount: unified.point.clone(),
                    kind: HierarchyKind::Unified(controllers),
                }],
            });
        }
        let mut v1: Vec<(BTreeSet<String>, PathBuf)> = Vec::new();
        for m in mounts.iter().filter(under_root).filter(|m| m.fstype == "cgroup") {
            let controllers: BTreeSet<String> = m
                .super_options
                .iter()
                .filter(|o| KNOWN_V1_CONTROLLERS.contains(&o.as_str()) || o.as_str() == SYSTEMD_HIERARCHY)
                .cloned()
                .collect();
            if controllers.is_empty() {
                continue;
            }
            match v1.iter_mut().find(|(c, _)| *c == controllers) {
                Some((_, mount)) if m.point.as_os_str().len() < mount.as_os_str().len() => {
                    mount.clone_from(&m.point);
                }
                Some(_) => {}
                None => v1.push((controllers, m.point.clone())),
            }
        }
        v1.sort_by(|a, b| a.1.cmp(&b.1));
        let mut hierarchies: Vec<Hierarchy> =
            v1.into_iter().map(|(c, mount)| Hierarchy { mount, kind: HierarchyKind::V1(c) }).collect();
        let hybrid = mounts
            .iter()
            .filter(under_root)
            .filter(|m| m.fstype == "cgroup2")
            .min_by_key(|m| m.point.as_os_str().len());
        if hierarchies.is_empty() {
            return Err(LayoutError::NoCgroupMounts { fs_root: fs_root.to_owned() });
        }
        let mode = if let Some(h) = hybrid {
            hierarchies.push(Hierarchy { mount: h.point.clone(), kind: HierarchyKind::HybridUnified });
            CgroupMode::Hybrid
        } else {
            CgroupMode::Legacy
        };
        Ok(Self { mode, hierarchies })
    }

    /// The node runs cgroup v2 only.
    pub fn is_unified(&self) -> bool {
        self.mode == CgroupMode::Unified
    }

    /// Whether the kubelet can use `controller`: a v1 hierarchy has it, or the unified root
    /// offers it (a hybrid node's cgroup2 mount does not count: runc uses v1 there).
    pub fn has_controller(&self, controller: &str) -> bool {
        self.hierarchies.iter().any(|h| h.has(controller))
    }

    /// The mount point of the v1 hierarchy holding `controller`.
    pub fn v1_mount_of(&self, controller: &str) -> Option<&Path> {
        self.hierarchies
            .iter()
            .find(|h| matches!(&h.kind, HierarchyKind::V1(c) if c.contains(controller)))
            .map(|h| h.mount.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's mountinfo, verbatim.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_lines() {
        let mounts = parse_mountinfo(
            "25 30 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,xattr,cpu,cpuacct\n\
             bogus line\n\
             26 30 0:24 / /mnt/with\\040space rw - ext4 /dev/sda1 rw\n",
        );
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].point, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(mounts[0].fstype, "cgroup");
        assert_eq!(mounts[0].super_options, vec!["rw", "xattr", "cpu", "cpuacct"]);
        assert_eq!(mounts[1].point, PathBuf::from("/mnt/with space"));
    }

    #[test]
    fn hybrid_layout() {
        let layout = CgroupLayout::from_mounts(&parse_mountinfo(HYBRID), Path::new("/sys/fs/cgroup")).unwrap();
        assert_eq!(layout.mode, CgroupMode::Hybrid);
        let mounts: Vec<_> = layout.hierarchies.iter().map(|h| h.mount.to_str().unwrap()).collect();
        assert_eq!(
            mounts,
            [
                "/sys/fs/cgroup/blkio",
                "/sys/fs/cgroup/cpu",
                "/sys/fs/cgroup/cpuacct",
                "/sys/fs/cgroup/cpuset",
                "/sys/fs/cgroup/devices",
                "/sys/fs/cgroup/freezer",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/pids",
                "/sys/fs/cgroup/systemd",
                "/sys/fs/cgroup/unified",
            ]
        );
        assert_eq!(layout.hierarchies.last().unwrap().kind, HierarchyKind::HybridUnified);
        assert_eq!(layout.v1_mount_of("memory"), Some(Path::new("/sys/fs/cgroup/memory")));
        assert!(layout.has_controller("pids"));
        assert!(!layout.has_controller("hugetlb"));
        assert!(!layout.is_unified());
    }

    #[test]
    fn legacy_layout_with_comounts_and_duplicates() {
        let text = "\
1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
2 0 0:1 / /var/lib/x/cpu rw - cgroup cgroup rw,cpu,cpuacct
3 0 0:1 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
4 0 0:1 / /sys/fs/cgroup/memory/again rw - cgroup cgroup rw,memory
5 0 0:1 / /sys/fs/cgroup/misc-named rw - cgroup cgroup rw,name=other
";
        let layout = CgroupLayout::from_mounts(&parse_mountinfo(text), Path::new("/sys/fs/cgroup")).unwrap();
        assert_eq!(layout.mode, CgroupMode::Legacy);
        assert_eq!(layout.hierarchies.len(), 2, "outside-root, duplicate and unknown named mounts are ignored");
        assert_eq!(layout.v1_mount_of("cpuacct"), Some(Path::new("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(layout.v1_mount_of("memory"), Some(Path::new("/sys/fs/cgroup/memory")));
    }

    #[test]
    fn unified_layout() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n").unwrap();
        let text = format!("30 23 0:26 / {} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", dir.path().display());
        let layout = CgroupLayout::from_mounts(&parse_mountinfo(&text), dir.path()).unwrap();
        assert!(layout.is_unified());
        assert_eq!(layout.hierarchies.len(), 1);
        assert!(layout.has_controller("hugetlb"));
        assert!(layout.v1_mount_of("memory").is_none());
    }

    #[test]
    fn nothing_mounted() {
        let err = CgroupLayout::from_mounts(&parse_mountinfo(HYBRID), Path::new("/elsewhere")).unwrap_err();
        assert_eq!(err.to_string(), "no cgroup hierarchies are mounted under /elsewhere");
    }
}
