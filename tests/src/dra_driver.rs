//! Upstream's DRA test driver (`k8s.io/kubernetes/test/e2e/dra/test-driver`, built into
//! the control plane's binary directory by `cargo xtask upstream build` as
//! `test-driver`) as the kubelet plugin of one node: it publishes the node's
//! `ResourceSlice` (devices `device-00`..), registers with the agent through
//! `<root-dir>/plugins_registry`, serves `NodePrepareResources` on
//! `<root-dir>/plugins/<driver>/dra.sock`, and writes one CDI spec per prepared claim
//! request (a device that sets `claim_<claim>_<request>=true` in the container).
//!
//! Two ways to run it ([`Deployment`]):
//!
//! - **As a pod on the node** (`Deployment::Pod`), the way clusters run DRA drivers: a
//!   `DaemonSet` pinned to the node, its service account bound to the cluster role
//!   upstream's example deployment gives the kubelet plugin (`resourceslices` all verbs,
//!   `resourceclaims` and `nodes` get), the node's `plugins_registry`,
//!   `plugins/<driver>` and CDI directory mounted from the node. Its image,
//!   `localhost/swiftlet-dra-test-driver:dev`, holds the driver binary and is imported
//!   into the node's runtime ([`crate::plugin_pods`]). On the host the CDI directory is a
//!   directory of the test (the host's containerd 1.6 reads no CDI specs anyway); in the
//!   node container it is the node's `/var/run/cdi`, which the node's containerd 2.x
//!   applies. Its log is the container's log as the agent keeps it, every instance.
//! - **As a process** (`Deployment::Process`) beside the agent: a child process on the
//!   host; in the node container ([`crate::node::node_target`]) a transient systemd unit
//!   of the node, writing its specs to the node's `/var/run/cdi`.
//!
//! Stopped by deleting its objects (the agent stops the pod), by pid or by unit, never
//! by name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::{Value, json};
use swiftlet_oci::{HostProgram, Layer};

use crate::cluster::Cluster;
use crate::{Agent, plugin_pods};

/// The driver's name (its default).
pub const DRIVER: &str = "test-driver.cdi.k8s.io";
/// The unit the driver runs as in the node container.
const UNIT: &str = "swiftlet-dra-test-driver";

/// The verbosity the driver runs with: from 6 on it logs every gRPC call it serves
/// (`handling request`, with the request), which [`DraTestDriver::calls`] counts.
const VERBOSITY: &str = "-v=6";

/// How the driver runs (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// A `DaemonSet` pod on the node, run by its agent.
    Pod,
    /// A process beside the agent.
    Process,
}

/// The image of the pod deployment.
pub const IMAGE: &str = "localhost/swiftlet-dra-test-driver:dev";
/// The `DaemonSet`'s (and its pods' `app.kubernetes.io/name` label's) name.
pub const DAEMONSET: &str = "dra-test-driver";
/// The driver container's name.
const CONTAINER: &str = "plugin";
/// The driver's path in the image.
const IMAGE_BIN: &str = "/usr/local/bin/dra-test-driver";

/// Where the driver's output is.
#[derive(Debug)]
enum Log {
    /// A file it writes (host path).
    File(PathBuf),
    /// The container logs the agent keeps of the pod's driver container.
    Pod { logs_dir: PathBuf, namespace: String },
}

/// The objects of the pod deployment, removed when the driver stops.
#[derive(Debug)]
struct Deployed {
    cluster: Cluster,
    namespace: String,
    cluster_role: String,
}

/// The running driver.
#[derive(Debug)]
pub struct DraTestDriver {
    /// The registration socket, as the host sees it.
    pub registration_socket: PathBuf,
    /// The CDI spec directory, as the host sees it.
    pub cdi_dir: PathBuf,
    log: Log,
    child: Option<Child>,
    in_node: bool,
    pod: Option<Deployed>,
    _dir: tempfile::TempDir,
}

impl DraTestDriver {
    /// Starts the driver for `agent`'s node (`deployment` says how) and waits until its
    /// registration socket is there.
    ///
    /// # Errors
    /// No driver binary (run `cargo xtask upstream build`), or it did not come up.
    pub async fn start(cluster: &Cluster, agent: &Agent, deployment: Deployment) -> Result<Self> {
        let bin = cluster.state.bin_dir.join("test-driver");
        ensure!(bin.is_file(), "no {}: run `cargo xtask upstream build`", bin.display());
        let dir = tempfile::Builder::new().prefix("swiftlet-dra-").tempdir()?;
        let (node_name, root_dir) = (agent.node_name.as_str(), agent.root_dir.as_path());
        let registration_socket = root_dir.join("plugins_registry").join(format!("{DRIVER}-reg.sock"));
        // The driver's socket directory and the registration directory, as a node's
        // DaemonSet would have them mounted.
        std::fs::create_dir_all(root_dir.join("plugins").join(DRIVER))?;
        std::fs::create_dir_all(root_dir.join("plugins_registry"))?;
        let mut driver = if deployment == Deployment::Pod {
            Self::deploy_pod(cluster, agent, &bin, dir).await?
        } else {
            Self::spawn(cluster, node_name, root_dir, &bin, dir)?
        };
        driver.registration_socket = registration_socket;
        driver.wait_registration_socket().await?;
        Ok(driver)
    }

    /// Runs the driver as a process beside the agent.
    fn spawn(cluster: &Cluster, node_name: &str, root_dir: &Path, bin: &Path, dir: tempfile::TempDir) -> Result<Self> {
        // The admin's credentials inline: the node does not see the test bed's files.
        let pki = cluster.state.ca_cert.parent().map(Path::to_path_buf).unwrap_or_default();
        let cert = std::fs::read_to_string(pki.join("admin.crt"))?;
        let key = std::fs::read_to_string(pki.join("admin.key"))?;
        let (child, in_node, cdi_dir, log) = if let Some((node, _)) = crate::node::node_target()? {
            // In the node: the binary, a kubeconfig (the API server is forwarded to the
            // same address) and the node's own paths.
            node.forward_api_server(&cluster.state.server)?;
            std::fs::create_dir_all(node.file("/usr/local/lib/swiftlet-test"))?;
            std::fs::copy(bin, node.file("/usr/local/lib/swiftlet-test/dra-test-driver"))?;
            std::fs::create_dir_all(node.file("/etc/swiftlet-test"))?;
            cluster.write_cert_kubeconfig(&node.file("/etc/swiftlet-test"), "dra-test-driver.conf", &cert, &key)?;
            let root = node.inside(root_dir)?;
            let _ = node.run(&["systemctl", "reset-failed", UNIT]);
            node.ok(&[
                "systemd-run",
                &format!("--unit={UNIT}"),
                "--property=StandardOutput=append:/var/log/swiftlet-dra-test-driver.log",
                "--property=StandardError=append:/var/log/swiftlet-dra-test-driver.log",
                "/usr/local/lib/swiftlet-test/dra-test-driver",
                "--kubeconfig=/etc/swiftlet-test/dra-test-driver.conf",
                VERBOSITY,
                "kubelet-plugin",
                &format!("--node-name={node_name}"),
                &format!("--plugin-registration-path={}", root.join("plugins_registry").display()),
                &format!("--datadir={}", root.join("plugins").display()),
                "--cdi-dir=/var/run/cdi",
            ])?;
            (None, true, node_cdi_dir(node), node.file("/var/log/swiftlet-dra-test-driver.log"))
        } else {
            let kubeconfig = cluster.write_cert_kubeconfig(dir.path(), "admin.conf", &cert, &key)?;
            let cdi_dir = dir.path().join("cdi");
            std::fs::create_dir_all(&cdi_dir)?;
            let log = dir.path().join("driver.log");
            let out = std::fs::File::create(&log)?;
            let child = Command::new(bin)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(VERBOSITY)
                .arg("kubelet-plugin")
                .arg(format!("--node-name={node_name}"))
                .arg(format!("--plugin-registration-path={}", root_dir.join("plugins_registry").display()))
                .arg(format!("--datadir={}", root_dir.join("plugins").display()))
                .arg(format!("--cdi-dir={}", cdi_dir.display()))
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()?;
            (Some(child), false, cdi_dir, log)
        };
        Ok(Self {
            registration_socket: PathBuf::new(),
            cdi_dir,
            log: Log::File(log),
            child,
            in_node,
            pod: None,
            _dir: dir,
        })
    }

    /// Runs the driver as a `DaemonSet` pod on `agent`'s node (see the module
    /// documentation).
    async fn deploy_pod(cluster: &Cluster, agent: &Agent, bin: &Path, dir: tempfile::TempDir) -> Result<Self> {
        let mut layer = Layer::default();
        HostProgram::read(&bin.display().to_string())?.add_to_at(&mut layer, IMAGE_BIN);
        layer.dir("tmp", 0o1777);
        plugin_pods::import_image(IMAGE, &layer, dir.path()).await?;
        // The CDI directory: the node's own, or the test's on the host (see the module
        // documentation); the pod sees it at the driver's default path.
        let (cdi_host, cdi_dir) = if let Some((node, _)) = crate::node::node_target()? {
            node.forward_api_server(&cluster.state.server)?;
            (PathBuf::from("/var/run/cdi"), node_cdi_dir(node))
        } else {
            let cdi = dir.path().join("cdi");
            std::fs::create_dir_all(&cdi)?;
            (cdi.clone(), cdi)
        };
        let root = crate::agent_path(&agent.root_dir)?;
        let namespace = plugin_pods::namespace("dra-driver", &agent.node_name);
        let cluster_role = format!("swiftlet-dra-test-driver-{}", agent.node_name);
        let objects = manifests(&namespace, &cluster_role, &agent.node_name, &root, &cdi_host, &cluster.state.server)?;
        let pod = Deployed { cluster: cluster.clone(), namespace: namespace.clone(), cluster_role };
        cluster.kubectl_apply(&objects.to_string())?;
        Ok(Self {
            registration_socket: PathBuf::new(),
            cdi_dir,
            log: Log::Pod { logs_dir: agent.logs_dir.clone(), namespace },
            child: None,
            in_node: false,
            pod: Some(pod),
            _dir: dir,
        })
    }

    /// Waits (60 s) until the driver's registration socket is there, failing early when
    /// the driver shows it will not come.
    async fn wait_registration_socket(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_mins(1);
        while !self.registration_socket.exists() {
            if let Some(why) = self.failure()? {
                bail!("the DRA test driver does not run: {why}\n{}", crate::tail(&self.log_text(), 40));
            }
            if Instant::now() >= deadline {
                let events = self.pod.as_ref().map(|p| plugin_pods::events(&p.cluster, &p.namespace));
                bail!(
                    "no {} after 60 s:\n{}\n{}",
                    self.registration_socket.display(),
                    self.log_text(),
                    events.unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Why the driver stopped or cannot start, if it shows that: its process exited, its
    /// unit ended, or its pod's container is failing.
    fn failure(&mut self) -> Result<Option<String>> {
        if let Some(c) = self.child.as_mut()
            && let Some(status) = c.try_wait()?
        {
            return Ok(Some(format!("it exited with {status}")));
        }
        if self.in_node
            && let Some((node, _)) = crate::node::node_target()?
            && node.run(&["systemctl", "is-active", "--quiet", UNIT])?.status.code() == Some(3)
        {
            return Ok(Some("its unit ended".into()));
        }
        if let Some(p) = &self.pod
            && let Some(pod) = plugin_pods::pod(&p.cluster, &p.namespace, DAEMONSET)?
        {
            return Ok(plugin_pods::failing(&pod));
        }
        Ok(None)
    }

    /// The driver's log so far (for a pod, every instance of its container).
    #[must_use]
    pub fn log_text(&self) -> String {
        match &self.log {
            Log::File(path) => std::fs::read_to_string(path).unwrap_or_default(),
            Log::Pod { logs_dir, namespace } => plugin_pods::log_files(logs_dir, namespace, CONTAINER)
                .iter()
                .filter_map(|f| std::fs::read_to_string(f).ok())
                .collect(),
        }
    }

    /// The uid of the driver's pod, for the pod deployment.
    ///
    /// # Errors
    /// The API server refused.
    pub fn pod_uid(&self) -> Result<Option<String>> {
        let Some(p) = &self.pod else { return Ok(None) };
        plugin_pods::pod_uid(&p.cluster, &p.namespace, DAEMONSET)
    }

    /// How often the driver was called with `method` (`NodePrepareResources`,
    /// `NodeUnprepareResources`, `NotifyRegistrationStatus`, ...) for claim `uid` (any,
    /// if empty), from its log.
    #[must_use]
    pub fn calls(&self, method: &str, uid: &str) -> usize {
        count_calls(&self.log_text(), method, uid)
    }

    /// The CDI spec files the driver has written for claim `uid`.
    #[must_use]
    pub fn cdi_specs_of(&self, uid: &str) -> Vec<PathBuf> {
        std::fs::read_dir(&self.cdi_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().contains(uid)))
            .collect()
    }

    /// Stops the driver: its objects deleted and its pod gone (stopped by the agent,
    /// which must still run), its own pid, or its unit in the node.
    ///
    /// # Errors
    /// The pod did not go, or the unit could not be stopped.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        if let Some(p) = self.pod.take() {
            plugin_pods::delete(&p.cluster, &p.namespace, DAEMONSET, &p.cluster_role)?;
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.in_node {
            self.in_node = false;
            if let Some((node, _)) = crate::node::node_target()? {
                let _ = node.run(&["systemctl", "stop", UNIT]);
                let _ = node.run(&["systemctl", "reset-failed", UNIT]);
            }
        }
        Ok(())
    }
}

/// The node's CDI directory (`/var/run/cdi`; `/var/run` is `/run`, the node's own tmpfs),
/// seen through its root.
fn node_cdi_dir(node: &crate::node::Node) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root/run/cdi", node.init_pid))
}

/// The objects of the pod deployment: the namespace, the service account with the
/// kubelet plugin's cluster role, and the `DaemonSet` pinned to node `node_name` whose
/// agent's root directory is `root` (a node path) and whose CDI directory is `cdi` (a
/// node path), reaching the API server at `server`.
fn manifests(
    namespace: &str,
    cluster_role: &str,
    node_name: &str,
    root: &Path,
    cdi: &Path,
    server: &str,
) -> Result<Value> {
    let (reg_vol, reg_mount) = plugin_pods::same_path("plugins-registry", &root.join("plugins_registry"), None);
    let (plugin_vol, plugin_mount) = plugin_pods::same_path("plugin-dir", &root.join("plugins").join(DRIVER), None);
    // The CDI directory at the driver's default path, whatever the node's path.
    let (cdi_vol, _) = plugin_pods::same_path("cdi", cdi, None);
    let cdi_mount = json!({"name": "cdi", "mountPath": "/var/run/cdi"});
    let mut env = vec![
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}}),
    ];
    env.extend(plugin_pods::api_env(server)?.as_array().cloned().unwrap_or_default());
    let root = root.display();
    let container = json!({
        "name": CONTAINER,
        "image": IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": [IMAGE_BIN],
        "args": [
            VERBOSITY, "kubelet-plugin", "--node-name=$(NODE_NAME)",
            format!("--plugin-registration-path={root}/plugins_registry"),
            format!("--datadir={root}/plugins"),
            "--cdi-dir=/var/run/cdi",
        ],
        "env": env,
        "volumeMounts": [reg_mount, plugin_mount, cdi_mount],
    });
    // The kubelet plugin's permissions in upstream's example deployment.
    let rules = json!([
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    ]);
    Ok(plugin_pods::PluginDaemonSet {
        namespace,
        name: DAEMONSET,
        service_account: "dra-kubelet-plugin",
        cluster_role,
        rules,
        node_name,
        containers: vec![container],
        volumes: vec![reg_vol, plugin_vol, cdi_vol],
    }
    .objects())
}

/// The calls of `method` (for claim `uid`, any if empty) that the driver's `log` shows:
/// one `handling request` line each, naming the method and holding the request.
fn count_calls(log: &str, method: &str, uid: &str) -> usize {
    let method = format!("/{method}\"");
    log.lines().filter(|l| l.contains("\"handling request\"") && l.contains(&method) && l.contains(uid)).count()
}

impl Drop for DraTestDriver {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_method_and_claim_from_the_grpc_log() {
        let log = r#"I1206 1 nonblockinggrpcserver.go:150] "handling request" requestID=1 method="/pluginregistration.Registration/NotifyRegistrationStatus" request="plugin_registered:true"
I1206 1 nonblockinggrpcserver.go:150] "handling request" requestID=2 method="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" request="claims:{namespace:\"ns\" uid:\"u-1\" name:\"gpu\"}"
I1206 1 nonblockinggrpcserver.go:161] "handling request succeeded" requestID=2 method="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" response="claims:{key:\"u-1\"}"
I1206 1 nonblockinggrpcserver.go:150] "handling request" requestID=3 method="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources" request="claims:{uid:\"u-1\"}"
"#;
        assert_eq!(count_calls(log, "NodePrepareResources", "u-1"), 1);
        assert_eq!(count_calls(log, "NodePrepareResources", "u-2"), 0);
        assert_eq!(count_calls(log, "NodeUnprepareResources", "u-1"), 1);
        assert_eq!(count_calls(log, "NotifyRegistrationStatus", ""), 1);
    }
}
