//! Staging, publishing and tearing down CSI volumes through their driver, and the files
//! on disk that say what is staged and published where (upstream `csi_attacher.go`'s
//! `MountDevice`/`UnmountDevice` and `csi_mounter.go`'s `SetUpAt`/`TearDownAt`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::drivers::{CsiDrivers, Driver};
use super::{CsiSpec, Error, LifecycleMode, PLUGIN_NAME, VOL_DATA_FILE, attachment_name, proto};

/// The directory of published volumes in a pod's volumes directory.
#[must_use]
pub fn plugin_dir_name() -> String {
    PLUGIN_NAME.replace('/', "~")
}

/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>`: a staged volume's
/// directory, holding `globalmount` and `vol_data.json`.
#[must_use]
pub fn staging_dir(root: &Path, driver: &str, volume_handle: &str) -> PathBuf {
    use sha2::Digest as _;
    let sha = hex::encode(sha2::Sha256::digest(volume_handle));
    root.join("plugins").join(PLUGIN_NAME).join(driver).join(sha)
}

/// The staging target path of a volume.
#[must_use]
pub fn staging_path(root: &Path, driver: &str, volume_handle: &str) -> PathBuf {
    staging_dir(root, driver, volume_handle).join("globalmount")
}

/// The staging path of `spec` when its driver stages it (persistent volumes of drivers
/// with `STAGE_UNSTAGE_VOLUME`), else `None`.
fn staging_of(root: &Path, driver: &Driver, spec: &CsiSpec) -> Option<PathBuf> {
    (driver.capabilities.stage_unstage && spec.mode == LifecycleMode::Persistent)
        .then(|| staging_path(root, &spec.driver, &spec.volume_handle))
}

/// What `vol_data.json` records (upstream's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolData {
    #[serde(rename = "specVolID", default)]
    pub spec_vol_id: String,
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    #[serde(rename = "driverName")]
    pub driver_name: String,
    #[serde(rename = "nodeName", default)]
    pub node_name: String,
    #[serde(rename = "attachmentID", default)]
    pub attachment_id: String,
    #[serde(rename = "volumeLifecycleMode", default)]
    pub volume_lifecycle_mode: String,
}

impl VolData {
    /// Reads `<dir>/vol_data.json`; `Ok(None)` when there is none.
    ///
    /// # Errors
    /// The file cannot be read or parsed.
    pub fn load(dir: &Path) -> Result<Option<Self>, Error> {
        let path = dir.join(VOL_DATA_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::Io { op: "loading volume data", message: format!("{}: {e}", path.display()) }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("loading volume data", &path, &e)),
        }
    }

    fn save(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(VOL_DATA_FILE);
        let bytes = serde_json::to_vec(self).expect("volume data serializes");
        std::fs::write(&path, bytes).map_err(|e| Error::io("saving volume data", &path, &e))
    }
}

/// Everything a set-up needs besides the spec, read from the API by the caller.
#[derive(Debug, Clone, Default)]
pub struct SetUpArgs {
    /// `<pod volumes dir>/kubernetes.io~csi/<spec name>`; the target is its `mount`.
    pub publish_dir: PathBuf,
    /// The `VolumeAttachment`'s `attachmentMetadata` (attachable drivers).
    pub publish_context: BTreeMap<String, String>,
    pub stage_secrets: BTreeMap<String, String>,
    pub publish_secrets: BTreeMap<String, String>,
    /// Pod information for the volume context (`podInfoOnMount`).
    pub pod_attributes: BTreeMap<String, String>,
    /// The pod's fsGroup, handed to drivers with `VOLUME_MOUNT_GROUP`.
    pub fs_group: Option<i64>,
    /// The volume is published already (`requiresRepublish`): publish it again only.
    pub republish: bool,
}

/// The publish target of a volume in its publish directory.
#[must_use]
pub fn publish_target(publish_dir: &Path) -> PathBuf {
    publish_dir.join("mount")
}

fn mkdir(op: &'static str, dir: &Path) -> Result<(), Error> {
    std::fs::DirBuilder::new().recursive(true).create(dir).map_err(|e| Error::io(op, dir, &e))
}

/// Removes an empty directory or a file; absent is fine.
fn remove_path(op: &'static str, path: &Path) -> Result<(), Error> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(op, path, &e)),
        _ => Ok(()),
    }
}

impl CsiDrivers {
    fn driver(&self, op: &'static str, name: &str) -> Result<Driver, Error> {
        self.get(name).ok_or_else(|| Error::NotRegistered { op, driver: name.to_owned() })
    }

    /// The lock of one volume's stage/unstage decisions.
    fn volume_lock(&self, driver: &str, handle: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.volume_locks.lock().unwrap();
        Arc::clone(locks.entry(format!("{driver}/{handle}")).or_default())
    }

    /// Stages (when the driver stages) and publishes `spec` for a pod; idempotent, as the
    /// CSI calls are. The caller has checked the `CSIDriver`'s modes and read the secrets.
    ///
    /// # Errors
    /// The driver is not registered, a call failed, a file could not be written.
    pub async fn set_up(&self, root: &Path, spec: &CsiSpec, args: SetUpArgs) -> Result<(), Error> {
        let driver = self.driver("mounter.SetUpAt", &spec.driver)?;
        let caps = driver.capabilities;
        let mount_group = args.fs_group.filter(|_| caps.volume_mount_group).map(|g| g.to_string());
        let capability = spec.capability(caps.single_node_multi_writer, mount_group);
        let lock = self.volume_lock(&spec.driver, &spec.volume_handle);
        let _held = lock.lock().await;

        let staging = staging_of(root, &driver, spec);
        if let Some(staging) = staging.as_ref().filter(|_| !args.republish) {
            let dir = staging.parent().expect("the staging path has a parent");
            mkdir("attacher.MountDevice", staging)?;
            VolData {
                volume_handle: spec.volume_handle.clone(),
                driver_name: spec.driver.clone(),
                ..VolData::default()
            }
            .save(dir)?;
            let req = proto::NodeStageVolumeRequest {
                volume_id: spec.volume_handle.clone(),
                publish_context: args.publish_context.clone().into_iter().collect(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                volume_capability: Some(capability.clone()),
                secrets: args.stage_secrets.into_iter().collect(),
                volume_context: spec.attributes.clone().into_iter().collect(),
            };
            let mut node = driver.node();
            self.run(async move { node.node_stage_volume(req).await })
                .await
                .map_err(|s| Error::rpc("attacher.MountDevice", &s))?;
        }

        mkdir("mounter.SetUpAt", &args.publish_dir)?;
        VolData {
            spec_vol_id: spec.spec_name.clone(),
            volume_handle: spec.volume_handle.clone(),
            driver_name: spec.driver.clone(),
            node_name: self.node_name().to_owned(),
            attachment_id: attachment_name(&spec.volume_handle, &spec.driver, self.node_name()),
            volume_lifecycle_mode: spec.mode.as_str().to_owned(),
        }
        .save(&args.publish_dir)?;
        let mut context: HashMap<String, String> = spec.attributes.clone().into_iter().collect();
        context.extend(args.pod_attributes);
        let req = proto::NodePublishVolumeRequest {
            volume_id: spec.volume_handle.clone(),
            publish_context: args.publish_context.into_iter().collect(),
            staging_target_path: staging.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            target_path: publish_target(&args.publish_dir).to_string_lossy().into_owned(),
            volume_capability: Some(capability),
            readonly: spec.read_only,
            secrets: args.publish_secrets.into_iter().collect(),
            volume_context: context,
        };
        let mut node = driver.node();
        self.run(async move { node.node_publish_volume(req).await })
            .await
            .map(|_| ())
            .map_err(|s| Error::rpc("mounter.SetUpAt", &s))
    }

    /// Grows a published volume's file system to `required_bytes` (`NodeExpandVolume`,
    /// with the PV's `nodeExpandSecretRef` data as `secrets`); a driver without
    /// `EXPAND_VOLUME` has nothing to do on the node (upstream skips the call too).
    /// Returns the capacity the driver reports, if any.
    ///
    /// # Errors
    /// The driver is not registered or the call failed.
    pub async fn expand(
        &self,
        root: &Path,
        spec: &CsiSpec,
        target: &Path,
        required_bytes: i64,
        secrets: BTreeMap<String, String>,
    ) -> Result<Option<i64>, Error> {
        let op = "Expander.NodeExpand";
        let driver = self.driver(op, &spec.driver)?;
        if !driver.capabilities.expand {
            return Ok(None);
        }
        let staging = staging_of(root, &driver, spec).map(|p| p.to_string_lossy().into_owned());
        let req = proto::NodeExpandVolumeRequest {
            volume_id: spec.volume_handle.clone(),
            volume_path: target.to_string_lossy().into_owned(),
            capacity_range: Some(proto::CapacityRange { required_bytes, limit_bytes: 0 }),
            staging_target_path: staging.unwrap_or_default(),
            volume_capability: Some(spec.capability(driver.capabilities.single_node_multi_writer, None)),
            secrets: secrets.into_iter().collect(),
        };
        let mut node = driver.node();
        let out = self.run(async move { node.node_expand_volume(req).await }).await.map_err(|s| Error::rpc(op, &s))?;
        Ok(Some(out.into_inner().capacity_bytes).filter(|c| *c > 0))
    }

    /// Unpublishes every CSI volume in a pod's volumes directory and unstages those no
    /// other pod publishes; removes their directories. Blocking: runs on a blocking
    /// thread. A volume without `vol_data.json` (a set-up that stopped before writing
    /// it) is only removed, and only when nothing is mounted there.
    ///
    /// # Errors
    /// The first volume that could not be torn down (the others are still tried); the
    /// caller retries.
    pub fn tear_down_pod(&self, root: &Path, pod_volumes_dir: &Path) -> Result<(), Error> {
        let dir = pod_volumes_dir.join(plugin_dir_name());
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io("Unmounter.TearDownAt", &dir, &e)),
        };
        let mut first_error = None;
        for entry in entries.flatten() {
            let publish_dir = entry.path();
            let plugin = match VolData::load(&publish_dir) {
                Ok(Some(d)) => format!("{PLUGIN_NAME}:{}", d.driver_name),
                _ => PLUGIN_NAME.to_owned(),
            };
            let started = std::time::Instant::now();
            let outcome = self.tear_down_volume(root, &publish_dir);
            self.metrics.observe(&plugin, "volume_unmount", outcome.is_ok(), started.elapsed());
            if let Err(e) = outcome {
                tracing::warn!(path = %publish_dir.display(), error = %e, "CSI volume tear-down failed");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => remove_path("Unmounter.TearDownAt", &dir),
        }
    }

    fn tear_down_volume(&self, root: &Path, publish_dir: &Path) -> Result<(), Error> {
        let op = "Unmounter.TearDownAt";
        let target = publish_target(publish_dir);
        let Some(data) = VolData::load(publish_dir)? else {
            remove_path(op, &target)?;
            return remove_path(op, publish_dir);
        };
        let driver = self.driver(op, &data.driver_name)?;
        let lock = self.volume_lock(&data.driver_name, &data.volume_handle);
        let _held = lock.blocking_lock();
        let req = proto::NodeUnpublishVolumeRequest {
            volume_id: data.volume_handle.clone(),
            target_path: target.to_string_lossy().into_owned(),
        };
        let mut node = driver.node();
        self.run_blocking(async move { node.node_unpublish_volume(req).await }).map_err(|s| Error::rpc(op, &s))?;
        remove_path(op, &target)?;
        remove_path(op, &publish_dir.join(VOL_DATA_FILE))?;
        remove_path(op, publish_dir)?;

        let persistent = data.volume_lifecycle_mode != LifecycleMode::Ephemeral.as_str();
        let staged = staging_dir(root, &data.driver_name, &data.volume_handle);
        if !persistent || !driver.capabilities.stage_unstage || !staged.exists() {
            return Ok(());
        }
        if published_anywhere(root, &data.driver_name, &data.volume_handle) {
            return Ok(());
        }
        self.unstage(&driver, &data, &staged)
    }

    /// `NodeUnstageVolume` of a staged volume, then its staging directory removed; timed
    /// as upstream's `unmount_device`. The caller holds the volume's lock and has checked
    /// that no pod publishes it.
    fn unstage(&self, driver: &Driver, data: &VolData, staged: &Path) -> Result<(), Error> {
        let op = "attacher.UnmountDevice";
        let staging = staged.join("globalmount");
        let req = proto::NodeUnstageVolumeRequest {
            volume_id: data.volume_handle.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        };
        let mut node = driver.node();
        let started = std::time::Instant::now();
        let unstaged = self
            .run_blocking(async move { node.node_unstage_volume(req).await })
            .map_err(|s| Error::rpc(op, &s))
            .and_then(|_| remove_path(op, &staging))
            .and_then(|()| remove_path(op, &staged.join(VOL_DATA_FILE)))
            .and_then(|()| remove_path(op, staged));
        let plugin = format!("{PLUGIN_NAME}:{}", data.driver_name);
        self.metrics.observe(&plugin, "unmount_device", unstaged.is_ok(), started.elapsed());
        unstaged
    }

    /// Unstages a staged volume no pod publishes (left by pods removed while the agent
    /// was down, after their publish directories went); run by housekeeping. Volumes of
    /// drivers that are not registered are left for a later pass.
    pub fn unstage_unused(&self, root: &Path) -> Vec<Error> {
        let mut errors = Vec::new();
        let plugin_root = root.join("plugins").join(PLUGIN_NAME);
        let Ok(drivers) = std::fs::read_dir(&plugin_root) else { return errors };
        for driver_dir in drivers.flatten() {
            let Ok(volumes) = std::fs::read_dir(driver_dir.path()) else { continue };
            for staged in volumes.flatten() {
                let Ok(Some(data)) = VolData::load(&staged.path()) else { continue };
                if published_anywhere(root, &data.driver_name, &data.volume_handle) {
                    continue;
                }
                let Some(driver) = self.get(&data.driver_name) else { continue };
                let lock = self.volume_lock(&data.driver_name, &data.volume_handle);
                let _held = lock.blocking_lock();
                if published_anywhere(root, &data.driver_name, &data.volume_handle) {
                    continue;
                }
                let result = self.unstage(&driver, &data, &staged.path());
                if let Err(e) = result {
                    errors.push(e);
                }
            }
        }
        errors
    }
}

/// Whether any pod's volumes directory publishes the volume.
fn published_anywhere(root: &Path, driver: &str, handle: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(root.join("pods")) else { return false };
    let plugin = plugin_dir_name();
    pods.flatten().any(|pod| {
        let Ok(volumes) = std::fs::read_dir(pod.path().join("volumes").join(&plugin)) else { return false };
        volumes.flatten().any(|v| {
            VolData::load(&v.path())
                .ok()
                .flatten()
                .is_some_and(|d| d.driver_name == driver && d.volume_handle == handle)
        })
    })
}
