//! Cgroup identity as the kernel sees it: a cgroup is `(hierarchy id, kernfs node id)`.
//!
//! On cgroup2 the hierarchy id is always 0 and the node id is the directory's inode
//! (and what `bpf_get_current_cgroup_id()` returns). On v1 each hierarchy numbers its
//! nodes on its own, so the same id can name unrelated cgroups in `memory` and `cpu`;
//! the hierarchy id (as in `/proc/cgroups` and `/proc/<pid>/cgroup`) tells them apart.
//! On 64-bit kernels `kn->id` is the inode number of the directory in every hierarchy
//! (the real-kernel tests check this against the ids the sensors report).

use std::{
    collections::BTreeSet,
    fmt, fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Component, Path, PathBuf},
};

/// Where the kernel describes mounts and hierarchies; fixed paths so tests can feed text.
const MOUNTINFO: &str = "/proc/self/mountinfo";
const PROC_SELF_CGROUP: &str = "/proc/self/cgroup";
const PROC_CGROUPS: &str = "/proc/cgroups";

/// A cgroup: the hierarchy it lives in and its id within that hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupId {
    /// Hierarchy id: 0 for cgroup2, otherwise the v1 hierarchy's id from `/proc/cgroups`.
    pub hierarchy_id: u32,
    /// The cgroup's kernfs node id: the inode number of its directory.
    pub id: u64,
}

impl CgroupId {
    /// The hierarchy id of cgroup2 (the kernel's default hierarchy).
    pub const UNIFIED_HIERARCHY: u32 = 0;

    /// A cgroup2 cgroup by id (the inode of its directory).
    #[must_use]
    pub const fn unified(id: u64) -> Self {
        Self { hierarchy_id: Self::UNIFIED_HIERARCHY, id }
    }

    /// Whether this cgroup is on the cgroup2 hierarchy.
    #[must_use]
    pub const fn is_unified(&self) -> bool {
        self.hierarchy_id == Self::UNIFIED_HIERARCHY
    }

    /// Resolves a cgroup directory (e.g. `/sys/fs/cgroup/memory/kubepods`) to its id,
    /// from the directory's inode and the mount it lives on.
    pub fn of_dir(dir: &Path) -> Result<Self, CgroupError> {
        Ok(CgroupDir::resolve(dir)?.id)
    }
}

impl fmt::Display for CgroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.hierarchy_id, self.id)
    }
}

/// Why a directory could not be resolved to a cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The directory could not be inspected.
    #[error("cannot stat cgroup directory {}", path.display())]
    Stat {
        /// The directory.
        path: PathBuf,
        /// What `stat`/`realpath` returned.
        #[source]
        io_error: io::Error,
    },

    /// The path exists but is not a directory.
    #[error("{} is not a directory, so not a cgroup", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },

    /// The directory is not on a cgroup or cgroup2 mount.
    #[error("{} is not inside a mounted cgroup hierarchy (no cgroup/cgroup2 mount in {MOUNTINFO})", path.display())]
    NotACgroup {
        /// The directory.
        path: PathBuf,
    },

    /// A `/proc` file that describes cgroups could not be read.
    #[error("cannot read {path}")]
    ReadProc {
        /// The file.
        path: &'static str,
        /// The read error.
        #[source]
        io_error: io::Error,
    },

    /// A v1 mount whose controllers match no hierarchy the kernel lists.
    #[error(
        "cannot find the v1 hierarchy of {} (mount options `{options}`) in {PROC_SELF_CGROUP}",
        path.display()
    )]
    UnknownHierarchy {
        /// The directory.
        path: PathBuf,
        /// The mount's super options.
        options: String,
    },
}

/// A resolved cgroup directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CgroupDir {
    pub(crate) id: CgroupId,
    /// Depth below the hierarchy root (the root is level 0).
    pub(crate) level: u32,
}

impl CgroupDir {
    pub(crate) fn resolve(dir: &Path) -> Result<Self, CgroupError> {
        let stat_error = |io_error| CgroupError::Stat { path: dir.to_path_buf(), io_error };
        let canonical = fs::canonicalize(dir).map_err(stat_error)?;
        let metadata = fs::metadata(&canonical).map_err(stat_error)?;
        if !metadata.is_dir() {
            return Err(CgroupError::NotADirectory { path: dir.to_path_buf() });
        }
        let mountinfo = read_proc(MOUNTINFO)?;
        let mounts = parse_mountinfo(&mountinfo);
        let mount = find_cgroup_mount(&mounts, &canonical)
            .ok_or_else(|| CgroupError::NotACgroup { path: dir.to_path_buf() })?;
        let hierarchy_id = match mount.version {
            CgroupVersion::V2 => CgroupId::UNIFIED_HIERARCHY,
            CgroupVersion::V1 => {
                let controllers = read_proc(PROC_CGROUPS)?;
                let own = read_proc(PROC_SELF_CGROUP)?;
                v1_hierarchy_id(&mount.super_options, &controllers, &own).ok_or_else(|| {
                    CgroupError::UnknownHierarchy { path: dir.to_path_buf(), options: mount.super_options.clone() }
                })?
            }
        };
        // In a cgroup namespace (a node in a container) paths and mount roots start at the
        // namespace's root, not the hierarchy's: the kernel's level is unknown from here.
        let level = if in_initial_cgroup_namespace() { level_of(mount, &canonical) } else { LEVEL_UNKNOWN };
        Ok(Self { id: CgroupId { hierarchy_id, id: metadata.ino() }, level })
    }
}

fn read_proc(path: &'static str) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|io_error| CgroupError::ReadProc { path, io_error })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

/// The parts of a `/proc/self/mountinfo` line that matter for cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CgroupMount {
    /// Which cgroup directory of the hierarchy is mounted here (`/` unless bind-mounted).
    root: PathBuf,
    mount_point: PathBuf,
    version: CgroupVersion,
    super_options: String,
}

/// The cgroup mounts in a mountinfo text; other mounts and malformed lines are skipped.
fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mount-point options [optional...] - fstype source super-options
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let version = match right.next()? {
                "cgroup" => CgroupVersion::V1,
                "cgroup2" => CgroupVersion::V2,
                _ => return None,
            };
            let _source = right.next()?;
            let super_options = right.next().unwrap_or_default().to_owned();
            Some(CgroupMount {
                root: PathBuf::from(unescape_octal(left.get(3)?)),
                mount_point: PathBuf::from(unescape_octal(left.get(4)?)),
                version,
                super_options,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if let Some(digits) = escape {
            let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            out.push(value as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup mount whose mount point is the longest prefix of `path` (the mount that
/// `path` resolves through, barring overmounts inside cgroupfs, which cgroupfs forbids).
fn find_cgroup_mount<'a>(mounts: &'a [CgroupMount], path: &Path) -> Option<&'a CgroupMount> {
    mounts.iter().filter(|m| path.starts_with(&m.mount_point)).max_by_key(|m| m.mount_point.components().count())
}

/// A root whose level below its hierarchy's root is not known: the filter then checks
/// every ancestor level for it.
pub(crate) const LEVEL_UNKNOWN: u32 = u32::MAX;

/// The initial cgroup namespace's inode (the kernel's `CGROUP_NS_INIT_INO`).
const CGROUP_NS_INIT_INO: u64 = 0xEFFF_FFFB;

/// Whether this process sees the cgroup hierarchies from their roots (no cgroup
/// namespace of its own); assumed so when `/proc/self/ns/cgroup` cannot be read.
fn in_initial_cgroup_namespace() -> bool {
    fs::metadata("/proc/self/ns/cgroup").map_or(true, |m| m.ino() == CGROUP_NS_INIT_INO)
}

fn level_of(mount: &CgroupMount, path: &Path) -> u32 {
    let below_mount = path.strip_prefix(&mount.mount_point).unwrap_or(Path::new(""));
    let normal = |p: &Path| p.components().filter(|c| matches!(c, Component::Normal(_))).count();
    (normal(&mount.root) + normal(below_mount)) as u32
}

/// The hierarchy id of a v1 mount: its controllers (and `name=`) from the mount's super
/// options, matched against the `id:controllers:path` lines of `/proc/self/cgroup`,
/// which, unlike `/proc/cgroups`, also lists named hierarchies without controllers.
fn v1_hierarchy_id(super_options: &str, proc_cgroups: &str, proc_self_cgroup: &str) -> Option<u32> {
    let known: BTreeSet<&str> =
        proc_cgroups.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_whitespace().next()).collect();
    let wanted: BTreeSet<&str> =
        super_options.split(',').filter(|o| o.starts_with("name=") || known.contains(o)).collect();
    if wanted.is_empty() {
        return None;
    }
    proc_self_cgroup.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let id = fields.next()?.parse::<u32>().ok()?;
        let controllers: BTreeSet<&str> = fields.next()?.split(',').filter(|c| !c.is_empty()).collect();
        (id != CgroupId::UNIFIED_HIERARCHY && controllers == wanted).then_some(id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hybrid node like the test machines: v1 controllers plus cgroup2 at `unified`.
    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
    const HYBRID_PROC_CGROUPS: &str = "\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpu\t1\t2\t1
cpuacct\t1\t2\t1
memory\t4\t173\t1
";
    const HYBRID_SELF_CGROUP: &str = "9:name=systemd:/\n4:memory:/x\n1:cpu,cpuacct:/\n0::/\n";

    /// A cgroup2-only node, with the agent in a container that bind-mounts its subtree.
    const V2_MOUNTINFO: &str = "\
25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
90 80 0:22 /kubepods /host\\040cgroup rw - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_cgroup_mounts_only() {
        let mounts = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(mounts.len(), 4);
        assert_eq!(mounts[0].mount_point, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(mounts[0].version, CgroupVersion::V1);
        assert_eq!(mounts[3].version, CgroupVersion::V2);
    }

    #[test]
    fn unescapes_mount_points() {
        let mounts = parse_mountinfo(V2_MOUNTINFO);
        assert_eq!(mounts[1].mount_point, Path::new("/host cgroup"));
        assert_eq!(unescape_octal(r"a\134b\011"), "a\\b\t");
        assert_eq!(unescape_octal(r"trailing\04"), r"trailing\04");
    }

    #[test]
    fn finds_the_innermost_cgroup_mount() {
        let mounts = parse_mountinfo(HYBRID_MOUNTINFO);
        let mount = find_cgroup_mount(&mounts, Path::new("/sys/fs/cgroup/memory/kubepods/pod1")).unwrap();
        assert_eq!(mount.mount_point, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(level_of(mount, Path::new("/sys/fs/cgroup/memory/kubepods/pod1")), 2);
        assert!(find_cgroup_mount(&mounts, Path::new("/sys/fs/cgroupx")).is_none());
        assert!(find_cgroup_mount(&mounts, Path::new("/tmp")).is_none());
    }

    #[test]
    fn levels_count_the_bind_mounted_root() {
        let mounts = parse_mountinfo(V2_MOUNTINFO);
        let mount = find_cgroup_mount(&mounts, Path::new("/host cgroup/burstable")).unwrap();
        assert_eq!(level_of(mount, Path::new("/host cgroup/burstable")), 2);
    }

    #[test]
    fn v1_hierarchies_match_on_controller_sets() {
        let id = |opts| v1_hierarchy_id(opts, HYBRID_PROC_CGROUPS, HYBRID_SELF_CGROUP);
        assert_eq!(id("rw,memory"), Some(4));
        assert_eq!(id("rw,cpuacct,cpu"), Some(1));
        assert_eq!(id("rw,xattr,name=systemd"), Some(9));
        assert_eq!(id("rw,cpu"), None, "a partial controller set is another hierarchy");
        assert_eq!(id("rw,relatime"), None);
    }

    #[test]
    fn ids_display_as_hierarchy_and_id() {
        assert_eq!(CgroupId { hierarchy_id: 4, id: 35 }.to_string(), "4:35");
        assert!(CgroupId::unified(7).is_unified());
    }
}
