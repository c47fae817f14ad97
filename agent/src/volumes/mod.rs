//! Pod volumes (upstream `pkg/kubelet/volumemanager` and the in-tree plugins of
//! `pkg/volume`): `emptyDir` (disk or tmpfs), `hostPath` (with its type checks),
//! `configMap`, `secret`, `downwardAPI` and `projected` (configMap, secret, downwardAPI and
//! service account token sources), laid out as upstream under
//! `<root-dir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`.
//!
//! - [`VolumeManager::mount_pod_volumes`] runs on every `SyncPod` before the runtime sync: it
//!   sets up each volume a container uses, and refreshes the API-backed ones (new `ConfigMap`
//!   and `Secret` content, tokens near expiry) through the [`atomic_writer`]. A volume that
//!   was never set up blocks the pod (event `FailedMount`, retried); a failed refresh of a
//!   volume that is already in use is reported and the old content stays. An attachable
//!   volume whose attachment is not there yet blocks the pod without an event of its own
//!   (upstream's `VerifyControllerAttachedVolume` records none); as upstream's pod worker
//!   after its wait of [`ATTACH_AND_MOUNT_TIMEOUT`], a pod still waiting that long gets
//!   `Unable to attach or mount volumes: ... timed out waiting for the condition`
//!   ([`Error::timeout_event`]), once per such period.
//! - [`VolumeManager::container_mounts`] turns `volumeMounts` into CRI mounts (`readOnly`,
//!   `subPath`/`subPathExpr`, `mountPropagation`, and the images of image volumes).
//! - [`VolumeManager::cleanup_pod`] unmounts and removes a terminated pod's volumes;
//!   [`VolumeManager::cleanup_orphans`] does it for pod directories nobody knows.
//!
//! API objects come from an [`ObjectSource`]: [`NoApiServer`] in standalone mode (static
//! pods with emptyDir/hostPath work; configMap/secret/token volumes fail with a clear
//! error), [`FakeObjectSource`] in tests.
//!
//! - `image` volumes (upstream `kubernetes.io/image`) need nothing on the node: the runtime
//!   manager pulls each volume's image with the volume's `pullPolicy` before the pod's
//!   containers start, and [`VolumeManager::container_mounts`] hands the runtime the pulled
//!   image as the mount's `image`, read-only, with its `subPath` as `image_sub_path`. The
//!   runtime mounts it (containerd 2.1 and later; containerd 1.6 refuses such a mount).
//!
//! - Claims (`persistentVolumeClaim`, generic `ephemeral`) and CSI volumes
//!   ([`csi`], `manager/claims.rs`): a claim is resolved to its bound persistent volume;
//!   `csi` volumes are staged and published through their registered driver, `hostPath`
//!   and `local` persistent volumes bind-mounted from their path.
//!
//! Not implemented: other in-tree volume types (refused with an error naming the type),
//! clusterTrustBundle and podCertificate projections, the alpha
//! fields `emptyDir.mode` and the `user`/`defaultUser` of atomic-writer volumes (their
//! feature gates are off by default upstream), `SELinux` relabeling, `emptyDir.sizeLimit`
//! enforcement (eviction's job), and the jitter upstream adds to token refresh.

pub mod atomic_writer;
pub mod config_map;
pub mod csi;
pub mod downward_api;
pub mod empty_dir;
pub mod host_path;
pub mod manager;
pub mod metrics;
pub mod mounter;
pub mod ownership;
pub mod secret;
pub mod source;
pub mod subpath;
pub mod token;

use std::path::PathBuf;

use crate::types::io::PathIoError;

pub use downward_api::NodeAllocatable;
pub use manager::{MountedVolume, Plugin, PodVolumes, VolumeEvent, VolumeManager};
pub use mounter::{FakeMounter, Mounter, SystemMounter};
pub use source::{BoundPod, FakeObjectSource, NoApiServer, ObjectSource, ServiceAccountToken};

/// Why one volume could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The API object could not be read.
    #[error(transparent)]
    Source(#[from] source::Error),
    /// A required `ConfigMap` or `Secret` does not exist (`configmap "x" not found`).
    #[error("{resource} {name:?} not found")]
    NotFound {
        /// `configmap` or `secret`, as upstream's message.
        resource: &'static str,
        /// The object's name.
        name: String,
    },
    /// A required `ConfigMap` key is missing.
    #[error(transparent)]
    ConfigMapKey(#[from] config_map::MissingKey),
    /// A required `Secret` key is missing.
    #[error(transparent)]
    SecretKey(#[from] secret::MissingKey),
    /// A downward API item failed.
    #[error(transparent)]
    DownwardApi(#[from] downward_api::Error),
    /// Writing the files failed.
    #[error(transparent)]
    Write(#[from] atomic_writer::Error),
    /// The hostPath type check failed.
    #[error(transparent)]
    HostPath(#[from] host_path::Error),
    /// The emptyDir (or the tmpfs of a secret/projected volume) could not be set up.
    #[error(transparent)]
    EmptyDir(#[from] empty_dir::Error),
    /// `emptyDir.sizeLimit` does not parse.
    #[error("invalid sizeLimit: {0}")]
    SizeLimit(#[from] crate::types::quantity::Error),
    /// A volume type or projection this agent does not provide.
    #[error(
        "{kind} volumes are not supported by swiftlet (supported: emptyDir, hostPath, configMap, secret, downwardAPI, projected, image, csi, persistentVolumeClaim, ephemeral)"
    )]
    Unsupported {
        /// The volume source's field name (`persistentVolumeClaim`, `csi`, ...).
        kind: &'static str,
    },
    /// A projected source this agent does not provide.
    #[error("projected volume source {kind} is not supported by swiftlet")]
    UnsupportedProjection {
        /// `clusterTrustBundle` or `podCertificate`.
        kind: &'static str,
    },
    /// Creating the mount points of volumes nested in this one failed.
    #[error("unable to create nested volume mountpoints: {0}")]
    NestedMountpoint(String),
    /// A CSI volume could not be set up.
    #[error(transparent)]
    Csi(#[from] csi::Error),
    /// A claim or its volume is not usable (upstream's messages).
    #[error("{0}")]
    Claim(String),
    /// An attachable CSI volume whose `VolumeAttachment` is not attached to the node yet:
    /// the pod waits for it quietly (upstream's `VerifyControllerAttachedVolume` records
    /// no event), see [`Error::timeout_event`].
    #[error(
        "kubernetes.io/csi: mounter.SetUpAt failed to fetch publishContext: volume {volume_handle} is not attached to node {node} yet (VolumeAttachment {attachment})"
    )]
    NotAttached {
        /// The volume's handle.
        volume_handle: String,
        /// This node.
        node: String,
        /// The attachment's name.
        attachment: String,
    },
    /// Several projected sources failed (Go's `utilerrors.NewAggregate` format).
    #[error("[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Aggregate(Vec<VolumeError>),
}

/// One volume that failed to set up, with upstream's `FailedMount` message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume {volume:?} : {message}")]
pub struct SetUpFailure {
    /// The volume's name.
    pub volume: String,
    /// What went wrong.
    pub message: String,
}

impl SetUpFailure {
    fn new(volume: &str, error: &VolumeError) -> Self {
        Self { volume: volume.to_owned(), message: error.to_string() }
    }
}

/// Errors of the volume manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Volumes the pod needs could not be set up; the pod waits. `failures` are the
    /// volumes whose set-up failed (one `MountVolume.SetUp failed` event each);
    /// `unprocessed` those that could not even be resolved (a claim not bound, an
    /// unsupported type: upstream's "failed to process volumes"); `unattached` the
    /// attachable volumes not attached yet (no event of their own).
    #[error(
        "unmounted volumes=[{}], unattached volumes=[{}]: {}",
        unmounted_names(failures, unprocessed, unattached).join(" "),
        unattached.join(" "),
        failures.iter().map(ToString::to_string).chain(unprocessed.iter().map(|f| f.message.clone())).collect::<Vec<_>>().join("; ")
    )]
    MountFailed {
        /// One entry per volume whose set-up failed.
        failures: Vec<SetUpFailure>,
        /// One entry per volume that could not be resolved.
        unprocessed: Vec<SetUpFailure>,
        /// The attachable volumes not attached yet, by name, sorted.
        unattached: Vec<String>,
        /// The pod has waited [`ATTACH_AND_MOUNT_TIMEOUT`] since it began waiting or since
        /// the last time this was set: time for upstream's timeout event.
        timed_out: bool,
    },
    /// A `volumeMount` names a volume that is not set up.
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    VolumeNotFound {
        /// The mount's volume name.
        volume: String,
        /// The container.
        container: String,
    },
    /// A `volumeDevices` entry names a volume that is not a block volume.
    #[error("volume {volume:?} of container {container:?} is not a block volume and cannot be in volumeDevices")]
    NotBlock {
        /// The device's volume name.
        volume: String,
        /// The container.
        container: String,
    },
    /// An image volume whose image was not pulled for this start (a runtime manager bug:
    /// it pulls every image volume before any container starts).
    #[error("the image of image volume {volume:?} was not pulled")]
    ImageNotPulled {
        /// The volume.
        volume: String,
    },
    /// A bad or unsafe `subPath`.
    #[error(transparent)]
    SubPath(#[from] subpath::Error),
    /// `subPathExpr` refers to variables the container does not have.
    #[error("missing value for {0}")]
    SubPathExpr(String),
    /// An unknown `mountPropagation`.
    #[error("invalid MountPropagation mode: {0:?}")]
    MountPropagation(String),
    /// A file system or mount call failed.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// A volume could not be torn down through its driver.
    #[error("{0}")]
    TearDown(String),
    /// Mounts remain under a pod directory after its volumes were unmounted: it is not
    /// removed, so that nothing mounted there is deleted.
    #[error("{path} still has mounts after its volumes were unmounted: {mounts:?}")]
    StillMounted {
        /// The pod directory.
        path: PathBuf,
        /// What is still mounted.
        mounts: Vec<PathBuf>,
    },
}

/// How long upstream's pod worker waits for a pod's volumes before it reports the wait
/// (`podAttachAndMountTimeout`).
pub const ATTACH_AND_MOUNT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(123);

/// The volumes not mounted, sorted.
fn unmounted_names(failures: &[SetUpFailure], unprocessed: &[SetUpFailure], unattached: &[String]) -> Vec<String> {
    let mut names: Vec<String> =
        failures.iter().chain(unprocessed).map(|f| f.volume.clone()).chain(unattached.iter().cloned()).collect();
    names.sort();
    names.dedup();
    names
}

impl Error {
    /// The per-volume set-up failures of [`Error::MountFailed`] (one `FailedMount` event
    /// each).
    #[must_use]
    pub fn set_up_failures(&self) -> &[SetUpFailure] {
        match self {
            Self::MountFailed { failures, .. } => failures,
            _ => &[],
        }
    }

    /// Upstream's `FailedMount` event when volumes could not be resolved (the volume
    /// manager's wait ending on the populator's errors): `Unable to attach or mount
    /// volumes: unmounted volumes=[..], unattached volumes=[..], failed to process
    /// volumes=[..]: <errors>`.
    #[must_use]
    pub fn processing_event(&self) -> Option<String> {
        let Self::MountFailed { failures, unprocessed, unattached, .. } = self else { return None };
        if unprocessed.is_empty() {
            return None;
        }
        let mut failed: Vec<&str> = unprocessed.iter().map(|f| f.volume.as_str()).collect();
        failed.sort_unstable();
        let errors: Vec<&str> = unprocessed.iter().map(|f| f.message.as_str()).collect();
        Some(format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[{}], failed to process volumes=[{}]: {}",
            unmounted_names(failures, unprocessed, unattached).join(" "),
            unattached.join(" "),
            failed.join(" "),
            errors.join("; ")
        ))
    }

    /// Upstream's `FailedMount` event when its pod worker's wait for the volumes
    /// ([`ATTACH_AND_MOUNT_TIMEOUT`]) ends with volumes still unmounted: `Unable to attach
    /// or mount volumes: unmounted volumes=[..], unattached volumes=[..]: timed out
    /// waiting for the condition`, once per timeout; the only event of a volume that
    /// waits for its attachment.
    #[must_use]
    pub fn timeout_event(&self) -> Option<String> {
        let Self::MountFailed { failures, unprocessed, unattached, timed_out: true } = self else { return None };
        if !unprocessed.is_empty() {
            // Upstream's wait ends on the populator's errors first ([`Self::processing_event`]).
            return None;
        }
        Some(format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[{}]: timed out waiting for the condition",
            unmounted_names(failures, unprocessed, unattached).join(" "),
            unattached.join(" ")
        ))
    }
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
pub(crate) mod tests_support {
    //! Helpers shared by the volume tests.

    use std::sync::Mutex;
    use std::time::{Duration, SystemTime};

    use crate::container::backoff::Clock;

    /// A clock that moves only when told.
    #[derive(Debug)]
    pub struct ManualClock(Mutex<SystemTime>);

    impl Default for ManualClock {
        fn default() -> Self {
            Self(Mutex::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)))
        }
    }

    impl ManualClock {
        pub fn advance(&self, by: Duration) {
            *self.0.lock().unwrap() += by;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap()
        }
    }
}
