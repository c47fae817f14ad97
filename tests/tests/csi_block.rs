//! CSI block volumes on a swiftlet node of the test bed's real control plane: a
//! `volumeMode: Block` claim provisioned by the host-path driver
//! (`swiftlet-test-csi-driver`, a sparse image on a loop device) is staged and published
//! by the agent and handed to the container as a device at its `volumeDevices` path; what
//! the container writes there survives the pod; the pod's deletion unpublishes and
//! unstages it and leaves no loop device or mount behind. And an attachable driver
//! (`attachRequired: true`) with upstream's csi-attacher: the agent waits for the
//! attachment, then stages with the publish context the attach gave. The driver runs as a
//! pod on the node (`Deployment::Pods`, as clusters deploy CSI drivers); the attacher, a
//! controller-side sidecar, as a process beside it.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use swiftlet_tests::cluster::{Cluster, ClusterNode, phase};
use swiftlet_tests::csi_driver::{self, ATTACHED_TO_KEY, CsiCall, Store};
use swiftlet_tests::csi_hostpath::{CsiHostPath, CsiHostPathOptions, Deployment, mounts_under};
use swiftlet_tests::pods::BUSYBOX;
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, eventually, tail, testbed_lock};

const WAIT: Duration = Duration::from_secs(90);

/// What the first pod writes at the start of the device.
const MARKER: &str = "swiftlet-block-marker";

fn calls_for(csi: &CsiHostPath, method: &str, volume: &str) -> Vec<CsiCall> {
    csi.calls_of(method).into_iter().filter(|c| c.volume_id == volume).collect()
}

/// A pod on `node` that maps claim `claim` at `/dev/xvda` and runs `script`.
fn block_pod(node: &ClusterNode, name: &str, claim: &str, script: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("trap 'exit 0' TERM; {script}; while true; do sleep 1; done")],
                "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        }
    })
}

/// The pod's log once it has a line starting with `prefix`.
async fn log_line(node: &ClusterNode, ns: &str, pod: &str, prefix: &str) -> Result<String> {
    let cluster = node.cluster.clone();
    eventually(&format!("{prefix} in the log of {ns}/{pod}"), WAIT, || async {
        let logs = cluster.kubectl_ok(&["-n", ns, "logs", pod]).unwrap_or_default();
        Ok(logs.lines().find(|l| l.starts_with(prefix)).map(str::to_owned))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))
}

async fn running(node: &ClusterNode, ns: &str, name: &str) -> Result<Pod> {
    node.eventually_pod(ns, name, WAIT, "Running", |p| phase(p) == "Running").await
}

#[tokio::test]
async fn a_block_claim_is_a_device_in_the_container_its_data_outlives_the_pod_and_nothing_is_left_after() -> Result<()>
{
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join("csi-blk", AgentOptions::default()).await?;
    node.wait_ready(Duration::from_secs(30)).await?;
    let root = node.agent.root_dir.clone();
    // The driver as a pod on the node, as clusters run it: its loop devices and mounts
    // are made from its privileged container.
    let opts = CsiHostPathOptions { deployment: Deployment::Pods, ..CsiHostPathOptions::default() };
    let csi = CsiHostPath::start(&cluster, &node.name, &root, opts)
        .await
        .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 80)))?;
    let driver_uid = csi.driver_pod_uid().context("the driver's pod")?;
    let ns = node.namespace("csi-blk").await?;

    let pv = csi.create_bound_claim(&ns, csi.claim("raw", "8Mi", true), WAIT).await?;
    let spec = pv.spec.clone().context("pv spec")?;
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    let handle = spec.csi.context("csi pv")?.volume_handle;
    let image = Store::new(&csi.state_dir).image_path(&handle);

    // The first pod: the device is a block device at its path; it writes the marker and
    // reads it back.
    let write = format!(
        "[ -b /dev/xvda ] && echo is-block; printf {MARKER} | dd of=/dev/xvda bs=512 conv=notrunc,fsync 2>/dev/null; \
         echo read:$(dd if=/dev/xvda bs={} count=1 2>/dev/null)",
        MARKER.len()
    );
    let first = node.create_pod(&ns, block_pod(&node, "writer", "raw", &write)).await?;
    let first_uid = first.metadata.uid.clone().unwrap_or_default();
    running(&node, &ns, "writer").await?;
    assert_eq!(log_line(&node, &ns, "writer", "read:").await?, format!("read:{MARKER}"));
    assert_eq!(log_line(&node, &ns, "writer", "is-").await?, "is-block");
    // Written through to the driver's volume (its image file).
    let on_disk = std::fs::read(&image)?;
    ensure!(on_disk.starts_with(MARKER.as_bytes()), "the image starts with {:?}", &on_disk[..32]);

    // Staged and published as a block volume.
    let stage = calls_for(&csi, "NodeStageVolume", &handle);
    ensure!(stage.len() == 1 && stage[0].access_type == "block", "{stage:?}");
    let publish = calls_for(&csi, "NodePublishVolume", &handle);
    ensure!(publish.len() == 1 && publish[0].access_type == "block", "{publish:?}");
    assert_eq!(publish[0].staging_target_path, stage[0].staging_target_path);
    let loops = csi_driver::loop_devices_of(&image).map_err(|s| anyhow::anyhow!("{s}"))?;
    ensure!(loops.len() == 1, "one loop device while in use: {loops:?}");

    // Stats: the driver's figures for the device (its capacity is the claim's 8Mi).
    let series = format!(
        "kubelet_volume_stats_capacity_bytes{{namespace=\"{ns}\",persistentvolumeclaim=\"raw\"}} {}\n",
        8 << 20
    );
    eventually("kubelet_volume_stats_capacity_bytes of the block claim", WAIT, || async {
        Ok(node.agent.metrics_text().await?.contains(&series).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    let stats = calls_for(&csi, "NodeGetVolumeStats", &handle);
    ensure!(stats.iter().any(|c| c.target_path == publish[0].target_path && c.code == "Ok"), "{stats:?}");

    // Deleted: unpublished and unstaged, the loop device detached, nothing mounted.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    pods.delete("writer", &DeleteParams::default()).await?;
    eventually("the first pod gone", WAIT, || async { Ok(pods.get_opt("writer").await?.is_none().then_some(())) })
        .await?;
    eventually("NodeUnpublishVolume and NodeUnstageVolume", WAIT, || async {
        let unpublished = calls_for(&csi, "NodeUnpublishVolume", &handle);
        let unstaged = calls_for(&csi, "NodeUnstageVolume", &handle);
        Ok((!unpublished.is_empty() && !unstaged.is_empty()).then_some((unpublished, unstaged)))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))
    .map(|(unpublished, unstaged)| {
        assert_eq!(unpublished[0].target_path, publish[0].target_path);
        assert_eq!(unstaged[0].staging_target_path, stage[0].staging_target_path);
        assert!(unstaged.iter().all(|c| c.code == "Ok"), "{unstaged:?}");
    })?;
    eventually("no loop device and nothing mounted under the agent's root", WAIT, || async {
        let loops = csi_driver::loop_devices_of(&image).map_err(|s| anyhow::anyhow!("{s}"))?;
        Ok((loops.is_empty() && mounts_under(&root, Some(&driver_uid)).is_empty()).then_some(()))
    })
    .await
    .with_context(|| format!("left mounted: {:?}", mounts_under(&root, Some(&driver_uid))))?;
    assert!(!root.join(format!("pods/{first_uid}")).exists(), "the first pod's directory is gone");

    // A new pod on the same claim reads what the first one wrote.
    let read = format!("echo read:$(dd if=/dev/xvda bs={} count=1 2>/dev/null)", MARKER.len());
    node.create_pod(&ns, block_pod(&node, "reader", "raw", &read)).await?;
    running(&node, &ns, "reader").await?;
    assert_eq!(log_line(&node, &ns, "reader", "read:").await?, format!("read:{MARKER}"));
    assert_eq!(calls_for(&csi, "NodeStageVolume", &handle).len(), 2, "staged again");

    pods.delete("reader", &DeleteParams::default()).await?;
    eventually("unstaged again, no loop device, nothing mounted", WAIT, || async {
        let unstaged = calls_for(&csi, "NodeUnstageVolume", &handle).len() == 2;
        let loops = csi_driver::loop_devices_of(&image).map_err(|s| anyhow::anyhow!("{s}"))?;
        Ok((unstaged && loops.is_empty() && mounts_under(&root, Some(&driver_uid)).is_empty()).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    csi.stop()?;
    node.leave(&cri).await
}

/// The `VolumeAttachment`'s name upstream gives a volume on a node.
fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    use sha2::Digest as _;
    use std::fmt::Write as _;
    let digest = sha2::Sha256::digest(format!("{handle}{driver}{node}"));
    digest.iter().fold(String::from("csi-"), |mut name, b| {
        let _ = write!(name, "{b:02x}");
        name
    })
}

#[tokio::test]
async fn an_attachable_volume_waits_for_its_attachment_and_is_staged_with_its_publish_context() -> Result<()> {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join("csi-att", AgentOptions::default()).await?;
    node.wait_ready(Duration::from_secs(30)).await?;
    let root = node.agent.root_dir.clone();
    let opts = CsiHostPathOptions {
        driver_name: "attach.csi.swiftlet.test".into(),
        storage_class: "swiftlet-csi-attach".into(),
        attach_required: true,
        resizer: false,
        deployment: Deployment::Pods,
        ..CsiHostPathOptions::default()
    };
    let mut csi = CsiHostPath::start(&cluster, &node.name, &root, opts)
        .await
        .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 80)))?;
    let driver_uid = csi.driver_pod_uid().context("the driver's pod")?;
    let ns = node.namespace("csi-att").await?;
    let pv = csi.create_bound_claim(&ns, csi.claim("att", "4Mi", false), WAIT).await?;
    let handle = pv.spec.and_then(|s| s.csi).context("csi pv")?.volume_handle;
    let unique = format!("kubernetes.io/csi/{}^{handle}", csi.driver_name);

    let pod = json!({
        "metadata": {"name": "att"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "att"}}]
        }
    });
    let created = node.create_pod(&ns, pod).await?;
    let uid = created.metadata.uid.clone().unwrap_or_default();

    // The attach/detach controller makes the attachment; nobody attaches it yet. The
    // agent wants the volume (volumesInUse) but neither stages nor starts the pod.
    let attachments: Api<VolumeAttachment> = Api::all(cluster.client());
    let name = attachment_name(&handle, &csi.driver_name, &node.name);
    let va = eventually("the VolumeAttachment", WAIT, || async { Ok(attachments.get_opt(&name).await?) }).await?;
    assert_eq!(va.spec.attacher, csi.driver_name);
    assert!(!va.status.is_some_and(|s| s.attached), "attached with no attacher running");
    eventually("the volume in the node's volumesInUse", WAIT, || async {
        let n = node.node().await?.context("node")?;
        let in_use = n.status.and_then(|s| s.volumes_in_use).unwrap_or_default();
        Ok(in_use.contains(&unique).then_some(()))
    })
    .await
    .with_context(|| format!("--- agent log ---\n{}", tail(&node.agent.log(), 60)))?;
    ensure!(calls_for(&csi, "NodeStageVolume", &handle).is_empty(), "staged before it was attached");
    ensure!(calls_for(&csi, "NodePublishVolume", &handle).is_empty(), "published before it was attached");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    let waiting = pods.get("att").await?;
    assert_eq!(phase(&waiting), "Pending");
    ensure!(cri.containers(&uid).await?.is_empty(), "a container started before the volume was attached");
    // As upstream, waiting for an attachment is no FailedMount (until the 2 min 3 s wait
    // times out).
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(cluster.client(), &ns);
    let failed: Vec<String> = events
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedMount"))
        .filter_map(|e| e.message)
        .collect();
    ensure!(failed.is_empty(), "FailedMount while waiting for the attachment: {failed:?}");

    // upstream's csi-attacher started: it attaches the volume through the driver's
    // ControllerPublishVolume (to the node id the agent registered in the CSINode) and
    // puts the driver's publish context in the attachment's status.
    csi.start_attacher().await?;
    running(&node, &ns, "att").await?;
    let attach = calls_for(&csi, "ControllerPublishVolume", &handle);
    // (The attacher may publish again, idempotently, when it syncs the attachment anew.)
    ensure!(!attach.is_empty() && attach.iter().all(|c| c.node_id == node.name && c.code == "Ok"), "{attach:?}");
    let va = attachments.get(&name).await?;
    let metadata = va.status.and_then(|s| s.attachment_metadata).unwrap_or_default();
    assert_eq!(metadata.get(ATTACHED_TO_KEY), Some(&node.name), "{metadata:?}");
    // Staged and published with that publish context (the driver refuses a stage
    // without it).
    let stage = calls_for(&csi, "NodeStageVolume", &handle);
    ensure!(stage.len() == 1 && stage[0].code == "Ok", "{stage:?}");
    assert_eq!(stage[0].publish_context, metadata);
    let publish = calls_for(&csi, "NodePublishVolume", &handle);
    assert_eq!(publish[0].publish_context, metadata);
    // The controller records the attachment in the node's status; the agent keeps it
    // (its status updates do not drop volumesAttached) and lists the volume in use.
    eventually("volumesAttached and volumesInUse", WAIT, || async {
        let n = node.node().await?.context("node")?;
        let s = n.status.unwrap_or_default();
        let attached = s.volumes_attached.unwrap_or_default().iter().any(|v| v.name == unique);
        let in_use = s.volumes_in_use.unwrap_or_default().contains(&unique);
        Ok((attached && in_use).then_some(()))
    })
    .await?;

    // Deleted: torn down, out of volumesInUse; the controller then detaches (the
    // attacher's ControllerUnpublishVolume, the attachment deleted) and drops it from
    // volumesAttached.
    pods.delete("att", &DeleteParams::default()).await?;
    eventually("unstaged, detached and out of the node's status", WAIT, || async {
        let unstaged = !calls_for(&csi, "NodeUnstageVolume", &handle).is_empty()
            && !calls_for(&csi, "ControllerUnpublishVolume", &handle).is_empty();
        let n = node.node().await?.context("node")?;
        let s = n.status.unwrap_or_default();
        let attached = s.volumes_attached.unwrap_or_default().iter().any(|v| v.name == unique);
        let in_use = s.volumes_in_use.unwrap_or_default().contains(&unique);
        let va = attachments.get_opt(&name).await?;
        Ok((unstaged && !attached && !in_use && va.is_none()).then_some(()))
    })
    .await
    .with_context(|| {
        let calls: Vec<String> =
            csi.calls().iter().filter(|c| c.volume_id == handle).map(|c| format!("{} {}", c.method, c.code)).collect();
        format!(
            "calls: {calls:?}\n--- agent log ---\n{}\n--- csi-attacher ---\n{}",
            tail(&node.agent.log(), 60),
            tail(&csi.log("csi-attacher"), 30)
        )
    })?;
    // Unpublished from the node before it was detached.
    let order: Vec<String> = csi
        .calls()
        .into_iter()
        .filter(|c| c.volume_id == handle && c.method.contains("Unpublish"))
        .map(|c| c.method)
        .collect();
    assert_eq!(order.first().map(String::as_str), Some("NodeUnpublishVolume"), "{order:?}");
    let left = mounts_under(&root, Some(&driver_uid));
    ensure!(left.is_empty(), "left mounted: {left:?}");
    csi.stop()?;
    node.leave(&cri).await
}
