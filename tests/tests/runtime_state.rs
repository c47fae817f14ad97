//! End-to-end tests on the real control plane of what the agent reads from the runtime's
//! CRI `Status`: the node is not ready while containerd's pod network is not (its CNI
//! configuration removed), when only pods on the host's network start, and pods asking for `supplementalGroupsPolicy: Strict` are refused on containerd 1.6,
//! which cannot honour it (the node's `status.features` says so), and run on 2.x.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Event, NodeCondition, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;
use swiftlet_tests::cluster::{Cluster, ClusterNode, phase};
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

async fn join(test: &str) -> Result<(Cluster, ClusterNode, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let node = cluster.join(test, AgentOptions::default()).await?;
    Ok((cluster, node, cri))
}

/// Waits until the node's Ready condition satisfies `pred`.
async fn wait_ready(node: &ClusterNode, secs: u64, pred: impl Fn(&NodeCondition) -> bool) -> Result<NodeCondition> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let ready = node.node().await?.and_then(|n| n.status?.conditions?.into_iter().find(|c| c.type_ == "Ready"));
        if let Some(c) = &ready
            && pred(c)
        {
            return Ok(c.clone());
        }
        ensure!(
            Instant::now() < deadline,
            "Ready condition not as wanted in {secs} s: {ready:?}\n{}",
            tail(&node.agent.log(), 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn wait_phase(node: &ClusterNode, ns: &str, name: &str, want: &str, secs: u64) -> Result<Pod> {
    node.eventually_pod(ns, name, Duration::from_secs(secs), &format!("{name} {want}"), |p| phase(p) == want).await
}

/// The test bed's CNI configuration directory (containerd's `conf_dir`), or the node
/// container's for an agent there (`SWIFTLET_E2E_NODE`).
fn cni_conf_dir() -> Result<PathBuf> {
    if let Some((node, _)) = swiftlet_tests::node::node_target()? {
        return Ok(node.file("/etc/cni/net.d"));
    }
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(swiftlet_tests::TESTBED_STATE).context("test bed state")?)?;
    let root = state["root_dir"].as_str().context("root_dir")?;
    Ok(Path::new(root).join("cni/net.d"))
}

/// Moves the CNI configuration files aside; puts them back when dropped, whatever the
/// test's outcome.
struct CniConfigAside {
    moved: Vec<(PathBuf, PathBuf)>,
}

impl CniConfigAside {
    fn new(dir: &Path) -> Result<Self> {
        let mut moved = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "conflist" || e == "conf") {
                let aside = path.with_extension("aside");
                std::fs::rename(&path, &aside)?;
                moved.push((path, aside));
            }
        }
        anyhow::ensure!(!moved.is_empty(), "no CNI configuration in {}", dir.display());
        Ok(Self { moved })
    }

    fn restore(&mut self) -> Result<()> {
        for (path, aside) in self.moved.drain(..) {
            std::fs::rename(&aside, &path)?;
        }
        Ok(())
    }
}

impl Drop for CniConfigAside {
    fn drop(&mut self) {
        let _ = self.restore();
    }
}

#[tokio::test]
async fn the_node_is_not_ready_while_the_pod_network_is_not() -> Result<()> {
    let _g = testbed_lock().await;
    let (cluster, mut node, cri) = join("network").await?;
    let ns = node.namespace("network").await?;

    let mut aside = CniConfigAside::new(&cni_conf_dir()?)?;
    // containerd notices the directory change and reports NetworkReady=false; the agent
    // asks every 5 s and reports at the next status update.
    let not_ready = wait_ready(&node, 60, |c| c.status == "False").await?;
    assert_eq!(not_ready.reason.as_deref(), Some("KubeletNotReady"));
    let message = not_ready.message.unwrap_or_default();
    assert!(
        message.starts_with("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady"),
        "{message}"
    );

    // Meanwhile a pod on the host's network starts; one on the pod network waits. (Bound
    // by hand: the scheduler keeps pods off a node that is not ready.)
    let host_uid = node.create_pod(&ns, sleeper("on-host", true)).await?.metadata.uid.context("uid")?;
    let net_uid = node.create_pod(&ns, sleeper("on-pod-network", false)).await?.metadata.uid.context("uid")?;
    wait_phase(&node, &ns, "on-host", "Running", 60).await?;
    let events = Api::<Event>::namespaced(cluster.client(), &ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    let event = loop {
        let list = events.list(&ListParams::default()).await?;
        if let Some(e) = list.items.into_iter().find(|e| e.reason.as_deref() == Some("NetworkNotReady")) {
            break e;
        }
        ensure!(Instant::now() < deadline, "no NetworkNotReady event\n{}", tail(&node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(event.involved_object.name.as_deref(), Some("on-pod-network"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let message = event.message.unwrap_or_default();
    assert!(message.starts_with("network is not ready: container runtime network not ready"), "{message}");
    assert!(cri.sandboxes(&net_uid).await?.is_empty(), "no sandbox while the network is not ready");
    assert_eq!(cri.sandboxes(&host_uid).await?.len(), 1);

    aside.restore()?;
    let back = wait_ready(&node, 60, |c| c.status == "True").await?;
    assert_eq!(back.reason.as_deref(), Some("KubeletReady"));
    // The waiting pod starts at its next try (within the 10 s retry).
    wait_phase(&node, &ns, "on-pod-network", "Running", 60).await?;
    node.leave(&cri).await
}

fn sleeper(name: &str, host_network: bool) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": host_network,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}]
        }
    })
}

#[tokio::test]
async fn strict_supplemental_groups_are_refused_only_by_a_runtime_without_them() -> Result<()> {
    let _g = testbed_lock().await;
    let (_cluster, mut node, cri) = join("supplemental").await?;
    let ns = node.namespace("supplemental").await?;
    let n = node.node().await?.context("node")?;
    let features = n.status.and_then(|s| s.features).context("the node reports no status.features")?;
    // containerd 1.6 cannot honour it; 2.x can (the agent in the node container).
    let supported = cri.status().await?.features.is_some_and(|f| f.supplemental_groups_policy);
    assert_eq!(features.supplemental_groups_policy, Some(supported), "the node tells what its runtime can do");

    let strict = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "strict"},
        "spec": {
            "securityContext": {"runAsUser": 1000, "supplementalGroups": [5000], "supplementalGroupsPolicy": "Strict"},
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}]
        }
    });
    let uid = node.create_pod(&ns, strict).await?.metadata.uid.context("uid")?;
    if supported {
        wait_phase(&node, &ns, "strict", "Running", 60).await?;
        return node.leave(&cri).await;
    }
    let p = wait_phase(&node, &ns, "strict", "Failed", 30).await?;
    let status = p.status.context("status")?;
    assert_eq!(status.reason.as_deref(), Some("SupplementalGroupsPolicyNotSupported"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: SupplementalGroupsPolicy=Strict is not supported in this node")
    );
    assert!(cri.sandboxes(&uid).await?.is_empty(), "a rejected pod never runs");
    node.leave(&cri).await
}
