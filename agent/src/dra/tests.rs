//! DRA manager tests: fake DRA plugins serving `DRAPlugin` over unix sockets in a
//! temporary directory, the fake claim source, the real checkpoint file.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::proto::dra_plugin_server::{DraPlugin, DraPluginServer};
use super::*;

const GPU: &str = "gpu.example.com";
const NIC: &str = "nic.example.com";
const NODE: &str = "node-1";
const BOOT: &str = "boot-1";

/// One call a fake plugin got: the method and the claims as (namespace, uid, name).
type Call = (&'static str, Vec<(String, String, String)>);

/// A DRA plugin that records its calls and answers each claim with the devices set for
/// it (by claim name), by default one device `<claim>-0` serving request `gpu` with CDI
/// id `<driver>/dev=<claim>`.
#[derive(Clone, Default)]
struct FakePlugin {
    driver: String,
    calls: Arc<Mutex<Vec<Call>>>,
    devices: Arc<Mutex<HashMap<String, Vec<proto::Device>>>>,
    claim_error: Arc<Mutex<Option<String>>>,
}

impl FakePlugin {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn methods(&self) -> Vec<&'static str> {
        self.calls().into_iter().map(|c| c.0).collect()
    }

    fn record(&self, method: &'static str, claims: &[proto::Claim]) {
        let claims = claims.iter().map(|c| (c.namespace.clone(), c.uid.clone(), c.name.clone())).collect();
        self.calls.lock().unwrap().push((method, claims));
    }

    fn devices_for(&self, claim: &proto::Claim) -> Vec<proto::Device> {
        self.devices.lock().unwrap().get(&claim.name).cloned().unwrap_or_else(|| {
            vec![device(&["gpu"], &format!("{}-0", claim.name), &[&format!("{}/dev={}", self.driver, claim.name)])]
        })
    }
}

fn device(requests: &[&str], name: &str, cdi: &[&str]) -> proto::Device {
    proto::Device {
        request_names: requests.iter().map(|r| (*r).to_owned()).collect(),
        pool_name: NODE.into(),
        device_name: name.into(),
        cdi_device_ids: cdi.iter().map(|c| (*c).to_owned()).collect(),
        share_id: None,
    }
}

#[tonic::async_trait]
impl DraPlugin for FakePlugin {
    async fn node_prepare_resources(
        &self,
        r: Request<proto::NodePrepareResourcesRequest>,
    ) -> Result<Response<proto::NodePrepareResourcesResponse>, Status> {
        let r = r.into_inner();
        self.record("NodePrepareResources", &r.claims);
        let error = self.claim_error.lock().unwrap().clone().unwrap_or_default();
        let claims = r
            .claims
            .iter()
            .map(|c| {
                let devices = if error.is_empty() { self.devices_for(c) } else { Vec::new() };
                (c.uid.clone(), proto::NodePrepareResourceResponse { devices, error: error.clone() })
            })
            .collect();
        Ok(Response::new(proto::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        r: Request<proto::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<proto::NodeUnprepareResourcesResponse>, Status> {
        let r = r.into_inner();
        self.record("NodeUnprepareResources", &r.claims);
        let claims =
            r.claims.iter().map(|c| (c.uid.clone(), proto::NodeUnprepareResourceResponse::default())).collect();
        Ok(Response::new(proto::NodeUnprepareResourcesResponse { claims }))
    }
}

/// Serves a fake plugin of `driver` on `<dir>/<driver>.sock`.
fn serve(dir: &Path, driver: &str) -> (FakePlugin, PathBuf) {
    let socket = dir.join(format!("{driver}.sock"));
    let plugin = FakePlugin { driver: driver.into(), ..FakePlugin::default() };
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = DraPluginServer::new(plugin.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    (plugin, socket)
}

/// A v1 server answering under the v1beta1 service name, as a plugin that only serves
/// `v1beta1.DRAPlugin` does (the messages are the same on the wire).
#[derive(Clone)]
struct AsV1Beta1<S>(S);

impl<S> tonic::server::NamedService for AsV1Beta1<S> {
    const NAME: &'static str = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin";
}

impl<S, B> tower::Service<http::Request<B>> for AsV1Beta1<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().replace(".dra.v1beta1.", ".dra.v1.");
        *req.uri_mut() = http::Uri::builder().path_and_query(path).build().unwrap();
        self.0.call(req)
    }
}

/// Serves a fake v1beta1-only plugin of `driver` on `<dir>/<driver>.sock`.
fn serve_v1beta1(dir: &Path, driver: &str) -> (FakePlugin, PathBuf) {
    let socket = dir.join(format!("{driver}.sock"));
    let plugin = FakePlugin { driver: driver.into(), ..FakePlugin::default() };
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = AsV1Beta1(DraPluginServer::new(plugin.clone()));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    (plugin, socket)
}

fn manager_in(root: &Path, source: &Arc<FakeClaimSource>, boot: &str) -> DraManager {
    let options = Options { boot_id: Some(boot.into()), ..Options::default() };
    DraManager::with_options(root, NODE, source.clone(), options).unwrap()
}

struct Env {
    dir: tempfile::TempDir,
    source: Arc<FakeClaimSource>,
    manager: DraManager,
    gpu: FakePlugin,
    gpu_socket: PathBuf,
    nic: FakePlugin,
    nic_socket: PathBuf,
}

/// A manager with both fake drivers registered.
async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(FakeClaimSource::new());
    let manager = manager_in(&dir.path().join("root"), &source, BOOT);
    let (gpu, gpu_socket) = serve(dir.path(), GPU);
    let (nic, nic_socket) = serve(dir.path(), NIC);
    let env = Env { dir, source, manager, gpu, gpu_socket, nic, nic_socket };
    env.register_all(&env.manager).await;
    env
}

impl Env {
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    async fn register_all(&self, m: &DraManager) {
        m.register(GPU, &self.gpu_socket, &["v1.DRAPlugin".into()]).await.unwrap();
        m.register(NIC, &self.nic_socket, &["v1.DRAPlugin".into(), "v1beta1.DRAPlugin".into()]).await.unwrap();
    }

    /// Claim `name` (uid `<name>-uid`) allocated with `results` (request, driver, device)
    /// and reserved for `pods` (uids).
    fn claim(&self, name: &str, results: &[(&str, &str, &str)], pods: &[&str]) {
        self.source.put(claim(name, results, pods));
    }
}

fn claim(name: &str, results: &[(&str, &str, &str)], pods: &[&str]) -> ResourceClaim {
    let results: Vec<Value> = results
        .iter()
        .map(|(request, driver, device)| json!({"request": request, "driver": driver, "pool": NODE, "device": device}))
        .collect();
    let reserved: Vec<Value> = pods.iter().map(|p| json!({"resource": "pods", "name": p, "uid": p})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid")},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
    }))
    .unwrap()
}

/// A container's claims: (pod claim name, request).
type ContainerClaims<'a> = &'a [(&'a str, Option<&'a str>)];

/// Pod `uid` (also its name) using `claims` (pod claim name → `ResourceClaim` name), with
/// `containers` as (name, claims).
fn pod(uid: &str, claims: &[(&str, &str)], containers: &[(&str, ContainerClaims<'_>)]) -> Pod {
    let claims: Vec<Value> = claims.iter().map(|(n, c)| json!({"name": n, "resourceClaimName": c})).collect();
    let containers: Vec<Value> = containers
        .iter()
        .map(|(name, refs)| {
            let refs: Vec<Value> = refs
                .iter()
                .map(|(n, r)| match r {
                    Some(r) => json!({"name": n, "request": r}),
                    None => json!({"name": n}),
                })
                .collect();
            json!({"name": name, "image": "x", "resources": {"claims": refs}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": containers, "resourceClaims": claims}
    }))
    .unwrap()
}

fn container<'a>(p: &'a Pod, name: &str) -> &'a k8s_openapi::api::core::v1::Container {
    p.spec.as_ref().unwrap().containers.iter().find(|c| c.name == name).unwrap()
}

/// The CDI devices `pre_create_container` leaves in a config that had `initial`.
fn cdi_of(m: &DraManager, p: &Pod, c: &str, initial: &[&str]) -> Result<Vec<String>, String> {
    let mut config = api::ContainerConfig {
        cdi_devices: initial.iter().map(|n| api::CdiDevice { name: (*n).to_owned() }).collect(),
        ..Default::default()
    };
    m.pre_create_container(p, container(p, c), &mut config)?;
    Ok(config.cdi_devices.into_iter().map(|d| d.name).collect())
}

fn ids(claims: &[(&str, &str)]) -> Vec<(String, String, String)> {
    claims.iter().map(|(uid, name)| ("default".to_owned(), (*uid).to_owned(), (*name).to_owned())).collect()
}

#[tokio::test]
async fn prepare_calls_each_driver_once_per_claim() {
    let env = env().await;
    env.claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1"]);
    // One claim with devices of both drivers.
    env.claim("both", &[("gpu", GPU, "gpu-1"), ("nic", NIC, "nic-0")], &["p1"]);
    let p = pod("p1", &[("a", "gpus"), ("b", "both")], &[("c", &[("a", None)])]);
    env.manager.prepare_resources(&p).await.unwrap();
    assert_eq!(env.gpu.calls(), vec![("NodePrepareResources", ids(&[("gpus-uid", "gpus"), ("both-uid", "both")]))]);
    assert_eq!(env.nic.calls(), vec![("NodePrepareResources", ids(&[("both-uid", "both")]))]);
    let both = env.manager.claim("default", "both").unwrap();
    assert!(both.prepared);
    assert_eq!(both.pod_uids, BTreeSet::from(["p1".to_owned()]));
    assert_eq!(both.driver_state[NIC].devices[0].cdi_device_ids, ["nic.example.com/dev=both"]);
    // Preparing the same pod again (a new sandbox) calls no driver.
    env.manager.prepare_resources(&p).await.unwrap();
    assert_eq!(env.gpu.calls().len(), 1);
    assert_eq!(env.nic.calls().len(), 1);
    // The checkpoint has it.
    let cp = checkpoint::read(&DraManager::state_file(&env.root())).unwrap().unwrap();
    assert_eq!(cp.claims.len(), 2);
    assert!(cp.claims.iter().all(|c| c.prepared));
}

#[tokio::test]
async fn cdi_devices_reach_only_the_containers_that_use_the_claim() {
    let env = env().await;
    env.claim("gpus", &[("a", GPU, "gpu-0"), ("b", GPU, "gpu-1")], &["p1"]);
    env.gpu.devices.lock().unwrap().insert(
        "gpus".into(),
        vec![
            device(&["a"], "gpu-0", &["vendor.com/gpu=0", "vendor.com/gpu=common"]),
            device(&["b"], "gpu-1", &["vendor.com/gpu=1", "vendor.com/gpu=common"]),
        ],
    );
    let p = pod(
        "p1",
        &[("g", "gpus")],
        &[
            ("all", &[("g", None)]),
            ("only-a", &[("g", Some("a"))]),
            ("both-named", &[("g", Some("a")), ("g", Some("b"))]),
            ("none", &[]),
        ],
    );
    env.manager.prepare_resources(&p).await.unwrap();
    assert_eq!(
        cdi_of(&env.manager, &p, "all", &[]).unwrap(),
        ["vendor.com/gpu=0", "vendor.com/gpu=common", "vendor.com/gpu=1"],
        "every device, each id once"
    );
    assert_eq!(cdi_of(&env.manager, &p, "only-a", &[]).unwrap(), ["vendor.com/gpu=0", "vendor.com/gpu=common"]);
    assert_eq!(
        cdi_of(&env.manager, &p, "both-named", &["vendor.com/gpu=1"]).unwrap(),
        ["vendor.com/gpu=1", "vendor.com/gpu=0", "vendor.com/gpu=common"],
        "ids already in the config are not added again"
    );
    assert_eq!(cdi_of(&env.manager, &p, "none", &[]).unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn each_container_claim_has_its_devices_in_the_allocated_resources_status() {
    let env = env().await;
    env.claim("gpus", &[("a", GPU, "gpu-0"), ("b", GPU, "gpu-1")], &["p1"]);
    env.gpu.devices.lock().unwrap().insert(
        "gpus".into(),
        vec![device(&["a"], "gpu-0", &["vendor.com/gpu=0", "vendor.com/gpu=common"]), device(&["b"], "gpu-1", &[])],
    );
    let p = pod(
        "p1",
        &[("g", "gpus"), ("later", "not-prepared")],
        &[("all", &[("g", None), ("later", None)]), ("sub", &[("g", Some("b/sub"))]), ("none", &[])],
    );
    env.manager.prepare_resources(&pod("p1", &[("g", "gpus")], &[])).await.unwrap();
    let status = |c: &str| -> Vec<(String, Vec<(String, String)>)> {
        env.manager
            .allocated_resources_status(&p, container(&p, c))
            .into_iter()
            .map(|s| {
                let devices = s.resources.unwrap_or_default();
                (s.name, devices.into_iter().map(|r| (r.resource_id, r.health.unwrap_or_default())).collect())
            })
            .collect()
    };
    // Every device of the claim, by its first CDI id or as driver/pool/device; a claim
    // not prepared here is left out; health unknown (no health stream is watched).
    let unknown = |id: &str| (id.to_owned(), "Unknown".to_owned());
    assert_eq!(
        status("all"),
        [("claim:g".to_owned(), vec![unknown("vendor.com/gpu=0"), unknown(&format!("{GPU}/{NODE}/gpu-1"))])]
    );
    // A subrequest is served by its request's devices.
    assert_eq!(status("sub"), [("claim:g/b/sub".to_owned(), vec![unknown(&format!("{GPU}/{NODE}/gpu-1"))])]);
    assert!(status("none").is_empty());
}

#[tokio::test]
async fn a_container_of_an_unprepared_claim_is_refused() {
    let env = env().await;
    let p = pod("p1", &[("g", "gpus")], &[("c", &[("g", None)])]);
    let e = cdi_of(&env.manager, &p, "c", &[]).unwrap_err();
    assert_eq!(e, "ResourceClaim default/gpus used by container \"c\" is not prepared on this node");
}

#[tokio::test]
async fn a_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod() {
    let env = env().await;
    env.claim("shared", &[("gpu", GPU, "gpu-0")], &["p1", "p2"]);
    let p1 = pod("p1", &[("g", "shared")], &[("c", &[("g", None)])]);
    let p2 = pod("p2", &[("g", "shared")], &[("c", &[("g", None)])]);
    env.manager.prepare_resources(&p1).await.unwrap();
    env.manager.prepare_resources(&p2).await.unwrap();
    assert_eq!(env.gpu.methods(), ["NodePrepareResources"]);
    assert_eq!(cdi_of(&env.manager, &p2, "c", &[]).unwrap(), ["gpu.example.com/dev=shared"]);
    assert_eq!(env.manager.claim("default", "shared").unwrap().pod_uids.len(), 2);

    env.manager.unprepare_resources(&p1).await.unwrap();
    assert_eq!(env.gpu.methods(), ["NodePrepareResources"], "p2 still uses the claim");
    assert!(!env.manager.pod_might_need_to_unprepare("p1"));
    assert!(env.manager.pod_might_need_to_unprepare("p2"));
    // Unprepare is idempotent.
    env.manager.unprepare_resources(&p1).await.unwrap();
    assert_eq!(env.gpu.methods().len(), 1);

    env.manager.unprepare_resources(&p2).await.unwrap();
    assert_eq!(
        env.gpu.calls()[1],
        ("NodeUnprepareResources", ids(&[("shared-uid", "shared")])),
        "the last user gone, the claim is unprepared"
    );
    assert!(env.manager.claim("default", "shared").is_none());
    assert!(!env.manager.pod_might_need_to_unprepare("p2"));
    let cp = checkpoint::read(&DraManager::state_file(&env.root())).unwrap().unwrap();
    assert!(cp.claims.is_empty());
    env.manager.unprepare_resources(&p2).await.unwrap();
    assert_eq!(env.gpu.methods().len(), 2);
}

#[tokio::test]
async fn claims_that_cannot_be_used_are_refused_with_upstreams_words() {
    let env = env().await;
    let p = pod("p1", &[("g", "gpus")], &[("c", &[("g", None)])]);
    let prepare_err = |p: Pod| {
        let m = env.manager.clone();
        async move { m.prepare_resources(&p).await.unwrap_err().to_string() }
    };

    assert_eq!(
        prepare_err(p.clone()).await,
        "prepare dynamic resources: fetch ResourceClaim gpus: resourceclaims.resource.k8s.io \"gpus\" not found"
    );

    env.claim("gpus", &[("gpu", GPU, "gpu-0")], &["someone-else"]);
    assert_eq!(
        prepare_err(p.clone()).await,
        "prepare dynamic resources: pod p1 (p1) is not allowed to use ResourceClaim gpus (gpus-uid)"
    );

    let mut unallocated = claim("gpus", &[], &["p1"]);
    unallocated.status.as_mut().unwrap().allocation = None;
    env.source.put(unallocated);
    assert_eq!(prepare_err(p.clone()).await, "prepare dynamic resources: ResourceClaim gpus: not allocated");

    env.claim("gpus", &[("gpu", "absent.example.com", "dev-0")], &["p1"]);
    assert_eq!(
        prepare_err(p.clone()).await,
        "prepare dynamic resources: DRA driver absent.example.com is not registered"
    );

    let mut skipping = claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1"]);
    skipping
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0]
        .skip_node_operations = Some(vec!["All".into()]);
    env.source.put(skipping);
    assert_eq!(
        prepare_err(p.clone()).await,
        "prepare dynamic resources: ResourceClaim gpus: DRAOptionalNodeOperations feature gate is disabled on kubelet"
    );

    let from_template: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1", "namespace": "default", "uid": "p1"},
        "spec": {"containers": [], "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]}
    }))
    .unwrap();
    assert_eq!(
        prepare_err(from_template).await,
        "prepare dynamic resources: pod \"default/p1\": ResourceClaim not created yet"
    );

    // Nothing was recorded on the way: the pod needs no unprepare, no driver was called.
    assert!(!env.manager.pod_might_need_to_unprepare("p1"));
    assert!(env.gpu.calls().is_empty());
    assert!(env.manager.unprepare_resources(&p).await.is_ok());
}

#[tokio::test]
async fn a_drivers_error_fails_the_prepare_and_a_retry_prepares() {
    let env = env().await;
    env.claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1"]);
    let p = pod("p1", &[("g", "gpus")], &[("c", &[("g", None)])]);
    *env.gpu.claim_error.lock().unwrap() = Some("device is busy".into());
    let e = env.manager.prepare_resources(&p).await.unwrap_err().to_string();
    assert_eq!(e, "prepare dynamic resources: NodePrepareResources failed for ResourceClaim gpus: device is busy");
    // Recorded as a user, not prepared: the pod must be unprepared before it goes.
    assert!(env.manager.pod_might_need_to_unprepare("p1"));
    assert!(!env.manager.claim("default", "gpus").unwrap().prepared);

    *env.gpu.claim_error.lock().unwrap() = None;
    env.manager.prepare_resources(&p).await.unwrap();
    assert!(env.manager.claim("default", "gpus").unwrap().prepared);
    assert_eq!(env.gpu.methods(), ["NodePrepareResources", "NodePrepareResources"]);
}

#[tokio::test]
async fn a_driver_that_went_away_fails_the_unprepare_until_it_is_back() {
    let env = env().await;
    env.claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1"]);
    let p = pod("p1", &[("g", "gpus")], &[("c", &[("g", None)])]);
    env.manager.prepare_resources(&p).await.unwrap();
    env.manager.deregister(GPU).await;
    let e = env.manager.unprepare_resources(&p).await.unwrap_err().to_string();
    assert_eq!(e, "unprepare dynamic resources: DRA driver gpu.example.com is not registered");
    // Meanwhile no other pod may start using the claim being unprepared.
    env.claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1", "p2"]);
    env.manager.register(GPU, &env.gpu_socket, &["v1.DRAPlugin".into()]).await.unwrap();
    let p2 = pod("p2", &[("g", "gpus")], &[("c", &[("g", None)])]);
    let e = env.manager.prepare_resources(&p2).await.unwrap_err().to_string();
    assert_eq!(e, "prepare dynamic resources: ResourceClaim gpus is being unprepared");
    env.manager.unprepare_resources(&p).await.unwrap();
    assert_eq!(env.gpu.methods(), ["NodePrepareResources", "NodeUnprepareResources"]);
    assert!(env.manager.claim("default", "gpus").is_none());
}

#[tokio::test]
async fn a_restarted_agent_keeps_prepared_claims() {
    let env = env().await;
    env.claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1", "p2"]);
    let p1 = pod("p1", &[("g", "gpus")], &[("c", &[("g", None)])]);
    let p2 = pod("p2", &[("g", "gpus")], &[("c", &[("g", None)])]);
    env.manager.prepare_resources(&p1).await.unwrap();

    // The same boot: the claim is known prepared, before any driver is back.
    let restarted = manager_in(&env.root(), &env.source, BOOT);
    assert_eq!(cdi_of(&restarted, &p1, "c", &[]).unwrap(), ["gpu.example.com/dev=gpus"]);
    assert!(restarted.pod_might_need_to_unprepare("p1"));
    env.register_all(&restarted).await;
    restarted.prepare_resources(&p2).await.unwrap();
    assert_eq!(env.gpu.methods(), ["NodePrepareResources"], "no second NodePrepareResources");
    assert_eq!(restarted.claim("default", "gpus").unwrap().pod_uids.len(), 2);

    // After a reboot the drivers' CDI specs are gone: the claim is prepared again.
    let rebooted = manager_in(&env.root(), &env.source, "boot-2");
    env.register_all(&rebooted).await;
    rebooted.prepare_resources(&p1).await.unwrap();
    assert_eq!(env.gpu.methods(), ["NodePrepareResources", "NodePrepareResources"]);
    assert_eq!(cdi_of(&rebooted, &p2, "c", &[]).unwrap(), ["gpu.example.com/dev=gpus"]);
}

#[tokio::test]
async fn a_corrupt_checkpoint_stops_the_manager() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(STATE_FILE), "{\"Data\":\"{}\",\"Checksum\":1}").unwrap();
    let source = Arc::new(FakeClaimSource::new());
    let e = DraManager::with_options(dir.path(), NODE, source, Options::default()).unwrap_err();
    assert!(matches!(e, Error::State(checkpoint::Error::Corrupt { .. })), "{e:?}");
}

#[tokio::test]
async fn inactive_pods_are_unprepared_by_the_reconcile() {
    let env = env().await;
    env.claim("a", &[("gpu", GPU, "gpu-0")], &["p1"]);
    env.claim("b", &[("nic", NIC, "nic-0")], &["p2"]);
    env.manager.prepare_resources(&pod("p1", &[("g", "a")], &[])).await.unwrap();
    env.manager.prepare_resources(&pod("p2", &[("n", "b")], &[])).await.unwrap();
    env.manager.unprepare_inactive(&HashSet::from(["p2".to_owned()])).await;
    assert_eq!(env.gpu.methods(), ["NodePrepareResources", "NodeUnprepareResources"]);
    assert_eq!(env.nic.methods(), ["NodePrepareResources"]);
    assert!(env.manager.claim("default", "a").is_none());
    assert!(env.manager.claim("default", "b").is_some());
}

#[tokio::test]
async fn extended_resources_served_by_dra_get_their_requests_devices() {
    let env = env().await;
    env.claim(
        "p1-extended-resources",
        &[("container-0-request-0", GPU, "gpu-0"), ("container-1-request-0", GPU, "gpu-1")],
        &["p1"],
    );
    env.gpu.devices.lock().unwrap().insert(
        "p1-extended-resources".into(),
        vec![
            device(&["container-0-request-0"], "gpu-0", &["vendor.com/gpu=0"]),
            device(&["container-1-request-0"], "gpu-1", &["vendor.com/gpu=1"]),
        ],
    );
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1", "namespace": "default", "uid": "p1"},
        "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"example.com/gpu": "1"}}},
            {"name": "b", "resources": {"requests": {"example.com/gpu": "1"}}},
            {"name": "c"}
        ]},
        "status": {"extendedResourceClaimStatus": {"resourceClaimName": "p1-extended-resources", "requestMappings": [
            {"containerName": "a", "resourceName": "example.com/gpu", "requestName": "container-0-request-0"},
            {"containerName": "b", "resourceName": "example.com/gpu", "requestName": "container-1-request-0"}
        ]}}
    }))
    .unwrap();
    env.manager.prepare_resources(&p).await.unwrap();
    assert_eq!(cdi_of(&env.manager, &p, "a", &[]).unwrap(), ["vendor.com/gpu=0"]);
    assert_eq!(cdi_of(&env.manager, &p, "b", &[]).unwrap(), ["vendor.com/gpu=1"]);
    assert_eq!(cdi_of(&env.manager, &p, "c", &[]).unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn registration_needs_a_service_the_agent_speaks() {
    let env = env().await;
    let e =
        env.manager.register("x.example.com", Path::new("/x.sock"), &["v1alpha3.DRAPlugin".into()]).await.unwrap_err();
    assert_eq!(
        e,
        "invalid supported gRPC versions of DRA driver plugin x.example.com at endpoint /x.sock: none of services supported by the plugin ([\"v1alpha3.DRAPlugin\"]) are supported by the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"
    );
    assert!(!env.manager.is_registered("x.example.com"));
}

#[tokio::test]
async fn metrics_follow_operations_and_claims() {
    let env = env().await;
    let mut registry = Registry::default();
    let metrics = DraMetrics::new(&mut registry);
    let source = env.source.clone();
    let m = DraManager::with_options(
        &env.root(),
        NODE,
        source,
        Options { boot_id: Some(BOOT.into()), ..Options::default() },
    )
    .unwrap()
    .with_metrics(metrics);
    registry.register_collector(Box::new(m.claims_in_use_collector()));
    env.register_all(&m).await;
    env.claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1"]);
    m.prepare_resources(&pod("p1", &[("g", "gpus")], &[])).await.unwrap();
    let _ = m.prepare_resources(&pod("p2", &[("g", "gpus")], &[])).await.unwrap_err();
    let mut text = String::new();
    prometheus_client::encoding::text::encode_registry(&mut text, &registry).unwrap();
    for line in [
        "dra_operations_duration_seconds_count{is_error=\"false\",operation_name=\"PrepareResources\"} 1",
        "dra_operations_duration_seconds_count{is_error=\"true\",operation_name=\"PrepareResources\"} 1",
        "dra_grpc_operations_duration_seconds_count{driver_name=\"gpu.example.com\",grpc_status_code=\"OK\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources\"} 1",
        "dra_resource_claims_in_use{driver_name=\"<any>\"} 1",
        "dra_resource_claims_in_use{driver_name=\"gpu.example.com\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert!(!text.contains("driver_name=\"nic.example.com\"} "), "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_driver_back_within_the_grace_period_keeps_its_slices() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(FakeClaimSource::new());
    let m = manager_in(dir.path(), &source, BOOT);
    let socket = dir.path().join("gpu.sock");
    let v1 = ["v1.DRAPlugin".to_owned()];
    m.register(GPU, &socket, &v1).await.unwrap();

    m.deregister(GPU).await;
    assert!(m.wipe_pending(GPU));
    tokio::time::sleep(WIPING_DELAY.saturating_sub(Duration::from_secs(1))).await;
    m.register(GPU, &socket, &v1).await.unwrap();
    assert!(!m.wipe_pending(GPU));
    tokio::time::sleep(WIPING_DELAY * 2).await;
    assert_eq!(source.deletions(), Vec::new());

    // Gone for good: its slices are deleted once the delay is over, failures retried.
    source.fail_next_deletions(1);
    m.deregister(GPU).await;
    tokio::time::sleep(WIPING_DELAY.saturating_sub(Duration::from_secs(1))).await;
    assert_eq!(source.deletions(), Vec::new());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(source.deletions(), vec![(Some(GPU.to_owned()), NODE.to_owned())]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(source.deletions().len(), 2, "the failed deletion is tried again");
    assert!(!m.wipe_pending(GPU));
    tokio::time::sleep(WIPING_DELAY * 10).await;
    assert_eq!(source.deletions().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_rolling_update_keeps_the_driver_registered() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(FakeClaimSource::new());
    let m = manager_in(dir.path(), &source, BOOT);
    let v1 = ["v1.DRAPlugin".to_owned()];
    m.register(GPU, &dir.path().join("old.sock"), &v1).await.unwrap();
    m.register(GPU, &dir.path().join("new.sock"), &v1).await.unwrap();
    // The old plugin leaves: the new one serves on.
    m.deregister(GPU).await;
    assert!(m.is_registered(GPU));
    assert!(!m.wipe_pending(GPU));
    assert_eq!(m.inner.plugins.get(GPU).unwrap().endpoint, dir.path().join("new.sock"));
    m.deregister(GPU).await;
    assert!(!m.is_registered(GPU));
    assert!(m.wipe_pending(GPU));
}

#[tokio::test(start_paused = true)]
async fn start_wipes_the_nodes_slices_of_every_driver() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(FakeClaimSource::new());
    let m = manager_in(dir.path(), &source, BOOT);
    source.fail_next_deletions(2);
    m.start();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(source.deletions(), vec![(None, NODE.to_owned()); 3]);
    m.stop();
}

#[tokio::test]
async fn a_v1beta1_plugin_is_called_on_its_service() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(FakeClaimSource::new());
    let m = manager_in(&dir.path().join("root"), &source, BOOT);
    let (old, socket) = serve_v1beta1(dir.path(), GPU);
    source.put(claim("gpus", &[("gpu", GPU, "gpu-0")], &["p1"]));
    let p = pod("p1", &[("g", "gpus")], &[("c", &[("g", None)])]);

    // Told the wrong service, the agent's call finds nothing there.
    m.register(GPU, &socket, &["v1.DRAPlugin".into()]).await.unwrap();
    let e = m.prepare_resources(&p).await.unwrap_err().to_string();
    assert!(e.starts_with("prepare dynamic resources: NodePrepareResources: rpc error: code = Unimplemented"), "{e}");

    m.deregister(GPU).await;
    m.register(GPU, &socket, &["v1alpha4.DRAPlugin".into(), "v1beta1.DRAPlugin".into()]).await.unwrap();
    m.prepare_resources(&p).await.unwrap();
    assert_eq!(old.calls(), vec![("NodePrepareResources", ids(&[("gpus-uid", "gpus")]))]);
    assert_eq!(cdi_of(&m, &p, "c", &[]).unwrap(), ["gpu.example.com/dev=gpus"]);
    m.unprepare_resources(&p).await.unwrap();
    assert_eq!(old.methods(), ["NodePrepareResources", "NodeUnprepareResources"]);
}

/// A plugin's `DRAResourceHealth` service (served as v1alpha1): every stream sends what
/// the test puts on `reports`; `streams` counts the streams opened.
#[derive(Clone)]
struct FakeHealth {
    reports: tokio::sync::broadcast::Sender<health::proto::NodeWatchResourcesResponse>,
    streams: Arc<std::sync::atomic::AtomicUsize>,
}

#[tonic::async_trait]
impl health::proto_v1alpha1::dra_resource_health_server::DraResourceHealth for FakeHealth {
    type NodeWatchResourcesStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<health::proto_v1alpha1::NodeWatchResourcesResponse, Status>> + Send>,
    >;

    async fn node_watch_resources(
        &self,
        _: Request<health::proto_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        use prost::Message as _;
        let rx = self.reports.subscribe();
        self.streams.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            let report = rx.recv().await.ok()?;
            // The same message on the wire in either version.
            let bytes = report.encode_to_vec();
            let v1alpha1 = health::proto_v1alpha1::NodeWatchResourcesResponse::decode(bytes.as_slice()).unwrap();
            Some((Ok(v1alpha1), rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Serves a fake plugin of `driver` with a v1alpha1 health service on `<dir>/<driver>.sock`.
fn serve_with_health(dir: &Path, driver: &str) -> (FakePlugin, FakeHealth, PathBuf) {
    let socket = dir.join(format!("{driver}.sock"));
    let plugin = FakePlugin { driver: driver.into(), ..FakePlugin::default() };
    let health = FakeHealth { reports: tokio::sync::broadcast::channel(16).0, streams: Arc::default() };
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = DraPluginServer::new(plugin.clone());
    let health_server =
        health::proto_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(health.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(server)
            .add_service(health_server)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    (plugin, health, socket)
}

fn device_health(device: &str, health: health::proto::HealthStatus, message: &str) -> health::proto::DeviceHealth {
    health::proto::DeviceHealth {
        device: Some(health::proto::DeviceIdentifier { pool_name: NODE.into(), device_name: device.into() }),
        health: health.into(),
        last_updated_time: 0,
        health_check_timeout_seconds: 0,
        message: message.into(),
    }
}

/// Polls `check` every 20 ms for up to 10 s.
async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drivers_health_reports_reach_the_status_of_the_pods_holding_its_devices() {
    use health::proto::HealthStatus::{Healthy, Unhealthy};
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(FakeClaimSource::new());
    let root = dir.path().join("root");
    let m = manager_in(&root, &source, BOOT);
    let (tx, mut updates) = tokio::sync::mpsc::unbounded_channel();
    m.set_health_updates(tx);
    let (_plugin, fake, socket) = serve_with_health(dir.path(), GPU);
    m.register(GPU, &socket, &["v1.DRAPlugin".into(), "v1alpha1.DRAResourceHealth".into()]).await.unwrap();
    source.put(claim("gpus", &[("gpu", GPU, "gpus-0")], &["p1"]));
    let p = pod("p1", &[("g", "gpus")], &[("c", &[("g", None)])]);
    m.prepare_resources(&p).await.unwrap();
    let status = |m: &DraManager| {
        let s = m.allocated_resources_status(&p, container(&p, "c"));
        let r = &s[0].resources.as_ref().unwrap()[0];
        (r.health.clone().unwrap_or_default(), r.message.clone())
    };
    assert_eq!(status(&m), ("Unknown".to_owned(), None), "nothing reported yet");
    wait_until("the health stream open", || fake.streams.load(std::sync::atomic::Ordering::SeqCst) == 1).await;

    // A device no pod holds: nothing to sync. The pod's device: its pod is synced.
    fake.reports
        .send(health::proto::NodeWatchResourcesResponse { devices: vec![device_health("other", Unhealthy, "")] })
        .unwrap();
    let held = |h, message: &str| health::proto::NodeWatchResourcesResponse {
        devices: vec![device_health("other", Unhealthy, ""), device_health("gpus-0", h, message)],
    };
    fake.reports.send(held(Unhealthy, "ECC errors")).unwrap();
    let pods = tokio::time::timeout(Duration::from_secs(10), updates.recv()).await.unwrap().unwrap();
    assert_eq!(pods, ["p1"]);
    assert_eq!(status(&m), ("Unhealthy".to_owned(), Some("ECC errors".to_owned())));
    fake.reports.send(held(Healthy, "")).unwrap();
    let pods = tokio::time::timeout(Duration::from_secs(10), updates.recv()).await.unwrap().unwrap();
    assert_eq!(pods, ["p1"]);
    assert_eq!(status(&m), ("Healthy".to_owned(), None));

    // A restarted agent reads the health checkpoint (the report still holds).
    let restarted = manager_in(&root, &source, BOOT);
    assert_eq!(status(&restarted).0, "Healthy");
    // The plugin gone: its stream stops and its devices are unknown again.
    m.deregister(GPU).await;
    wait_until("the device unknown", || status(&m).0 == "Unknown").await;
    m.stop();
    restarted.stop();
}

#[tokio::test]
async fn a_driver_that_advertises_health_but_does_not_serve_it_is_not_watched_again() {
    let dir = tempfile::tempdir().unwrap();
    // Serves DRAPlugin only: the health call answers Unimplemented.
    let (_plugin, socket) = serve(dir.path(), GPU);
    let cache = Arc::new(health::HealthCache::default());
    let watch = health::watch(
        GPU.to_owned(),
        socket,
        "v1.DRAResourceHealth",
        cache,
        |_: &str, _: Vec<health::DeviceHealth>| panic!("no report"),
        CancellationToken::new(),
    );
    tokio::time::timeout(Duration::from_secs(10), watch).await.expect("the watch ends at Unimplemented");
}
