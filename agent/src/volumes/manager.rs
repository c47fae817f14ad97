//! [`VolumeManager`]: sets up, refreshes and tears down the volumes of pods, and turns
//! `volumeMounts` into CRI mounts (upstream `volumemanager` with its reconciler folded into
//! `SyncPod`, plus `makeMounts` of `kubelet_pods.go`).
//!
//! The pod worker serializes calls per pod (one sync of a pod at a time), which the
//! atomic writer needs; different pods never share a directory.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec, Secret, Volume, VolumeProjection};

use super::atomic_writer::{AtomicWriter, DATA_DIR_NAME, Payload};
use super::csi::{CsiDrivers, CsiSpec};
use super::downward_api::{self, NodeAllocatable};
use super::empty_dir::{self, Medium};
use super::mounter::{Mounter, SystemMounter};
use super::source::{BoundPod, ObjectSource};
use super::token::TokenManager;
use super::{Error, Result, SetUpFailure, VolumeError, config_map, host_path, ownership, secret, subpath};
use crate::container::api;
use crate::container::backoff::{Clock, SystemClock};
use crate::types::io::PathIoError;
use crate::types::pod::uid as pod_uid;

/// Upstream default of `serviceAccountToken.expirationSeconds`.
const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// Upstream `ProjectedVolumeSourceDefaultMode` / `DownwardAPIVolumeSourceDefaultMode`.
const DEFAULT_MODE: u32 = 0o644;

/// The in-tree volume plugins this agent provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plugin {
    EmptyDir,
    HostPath,
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
    /// An OCI image or artifact mounted by the runtime (upstream `kubernetes.io/image`):
    /// nothing on the node's side; the image is pulled by the runtime manager before the
    /// containers start and handed to CRI as the mount's `image`.
    Image,
    /// A volume of a CSI driver (upstream `kubernetes.io/csi`), from a claim or inline.
    Csi,
}

impl Plugin {
    /// Upstream plugin name (`kubernetes.io/empty-dir`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::EmptyDir => "kubernetes.io/empty-dir",
            Self::HostPath => "kubernetes.io/host-path",
            Self::ConfigMap => "kubernetes.io/configmap",
            Self::Secret => "kubernetes.io/secret",
            Self::DownwardApi => "kubernetes.io/downward-api",
            Self::Projected => "kubernetes.io/projected",
            Self::Image => "kubernetes.io/image",
            Self::Csi => super::csi::PLUGIN_NAME,
        }
    }

    /// The plugin's directory under `pods/<uid>/volumes` (the name with `/` escaped as `~`).
    #[must_use]
    pub fn dir_name(self) -> String {
        self.name().replace('/', "~")
    }

    /// Volumes whose content comes from the API and is refreshed on every sync
    /// (upstream `RequiresRemount`); they are also mounted read-only.
    #[must_use]
    pub fn is_projected_content(self) -> bool {
        matches!(self, Self::ConfigMap | Self::Secret | Self::DownwardApi | Self::Projected)
    }
}

/// The images pulled for a pod's image volumes, by volume name (upstream
/// `ImageVolumes`): what each mount of the volume hands the runtime.
pub type ImageVolumes = HashMap<String, api::ImageSpec>;

/// A container's CRI mounts ([`VolumeManager::container_mounts`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerMounts {
    pub mounts: Vec<api::Mount>,
    /// CRI `Mount.image_sub_path` of the image volume mounts with a sub path, by index
    /// into `mounts` ([`crate::container::ImageSubPaths`]).
    pub image_sub_paths: crate::container::ImageSubPaths,
    /// The block volumes of its `volumeDevices` (upstream `makeBlockVolumes`).
    pub devices: Vec<api::Device>,
}

/// A volume as set up for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// The volume's name in the pod spec.
    pub name: String,
    /// Its plugin.
    pub plugin: Plugin,
    /// Where it is on the host (the hostPath itself for hostPath volumes).
    pub path: PathBuf,
    /// Mounted read-only into every container whatever `volumeMounts[].readOnly` says.
    pub read_only: bool,
    /// Backed by a tmpfs.
    pub memory: bool,
    /// `emptyDir.sizeLimit` in bytes, for eviction.
    pub size_limit: Option<i64>,
    /// The claim it comes from (`persistentVolumeClaim`, or the claim of an `ephemeral`
    /// volume), in the pod's namespace.
    pub claim: Option<String>,
    /// What a CSI volume is.
    pub csi: Option<Arc<CsiSpec>>,
}

impl MountedVolume {
    /// The plugin's name in metrics: upstream's, with a CSI volume's driver
    /// (`kubernetes.io/csi:<driver>`).
    #[must_use]
    pub fn qualified_plugin(&self) -> String {
        match &self.csi {
            Some(c) => format!("{}:{}", self.plugin.name(), c.driver),
            None => self.plugin.name().to_owned(),
        }
    }
}

/// An event a sync's volume work asks the pod worker to record (upstream's volume
/// manager records them itself): on the pod, or on another object, such as the claim of
/// a volume grown on the node.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeEvent {
    /// The object the event is about; `None`: the pod.
    pub object: Option<k8s_openapi::api::core::v1::ObjectReference>,
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The volumes of one pod, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodVolumes {
    volumes: BTreeMap<String, MountedVolume>,
    remount_failures: Vec<SetUpFailure>,
    /// Events of this sync (expansions on the node).
    events: Vec<VolumeEvent>,
    /// The volumes whose first set-up failed (still desired).
    pending: Vec<MountedVolume>,
}

impl PodVolumes {
    /// The volume called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&MountedVolume> {
        self.volumes.get(name)
    }

    /// All volumes, by name.
    pub fn iter(&self) -> impl Iterator<Item = &MountedVolume> {
        self.volumes.values()
    }

    /// Number of volumes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    /// Whether the pod has no volumes in use.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }

    /// Volumes in use whose refresh failed in this sync; they keep their previous content.
    /// Each deserves a `FailedMount` event.
    #[must_use]
    pub fn remount_failures(&self) -> &[SetUpFailure] {
        &self.remount_failures
    }

    /// Events of this sync for the pod worker to record.
    #[must_use]
    pub fn events(&self) -> &[VolumeEvent] {
        &self.events
    }
}

/// Sets up and tears down pod volumes under `<root-dir>/pods/<uid>/volumes`.
#[derive(Debug)]
pub struct VolumeManager {
    root_dir: PathBuf,
    source: Arc<dyn ObjectSource>,
    mounter: Arc<dyn Mounter>,
    tokens: TokenManager,
    node: OnceLock<NodeAllocatable>,
    mounted: Mutex<HashMap<String, PodVolumes>>,
    csi: Arc<CsiDrivers>,
    metrics: super::metrics::VolumeMetrics,
    clock: Arc<dyn Clock>,
    /// Since when each pod whose volumes are not all set up has waited (or since its
    /// last timeout event).
    waiting: Mutex<HashMap<String, std::time::SystemTime>>,
    /// Expansions not to try again while the pod runs (upstream's actual state of the
    /// world marks them): pod UID, volume name and size, for a read-only volume or a
    /// driver that cannot grow a volume in use (`FailedPrecondition`).
    expansions_settled: Mutex<HashSet<(String, String, i64)>>,
}

fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers.iter().flatten().chain(&spec.containers)
}

/// Names of the volumes some container mounts; upstream ignores the others.
fn used_volume_names(spec: &PodSpec) -> HashSet<&str> {
    let mut used: HashSet<&str> = HashSet::new();
    for c in all_containers(spec) {
        used.extend(c.volume_mounts.iter().flatten().map(|m| m.name.as_str()));
        used.extend(c.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        used.extend(c.volume_mounts.iter().flatten().map(|m| m.name.as_str()));
    }
    used
}

/// The field name of a volume source this agent does not provide.
fn unsupported_kind(v: &Volume) -> &'static str {
    let kinds: [(bool, &'static str); 23] = [
        (v.persistent_volume_claim.is_some(), "persistentVolumeClaim"),
        (v.csi.is_some(), "csi"),
        (v.ephemeral.is_some(), "ephemeral"),
        (v.nfs.is_some(), "nfs"),
        (v.iscsi.is_some(), "iscsi"),
        (v.fc.is_some(), "fc"),
        (v.rbd.is_some(), "rbd"),
        (v.cephfs.is_some(), "cephfs"),
        (v.git_repo.is_some(), "gitRepo"),
        (v.glusterfs.is_some(), "glusterfs"),
        (v.aws_elastic_block_store.is_some(), "awsElasticBlockStore"),
        (v.gce_persistent_disk.is_some(), "gcePersistentDisk"),
        (v.azure_disk.is_some(), "azureDisk"),
        (v.azure_file.is_some(), "azureFile"),
        (v.cinder.is_some(), "cinder"),
        (v.flex_volume.is_some(), "flexVolume"),
        (v.flocker.is_some(), "flocker"),
        (v.photon_persistent_disk.is_some(), "photonPersistentDisk"),
        (v.portworx_volume.is_some(), "portworxVolume"),
        (v.quobyte.is_some(), "quobyte"),
        (v.scale_io.is_some(), "scaleIO"),
        (v.storageos.is_some(), "storageos"),
        (v.vsphere_volume.is_some(), "vsphereVolume"),
    ];
    kinds.iter().find(|(set, _)| *set).map_or("(empty)", |(_, k)| k)
}

/// Upstream `FsUserFrom`: the one effective `runAsUser` of every (init) container, if they
/// all have the same.
fn fs_user(spec: &PodSpec) -> Option<u32> {
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let mut user = None;
    for c in all_containers(spec) {
        let u = c.security_context.as_ref().and_then(|s| s.run_as_user).or(pod_user)?;
        if user.is_some_and(|prev| prev != u) {
            return None;
        }
        user = Some(u);
    }
    user.and_then(|u| u32::try_from(u).ok())
}

fn fs_group(spec: &PodSpec) -> Option<u32> {
    spec.security_context.as_ref().and_then(|s| s.fs_group).and_then(|g| u32::try_from(g).ok())
}

fn mode_of(mode: Option<i32>, default: u32) -> u32 {
    mode.map_or(default, |m| m as u32 & 0o7777)
}

/// Upstream `getNestedMountpoints`: where other volumes are mounted beneath this one in
/// some container, relative to this volume (only the outermost of doubly nested ones).
fn nested_mountpoints(name: &str, spec: &PodSpec) -> Result<Vec<String>, VolumeError> {
    let mut out = Vec::new();
    for c in all_containers(spec) {
        let clean = |p: &str| {
            let parts: Vec<&str> = p.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
            format!("{}{}", if p.starts_with('/') { "/" } else { "" }, parts.join("/"))
        };
        let mut all: Vec<String> = c.volume_mounts.iter().flatten().map(|m| clean(&m.mount_path)).collect();
        all.sort();
        for mine in c.volume_mounts.iter().flatten().filter(|m| m.name == name).map(|m| clean(&m.mount_path)) {
            if mine.starts_with("../") {
                return Err(VolumeError::NestedMountpoint(format!("invalid container mount point {mine}")));
            }
            let prefix = format!("{}/", mine.trim_end_matches('/'));
            let mut prev: Option<String> = None;
            for mp in &all {
                if !mp.starts_with(&prefix) || prev.as_deref().is_some_and(|p| mp.starts_with(p)) {
                    continue;
                }
                prev = Some(format!("{mp}/"));
                out.push(mp[prefix.len()..].to_owned());
            }
        }
    }
    Ok(out)
}

/// Whose tokens a pod's volumes carry: its service account (`default` when the spec names
/// none) and the pod they are bound to.
fn token_subject(pod: &Pod) -> (&str, BoundPod) {
    let sa = pod.spec.as_ref().and_then(|s| s.service_account_name.as_deref()).filter(|s| !s.is_empty());
    let bound = BoundPod { name: pod.metadata.name.clone().unwrap_or_default(), uid: pod_uid(pod).to_owned() };
    (sa.unwrap_or("default"), bound)
}

impl VolumeManager {
    /// A manager for pods under `<root_dir>/pods`, reading API objects from `source`,
    /// mounting through the kernel. Node allocatable is probed on first use.
    #[must_use]
    pub fn new(root_dir: impl Into<PathBuf>, source: Arc<dyn ObjectSource>) -> Self {
        Self {
            root_dir: root_dir.into(),
            source,
            mounter: Arc::new(SystemMounter),
            tokens: TokenManager::new(Arc::new(SystemClock)),
            node: OnceLock::new(),
            mounted: Mutex::default(),
            csi: Arc::default(),
            metrics: super::metrics::VolumeMetrics::default(),
            clock: Arc::new(SystemClock),
            waiting: Mutex::default(),
            expansions_settled: Mutex::default(),
        }
    }

    /// Records volume operations into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: super::metrics::VolumeMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The volume operation families.
    #[must_use]
    pub fn metrics(&self) -> &super::metrics::VolumeMetrics {
        &self.metrics
    }

    /// `volume_manager_total_volumes`: the volumes of the pods set up here by plugin
    /// (upstream's full plugin names), `actual_state_of_world` for those set up and
    /// `desired_state_of_world` for those plus the ones whose set-up failed.
    #[must_use]
    pub fn volume_counts(&self) -> BTreeMap<(String, &'static str), i64> {
        let mut counts = BTreeMap::new();
        for pod in self.mounted.lock().unwrap().values() {
            for v in pod.iter() {
                let plugin = v.qualified_plugin();
                *counts.entry((plugin.clone(), "actual_state_of_world")).or_insert(0) += 1;
                *counts.entry((plugin, "desired_state_of_world")).or_insert(0) += 1;
            }
            for v in &pod.pending {
                *counts.entry((v.qualified_plugin(), "desired_state_of_world")).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Serves CSI volumes through `drivers`.
    #[must_use]
    pub fn with_csi(mut self, drivers: Arc<CsiDrivers>) -> Self {
        self.csi = drivers;
        self
    }

    /// The CSI drivers registered on this node.
    #[must_use]
    pub fn csi(&self) -> &Arc<CsiDrivers> {
        &self.csi
    }

    /// `<root>`.
    #[must_use]
    pub fn root_dir(&self) -> &Path {
        &self.root_dir
    }

    /// Mounts through `mounter` (a [`super::FakeMounter`] in tests).
    #[must_use]
    pub fn with_mounter(mut self, mounter: Arc<dyn Mounter>) -> Self {
        self.mounter = mounter;
        self
    }

    /// Times token refreshes and pods' waits for their volumes with `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.tokens = TokenManager::new(Arc::clone(&clock));
        self.clock = clock;
        self
    }

    /// Uses `node` instead of probing the host.
    #[must_use]
    pub fn with_node_allocatable(self, node: NodeAllocatable) -> Self {
        Self { node: OnceLock::from(node), ..self }
    }

    /// Where API objects come from.
    #[must_use]
    pub fn object_source(&self) -> &Arc<dyn ObjectSource> {
        &self.source
    }

    /// The node's allocatable resources (defaults for unset limits).
    pub fn node_allocatable(&self) -> &NodeAllocatable {
        self.node.get_or_init(|| NodeAllocatable::detect(&self.root_dir))
    }

    /// The node's volumes in use (`status.volumesInUse`): the attachable volumes
    /// (persistent CSI volumes whose driver attaches them) the node's pods want, set up or
    /// not yet, named as upstream's unique volume names
    /// (`kubernetes.io/csi/<driver>^<volume handle>`), sorted, each once. The
    /// attach/detach controller does not detach a volume in use.
    #[must_use]
    pub fn volumes_in_use(&self) -> Vec<String> {
        let mounted = self.mounted.lock().unwrap();
        let names: BTreeSet<String> = mounted
            .values()
            .flat_map(|p| p.iter().chain(&p.pending))
            .filter_map(|v| v.csi.as_ref())
            .filter(|c| c.mode == super::csi::LifecycleMode::Persistent && c.attach_required)
            .map(|c| format!("{}/{}^{}", super::csi::PLUGIN_NAME, c.driver, c.volume_handle))
            .collect();
        names.into_iter().collect()
    }

    /// `<root>/pods/<uid>`.
    #[must_use]
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid)
    }

    /// `<root>/pods/<uid>/volumes`.
    #[must_use]
    pub fn pod_volumes_dir(&self, uid: &str) -> PathBuf {
        self.pod_dir(uid).join("volumes")
    }

    /// The volumes set up by the last [`Self::mount_pod_volumes`] of the pod.
    #[must_use]
    pub fn mounted_volumes(&self, uid: &str) -> Option<PodVolumes> {
        self.mounted.lock().unwrap().get(uid).cloned()
    }

    /// What a volume is and where it lives, without touching anything.
    fn describe(&self, uid: &str, v: &Volume) -> Result<MountedVolume, VolumeError> {
        let at = |plugin: Plugin| self.pod_volumes_dir(uid).join(plugin.dir_name()).join(&v.name);
        let mv = |plugin: Plugin, path: PathBuf, memory: bool| MountedVolume {
            name: v.name.clone(),
            plugin,
            path,
            read_only: plugin.is_projected_content(),
            memory,
            size_limit: None,
            claim: None,
            csi: None,
        };
        Ok(if let Some(ed) = &v.empty_dir {
            let memory = Medium::parse(ed.medium.as_deref())? == Medium::Memory;
            let size_limit = ed.size_limit.as_ref().map(|q| crate::types::quantity::parse_bytes(&q.0)).transpose()?;
            MountedVolume { size_limit, ..mv(Plugin::EmptyDir, at(Plugin::EmptyDir), memory) }
        } else if let Some(hp) = &v.host_path {
            mv(Plugin::HostPath, PathBuf::from(&hp.path), false)
        } else if v.config_map.is_some() {
            mv(Plugin::ConfigMap, at(Plugin::ConfigMap), false)
        } else if v.secret.is_some() {
            mv(Plugin::Secret, at(Plugin::Secret), true)
        } else if v.downward_api.is_some() {
            mv(Plugin::DownwardApi, at(Plugin::DownwardApi), true)
        } else if v.projected.is_some() {
            mv(Plugin::Projected, at(Plugin::Projected), true)
        } else if v.image.is_some() {
            // No path: the runtime mounts the image (upstream's plugin has none either),
            // always read-only.
            MountedVolume { read_only: true, ..mv(Plugin::Image, PathBuf::new(), false) }
        } else {
            return Err(VolumeError::Unsupported { kind: unsupported_kind(v) });
        })
    }

    /// Whether a volume's setup from an earlier run is on disk (after an agent restart the
    /// in-memory record is gone; upstream reconstructs it from disk the same way).
    fn set_up_on_disk(mv: &MountedVolume) -> bool {
        match mv.plugin {
            Plugin::HostPath | Plugin::Image => false,
            Plugin::Csi => mv.path.parent().is_some_and(|d| d.join(super::csi::VOL_DATA_FILE).exists()),
            Plugin::EmptyDir => mv.path.is_dir(),
            _ => std::fs::symlink_metadata(mv.path.join(DATA_DIR_NAME)).is_ok(),
        }
    }

    /// Sets up (first time) or refreshes the volumes the pod's containers use; idempotent.
    /// Fails only if a volume that was never set up cannot be; refresh failures are in
    /// [`PodVolumes::remount_failures`].
    pub async fn mount_pod_volumes(&self, pod: &Pod) -> Result<PodVolumes> {
        let uid = pod_uid(pod).to_owned();
        let Some(spec) = pod.spec.as_ref() else { return Ok(PodVolumes::default()) };
        let previous = self.mounted_volumes(&uid).unwrap_or_default();
        let used = used_volume_names(spec);
        let mut result = PodVolumes::default();
        let mut failures = Vec::new();
        let mut unprocessed = Vec::new();
        let mut unattached = Vec::new();
        for v in spec.volumes.iter().flatten().filter(|v| used.contains(v.name.as_str())) {
            // Boxed: claims and CSI set-ups are rare, and would make every sync's future larger.
            let mv = match Box::pin(self.resolve(pod, v, previous.get(&v.name))).await {
                Ok(mv) => mv,
                Err(e) => {
                    unprocessed.push(SetUpFailure::new(&v.name, &e));
                    continue;
                }
            };
            let known = previous.get(&v.name).is_some_and(|p| p.plugin == mv.plugin && p.path == mv.path);
            let republish = known && mv.plugin == Plugin::Csi && Box::pin(self.requires_republish(&mv)).await;
            if known
                && mv.plugin == Plugin::Csi
                && let Err(e) = Box::pin(self.expand_if_pending(pod, &mv, &mut result.events)).await
            {
                tracing::warn!(volume = %v.name, error = %e, "expanding the volume on the node failed; retrying at the next sync");
            }
            if known && !mv.plugin.is_projected_content() && !republish {
                // emptyDir and hostPath have nothing to refresh (upstream mounts them once).
                result.volumes.insert(v.name.clone(), mv);
                continue;
            }
            let in_use = known || Self::set_up_on_disk(&mv);
            let started = std::time::Instant::now();
            let outcome = self.set_up(pod, v, &mv, in_use, republish).await;
            self.metrics.observe(&mv.qualified_plugin(), "volume_mount", outcome.is_ok(), started.elapsed());
            match outcome {
                Ok(()) => {
                    result.volumes.insert(v.name.clone(), mv);
                }
                Err(e @ VolumeError::NotAttached { .. }) if !in_use => {
                    tracing::debug!(pod = %pod.metadata.name.as_deref().unwrap_or_default(), volume = %v.name, reason = %e, "volume waits for its attachment");
                    result.pending.push(mv);
                    unattached.push(v.name.clone());
                }
                Err(e) => {
                    let failure = SetUpFailure::new(&v.name, &e);
                    tracing::warn!(pod = %pod.metadata.name.as_deref().unwrap_or_default(), %failure, "volume setup failed");
                    if in_use {
                        result.remount_failures.push(failure);
                        result.volumes.insert(v.name.clone(), mv);
                    } else {
                        result.pending.push(mv);
                        failures.push(failure);
                    }
                }
            }
        }
        let mut recorded = result.clone();
        recorded.remount_failures.clear();
        recorded.events.clear();
        self.mounted.lock().unwrap().insert(uid.clone(), recorded);
        if failures.is_empty() && unprocessed.is_empty() && unattached.is_empty() {
            self.waiting.lock().unwrap().remove(&uid);
            Ok(result)
        } else {
            unattached.sort();
            let now = self.clock.now();
            let mut waiting = self.waiting.lock().unwrap();
            let since = waiting.entry(uid).or_insert(now);
            let timed_out = now.duration_since(*since).unwrap_or_default() >= super::ATTACH_AND_MOUNT_TIMEOUT;
            if timed_out {
                *since = now;
            }
            Err(Error::MountFailed { failures, unprocessed, unattached, timed_out })
        }
    }

    /// `republish`: a published CSI volume whose driver `requiresRepublish`.
    async fn set_up(
        &self,
        pod: &Pod,
        v: &Volume,
        mv: &MountedVolume,
        in_use: bool,
        republish: bool,
    ) -> Result<(), VolumeError> {
        let spec = pod.spec.as_ref().expect("checked by the caller");
        match mv.plugin {
            Plugin::EmptyDir => {
                let medium = if mv.memory { Medium::Memory } else { Medium::Disk };
                let size = empty_dir::memory_size(self.node_allocatable().memory, pod, mv.size_limit);
                empty_dir::set_up(&mv.path, medium, size, self.mounter.as_ref())?;
                if let Some(gid) = fs_group(spec) {
                    ownership::set_volume_ownership(&mv.path, gid, false).map_err(|source| {
                        empty_dir::Error::Io(PathIoError { op: "set ownership of", path: mv.path.clone(), source })
                    })?;
                }
                Ok(())
            }
            Plugin::HostPath => {
                let hp = v.host_path.as_ref().expect("described as hostPath");
                Ok(host_path::check_type(&mv.path, hp.type_.as_deref())?)
            }
            // Pulled by the runtime manager, mounted by the runtime.
            Plugin::Image => Ok(()),
            Plugin::Csi => Box::pin(self.set_up_csi(pod, mv, republish)).await,
            Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected => {
                // Read everything first: a failure leaves the volume as it was.
                let payload = self.payload(pod, v).await?;
                self.write_atomic(pod, mv, &payload, in_use)
            }
        }
    }

    async fn config_map(&self, pod: &Pod, name: &str, optional: bool) -> Result<ConfigMap, VolumeError> {
        match self.source.config_map(pod_namespace(pod), name).await? {
            Some(cm) => Ok(cm),
            None if optional => Ok(ConfigMap::default()),
            None => Err(VolumeError::NotFound { resource: "configmap", name: name.to_owned() }),
        }
    }

    async fn secret(&self, pod: &Pod, name: &str, optional: bool) -> Result<Secret, VolumeError> {
        match self.source.secret(pod_namespace(pod), name).await? {
            Some(s) => Ok(s),
            None if optional => Ok(Secret::default()),
            None => Err(VolumeError::NotFound { resource: "secret", name: name.to_owned() }),
        }
    }

    /// The files of an API-backed volume (upstream `MakePayload` / `CollectData` /
    /// `collectData` of the projected plugin).
    async fn payload(&self, pod: &Pod, v: &Volume) -> Result<Payload, VolumeError> {
        let node = *self.node_allocatable();
        if let Some(src) = &v.config_map {
            let optional = src.optional == Some(true);
            let cm = self.config_map(pod, &src.name, optional).await?;
            let items = src.items.as_deref().unwrap_or_default();
            return Ok(config_map::make_payload(
                items,
                &cm,
                mode_of(src.default_mode, config_map::DEFAULT_MODE),
                optional,
            )?);
        }
        if let Some(src) = &v.secret {
            let optional = src.optional == Some(true);
            let s = self.secret(pod, src.secret_name.as_deref().unwrap_or_default(), optional).await?;
            let items = src.items.as_deref().unwrap_or_default();
            return Ok(secret::make_payload(items, &s, mode_of(src.default_mode, secret::DEFAULT_MODE), optional)?);
        }
        if let Some(src) = &v.downward_api {
            let items = src.items.as_deref().unwrap_or_default();
            return Ok(downward_api::collect_data(items, pod, &node, mode_of(src.default_mode, DEFAULT_MODE))?);
        }
        let src = v.projected.as_ref().expect("described as projected");
        let default_mode = mode_of(src.default_mode, DEFAULT_MODE);
        let mut payload = Payload::new();
        let mut errors = Vec::new();
        for s in src.sources.iter().flatten() {
            match self.projection(pod, s, default_mode, &node).await {
                Ok(p) => payload.extend(p),
                Err(e) => errors.push(e),
            }
        }
        match errors.len() {
            0 => Ok(payload),
            1 => Err(errors.remove(0)),
            _ => Err(VolumeError::Aggregate(errors)),
        }
    }

    async fn projection(
        &self,
        pod: &Pod,
        s: &VolumeProjection,
        default_mode: u32,
        node: &NodeAllocatable,
    ) -> Result<Payload, VolumeError> {
        let spec = pod.spec.as_ref().expect("checked by the caller");
        if let Some(p) = &s.config_map {
            let optional = p.optional == Some(true);
            let cm = self.config_map(pod, &p.name, optional).await?;
            return Ok(config_map::make_payload(p.items.as_deref().unwrap_or_default(), &cm, default_mode, optional)?);
        }
        if let Some(p) = &s.secret {
            let optional = p.optional == Some(true);
            let obj = self.secret(pod, &p.name, optional).await?;
            return Ok(secret::make_payload(p.items.as_deref().unwrap_or_default(), &obj, default_mode, optional)?);
        }
        if let Some(p) = &s.downward_api {
            return Ok(downward_api::collect_data(p.items.as_deref().unwrap_or_default(), pod, node, default_mode)?);
        }
        if let Some(p) = &s.service_account_token {
            let user = fs_user(spec);
            // With an fsUser or fsGroup the token is 0600 (fsGroup ownership then adds g+r).
            let mode = if user.is_some() || fs_group(spec).is_some() { 0o600 } else { default_mode };
            let audiences: Vec<String> = p.audience.iter().filter(|a| !a.is_empty()).cloned().collect();
            let (sa, bound) = token_subject(pod);
            let exp = p.expiration_seconds.unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS);
            let token =
                self.tokens.get(self.source.as_ref(), pod_namespace(pod), sa, &audiences, exp, &bound).await?.token;
            let mut file = super::atomic_writer::FileProjection::new(token, mode);
            file.fs_user = user;
            return Ok(Payload::from([(p.path.clone(), file)]));
        }
        let kind = if s.cluster_trust_bundle.is_some() { "clusterTrustBundle" } else { "podCertificate" };
        Err(VolumeError::UnsupportedProjection { kind })
    }

    /// Writes an API-backed volume: its directory (a tmpfs for secret, downwardAPI and
    /// projected), mount points of nested volumes, the files, `fsGroup` ownership. A first
    /// setup that fails is torn down again, as upstream.
    fn write_atomic(&self, pod: &Pod, mv: &MountedVolume, payload: &Payload, in_use: bool) -> Result<(), VolumeError> {
        let spec = pod.spec.as_ref().expect("checked by the caller");
        let result = (|| {
            empty_dir::setup_dir(&mv.path)?;
            // A volume in use already has its tmpfs (reading the mount table on every
            // refresh of every secret would be the expensive part of a sync).
            if mv.memory && !in_use {
                let size = empty_dir::memory_size(self.node_allocatable().memory, pod, None);
                empty_dir::set_up_tmpfs(&mv.path, size, self.mounter.as_ref())?;
            }
            for nested in nested_mountpoints(&mv.name, spec)? {
                let dir = mv.path.join(&nested);
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .create(&dir)
                    .map_err(|e| VolumeError::NestedMountpoint(e.to_string()))?;
            }
            let context = format!(
                "pod {}/{} volume {}",
                pod_namespace(pod),
                pod.metadata.name.as_deref().unwrap_or_default(),
                mv.name
            );
            let writer = AtomicWriter::new(&mv.path, context)?;
            let gid = fs_group(spec);
            let set_perms = |_: &Path| match gid {
                // The whole volume: the first write also creates the links outside the
                // version directory.
                Some(gid) => ownership::set_volume_ownership(&mv.path, gid, true),
                None => Ok(()),
            };
            let written = writer.write(payload, Some(&set_perms))?;
            if written {
                tracing::debug!(volume = %mv.name, plugin = mv.plugin.name(), "volume content written");
            }
            Ok(())
        })();
        if result.is_err() && !in_use {
            self.tear_down(&mv.path);
        }
        result
    }

    /// Unmounts (if mounted) and removes one volume directory; errors are logged.
    fn tear_down(&self, path: &Path) {
        match self.mounter.mounts_under(path) {
            Ok(points) => {
                for p in points {
                    if let Err(e) = self.mounter.unmount(&p) {
                        tracing::warn!(path = %p.display(), error = %e, "failed to unmount a volume after a failed setup");
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read mounts");
                return;
            }
        }
        if let Err(e) = std::fs::remove_dir_all(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "failed to remove a volume after a failed setup");
        }
    }

    /// The CRI mounts of a container's `volumeMounts` (upstream `makeMounts` without the
    /// `/etc/hosts` entry, which the runtime manager adds). `envs` are the container's
    /// resolved environment, for `subPathExpr`.
    pub fn container_mounts(
        &self,
        container: &Container,
        volumes: &PodVolumes,
        images: &ImageVolumes,
        envs: &[(String, String)],
    ) -> Result<ContainerMounts> {
        let mut out = ContainerMounts::default();
        for m in container.volume_mounts.iter().flatten() {
            let vol = volumes
                .get(&m.name)
                .ok_or_else(|| Error::VolumeNotFound { volume: m.name.clone(), container: container.name.clone() })?;
            let mut sub_path = m.sub_path.clone().unwrap_or_default();
            if let Some(expr) = m.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                sub_path = expand_sub_path_expr(expr, envs)?;
            }
            let propagation = match m.mount_propagation.as_deref() {
                None | Some("None") => api::MountPropagation::PropagationPrivate,
                Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => api::MountPropagation::PropagationBidirectional,
                Some(other) => return Err(Error::MountPropagation(other.to_owned())),
            };
            let mut mount = api::Mount {
                container_path: m.mount_path.clone(),
                readonly: m.read_only.unwrap_or(false) || vol.read_only,
                propagation: propagation as i32,
                ..Default::default()
            };
            if vol.plugin == Plugin::Image {
                // Upstream `makeMounts`: the image pulled for the volume, its sub path
                // checked as any other and left to the runtime to resolve in the image.
                let image = images.get(&m.name).ok_or_else(|| Error::ImageNotPulled { volume: m.name.clone() })?;
                if !sub_path.is_empty() {
                    subpath::validate(&sub_path)?;
                    out.image_sub_paths.push((out.mounts.len(), sub_path));
                }
                mount.image = Some(image.clone());
            } else {
                let host_path = if sub_path.is_empty() {
                    vol.path.clone()
                } else {
                    subpath::prepare(&vol.path, &sub_path, &m.name, &container.name)?
                };
                mount.host_path = host_path.to_string_lossy().into_owned();
            }
            out.mounts.push(mount);
        }
        for d in container.volume_devices.iter().flatten() {
            let vol = volumes
                .get(&d.name)
                .ok_or_else(|| Error::VolumeNotFound { volume: d.name.clone(), container: container.name.clone() })?;
            if !vol.csi.as_ref().is_some_and(|c| c.block) {
                return Err(Error::NotBlock { volume: d.name.clone(), container: container.name.clone() });
            }
            out.devices.push(api::Device {
                container_path: d.device_path.clone(),
                host_path: vol.path.to_string_lossy().into_owned(),
                permissions: "mrw".into(),
            });
        }
        Ok(out)
    }

    /// Unmounts and removes the volumes of a pod whose containers are gone (upstream
    /// `WaitForUnmount` in `SyncTerminatedPod`). Blocking: call it off the async workers.
    /// The pod directory itself is left to its owner.
    pub fn cleanup_pod(&self, uid: &str) -> Result<()> {
        let vols = self.pod_volumes_dir(uid);
        // Through the drivers first: they unmount what they mounted.
        self.csi
            .tear_down_pod(&self.root_dir, &vols)
            .map_err(VolumeError::from)
            .map_err(|e| Error::TearDown(e.to_string()))?;
        let io_err = PathIoError::at;
        // Volume by volume, each timed as upstream's `volume_unmount`.
        for (plugin, dir) in volume_dirs(&vols) {
            let started = std::time::Instant::now();
            let unmounted = self.unmount_all_under(&dir);
            self.metrics.observe(&plugin, "volume_unmount", unmounted.is_ok(), started.elapsed());
            unmounted?;
        }
        // Anything else mounted in the pod's volumes directory.
        self.unmount_all_under(&vols)?;
        let pod_dir = self.pod_dir(uid);
        let left = self.mounter.mounts_under(&pod_dir).map_err(io_err("read mounts under", &pod_dir))?;
        if !left.is_empty() {
            return Err(Error::StillMounted { path: pod_dir, mounts: left });
        }
        // remove_dir_all does not follow symlinks: links to the host stay links.
        match std::fs::remove_dir_all(&vols) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err("remove", &vols)(e).into()),
            _ => {}
        }
        self.mounted.lock().unwrap().remove(uid);
        self.waiting.lock().unwrap().remove(uid);
        self.expansions_settled.lock().unwrap().retain(|(pod, _, _)| pod != uid);
        self.tokens.forget_pod(uid);
        Ok(())
    }

    fn unmount_all_under(&self, dir: &Path) -> Result<()> {
        let io_err = PathIoError::at;
        for point in self.mounter.mounts_under(dir).map_err(io_err("read mounts under", dir))? {
            tracing::debug!(path = %point.display(), "unmounting volume");
            self.mounter.unmount(&point).map_err(io_err("unmount", &point))?;
        }
        Ok(())
    }

    /// Cleans up pod directories under `<root>/pods` of orphaned pods (pods removed while
    /// the agent was down): unmounts their volumes and removes the whole directory,
    /// unless something is still mounted there. `claim` grants the removal of a UID's
    /// directory and is held while it goes; it must refuse known pods, those the runtime
    /// still has containers for included. Blocking. Returns the UIDs removed and those
    /// that could not be (logged, and retried at the next call).
    pub fn cleanup_orphans<C>(&self, claim: impl Fn(&str) -> Option<C>) -> Result<OrphanSweep> {
        let pods = self.root_dir.join("pods");
        let entries = match std::fs::read_dir(&pods) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OrphanSweep::default()),
            Err(source) => return Err(PathIoError { op: "read", path: pods, source }.into()),
        };
        let mut uids: BTreeSet<String> = BTreeSet::new();
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                uids.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
        let mut sweep = OrphanSweep::default();
        for uid in uids {
            let Some(_claim) = claim(&uid) else { continue };
            let outcome = self.cleanup_pod(&uid).and_then(|()| {
                let dir = self.pod_dir(&uid);
                std::fs::remove_dir_all(&dir)
                    .map_err(|source| Error::Io(PathIoError { op: "remove", path: dir, source }))
            });
            match outcome {
                Ok(()) => {
                    tracing::info!(pod_uid = %uid, "removed orphaned pod directory");
                    sweep.removed.push(uid);
                }
                Err(e) => {
                    tracing::warn!(pod_uid = %uid, error = %e, "orphaned pod directory not removed");
                    sweep.failed.push(uid);
                }
            }
        }
        Ok(sweep)
    }
}

/// The volume directories in a pod's volumes directory, with their plugin's name
/// (`kubernetes.io~empty-dir/x` → `kubernetes.io/empty-dir`).
fn volume_dirs(vols: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for plugin in std::fs::read_dir(vols).into_iter().flatten().flatten() {
        let name = plugin.file_name().to_string_lossy().replace('~', "/");
        for volume in std::fs::read_dir(plugin.path()).into_iter().flatten().flatten() {
            out.push((name.clone(), volume.path()));
        }
    }
    out
}

/// What one [`VolumeManager::cleanup_orphans`] sweep did (upstream's
/// `kubelet_orphan_pod_cleaned_volumes` and `_errors` report its two counts).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OrphanSweep {
    /// Orphaned pods whose volumes and directory were removed.
    pub removed: Vec<String>,
    /// Orphaned pods whose clean-up failed.
    pub failed: Vec<String>,
}

/// Upstream `ExpandContainerVolumeMounts`: `$(VAR)` from the container's environment; a
/// variable that is missing or empty is an error.
fn expand_sub_path_expr(expr: &str, envs: &[(String, String)]) -> Result<String> {
    let vars: HashMap<&str, &str> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut missing = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            // `$$` is an escaped `$`, never a reference.
            (b'$', b'$') => i += 2,
            (b'$', b'(') => match expr[i + 2..].find(')') {
                Some(end) => {
                    let name = &expr[i + 2..i + 2 + end];
                    if vars.get(name).is_none_or(|v| v.is_empty()) {
                        missing.insert(name.to_owned());
                    }
                    i += 3 + end;
                }
                None => break,
            },
            _ => i += 1,
        }
    }
    if !missing.is_empty() {
        return Err(Error::SubPathExpr(missing.into_iter().collect::<Vec<_>>().join(", ")));
    }
    Ok(crate::types::expansion::expand(expr, &vars))
}

mod claims;
#[cfg(test)]
mod tests;
