//! CSI volume tests: a fake driver serving the CSI node service on a unix socket in a
//! temporary directory, the volume manager with the fake object source, real files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIDriver;
use serde_json::json;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::proto::node_server::{Node, NodeServer};
use super::proto::node_service_capability::{Rpc as RpcCap, Type as CapType, rpc::Type as Rpc};
use super::proto::{self, NodeServiceCapability};
use super::volume::{VolData, staging_dir};
use super::*;
use crate::volumes::manager::Plugin;
use crate::volumes::{FakeMounter, FakeObjectSource, ObjectSource as _, VolumeManager};

const DRIVER: &str = "hostpath.csi.test";

/// One call the fake driver got: (method, volume id, path, volume context).
type Call = (&'static str, String, String, BTreeMap<String, String>);

#[derive(Clone, Default)]
struct FakeDriver {
    calls: Arc<Mutex<Vec<Call>>>,
    stage: bool,
    expand: bool,
    fail_publish: Arc<Mutex<Option<String>>>,
    /// `NodeExpandVolume`'s error, if any.
    fail_expand: Arc<Mutex<Option<(tonic::Code, String)>>>,
    /// Leave `GET_VOLUME_STATS` out of the capabilities.
    no_stats: bool,
    /// `NodeGetVolumeStats`'s answer (an error message: `Internal`); none: `Unimplemented`.
    stats: Arc<Mutex<Option<Result<proto::NodeGetVolumeStatsResponse, String>>>>,
}

impl FakeDriver {
    fn record(&self, method: &'static str, id: &str, path: &str, context: &std::collections::HashMap<String, String>) {
        let ctx = context.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        self.calls.lock().unwrap().push((method, id.to_owned(), path.to_owned(), ctx));
    }

    fn methods(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().iter().map(|c| c.0).collect()
    }
}

#[tonic::async_trait]
impl Node for FakeDriver {
    async fn node_stage_volume(
        &self,
        r: Request<proto::NodeStageVolumeRequest>,
    ) -> Result<Response<proto::NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        assert!(Path::new(&r.staging_target_path).is_dir(), "the CO creates the staging directory");
        self.record("NodeStageVolume", &r.volume_id, &r.staging_target_path, &r.volume_context);
        Ok(Response::new(proto::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        r: Request<proto::NodeUnstageVolumeRequest>,
    ) -> Result<Response<proto::NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record("NodeUnstageVolume", &r.volume_id, &r.staging_target_path, &std::collections::HashMap::default());
        Ok(Response::new(proto::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        r: Request<proto::NodePublishVolumeRequest>,
    ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        if let Some(message) = self.fail_publish.lock().unwrap().clone() {
            return Err(Status::internal(message));
        }
        // As a driver does: the target is its to create.
        std::fs::create_dir_all(&r.target_path).unwrap();
        std::fs::write(Path::new(&r.target_path).join("data"), &r.volume_id).unwrap();
        // The secrets recorded beside the context, as `secret:<key>`.
        let mut context = r.volume_context.clone();
        context.extend(r.secrets.iter().map(|(k, v)| (format!("secret:{k}"), v.clone())));
        self.record("NodePublishVolume", &r.volume_id, &r.target_path, &context);
        Ok(Response::new(proto::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let _ = std::fs::remove_dir_all(&r.target_path);
        self.record("NodeUnpublishVolume", &r.volume_id, &r.target_path, &std::collections::HashMap::default());
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        let context = [("staging_target_path".to_owned(), r.staging_target_path.clone())].into();
        self.record("NodeGetVolumeStats", &r.volume_id, &r.volume_path, &context);
        match self.stats.lock().unwrap().clone() {
            Some(Ok(answer)) => Ok(Response::new(answer)),
            Some(Err(message)) => Err(Status::internal(message)),
            None => Err(Status::unimplemented("no stats")),
        }
    }

    async fn node_expand_volume(
        &self,
        r: Request<proto::NodeExpandVolumeRequest>,
    ) -> Result<Response<proto::NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let required = r.capacity_range.map_or(0, |c| c.required_bytes);
        let mut context: std::collections::HashMap<_, _> = [("required_bytes".to_owned(), required.to_string())].into();
        context.extend(r.secrets.iter().map(|(k, v)| (format!("secret:{k}"), v.clone())));
        self.record("NodeExpandVolume", &r.volume_id, &r.volume_path, &context);
        if let Some((code, message)) = self.fail_expand.lock().unwrap().clone() {
            return Err(Status::new(code, message));
        }
        Ok(Response::new(proto::NodeExpandVolumeResponse { capacity_bytes: required }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        let cap = |t: Rpc| NodeServiceCapability { r#type: Some(CapType::Rpc(RpcCap { r#type: t as i32 })) };
        let mut capabilities = Vec::new();
        if !self.no_stats {
            capabilities.push(cap(Rpc::GetVolumeStats));
        }
        if self.stage {
            capabilities.push(cap(Rpc::StageUnstageVolume));
        }
        if self.expand {
            capabilities.push(cap(Rpc::ExpandVolume));
        }
        Ok(Response::new(proto::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: "node-id-1".into(),
            max_volumes_per_node: 7,
            accessible_topology: Some(proto::Topology {
                segments: [("topology.hostpath.csi/node".to_owned(), "n1".to_owned())].into(),
            }),
        }))
    }
}

type RecordedDriver = (String, i64, BTreeMap<String, String>);

/// Records what the registry writes to the node objects.
#[derive(Debug, Default)]
struct RecordingNodeInfo {
    /// Driver → (node id, volume limit, topology).
    drivers: Mutex<BTreeMap<String, RecordedDriver>>,
}

#[async_trait::async_trait]
impl NodeInfoUpdater for RecordingNodeInfo {
    async fn init(&self) -> Result<(), String> {
        Ok(())
    }

    async fn add_driver(&self, d: &str, id: &str, max: i64, topo: &BTreeMap<String, String>) -> Result<(), String> {
        self.drivers.lock().unwrap().insert(d.into(), (id.into(), max, topo.clone()));
        Ok(())
    }

    async fn remove_driver(&self, d: &str) -> Result<(), String> {
        self.drivers.lock().unwrap().remove(d);
        Ok(())
    }
}

struct Env {
    dir: tempfile::TempDir,
    src: FakeObjectSource,
    driver: FakeDriver,
    socket: PathBuf,
    drivers: Arc<CsiDrivers>,
    node_info: Arc<RecordingNodeInfo>,
    vm: VolumeManager,
    registry: prometheus_client::registry::Registry,
    clock: Arc<crate::volumes::tests_support::ManualClock>,
}

fn env(stage: bool) -> Env {
    env_with(FakeDriver { stage, ..FakeDriver::default() })
}

fn env_with(driver: FakeDriver) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = NodeServer::new(driver.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    let node_info = Arc::new(RecordingNodeInfo::default());
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = crate::volumes::metrics::VolumeMetrics::new(&mut registry);
    let drivers = Arc::new(CsiDrivers::new("node-1".into(), node_info.clone()).with_metrics(metrics.clone()));
    let clock = Arc::new(crate::volumes::tests_support::ManualClock::default());
    let src = FakeObjectSource::new().with_clock(clock.clone());
    let root = dir.path().join("root");
    let vm = VolumeManager::new(&root, Arc::new(src.clone()))
        .with_mounter(Arc::new(FakeMounter::default()))
        .with_csi(drivers.clone())
        .with_metrics(metrics)
        .with_clock(clock.clone());
    Env { dir, src, driver, socket, drivers, node_info, vm, registry, clock }
}

impl Env {
    async fn register(&self) {
        self.drivers.register(DRIVER, &self.socket, &["1.0.0".into()]).await.unwrap();
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// A bound claim `data` (uid `pvc-uid`) on PV `pv-1` with handle `vol-1`.
    fn bound_claim(&self) {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default", "uid": "pvc-uid"},
            "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound"}
        }))
        .unwrap();
        self.src.set_storage_object(&pvc);
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-1"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"name": "data", "namespace": "default", "uid": "pvc-uid"},
                "csi": {"driver": DRIVER, "volumeHandle": "vol-1", "volumeAttributes": {"size": "1Gi"}}
            }
        }))
        .unwrap();
        self.src.set_storage_object(&pv);
        self.csi_driver(&json!({"attachRequired": false, "podInfoOnMount": true}));
    }

    fn csi_driver(&self, spec: &serde_json::Value) {
        let d: CSIDriver = serde_json::from_value(json!({"metadata": {"name": DRIVER}, "spec": spec})).unwrap();
        self.src.set_storage_object(&d);
    }
}

fn pod(name: &str, uid: &str, volume: &serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "serviceAccountName": "sa",
            "volumes": [volume],
            "containers": [{"name": "c", "image": "img", "volumeMounts": [{"name": "v", "mountPath": "/data"}]}]
        }
    }))
    .unwrap()
}

fn claim_pod(name: &str, uid: &str) -> Pod {
    pod(name, uid, &json!({"name": "v", "persistentVolumeClaim": {"claimName": "data"}}))
}

#[tokio::test]
async fn registration_asks_the_driver_and_records_it_in_the_node_objects() {
    let e = env(true);
    e.register().await;
    let d = e.drivers.get(DRIVER).unwrap();
    assert_eq!((d.node_id.as_str(), d.max_volumes_per_node), ("node-id-1", 7));
    assert!(d.capabilities.stage_unstage && d.capabilities.get_volume_stats && !d.capabilities.expand);
    let recorded = e.node_info.drivers.lock().unwrap().get(DRIVER).cloned().unwrap();
    assert_eq!(recorded.0, "node-id-1");
    assert_eq!(recorded.2.get("topology.hostpath.csi/node").map(String::as_str), Some("n1"));
    e.drivers.deregister(DRIVER).await;
    assert!(e.drivers.get(DRIVER).is_none());
    assert!(e.node_info.drivers.lock().unwrap().is_empty());
    let err = e.drivers.register(DRIVER, &e.socket, &["0.3.0".into()]).await.unwrap_err();
    assert!(err.contains("none of the CSI versions"), "{err}");
}

#[tokio::test]
async fn a_claim_is_staged_once_published_per_pod_and_unstaged_after_the_last_pod() {
    let e = env(true);
    e.register().await;
    e.bound_claim();
    let (a, b) = (claim_pod("a", "uid-a"), claim_pod("b", "uid-b"));
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    let v = vols.get("v").unwrap();
    assert_eq!(v.plugin, Plugin::Csi);
    assert_eq!(v.claim.as_deref(), Some("data"));
    let target = e.root().join("pods/uid-a/volumes/kubernetes.io~csi/pv-1/mount");
    assert_eq!(v.path, target);
    assert_eq!(std::fs::read_to_string(target.join("data")).unwrap(), "vol-1");
    let data = VolData::load(target.parent().unwrap()).unwrap().unwrap();
    assert_eq!((data.driver_name.as_str(), data.volume_handle.as_str()), (DRIVER, "vol-1"));
    assert_eq!((data.spec_vol_id.as_str(), data.volume_lifecycle_mode.as_str()), ("pv-1", "Persistent"));
    assert_eq!(data.attachment_id, attachment_name("vol-1", DRIVER, "node-1"));
    let staged = staging_dir(&e.root(), DRIVER, "vol-1");
    assert!(staged.join("globalmount").is_dir() && staged.join(VOL_DATA_FILE).exists());
    assert_eq!(e.driver.methods(), ["NodeStageVolume", "NodePublishVolume"]);
    // podInfoOnMount: the pod's details in the publish call's context, not the stage's.
    let calls = e.driver.calls.lock().unwrap().clone();
    assert_eq!(calls[0].3.get("size").map(String::as_str), Some("1Gi"));
    assert!(!calls[0].3.contains_key("csi.storage.k8s.io/pod.name"));
    let publish = &calls[1].3;
    assert_eq!(publish.get("csi.storage.k8s.io/pod.name").map(String::as_str), Some("a"));
    assert_eq!(publish.get("csi.storage.k8s.io/pod.uid").map(String::as_str), Some("uid-a"));
    assert_eq!(publish.get("csi.storage.k8s.io/serviceAccount.name").map(String::as_str), Some("sa"));
    assert_eq!(publish.get("csi.storage.k8s.io/ephemeral").map(String::as_str), Some("false"));

    // A later sync of the same pod does not call the driver again.
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(e.driver.methods().len(), 2);

    e.vm.mount_pod_volumes(&b).await.unwrap();
    assert_eq!(e.driver.methods(), ["NodeStageVolume", "NodePublishVolume", "NodeStageVolume", "NodePublishVolume"]);
    let counts = e.vm.volume_counts();
    let plugin = format!("kubernetes.io/csi:{DRIVER}");
    assert_eq!(counts.get(&(plugin.clone(), "actual_state_of_world")), Some(&2));
    assert_eq!(counts.get(&(plugin, "desired_state_of_world")), Some(&2));
    // Not attachable (attachRequired: false): never in the node's volumesInUse.
    assert!(e.vm.volumes_in_use().is_empty());

    let root = e.root();
    let vm = Arc::new(e.vm);
    let cleanup = |uid: &'static str| {
        let vm = vm.clone();
        async move { tokio::task::spawn_blocking(move || vm.cleanup_pod(uid)).await.unwrap() }
    };
    cleanup("uid-a").await.unwrap();
    assert_eq!(e.driver.methods().last(), Some(&"NodeUnpublishVolume"), "b still publishes the volume");
    assert!(staged.exists());
    assert!(!root.join("pods/uid-a/volumes").exists());
    cleanup("uid-b").await.unwrap();
    assert_eq!(e.driver.methods()[4..], ["NodeUnpublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"]);
    assert!(!staged.exists());
    // Each operation timed, by upstream's operation and plugin names.
    let mut text = String::new();
    prometheus_client::encoding::text::encode_registry(&mut text, &e.registry).unwrap();
    let count = |op: &str| {
        let series = format!(
            "storage_operation_duration_seconds_count{{volume_plugin=\"kubernetes.io/csi:{DRIVER}\",operation_name=\"{op}\",status=\"success\",migrated=\"false\"}} "
        );
        text.lines().find_map(|l| l.strip_prefix(&series)).map(str::to_owned)
    };
    assert_eq!(count("volume_mount").as_deref(), Some("2"), "{text}");
    assert_eq!(count("volume_unmount").as_deref(), Some("2"), "{text}");
    assert_eq!(count("unmount_device").as_deref(), Some("1"), "{text}");
}

#[tokio::test]
async fn claims_that_are_not_ready_say_why() {
    let e = env(false);
    e.register().await;
    let err = e.vm.mount_pod_volumes(&claim_pod("a", "uid-a")).await.unwrap_err().to_string();
    assert!(
        err.contains("error processing PVC default/data: failed to fetch PVC from API server: persistentvolumeclaims \"data\" not found"),
        "{err}"
    );
    let pending: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "default", "uid": "pvc-uid"},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    e.src.set_storage_object(&pending);
    let err = e.vm.mount_pod_volumes(&claim_pod("a", "uid-a")).await.unwrap_err().to_string();
    assert!(err.contains("error processing PVC default/data: PVC is not bound"), "{err}");
    // Bound, but the PV belongs to another claim.
    e.bound_claim();
    let mut pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "default", "uid": "other-uid"},
        "spec": {"volumeName": "pv-1"},
        "status": {"phase": "Bound"}
    }))
    .unwrap();
    e.src.set_storage_object(&pvc);
    let err = e.vm.mount_pod_volumes(&claim_pod("a", "uid-a")).await.unwrap_err().to_string();
    assert!(err.contains("does not point to claim.UID other-uid"), "{err}");
    // A Block claim mounted as a filesystem.
    pvc.metadata.uid = Some("pvc-uid".into());
    e.src.set_storage_object(&pvc);
    let mut pv: PersistentVolume = e.src.persistent_volume("pv-1").await.unwrap().unwrap();
    pv.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    e.src.set_storage_object(&pv);
    let err = e.vm.mount_pod_volumes(&claim_pod("a", "uid-a")).await.unwrap_err().to_string();
    assert!(err.contains("volume v has volumeMode Block, but is specified in volumeMounts"), "{err}");
    assert!(e.driver.methods().is_empty());
}

#[tokio::test]
async fn a_driver_that_is_not_registered_holds_the_pod_until_it_registers() {
    let e = env(false);
    e.bound_claim();
    let a = claim_pod("a", "uid-a");
    let err = e.vm.mount_pod_volumes(&a).await.unwrap_err().to_string();
    assert!(err.contains(&format!("driver name {DRIVER} not found in the list of registered CSI drivers")), "{err}");
    e.register().await;
    e.vm.mount_pod_volumes(&a).await.unwrap();
    // Without STAGE_UNSTAGE_VOLUME: publish only.
    assert_eq!(e.driver.methods(), ["NodePublishVolume"]);
    // A failed publish of another pod is the driver's message.
    *e.driver.fail_publish.lock().unwrap() = Some("disk on fire".into());
    let err = e.vm.mount_pod_volumes(&claim_pod("b", "uid-b")).await.unwrap_err().to_string();
    assert!(err.contains("code = Internal desc = disk on fire"), "{err}");
}

#[tokio::test]
async fn an_attachable_driver_waits_for_its_volume_attachment() {
    let e = env(false);
    e.register().await;
    e.bound_claim();
    e.csi_driver(&json!({}));
    let a = claim_pod("a", "uid-a");
    // Waiting for the attachment has no event of its own (upstream's
    // VerifyControllerAttachedVolume records none) until the wait times out.
    let err = e.vm.mount_pod_volumes(&a).await.unwrap_err();
    assert!(err.set_up_failures().is_empty() && err.processing_event().is_none(), "{err}");
    assert_eq!(err.timeout_event(), None);
    assert!(err.to_string().starts_with("unmounted volumes=[v], unattached volumes=[v]: "), "{err}");
    e.clock.advance(std::time::Duration::from_secs(122));
    assert_eq!(e.vm.mount_pod_volumes(&a).await.unwrap_err().timeout_event(), None);
    e.clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(
        e.vm.mount_pod_volumes(&a).await.unwrap_err().timeout_event().as_deref(),
        Some(
            "Unable to attach or mount volumes: unmounted volumes=[v], unattached volumes=[v]: timed out waiting for the condition"
        )
    );
    // Once per timeout.
    assert_eq!(e.vm.mount_pod_volumes(&a).await.unwrap_err().timeout_event(), None);
    assert!(e.driver.methods().is_empty(), "nothing staged or published before the attachment");
    // Wanted, so in use, before it is attached (the controller must not detach it).
    assert_eq!(e.vm.volumes_in_use(), [format!("kubernetes.io/csi/{DRIVER}^vol-1")]);
    let name = attachment_name("vol-1", DRIVER, "node-1");
    let va: k8s_openapi::api::storage::v1::VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": DRIVER, "nodeName": "node-1", "source": {"persistentVolumeName": "pv-1"}},
        "status": {"attached": true, "attachmentMetadata": {"device": "/dev/fake"}}
    }))
    .unwrap();
    e.src.set_storage_object(&va);
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(e.driver.methods(), ["NodePublishVolume"]);
    assert_eq!(e.vm.volumes_in_use(), [format!("kubernetes.io/csi/{DRIVER}^vol-1")]);
}

#[tokio::test]
async fn inline_volumes_need_the_ephemeral_mode_and_get_a_per_pod_handle() {
    let e = env(true);
    e.register().await;
    e.csi_driver(&json!({"attachRequired": false, "podInfoOnMount": true}));
    let a = pod("a", "uid-a", &json!({"name": "v", "csi": {"driver": DRIVER, "volumeAttributes": {"k": "x"}}}));
    let err = e.vm.mount_pod_volumes(&a).await.unwrap_err().to_string();
    assert!(err.contains("volume mode \"Ephemeral\" not supported by driver"), "{err}");
    e.csi_driver(&json!({"attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": ["Ephemeral"]}));
    e.vm.mount_pod_volumes(&a).await.unwrap();
    // Never staged, even by a driver that stages.
    assert_eq!(e.driver.methods(), ["NodePublishVolume"]);
    // Not attachable, so never "in use" on the node.
    assert!(e.vm.volumes_in_use().is_empty());
    let calls = e.driver.calls.lock().unwrap().clone();
    assert_eq!(calls[0].1, CsiSpec::inline_volume_handle("uid-a", "v"));
    assert!(calls[0].2.ends_with("pods/uid-a/volumes/kubernetes.io~csi/v/mount"));
    assert_eq!(calls[0].3.get("csi.storage.k8s.io/ephemeral").map(String::as_str), Some("true"));
    assert_eq!(calls[0].3.get("k").map(String::as_str), Some("x"));
    let vm = Arc::new(e.vm);
    let vm2 = vm.clone();
    tokio::task::spawn_blocking(move || vm2.cleanup_pod("uid-a")).await.unwrap().unwrap();
    assert_eq!(e.driver.methods(), ["NodePublishVolume", "NodeUnpublishVolume"]);
}

#[tokio::test]
async fn token_requests_hand_the_pods_tokens_over_and_requires_republish_publishes_at_each_sync() {
    let e = env(true);
    e.register().await;
    e.bound_claim();
    e.csi_driver(&json!({
        "attachRequired": false,
        "requiresRepublish": true,
        "tokenRequests": [{"audience": "vault", "expirationSeconds": 600}, {"audience": ""}]
    }));
    let a = claim_pod("a", "uid-a");
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(e.driver.methods(), ["NodeStageVolume", "NodePublishVolume"]);
    let publish =
        |n: usize| e.driver.calls.lock().unwrap().iter().filter(|c| c.0 == "NodePublishVolume").nth(n).cloned();
    let tokens = |n: usize| -> serde_json::Value {
        let call = publish(n).unwrap();
        serde_json::from_str(call.3.get(CSI_TOKENS_KEY).expect("tokens in the volume context")).unwrap()
    };
    // One token per audience (the empty audience: the API server's own), bound to the pod,
    // with its expiry as the API's timestamps are written.
    assert_eq!(
        tokens(0),
        json!({
            "vault": {"token": "token-1", "expirationTimestamp": "2023-11-14T22:23:20Z"},
            "": {"token": "token-2", "expirationTimestamp": "2023-11-14T23:13:20Z"}
        })
    );
    let requests = e.src.token_requests();
    assert_eq!(requests.len(), 2);
    assert_eq!((requests[0].namespace.as_str(), requests[0].service_account.as_str()), ("default", "sa"));
    assert_eq!((requests[0].audiences.clone(), requests[0].expiration_seconds), (vec!["vault".to_owned()], 600));
    assert_eq!((requests[1].audiences.clone(), requests[1].expiration_seconds), (Vec::<String>::new(), 3600));
    assert_eq!((requests[0].pod.name.as_str(), requests[0].pod.uid.as_str()), ("a", "uid-a"));

    // requiresRepublish: each sync publishes again (never stages again), with the cached
    // tokens until 80 % of a token's lifetime has passed.
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(e.driver.methods(), ["NodeStageVolume", "NodePublishVolume", "NodePublishVolume"]);
    assert_eq!(tokens(1), tokens(0));
    assert_eq!(publish(1).unwrap().2, publish(0).unwrap().2, "the same target");
    e.clock.advance(std::time::Duration::from_secs(481));
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(tokens(2)["vault"]["token"], "token-3");
    assert_eq!(tokens(2)[""]["token"], "token-2");

    // A republish that fails keeps the volume in use and says so; the next one retries.
    *e.driver.fail_publish.lock().unwrap() = Some("driver busy".into());
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert!(vols.get("v").is_some(), "the volume stays in use");
    let failures: Vec<String> = vols.remount_failures().iter().map(ToString::to_string).collect();
    assert!(failures.len() == 1 && failures[0].contains("driver busy"), "{failures:?}");
    *e.driver.fail_publish.lock().unwrap() = None;
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert!(vols.remount_failures().is_empty());
    assert_eq!(e.driver.methods().iter().filter(|m| **m == "NodePublishVolume").count(), 4);

    // serviceAccountTokenInSecrets: the tokens go to the publish secrets instead.
    e.csi_driver(&json!({
        "attachRequired": false,
        "requiresRepublish": true,
        "serviceAccountTokenInSecrets": true,
        "tokenRequests": [{"audience": "vault", "expirationSeconds": 600}]
    }));
    e.vm.mount_pod_volumes(&a).await.unwrap();
    let last = publish(4).unwrap().3;
    assert!(!last.contains_key(CSI_TOKENS_KEY));
    let in_secrets: serde_json::Value =
        serde_json::from_str(last.get(&format!("secret:{CSI_TOKENS_KEY}")).unwrap()).unwrap();
    assert_eq!(in_secrets["vault"]["token"], "token-3");

    // Without requiresRepublish a published volume is left alone, as before.
    e.csi_driver(&json!({"attachRequired": false, "tokenRequests": [{"audience": "vault"}]}));
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(e.driver.methods().iter().filter(|m| **m == "NodePublishVolume").count(), 5);
    assert_eq!(e.driver.methods().iter().filter(|m| **m == "NodeStageVolume").count(), 1);
}

#[tokio::test]
async fn token_requests_that_fail_say_why_and_publish_nothing() {
    let e = env(false);
    e.register().await;
    e.bound_claim();
    e.csi_driver(&json!({"attachRequired": false, "tokenRequests": [{"audience": "vault"}]}));
    e.src.set_token_failure(Some("serviceaccounts \"sa\" not found"));
    let err = e.vm.mount_pod_volumes(&claim_pod("a", "uid-a")).await.unwrap_err().to_string();
    assert!(err.contains("failed to get service accoount token attributes"), "{err}");
    assert!(err.contains("not found"), "{err}");
    assert!(e.driver.methods().is_empty(), "{:?}", e.driver.methods());
}

#[tokio::test]
async fn a_generic_ephemeral_volume_uses_the_claim_made_for_the_pod() {
    let e = env(false);
    e.register().await;
    e.bound_claim();
    let a = pod("a", "uid-a", &json!({"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}));
    // The claim is `<pod>-<volume>`, and must be owned by the pod.
    let claim = |owner: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "a-v", "namespace": "default", "uid": "pvc-uid",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "a", "uid": owner, "controller": true}]},
            "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound"}
        }))
        .unwrap()
    };
    e.src.set_storage_object(&claim("someone-else"));
    let err = e.vm.mount_pod_volumes(&a).await.unwrap_err().to_string();
    assert!(err.contains("PVC default/a-v was not created for pod default/a (pod is not owner)"), "{err}");
    e.src.set_storage_object(&claim("uid-a"));
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(vols.get("v").unwrap().claim.as_deref(), Some("a-v"));
}

#[tokio::test]
async fn a_restarted_agent_tears_down_through_the_driver_from_what_is_on_disk() {
    let e = env(true);
    e.register().await;
    e.bound_claim();
    e.vm.mount_pod_volumes(&claim_pod("a", "uid-a")).await.unwrap();
    // A new manager (the agent restarted) knows nothing but the disk.
    let restarted = Arc::new(
        VolumeManager::new(e.root(), Arc::new(e.src.clone()))
            .with_mounter(Arc::new(FakeMounter::default()))
            .with_csi(e.drivers.clone()),
    );
    let sweep = tokio::task::spawn_blocking(move || restarted.cleanup_orphans(|_| Some(()))).await.unwrap().unwrap();
    assert_eq!(sweep.removed, ["uid-a"]);
    assert_eq!(
        e.driver.methods(),
        ["NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"]
    );
}

/// The claim `data` after the resizer grew its volume to 2Gi: the node's part pending.
fn claim_pending_node_expansion(e: &Env, read_only: bool) -> Pod {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "default", "uid": "pvc-uid", "resourceVersion": "7"},
        "spec": {"volumeName": "pv-1"},
        "status": {
            "phase": "Bound",
            "capacity": {"storage": "1Gi"},
            "allocatedResources": {"storage": "2Gi"},
            "allocatedResourceStatuses": {"storage": "NodeResizePending"},
            "conditions": [{"type": "FileSystemResizePending", "status": "True"}]
        }
    }))
    .unwrap();
    e.src.set_storage_object(&pvc);
    pod("a", "uid-a", &json!({"name": "v", "persistentVolumeClaim": {"claimName": "data", "readOnly": read_only}}))
}

/// A driver that expands, a pod on the claim `data` set up, then the claim pending the
/// node's part of an expansion ([`claim_pending_node_expansion`]).
async fn set_up_pending_expansion(read_only: bool) -> (Env, Pod) {
    let e = env_with(FakeDriver { stage: true, expand: true, ..FakeDriver::default() });
    e.register().await;
    e.bound_claim();
    let a = claim_pending_node_expansion(&e, read_only);
    e.vm.mount_pod_volumes(&a).await.unwrap();
    (e, a)
}

async fn claim_status(e: &Env) -> k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
    e.src.persistent_volume_claim("default", "data").await.unwrap().unwrap().status.unwrap()
}

fn resize_status(s: &k8s_openapi::api::core::v1::PersistentVolumeClaimStatus) -> Option<String> {
    s.allocated_resource_statuses.as_ref().and_then(|m| m.get("storage").cloned())
}

/// (object kind, reason, message) of a sync's volume events.
fn volume_events(vols: &crate::volumes::PodVolumes) -> Vec<(String, String, String)> {
    vols.events()
        .iter()
        .map(|e| {
            let kind = e.object.as_ref().and_then(|o| o.kind.clone()).unwrap_or_else(|| "Pod".into());
            let severity = if e.warning { "Warning" } else { "Normal" };
            (format!("{severity} {kind}"), e.reason.to_owned(), e.message.clone())
        })
        .collect()
}

fn expansions(e: &Env) -> usize {
    e.driver.methods().iter().filter(|m| **m == "NodeExpandVolume").count()
}

#[tokio::test]
async fn a_claim_pending_node_expansion_is_expanded_and_its_status_finished() {
    let e = env_with(FakeDriver { stage: true, expand: true, ..FakeDriver::default() });
    e.register().await;
    e.bound_claim();
    let mut pv: PersistentVolume = e.src.persistent_volume("pv-1").await.unwrap().unwrap();
    let csi = pv.spec.as_mut().unwrap().csi.as_mut().unwrap();
    csi.node_expand_secret_ref = Some(k8s_openapi::api::core::v1::SecretReference {
        name: Some("expand-secret".into()),
        namespace: Some("kube-system".into()),
    });
    e.src.set_storage_object(&pv);
    e.src.set_secret(
        serde_json::from_value(
            json!({"metadata": {"name": "expand-secret", "namespace": "kube-system"}, "stringData": {"key": "k1"}}),
        )
        .unwrap(),
    );
    let a = claim_pod("a", "uid-a");
    e.vm.mount_pod_volumes(&a).await.unwrap();
    // Nothing pending: no expansion.
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert!(vols.events().is_empty());
    assert_eq!(e.driver.methods(), ["NodeStageVolume", "NodePublishVolume"]);
    claim_pending_node_expansion(&e, false);
    // The first try meets a driver that may still be at it: the claim says the node is
    // expanding, nothing failed for good, no event.
    *e.driver.fail_expand.lock().unwrap() = Some((tonic::Code::Unavailable, "restarting".into()));
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert!(vols.events().is_empty());
    let status = claim_status(&e).await;
    assert_eq!(resize_status(&status).as_deref(), Some("NodeResizeInProgress"));
    assert_eq!(status.conditions.unwrap_or_default().len(), 1, "only the resizer's condition");
    // Tried again at the next sync, from `NodeResizeInProgress`.
    *e.driver.fail_expand.lock().unwrap() = None;
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    let calls = e.driver.calls.lock().unwrap().clone();
    let expand = calls.last().unwrap();
    assert_eq!((expand.0, expand.1.as_str()), ("NodeExpandVolume", "vol-1"));
    assert!(expand.2.ends_with("pods/uid-a/volumes/kubernetes.io~csi/pv-1/mount"));
    assert_eq!(expand.3.get("required_bytes").map(String::as_str), Some("2147483648"));
    assert_eq!(expand.3.get("secret:key").map(String::as_str), Some("k1"), "nodeExpandSecretRef's data");
    let after = claim_status(&e).await;
    assert_eq!(after.capacity.unwrap().get("storage").unwrap().0, "2Gi");
    assert!(after.allocated_resource_statuses.unwrap_or_default().is_empty());
    assert!(after.conditions.unwrap_or_default().is_empty());
    // Upstream's event, on the pod and on the claim.
    let message = r#"MountVolume.NodeExpandVolume succeeded for volume "pv-1" node-1"#.to_owned();
    let reason = "FileSystemResizeSuccessful".to_owned();
    assert_eq!(
        volume_events(&vols),
        [
            ("Normal Pod".into(), reason.clone(), message.clone()),
            ("Normal PersistentVolumeClaim".into(), reason, message)
        ]
    );
    let claim_ref = vols.events()[1].object.clone().unwrap();
    assert_eq!(
        (claim_ref.namespace.as_deref(), claim_ref.name.as_deref(), claim_ref.uid.as_deref()),
        (Some("default"), Some("data"), Some("pvc-uid"))
    );
    // Done once.
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert!(vols.events().is_empty());
    assert_eq!(expansions(&e), 2);
}

#[tokio::test]
async fn a_driver_refusing_an_expansion_says_so_in_the_claim_and_is_asked_again_unless_infeasible() {
    let (e, a) = set_up_pending_expansion(false).await;
    assert_eq!(expansions(&e), 0, "set up, not expanded, at the first sync");
    // A final error: the claim's NodeResizeError condition, upstream's words; still in
    // progress, so asked again at the next sync.
    *e.driver.fail_expand.lock().unwrap() = Some((tonic::Code::Internal, "disk full".into()));
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert!(vols.events().is_empty(), "no event for a failed expansion, as upstream");
    let status = claim_status(&e).await;
    assert_eq!(resize_status(&status).as_deref(), Some("NodeResizeInProgress"));
    let conditions = status.conditions.unwrap_or_default();
    let error = conditions.iter().find(|c| c.type_ == "NodeResizeError").expect("NodeResizeError");
    assert_eq!(
        error.message.as_deref(),
        Some(
            "failed to expand pvc with Expander.NodeExpand failed to expand the volume : rpc error: code = Internal desc = disk full"
        )
    );
    assert_eq!(error.status, "True");
    assert!(error.last_transition_time.is_some());
    assert!(conditions.iter().any(|c| c.type_ == "FileSystemResizePending"), "the resizer's condition kept");
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(expansions(&e), 2);
    assert_eq!(claim_status(&e).await.conditions.unwrap_or_default().len(), 2, "one NodeResizeError, replaced");
    // An infeasible one: the claim says so, and the node stops asking.
    *e.driver.fail_expand.lock().unwrap() = Some((tonic::Code::OutOfRange, "too big".into()));
    e.vm.mount_pod_volumes(&a).await.unwrap();
    let status = claim_status(&e).await;
    assert_eq!(resize_status(&status).as_deref(), Some("NodeResizeInfeasible"));
    let conditions = status.conditions.unwrap_or_default();
    let error = conditions.iter().find(|c| c.type_ == "NodeResizeError").unwrap();
    assert_eq!(
        error.message.as_deref(),
        Some(
            "failed to expand pvc with Expander.NodeExpand failed to expand the volume rpc error: code = OutOfRange desc = too big"
        )
    );
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(expansions(&e), 3);
}

#[tokio::test]
async fn a_volume_the_driver_cannot_grow_in_use_waits_for_the_next_pod() {
    let (e, a) = set_up_pending_expansion(false).await;
    *e.driver.fail_expand.lock().unwrap() = Some((tonic::Code::FailedPrecondition, "in use".into()));
    e.vm.mount_pod_volumes(&a).await.unwrap();
    e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(expansions(&e), 1, "not asked again while the pod runs");
    let status = claim_status(&e).await;
    assert_eq!(resize_status(&status).as_deref(), Some("NodeResizeInProgress"));
    assert!(!status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "NodeResizeError"));
    // The pod gone (its volumes torn down), a pod set up again is grown: nothing of the
    // first is remembered (the same UID here, to show it).
    let root = e.root();
    let vm = Arc::new(e.vm);
    let vm2 = vm.clone();
    tokio::task::spawn_blocking(move || vm2.cleanup_pod("uid-a")).await.unwrap().unwrap();
    assert!(!root.join("pods/uid-a/volumes").exists());
    *e.driver.fail_expand.lock().unwrap() = None;
    vm.mount_pod_volumes(&a).await.unwrap();
    vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(e.driver.methods().iter().filter(|m| **m == "NodeExpandVolume").count(), 2);
    let claim = e.src.persistent_volume_claim("default", "data").await.unwrap().unwrap();
    assert_eq!(resize_status(&claim.status.unwrap()), None);
}

#[tokio::test]
async fn a_read_only_volume_is_not_grown_and_says_so_once() {
    let (e, a) = set_up_pending_expansion(true).await;
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    let message = r#"MountVolume.NodeExpandVolume failed for volume "pv-1" requested read-only file system"#.to_owned();
    let reason = "FileSystemResizeFailed".to_owned();
    assert_eq!(
        volume_events(&vols),
        [
            ("Warning Pod".into(), reason.clone(), message.clone()),
            ("Warning PersistentVolumeClaim".into(), reason, message)
        ]
    );
    assert!(e.vm.mount_pod_volumes(&a).await.unwrap().events().is_empty(), "once while the pod runs");
    assert_eq!(expansions(&e), 0);
    assert_eq!(resize_status(&claim_status(&e).await).as_deref(), Some("NodeResizePending"));
}

#[tokio::test]
async fn a_block_claim_is_handed_to_the_container_as_a_device() {
    let e = env(true);
    e.register().await;
    e.bound_claim();
    let mut pv: PersistentVolume = e.src.persistent_volume("pv-1").await.unwrap().unwrap();
    pv.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    e.src.set_storage_object(&pv);
    let a: Pod = serde_json::from_value(json!({
        "metadata": {"name": "a", "namespace": "default", "uid": "uid-a"},
        "spec": {
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "c", "image": "img", "volumeDevices": [{"name": "v", "devicePath": "/dev/xvda"}]}]
        }
    }))
    .unwrap();
    let vols = e.vm.mount_pod_volumes(&a).await.unwrap();
    assert_eq!(e.driver.methods(), ["NodeStageVolume", "NodePublishVolume"]);
    let container = &a.spec.as_ref().unwrap().containers[0];
    let out = e.vm.container_mounts(container, &vols, &crate::volumes::manager::ImageVolumes::new(), &[]).unwrap();
    assert!(out.mounts.is_empty());
    assert_eq!(out.devices.len(), 1);
    assert_eq!(out.devices[0].container_path, "/dev/xvda");
    assert!(out.devices[0].host_path.ends_with("pods/uid-a/volumes/kubernetes.io~csi/pv-1/mount"));
    assert_eq!(out.devices[0].permissions, "mrw");
    // The block capability went to the driver.
    let calls = e.driver.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
}

#[test]
fn node_annotation_and_csi_node_entries() {
    let a = node_info::updated_annotation(None, "d1", Some("n1")).unwrap();
    assert_eq!(a, r#"{"d1":"n1"}"#);
    let a = node_info::updated_annotation(Some(&a), "d2", Some("n2")).unwrap();
    assert_eq!(a, r#"{"d1":"n1","d2":"n2"}"#);
    assert_eq!(node_info::updated_annotation(Some(r#"{"d1":"n1"}"#), "d1", None), None);
    let topo = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
    let entry = node_info::driver_entry("d1", "n1", 0, &topo);
    assert_eq!(entry.topology_keys, Some(vec!["zone".to_owned()]));
    assert!(entry.allocatable.is_none(), "no limit: no allocatable");
    assert_eq!(node_info::driver_entry("d1", "n1", 3, &BTreeMap::new()).allocatable.unwrap().count, Some(3));
}

#[test]
fn fs_group_policy_as_upstream() {
    use proto::volume_capability::access_mode::Mode;
    let mut spec = CsiSpec {
        driver: DRIVER.into(),
        volume_handle: "h".into(),
        spec_name: "pv".into(),
        mode: LifecycleMode::Persistent,
        read_only: false,
        fs_type: String::new(),
        mount_options: vec![],
        attributes: BTreeMap::new(),
        stage_secret: None,
        publish_secret: None,
        expand_secret: None,
        access_modes: vec!["ReadWriteOnce".into()],
        block: false,
        attach_required: false,
    };
    assert!(!spec.applies_fs_group("ReadWriteOnceWithFSType"), "no fsType");
    assert!(spec.applies_fs_group("File"));
    assert!(!spec.applies_fs_group("None"));
    spec.fs_type = "ext4".into();
    assert!(spec.applies_fs_group("ReadWriteOnceWithFSType"));
    spec.access_modes.push("ReadOnlyMany".into());
    assert!(!spec.applies_fs_group("ReadWriteOnceWithFSType"));
    assert_eq!(spec.csi_access_mode(false), Mode::SingleNodeWriter);
    spec.access_modes = vec!["ReadWriteMany".into()];
    assert_eq!(spec.csi_access_mode(false), Mode::MultiNodeMultiWriter);
}

#[tokio::test]
async fn volume_stats_come_from_node_get_volume_stats_when_the_driver_offers_it() {
    use proto::volume_usage::Unit;
    let e = env(true);
    e.register().await;
    let usage = |unit: Unit, available, total, used| proto::VolumeUsage { available, total, used, unit: unit as i32 };
    *e.driver.stats.lock().unwrap() = Some(Ok(proto::NodeGetVolumeStatsResponse {
        usage: vec![usage(Unit::Bytes, 6 << 20, 10 << 20, 4 << 20), usage(Unit::Inodes, 90, 100, 10)],
    }));
    let ask = |drivers: Arc<CsiDrivers>, driver: &str, id: &str| {
        let (driver, id) = (driver.to_owned(), id.to_owned());
        tokio::task::spawn_blocking(move || drivers.volume_stats_blocking(&driver, &id, Path::new("/pods/u/mount")))
    };
    let got = ask(e.drivers.clone(), DRIVER, "vol-1").await.unwrap().unwrap().unwrap();
    assert_eq!(
        got,
        stats::VolumeUsage {
            capacity: 10 << 20,
            available: 6 << 20,
            used: 4 << 20,
            inodes: 100,
            inodes_free: 90,
            inodes_used: 10
        }
    );
    // The volume id and the publish path; no staging path, as upstream.
    let calls = e.driver.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].0, calls[0].1.as_str(), calls[0].2.as_str()),
        ("NodeGetVolumeStats", "vol-1", "/pods/u/mount")
    );
    assert_eq!(calls[0].3["staging_target_path"], "");

    // Bytes only (a block volume): inodes stay 0; negative figures count as 0.
    *e.driver.stats.lock().unwrap() =
        Some(Ok(proto::NodeGetVolumeStatsResponse { usage: vec![usage(Unit::Bytes, -1, 5 << 20, 0)] }));
    let got = ask(e.drivers.clone(), DRIVER, "vol-1").await.unwrap().unwrap().unwrap();
    assert_eq!(got, stats::VolumeUsage { capacity: 5 << 20, ..stats::VolumeUsage::default() });
    // No usage at all, a failing driver, an unregistered one: errors the caller logs.
    *e.driver.stats.lock().unwrap() = Some(Ok(proto::NodeGetVolumeStatsResponse::default()));
    let err = ask(e.drivers.clone(), DRIVER, "vol-1").await.unwrap().unwrap_err().to_string();
    assert!(err.contains("usage is nil"), "{err}");
    *e.driver.stats.lock().unwrap() = Some(Err("disk gone".into()));
    let err = ask(e.drivers.clone(), DRIVER, "vol-1").await.unwrap().unwrap_err().to_string();
    assert!(err.contains("code = Internal desc = disk gone"), "{err}");
    let err = ask(e.drivers.clone(), "other.csi", "vol-1").await.unwrap().unwrap_err().to_string();
    assert!(err.contains("driver name other.csi not found"), "{err}");

    // A driver without GET_VOLUME_STATS is not asked: no figures.
    let e = env_with(FakeDriver { stage: true, no_stats: true, ..FakeDriver::default() });
    e.register().await;
    assert_eq!(ask(e.drivers.clone(), DRIVER, "vol-1").await.unwrap().unwrap(), None);
    assert!(e.driver.methods().is_empty());
}
