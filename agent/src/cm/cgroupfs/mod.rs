//! Pod and `QoS` cgroups for the `cgroupfs` and `systemd` drivers, on cgroup v1 (legacy or
//! hybrid) and v2. Under systemd the same directories are slices
//! (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`) that
//! systemd makes as transient units ([`crate::cm::systemd_dbus`]) before the manager writes
//! their files; the v1 hierarchies systemd handles by itself (devices, freezer) are left
//! to it.
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
mod systemd_tests;
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
use super::systemd_dbus::{self, DbusSystemd, SystemdUnits};
use super::systemd_names;
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
    /// A systemd call of the systemd driver failed.
    #[error(transparent)]
    Systemd(#[from] crate::cm::systemd_dbus::Error),
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
/// What runc's systemd driver names a container's scope after, by runtime.
const SCOPE_PREFIXES: [&str; 3] = ["cri-containerd", "crio", "docker"];
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

/// How cgroups are named and made (`cgroupDriver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// Directories named by the kubelet's components (`/kubepods/burstable/pod<uid>`),
    /// made with mkdir.
    Cgroupfs,
    /// Slices (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`)
    /// made by systemd as transient units ([`crate::cm::systemd_dbus`]).
    Systemd,
}

impl Driver {
    /// Parses `cgroupDriver`.
    ///
    /// # Errors
    /// [`Error::InvalidDriver`] for anything but `cgroupfs` and `systemd`.
    pub fn parse(driver: &str) -> Result<Self> {
        match driver {
            "cgroupfs" => Ok(Self::Cgroupfs),
            "systemd" => Ok(Self::Systemd),
            other => Err(Error::InvalidDriver { driver: other.to_owned() }),
        }
    }
}

/// The `kubepods` cgroup's path from a hierarchy's root as the manager names it
/// (`/kubepods`, `/r/kubepods`; `/kubepods.slice`, `/r.slice/r-kubepods.slice` under
/// systemd); `None` for a `cgroupRoot` or `cgroupDriver` the manager refuses.
#[must_use]
pub fn kubepods_cgroup(cgroup_root: &str, cgroup_driver: &str) -> Option<String> {
    let names = CgroupNames::with_driver(cgroup_root, Driver::parse(cgroup_driver).ok()?).ok()?;
    Some(format!("/{}", names.kubepods_rel().display()))
}

/// Cgroup names under the configured root, shared with the fake: the kubelet's
/// components (upstream `CgroupName`) and the path each driver makes of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupNames {
    /// Components of `cgroupRoot`.
    root: Vec<String>,
    driver: Driver,
}

impl CgroupNames {
    /// Normalizes `cgroupRoot` (`""` and `"/"` are the root; `"a/b"` means `"/a/b"`) for the
    /// cgroupfs driver.
    pub(crate) fn new(cgroup_root: &str) -> Result<Self> {
        Self::with_driver(cgroup_root, Driver::Cgroupfs)
    }

    /// As [`Self::new`] for `driver`: under systemd every component of the root must be
    /// able to name a slice.
    pub(crate) fn with_driver(cgroup_root: &str, driver: Driver) -> Result<Self> {
        let invalid = |reason| Error::InvalidCgroupRoot { root: cgroup_root.to_owned(), reason };
        let mut root = Vec::new();
        for component in cgroup_root.split('/').filter(|c| !c.is_empty()) {
            if component == "." || component == ".." {
                return Err(invalid("must not contain . or .. components"));
            }
            if component.contains('\0') {
                return Err(invalid("must not contain NUL"));
            }
            if driver == Driver::Systemd && component.contains('_') {
                return Err(invalid("must not contain _ with cgroupDriver systemd"));
            }
            root.push(component.to_owned());
        }
        Ok(Self { root, driver })
    }

    fn components<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        self.root.iter().map(String::as_str).chain(extra.iter().copied()).collect()
    }

    /// The path of the cgroup named by the root and `extra`, relative to a hierarchy's
    /// mount; the caller has checked the components ([`Self::checked_uid`]).
    fn rel(&self, extra: &[&str]) -> PathBuf {
        let parts = self.components(extra);
        match self.driver {
            Driver::Cgroupfs => parts.iter().collect(),
            Driver::Systemd => {
                let path = systemd_names::to_systemd(&parts)
                    .unwrap_or_else(|e| unreachable!("components checked at construction and by checked_uid: {e}"));
                PathBuf::from(path.trim_start_matches('/'))
            }
        }
    }

    fn qos_parts(qos: QosClass) -> Vec<&'static str> {
        std::iter::once(KUBEPODS).chain(qos.cgroup_name()).collect()
    }

    /// The cgroup root, relative to a hierarchy's mount (empty for `/`).
    pub(crate) fn root_rel(&self) -> PathBuf {
        self.rel(&[])
    }

    /// The `kubepods` cgroup (node allocatable), relative to a hierarchy's mount.
    pub(crate) fn kubepods_rel(&self) -> PathBuf {
        self.rel(&[KUBEPODS])
    }

    /// A `QoS` class's parent cgroup, relative to a hierarchy's mount.
    pub(crate) fn qos_rel(&self, qos: QosClass) -> PathBuf {
        self.rel(&Self::qos_parts(qos))
    }

    /// A pod's cgroup, relative to a hierarchy's mount (`uid` checked by
    /// [`Self::checked_uid`]).
    pub(crate) fn pod_rel(&self, qos: QosClass, uid: &str) -> PathBuf {
        let pod = format!("{POD_PREFIX}{uid}");
        let mut parts = Self::qos_parts(qos);
        parts.push(&pod);
        self.rel(&parts)
    }

    /// The systemd slice of the `kubepods` cgroup (`None`), a `QoS` class's (`Some(qos,
    /// None)`) or a pod's (`Some(qos, Some(uid))`). Under the systemd driver only: the
    /// cgroupfs driver allows `_`, which no slice name can hold.
    pub(crate) fn slice(&self, which: Option<(QosClass, Option<&str>)>) -> String {
        let pod = which.and_then(|(_, uid)| uid).map(|u| format!("{POD_PREFIX}{u}"));
        let mut parts = match which {
            Some((qos, _)) => Self::qos_parts(qos),
            None => vec![KUBEPODS],
        };
        parts.extend(pod.as_deref());
        systemd_names::unit_name(&self.components(&parts))
            .unwrap_or_else(|e| unreachable!("components checked at construction and by checked_uid: {e}"))
    }

    /// The pod uid a directory in a `QoS` class's cgroup names, if it is a pod cgroup.
    pub(crate) fn pod_uid_of(&self, qos: QosClass, dir_name: &str) -> Option<String> {
        let uid = match self.driver {
            Driver::Cgroupfs => dir_name.strip_prefix(POD_PREFIX)?.to_owned(),
            Driver::Systemd => {
                let qos_slice = self.slice(Some((qos, None)));
                let prefix = format!("{}-{POD_PREFIX}", qos_slice.strip_suffix(".slice").unwrap_or(&qos_slice));
                dir_name.strip_prefix(&prefix)?.strip_suffix(".slice")?.replace('_', "-")
            }
        };
        (!uid.is_empty()).then_some(uid)
    }

    /// The pod's UID, checked for use in a cgroup name.
    pub(crate) fn checked_uid<'a>(&self, uid: &'a str) -> Result<&'a str> {
        let bad = uid.is_empty()
            || uid == "."
            || uid == ".."
            || uid.contains(['/', '\0'])
            || (self.driver == Driver::Systemd && uid.contains('_'));
        if bad { Err(Error::InvalidPodUid { uid: uid.to_owned() }) } else { Ok(uid) }
    }

    /// The CRI `cgroup_parent` of a pod: its cgroup's path from the hierarchy root
    /// (`/kubepods/burstable/pod<uid>`; under systemd the expanded slice path, of which
    /// the runtime uses the last slice).
    pub(crate) fn pod_cgroupfs_name(&self, qos: QosClass, uid: &str) -> String {
        if self.driver == Driver::Systemd && self.checked_uid(uid).is_err() {
            // Refused when the pod cgroup is made; no slice can be named for it.
            return String::new();
        }
        format!("/{}", self.pod_rel(qos, uid).display())
    }
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
    /// systemd, under `cgroupDriver: systemd` (with `cgroupsPerQOS`).
    systemd: Option<Arc<dyn SystemdUnits>>,
    /// How long removal waits for killed processes to leave before giving up.
    remove_timeout: Duration,
    unquoted: Option<UnquotedPods>,
    /// Under systemd, the runtime's scope prefix ([`SCOPE_PREFIXES`]) once a container's
    /// scope was found with it: one runtime serves the node, so later lookups (every
    /// stats pass, for every container) need not probe the file system.
    scope_prefix: std::sync::OnceLock<&'static str>,
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
    /// Validates `cfg` and detects the cgroup layout from `/proc/self/mountinfo`; under
    /// `cgroupDriver: systemd` connects to systemd ([`DbusSystemd::connect`]).
    pub fn new(cfg: CgroupConfig) -> Result<Self> {
        let driver = Driver::parse(&cfg.cgroup_driver)?;
        let mountinfo = if cfg.cgroups_per_qos {
            let path = PathBuf::from("/proc/self/mountinfo");
            Some(std::fs::read_to_string(&path).map_err(|source| Error::ReadMountinfo { path, source })?)
        } else {
            None
        };
        let mut manager = Self::build(cfg, mountinfo.as_deref(), Box::new(RealSys))?;
        if driver == Driver::Systemd && manager.layout.is_some() {
            let systemd = DbusSystemd::connect()?;
            tracing::info!(address = systemd.address(), "cgroupDriver systemd: pod and QoS cgroups are systemd slices");
            manager.systemd = Some(Arc::new(systemd));
        }
        Ok(manager)
    }

    /// Uses `units` for the slices of `cgroupDriver: systemd` (tests, or another bus).
    #[must_use]
    pub fn with_systemd_units(mut self, units: Arc<dyn SystemdUnits>) -> Self {
        self.systemd = Some(units);
        self
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

    pub(crate) fn build(cfg: CgroupConfig, mountinfo: Option<&str>, sys: Box<dyn CgroupSys>) -> Result<Self> {
        let driver = Driver::parse(&cfg.cgroup_driver)?;
        let names = CgroupNames::with_driver(&cfg.cgroup_root, driver)?;
        let layout = match (cfg.cgroups_per_qos, mountinfo) {
            (true, Some(text)) => {
                let layout = CgroupLayout::from_mounts(&mounts::parse_mountinfo(text), &cfg.fs_root)?;
                Self::validate_layout(&layout, &cfg.fs_root)?;
                Some(layout)
            }
            _ => None,
        };
        Ok(Self {
            config: cfg,
            names,
            layout,
            sys,
            systemd: None,
            remove_timeout: Duration::from_secs(2),
            unquoted: None,
            scope_prefix: std::sync::OnceLock::new(),
        })
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
        let kubepods = self.names.kubepods_rel();
        let mut out = KubepodsDirs::default();
        for h in self.hierarchies() {
            match &h.kind {
                HierarchyKind::Unified(_) | HierarchyKind::HybridUnified => {
                    out.cgroup2 = Some(h.mount.join(&kubepods));
                }
                HierarchyKind::V1(c) if c.contains("memory") => out.memory_v1 = Some(h.mount.join(&kubepods)),
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
        self.hierarchies()
            .iter()
            .flat_map(|h| QOS_CLASSES.iter().map(move |q| h.mount.join(self.names.pod_rel(*q, uid))))
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
        QOS_CLASSES.map(|q| (q, h.mount.join(self.names.qos_rel(q))))
    }

    /// Whether the manager makes and limits its cgroups in `h`: every hierarchy under the
    /// cgroupfs driver; under systemd the unified one and the v1 hierarchies the kubelet
    /// uses (upstream's list for the systemd driver): systemd itself handles the rest
    /// (devices, freezer, ...), and removes what others make there.
    fn ours(&self, h: &Hierarchy) -> bool {
        match &h.kind {
            HierarchyKind::V1(c) if self.systemd.is_some() => CHECKED_V1.iter().any(|x| c.contains(*x)),
            _ => true,
        }
    }

    /// Creates each missing level of `rel` in `h` (a cpuset cgroup with its parent's cpus).
    fn mkdir_levels(&self, h: &Hierarchy, rel: &Path) -> Result<()> {
        let mut dir = h.mount.clone();
        for c in rel.components() {
            dir.push(c);
            if self.mkdir(&dir)? && matches!(&h.kind, HierarchyKind::V1(c) if c.contains("cpuset")) {
                Self::inherit_cpuset(&dir)?;
            }
        }
        Ok(())
    }

    fn unified(&self) -> bool {
        self.layout.as_ref().is_some_and(CgroupLayout::is_unified)
    }

    /// Under systemd: starts the slice `unit` in `parent` with `cfg`'s limits; true when
    /// it was created now. An existing slice is left as it is unless `update_existing`.
    /// Without systemd: false.
    fn start_slice(&self, unit: &str, parent: &str, cfg: &PodResourceConfig, update_existing: bool) -> Result<bool> {
        let Some(units) = &self.systemd else { return Ok(false) };
        let props = systemd_dbus::resource_properties(cfg, self.unified());
        let created = units.start_slice(unit, parent, &props)?;
        if !created && update_existing {
            units.set_properties(unit, &props)?;
        }
        Ok(created)
    }

    /// Under systemd: sets `cfg`'s limits on the unit `unit`.
    fn set_slice(&self, unit: &str, cfg: &PodResourceConfig) -> Result<()> {
        let Some(units) = &self.systemd else { return Ok(()) };
        units.set_properties(unit, &systemd_dbus::resource_properties(cfg, self.unified()))?;
        Ok(())
    }
}

/// The slice holding the cgroup root `root` (`-.slice` for `/`).
fn root_slice(root: &Path) -> String {
    let parts: Vec<&str> = root.iter().filter_map(|c| c.to_str()).collect();
    parts.last().map_or_else(|| "-.slice".to_owned(), |last| (*last).to_owned())
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
        let root = self.names.root_rel();
        let kubepods_rel = self.names.kubepods_rel();
        // The QoS cgroups leave huge pages to the pod cgroups (upstream
        // `setHugePagesUnbounded`).
        let unbounded = Some(resources::HugepageLimits::unbounded());
        let best_effort = PodResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            hugepage_limits: unbounded.clone(),
            ..PodResourceConfig::default()
        };
        let burstable = PodResourceConfig { hugepage_limits: unbounded, ..PodResourceConfig::default() };
        let pods_limits = self.config.enforcement.pods.clone().unwrap_or_default();
        if self.systemd.is_some() {
            let kubepods = self.names.slice(None);
            let root_slice = root_slice(&root);
            self.start_slice(&kubepods, &root_slice, &pods_limits, true)?;
            for (qos, cfg) in [(QosClass::Burstable, &burstable), (QosClass::BestEffort, &best_effort)] {
                self.start_slice(&self.names.slice(Some((qos, None))), &kubepods, cfg, true)?;
            }
        }
        for h in self.hierarchies().iter().filter(|h| self.ours(h)) {
            let root_dir = h.mount.join(&root);
            if !root_dir.is_dir() {
                return Err(Error::CgroupRootMissing { path: root_dir }.into());
            }
            if let HierarchyKind::Unified(_) = h.kind {
                // Every level from the fs root down must pass the controllers on.
                let mut dir = h.mount.clone();
                Self::enable_controllers(&dir)?;
                for c in root.components() {
                    dir.push(c);
                    Self::enable_controllers(&dir)?;
                }
            }
            if matches!(&h.kind, HierarchyKind::V1(c) if c.contains("cpuset")) && root.components().next().is_some() {
                Self::inherit_cpuset(&root_dir)?;
            }
            let kubepods = h.mount.join(&kubepods_rel);
            let burstable_dir = h.mount.join(self.names.qos_rel(QosClass::Burstable));
            let best_effort_dir = h.mount.join(self.names.qos_rel(QosClass::BestEffort));
            for dir in [&kubepods, &burstable_dir, &best_effort_dir] {
                self.mkdir(dir)?;
                match h.kind {
                    HierarchyKind::Unified(_) => Self::enable_controllers(dir)?,
                    HierarchyKind::V1(ref c) if c.contains("cpuset") => Self::inherit_cpuset(dir)?,
                    _ => {}
                }
            }
            Self::apply_limits(h, &best_effort_dir, &best_effort)?;
            Self::apply_limits(h, &burstable_dir, &burstable)?;
            if self.config.enforcement.pods.is_some() {
                Self::apply_limits(h, &kubepods, &pods_limits)?;
            }
        }
        let reserved =
            [("Kube", &self.config.enforcement.kube_reserved), ("System", &self.config.enforcement.system_reserved)];
        for (what, enforced) in reserved {
            let Some((name, limits)) = enforced else { continue };
            let rel: PathBuf = name.split('/').filter(|c| !c.is_empty()).collect();
            for h in self.hierarchies().iter().filter(|h| !matches!(h.kind, HierarchyKind::HybridUnified)) {
                let dir = h.mount.join(&rel);
                if !dir.is_dir() {
                    return Err(Error::ReservedCgroupMissing { what, name: name.clone(), path: dir }.into());
                }
            }
            // Under systemd the reserved cgroup is a unit (`/system.slice`), which keeps its
            // limits across a daemon-reload only when systemd holds them too.
            if self.systemd.is_some()
                && let Some(unit) = rel.file_name().and_then(|u| u.to_str())
            {
                self.set_slice(unit, limits)?;
            }
            for h in self.hierarchies().iter().filter(|h| !matches!(h.kind, HierarchyKind::HybridUnified)) {
                Self::apply_limits(h, &h.mount.join(&rel), limits)?;
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

    fn container_cgroup(&self, pod_cgroup: &str, container_id: &str) -> String {
        if self.systemd.is_none() {
            return format!("{pod_cgroup}/{container_id}");
        }
        // runc names a container's scope after the runtime's prefix (containerd's
        // `cri-containerd`, CRI-O's `crio`): whichever exists, remembered once found.
        let scope = |prefix: &str| format!("{pod_cgroup}/{prefix}-{container_id}.scope");
        if let Some(prefix) = self.scope_prefix.get() {
            return scope(prefix);
        }
        let Some(mount) = self.hierarchies().first().map(|h| h.mount.clone()) else {
            return scope(SCOPE_PREFIXES[0]);
        };
        match SCOPE_PREFIXES.iter().find(|p| mount.join(scope(p).trim_start_matches('/')).is_dir()) {
            Some(prefix) => scope(self.scope_prefix.get_or_init(|| prefix)),
            None => scope(SCOPE_PREFIXES[0]),
        }
    }

    fn ensure_pod_cgroup(&self, pod: &Pod) -> super::Result<()> {
        if self.layout.is_none() {
            return Ok(());
        }
        let uid = self.names.checked_uid(pod_uid(pod))?;
        let qos = qos_class(pod);
        let enforce_cpu_limits = self.config.cpu_cfs_quota && !self.unquoted.as_ref().is_some_and(|f| f(uid));
        let mut cfg = resources::resource_config_for_pod(pod, enforce_cpu_limits);
        if self.config.pod_pids_limit > 0 {
            cfg.pids_limit = Some(self.config.pod_pids_limit);
        }
        let rel = self.names.pod_rel(qos, uid);
        let qos_rel = self.names.qos_rel(qos);
        for h in self.hierarchies().iter().filter(|h| self.ours(h)) {
            let parent = h.mount.join(&qos_rel);
            if parent.is_dir() {
                continue;
            }
            if self.systemd.is_none() {
                return Err(Error::ParentMissing { path: parent }.into());
            }
            // systemd trims a slice's cgroups in the v1 hierarchies it does not use for
            // it when it realizes the slice again; the ones the kubelet uses come back.
            self.mkdir_levels(h, &qos_rel)?;
        }
        // systemd makes the slice's cgroup in the hierarchies it manages; mkdir makes the
        // others (cpuset and hugetlb on v1), as libcontainer's systemd manager does.
        // Slice names exist only under systemd (a cgroupfs root or uid may hold `_`).
        let slice = self.systemd.is_some().then(|| self.names.slice(Some((qos, Some(uid)))));
        let started = match &slice {
            Some(slice) => self.start_slice(slice, &self.names.slice(Some((qos, None))), &cfg, false)?,
            None => false,
        };
        for h in self.hierarchies().iter().filter(|h| self.ours(h)) {
            let dir = h.mount.join(&rel);
            if !self.mkdir(&dir)? && !started {
                continue;
            }
            if let Err(error) = Self::apply_limits(h, &dir, &cfg) {
                // Start over on the next attempt rather than keep a cgroup without limits.
                if let (Some(units), Some(slice)) = (&self.systemd, &slice)
                    && let Err(stop) = units.stop_unit(slice)
                {
                    tracing::warn!(error = %stop, %slice, "cannot undo pod slice creation");
                }
                if let Err(rm) = self.sys.rmdir(&dir)
                    && rm.kind() != io::ErrorKind::NotFound
                {
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
        let uid = self.names.checked_uid(uid)?;
        let dirs = self.pod_dirs(uid);
        if dirs.is_empty() {
            return Ok(());
        }
        self.kill_processes(&dirs)?;
        if let Some(units) = &self.systemd {
            // The pod's slice is the last component of its directory, in any QoS class.
            let slices: BTreeSet<&str> = dirs.iter().filter_map(|d| d.file_name()?.to_str()).collect();
            for slice in slices {
                units.stop_unit(slice).map_err(Error::from)?;
            }
        }
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
                    // The other QoS classes' cgroups sit in Guaranteed's (kubepods) too.
                    let Some(uid) = name.to_str().and_then(|n| self.names.pod_uid_of(qos, n)) else { continue };
                    found.insert((uid, qos));
                }
            }
        }
        Ok(found.into_iter().collect())
    }

    fn pod_cgroup_exists(&self, uid: &str) -> bool {
        let Some(layout) = self.layout.as_ref() else {
            return true;
        };
        let Ok(uid) = self.names.checked_uid(uid) else {
            return false;
        };
        let checked: Vec<&Hierarchy> = layout
            .hierarchies
            .iter()
            .filter(|h| match &h.kind {
                HierarchyKind::V1(c) => CHECKED_V1.iter().any(|x| c.contains(*x)),
                HierarchyKind::Unified(_) => true,
                HierarchyKind::HybridUnified => false,
            })
            .collect();
        QOS_CLASSES.iter().any(|q| {
            let rel = self.names.pod_rel(*q, uid);
            checked.iter().all(|h| h.mount.join(&rel).is_dir())
        })
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
        if self.systemd.is_some() {
            for (qos, cfg) in [(QosClass::Burstable, &burstable), (QosClass::BestEffort, &best_effort)] {
                self.set_slice(&self.names.slice(Some((qos, None))), cfg)?;
            }
        }
        for h in self.hierarchies().iter().filter(|h| h.has("cpu")) {
            for (qos, cfg) in [(QosClass::Burstable, &burstable), (QosClass::BestEffort, &best_effort)] {
                let dir = h.mount.join(self.names.qos_rel(qos));
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
