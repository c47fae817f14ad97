//! Node plugins (the test bed's CSI driver, upstream's DRA test driver) run the way
//! clusters run them: as a `DaemonSet` pod pinned to the node, whose agent then talks to
//! the plugin through the sockets the pod serves on the node's paths.
//!
//! What the deployments share: importing a locally built image into the node's runtime
//! ([`import_image`]: the test bed's containerd, or the node container's through the
//! node's own `ctr`), the objects ([`PluginDaemonSet`]: the `DaemonSet`, its namespace,
//! service account and cluster role),
//! hostPath volumes at the node's own paths ([`same_path`]), the API server's address for
//! a pod on the host's network ([`api_env`]), and the pod's state, logs and removal.
//!
//! One deviation from upstream's deployments, for the test bed: the pods use the node's
//! network and name the API server with `KUBERNETES_SERVICE_HOST`/`PORT` (the test bed
//! runs no service proxy, so the `kubernetes` service's cluster IP leads nowhere; the
//! service account's token and CA are still the ones the agent projects).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};
use swiftlet_oci::{DEFAULT_PATH, Layer, RunConfig};

use crate::Cri;
use crate::cluster::Cluster;

/// Builds image `image` of `layer` (programs started by the pod's `command`: the image
/// sets only `PATH` and `/` as the working directory) and imports it into the runtime
/// the tests use (the test bed's containerd, or the node container's runtime) unless it
/// has this build already; waits until CRI sees it. Returns the image id. `scratch`
/// holds the archive meanwhile.
///
/// # Errors
/// `ctr` failed, or CRI did not see the image in 30 s.
pub async fn import_image(image: &str, layer: &Layer, scratch: &Path) -> Result<String> {
    let endpoint = crate::cri_endpoint()?;
    let cri = Cri::connect(&endpoint)?;
    let run = RunConfig { env: vec![DEFAULT_PATH.into()], working_dir: "/".into(), ..RunConfig::default() };
    let archive = swiftlet_oci::oci_archive(image, layer, &run)?;
    if cri.image_id(image).await?.as_deref() == Some(archive.image_id.as_str()) {
        return Ok(archive.image_id);
    }
    let file = image.rsplit('/').next().unwrap_or(image).replace(':', "-");
    let tar = scratch.join(format!("{file}.tar"));
    std::fs::write(&tar, &archive.tar).with_context(|| format!("writing {}", tar.display()))?;
    let imported = if let Some((node, runtime)) = crate::node::node_target()? {
        node.import_image(*runtime, &tar)
    } else {
        Command::new("ctr")
            .arg("-a")
            .arg(endpoint.trim_start_matches("unix://"))
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&tar)
            .output()
            .context("running ctr (apt package containerd)")
            .and_then(|out| {
                ensure!(out.status.success(), "ctr images import: {}", String::from_utf8_lossy(&out.stderr).trim());
                Ok(())
            })
    };
    let _ = std::fs::remove_file(&tar);
    imported?;
    // CRI learns of a ctr import from containerd's events, a moment later.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cri.image_id(image).await?.as_deref() != Some(archive.image_id.as_str()) {
        ensure!(Instant::now() < deadline, "CRI does not see {image} ({}) 30 s after its import", archive.image_id);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(archive.image_id)
}

/// A hostPath volume (a directory, made if missing) and its mount at the same path.
#[must_use]
pub fn same_path(name: &str, path: &Path, propagation: Option<&str>) -> (Value, Value) {
    let p = path.display().to_string();
    let mut mount = json!({"name": name, "mountPath": p});
    if let Some(propagation) = propagation {
        mount["mountPropagation"] = propagation.into();
    }
    (json!({"name": name, "hostPath": {"path": p, "type": "DirectoryOrCreate"}}), mount)
}

/// The environment that names the API server at `server` (`https://host:port`) to a
/// client using its in-cluster configuration.
///
/// # Errors
/// The URL has no host and port.
pub fn api_env(server: &str) -> Result<Value> {
    let authority = server.trim_start_matches("https://").trim_end_matches('/');
    let (host, port) = authority.rsplit_once(':').context("the API server's URL has no port")?;
    Ok(json!([
        {"name": "KUBERNETES_SERVICE_HOST", "value": host},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]))
}

/// A plugin's deployment: a `DaemonSet` pinned to one node on the node's network, its
/// pods labelled `app.kubernetes.io/name=<name>`, in a namespace of its own with a
/// service account bound to a cluster role.
#[derive(Debug, Clone)]
pub struct PluginDaemonSet<'a> {
    /// Labelled as the tests' namespaces, so that a later run removes it if this one
    /// could not.
    pub namespace: &'a str,
    pub name: &'a str,
    pub service_account: &'a str,
    /// The cluster role and its binding (cluster-wide names: one per deployment).
    pub cluster_role: &'a str,
    pub rules: Value,
    pub node_name: &'a str,
    pub containers: Vec<Value>,
    pub volumes: Vec<Value>,
}

impl PluginDaemonSet<'_> {
    /// The objects, as one `List` for `kubectl apply`.
    #[must_use]
    pub fn objects(&self) -> Value {
        let (ns, account, role) = (self.namespace, self.service_account, self.cluster_role);
        let labels = json!({"app.kubernetes.io/name": self.name});
        json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": ns, "labels": {crate::cluster::TEST_LABEL: "true"}}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": role}, "rules": self.rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": role},
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
             "roleRef": {"kind": "ClusterRole", "name": role, "apiGroup": "rbac.authorization.k8s.io"}},
            {"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": self.name, "namespace": ns},
             "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": account,
                        "nodeSelector": {"kubernetes.io/hostname": self.node_name},
                        // On the node whatever its taints, as node plugins' DaemonSets
                        // commonly are (the benches' nodes carry one).
                        "tolerations": [{"operator": "Exists"}],
                        "hostNetwork": true,
                        "terminationGracePeriodSeconds": 5,
                        "containers": self.containers,
                        "volumes": self.volumes,
                    }
                }
             }},
        ]})
    }
}

/// The namespace of a plugin's deployment for node `node_name`: `<prefix>-<node>`, cut to
/// the 63 characters a namespace name may have.
#[must_use]
pub fn namespace(prefix: &str, node_name: &str) -> String {
    let mut namespace = format!("{prefix}-{node_name}");
    namespace.truncate(63);
    namespace.trim_end_matches('-').to_owned()
}

/// The pod of `DaemonSet` `daemonset` in `namespace` (its pods are labelled
/// `app.kubernetes.io/name=<daemonset>`) as the API shows it, if it has one.
///
/// # Errors
/// The API server refused.
pub fn pod(cluster: &Cluster, namespace: &str, daemonset: &str) -> Result<Option<Value>> {
    let selector = format!("app.kubernetes.io/name={daemonset}");
    let out = cluster.kubectl_ok(&["get", "pods", "-n", namespace, "-l", &selector, "-o", "json"])?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"].as_array().and_then(|items| items.first()).cloned())
}

/// The uid of the pod of `DaemonSet` `daemonset` in `namespace`, if it has one.
///
/// # Errors
/// The API server refused.
pub fn pod_uid(cluster: &Cluster, namespace: &str, daemonset: &str) -> Result<Option<String>> {
    let pod = pod(cluster, namespace, daemonset)?;
    Ok(pod.and_then(|pod| pod["metadata"]["uid"].as_str().map(str::to_owned)))
}

/// The events of `namespace` (`kubectl get events`), for a deployment that did not come
/// up; empty if they could not be had.
#[must_use]
pub fn events(cluster: &Cluster, namespace: &str) -> String {
    let out = cluster.kubectl(&["get", "events", "-n", namespace]).map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&out).into_owned()
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
pub fn logs(cluster: &Cluster, namespace: &str, daemonset: &str, container: &str) -> String {
    let target = format!("daemonset/{daemonset}");
    match cluster.kubectl_ok(&["logs", "-n", namespace, &target, "-c", container]) {
        Ok(out) => out,
        Err(e) => format!("(no log of {container}: {e:#})"),
    }
}

/// The log files the agent whose pod logs are in `logs_dir` (a host path) keeps of
/// container `container` of the pods of `namespace`, every instance, oldest first: what
/// a plugin said also while its agent was down.
#[must_use]
pub fn log_files(logs_dir: &Path, namespace: &str, container: &str) -> Vec<PathBuf> {
    let prefix = format!("{namespace}_");
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(logs_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .flat_map(|pod| std::fs::read_dir(pod.path().join(container)).into_iter().flatten().flatten())
        .filter_map(|f| {
            let path = f.path();
            let attempt = path.file_stem()?.to_str()?.parse().ok()?;
            Some((attempt, path))
        })
        .collect();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

/// Deletes namespace `namespace` and waits (60 s) until the pod of `daemonset` is gone,
/// its containers stopped by the node's agent; then the cluster role `cluster_role` and
/// its binding.
///
/// # Errors
/// The pod did not go: the agent is not running, or did not stop it.
pub fn delete(cluster: &Cluster, namespace: &str, daemonset: &str, cluster_role: &str) -> Result<()> {
    let _ = cluster.kubectl(&["delete", "namespace", namespace, "--ignore-not-found", "--wait=false"]);
    let deadline = Instant::now() + Duration::from_mins(1);
    let gone = loop {
        match pod(cluster, namespace, daemonset) {
            Ok(None) => break true,
            Ok(Some(_)) | Err(_) if Instant::now() >= deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    };
    let role = format!("clusterrole/{cluster_role}");
    let binding = format!("clusterrolebinding/{cluster_role}");
    cluster.kubectl_ok(&["delete", &role, &binding, "--ignore-not-found"])?;
    if !gone {
        bail!("the pod of {namespace}/{daemonset} was not removed in 60 s (is the node's agent running?)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_cut_to_63_characters_without_a_trailing_dash() {
        assert_eq!(namespace("csi", "e2e-node-1a2b"), "csi-e2e-node-1a2b");
        // The 63rd character is a dash: it goes too.
        let node = format!("{}-xyz", "n".repeat(51));
        assert_eq!(namespace("dra-driver", &node), format!("dra-driver-{}", "n".repeat(51)));
        let long = "n".repeat(70);
        assert_eq!(namespace("csi", &long).len(), 63);
    }

    #[test]
    fn log_files_are_those_of_the_container_in_the_namespace_oldest_attempt_first() {
        let dir = tempfile::tempdir().unwrap();
        for (pod, container, file) in [
            ("dra-a_plugin-x_u1", "plugin", "10.log"),
            ("dra-a_plugin-x_u1", "plugin", "2.log"),
            ("dra-a_plugin-x_u1", "other", "0.log"),
            ("dra-b_plugin-y_u2", "plugin", "0.log"),
        ] {
            let d = dir.path().join(pod).join(container);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), "x").unwrap();
        }
        let names: Vec<String> = log_files(dir.path(), "dra-a", "plugin")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["2.log", "10.log"]);
    }
}
