//! CSI volumes on a swiftlet node of the test bed's real control plane: the host-path
//! driver (`swiftlet-test-csi-driver`) registers with the agent through
//! `<root-dir>/plugins_registry`, upstream's csi-provisioner and csi-resizer provision
//! and grow its volumes, kube-controller-manager binds claims, makes the `StatefulSet`'s
//! pods and the claims of generic ephemeral volumes, and the agent stages, publishes,
//! expands, reports and tears them down through the driver; a driver with
//! `tokenRequests` and `requiresRepublish` gets the pod's tokens, which the API server
//! vouches for, and is published again at each sync of the pod.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use swiftlet_tests::cluster::{Cluster, ClusterNode, phase};
use swiftlet_tests::csi_driver::{CsiCall, TOKENS_FILE};
use swiftlet_tests::csi_hostpath::{CsiHostPath, CsiHostPathOptions, Deployment, mounts_under};
use swiftlet_tests::pods::BUSYBOX;
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, eventually, tail, testbed_lock};

const WAIT: Duration = Duration::from_secs(90);

/// The pod `name` once it runs, with its UID.
async fn running_pod(node: &ClusterNode, ns: &str, name: &str, not_uid: Option<&str>) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(node.cluster.client(), ns);
    eventually(&format!("pod {ns}/{name} Running"), WAIT, || async {
        let p = pods.get_opt(name).await?;
        Ok(p.filter(|p| phase(p) == "Running" && p.metadata.uid.as_deref() != not_uid))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 80)))
}

fn calls_for(csi: &CsiHostPath, method: &str, volume: &str) -> Vec<CsiCall> {
    csi.calls_of(method).into_iter().filter(|c| c.volume_id == volume).collect()
}

/// The host-path driver and its sidecars as a pod on `node`, run by its agent.
async fn driver_pod(cluster: &Cluster, node: &ClusterNode, opts: CsiHostPathOptions) -> Result<CsiHostPath> {
    let opts = CsiHostPathOptions { deployment: Deployment::Pods, ..opts };
    CsiHostPath::start(cluster, &node.name, &node.agent.root_dir, opts)
        .await
        .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 80)))
}

#[tokio::test]
async fn a_statefulset_claim_is_staged_published_expanded_and_keeps_its_data_through_pod_and_agent_restarts()
-> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join("csi-sts", AgentOptions { sync_frequency: "5s", ..AgentOptions::default() }).await?;
    node.wait_ready(Duration::from_secs(30)).await?;
    let root = node.agent.root_dir.clone();
    let csi = driver_pod(&cluster, &node, CsiHostPathOptions::default()).await?;
    let client = cluster.client();

    // Registration: the driver in the node's CSINode (owned by the Node) and annotation.
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    let entry = eventually("the driver in the CSINode", WAIT, || async {
        let n = csi_nodes.get_opt(&node.name).await?;
        Ok(n.and_then(|n| n.spec.drivers.into_iter().find(|d| d.name == csi.driver_name)))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    assert_eq!(entry.node_id, node.name);
    let csi_node = csi_nodes.get(&node.name).await?;
    let owner = csi_node.metadata.owner_references.unwrap_or_default();
    assert!(owner.iter().any(|o| o.kind == "Node" && o.name == node.name), "{owner:?}");
    let n = node.node().await?.context("node")?;
    let ids = n.metadata.annotations.unwrap_or_default();
    let ids: serde_json::Value =
        serde_json::from_str(ids.get("csi.volume.kubernetes.io/nodeid").context("annotation")?)?;
    assert_eq!(ids[&csi.driver_name], json!(node.name));
    // Told after the node objects are written (the CSINode above), so maybe a moment later.
    eventually("the driver told it is registered", WAIT, || async {
        Ok(csi.calls_of("NotifyRegistrationStatus").iter().any(|c| c.registered).then_some(()))
    })
    .await?;

    // A StatefulSet whose claim the provisioner makes; each boot appends to the volume.
    let ns = node.namespace("csi").await?;
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "serviceName": "web",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node.name},
                    "terminationGracePeriodSeconds": 2,
                    "securityContext": {"fsGroup": 2000},
                    "containers": [{
                        "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; echo boot >> /data/boots; while true; do sleep 1; done"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }]
                }
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": csi.storage_class,
                         "resources": {"requests": {"storage": "10Mi"}}}
            }]
        }
    }))?;
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    statefulsets.create(&PostParams::default(), &sts).await?;
    let first = running_pod(&node, &ns, "web-0", None).await?;
    let first_uid = first.metadata.uid.clone().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims.get("data-web-0").await?;
    let pv_name = claim.spec.as_ref().and_then(|s| s.volume_name.clone()).context("bound")?;
    let pv = csi.wait_bound(&ns, "data-web-0", WAIT).await?;
    let handle = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.clone()).context("csi pv")?;

    // Staged once under the plugin directory, published into the pod's directory, with
    // the pod's details (podInfoOnMount) and the pod's fsGroup applied (policy File).
    let stage = calls_for(&csi, "NodeStageVolume", &handle);
    ensure!(stage.len() == 1, "stage calls: {stage:?}");
    let staging = root.join("plugins/kubernetes.io/csi").join(&csi.driver_name);
    assert!(stage[0].staging_target_path.starts_with(&*staging.to_string_lossy()), "{:?}", stage[0]);
    assert!(stage[0].staging_target_path.ends_with("/globalmount"));
    assert_eq!((stage[0].access_type.as_str(), stage[0].access_mode.as_str()), ("mount", "SINGLE_NODE_WRITER"));
    let publish = calls_for(&csi, "NodePublishVolume", &handle);
    let target = root.join(format!("pods/{first_uid}/volumes/kubernetes.io~csi/{pv_name}/mount"));
    assert_eq!(publish[0].target_path, target.to_string_lossy());
    assert_eq!(publish[0].staging_target_path, stage[0].staging_target_path);
    assert_eq!(publish[0].volume_context.get("csi.storage.k8s.io/pod.name").map(String::as_str), Some("web-0"));
    assert_eq!(publish[0].volume_context.get("csi.storage.k8s.io/ephemeral").map(String::as_str), Some("false"));
    let data = csi.state_dir.join(&handle);
    let boots = || std::fs::read_to_string(data.join("boots")).unwrap_or_default();
    eventually("the first boot in the volume", WAIT, || async { Ok((boots() == "boot\n").then_some(())) }).await?;
    let meta = std::fs::metadata(data.join("boots"))?;
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&meta), 2000, "fsGroup applied");
    // Volume stats: /stats/summary and kubelet_volume_stats_* of the claim, the driver's
    // figures (NodeGetVolumeStats: capacity is the provisioned 10Mi, not the size of the
    // file system the driver's directory is on).
    let series = format!(
        "kubelet_volume_stats_capacity_bytes{{namespace=\"{ns}\",persistentvolumeclaim=\"data-web-0\"}} {}\n",
        10 << 20
    );
    eventually("kubelet_volume_stats_* of the claim", WAIT, || async {
        let text = node.agent.metrics_text().await?;
        Ok(text.contains(&series).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    let stats_call = calls_for(&csi, "NodeGetVolumeStats", &handle);
    ensure!(stats_call.iter().any(|c| c.target_path == target.to_string_lossy() && c.code == "Ok"), "{stats_call:?}");
    let (code, summary) = node.agent.get("/stats/summary").await?;
    ensure!(code == 200, "{code}");
    let summary: serde_json::Value = serde_json::from_str(&summary)?;
    let volume = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["volume"].as_array().cloned().unwrap_or_default())
        .find(|v| v["pvcRef"]["name"] == "data-web-0")
        .context("no volume with the claim's pvcRef in /stats/summary")?;
    assert_eq!(volume["pvcRef"]["namespace"], json!(ns));
    assert!(volume["usedBytes"].as_u64().is_some_and(|b| b > 0), "{volume}");
    assert_eq!(volume["capacityBytes"], json!(10 << 20), "{volume}");
    let (used, available) = (volume["usedBytes"].as_u64().unwrap_or(0), volume["availableBytes"].as_u64());
    assert_eq!(available, Some((10 << 20) - used), "{volume}");

    // The pod deleted: the StatefulSet makes it again on the same claim, data kept.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete("web-0", &DeleteParams::default()).await?;
    let second = running_pod(&node, &ns, "web-0", Some(&first_uid)).await?;
    eventually("the second boot in the volume", WAIT, || async { Ok((boots() == "boot\nboot\n").then_some(())) })
        .await?;
    assert!(!calls_for(&csi, "NodeUnpublishVolume", &handle).is_empty(), "the first pod's volume unpublished");
    assert!(!root.join(format!("pods/{first_uid}")).exists(), "the first pod's directory is gone");

    // The agent killed and started again: the container runs on, the volume stays.
    let second_uid = second.metadata.uid.clone().unwrap_or_default();
    let ids = |cs: Vec<k8s_cri::v1::Container>| {
        let mut ids: Vec<String> = cs.into_iter().filter(|c| c.state == 1).map(|c| c.id).collect();
        ids.sort();
        ids
    };
    let before = ids(cri.containers(&second_uid).await?);
    ensure!(before.len() == 1, "running containers: {before:?}");
    // The driver runs as a pod of this agent: it too runs on through the restart, and
    // registers again with the new agent.
    let driver_uid = csi.driver_pod_uid().context("the driver's pod")?;
    let driver_before = ids(cri.containers(&driver_uid).await?);
    ensure!(driver_before.len() == 3, "the driver pod's running containers: {driver_before:?}");
    let registered = csi.calls_of("NotifyRegistrationStatus").iter().filter(|c| c.registered).count();
    node.agent.kill9()?;
    node.agent.spawn().await?;
    node.wait_ready(Duration::from_mins(1)).await?;
    // Synced again (a sync after the restart re-publishes idempotently).
    eventually("the restarted agent syncing the pod", WAIT, || async {
        let n = calls_for(&csi, "NodePublishVolume", &handle).len();
        Ok((n >= 3).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    let after = ids(cri.containers(&second_uid).await?);
    assert_eq!(before, after, "the container was restarted");
    assert_eq!(driver_before, ids(cri.containers(&driver_uid).await?), "the driver's containers were restarted");
    // The agent knows the driver before it has written the node objects and told the driver
    // (as upstream's RegisterPlugin), so the publish above may come before the notification.
    eventually("the restarted agent registering the driver again", WAIT, || async {
        let n = csi.calls_of("NotifyRegistrationStatus").iter().filter(|c| c.registered).count();
        Ok((n > registered).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    assert_eq!(boots(), "boot\nboot\n");

    // Expansion: the resizer grows the volume, the agent the file system, the claim's
    // status says so.
    claims
        .patch(
            "data-web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "20Mi"}}}})),
        )
        .await?;
    eventually("the claim's capacity 20Mi", WAIT, || async {
        let c = claims.get("data-web-0").await?;
        let cap = c.status.and_then(|s| s.capacity).and_then(|c| c.get("storage").map(|q| q.0.clone()));
        Ok((cap.as_deref() == Some("20Mi")).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    let expand = calls_for(&csi, "NodeExpandVolume", &handle);
    ensure!(expand.len() == 1 && expand[0].required_bytes == 20 << 20, "{expand:?}");
    // Upstream's event on the pod and on the claim.
    let claim = claims.get("data-web-0").await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
    let resized = eventually("FileSystemResizeSuccessful on the pod and the claim", WAIT, || async {
        let list = events.list(&kube::api::ListParams::default()).await?;
        let resized: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FileSystemResizeSuccessful"))
            .map(|e| {
                (
                    e.involved_object.kind.unwrap_or_default(),
                    e.involved_object.name.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                    e.type_.unwrap_or_default(),
                )
            })
            .collect();
        Ok((resized.len() >= 2).then_some(resized))
    })
    .await?;
    let message = format!("MountVolume.NodeExpandVolume succeeded for volume {pv_name:?} {}", node.name);
    let mut resized = resized;
    resized.sort();
    assert_eq!(
        resized,
        [
            ("PersistentVolumeClaim".to_owned(), "data-web-0".to_owned(), message.clone(), "Normal".to_owned()),
            ("Pod".to_owned(), "web-0".to_owned(), message, "Normal".to_owned()),
        ]
    );
    let status = claim.status.unwrap_or_default();
    assert!(status.allocated_resource_statuses.unwrap_or_default().is_empty());
    // Not attachable (the driver's attachRequired is false): never in the node's
    // volumesInUse, as upstream (the node has sent many statuses by now).
    let in_use = format!("kubernetes.io/csi/{}^{handle}", csi.driver_name);
    let n = node.node().await?.context("node")?;
    let listed = n.status.and_then(|s| s.volumes_in_use).unwrap_or_default();
    assert!(!listed.contains(&in_use), "{listed:?}");

    // Deleted: unpublished, then unstaged, nothing left mounted in the agent's root.
    statefulsets.delete("web", &DeleteParams::default()).await?;
    pods.delete("web-0", &DeleteParams::default()).await.ok();
    eventually("NodeUnstageVolume", WAIT, || async {
        Ok((!calls_for(&csi, "NodeUnstageVolume", &handle).is_empty()).then_some(()))
    })
    .await?;
    eventually("nothing mounted under the agent's root", WAIT, || async {
        Ok(mounts_under(&root, Some(&driver_uid)).is_empty().then_some(()))
    })
    .await?;
    assert!(!staging.join("x").parent().is_some_and(|d| d.read_dir().is_ok_and(|mut e| e.next().is_some())));
    csi.stop()?;
    node.leave(&cri).await
}

#[tokio::test]
async fn inline_and_generic_ephemeral_csi_volumes_live_as_long_as_their_pod() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join("csi-eph", AgentOptions::default()).await?;
    node.wait_ready(Duration::from_secs(30)).await?;
    let root = node.agent.root_dir.clone();
    let csi = driver_pod(&cluster, &node, CsiHostPathOptions::default()).await?;
    let ns = node.namespace("csi-eph").await?;
    let pod = json!({
        "metadata": {"name": "eph"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; echo hi > /inline/f; echo hi > /claim/f; while true; do sleep 1; done"],
                "volumeMounts": [{"name": "inline", "mountPath": "/inline"}, {"name": "claim", "mountPath": "/claim"}]
            }],
            "volumes": [
                {"name": "inline", "csi": {"driver": csi.driver_name, "volumeAttributes": {"purpose": "scratch"}}},
                {"name": "claim", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": csi.storage_class,
                    "resources": {"requests": {"storage": "5Mi"}}}}}}
            ]
        }
    });
    let created = node.create_pod(&ns, pod).await?;
    let uid = created.metadata.uid.clone().unwrap_or_default();
    running_pod(&node, &ns, "eph", None).await?;
    let publish = csi.calls_of("NodePublishVolume");
    let inline = publish
        .iter()
        .find(|c| c.volume_context.get("csi.storage.k8s.io/ephemeral").map(String::as_str) == Some("true"))
        .context("no ephemeral publish")?;
    assert_eq!(inline.volume_context.get("purpose").map(String::as_str), Some("scratch"));
    assert!(inline.staging_target_path.is_empty(), "inline volumes are not staged");
    assert!(inline.target_path.ends_with(&format!("pods/{uid}/volumes/kubernetes.io~csi/inline/mount")));
    // The generic ephemeral volume's claim is the pod's.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), &ns);
    let claim = claims.get("eph-claim").await?;
    let owners = claim.metadata.owner_references.unwrap_or_default();
    assert!(owners.iter().any(|o| o.uid == uid && o.controller == Some(true)), "{owners:?}");
    let handle = csi.wait_bound(&ns, "eph-claim", WAIT).await?.spec.and_then(|s| s.csi).context("csi")?.volume_handle;
    assert_eq!(calls_for(&csi, "NodePublishVolume", &handle).len(), 1);

    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    pods.delete("eph", &DeleteParams::default()).await?;
    eventually("both volumes unpublished and the claim's unstaged", WAIT, || async {
        let inline_gone = calls_for(&csi, "NodeUnpublishVolume", &inline.volume_id).len() == 1;
        let claim_gone = !calls_for(&csi, "NodeUnstageVolume", &handle).is_empty();
        Ok((inline_gone && claim_gone).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    // The claim goes with its pod (garbage collector), and its volume with it.
    eventually("the claim's volume deleted", WAIT, || async {
        Ok((!calls_for(&csi, "DeleteVolume", &handle).is_empty()).then_some(()))
    })
    .await?;
    let driver_uid = csi.driver_pod_uid().context("the driver's pod")?;
    let left = mounts_under(&root, Some(&driver_uid));
    ensure!(left.is_empty(), "left mounted: {left:?}");
    csi.stop()?;
    node.leave(&cri).await
}

#[tokio::test]
async fn a_driver_with_token_requests_gets_the_pods_tokens_and_is_published_again_at_each_sync() -> Result<()> {
    use k8s_openapi::api::authentication::v1::TokenReview;
    const AUDIENCE: &str = "swiftlet-csi-test";
    const TOKENS: &str = "csi.storage.k8s.io/serviceAccount.tokens";
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join("csi-tok", AgentOptions::default()).await?;
    node.wait_ready(Duration::from_secs(30)).await?;
    let opts = CsiHostPathOptions {
        requires_republish: true,
        token_requests: vec![json!({"audience": AUDIENCE, "expirationSeconds": 3600})],
        ..CsiHostPathOptions::default()
    };
    let csi = driver_pod(&cluster, &node, opts).await?;
    let ns = node.namespace("csi-tok").await?;
    let pod = json!({
        "metadata": {"name": "tok"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "volumeMounts": [{"name": "inline", "mountPath": "/inline"}]
            }],
            "volumes": [{"name": "inline", "csi": {"driver": csi.driver_name}}]
        }
    });
    let created = node.create_pod(&ns, pod).await?;
    let uid = created.metadata.uid.clone().unwrap_or_default();
    running_pod(&node, &ns, "tok", None).await?;
    let publish = csi.calls_of("NodePublishVolume");
    let first = publish.iter().find(|c| c.target_path.contains(&uid)).context("no publish of the pod's volume")?;
    let tokens: serde_json::Value =
        serde_json::from_str(first.volume_context.get(TOKENS).context("no tokens in the volume context")?)?;
    let token = tokens[AUDIENCE]["token"].as_str().context("no token for the audience")?.to_owned();
    let expiry = tokens[AUDIENCE]["expirationTimestamp"].as_str().context("no expiry")?;
    ensure!(expiry.parse::<jiff::Timestamp>().is_ok(), "expirationTimestamp {expiry:?}");

    // The API server vouches for it: the pod's service account, for that audience, bound
    // to this pod.
    let reviews: Api<TokenReview> = Api::all(cluster.client());
    let review: TokenReview = serde_json::from_value(json!({"spec": {"token": token, "audiences": [AUDIENCE]}}))?;
    let status = reviews.create(&PostParams::default(), &review).await?.status.context("no review status")?;
    ensure!(status.authenticated == Some(true), "not authenticated: {status:?}");
    let user = status.user.context("no user")?;
    assert_eq!(user.username.as_deref(), Some(format!("system:serviceaccount:{ns}:default").as_str()));
    let extra = user.extra.unwrap_or_default();
    assert_eq!(extra.get("authentication.kubernetes.io/pod-uid"), Some(&vec![uid.clone()]));
    assert_eq!(status.audiences.unwrap_or_default(), [AUDIENCE]);
    // The driver put what the token says of itself in the pod's volume.
    let seen = std::fs::read_to_string(std::path::Path::new(&first.target_path).join(TOKENS_FILE))?;
    assert_eq!(seen, format!("{AUDIENCE} {ns}/tok default\n"));

    // requiresRepublish: a sync of the pod (here: a label changed) publishes it again,
    // with the cached token.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    pods.patch("tok", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"synced": "again"}}})))
        .await?;
    let again = eventually("the volume published again", WAIT, || async {
        let calls = calls_for(&csi, "NodePublishVolume", &first.volume_id);
        Ok((calls.len() >= 2).then(|| calls[1].clone()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    assert_eq!(again.target_path, first.target_path);
    let tokens_again: serde_json::Value = serde_json::from_str(again.volume_context.get(TOKENS).context("tokens")?)?;
    assert_eq!(tokens_again[AUDIENCE]["token"].as_str(), Some(token.as_str()));

    pods.delete("tok", &DeleteParams::default()).await?;
    eventually("the volume unpublished", WAIT, || async {
        Ok((!calls_for(&csi, "NodeUnpublishVolume", &first.volume_id).is_empty()).then_some(()))
    })
    .await?;
    csi.stop()?;
    node.leave(&cri).await
}
