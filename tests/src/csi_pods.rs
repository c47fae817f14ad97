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
//!   and the sidecars beside it on the socket. Deviations, both for the test bed: the
//!   host's network and the API server's address given (see [`crate::plugin_pods`]);
//!   and the node's registration socket is served by the driver itself (upstream's
//!   node-driver-registrar is not served by the Go module proxy here; see
//!   `swiftlet_tests::csi_driver`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use swiftlet_oci::{HostProgram, Layer};

use crate::plugin_pods;

/// The image's name (re-imported under the same name when its contents change).
pub const IMAGE: &str = "localhost/swiftlet-csi-hostpath:dev";

/// Where the programs are in the image.
pub const BIN_DIR: &str = "/usr/local/bin";

/// The `DaemonSet`'s (and its pods' `app` label's) name.
pub const DAEMONSET: &str = "csi-hostpathplugin";

/// The pods' service account.
const SERVICE_ACCOUNT: &str = "csi-hostpathplugin-sa";

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
/// node's runtime unless it has this build already (see
/// [`crate::plugin_pods::import_image`]). Returns the image id.
///
/// # Errors
/// A program is missing, `ctr` failed, or CRI did not see the image in 30 s.
pub async fn ensure_image(driver: &Path, sidecars: &[PathBuf], scratch: &Path) -> Result<String> {
    let layer = layer(driver, sidecars)?;
    plugin_pods::import_image(IMAGE, &layer, scratch).await
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

/// The objects of the deployment (see the module documentation), as one `List`.
///
/// # Errors
/// The API server's URL has no host and port.
pub fn manifests(spec: &PodsSpec<'_>) -> Result<Value> {
    let api_env = plugin_pods::api_env(spec.server)?;
    let root = spec.kubelet_root_dir;
    let (pods_vol, pods_mount) = plugin_pods::same_path("mountpoint-dir", &root.join("pods"), Some("Bidirectional"));
    let (plugins_vol, plugins_mount) =
        plugin_pods::same_path("plugins-dir", &root.join("plugins"), Some("Bidirectional"));
    let (reg_vol, reg_mount) = plugin_pods::same_path("registration-dir", &root.join("plugins_registry"), None);
    let (dev_vol, dev_mount) = plugin_pods::same_path("dev-dir", Path::new("/dev"), None);
    let mut volumes = vec![pods_vol, plugins_vol, reg_vol, dev_vol];
    let mut driver_mounts = vec![pods_mount, plugins_mount.clone(), reg_mount, dev_mount];
    for (i, dir) in spec.shared_dirs.iter().enumerate() {
        let (v, m) = plugin_pods::same_path(&format!("data-{i}"), dir, None);
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
    Ok(plugin_pods::PluginDaemonSet {
        namespace: spec.namespace,
        name: DAEMONSET,
        service_account: SERVICE_ACCOUNT,
        cluster_role: spec.cluster_role,
        rules,
        node_name: spec.node_name,
        containers,
        volumes,
    }
    .objects())
}
