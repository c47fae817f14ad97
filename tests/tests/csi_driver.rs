//! The test bed's host-path CSI driver (`swiftlet-test-csi-driver`) on its own, as root:
//! called as a kubelet calls it (real bind mounts, loop devices, read-only remounts,
//! ephemeral inline volumes, the registration API), with nothing left mounted or
//! attached afterwards; and deployed with upstream's csi-provisioner and csi-resizer
//! against the test bed's API server (`swiftlet_tests::csi_hostpath`): claims of its
//! storage class are provisioned, expanded and deleted through the driver.

use std::collections::HashMap;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use swiftlet::pluginmanager::proto as reg;
use swiftlet::pluginmanager::proto::registration_client::RegistrationClient;
use swiftlet::volumes::csi::proto as csi;
use swiftlet::volumes::csi::proto::controller_client::ControllerClient;
use swiftlet::volumes::csi::proto::identity_client::IdentityClient;
use swiftlet::volumes::csi::proto::node_client::NodeClient;
use swiftlet_tests::cluster::Cluster;
use swiftlet_tests::csi_driver::{self, CsiCall, DEFAULT_NAME, EPHEMERAL_KEY, Store};
use swiftlet_tests::csi_hostpath::{CsiHostPath, CsiHostPathOptions};
use tonic::Code;
use tonic::transport::Channel;

/// The driver binary running on a directory of its own.
struct Driver {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
    state: PathBuf,
    calls: PathBuf,
    registration_dir: PathBuf,
}

impl Driver {
    async fn start() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("swiftlet-csi-test-").tempdir()?;
        let socket = dir.path().join("plugins/csi.sock");
        let state = dir.path().join("state");
        let calls = dir.path().join("calls.jsonl");
        let registration_dir = dir.path().join("plugins_registry");
        let child = Command::new(swiftlet_tests::csi_hostpath::driver_bin()?)
            .arg(format!("--endpoint={}", socket.display()))
            .arg("--node-id=csi-test-node")
            .arg(format!("--state-dir={}", state.display()))
            .arg(format!("--registration-dir={}", registration_dir.display()))
            .arg(format!("--calls-log={}", calls.display()))
            .arg("--max-volumes-per-node=7")
            .stdin(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            ensure!(Instant::now() < deadline, "no {} after 20 s", socket.display());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { child, dir, socket, state, calls, registration_dir })
    }

    async fn channel(&self) -> Result<Channel> {
        csi_driver::connect(&self.socket).await
    }

    fn calls(&self) -> Vec<CsiCall> {
        csi_driver::read_calls(&self.calls)
    }

    /// A path under the test's own "kubelet root".
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join("kubelet").join(rel)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for m in mounts_under(self.dir.path()) {
            let p = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: umount2 with a NUL-terminated path.
            unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Mount points at or below `dir`, and bind mounts of anything below it.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    csi_driver::mounts()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(&dir) || m.root.starts_with(&dir))
        .map(|m| m.mount_point)
        .collect()
}

fn mount_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec![],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter.into(),
        }),
    }
}

fn block_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(csi::volume_capability::BlockVolume {})),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter.into(),
        }),
    }
}

async fn create(
    c: &mut ControllerClient<Channel>,
    name: &str,
    bytes: i64,
    cap: csi::VolumeCapability,
) -> Result<String> {
    let v = c
        .create_volume(csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
            volume_capabilities: vec![cap],
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .context("no volume")?;
    ensure!(v.capacity_bytes == bytes, "capacity {} != {bytes}", v.capacity_bytes);
    Ok(v.volume_id)
}

fn usage(r: &csi::NodeGetVolumeStatsResponse, unit: csi::volume_usage::Unit) -> csi::VolumeUsage {
    r.usage.iter().find(|u| u.unit == i32::from(unit)).copied().unwrap_or_default()
}

#[tokio::test]
async fn filesystem_volumes_are_bind_mounted_read_only_when_asked_and_leave_nothing_mounted() -> Result<()> {
    let d = Driver::start().await?;
    let ch = d.channel().await?;
    let (mut ids, mut ctl, mut node) =
        (IdentityClient::new(ch.clone()), ControllerClient::new(ch.clone()), NodeClient::new(ch));
    assert_eq!(ids.get_plugin_info(csi::GetPluginInfoRequest {}).await?.into_inner().name, DEFAULT_NAME);
    let info = node.node_get_info(csi::NodeGetInfoRequest {}).await?.into_inner();
    assert_eq!((info.node_id.as_str(), info.max_volumes_per_node), ("csi-test-node", 7));

    let id = create(&mut ctl, "pvc-fs", 10 << 20, mount_cap()).await?;
    assert_eq!(create(&mut ctl, "pvc-fs", 10 << 20, mount_cap()).await?, id, "create is idempotent by name");

    let staging = d.path("plugins/kubernetes.io/csi/driver/h/globalmount");
    let rw = d.path("pods/uid1/volumes/kubernetes.io~csi/pv/mount");
    let ro = d.path("pods/uid2/volumes/kubernetes.io~csi/pv/mount");
    std::fs::create_dir_all(&staging)?;
    std::fs::create_dir_all(rw.parent().unwrap())?;
    std::fs::create_dir_all(ro.parent().unwrap())?;
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap()),
        volume_context: HashMap::from([("k".to_string(), "v".to_string())]),
        ..Default::default()
    };
    node.node_stage_volume(stage.clone()).await?;
    node.node_stage_volume(stage).await?;
    assert!(csi_driver::is_mount_point(&staging));

    let publish = |target: &Path, readonly: bool| csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap()),
        readonly,
        ..Default::default()
    };
    node.node_publish_volume(publish(&rw, false)).await?;
    node.node_publish_volume(publish(&rw, false)).await?;
    node.node_publish_volume(publish(&ro, true)).await?;
    std::fs::write(rw.join("data"), vec![7u8; 1 << 20])?;
    let stored = Store::new(&d.state).dir_path(&id).join("data");
    assert_eq!(std::fs::metadata(&stored)?.len(), 1 << 20, "written through the target into the volume");
    assert_eq!(std::fs::read(ro.join("data"))?.len(), 1 << 20, "seen through the read-only target");
    let err = std::fs::write(ro.join("other"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");

    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: rw.display().to_string(),
            staging_target_path: String::new(),
        })
        .await?
        .into_inner();
    let bytes = usage(&stats, csi::volume_usage::Unit::Bytes);
    assert_eq!(bytes.total, 10 << 20);
    assert!(bytes.used >= 1 << 20, "{bytes:?}");
    assert_eq!(bytes.available, bytes.total - bytes.used);
    assert!(usage(&stats, csi::volume_usage::Unit::Inodes).total > 0);

    let calls = d.calls();
    let ro_call = calls.iter().find(|c| c.method == "NodePublishVolume" && c.readonly).context("no ro publish")?;
    assert_eq!(
        (ro_call.access_type.as_str(), ro_call.fs_type.as_str(), ro_call.access_mode.as_str()),
        ("mount", "ext4", "SINGLE_NODE_WRITER")
    );
    let stage_call = calls.iter().find(|c| c.method == "NodeStageVolume").context("no stage")?;
    assert_eq!(stage_call.volume_context.get("k").map(String::as_str), Some("v"));

    for target in [&rw, &ro] {
        let unpublish =
            csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: target.display().to_string() };
        node.node_unpublish_volume(unpublish.clone()).await?;
        node.node_unpublish_volume(unpublish).await?;
        assert!(!target.exists(), "{} left", target.display());
    }
    let e = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: rw.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let unstage =
        csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: staging.display().to_string() };
    node.node_unstage_volume(unstage.clone()).await?;
    node.node_unstage_volume(unstage).await?;
    assert_eq!(mounts_under(d.dir.path()), Vec::<PathBuf>::new(), "mounts left");

    ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await?;
    ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await?;
    assert!(!stored.exists());
    let e = ctl
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id,
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn block_volumes_are_loop_devices_published_on_a_file_and_grow() -> Result<()> {
    let d = Driver::start().await?;
    let ch = d.channel().await?;
    let (mut ctl, mut node) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));
    let id = create(&mut ctl, "pvc-block", 8 << 20, block_cap()).await?;
    let image = Store::new(&d.state).image_path(&id);
    let staging = d.path("plugins/kubernetes.io/csi/volumeDevices/staging/pv");
    let target = d.path("plugins/kubernetes.io/csi/volumeDevices/publish/pv/uid1");
    std::fs::create_dir_all(&staging)?;
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(block_cap()),
        ..Default::default()
    };
    node.node_stage_volume(stage.clone()).await?;
    node.node_stage_volume(stage).await?;
    let loops = csi_driver::loop_devices_of(&image)?;
    ensure!(loops.len() == 1, "one loop device for the image: {loops:?}");
    let publish = csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(block_cap()),
        ..Default::default()
    };
    node.node_publish_volume(publish.clone()).await?;
    node.node_publish_volume(publish).await?;
    assert!(std::fs::metadata(&target)?.file_type().is_block_device(), "the target is the device");
    {
        let mut dev = std::fs::OpenOptions::new().write(true).open(&target)?;
        dev.write_all(b"swiftlet block")?;
        dev.sync_all()?;
    }
    let mut head = [0u8; 14];
    std::fs::File::open(&image)?.read_exact(&mut head)?;
    assert_eq!(&head, b"swiftlet block", "written through the device into the image");

    let grown = ctl
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 16 << 20, limit_bytes: 0 }),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (16 << 20, true));
    assert_eq!(std::fs::metadata(&image)?.len(), 16 << 20);
    let node_grown = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 16 << 20, limit_bytes: 0 }),
            volume_capability: Some(block_cap()),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(node_grown.capacity_bytes, 16 << 20);
    let mut dev = std::fs::File::open(&target)?;
    assert_eq!(dev.seek(std::io::SeekFrom::End(0))?, 16 << 20, "the device has the new size");
    drop(dev);

    let unpublish =
        csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: target.display().to_string() };
    node.node_unpublish_volume(unpublish.clone()).await?;
    node.node_unpublish_volume(unpublish).await?;
    assert!(!target.exists());
    let unstage =
        csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: staging.display().to_string() };
    node.node_unstage_volume(unstage.clone()).await?;
    node.node_unstage_volume(unstage).await?;
    assert_eq!(csi_driver::loop_devices_of(&image)?, Vec::<PathBuf>::new(), "loop device detached");
    assert_eq!(mounts_under(d.dir.path()), Vec::<PathBuf>::new(), "mounts left");
    ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await?;
    assert!(!image.exists());
    Ok(())
}

#[tokio::test]
async fn ephemeral_inline_volumes_live_from_publish_to_unpublish() -> Result<()> {
    let d = Driver::start().await?;
    let mut node = NodeClient::new(d.channel().await?);
    let target = d.path("pods/uid/volumes/kubernetes.io~csi/scratch/mount");
    std::fs::create_dir_all(target.parent().unwrap())?;
    let id = "csi-0123456789abcdef";
    let context = HashMap::from([
        (EPHEMERAL_KEY.to_string(), "true".to_string()),
        ("size".to_string(), "3Mi".to_string()),
        ("csi.storage.k8s.io/pod.name".to_string(), "p".to_string()),
    ]);
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap()),
        volume_context: context,
        ..Default::default()
    })
    .await?;
    let store = Store::new(&d.state);
    std::fs::write(target.join("f"), b"hello")?;
    assert_eq!(std::fs::read(store.ephemeral_path(id).join("f"))?, b"hello");
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(usage(&stats, csi::volume_usage::Unit::Bytes).total, 3 << 20);
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
    })
    .await?;
    assert!(!store.ephemeral_path(id).exists(), "the ephemeral volume is gone");
    assert!(store.load(id)?.is_none());
    assert_eq!(mounts_under(d.dir.path()), Vec::<PathBuf>::new(), "mounts left");
    // Without a staging path a persistent volume is refused.
    let e = node
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: "hp-unknown".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    Ok(())
}

async fn registration(socket: &Path) -> Result<RegistrationClient<Channel>> {
    Ok(RegistrationClient::new(csi_driver::connect(socket).await?))
}

#[tokio::test]
async fn the_registration_socket_answers_and_comes_back_when_removed() -> Result<()> {
    let d = Driver::start().await?;
    let socket = d.registration_dir.join(format!("{DEFAULT_NAME}-reg.sock"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        ensure!(Instant::now() < deadline, "no {}", socket.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = registration(&socket).await?.get_info(reg::InfoRequest {}).await?.into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, DEFAULT_NAME);
    assert_eq!(info.endpoint, d.socket.display().to_string());
    assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
    registration(&socket)
        .await?
        .notify_registration_status(reg::RegistrationStatus { plugin_registered: false, error: "nope".into() })
        .await?;
    let notified = d.calls().into_iter().find(|c| c.method == "NotifyRegistrationStatus").context("not recorded")?;
    assert_eq!((notified.registered, notified.message.as_str()), (false, "nope"));

    // An agent restart that wipes its registry directory: the socket is served again.
    std::fs::remove_dir_all(&d.registration_dir)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if socket.exists()
            && let Ok(mut c) = registration(&socket).await
            && c.get_info(reg::InfoRequest {}).await.is_ok()
        {
            break;
        }
        ensure!(Instant::now() < deadline, "the registration socket did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The driver deployed with upstream's sidecars against the test bed's API server (no
/// node needed: the storage class binds at once and the driver has no topology).
#[tokio::test]
async fn claims_of_the_storage_class_are_provisioned_expanded_and_deleted_by_the_sidecars() -> Result<()> {
    let _lock = swiftlet_tests::testbed_lock().await;
    let cluster = Cluster::connect().await?;
    let root = tempfile::Builder::new().prefix("swiftlet-csi-root-").tempdir()?;
    let node_name = format!("e2e-csi-{:08x}", rand::random::<u32>());
    let csi = CsiHostPath::start(&cluster, &node_name, root.path(), CsiHostPathOptions::default()).await?;
    let ns = cluster.namespace("csi").await?;
    let result = provision_expand_delete(&cluster, &csi, &ns).await;
    let _ = cluster.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    if result.is_err() {
        eprintln!("provisioner:\n{}", swiftlet_tests::tail(&csi.log("csi-provisioner"), 40));
        eprintln!("resizer:\n{}", swiftlet_tests::tail(&csi.log("csi-resizer"), 40));
    }
    csi.stop()?;
    result
}

async fn provision_expand_delete(cluster: &Cluster, csi: &CsiHostPath, ns: &str) -> Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), ns);
    let volumes: Api<PersistentVolume> = Api::all(cluster.client());
    let pv = csi.create_bound_claim(ns, csi.claim("data", "10Mi", false), Duration::from_mins(1)).await?;
    let source = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).context("not a CSI volume")?;
    assert_eq!(source.driver, DEFAULT_NAME);
    let created = csi.wait_for_call(Duration::from_secs(5), |c| c.method == "CreateVolume" && c.code == "Ok").await?;
    assert_eq!(created.volume_id, source.volume_handle);
    assert_eq!(created.required_bytes, 10 << 20);
    // --extra-create-metadata: the claim's name and namespace reach the driver.
    assert_eq!(created.parameters.get("csi.storage.k8s.io/pvc/name").map(String::as_str), Some("data"));
    assert_eq!(created.parameters.get("csi.storage.k8s.io/pvc/namespace").map(String::as_str), Some(ns));
    let dir = Store::new(&csi.state_dir).dir_path(&source.volume_handle);
    assert!(dir.is_dir(), "{} not made", dir.display());

    // Expansion: the resizer asks the driver, and the volume's capacity grows.
    let patch = json!({"spec": {"resources": {"requests": {"storage": "20Mi"}}}});
    claims.patch("data", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let pv_name = pv.metadata.name.clone().context("unnamed PV")?;
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let pv = volumes.get(&pv_name).await?;
        let capacity = pv.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        if capacity.as_ref().is_some_and(|q| q.0 == "20Mi") {
            break;
        }
        ensure!(Instant::now() < deadline, "PV capacity still {capacity:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expanded = csi.wait_for_call(Duration::from_secs(5), |c| c.method == "ControllerExpandVolume").await?;
    assert_eq!((expanded.volume_id.as_str(), expanded.capacity_bytes), (source.volume_handle.as_str(), 20 << 20));
    assert_eq!(csi.volumes().iter().find(|v| v.id == source.volume_handle).map(|v| v.capacity_bytes), Some(20 << 20));

    // A block claim gets an image of its size.
    let block = csi.create_bound_claim(ns, csi.claim("raw", "4Mi", true), Duration::from_mins(1)).await?;
    let handle = block.spec.and_then(|s| s.csi).map(|c| c.volume_handle).context("not a CSI volume")?;
    assert_eq!(std::fs::metadata(Store::new(&csi.state_dir).image_path(&handle))?.len(), 4 << 20);

    // Deleting the claims deletes the volumes (reclaim policy Delete).
    for name in ["data", "raw"] {
        claims.delete(name, &DeleteParams::default()).await?;
    }
    let deadline = Instant::now() + Duration::from_mins(1);
    while volumes.get_opt(&pv_name).await?.is_some() || !csi.volumes().is_empty() {
        ensure!(Instant::now() < deadline, "volumes left: {:?}", csi.volumes());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deleted: Vec<String> = csi.calls_of("DeleteVolume").into_iter().map(|c| c.volume_id).collect();
    assert!(deleted.contains(&source.volume_handle) && deleted.contains(&handle), "{deleted:?}");
    assert!(!dir.exists());
    Ok(())
}

/// What a test that failed half-way leaves (a staged and published filesystem volume, a
/// staged and published block volume, their claims and volumes) is undone by
/// [`CsiHostPath::stop`]: nothing of the driver's stays mounted or attached, and its
/// `CSIDriver`, storage class and persistent volumes are gone.
#[tokio::test]
async fn stopping_the_deployment_undoes_what_a_failed_test_left() -> Result<()> {
    let _lock = swiftlet_tests::testbed_lock().await;
    let cluster = Cluster::connect().await?;
    let root = tempfile::Builder::new().prefix("swiftlet-csi-root-").tempdir()?;
    let node_name = format!("e2e-csi-{:08x}", rand::random::<u32>());
    let csi = CsiHostPath::start(&cluster, &node_name, root.path(), CsiHostPathOptions::default()).await?;
    let ns = cluster.namespace("csi").await?;
    let fs = csi.create_bound_claim(&ns, csi.claim("fs", "4Mi", false), Duration::from_mins(1)).await?;
    let raw = csi.create_bound_claim(&ns, csi.claim("raw", "4Mi", true), Duration::from_mins(1)).await?;
    let handle = |pv: &PersistentVolume| pv.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.clone());
    let (fs_id, raw_id) = (handle(&fs).context("fs")?, handle(&raw).context("raw")?);

    let mut node = NodeClient::new(csi_driver::connect(&csi.csi_socket).await?);
    let staging = root.path().join("plugins/kubernetes.io/csi/s/globalmount");
    let target = root.path().join("pods/u/volumes/kubernetes.io~csi/fs/mount");
    let block_staging = root.path().join("plugins/kubernetes.io/csi/volumeDevices/staging/raw");
    let block_target = root.path().join("plugins/kubernetes.io/csi/volumeDevices/publish/raw/u");
    for (id, cap, staging, target) in
        [(&fs_id, mount_cap(), &staging, &target), (&raw_id, block_cap(), &block_staging, &block_target)]
    {
        std::fs::create_dir_all(staging)?;
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await?;
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await?;
    }
    let image = Store::new(&csi.state_dir).image_path(&raw_id);
    ensure!(csi_driver::loop_devices_of(&image)?.len() == 1, "the block volume is not attached");
    ensure!(mounts_under(root.path()).len() == 3, "mounts: {:?}", mounts_under(root.path()));
    let state_dir = csi.state_dir.clone();

    csi.stop()?;
    assert_eq!(mounts_under(root.path()), Vec::<PathBuf>::new(), "mounts left");
    assert_eq!(csi_driver::loop_devices_of(&image)?, Vec::<PathBuf>::new(), "loop device left");
    assert!(!state_dir.exists(), "state dir left");
    let volumes: Api<PersistentVolume> = Api::all(cluster.client());
    for pv in [&fs, &raw] {
        let name = pv.metadata.name.as_deref().context("unnamed")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while volumes.get_opt(name).await?.is_some() {
            ensure!(Instant::now() < deadline, "{name} left");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let left = cluster.kubectl(&["get", "csidriver", DEFAULT_NAME])?;
    assert!(!left.status.success(), "the CSIDriver is left");
    let _ = cluster.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    Ok(())
}
