//! End-to-end tests of what the agent reads from the runtime's CRI `Status`: the node is
//! not ready while containerd's pod network is not (its CNI configuration removed), and
//! pods asking for `supplementalGroupsPolicy: Strict` are refused on containerd 1.6,
//! which cannot honour it (the node's `status.features` says so).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use serde_json::json;
use swiftlet_tests::apiserver::{Options, TestApiServer};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, testbed_lock};

const NODE: &str = "e2e-node";

async fn setup() -> Result<(TestApiServer, Agent, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let api = TestApiServer::start(Options::default()).await?;
    let agent =
        Agent::start(AgentOptions { kubeconfig: Some(api.kubeconfig_path().to_path_buf()), ..AgentOptions::default() })
            .await?;
    Ok((api, agent, cri))
}

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
    let (api, agent, cri) = setup().await?;
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

    aside.restore()?;
    let back = wait_ready(&api, 60, |c| c.status == "True").await?;
    assert_eq!(back.reason.as_deref(), Some("KubeletReady"));
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn strict_supplemental_groups_are_refused_by_a_runtime_without_them() -> Result<()> {
    let _g = testbed_lock().await;
    let (api, agent, cri) = setup().await?;
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
