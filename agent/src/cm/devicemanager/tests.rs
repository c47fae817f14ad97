use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::Pod;
use tonic::Status;

use super::plugin::validate;
use super::proto::{self, RegisterRequest};
use super::state::Endpoint;
use super::*;

const RES: &str = "example.com/dev";

/// A plugin that records its calls and hands out `/dev/null` as `/dev/fake-<id>`.
#[derive(Default)]
struct FakePlugin {
    calls: Mutex<Vec<String>>,
    prefer: Vec<String>,
}

#[async_trait::async_trait]
impl PluginApi for FakePlugin {
    async fn get_preferred_allocation(
        &self,
        req: proto::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("preferred {} of {:?}", req.allocation_size, req.available_device_i_ds));
        Ok(self.prefer.clone())
    }

    async fn allocate(&self, devices: Vec<String>) -> Result<proto::AllocateResponse, Status> {
        self.calls.lock().unwrap().push(format!("allocate {devices:?}"));
        Ok(proto::AllocateResponse {
            container_responses: vec![proto::ContainerAllocateResponse {
                envs: [("FAKE_DEVICES".to_string(), devices.join(","))].into(),
                mounts: vec![proto::Mount {
                    container_path: "/fake".into(),
                    host_path: "/tmp".into(),
                    read_only: true,
                }],
                devices: devices
                    .iter()
                    .map(|d| proto::DeviceSpec {
                        container_path: format!("/dev/fake-{d}"),
                        host_path: "/dev/null".into(),
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: [("fake/annotation".to_string(), "yes".to_string())].into(),
                cdi_devices: vec![proto::CdiDevice { name: "example.com/dev=all".into() }],
            }],
        })
    }

    async fn pre_start_container(&self, devices: Vec<String>) -> Result<(), Status> {
        self.calls.lock().unwrap().push(format!("prestart {devices:?}"));
        Ok(())
    }
}

fn dev(id: &str, healthy: bool, numa: Option<i64>) -> proto::Device {
    proto::Device {
        id: id.into(),
        health: if healthy { HEALTHY } else { UNHEALTHY }.into(),
        topology: numa.map(|n| proto::TopologyInfo { nodes: vec![proto::NumaNode { id: n }] }),
    }
}

fn manager(dir: &std::path::Path, grace: Duration) -> DeviceManager {
    DeviceManager::with_options(dir.to_owned(), vec![0, 1], grace).unwrap()
}

/// Registers `devices` from a plugin with default behaviour and options.
fn register_default(m: &DeviceManager, devices: Vec<proto::Device>) {
    register(m, Arc::new(FakePlugin::default()), proto::DevicePluginOptions::default(), devices);
}

fn register(
    m: &DeviceManager,
    plugin: Arc<FakePlugin>,
    options: proto::DevicePluginOptions,
    devices: Vec<proto::Device>,
) {
    let mut s = m.inner.state.lock().unwrap();
    s.next_generation += 1;
    let generation = s.next_generation;
    s.endpoints.insert(RES.into(), Endpoint { api: Some(plugin), options, stopped_at: None, generation });
    s.update_devices(RES, devices);
}

fn pod(uid: &str, init: &[(&str, u32)], apps: &[(&str, u32)]) -> Pod {
    let c = |(name, n): &(&str, u32)| serde_json::json!({"name": name, "image": "x", "resources": {"limits": {RES: n.to_string()}}});
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "uid": uid},
        "spec": {"initContainers": init.iter().map(c).collect::<Vec<_>>(), "containers": apps.iter().map(c).collect::<Vec<_>>()}
    }))
    .unwrap()
}

fn admit(m: &DeviceManager, p: &Pod, active: &[Pod]) -> Result<(), Rejection> {
    m.remove_stale(active);
    let spec = p.spec.as_ref().unwrap();
    for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
        m.allocate(p, c, &TopologyHint::default())?;
    }
    Ok(())
}

fn ids(m: &DeviceManager, uid: &str, c: &str) -> BTreeSet<String> {
    m.container_devices(uid, c).remove(RES).unwrap_or_default()
}

#[test]
fn registration_requests_are_validated_as_upstream() {
    let ok = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "p.sock".into(),
        resource_name: RES.into(),
        options: None,
    };
    assert_eq!(validate(&ok), Ok(()));
    let e = validate(&RegisterRequest { version: "v1alpha".into(), ..ok.clone() }).unwrap_err();
    assert_eq!(e, "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]");
    for bad in [
        "gpu",
        "kubernetes.io/gpu",
        "x.kubernetes.io/gpu",
        "requests.example.com/gpu",
        "Example.com/gpu",
        "example.com/-gpu",
    ] {
        let e = validate(&RegisterRequest { resource_name: bad.into(), ..ok.clone() }).unwrap_err();
        assert_eq!(e, format!("the ResourceName {bad:?} is invalid"));
    }
    assert!(validate(&RegisterRequest { endpoint: "../x.sock".into(), ..ok.clone() }).is_err());
    assert!(validate(&RegisterRequest { endpoint: "/x.sock".into(), ..ok.clone() }).is_err());
    assert!(validate(&RegisterRequest { endpoint: String::new(), ..ok.clone() }).is_err());
}

#[test]
fn init_container_devices_are_reused_and_exhaustion_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    let plugin = Arc::new(FakePlugin::default());
    register(
        &m,
        plugin.clone(),
        proto::DevicePluginOptions::default(),
        vec![dev("a", true, None), dev("b", true, None), dev("c", true, None)],
    );
    let p1 = pod("u1", &[("init", 2)], &[("app", 1), ("side", 1)]);
    admit(&m, &p1, &[]).unwrap();
    let init = ids(&m, "u1", "init");
    assert_eq!(init.len(), 2);
    // The app containers get the init container's devices back, not the third one.
    let apps: BTreeSet<String> = ids(&m, "u1", "app").union(&ids(&m, "u1", "side")).cloned().collect();
    assert_eq!(apps, init);
    assert_eq!(m.extended_resources().allocatable[RES], 3);
    // One device is free: a pod asking for two is refused with upstream's message.
    let p2 = pod("u2", &[], &[("c", 2)]);
    let r = admit(&m, &p2, std::slice::from_ref(&p1)).unwrap_err();
    assert_eq!(r.reason, "UnexpectedAdmissionError");
    assert_eq!(
        r.message,
        "Allocate failed due to requested number of devices unavailable for example.com/dev. Requested: 2, Available: 1, which is unexpected"
    );
    // Once the first pod is no longer active its devices are free again.
    admit(&m, &p2, &[]).unwrap();
    assert_eq!(ids(&m, "u2", "c").len(), 2);
    assert!(m.container_devices("u1", "init").is_empty());
    // Re-admitting an allocated container calls no plugin (e.g. after a restart).
    let calls = plugin.calls.lock().unwrap().len();
    admit(&m, &p2, &[]).unwrap();
    assert_eq!(plugin.calls.lock().unwrap().len(), calls);
}

/// `DRAExtendedResource` (GA): a container's extended resource that the pod's extended
/// resource claim serves comes from DRA, so the device manager hands out none of its
/// plugin's devices for it (upstream `allocateContainerResources` skips it), neither at
/// admission nor when the container is created; other containers' requests are served.
#[test]
fn extended_resources_served_by_dra_get_no_plugin_devices() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    let plugin = Arc::new(FakePlugin::default());
    register(
        &m,
        plugin.clone(),
        proto::DevicePluginOptions::default(),
        vec![dev("a", true, None), dev("b", true, None)],
    );
    let mut p = pod("u1", &[], &[("dra", 2), ("plugin", 1)]);
    p.status = Some(
        serde_json::from_value(serde_json::json!({"extendedResourceClaimStatus": {
            "resourceClaimName": "u1-extended-resources-x",
            "requestMappings": [{"containerName": "dra", "resourceName": RES, "requestName": "container-0-request-0"}],
        }}))
        .unwrap(),
    );
    admit(&m, &p, &[]).unwrap();
    assert!(ids(&m, "u1", "dra").is_empty(), "DRA serves it");
    assert_eq!(ids(&m, "u1", "plugin").len(), 1);
    assert_eq!(plugin.calls.lock().unwrap().iter().filter(|c| c.starts_with("allocate")).count(), 1);
    // Creating the container asks the plugin for nothing either (no re-allocation).
    let dra = &p.spec.as_ref().unwrap().containers[0];
    let mut config = api::ContainerConfig::default();
    m.pre_create_container(&p, dra, &mut config).unwrap();
    assert!(config.devices.is_empty() && config.cdi_devices.is_empty() && config.envs.is_empty(), "{config:?}");
    assert_eq!(plugin.calls.lock().unwrap().iter().filter(|c| c.starts_with("allocate")).count(), 1);
}

#[test]
fn the_plugins_preference_is_asked_and_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    let plugin = Arc::new(FakePlugin { prefer: vec!["c".into()], ..FakePlugin::default() });
    let opts = proto::DevicePluginOptions { get_preferred_allocation_available: true, pre_start_required: true };
    register(&m, plugin.clone(), opts, vec![dev("a", true, None), dev("b", true, None), dev("c", true, None)]);
    let p = pod("u1", &[], &[("app", 1)]);
    admit(&m, &p, &[]).unwrap();
    assert_eq!(ids(&m, "u1", "app"), BTreeSet::from(["c".to_string()]));
    let calls = plugin.calls.lock().unwrap().clone();
    assert_eq!(calls, vec!["preferred 1 of [\"a\", \"b\", \"c\"]".to_string(), "allocate [\"c\"]".to_string()]);
    // Container creation: PreStartContainer first, then the allocation in the config.
    let mut config = api::ContainerConfig {
        envs: vec![api::KeyValue { key: "OWN".into(), value: "1".into() }],
        ..Default::default()
    };
    let c = &p.spec.as_ref().unwrap().containers[0];
    m.pre_create_container(&p, c, &mut config).unwrap();
    assert_eq!(plugin.calls.lock().unwrap().last().unwrap(), "prestart [\"c\"]");
    assert_eq!(config.devices.len(), 1);
    assert_eq!(config.devices[0].container_path, "/dev/fake-c");
    assert_eq!(config.devices[0].host_path, "/dev/null");
    assert_eq!(config.envs[0].key, "FAKE_DEVICES");
    assert_eq!(config.envs[1].key, "OWN");
    assert!(config.mounts.iter().any(|m| m.container_path == "/fake" && m.readonly));
    assert_eq!(config.annotations["fake/annotation"], "yes");
    assert_eq!(config.cdi_devices[0].name, "example.com/dev=all");
}

#[test]
fn a_health_change_names_the_pods_holding_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    register_default(&m, vec![dev("a", true, None), dev("b", true, None)]);
    let p = pod("u1", &[], &[("app", 1)]);
    admit(&m, &p, &[]).unwrap();
    let held = ids(&m, "u1", "app").into_iter().next().unwrap();
    let other = if held == "a" { "b" } else { "a" };
    let mut s = m.inner.state.lock().unwrap();
    let report = |held_ok: bool, other_ok: bool| vec![dev(&held, held_ok, None), dev(other, other_ok, None)];
    // The same health again, or a change of a device no pod holds: nothing to sync.
    assert!(s.update_devices(RES, report(true, true)).is_empty());
    assert!(s.update_devices(RES, report(true, false)).is_empty());
    assert_eq!(s.update_devices(RES, report(false, false)), BTreeSet::from(["u1".to_owned()]));
    let status = s.allocated_resources_status("u1", "app");
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].name, RES);
    let r = &status[0].resources.as_ref().unwrap()[0];
    assert_eq!((r.resource_id.as_str(), r.health.as_deref()), (held.as_str(), Some("Unhealthy")));
    // Gone from the list: healthy, as upstream; back in it: the pod is synced again.
    assert!(s.update_devices(RES, vec![dev(other, true, None)]).is_empty());
    assert_eq!(
        s.allocated_resources_status("u1", "app")[0].resources.as_ref().unwrap()[0].health.as_deref(),
        Some("Healthy")
    );
    assert_eq!(s.update_devices(RES, report(true, true)), BTreeSet::from(["u1".to_owned()]));
    assert!(s.allocated_resources_status("u1", "other").is_empty());
    assert!(s.allocated_resources_status("u2", "app").is_empty());
}

#[test]
fn health_and_a_gone_plugin_shape_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), Duration::ZERO);
    register_default(&m, vec![dev("a", true, None), dev("b", false, None)]);
    let r = m.extended_resources();
    assert_eq!((r.capacity[RES], r.allocatable[RES]), (2, 1));
    m.inner.state.lock().unwrap().plugin_gone(RES, Instant::now());
    // Grace period zero: the resource is removed and reported as 0 from then on.
    let r = m.extended_resources();
    assert_eq!((r.capacity[RES], r.allocatable[RES]), (0, 0));
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    register_default(&m, vec![dev("a", true, None)]);
    m.inner.state.lock().unwrap().plugin_gone(RES, Instant::now());
    let r = m.extended_resources();
    assert_eq!((r.capacity[RES], r.allocatable[RES]), (1, 0));
}

#[test]
fn the_checkpoint_is_written_only_when_devices_are_handed_out() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    register_default(&m, vec![dev("a", true, None)]);
    let checkpoint = dir.path().join(CHECKPOINT_FILE);
    let _ = std::fs::remove_file(&checkpoint);
    // No device resources: nothing to record (upstream writes only on an allocation).
    let plain: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plain", "uid": "u0"},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": {"limits": {"cpu": "1"}}}]}
    }))
    .unwrap();
    admit(&m, &plain, &[]).unwrap();
    assert!(!checkpoint.exists(), "a pod without devices wrote the checkpoint");
    // A device handed out is recorded at once.
    let p = pod("u1", &[], &[("app", 1)]);
    admit(&m, &p, std::slice::from_ref(&plain)).unwrap();
    assert!(std::fs::read_to_string(&checkpoint).unwrap().contains("u1"));
    // Admitted again (a restart's re-admission), the container keeps its device: no write.
    std::fs::remove_file(&checkpoint).unwrap();
    admit(&m, &p, &[plain, p.clone()]).unwrap();
    assert!(!checkpoint.exists(), "a container that already held its devices rewrote the checkpoint");
    assert_eq!(ids(&m, "u1", "app"), BTreeSet::from(["a".to_string()]));
    m.stop();
}

#[test]
fn allocations_survive_a_restart_through_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    register_default(&m, vec![dev("a", true, None), dev("b", true, None)]);
    let p = pod("u1", &[], &[("app", 1)]);
    admit(&m, &p, &[]).unwrap();
    let before = ids(&m, "u1", "app");
    m.stop();
    drop(m);
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    m.start(HashSet::from([("u1".to_string(), "app".to_string())])).unwrap();
    assert!(m.socket().exists());
    assert_eq!(ids(&m, "u1", "app"), before);
    // The resource is known (capacity 0) until its plugin is back.
    assert_eq!(m.extended_resources().capacity[RES], 0);
    // The running container is re-admitted without its plugin.
    admit(&m, &p, &[]).unwrap();
    let mut config = api::ContainerConfig::default();
    m.pre_create_container(&p, &p.spec.as_ref().unwrap().containers[0], &mut config).unwrap();
    assert_eq!(config.devices.len(), 1);
    // The node-fit check sees at least the held devices as allocatable.
    let mut node = k8s_openapi::api::core::v1::Node::default();
    crate::lifecycle::admission::PluginResourceUpdater::update_plugin_resources(&m, &mut node);
    assert_eq!(node.status.unwrap().allocatable.unwrap()[RES].0, "1");
    // A new pod cannot get devices of an unregistered plugin.
    let r = admit(&m, &pod("u2", &[], &[("c", 1)]), std::slice::from_ref(&p)).unwrap_err();
    assert!(
        r.message.contains("no healthy devices present; cannot allocate unhealthy devices example.com/dev"),
        "{r:?}"
    );
    m.stop();
}

#[test]
fn hints_follow_device_numa_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    register_default(&m, vec![dev("a", true, Some(0)), dev("b", true, Some(1)), dev("c", true, Some(1))]);
    let p = pod("u1", &[], &[("app", 2)]);
    let h = m.get_topology_hints(&p, &p.spec.as_ref().unwrap().containers[0]);
    assert_eq!(
        h[RES],
        vec![
            TopologyHint { affinity: Some(NumaMask(0b10)), preferred: true },
            TopologyHint { affinity: Some(NumaMask(0b11)), preferred: false },
        ]
    );
    assert_eq!(m.get_pod_topology_hints(&p)[RES].len(), 2);
    // Allocation within the chosen hint takes the node-1 devices.
    m.remove_stale(&[]);
    let hint = TopologyHint { affinity: Some(NumaMask(0b10)), preferred: true };
    m.allocate(&p, &p.spec.as_ref().unwrap().containers[0], &hint).unwrap();
    assert_eq!(ids(&m, "u1", "app"), BTreeSet::from(["b".to_string(), "c".to_string()]));
    // Too many requested: an empty list (cannot be aligned).
    let big = pod("u2", &[], &[("app", 2)]);
    m.remove_stale(std::slice::from_ref(&p));
    assert_eq!(m.get_topology_hints(&big, &big.spec.as_ref().unwrap().containers[0])[RES], vec![]);
    // Devices without topology give no preference at all.
    let dir2 = tempfile::tempdir().unwrap();
    let m2 = manager(dir2.path(), ENDPOINT_STOP_GRACE);
    register_default(&m2, vec![dev("a", true, None)]);
    let one = pod("u3", &[], &[("app", 1)]);
    assert!(m2.get_topology_hints(&one, &one.spec.as_ref().unwrap().containers[0]).is_empty());
}

/// A plugin served over gRPC on a unix socket, as the manager sees real plugins.
#[derive(Clone)]
struct GrpcPlugin {
    devices: tokio::sync::watch::Sender<Vec<proto::Device>>,
    stop: tokio_util::sync::CancellationToken,
}

type DeviceStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl proto::device_plugin_server::DevicePlugin for GrpcPlugin {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<proto::Empty>,
    ) -> Result<tonic::Response<proto::DevicePluginOptions>, Status> {
        Ok(tonic::Response::new(proto::DevicePluginOptions::default()))
    }

    async fn list_and_watch(&self, _: tonic::Request<proto::Empty>) -> Result<tonic::Response<DeviceStream>, Status> {
        use futures::StreamExt as _;
        let rx = self.devices.subscribe();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first {
                rx.changed().await.ok()?;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(proto::ListAndWatchResponse { devices }), (rx, false)))
        })
        .take_until(self.stop.clone().cancelled_owned());
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<proto::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<proto::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not offered"))
    }

    async fn allocate(
        &self,
        request: tonic::Request<proto::AllocateRequest>,
    ) -> Result<tonic::Response<proto::AllocateResponse>, Status> {
        let ids = request.into_inner().container_requests.remove(0).devices_ids;
        Ok(tonic::Response::new(FakePlugin::default().allocate(ids).await?))
    }

    async fn pre_start_container(
        &self,
        _: tonic::Request<proto::PreStartContainerRequest>,
    ) -> Result<tonic::Response<proto::PreStartContainerResponse>, Status> {
        Ok(tonic::Response::new(proto::PreStartContainerResponse {}))
    }
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_register_over_the_socket_and_stream_their_devices() {
    let dir = tempfile::tempdir().unwrap();
    // A socket left by an earlier run is removed at start.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("stale.sock")).unwrap());
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    let (tx, mut health) = tokio::sync::mpsc::unbounded_channel();
    m.set_health_updates(tx);
    m.start(HashSet::new()).unwrap();
    assert!(!dir.path().join("stale.sock").exists());

    let (devices, _) = tokio::sync::watch::channel(vec![dev("a", true, None), dev("b", true, None)]);
    let plugin = GrpcPlugin { devices: devices.clone(), stop: tokio_util::sync::CancellationToken::new() };
    let listener = tokio::net::UnixListener::bind(dir.path().join("p.sock")).unwrap();
    let stop = plugin.stop.clone();
    tokio::spawn(tonic::transport::Server::builder().serve_with_incoming_shutdown(
        proto::device_plugin_server::DevicePluginServer::new(plugin),
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        stop.clone().cancelled_owned(),
    ));
    let channel = connect_plugin(&m.socket()).await.unwrap();
    let mut reg = proto::registration_client::RegistrationClient::new(channel);
    let good = RegisterRequest {
        version: VERSION.into(),
        endpoint: "p.sock".into(),
        resource_name: RES.into(),
        options: None,
    };
    let e = reg.register(RegisterRequest { version: "v1".into(), ..good.clone() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert!(e.message().starts_with("requested API version \"v1\" is not supported by kubelet"), "{e}");
    let e = reg.register(RegisterRequest { endpoint: "nothing.sock".into(), ..good.clone() }).await.unwrap_err();
    assert!(e.message().contains("nothing.sock"), "{e}");
    reg.register(good).await.unwrap();
    eventually("two healthy devices", || m.extended_resources().allocatable.get(RES) == Some(&2)).await;

    devices.send_modify(|d| d[0].health = UNHEALTHY.into());
    eventually("one unhealthy device", || {
        let r = m.extended_resources();
        (r.capacity.get(RES), r.allocatable.get(RES)) == (Some(&2), Some(&1))
    })
    .await;
    // Allocation through the real client; the unhealthy device is never given out.
    let p = pod("u1", &[], &[("app", 1)]);
    let m2 = m.clone();
    let p2 = p.clone();
    tokio::task::spawn_blocking(move || admit(&m2, &p2, &[])).await.unwrap().unwrap();
    assert_eq!(ids(&m, "u1", "app"), BTreeSet::from(["b".to_string()]));
    let health_of = |m: &DeviceManager| {
        m.allocated_resources_status("u1", "app")
            .into_iter()
            .flat_map(|s| {
                s.resources.unwrap_or_default().into_iter().map(move |r| (s.name.clone(), r.resource_id, r.health))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(health_of(&m), [(RES.to_owned(), "b".to_owned(), Some("Healthy".to_owned()))]);
    assert!(health.try_recv().is_err(), "no pod held a device when health changed so far");
    // The device the pod holds turns unhealthy: the pod is to be synced, its status says so.
    devices.send_modify(|d| d[1].health = UNHEALTHY.into());
    let pods = tokio::time::timeout(Duration::from_secs(10), health.recv()).await.unwrap().unwrap();
    assert_eq!(pods, ["u1"]);
    assert_eq!(health_of(&m), [(RES.to_owned(), "b".to_owned(), Some("Unhealthy".to_owned()))]);

    // The plugin goes away: its devices are unhealthy, the resource stays (grace period).
    stop.cancel();
    eventually("the plugin's devices unhealthy", || {
        let r = m.extended_resources();
        (r.capacity.get(RES), r.allocatable.get(RES)) == (Some(&2), Some(&0))
    })
    .await;
    m.stop();
}

#[test]
fn a_recreated_node_zeroes_extended_resources_it_does_not_know() {
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let q = |v: &str| Quantity(v.into());
    let old = NodeStatus {
        capacity: Some([(RES.to_string(), q("4")), ("other.example/x".into(), q("1")), ("cpu".into(), q("2"))].into()),
        ..Default::default()
    };
    let mut new = NodeStatus {
        capacity: Some([(RES.to_string(), q("2")), ("cpu".into(), q("2"))].into()),
        allocatable: Some([(RES.to_string(), q("2"))].into()),
        ..Default::default()
    };
    zero_unknown_extended(&mut new, Some(&old));
    let cap = new.capacity.unwrap();
    assert_eq!(cap[RES], q("2"));
    assert_eq!(cap["other.example/x"], q("0"));
    assert_eq!(new.allocatable.unwrap()["other.example/x"], q("0"));
    // Without a checkpoint the manager asks for the reset; with one it does not.
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ENDPOINT_STOP_GRACE);
    assert!(m.extended_resources().reset_unknown);
    register_default(&m, vec![dev("a", true, None)]);
    admit(&m, &pod("u1", &[], &[("app", 1)]), &[]).unwrap();
    assert!(!m.extended_resources().reset_unknown);
}
