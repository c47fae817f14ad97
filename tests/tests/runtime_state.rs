//! End-to-end tests of what the agent reads from the runtime's CRI `Status`: the node is
//! not ready while containerd's pod network is not (its CNI configuration removed), when
//! only pods on the host's network start, and
//! pods asking for `supplementalGroupsPolicy: Strict` are refused on containerd 1.6,
//! which cannot honour it (the node's `status.features` says so).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use serde_json::json;
use swiftlet_tests::apiserver::TestApiServer;
use swiftlet_tests::testbed_lock;

const NODE: &str = "e2e-node";

fn ready(node: Option<&Node>) -> Option<NodeCondition> {
    node?.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").cloned()
}

async fn wait_ready(api: &TestApiServer, secs: u64, pred: impl Fn(&NodeCondition) -> bool) -> Result<NodeCondition> {
    let node =
        api.wait_for::<Node>(None, NODE, Duration::from_secs(secs), |n| ready(n).is_some_and(|c| pred(&c))).await?;
    Ok(ready(node.as_ref()).expect("matched"))
}

/// The test bed's CNI configuration directory (containerd's `conf_dir`).
fn cni_conf_dir() -> Result<PathBuf> {
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
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    wait_ready(&api, 30, |c| c.status == "True").await?;

    let mut aside = CniConfigAside::new(&cni_conf_dir()?)?;
    // containerd notices the directory change and reports NetworkReady=false; the agent
    // asks every 5 s and reports at the next status update.
    let not_ready = wait_ready(&api, 60, |c| c.status == "False").await.map_err(|e| {
        anyhow::anyhow!("{e}; node: {:?}\n{}", ready(api.get::<Node>(None, NODE).as_ref()), agent.log())
    })?;
    assert_eq!(not_ready.reason.as_deref(), Some("KubeletNotReady"));
    let message = not_ready.message.unwrap_or_default();
    assert!(
        message.starts_with("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady"),
        "{message}"
    );

    // Meanwhile a pod on the host's network starts; one on the pod network waits.
    let host_uid = api.create(&sleeper("on-host", true))?.metadata.uid.unwrap();
    let net_uid = api.create(&sleeper("on-pod-network", false))?.metadata.uid.unwrap();
    wait_phase(&api, "on-host", "Running", 60).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let event = loop {
        let events = api.list::<k8s_openapi::api::core::v1::Event>(Some("default"));
        if let Some(e) = events.into_iter().find(|e| e.reason.as_deref() == Some("NetworkNotReady")) {
            break e;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no NetworkNotReady event\n{}", agent.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(event.involved_object.name.as_deref(), Some("on-pod-network"));
    assert!(event.message.unwrap_or_default().starts_with("network is not ready: container runtime network not ready"));
    assert!(cri.sandboxes(&net_uid).await?.is_empty(), "no sandbox while the network is not ready");
    assert_eq!(cri.sandboxes(&host_uid).await?.len(), 1);

    aside.restore()?;
    let back = wait_ready(&api, 60, |c| c.status == "True").await?;
    assert_eq!(back.reason.as_deref(), Some("KubeletReady"));
    // The waiting pod starts at its next try (within the 10 s retry).
    wait_phase(&api, "on-pod-network", "Running", 60).await?;
    for name in ["on-host", "on-pod-network"] {
        api.delete::<Pod>(Some("default"), name, Some(0))?;
    }
    agent.shutdown(&cri).await
}

fn sleeper(name: &str, host_network: bool) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": host_network,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}]
        }
    }))
    .expect("a valid pod")
}

async fn wait_phase(api: &TestApiServer, name: &str, phase: &str, secs: u64) -> Result<()> {
    api.wait_for::<Pod>(Some("default"), name, Duration::from_secs(secs), |p| {
        p.is_some_and(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn strict_supplemental_groups_are_refused_by_a_runtime_without_them() -> Result<()> {
    let _g = testbed_lock().await;
    let (api, agent, cri) = swiftlet_tests::api_mode_agent().await?;
    let node = api
        .wait_for::<Node>(None, NODE, Duration::from_secs(30), |n| {
            n.is_some_and(|n| n.status.as_ref().and_then(|s| s.features.as_ref()).is_some())
        })
        .await?
        .expect("matched");
    let features = node.status.unwrap().features.unwrap();
    assert_eq!(features.supplemental_groups_policy, Some(false), "containerd 1.6 does not support it");

    let strict: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "strict", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "securityContext": {"runAsUser": 1000, "supplementalGroups": [5000], "supplementalGroupsPolicy": "Strict"},
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}]
        }
    }))?;
    let uid = api.create(&strict)?.metadata.uid.unwrap();
    let p = api
        .wait_for::<Pod>(Some("default"), "strict", Duration::from_secs(30), |p| {
            p.is_some_and(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
        })
        .await?
        .expect("matched");
    let status = p.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("SupplementalGroupsPolicyNotSupported"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: SupplementalGroupsPolicy=Strict is not supported in this node")
    );
    assert!(cri.sandboxes(&uid).await?.is_empty(), "a rejected pod never runs");
    api.delete::<Pod>(Some("default"), "strict", Some(0))?;
    agent.shutdown(&cri).await
}
