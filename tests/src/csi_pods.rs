//! The test bed's host-path CSI driver run the way clusters run CSI drivers: as a pod on
//! the node, whose agent mounts through it. [`crate::csi_hostpath::CsiHostPath`] uses this
//! with `Deployment::Pods`.
//!
//! - **The image** `localhost/swiftlet-csi-hostpath:dev` ([`ensure_image`]): the driver
//!   (`swiftlet-test-csi-driver`, built beside the tests), `losetup` (block volumes), and
//!   upstream's `csi-provisioner` and `csi-resizer` (built by `cargo xtask upstream
//!   build`), each with the shared libraries `ldd` names. Built when a test needs it (the
//!   driver is built with the tests, after the test bed is up) and imported into the
//!   node's containerd unless it has exactly this build. One image for the three programs
//!   where upstream ships three: they are only started from it, and one import is faster.
//! - **The objects** ([`manifests`]), as upstream's csi-driver-host-path deploys its
//!   plugin: a namespace, a service account with the sidecars' cluster role, and a
//!   `DaemonSet` pinned to the node with the driver container (privileged; `<root>/pods`
//!   and `<root>/plugins` mounted `Bidirectional` at the same paths, so the mounts it
//!   makes there reach the host and the other pods; `<root>/plugins_registry`; `/dev`)
//!   and the sidecars beside it on the socket. Two deviations, both for the test bed:
//!   the pod uses the host's network and the sidecars name the API server with
//!   `KUBERNETES_SERVICE_HOST`/`PORT` (the test bed runs no service proxy, so the
//!   `kubernetes` service's cluster IP leads nowhere; the service account's token and
//!   CA are still the ones the agent projects); and the node's registration socket is
//!   served by the driver itself (upstream's node-driver-registrar is not served by
//!   the Go module proxy here; see `swiftlet_tests::csi_driver`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};
use swiftlet_oci::{DEFAULT_PATH, HostProgram, Layer, RunConfig};

use crate::Cri;
use crate::cluster::Cluster;

/// The image's name (re-imported under the same name when its contents change).
pub const IMAGE: &str = "localhost/swiftlet-csi-hostpath:dev";

/// Where the programs are in the image.
pub const BIN_DIR: &str = "/usr/local/bin";

/// The `DaemonSet`'s (and its pods' `app` label's) name.
pub const DAEMONSET: &str = "csi-hostpathplugin";

/// The driver container's name.
pub const DRIVER_CONTAINER: &str = "hostpath";

/// The image's files: each program at [`BIN_DIR`], with its libraries at their host
/// paths; `losetup` at its own path.
fn layer(driver: &Path, sidecars: &[PathBuf]) -> Result<Layer> {
    let mut layer = Layer::default();
    let mut add = |host: &Path, at: &str| -> Result<()> {
        HostProgram::read(&host.display().to_string())?.add_to_at(&mut layer, at);
        Ok(())
    };
    add(driver, &format!("{BIN_DIR}/swiftlet-test-csi-driver"))?;
    for s in sidecars {
        let name = s.file_name().context("a sidecar without a file name")?.to_string_lossy().into_owned();
        add(s, &format!("{BIN_DIR}/{name}"))?;
    }
    add(Path::new("/usr/sbin/losetup"), "/usr/sbin/losetup")?;
    layer.dir("tmp", 0o1777);
    Ok(layer)
}

/// Builds the image from `driver` and `sidecars` (host paths) and imports it into the
/// containerd at `socket` (whose CRI is `cri`) unless it has this build already; waits
/// until CRI sees it. Returns the image id.
///
/// # Errors
/// A program is missing, `ctr` failed, or CRI did not see the image in 30 s.
pub async fn ensure_image(
    cri: &Cri,
    socket: &Path,
    driver: &Path,
    sidecars: &[PathBuf],
    scratch: &Path,
) -> Result<String> {
    let layer = layer(driver, sidecars)?;
    let run = RunConfig { env: vec![DEFAULT_PATH.into()], working_dir: "/".into(), ..RunConfig::default() };
    let archive = swiftlet_oci::oci_archive(IMAGE, &layer, &run)?;
    if cri.image_id(IMAGE).await?.as_deref() == Some(archive.image_id.as_str()) {
        return Ok(archive.image_id);
    }
    let tar = scratch.join("csi-hostpath-image.tar");
    std::fs::write(&tar, &archive.tar).with_context(|| format!("writing {}", tar.display()))?;
    let out = Command::new("ctr")
        .arg("-a")
        .arg(socket)
        .args(["-n", "k8s.io", "images", "import"])
        .arg(&tar)
        .output()
        .context("running ctr (apt package containerd)")?;
    let _ = std::fs::remove_file(&tar);
    ensure!(out.status.success(), "ctr images import: {}", String::from_utf8_lossy(&out.stderr).trim());
    // CRI learns of a ctr import from containerd's events, a moment later.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cri.image_id(IMAGE).await?.as_deref() != Some(archive.image_id.as_str()) {
        ensure!(Instant::now() < deadline, "CRI does not see {IMAGE} ({}) 30 s after its import", archive.image_id);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(archive.image_id)
}

/// What the pod deployment needs to know.
#[derive(Debug, Clone)]
pub struct PodsSpec<'a> {
    pub namespace: &'a str,
    /// The cluster role and its binding (cluster-wide names: one per deployment).
    pub cluster_role: &'a str,
    pub node_name: &'a str,
    pub kubelet_root_dir: &'a Path,
    /// The driver's arguments after the program, `--node-id` excluded (it comes from
    /// the pod's node name, as upstream's deployments pass it).
    pub driver_args: Vec<String>,
    /// Each sidecar: its program's file name and its arguments.
    pub sidecars: Vec<(String, Vec<String>)>,
    /// Host directories the containers see at the same path (the driver's state and
    /// calls log).
    pub shared_dirs: Vec<PathBuf>,
    /// `https://host:port` of the API server.
    pub server: &'a str,
}

/// A hostPath volume and its mount at the same path.
fn same_path(name: &str, path: &Path, propagation: Option<&str>) -> (Value, Value) {
    let p = path.display().to_string();
    let mut mount = json!({"name": name, "mountPath": p});
    if let Some(propagation) = propagation {
        mount["mountPropagation"] = propagation.into();
    }
    (json!({"name": name, "hostPath": {"path": p, "type": "DirectoryOrCreate"}}), mount)
}

/// The objects of the deployment (see the module documentation), as one `List`.
///
/// # Errors
/// The API server's URL has no host and port.
pub fn manifests(spec: &PodsSpec<'_>) -> Result<Value> {
    let authority = spec.server.trim_start_matches("https://").trim_end_matches('/');
    let (host, port) = authority.rsplit_once(':').context("the API server's URL has no port")?;
    let api_env = json!([
        {"name": "KUBERNETES_SERVICE_HOST", "value": host},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]);
    let root = spec.kubelet_root_dir;
    let (pods_vol, pods_mount) = same_path("mountpoint-dir", &root.join("pods"), Some("Bidirectional"));
    let (plugins_vol, plugins_mount) = same_path("plugins-dir", &root.join("plugins"), Some("Bidirectional"));
    let (reg_vol, reg_mount) = same_path("registration-dir", &root.join("plugins_registry"), None);
    let (dev_vol, dev_mount) = same_path("dev-dir", Path::new("/dev"), None);
    let mut volumes = vec![pods_vol, plugins_vol, reg_vol, dev_vol];
    let mut driver_mounts = vec![pods_mount, plugins_mount.clone(), reg_mount, dev_mount];
    for (i, dir) in spec.shared_dirs.iter().enumerate() {
        let (v, m) = same_path(&format!("data-{i}"), dir, None);
        volumes.push(v);
        driver_mounts.push(m);
    }
    // The sidecars need only the socket's directory.
    let mut socket_mount = plugins_mount;
    socket_mount.as_object_mut().map(|m| m.remove("mountPropagation"));

    let mut args = spec.driver_args.clone();
    args.push("--node-id=$(KUBE_NODE_NAME)".into());
    let mut containers = vec![json!({
        "name": DRIVER_CONTAINER,
        "image": IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": [format!("{BIN_DIR}/swiftlet-test-csi-driver")],
        "args": args,
        "env": [{"name": "KUBE_NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}}],
        "securityContext": {"privileged": true},
        "volumeMounts": driver_mounts,
    })];
    for (program, args) in &spec.sidecars {
        containers.push(json!({
            "name": program,
            "image": IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": [format!("{BIN_DIR}/{program}")],
            "args": args,
            "env": api_env,
            "volumeMounts": [socket_mount],
        }));
    }
    let labels = json!({"app.kubernetes.io/name": DAEMONSET});
    let ns = spec.namespace;
    let rules = json!([
        {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch", "update", "patch"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims/status"], "verbs": ["patch", "update"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch", "create", "update", "patch"]},
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses", "csinodes", "volumeattachments", "volumeattributesclasses"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots", "volumesnapshotcontents"], "verbs": ["get", "list"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "watch", "list", "delete", "update", "create"]},
    ]);
    Ok(json!({
        "apiVersion": "v1", "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "csi-hostpathplugin-sa", "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": spec.cluster_role}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": spec.cluster_role},
             "subjects": [{"kind": "ServiceAccount", "name": "csi-hostpathplugin-sa", "namespace": ns}],
             "roleRef": {"kind": "ClusterRole", "name": spec.cluster_role, "apiGroup": "rbac.authorization.k8s.io"}},
            {"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": DAEMONSET, "namespace": ns},
             "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "csi-hostpathplugin-sa",
                        "nodeSelector": {"kubernetes.io/hostname": spec.node_name},
                        "hostNetwork": true,
                        "terminationGracePeriodSeconds": 5,
                        "containers": containers,
                        "volumes": volumes,
                    }
                }
             }},
        ]
    }))
}

/// The deployment's pod as the API shows it, if it has one.
///
/// # Errors
/// The API server refused.
pub fn pod(cluster: &Cluster, namespace: &str) -> Result<Option<Value>> {
    let out = cluster.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        &format!("app.kubernetes.io/name={DAEMONSET}"),
        "-o",
        "json",
    ])?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"].as_array().and_then(|items| items.first()).cloned())
}

/// Why the pod cannot come up, if it shows that it cannot: a container waiting for a
/// reason other than starting (an image or configuration error, a crash loop) or
/// terminated.
#[must_use]
pub fn failing(pod: &Value) -> Option<String> {
    let statuses = pod["status"]["containerStatuses"].as_array()?;
    statuses.iter().find_map(|c| {
        let name = c["name"].as_str().unwrap_or_default();
        if let Some(reason) = c["state"]["waiting"]["reason"].as_str().filter(|r| *r != "ContainerCreating") {
            return Some(format!("{name}: waiting: {reason}: {}", c["state"]["waiting"]["message"]));
        }
        let t = &c["state"]["terminated"];
        (t.is_object() || c["restartCount"].as_i64().unwrap_or(0) > 0).then(|| {
            let last = &c["lastState"]["terminated"];
            format!("{name}: exited ({t}), before: {last}")
        })
    })
}

/// A container's output, through the API (`kubectl logs`), or why it could not be had.
#[must_use]
pub fn logs(cluster: &Cluster, namespace: &str, container: &str) -> String {
    let target = format!("daemonset/{DAEMONSET}");
    match cluster.kubectl_ok(&["logs", "-n", namespace, &target, "-c", container]) {
        Ok(out) => out,
        Err(e) => format!("(no log of {container}: {e:#})"),
    }
}

/// Deletes the deployment and waits (60 s) until its pod is gone, its containers
/// stopped by the node's agent; then the cluster role and its binding.
///
/// # Errors
/// The pod did not go: the agent is not running, or did not stop it.
pub fn delete(cluster: &Cluster, namespace: &str, cluster_role: &str) -> Result<()> {
    let _ = cluster.kubectl(&["delete", "namespace", namespace, "--ignore-not-found", "--wait=false"]);
    let deadline = Instant::now() + Duration::from_mins(1);
    let gone = loop {
        match pod(cluster, namespace) {
            Ok(None) => break true,
            Ok(Some(_)) | Err(_) if Instant::now() >= deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    };
    let role = format!("clusterrole/{cluster_role}");
    let binding = format!("clusterrolebinding/{cluster_role}");
    cluster.kubectl_ok(&["delete", &role, &binding, "--ignore-not-found"])?;
    if !gone {
        bail!("the CSI driver's pod in {namespace} was not removed in 60 s (is the node's agent running?)");
    }
    Ok(())
}
