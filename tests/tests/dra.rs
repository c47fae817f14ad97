//! Dynamic Resource Allocation on a swiftlet node of the test bed's real control plane:
//! upstream's DRA test driver publishes the node's devices and registers with the agent
//! through `<root-dir>/plugins_registry`, the real scheduler allocates a claim from them,
//! and the agent prepares it before the pod's sandbox, hands the container the driver's
//! CDI device, and unprepares it once the pod is gone. The first two tests run the driver
//! as clusters do, as a `DaemonSet` pod on the node run by the agent under test; the
//! extended-resource test runs it as a process beside the agent.
//!
//! CDI needs containerd 1.7 or later: in the node container (containerd 2.x,
//! `SWIFTLET_E2E_NODE=containerd2`) the container sees the device's environment; the
//! host's containerd 1.6 ignores CDI devices, so there the test checks everything up to
//! the CRI config (the prepared claim, the spec the driver wrote, the agent's state).
//!
//! A prepared claim survives an agent crash: the agent killed with SIGKILL and started
//! again on the same root dir restores its `dra_manager_state`, leaves the running
//! containers (the user's and the driver's own pod) and the prepared claim alone (the
//! driver is not asked again), registers the driver again, and unprepares the claim from
//! the checkpoint once the pod is deleted.
//!
//! An extended resource backed by DRA (a device class with `extendedResourceName`,
//! `DRAExtendedResource`): the scheduler makes the pod's claim, the agent admits the pod
//! although its node reports no such resource, prepares the claim and gives the container
//! its CDI device.

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use swiftlet_tests::cluster::{Cluster, ClusterNode, phase};
use swiftlet_tests::dra_driver::{DRIVER, Deployment, DraTestDriver};
use swiftlet_tests::pods::BUSYBOX;
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, eventually, tail, testbed_lock};

const WAIT: Duration = Duration::from_secs(90);

fn logs(agent: &swiftlet_tests::Agent, driver: &DraTestDriver) -> String {
    format!("--- agent log ---\n{}\n--- driver log ---\n{}", tail(&agent.log(), 60), tail(&driver.log_text(), 30))
}

/// The node's driver, its device class, a namespace with claim `gpu` of one of its
/// devices and pod `user` running with it: what each test starts from.
struct Setup {
    // Dropped first (a failed test): the driver's pod is deleted while its agent runs.
    driver: DraTestDriver,
    node: ClusterNode,
    class_name: String,
    ns: String,
    pod_uid: String,
    claim_uid: String,
}

/// A node of test `test` with the driver (run as `deployment` says) registered and its
/// devices published.
async fn node_with_driver(
    cluster: &Cluster,
    test: &str,
    deployment: Deployment,
) -> Result<(ClusterNode, DraTestDriver)> {
    let node = cluster.join(test, AgentOptions::default()).await?;
    node.wait_ready(Duration::from_secs(30)).await?;
    let driver = DraTestDriver::start(cluster, &node.agent, deployment)
        .await
        .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    let client = cluster.client();

    // The driver's devices on this node, and the agent's side of the registration.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    eventually("the node's ResourceSlice", WAIT, || async {
        let list = slices.list(&ListParams::default()).await?;
        Ok(list.items.iter().any(|s| s.spec.node_name.as_deref() == Some(node.name.as_str())).then_some(()))
    })
    .await
    .with_context(|| logs(&node.agent, &driver))?;
    eventually("the agent's registration of the driver", WAIT, || async {
        Ok(node.agent.log().contains("DRA driver plugin registered").then_some(()))
    })
    .await
    .with_context(|| logs(&node.agent, &driver))?;
    Ok((node, driver))
}

async fn set_up(cluster: &Cluster, test: &str) -> Result<Setup> {
    let (node, driver) = node_with_driver(cluster, test, Deployment::Pod).await?;
    let client = cluster.client();
    let class_name = format!("swiftlet-dra-{}", node.name);
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": class_name},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}
    }))?;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    classes.create(&PostParams::default(), &class).await?;
    let mut node = node;
    let ns = node.namespace("dra").await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "gpu"},
        "spec": {"devices": {"requests": [{"name": "one", "exactly": {"deviceClassName": class_name}}]}}
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "user"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "terminationGracePeriodSeconds": 2,
            "resourceClaims": [{"name": "dev", "resourceClaimName": "gpu"}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "resources": {"claims": [{"name": "dev"}]}
            }]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = eventually("the pod Running", WAIT, || async {
        Ok(pods.get_opt("user").await?.filter(|p| phase(p) == "Running"))
    })
    .await
    .with_context(|| logs(&node.agent, &driver))?;
    let pod_uid = running.metadata.uid.clone().unwrap_or_default();
    let claim_uid = claims.get("gpu").await?.metadata.uid.clone().unwrap_or_default();
    Ok(Setup { driver, node, class_name, ns, pod_uid, claim_uid })
}

impl Setup {
    /// Deletes pod `user` and waits until the claim is unprepared (the driver removed its
    /// spec) and forgotten by the agent.
    async fn delete_pod_and_wait_unprepared(&self, cluster: &Cluster) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(cluster.client(), &self.ns);
        pods.delete("user", &DeleteParams::default()).await?;
        let root = &self.node.agent.root_dir;
        eventually("the claim unprepared", WAIT, || async {
            let state = std::fs::read_to_string(root.join("dra_manager_state")).unwrap_or_default();
            Ok((self.driver.cdi_specs_of(&self.claim_uid).is_empty() && !state.contains(&self.claim_uid)).then_some(()))
        })
        .await
        .with_context(|| logs(&self.node.agent, &self.driver))
    }

    /// Removes the claim and the class, stops the driver and the node.
    async fn tear_down(self, cluster: &Cluster, cri: &Cri) -> Result<()> {
        let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), &self.ns);
        claims.delete("gpu", &DeleteParams::default()).await?;
        let classes: Api<DeviceClass> = Api::all(cluster.client());
        classes.delete(&self.class_name, &DeleteParams::default()).await?;
        self.driver.stop()?;
        self.node.leave(cri).await
    }
}

/// The running containers of pod `uid`, by id.
async fn running_containers(cri: &Cri, uid: &str) -> Result<Vec<String>> {
    let mut ids: Vec<String> = cri.containers(uid).await?.into_iter().filter(|c| c.state == 1).map(|c| c.id).collect();
    ids.sort();
    Ok(ids)
}

#[tokio::test]
async fn a_claim_is_prepared_for_its_pod_its_cdi_device_handed_to_the_container_and_unprepared_after() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let setup = set_up(&cluster, "dra").await?;
    let (node, driver) = (&setup.node, &setup.driver);
    let root = node.agent.root_dir.clone();
    let (pod_uid, claim_uid) = (&setup.pod_uid, &setup.claim_uid);
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), &setup.ns);

    // Allocated from this node's devices and reserved for the pod; the driver prepared it.
    let claim = claims.get("gpu").await?;
    let status = claim.status.clone().context("claim status")?;
    let results = status.allocation.and_then(|a| a.devices).and_then(|d| d.results).unwrap_or_default();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].driver, DRIVER);
    assert!(status.reserved_for.unwrap_or_default().iter().any(|r| &r.uid == pod_uid));
    let specs = driver.cdi_specs_of(claim_uid);
    assert_eq!(specs.len(), 1, "the driver's CDI spec of the claim: {specs:?}");
    assert_eq!(driver.calls("NodePrepareResources", claim_uid), 1, "{}", driver.log_text());
    // The agent's state and metrics know the prepared claim.
    let state = std::fs::read_to_string(root.join("dra_manager_state"))?;
    assert!(state.contains(claim_uid.as_str()), "{state}");
    let in_use = format!("dra_resource_claims_in_use{{driver_name=\"{DRIVER}\"}} 1");
    assert!(node.agent.metrics_text().await?.contains(&in_use));

    // The container's status names the claim's device (ResourceHealthStatus, on upstream
    // since 1.36), health unknown: this agent watches no health stream (and the test
    // driver reports no device's health; upstream's kubelet shows the same).
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &setup.ns);
    let user = pods.get("user").await?;
    let statuses = user.status.and_then(|s| s.container_statuses).unwrap_or_default();
    let allocated = statuses.first().and_then(|c| c.allocated_resources_status.clone()).unwrap_or_default();
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    assert_eq!(allocated[0].name, "claim:dev");
    let devices = allocated[0].resources.clone().unwrap_or_default();
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0].health.as_deref(), Some("Unknown"));
    assert!(!devices[0].resource_id.is_empty());

    // The container got the CDI device (on a runtime with CDI).
    let containers = cri.containers(pod_uid).await?;
    let id = containers.iter().find(|c| c.state == 1).map(|c| c.id.clone()).context("no running container")?;
    let (code, env) = cri.exec(&id, &["env"]).await?;
    assert_eq!(code, 0, "{env}");
    let variable = "claim_gpu_one=true";
    if swiftlet_tests::node::node_target()?.is_some() {
        assert!(env.lines().any(|l| l == variable), "the CDI device's environment is missing:\n{env}");
    } else {
        // containerd 1.6 has no CDI: the device is in the config but never applied.
        assert!(!env.lines().any(|l| l == variable), "containerd 1.6 applied a CDI device?\n{env}");
    }

    // The pod deleted: the claim is unprepared (the driver removes its spec) and forgotten.
    setup.delete_pod_and_wait_unprepared(&cluster).await?;
    assert_eq!(driver.calls("NodeUnprepareResources", claim_uid), 1, "{}", driver.log_text());
    let text = node.agent.metrics_text().await?;
    assert!(!text.contains(&in_use), "{text}");
    assert!(text.contains("dra_resource_claims_in_use{driver_name=\"<any>\"} 0"), "{text}");

    setup.tear_down(&cluster, &cri).await
}

#[tokio::test]
async fn a_prepared_claim_survives_an_agent_crash_and_is_unprepared_from_the_checkpoint() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut setup = set_up(&cluster, "dra-restart").await?;
    let (pod_uid, claim_uid) = (setup.pod_uid.clone(), setup.claim_uid.clone());
    let before = running_containers(&cri, &pod_uid).await?;
    assert_eq!(before.len(), 1, "running containers: {before:?}");
    assert_eq!(setup.driver.calls("NodePrepareResources", &claim_uid), 1);
    let registrations = setup.driver.calls("NotifyRegistrationStatus", "");
    let driver_pod = setup.driver.pod_uid()?.context("the driver's pod")?;
    let driver_containers = running_containers(&cri, &driver_pod).await?;
    assert_eq!(driver_containers.len(), 1, "the driver's running containers: {driver_containers:?}");

    // Killed and started again on the same root dir.
    setup.node.agent.kill9()?;
    setup.node.agent.spawn().await?;
    setup.node.wait_ready(Duration::from_mins(1)).await?;
    let node = &setup.node;
    let driver = &setup.driver;
    // The restarted agent registered the driver again and synced the pod, its only one.
    eventually("the driver registered again and the pod synced", WAIT, || async {
        let mut synced = 0.0;
        for operation in ["create", "update", "sync"] {
            let series = format!("kubelet_pod_worker_duration_seconds_count{{operation_type=\"{operation}\"}}");
            synced += node.agent.metric(&series).await?;
        }
        Ok((driver.calls("NotifyRegistrationStatus", "") > registrations && synced >= 1.0).then_some(()))
    })
    .await
    .with_context(|| logs(&node.agent, driver))?;
    // The claim comes back from the checkpoint: still in use, not prepared again, the
    // container left running.
    let in_use = format!("dra_resource_claims_in_use{{driver_name=\"{DRIVER}\"}} 1");
    let text = node.agent.metrics_text().await?;
    assert!(text.contains(&in_use), "{text}");
    assert_eq!(running_containers(&cri, &pod_uid).await?, before, "the container was restarted");
    assert_eq!(running_containers(&cri, &driver_pod).await?, driver_containers, "the driver was restarted");
    assert_eq!(driver.calls("NodePrepareResources", &claim_uid), 1, "{}", driver.log_text());
    assert_eq!(driver.cdi_specs_of(&claim_uid).len(), 1);

    // Deleted after the restart: unprepared once, through the restored state.
    setup.delete_pod_and_wait_unprepared(&cluster).await?;
    assert_eq!(setup.driver.calls("NodeUnprepareResources", &claim_uid), 1, "{}", setup.driver.log_text());
    setup.tear_down(&cluster, &cri).await
}

#[tokio::test]
async fn an_extended_resource_served_by_dra_is_admitted_prepared_and_its_cdi_device_handed_to_the_container()
-> Result<()> {
    const RESOURCE: &str = "e2e.swiftlet.test/dra-device";
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let (mut node, driver) = node_with_driver(&cluster, "dra-ext", Deployment::Process).await?;
    let client = cluster.client();
    let root = node.agent.root_dir.clone();
    let class_name = format!("swiftlet-dra-ext-{}", node.name);
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": class_name},
        "spec": {
            "selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}],
            "extendedResourceName": RESOURCE,
        }
    }))?;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    classes.create(&PostParams::default(), &class).await?;
    let ns = node.namespace("dra-ext").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "user"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "resources": {"limits": {RESOURCE: "1"}}
            }]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = eventually("the pod Running", WAIT, || async {
        Ok(pods.get_opt("user").await?.filter(|p| phase(p) == "Running"))
    })
    .await
    .with_context(|| logs(&node.agent, &driver))?;
    let pod_uid = running.metadata.uid.clone().unwrap_or_default();

    // The node reports no such resource: admitted because DRA serves it.
    let node_obj = node.node().await?.context("no node")?;
    let allocatable = node_obj.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert!(!allocatable.contains_key(RESOURCE), "{allocatable:?}");
    // The scheduler's claim for it, allocated from the driver and prepared by it.
    let ext =
        running.status.and_then(|s| s.extended_resource_claim_status).context("no extendedResourceClaimStatus")?;
    let mapping = ext.request_mappings.iter().find(|m| m.container_name == "main").context("no request mapping")?;
    assert_eq!(mapping.resource_name, RESOURCE);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims.get(&ext.resource_claim_name).await?;
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
    let status = claim.status.clone().context("claim status")?;
    let results = status.allocation.and_then(|a| a.devices).and_then(|d| d.results).unwrap_or_default();
    assert!(results.iter().any(|r| r.driver == DRIVER && r.request == mapping.request_name), "{results:?}");
    assert!(status.reserved_for.unwrap_or_default().iter().any(|r| r.uid == pod_uid));
    assert_eq!(driver.calls("NodePrepareResources", &claim_uid), 1, "{}", driver.log_text());
    assert_eq!(driver.cdi_specs_of(&claim_uid).len(), 1);

    // The container got the claim's CDI device (on a runtime with CDI): the driver's
    // device sets `claim_<claim>_<request>` (non-alphanumerics as `_`).
    let id = cri
        .containers(&pod_uid)
        .await?
        .into_iter()
        .find(|c| c.state == 1)
        .map(|c| c.id)
        .context("no running container")?;
    let (code, env) = cri.exec(&id, &["env"]).await?;
    assert_eq!(code, 0, "{env}");
    let variable: String = format!("claim_{}_{}=true", ext.resource_claim_name, mapping.request_name)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '=' { c } else { '_' })
        .collect();
    if swiftlet_tests::node::node_target()?.is_some() {
        assert!(env.lines().any(|l| l == variable), "the CDI device's environment ({variable}) is missing:\n{env}");
    } else {
        assert!(!env.lines().any(|l| l == variable), "containerd 1.6 applied a CDI device?\n{env}");
    }

    // Deleted: the claim is unprepared.
    pods.delete("user", &DeleteParams::default()).await?;
    eventually("the claim unprepared", WAIT, || async {
        let state = std::fs::read_to_string(root.join("dra_manager_state")).unwrap_or_default();
        Ok((driver.cdi_specs_of(&claim_uid).is_empty() && !state.contains(&claim_uid)).then_some(()))
    })
    .await
    .with_context(|| logs(&node.agent, &driver))?;

    classes.delete(&class_name, &DeleteParams::default()).await?;
    driver.stop()?;
    node.leave(&cri).await
}
