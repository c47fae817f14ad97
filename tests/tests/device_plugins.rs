//! End-to-end tests of device plugins: the test device plugin
//! (`swiftlet_tests::device_plugin`) registers with a real `swiftlet` joined to the test
//! bed's real control plane; the node reports its devices, pods requesting them run in the real
//! containerd of the test bed with the device nodes, environment and mount the plugin
//! asked for, over-requests are refused as upstream refuses them, and allocations
//! survive an agent restart.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use serde_json::json;
use swiftlet_tests::cluster::{TestNode as Bed, phase as pod_phase};
use swiftlet_tests::device_plugin::{TestDevicePlugin, TestDevicePluginOptions};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

const RES: &str = "swiftlet.test/fake";

/// One test's node (reporting its status every second), its namespace, and the runtime.
async fn setup(test: &str) -> Result<(Bed, Cri)> {
    setup_syncing_every(test, AgentOptions::default().sync_frequency).await
}

/// [`setup`] with the pods synced every `sync_frequency`.
async fn setup_syncing_every(test: &str, sync_frequency: &'static str) -> Result<(Bed, Cri)> {
    let opts = AgentOptions {
        extra_config: "nodeStatusUpdateFrequency: 1s\n".into(),
        sync_frequency,
        ..AgentOptions::default()
    };
    let bed = Bed::join(test, opts).await?;
    let cri = bed.cri.clone();
    Ok((bed, cri))
}

/// [`setup`], and a test plugin of the default options registered with the node's agent
/// ([`plugin_up`]).
async fn setup_with_plugin(test: &str) -> Result<(Bed, Cri, PathBuf, TestDevicePlugin)> {
    let (bed, cri) = setup(test).await?;
    let (dir, plugin) = plugin_up(&bed).await?;
    Ok((bed, cri, dir, plugin))
}

/// Starts a test plugin of the default options in the agent's device plugin dir (returned)
/// and waits until the node shows its two devices.
async fn plugin_up(bed: &Bed) -> Result<(PathBuf, TestDevicePlugin)> {
    let dir = bed.agent().root_dir.join("device-plugins");
    let plugin = TestDevicePlugin::start(&dir, TestDevicePluginOptions::default()).await?;
    wait_node_devices(bed, "2", "2").await?;
    Ok((dir, plugin))
}

fn device_pod(name: &str, count: u32) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "resources": {"limits": {RES: count.to_string()}}
            }]
        }
    })
}

fn phase(p: &Pod) -> Option<&str> {
    Some(pod_phase(p)).filter(|p| !p.is_empty())
}

async fn wait_pod(bed: &Bed, name: &str, pred: impl Fn(&Pod) -> bool) -> Result<Pod> {
    bed.node.eventually_pod(&bed.ns, name, Duration::from_mins(1), name, pred).await
}

/// Waits until the node reports `capacity` and `allocatable` of the fake resource.
async fn wait_node_devices(bed: &Bed, capacity: &str, allocatable: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = bed.node.node().await?.and_then(|n| n.status).unwrap_or_default();
        let get = |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.and_then(|m| m.get(RES)).map(|q| q.0.clone())
        };
        let (c, a) = (get(status.capacity.as_ref()), get(status.allocatable.as_ref()));
        if c.as_deref() == Some(capacity) && a.as_deref() == Some(allocatable) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "node never reported {RES} capacity {capacity} / allocatable {allocatable}: {c:?} / {a:?}\n{}",
            tail(&bed.agent().log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn running_container(cri: &Cri, uid: &str) -> Result<String> {
    cri.containers(uid)
        .await?
        .into_iter()
        .find(|c| c.state == 1)
        .map(|c| c.id)
        .ok_or_else(|| anyhow::anyhow!("no running container"))
}

async fn exec(cri: &Cri, id: &str, cmd: &[&str]) -> Result<String> {
    let (code, out) = cri.exec(id, cmd).await?;
    ensure!(code == 0, "{cmd:?} exited {code}: {out}");
    Ok(out.trim().to_owned())
}

/// A variable of the container's environment (busybox here has no `printenv`).
async fn env(cri: &Cri, id: &str, name: &str) -> Result<String> {
    exec(cri, id, &["sh", "-c", &format!("echo \"${name}\"")]).await
}

async fn delete_and_wait(bed: &Bed, names: &[&str]) -> Result<()> {
    let pods = bed.pods();
    for n in names {
        pods.delete(n, &DeleteParams::default().grace_period(0)).await?;
    }
    let deadline = Instant::now() + Duration::from_mins(1);
    for n in names {
        while pods.get_opt(n).await?.is_some() {
            ensure!(Instant::now() < deadline, "{n} not removed in a minute\n{}", tail(&bed.agent().log(), 30));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// A plugin registers; the node shows its devices; a pod gets one (the plugin's
/// preferred one) with its device node, environment and mount; a pod asking for more
/// than is free is refused with upstream's reason; an unhealthy device and a stopped
/// plugin lower allocatable while capacity stays.
#[tokio::test]
async fn plugin_registers_and_pods_get_its_devices() -> Result<()> {
    let _g = testbed_lock().await;
    // Pods synced once a minute: a device's health reaches the pod's status sooner only
    // through the plugin's report.
    let (bed, cri) = setup_syncing_every("devices", "1m").await?;
    let agent = bed.agent();
    // A plugin on the node names the node's paths (an agent in the node container's).
    let shared = swiftlet_tests::agent_tempdir("swiftlet-e2e-plugin-")?;
    std::fs::write(shared.path().join("hello"), "from the plugin\n")?;
    let plugin = TestDevicePlugin::start(
        &agent.root_dir.join("device-plugins"),
        TestDevicePluginOptions {
            envs: BTreeMap::from([("FAKE_VENDOR".into(), "swiftlet".into())]),
            mount: Some((swiftlet_tests::agent_path(shared.path())?, "/fake".into())),
            pre_start_required: true,
            ..TestDevicePluginOptions::default()
        },
    )
    .await?;
    wait_node_devices(&bed, "2", "2").await?;
    let registrations =
        agent.metric(&format!("kubelet_device_plugin_registration_total{{resource_name=\"{RES}\"}}")).await?;
    assert!((registrations - 1.0).abs() < f64::EPSILON, "registrations: {registrations}");

    let uid = bed.create(device_pod("one", 1)).await?.metadata.uid.context("uid")?;
    let running = wait_pod(&bed, "one", |p| phase(p) == Some("Running")).await?;
    // The container's devices in its allocatedResourcesStatus (ResourceHealthStatus, on
    // upstream since 1.36): the resource, the device and its health.
    let statuses = running.status.and_then(|s| s.container_statuses).unwrap_or_default();
    let allocated = statuses.first().and_then(|c| c.allocated_resources_status.clone()).unwrap_or_default();
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    assert_eq!(allocated[0].name, RES);
    let devices = allocated[0].resources.clone().unwrap_or_default();
    assert_eq!(
        devices.iter().map(|r| (r.resource_id.as_str(), r.health.as_deref())).collect::<Vec<_>>(),
        [("dev-1", Some("Healthy"))]
    );
    // The agent asked for the plugin's preference (the highest device) and got it.
    assert_eq!(plugin.preferred_requests().len(), 1);
    assert_eq!(plugin.allocations(), vec![vec!["dev-1".to_string()]]);
    assert_eq!(plugin.pre_starts(), vec![vec!["dev-1".to_string()]]);
    let allocs =
        agent.metric(&format!("kubelet_device_plugin_alloc_duration_seconds_count{{resource_name=\"{RES}\"}}")).await?;
    assert!((allocs - 1.0).abs() < f64::EPSILON, "Allocate calls observed: {allocs}");
    let id = running_container(&cri, &uid).await?;
    exec(&cri, &id, &["test", "-c", "/dev/fake1"]).await?;
    let (code, _) = cri.exec(&id, &["test", "-e", "/dev/fake0"]).await?;
    assert_ne!(code, 0, "only the allocated device is in the container");
    assert_eq!(env(&cri, &id, "FAKE_DEVICES").await?, "dev-1");
    assert_eq!(env(&cri, &id, "FAKE_VENDOR").await?, "swiftlet");
    assert_eq!(exec(&cri, &id, &["cat", "/fake/hello"]).await?, "from the plugin");
    let status = cri.container_status(&id).await?;
    assert!(
        status
            .status
            .as_ref()
            .is_some_and(|s| s.annotations.get("swiftlet.test/devices").map(String::as_str) == Some("dev-1")),
        "the plugin's annotation reached the runtime: {:?}",
        status.status.map(|s| s.annotations)
    );

    // One device left: asking for two is refused by the device manager, as upstream.
    let greedy_uid = bed.create(device_pod("greedy", 2)).await?.metadata.uid.context("uid")?;
    let p = wait_pod(&bed, "greedy", |p| phase(p) == Some("Failed")).await?;
    let st = p.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        st.message.as_deref(),
        Some(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for swiftlet.test/fake. \
             Requested: 2, Available: 1, which is unexpected"
        )
    );
    assert!(cri.sandboxes(&greedy_uid).await?.is_empty(), "a rejected pod never runs");

    // Health: an unhealthy device leaves allocatable, not capacity, and the pod holding it
    // says so at once (the plugin's report syncs the pod).
    let health = |p: &Pod| -> Option<String> {
        let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
        let allocated = statuses.first()?.allocated_resources_status.as_ref()?;
        let devices = allocated.iter().find(|s| s.name == RES)?.resources.as_ref()?;
        devices.iter().find(|r| r.resource_id == "dev-1")?.health.clone()
    };
    plugin.set_healthy(0, false);
    wait_node_devices(&bed, "2", "1").await?;
    plugin.set_healthy(0, true);
    wait_node_devices(&bed, "2", "2").await?;
    let soon = Duration::from_secs(20);
    plugin.set_healthy(1, false);
    bed.node
        .eventually_pod(&bed.ns, "one", soon, "dev-1 Unhealthy", |p| health(p).as_deref() == Some("Unhealthy"))
        .await?;
    wait_node_devices(&bed, "2", "1").await?;
    plugin.set_healthy(1, true);
    bed.node.eventually_pod(&bed.ns, "one", soon, "dev-1 Healthy", |p| health(p).as_deref() == Some("Healthy")).await?;
    // A plugin that stops: its devices are unhealthy (capacity kept for the grace period).
    plugin.stop().await;
    wait_node_devices(&bed, "2", "0").await?;

    delete_and_wait(&bed, &["one", "greedy"]).await?;
    bed.node.leave(&cri).await
}

/// The agent restarts (SIGTERM, start again): the running pod keeps its container and its
/// device (restored from the checkpoint), the plugin registers again, and a new pod gets
/// the other device. A second restart with the plugin gone keeps both pods running.
#[tokio::test]
async fn agent_restart_keeps_device_allocations() -> Result<()> {
    let _g = testbed_lock().await;
    let (mut bed, cri, dir, plugin) = setup_with_plugin("device-restart").await?;
    let uid = bed.create(device_pod("keeper", 1)).await?.metadata.uid.context("uid")?;
    wait_pod(&bed, "keeper", |p| phase(p) == Some("Running")).await?;
    let id = running_container(&cri, &uid).await?;
    assert_eq!(env(&cri, &id, "FAKE_DEVICES").await?, "dev-1");
    let checkpoint = std::fs::read_to_string(dir.join("kubelet_internal_checkpoint"))?;
    let v: serde_json::Value = serde_json::from_str(&checkpoint)?;
    let entries = v["Data"]["PodDeviceEntries"].as_array().cloned().unwrap_or_default();
    assert!(
        entries
            .iter()
            .any(|e| e["PodUID"] == uid.as_str() && e["ResourceName"] == RES && e["DeviceIDs"]["-1"][0] == "dev-1"),
        "{checkpoint}"
    );

    bed.node.agent.stop()?;
    bed.node.agent.spawn().await?;
    // The plugin sees kubelet.sock created again and registers again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while plugin.registrations() < 2 {
        ensure!(tokio::time::Instant::now() < deadline, "the plugin did not register again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_node_devices(&bed, "2", "2").await?;
    // The running container was left alone: same container, still running.
    assert_eq!(running_container(&cri, &uid).await?, id);
    let allocations_before = plugin.allocations().len();

    // dev-1 is still taken (restored from the checkpoint): a new pod gets dev-0.
    let second = bed.create(device_pod("second", 1)).await?.metadata.uid.context("uid")?;
    wait_pod(&bed, "second", |p| phase(p) == Some("Running")).await?;
    let id2 = running_container(&cri, &second).await?;
    assert_eq!(env(&cri, &id2, "FAKE_DEVICES").await?, "dev-0");
    assert_eq!(plugin.allocations()[allocations_before..], [vec!["dev-0".to_string()]]);
    // And nothing is left for a third.
    bed.create(device_pod("third", 1)).await?;
    let p = wait_pod(&bed, "third", |p| phase(p) == Some("Failed")).await?;
    assert_eq!(p.status.unwrap().reason.as_deref(), Some("UnexpectedAdmissionError"));

    // Restart again with the plugin gone: the pods holding devices are admitted again
    // (the node-fit check counts their held devices) and keep running; the resource is
    // known with no devices until a plugin registers.
    plugin.stop().await;
    wait_node_devices(&bed, "2", "0").await?;
    bed.node.agent.stop()?;
    bed.node.agent.spawn().await?;
    wait_node_devices(&bed, "0", "0").await?;
    for (name, uid, id) in [("keeper", &uid, &id), ("second", &second, &id2)] {
        let p = wait_pod(&bed, name, |p| phase(p).is_some()).await?;
        assert_eq!(phase(&p), Some("Running"), "{name} was admitted again");
        assert_eq!(&running_container(&cri, uid).await?, id, "{name} kept its container");
    }
    let (_, plugin) = plugin_up(&bed).await?;
    bed.create(device_pod("fourth", 1)).await?;
    let p = wait_pod(&bed, "fourth", |p| phase(p) == Some("Failed")).await?;
    assert_eq!(p.status.unwrap().reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert!(plugin.allocations().is_empty(), "the new plugin was asked for nothing");

    delete_and_wait(&bed, &["keeper", "second", "third", "fourth"]).await?;
    plugin.stop().await;
    bed.node.leave(&cri).await
}

/// Standalone (static pod): with two devices, an init container and the app container
/// that both ask for two run, because the app container reuses the init container's
/// devices, as upstream does.
#[tokio::test]
async fn init_container_devices_are_reused_by_the_app_container() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let agent = Agent::start(AgentOptions::default()).await?;
    let plugin =
        TestDevicePlugin::start(&agent.root_dir.join("device-plugins"), TestDevicePluginOptions::default()).await?;
    let manifest = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: reuse, namespace: default}}
spec:
  initContainers:
  - name: init
    image: localhost/busybox:latest
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'test -c /dev/fake0 && test -c /dev/fake1']
    resources: {{limits: {{{RES}: 2}}}}
  containers:
  - name: main
    image: localhost/busybox:latest
    imagePullPolicy: IfNotPresent
    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]
    resources: {{limits: {{{RES}: 2}}}}
"
    );
    agent.write_manifest("reuse.yaml", &manifest)?;
    let p = agent.wait_pod("reuse", Duration::from_mins(1), |p| p["status"]["phase"] == "Running").await?;
    let uid = p["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    let id = running_container(&cri, &uid).await?;
    assert_eq!(env(&cri, &id, "FAKE_DEVICES").await?, "dev-0,dev-1");
    exec(&cri, &id, &["test", "-c", "/dev/fake0"]).await?;
    // The init container (which checked both nodes and exited 0) and the app container
    // were given the same two devices.
    let both = vec!["dev-0".to_string(), "dev-1".to_string()];
    assert_eq!(plugin.allocations(), vec![both.clone(), both]);
    plugin.stop().await;
    agent.shutdown(&cri).await
}

/// A node whose device manager state is gone (no checkpoint: a wiped or new node) that
/// adopts its existing node object zeroes the extended resources that object still
/// shows, as upstream.
#[tokio::test]
async fn a_wiped_node_zeroes_stale_extended_resources() -> Result<()> {
    let _g = testbed_lock().await;
    let (mut bed, cri, dir, plugin) = setup_with_plugin("device-wiped").await?;
    plugin.stop().await;
    wait_node_devices(&bed, "2", "0").await?;
    bed.node.agent.stop()?;
    std::fs::remove_file(dir.join("kubelet_internal_checkpoint"))?;
    bed.node.agent.spawn().await?;
    wait_node_devices(&bed, "0", "0").await?;
    bed.node.leave(&cri).await
}
