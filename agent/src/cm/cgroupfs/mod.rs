//! Pod and `QoS` cgroups for the `cgroupfs` driver, on cgroup v1 (legacy or hybrid) and v2.
//!
//! Layout (upstream `qos_container_manager_linux.go`, `pod_container_manager_linux.go`):
//! ```text
//! <cgroupRoot>/kubepods/pod<uid>              Guaranteed pods
//! <cgroupRoot>/kubepods/burstable/pod<uid>    Burstable pods
//! <cgroupRoot>/kubepods/besteffort/pod<uid>   BestEffort pods
//!                                  .../<container id>   created by the runtime
//! ```
//! in every hierarchy: each v1 controller hierarchy, the `name=systemd` one and a hybrid
//! node's controller-less cgroup2 mount (runc creates container cgroups in all of them, but
//! removes only its own, so the pod level is ours to create and remove), or the single v2
//! hierarchy, where the controllers the kubelet uses are enabled in `cgroup.subtree_control`
//! on the way down.
//!
//! What is written where: v1 `cpu.shares`, `cpu.cfs_period_us`, `cpu.cfs_quota_us`,
//! `memory.limit_in_bytes`, `pids.max` (and `cpuset.cpus`/`cpuset.mems` copied from the
//! parent, as libcontainer does, so the runtime's children can hold tasks); v2 `cpu.weight`,
//! `cpu.max`, `memory.max`, `pids.max`.

pub(crate) mod mounts;
pub(crate) mod sys;

#[cfg(test)]
mod fixture;
#[cfg(test)]
mod real_kernel_tests;
mod resize;
#[cfg(test)]
mod tests;

use crate::types::pod::uid as pod_uid;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::resources::{self, MIN_SHARES, PodResourceConfig};
use super::{CgroupConfig, PodContainerManager};
use crate::types::pod_resources;
use crate::types::qos::{QosClass, qos_class};
use crate::types::resource_names::CPU;
use mounts::{CgroupLayout, Hierarchy, HierarchyKind};
pub use mounts::{CgroupMode, LayoutError};
use sys::{CgroupSys, RealSys};

/// Errors of cgroup operations; each names the path or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `cgroupDriver: systemd`.
    #[error("cgroupDriver systemd is not supported yet")]
    SystemdDriverUnsupported,
    /// Any other unknown driver.
    #[error("invalid cgroupDriver {driver:?}: must be \"cgroupfs\" or \"systemd\"")]
    InvalidDriver {
        /// The configured value.
        driver: String,
    },
    /// `cgroupRoot` is not a usable cgroup path.
    #[error("invalid cgroupRoot {root:?}: {reason}")]
    InvalidCgroupRoot {
        /// The configured value.
        root: String,
        /// Why.
        reason: &'static str,
    },
    /// The mount table could not be read.
    #[error("failed to read {path}: {source}")]
    ReadMountinfo {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// No usable cgroup hierarchy layout.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A v1 controller the kubelet requires is not mounted.
    #[error("cgroup v1 controller {controller} is not mounted under {fs_root}")]
    MissingV1Controller {
        /// The controller.
        controller: &'static str,
        /// The fs root looked at.
        fs_root: PathBuf,
    },
    /// A v2 controller the kubelet requires is not offered by the root cgroup.
    #[error("cgroup v2 controller {controller} is not available in {path}")]
    MissingV2Controller {
        /// The controller.
        controller: &'static str,
        /// The `cgroup.controllers` file looked at.
        path: PathBuf,
    },
    /// The configured cgroup root does not exist in a hierarchy.
    #[error("cgroup root {path} does not exist: cgroupRoot must be created before the kubelet starts")]
    CgroupRootMissing {
        /// The missing directory.
        path: PathBuf,
    },
    /// `kubeReservedCgroup` / `systemReservedCgroup` does not exist (upstream's message).
    #[error("Failed to enforce {what} Reserved Cgroup Limits on {name:?}: {name:?} cgroup does not exist ({path})")]
    ReservedCgroupMissing {
        /// `Kube` or `System`.
        what: &'static str,
        /// The configured cgroup name.
        name: String,
        /// The missing directory.
        path: PathBuf,
    },
    /// A `QoS` cgroup is missing when a pod cgroup is created in it.
    #[error("parent cgroup {path} does not exist: node cgroups must be ensured first")]
    ParentMissing {
        /// The missing directory.
        path: PathBuf,
    },
    /// A pod UID that cannot name a cgroup.
    #[error("pod uid {uid:?} cannot be used in a cgroup name")]
    InvalidPodUid {
        /// The UID.
        uid: String,
    },
    /// Creating a cgroup failed.
    #[error("failed to create cgroup {path}: {source}")]
    Create {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Reading a control file or listing a cgroup failed.
    #[error("failed to read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Writing a control file failed.
    #[error("failed to write {value:?} to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Killing a process left in a pod cgroup failed.
    #[error("failed to kill pid {pid} left in {path}: {source}")]
    Kill {
        /// The process.
        pid: i32,
        /// The pod cgroup it was found in.
        path: PathBuf,
        /// The error from kill(2).
        #[source]
        source: io::Error,
    },
    /// Removing a cgroup failed (`EBUSY`: processes or child cgroups remain).
    #[error("failed to remove cgroup {path}: {source}")]
    Remove {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

const KUBEPODS: &str = "kubepods";
const POD_PREFIX: &str = "pod";
const QOS_CLASSES: [QosClass; 3] = [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort];
/// v1 controllers the kubelet refuses to run without (`validateSystemRequirements`).
const REQUIRED_V1: [&str; 4] = ["cpu", "cpuacct", "cpuset", "memory"];
/// v1 hierarchies whose pod cgroup must exist for the pod cgroup to exist (upstream's
/// allow-list in `cgroupV1impl.Exists`).
const CHECKED_V1: [&str; 7] = ["cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb", mounts::SYSTEMD_HIERARCHY];
/// v2 controllers the kubelet uses and requires enabled when the root offers them
/// (`getSupportedUnifiedControllers`).
const USED_V2: [&str; 5] = ["cpu", "cpuset", "hugetlb", "memory", "pids"];
/// v2 controllers enabled when offered but not required.
const OPTIONAL_V2: [&str; 1] = ["io"];
/// v2 controllers without which pod limits cannot be applied at all.
const REQUIRED_V2: [&str; 2] = ["cpu", "memory"];

/// Where the `kubepods` cgroup lives in the hierarchies the eBPF sensors care about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubepodsDirs {
    /// On the cgroup2 mount (`/sys/fs/cgroup/unified/kubepods` on hybrid hosts).
    pub cgroup2: Option<PathBuf>,
    /// On the v1 memory hierarchy, when there is one.
    pub memory_v1: Option<PathBuf>,
}

/// Cgroup names under the configured root, shared with the fake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupNames {
    /// Components of `cgroupRoot`.
    root: Vec<String>,
}

impl CgroupNames {
    /// Normalizes `cgroupRoot` (`""` and `"/"` are the root; `"a/b"` means `"/a/b"`).
    pub(crate) fn new(cgroup_root: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidCgroupRoot { root: cgroup_root.to_owned(), reason };
        let mut root = Vec::new();
        for component in cgroup_root.split('/').filter(|c| !c.is_empty()) {
            if component == "." || component == ".." {
                return Err(invalid("must not contain . or .. components"));
            }
            if component.contains('\0') {
                return Err(invalid("must not contain NUL"));
            }
            root.push(component.to_owned());
        }
        Ok(Self { root })
    }

    /// Relative components of the cgroup root.
    pub(crate) fn root(&self) -> Vec<&str> {
        self.root.iter().map(String::as_str).collect()
    }

    /// Relative components of a `QoS` class's parent cgroup.
    pub(crate) fn qos(&self, qos: QosClass) -> Vec<&str> {
        let mut parts = self.root();
        parts.push(KUBEPODS);
        parts.extend(qos.cgroup_name());
        parts
    }

    /// The cgroupfs name of a pod cgroup (`/kubepods/burstable/pod<uid>`).
    pub(crate) fn pod_cgroupfs_name(&self, qos: QosClass, uid: &str) -> String {
        let mut parts = self.qos(qos);
        let pod = format!("{POD_PREFIX}{uid}");
        parts.push(&pod);
        format!("/{}", parts.join("/"))
    }
}

/// The pod's UID, checked for use as a path component.
fn checked_uid(uid: &str) -> Result<&str> {
    let bad = uid.is_empty() || uid == "." || uid == ".." || uid.contains(['/', '\0']);
    if bad { Err(Error::InvalidPodUid { uid: uid.to_owned() }) } else { Ok(uid) }
}

fn join(base: &Path, parts: &[&str]) -> PathBuf {
    parts.iter().fold(base.to_owned(), |p, c| p.join(c))
}

fn read_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_owned(), source })
}

/// Writes a control file like runc: `O_WRONLY|O_TRUNC`, never creating it (a missing file
/// means a missing controller, which must fail loudly).
fn write_file(path: &Path, value: &str) -> Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| Error::Write { path: path.to_owned(), value: value.to_owned(), source })
}

fn controller_set(text: &str) -> BTreeSet<String> {
    // Fixture trees hold what was written ("+cpu"); the kernel lists names only.
    text.split_whitespace().map(|c| c.trim_start_matches('+').to_owned()).collect()
}

/// Pids in `cgroup.procs` of `dir` and every cgroup below it.
fn cgroup_tree_pids(dir: &Path, pids: &mut BTreeSet<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            cgroup_tree_pids(&entry.path(), pids);
        }
    }
}

/// `dir` and the cgroups below it, children before parents.
fn cgroup_tree_post_order(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            cgroup_tree_post_order(&entry.path(), out);
        }
    }
    out.push(dir.to_owned());
}

/// Which pods get no CFS quota on their pod cgroup (the CPU manager's
/// `DisableCPUQuotaWithExclusiveCPUs`), by pod uid.
pub type UnquotedPods = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The cgroupfs-driver [`PodContainerManager`].
pub struct CgroupfsPodContainerManager {
    config: CgroupConfig,
    names: CgroupNames,
    /// `None` when `cgroupsPerQOS` is off: every operation is a no-op.
    layout: Option<CgroupLayout>,
    sys: Box<dyn CgroupSys>,
    /// How long removal waits for killed processes to leave before giving up.
    remove_timeout: Duration,
    unquoted: Option<UnquotedPods>,
}

impl std::fmt::Debug for CgroupfsPodContainerManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupfsPodContainerManager")
            .field("config", &self.config)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl CgroupfsPodContainerManager {
    /// Validates `cfg` and detects the cgroup layout from `/proc/self/mountinfo`.
    pub fn new(cfg: CgroupConfig) -> Result<Self> {
        Self::validate_driver(&cfg)?;
        let mountinfo = if cfg.cgroups_per_qos {
            let path = PathBuf::from("/proc/self/mountinfo");
            Some(std::fs::read_to_string(&path).map_err(|source| Error::ReadMountinfo { path, source })?)
        } else {
            None
        };
        Self::build(cfg, mountinfo.as_deref(), Box::new(RealSys))
    }

    /// Pods for which `unquoted` says so get their pod cgroup without a CFS quota (upstream:
    /// pods holding exclusive CPUs, with `DisableCPUQuotaWithExclusiveCPUs`).
    #[must_use]
    pub fn with_unquoted_pods(mut self, unquoted: UnquotedPods) -> Self {
        self.unquoted = Some(unquoted);
        self
    }

    /// Like [`Self::new`] with the mount table given as text (mount points must lie under
    /// `cfg.fs_root`): for fixture trees and unusual hosts.
    pub fn with_mountinfo(cfg: CgroupConfig, mountinfo: &str) -> Result<Self> {
        Self::build(cfg, Some(mountinfo), Box::new(RealSys))
    }

    fn validate_driver(cfg: &CgroupConfig) -> Result<()> {
        match cfg.cgroup_driver.as_str() {
            "cgroupfs" => Ok(()),
            "systemd" => Err(Error::SystemdDriverUnsupported),
            other => Err(Error::InvalidDriver { driver: other.to_owned() }),
        }
    }

    pub(crate) fn build(cfg: CgroupConfig, mountinfo: Option<&str>, sys: Box<dyn CgroupSys>) -> Result<Self> {
        Self::validate_driver(&cfg)?;
        let names = CgroupNames::new(&cfg.cgroup_root)?;
        let layout = match (cfg.cgroups_per_qos, mountinfo) {
            (true, Some(text)) => {
                let layout = CgroupLayout::from_mounts(&mounts::parse_mountinfo(text), &cfg.fs_root)?;
                Self::validate_layout(&layout, &cfg.fs_root)?;
                Some(layout)
            }
            _ => None,
        };
        Ok(Self { config: cfg, names, layout, sys, remove_timeout: Duration::from_secs(2), unquoted: None })
    }

    fn validate_layout(layout: &CgroupLayout, fs_root: &Path) -> Result<()> {
        for h in &layout.hierarchies {
            if let HierarchyKind::Unified(offered) = &h.kind
                && let Some(missing) = REQUIRED_V2.iter().find(|c| !offered.contains(**c))
            {
                return Err(Error::MissingV2Controller {
                    controller: missing,
                    path: h.mount.join("cgroup.controllers"),
                });
            }
        }
        if !layout.is_unified()
            && let Some(missing) = REQUIRED_V1.iter().find(|c| layout.v1_mount_of(c).is_none())
        {
            return Err(Error::MissingV1Controller { controller: missing, fs_root: fs_root.to_owned() });
        }
        Ok(())
    }

    /// The cgroup version in use; `None` when `cgroupsPerQOS` is off (nothing detected).
    #[must_use]
    pub fn cgroup_mode(&self) -> Option<CgroupMode> {
        self.layout.as_ref().map(|l| l.mode)
    }

    /// The configuration this manager runs with.
    #[must_use]
    pub fn config(&self) -> &CgroupConfig {
        &self.config
    }

    #[cfg(test)]
    pub(crate) fn set_remove_timeout(&mut self, timeout: Duration) {
        self.remove_timeout = timeout;
    }

    #[cfg(test)]
    pub(crate) fn hierarchy_mounts(&self) -> Vec<PathBuf> {
        self.layout.iter().flat_map(|l| l.hierarchies.iter().map(|h| h.mount.clone())).collect()
    }

    /// The `kubepods` directories the kernel sensors watch: the cgroup2 one (hybrid or
    /// unified), and the v1 memory one (for OOM victims), if mounted.
    #[must_use]
    pub fn kubepods_dirs(&self) -> KubepodsDirs {
        let mut parts = self.names.root();
        parts.push(KUBEPODS);
        let mut out = KubepodsDirs::default();
        for h in self.hierarchies() {
            match &h.kind {
                HierarchyKind::Unified(_) | HierarchyKind::HybridUnified => {
                    out.cgroup2 = Some(join(&h.mount, &parts));
                }
                HierarchyKind::V1(c) if c.contains("memory") => out.memory_v1 = Some(join(&h.mount, &parts)),
                HierarchyKind::V1(_) => {}
            }
        }
        out
    }

    fn hierarchies(&self) -> &[Hierarchy] {
        self.layout.as_ref().map_or(&[], |l| l.hierarchies.as_slice())
    }

    /// Creates `path` if missing; true when it was created now.
    fn mkdir(&self, path: &Path) -> Result<bool> {
        match self.sys.mkdir(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(Error::ParentMissing { path: path.parent().unwrap_or(path).to_owned() })
            }
            Err(source) => Err(Error::Create { path: path.to_owned(), source }),
        }
    }

    /// Gives a v1 cpuset cgroup its parent's cpus and mems when empty, as libcontainer
    /// does: a cpuset cgroup without them cannot hold tasks, nor can its children.
    fn inherit_cpuset(dir: &Path) -> Result<()> {
        let Some(parent) = dir.parent() else {
            return Ok(());
        };
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = read_string(&dir.join(file))?;
            if own.trim().is_empty() {
                let inherited = read_string(&parent.join(file))?;
                write_file(&dir.join(file), inherited.trim())?;
            }
        }
        Ok(())
    }

    /// Enables the controllers the kubelet uses in `dir`'s `cgroup.subtree_control`.
    fn enable_controllers(dir: &Path) -> Result<()> {
        let offered = controller_set(&read_string(&dir.join("cgroup.controllers"))?);
        let control = dir.join("cgroup.subtree_control");
        let current = controller_set(&read_string(&control)?);
        let wanted: BTreeSet<String> = USED_V2
            .iter()
            .chain(OPTIONAL_V2.iter())
            .filter(|c| offered.contains(**c) && !current.contains(**c))
            .map(|c| (*c).to_owned())
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        // Write the whole resulting set: the kernel ignores already-enabled entries, and a
        // fixture file then holds the full set.
        let all: Vec<String> = current.union(&wanted).map(|c| format!("+{c}")).collect();
        if write_file(&control, &all.join(" ")).is_ok() {
            return Ok(());
        }
        // One at a time, like runc, so one refusal does not block the others.
        for c in &wanted {
            if let Err(error) = write_file(&control, &format!("+{c}")) {
                if USED_V2.contains(&c.as_str()) {
                    return Err(error);
                }
                tracing::warn!(%error, controller = %c, "optional cgroup v2 controller not enabled");
            }
        }
        Ok(())
    }

    /// Writes the hugetlb limit of every page size the cgroup `dir` has a
    /// `hugetlb.<size><suffix>` file for (the kernel's own list of sizes; none when the
    /// controller is off), as upstream's cgroup manager does for every size runc knows.
    fn apply_hugetlb(dir: &Path, suffix: &str, limits: &resources::HugepageLimits, unbounded: &str) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
        let mut sizes: Vec<String> = entries
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let size = name.strip_prefix("hugetlb.")?.strip_suffix(suffix)?;
                // `hugetlb.2MB.rsvd.max` is the reservation limit, not the usage limit.
                (!size.contains('.')).then(|| size.to_owned())
            })
            .collect();
        sizes.sort();
        for size in sizes {
            let limit = limits.limit(&size);
            let value = if limit < 0 { unbounded.to_owned() } else { limit.to_string() };
            write_file(&dir.join(format!("hugetlb.{size}{suffix}")), &value)?;
        }
        Ok(())
    }

    /// Writes `cfg` into the cgroup `dir` of hierarchy `h`.
    fn apply_limits(h: &Hierarchy, dir: &Path, cfg: &PodResourceConfig) -> Result<()> {
        let file = |name: &str| dir.join(name);
        match &h.kind {
            HierarchyKind::V1(controllers) => {
                if controllers.contains("cpuset") {
                    Self::inherit_cpuset(dir)?;
                }
                if controllers.contains("cpu") {
                    if let Some(shares) = cfg.cpu_shares {
                        write_file(&file("cpu.shares"), &shares.to_string())?;
                    }
                    // Period before quota, as runc: the pair must be valid after each write.
                    if let Some(period) = cfg.cpu_period.filter(|p| *p != 0) {
                        write_file(&file("cpu.cfs_period_us"), &period.to_string())?;
                    }
                    if let Some(quota) = cfg.cpu_quota.filter(|q| *q != 0) {
                        write_file(&file("cpu.cfs_quota_us"), &quota.to_string())?;
                    }
                }
                if controllers.contains("memory")
                    && let Some(limit) = cfg.memory_limit.filter(|m| *m != 0)
                {
                    write_file(&file("memory.limit_in_bytes"), &limit.to_string())?;
                }
                if controllers.contains("pids")
                    && let Some(limit) = cfg.pids_limit.filter(|p| *p != 0)
                {
                    write_file(&file("pids.max"), &pids_max(limit))?;
                }
                if controllers.contains("hugetlb")
                    && let Some(limits) = &cfg.hugepage_limits
                {
                    // v1 has no "max": an unbounded limit is the largest page-aligned value,
                    // which the kernel takes from "-1".
                    Self::apply_hugetlb(dir, ".limit_in_bytes", limits, "-1")?;
                }
            }
            HierarchyKind::Unified(_) => {
                if let Some(shares) = cfg.cpu_shares {
                    let weight = resources::cpu_shares_to_cpu_weight(shares);
                    write_file(&file("cpu.weight"), &weight.to_string())?;
                }
                let quota = cfg.cpu_quota.unwrap_or(0);
                let period = cfg.cpu_period.unwrap_or(0);
                if quota != 0 || period != 0 {
                    // libcontainer's fs2 format: "<quota|max> [period]".
                    let mut max = if quota > 0 { quota.to_string() } else { "max".to_owned() };
                    if period != 0 {
                        max = format!("{max} {period}");
                    }
                    write_file(&file("cpu.max"), &max)?;
                }
                if let Some(limit) = cfg.memory_limit.filter(|m| *m != 0) {
                    let value = if limit < 0 { "max".to_owned() } else { limit.to_string() };
                    write_file(&file("memory.max"), &value)?;
                }
                if let Some(limit) = cfg.pids_limit.filter(|p| *p != 0) {
                    write_file(&file("pids.max"), &pids_max(limit))?;
                }
                if let Some(limits) = &cfg.hugepage_limits {
                    Self::apply_hugetlb(dir, ".max", limits, "max")?;
                }
            }
            HierarchyKind::HybridUnified => {}
        }
        Ok(())
    }

    /// Existing pod cgroup directories of `uid`, over every hierarchy and `QoS` class.
    fn pod_dirs(&self, uid: &str) -> Vec<PathBuf> {
        let pod = format!("{POD_PREFIX}{uid}");
        let pod = pod.as_str();
        self.hierarchies()
            .iter()
            .flat_map(|h| QOS_CLASSES.iter().map(move |q| join(&h.mount, &self.names.qos(*q)).join(pod)))
            .filter(|p| p.is_dir())
            .collect()
    }

    /// SIGKILLs every process in the cgroup trees `dirs`; up to five rounds, as upstream.
    fn kill_processes(&self, dirs: &[PathBuf]) -> Result<()> {
        let own = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let mut last_error = None;
        for _ in 0..5 {
            last_error = None;
            // On v1 every hierarchy lists the same processes: signal each once per round,
            // naming the first cgroup it was seen in.
            let mut pids = BTreeMap::new();
            for dir in dirs {
                let mut found = BTreeSet::new();
                cgroup_tree_pids(dir, &mut found);
                for pid in found {
                    pids.entry(pid).or_insert(dir);
                }
            }
            // Never signal init, the kernel's pid 0 or ourselves, whatever a file says.
            for (pid, dir) in pids.into_iter().filter(|(p, _)| *p > 1 && *p != own) {
                tracing::debug!(pid, path = %dir.display(), "killing process left in pod cgroup");
                match self.sys.kill(pid) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(source) => {
                        last_error = Some(Error::Kill { pid, path: dir.clone(), source });
                    }
                }
            }
            if last_error.is_none() {
                return Ok(());
            }
        }
        last_error.map_or(Ok(()), Err)
    }

    fn qos_dirs(&self, h: &Hierarchy) -> [(QosClass, PathBuf); 3] {
        QOS_CLASSES.map(|q| (q, join(&h.mount, &self.names.qos(q))))
    }
}

fn pids_max(limit: i64) -> String {
    if limit < 0 { "max".to_owned() } else { limit.to_string() }
}

impl PodContainerManager for CgroupfsPodContainerManager {
    fn pod_cgroup_config(&self, pod: &Pod) -> super::Result<Option<PodResourceConfig>> {
        Ok(self.read_pod_config(pod, false)?)
    }

    fn pod_cgroup_status_config(&self, pod: &Pod) -> super::Result<Option<PodResourceConfig>> {
        Ok(self.read_pod_config(pod, true)?)
    }

    fn update_pod_cgroup(&self, pod: &Pod, cfg: &PodResourceConfig) -> super::Result<()> {
        Ok(self.write_pod_config(pod, cfg)?)
    }

    fn pod_memory_usage(&self, pod: &Pod) -> super::Result<Option<u64>> {
        Ok(self.read_pod_memory_usage(pod)?)
    }

    fn ensure_node_cgroups(&self) -> super::Result<()> {
        let root = self.names.root();
        for h in self.hierarchies() {
            let root_dir = join(&h.mount, &root);
            if !root_dir.is_dir() {
                return Err(Error::CgroupRootMissing { path: root_dir }.into());
            }
            if let HierarchyKind::Unified(_) = h.kind {
                // Every level from the fs root down must pass the controllers on.
                let mut dir = h.mount.clone();
                Self::enable_controllers(&dir)?;
                for c in &root {
                    dir.push(c);
                    Self::enable_controllers(&dir)?;
                }
            }
            if matches!(&h.kind, HierarchyKind::V1(c) if c.contains("cpuset")) && !root.is_empty() {
                Self::inherit_cpuset(&root_dir)?;
            }
            let kubepods = root_dir.join(KUBEPODS);
            for dir in [kubepods.clone(), kubepods.join("burstable"), kubepods.join("besteffort")] {
                self.mkdir(&dir)?;
                match h.kind {
                    HierarchyKind::Unified(_) => Self::enable_controllers(&dir)?,
                    HierarchyKind::V1(ref c) if c.contains("cpuset") => Self::inherit_cpuset(&dir)?,
                    _ => {}
                }
            }
            // The QoS cgroups leave huge pages to the pod cgroups (upstream
            // `setHugePagesUnbounded`).
            let unbounded = Some(resources::HugepageLimits::unbounded());
            let best_effort = PodResourceConfig {
                cpu_shares: Some(MIN_SHARES),
                hugepage_limits: unbounded.clone(),
                ..PodResourceConfig::default()
            };
            Self::apply_limits(h, &kubepods.join("besteffort"), &best_effort)?;
            let burstable = PodResourceConfig { hugepage_limits: unbounded, ..PodResourceConfig::default() };
            Self::apply_limits(h, &kubepods.join("burstable"), &burstable)?;
            if let Some(pods) = &self.config.enforcement.pods {
                Self::apply_limits(h, &kubepods, pods)?;
            }
        }
        let reserved =
            [("Kube", &self.config.enforcement.kube_reserved), ("System", &self.config.enforcement.system_reserved)];
        for (what, enforced) in reserved {
            let Some((name, limits)) = enforced else { continue };
            let parts: Vec<&str> = name.split('/').filter(|c| !c.is_empty()).collect();
            for h in self.hierarchies().iter().filter(|h| !matches!(h.kind, HierarchyKind::HybridUnified)) {
                let dir = join(&h.mount, &parts);
                if !dir.is_dir() {
                    return Err(Error::ReservedCgroupMissing { what, name: name.clone(), path: dir }.into());
                }
                Self::apply_limits(h, &dir, limits)?;
            }
        }
        Ok(())
    }

    fn cgroup_parent(&self, pod: &Pod) -> String {
        if !self.config.cgroups_per_qos {
            return String::new();
        }
        self.names.pod_cgroupfs_name(qos_class(pod), pod_uid(pod))
    }

    fn ensure_pod_cgroup(&self, pod: &Pod) -> super::Result<()> {
        if self.layout.is_none() {
            return Ok(());
        }
        let uid = checked_uid(pod_uid(pod))?;
        let qos = qos_class(pod);
        let enforce_cpu_limits = self.config.cpu_cfs_quota && !self.unquoted.as_ref().is_some_and(|f| f(uid));
        let mut cfg = resources::resource_config_for_pod(pod, enforce_cpu_limits);
        if self.config.pod_pids_limit > 0 {
            cfg.pids_limit = Some(self.config.pod_pids_limit);
        }
        let pod_dir = format!("{POD_PREFIX}{uid}");
        for h in self.hierarchies() {
            let parent = join(&h.mount, &self.names.qos(qos));
            if !parent.is_dir() {
                return Err(Error::ParentMissing { path: parent }.into());
            }
            let dir = parent.join(&pod_dir);
            if !self.mkdir(&dir)? {
                continue;
            }
            if let Err(error) = Self::apply_limits(h, &dir, &cfg) {
                // Start over on the next attempt rather than keep a cgroup without limits.
                if let Err(rm) = self.sys.rmdir(&dir) {
                    tracing::warn!(error = %rm, path = %dir.display(), "cannot undo pod cgroup creation");
                }
                return Err(error.into());
            }
        }
        tracing::debug!(pod = %uid, %qos, ?cfg, "pod cgroup ensured");
        Ok(())
    }

    fn remove_pod_cgroup(&self, uid: &str) -> super::Result<()> {
        if self.layout.is_none() {
            return Ok(());
        }
        let uid = checked_uid(uid)?;
        let dirs = self.pod_dirs(uid);
        if dirs.is_empty() {
            return Ok(());
        }
        self.kill_processes(&dirs)?;
        let deadline = Instant::now() + self.remove_timeout;
        let mut delay = Duration::from_millis(10);
        loop {
            let mut failure = None;
            for dir in &dirs {
                let mut tree = Vec::new();
                cgroup_tree_post_order(dir, &mut tree);
                for cgroup in tree {
                    match self.sys.rmdir(&cgroup) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(source) => {
                            failure = Some(Error::Remove { path: cgroup, source });
                            break;
                        }
                    }
                }
            }
            let Some(error) = failure else {
                tracing::debug!(pod = %uid, "pod cgroup removed");
                return Ok(());
            };
            if Instant::now() + delay > deadline {
                return Err(error.into());
            }
            // Killed tasks take a moment to leave; processes may also have forked between
            // listing and killing: kill again, then retry.
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(500));
            let remaining: Vec<PathBuf> = dirs.iter().filter(|d| d.is_dir()).cloned().collect();
            self.kill_processes(&remaining)?;
        }
    }

    fn list_pod_cgroups(&self) -> super::Result<Vec<(String, QosClass)>> {
        let mut found = BTreeSet::new();
        for h in self.hierarchies() {
            for (qos, dir) in self.qos_dirs(h) {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(source) => return Err(Error::Read { path: dir, source }.into()),
                };
                for entry in entries.flatten() {
                    if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let name = entry.file_name();
                    let Some(uid) = name.to_str().and_then(|n| n.strip_prefix(POD_PREFIX)) else {
                        continue;
                    };
                    if uid.is_empty() {
                        tracing::debug!(path = %entry.path().display(), "ignoring cgroup that is not a pod");
                        continue;
                    }
                    found.insert((uid.to_owned(), qos));
                }
            }
        }
        Ok(found.into_iter().collect())
    }

    fn pod_cgroup_exists(&self, uid: &str) -> bool {
        let Some(layout) = self.layout.as_ref() else {
            return true;
        };
        let Ok(uid) = checked_uid(uid) else {
            return false;
        };
        let pod = format!("{POD_PREFIX}{uid}");
        let checked: Vec<&Hierarchy> = layout
            .hierarchies
            .iter()
            .filter(|h| match &h.kind {
                HierarchyKind::V1(c) => CHECKED_V1.iter().any(|x| c.contains(*x)),
                HierarchyKind::Unified(_) => true,
                HierarchyKind::HybridUnified => false,
            })
            .collect();
        QOS_CLASSES.iter().any(|q| checked.iter().all(|h| join(&h.mount, &self.names.qos(*q)).join(&pod).is_dir()))
    }

    fn update_qos_cgroups(&self, active_pods: &[Pod]) -> super::Result<()> {
        let burstable_milli: i64 = active_pods
            .iter()
            .filter(|p| qos_class(p) == QosClass::Burstable)
            .map(|p| pod_resources::get(&pod_resources::pod_requests(p), CPU).milli_value_saturating())
            .fold(0, i64::saturating_add);
        let burstable = PodResourceConfig {
            cpu_shares: Some(resources::milli_cpu_to_shares(burstable_milli)),
            ..PodResourceConfig::default()
        };
        let best_effort = PodResourceConfig { cpu_shares: Some(MIN_SHARES), ..PodResourceConfig::default() };
        for h in self.hierarchies().iter().filter(|h| h.has("cpu")) {
            for (qos, cfg) in [(QosClass::Burstable, &burstable), (QosClass::BestEffort, &best_effort)] {
                let dir = join(&h.mount, &self.names.qos(qos));
                if !dir.is_dir() {
                    return Err(Error::ParentMissing { path: dir }.into());
                }
                // Only the cpu weight: the QoS cgroups hold no cpuset/memory settings here.
                let cpu_only = match &h.kind {
                    HierarchyKind::V1(_) => {
                        Hierarchy { mount: h.mount.clone(), kind: HierarchyKind::V1(["cpu".to_owned()].into()) }
                    }
                    _ => h.clone(),
                };
                Self::apply_limits(&cpu_only, &dir, cfg)?;
            }
        }
        Ok(())
    }
}
