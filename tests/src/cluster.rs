//! The test bed's real Kubernetes control plane (`cargo xtask testbed up --cluster`):
//! etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the upstream
//! release, built from the Go modules. [`Cluster`] reads the test bed's record of it,
//! gives an admin client and the real `kubectl`, joins agents to it by TLS bootstrap,
//! and stops and restarts its components for fault tests.
//!
//! One control plane serves every test (they run one at a time under
//! [`crate::testbed_lock`]); each test works in a namespace of its own and joins a node of
//! its own name, and [`ClusterNode::leave`] deletes both, so no test sees another's
//! objects.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde::Deserialize;
use serde_json::json;

use crate::{Agent, AgentOptions, Cri, tail};

/// The label of the namespaces the tests make.
pub const TEST_LABEL: &str = "swiftlet.dev/e2e";
/// The prefix of the nodes the tests join.
const TEST_NODE_PREFIX: &str = "e2e-";

/// Where `cargo xtask testbed up --cluster` records the control plane.
pub const CLUSTER_STATE: &str = "/run/swiftlet-testbed/cluster.json";

/// One component as recorded (see xtask's `cluster::Component`).
#[derive(Debug, Clone, Deserialize)]
pub struct Component {
    pub pid: Option<i32>,
    pub argv: Vec<String>,
    pub log: PathBuf,
}

/// The record (see xtask's `cluster::State`).
#[derive(Debug, Clone, Deserialize)]
pub struct State {
    pub version: String,
    pub server: String,
    pub dir: PathBuf,
    pub bin_dir: PathBuf,
    pub kubectl: PathBuf,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub admin_kubeconfig: PathBuf,
    pub bootstrap_kubeconfig: PathBuf,
    pub bootstrap_token: String,
    pub service_account_issuer: String,
    pub components: std::collections::BTreeMap<String, Component>,
}

/// A handle to the running control plane.
#[derive(Clone)]
pub struct Cluster {
    pub state: State,
    client: kube::Client,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("server", &self.state.server).finish_non_exhaustive()
    }
}

impl Cluster {
    /// Reads the record (`SWIFTLET_CLUSTER_STATE`, else [`CLUSTER_STATE`]) and connects
    /// as the cluster admin.
    ///
    /// # Errors
    /// No control plane: run `cargo xtask testbed up --cluster`.
    pub async fn connect() -> Result<Self> {
        Self::connect_to(&Self::state_path()).await
    }

    /// Where [`Cluster::connect`] reads the record: `SWIFTLET_CLUSTER_STATE`, else
    /// [`CLUSTER_STATE`].
    #[must_use]
    pub fn state_path() -> PathBuf {
        std::env::var_os("SWIFTLET_CLUSTER_STATE").map_or_else(|| PathBuf::from(CLUSTER_STATE), PathBuf::from)
    }

    /// Reads the record at `path` and connects as the cluster admin.
    ///
    /// # Errors
    /// No record there, or no control plane: run `cargo xtask testbed up --cluster`.
    pub async fn connect_to(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("no control plane: run `cargo xtask testbed up --cluster` (reading {})", path.display())
        })?;
        let state: State = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = kube_client(&state.admin_kubeconfig).await?;
        Ok(Self { state, client })
    }

    /// The cluster admin's client.
    #[must_use]
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Runs the real `kubectl` as the cluster admin.
    ///
    /// # Errors
    /// kubectl could not run.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        Ok(self.kubectl_command(args).stdin(Stdio::null()).output()?)
    }

    /// `kubectl` as the cluster admin, to be run by the caller.
    #[must_use]
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.state.kubectl);
        cmd.arg("--kubeconfig").arg(&self.state.admin_kubeconfig).args(args);
        cmd
    }

    /// kubectl that must succeed: its stdout.
    ///
    /// # Errors
    /// kubectl failed; the error has its stderr.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args)?;
        ensure!(
            out.status.success(),
            "kubectl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply` of `yaml` (or JSON), as the cluster admin.
    ///
    /// # Errors
    /// kubectl failed; the error has its stderr.
    pub fn kubectl_apply(&self, yaml: &str) -> Result<()> {
        use std::io::Write as _;
        let mut child = self
            .kubectl_command(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(yaml.as_bytes())?;
        let out = child.wait_with_output()?;
        ensure!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    }

    /// `kubectl attach -i` with `args` (namespace, pod, container): writes `line` to the
    /// container's stdin and waits (30 s at most) for a line of its output holding
    /// `want`. Stdin stays open until then: the runtime ends an attach session when the
    /// client's stdin closes.
    ///
    /// # Errors
    /// kubectl did not start, or `want` did not come back.
    pub async fn attach_and_expect(&self, args: &[&str], line: &str, want: &str) -> Result<()> {
        let mut all = vec!["attach", "-i"];
        all.extend_from_slice(args);
        let mut child =
            self.kubectl_command(&all).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
        let mut stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        std::io::Write::write_all(&mut stdin, format!("{line}\n").as_bytes())?;
        std::io::Write::flush(&mut stdin)?;
        let want_owned = want.to_owned();
        let echoed = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || {
                use std::io::BufRead as _;
                std::io::BufReader::new(stdout).lines().map_while(Result::ok).find(|l| l.contains(&want_owned))
            }),
        )
        .await;
        drop(stdin);
        let _ = child.kill();
        let _ = child.wait();
        ensure!(matches!(echoed, Ok(Ok(Some(_)))), "no {want:?} through kubectl attach: {echoed:?}");
        Ok(())
    }

    /// A client certificate (PEM) and its key for `common_name` in `organizations`,
    /// signed by the cluster CA and valid from `not_before` to `not_after`: what the
    /// controller-manager's signer would issue, with any lifetime (the API's shortest is
    /// 10 minutes).
    ///
    /// # Errors
    /// The CA's files are unreadable.
    pub fn issue_client_cert(
        &self,
        common_name: &str,
        organizations: &[&str],
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> Result<(String, String)> {
        let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(&self.state.ca_key)?)?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(&self.state.ca_cert)?, ca_key)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        for o in organizations {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, *o);
        }
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = time::OffsetDateTime::from(not_before);
        params.not_after = time::OffsetDateTime::from(not_after);
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes `<dir>/<file_name>`, a kubeconfig of the cluster whose user is `user` (the
    /// lines under `user:`, e.g. `    token: ...`), mode 0600.
    ///
    /// # Errors
    /// The file could not be written.
    pub fn write_kubeconfig(&self, dir: &Path, file_name: &str, user: &str) -> Result<PathBuf> {
        use base64::Engine as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&self.state.ca_cert)?);
        let text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster:
    server: {}
    certificate-authority-data: {ca}
contexts:
- name: default
  context: {{cluster: cluster, user: user}}
current-context: default
users:
- name: user
  user:
{user}",
            self.state.server
        );
        // An agent in the node container reaches the API server at the same address.
        if let Some((node, _)) = crate::node::node_target()? {
            node.forward_api_server(&self.state.server)?;
        }
        let path = dir.join(file_name);
        let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&path)?;
        std::io::Write::write_all(&mut f, text.as_bytes())?;
        Ok(path)
    }

    /// [`Cluster::write_kubeconfig`] for a client certificate and key (PEM).
    ///
    /// # Errors
    /// The file could not be written.
    pub fn write_cert_kubeconfig(&self, dir: &Path, file_name: &str, cert: &str, key: &str) -> Result<PathBuf> {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let user = format!("    client-certificate-data: {}\n    client-key-data: {}\n", b64(cert), b64(key));
        self.write_kubeconfig(dir, file_name, &user)
    }

    /// Creates a namespace for one test (`<prefix>-<random>`); [`ClusterNode::leave`]
    /// deletes it.
    ///
    /// # Errors
    /// The API server refused.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {TEST_LABEL: "true"}}}))?;
        Api::<Namespace>::all(self.client()).create(&PostParams::default(), &ns).await?;
        // Pods need the namespace's default service account (the token controller makes
        // it, as it does for any namespace).
        let sa = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(self.client(), &name);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sa.get_opt("default").await?.is_none() {
            ensure!(Instant::now() < deadline, "namespace {name}: no default service account after 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(name)
    }

    /// Stops one component (`etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`) with SIGTERM, SIGKILL after 15 s.
    ///
    /// # Errors
    /// Not recorded, or it would not die.
    pub fn stop_component(&self, name: &str) -> Result<()> {
        let component = self.component(name)?;
        for pid in Self::component_pids(component) {
            terminate(pid, Duration::from_secs(15))?;
        }
        Ok(())
    }

    /// Starts a stopped component again, as the test bed started it, and waits until it
    /// serves (the API server: `/readyz`).
    ///
    /// # Errors
    /// It did not start or become ready within 2 minutes.
    pub async fn start_component(&self, name: &str) -> Result<()> {
        let component = self.component(name)?;
        ensure!(Self::component_pids(component).is_empty(), "{name} is running already");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&component.log)?;
        let (program, args) = component.argv.split_first().context("empty command line")?;
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        // SAFETY: setsid is async-signal-safe; a session of its own keeps it out of the
        // test's signals, and `testbed down` finds it by its command line.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {program}"))?;
        // Not our child to wait for once the test ends: the test bed owns it.
        std::mem::forget(child);
        if name == "kube-apiserver" || name == "etcd" {
            let deadline = Instant::now() + Duration::from_mins(2);
            loop {
                let out = self.kubectl(&["get", "--raw", "/readyz", "--request-timeout=2s"])?;
                if out.status.success() {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "{name} not ready in 2 minutes: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    tail(&std::fs::read_to_string(&component.log).unwrap_or_default(), 30)
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(())
    }

    /// Deletes what earlier tests that failed before [`ClusterNode::leave`] left: their
    /// nodes (the scheduler would still place pods on them until the node lifecycle
    /// controller sees them gone) and their namespaces (the pod garbage collector removes
    /// the pods of deleted nodes).
    async fn remove_stale_test_objects(&self) -> Result<()> {
        let nodes = Api::<Node>::all(self.client());
        for n in nodes.list(&ListParams::default()).await? {
            let name = n.metadata.name.unwrap_or_default();
            if name.starts_with(TEST_NODE_PREFIX) {
                nodes.delete(&name, &DeleteParams::default()).await?;
            }
        }
        let namespaces = Api::<Namespace>::all(self.client());
        for ns in namespaces.list(&ListParams::default().labels(TEST_LABEL)).await? {
            let name = ns.metadata.name.unwrap_or_default();
            if ns.metadata.deletion_timestamp.is_none() {
                namespaces.delete(&name, &DeleteParams::default()).await?;
            }
        }
        Ok(())
    }

    /// Whether the component `name` runs.
    ///
    /// # Errors
    /// The cluster record has no such component.
    pub fn is_running(&self, name: &str) -> Result<bool> {
        Ok(!Self::component_pids(self.component(name)?).is_empty())
    }

    fn component(&self, name: &str) -> Result<&Component> {
        self.state.components.get(name).with_context(|| format!("no component {name} in the cluster record"))
    }

    /// Live processes running this component's command line.
    fn component_pids(component: &Component) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| cmdline(*pid).is_some_and(|a| a == component.argv) && alive(*pid))
            .collect()
    }

    /// Starts `opts`'s agent joined to the cluster as node `e2e-<test>-<random>` by TLS
    /// bootstrap (the bootstrap token; the controller-manager approves and signs the CSR),
    /// serving its
    /// API with webhook authentication and authorization against the API server, as a
    /// kubeadm node's kubelet; returns once the node is Ready.
    ///
    /// # Errors
    /// The agent did not start or the node was not Ready within a minute.
    pub async fn join(&self, test: &str, opts: AgentOptions) -> Result<ClusterNode> {
        self.join_via(test, opts, None).await
    }

    /// [`Cluster::join`], with the agent reaching the API server at `server` (e.g. a
    /// [`crate::tcp_proxy::TcpProxy`] in front of it) instead of its own address.
    ///
    /// # Errors
    /// As [`Cluster::join`].
    pub async fn join_via(&self, test: &str, mut opts: AgentOptions, server: Option<&str>) -> Result<ClusterNode> {
        self.remove_stale_test_objects().await?;
        // A name of its own per run: pods an earlier, failed run left bound to its node
        // must not be run by this agent.
        let name = &format!("{TEST_NODE_PREFIX}{test}-{:04x}", rand::random::<u16>());
        let files = crate::agent_tempdir("swiftlet-e2e-join-")?;
        let kubeconfig = files.path().join("kubelet.conf");
        opts.kubeconfig = Some(kubeconfig.clone());
        opts.node_name = Some(name.to_owned());
        let in_node = crate::node::node_target()?.map(|(n, _)| n);
        // The kubeconfig the agent writes after bootstrap names the bootstrap's server.
        // The node sees the API server (or the test's proxy in front of it) at its host
        // address, and the CA where the kubeconfigs and the config name it.
        if let Some(node) = in_node {
            node.forward_api_server(server.unwrap_or(&self.state.server))?;
            let ca = node.file(&self.state.ca_cert.display().to_string());
            std::fs::create_dir_all(ca.parent().context("the CA has a parent")?)?;
            std::fs::copy(&self.state.ca_cert, &ca)?;
        }
        let bootstrap = match (server, in_node) {
            (Some(url), _) => {
                let path = files.path().join("bootstrap-kubelet.conf");
                let original = std::fs::read_to_string(&self.state.bootstrap_kubeconfig)?;
                std::fs::write(
                    &path,
                    original.replace(&format!("server: {}", self.state.server), &format!("server: {url}")),
                )?;
                path
            }
            (None, Some(_)) => {
                let path = files.path().join("bootstrap-kubelet.conf");
                std::fs::copy(&self.state.bootstrap_kubeconfig, &path)?;
                path
            }
            (None, None) => self.state.bootstrap_kubeconfig.clone(),
        };
        opts.extra_flags.push(format!("--bootstrap-kubeconfig={}", crate::agent_path(&bootstrap)?.display()));
        let node_ip = in_node.map_or("127.0.0.1", |n| n.address.as_str());
        opts.extra_flags.push(format!("--node-ip={node_ip}"));
        opts.authentication = Some(format!(
            "authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {}
authorization:
  mode: Webhook
",
            self.state.ca_cert.display()
        ));
        // The test's own requests to the agent go as the cluster admin (system:masters),
        // whom the API server's authorizer lets do anything.
        let pki = self.state.dir.join("pki");
        opts.client_identity = Some((pki.join("admin.crt"), pki.join("admin.key")));
        let agent = Agent::start(opts).await?;
        let node = ClusterNode { cluster: self.clone(), agent, name: name.to_owned(), namespaces: Vec::new(), files };
        node.wait_ready(Duration::from_mins(1)).await?;
        Ok(node)
    }
}

/// An agent joined to the cluster as one node.
pub struct ClusterNode {
    pub cluster: Cluster,
    pub agent: Agent,
    pub name: String,
    /// Namespaces deleted when the node leaves.
    pub namespaces: Vec<String>,
    files: tempfile::TempDir,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode").field("name", &self.name).finish_non_exhaustive()
    }
}

impl ClusterNode {
    /// The node's kubeconfig (the bootstrapped client certificate).
    #[must_use]
    pub fn kubeconfig(&self) -> PathBuf {
        self.files.path().join("kubelet.conf")
    }

    /// A client with the node's own credentials (`system:node:<name>`).
    ///
    /// # Errors
    /// The kubeconfig is unreadable.
    pub async fn node_client(&self) -> Result<kube::Client> {
        kube_client(&self.kubeconfig()).await
    }

    /// The Node object.
    ///
    /// # Errors
    /// The API server refused.
    pub async fn node(&self) -> Result<Option<Node>> {
        Ok(Api::<Node>::all(self.cluster.client()).get_opt(&self.name).await?)
    }

    /// Waits until the node's Ready condition is True.
    ///
    /// # Errors
    /// Not Ready within `timeout`: the node's conditions and the agent's log.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Node> {
        let deadline = Instant::now() + timeout;
        loop {
            let node = self.node().await.ok().flatten();
            if let Some(n) = &node
                && node_condition(n, "Ready") == Some("True")
            {
                return Ok(n.clone());
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} not Ready within {timeout:?}: {}\n--- agent log ---\n{}",
                    self.name,
                    serde_json::to_string_pretty(&node.and_then(|n| n.status).map(|s| s.conditions))
                        .unwrap_or_default(),
                    tail(&self.agent.log(), 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A fresh namespace for this test, deleted when the node leaves.
    ///
    /// # Errors
    /// The API server refused.
    pub async fn namespace(&mut self, prefix: &str) -> Result<String> {
        let ns = self.cluster.namespace(prefix).await?;
        self.namespaces.push(ns.clone());
        Ok(ns)
    }

    /// Creates a pod bound to this node (`spec.nodeName`), as the scheduler would.
    ///
    /// # Errors
    /// The API server refused it.
    pub async fn create_pod(&self, namespace: &str, mut pod: serde_json::Value) -> Result<Pod> {
        pod["spec"]["nodeName"] = json!(self.name);
        let pod: Pod = serde_json::from_value(pod)?;
        Ok(Api::<Pod>::namespaced(self.cluster.client(), namespace).create(&PostParams::default(), &pod).await?)
    }

    /// Polls the API pod until `check` holds, for `timeout` at most.
    ///
    /// # Errors
    /// Not reached: `what`, the pod's status and the tail of the agent's log.
    pub async fn eventually_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
        what: &str,
        check: impl Fn(&Pod) -> bool,
    ) -> Result<Pod> {
        let api = Api::<Pod>::namespaced(self.cluster.client(), namespace);
        let deadline = Instant::now() + timeout;
        loop {
            let pod = api.get_opt(name).await.ok().flatten();
            if let Some(p) = &pod
                && check(p)
            {
                return Ok(p.clone());
            }
            if Instant::now() > deadline {
                bail!(
                    "{what}: not reached in {timeout:?}\nstatus: {}\n--- agent log ---\n{}",
                    serde_json::to_string_pretty(&pod.and_then(|p| p.status)).unwrap_or_default(),
                    tail(&self.agent.log(), 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes the test's namespaces (waiting until the agent has stopped their pods and
    /// the runtime has nothing left of them), stops the agent and deletes the Node.
    ///
    /// # Errors
    /// Pods were left in the runtime, or the API server refused.
    pub async fn leave(mut self, cri: &Cri) -> Result<()> {
        let client = self.cluster.client();
        for ns in &self.namespaces {
            // Graceful: the agent stops the containers, then deletes the pods.
            Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        for ns in &self.namespaces {
            let api = Api::<Namespace>::all(client.clone());
            while api.get_opt(ns).await?.is_some() {
                if Instant::now() > deadline {
                    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default()).await?;
                    bail!(
                        "namespace {ns} not gone after 90 s; pods left: {:?}\n{}",
                        pods.items.iter().map(|p| p.metadata.name.clone()).collect::<Vec<_>>(),
                        tail(&self.agent.log(), 60)
                    );
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        let static_pods = std::fs::read_dir(&self.agent.manifests)?.count();
        if static_pods > 0 {
            for e in std::fs::read_dir(&self.agent.manifests)? {
                std::fs::remove_file(e?.path())?;
            }
        }
        loop {
            let left = cri.all_sandboxes().await?;
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!("{} sandbox(es) left in the runtime\n{}", left.len(), tail(&self.agent.log(), 60));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.agent.stop()?;
        crate::remove_cgroup_tree(&self.agent.cgroup_root);
        Api::<Node>::all(client).delete(&self.name, &DeleteParams::default()).await?;
        self.namespaces.clear();
        Ok(())
    }
}

/// One test's node, its namespace and the runtime: what most end-to-end tests start
/// from. [`TestNode::leave`] ends it.
#[derive(Debug)]
pub struct TestNode {
    pub cluster: Cluster,
    pub node: ClusterNode,
    pub ns: String,
    pub cri: Cri,
}

impl TestNode {
    /// Joins a node for `test` with `opts` and makes its namespace (`<test>-<random>`).
    ///
    /// # Errors
    /// As [`Cluster::join`].
    pub async fn join(test: &str, opts: AgentOptions) -> Result<Self> {
        let cri = Cri::connect(&crate::cri_endpoint()?)?;
        let cluster = Cluster::connect().await?;
        let mut node = cluster.join(test, opts).await?;
        let ns = node.namespace(test).await?;
        Ok(Self { cluster, node, ns, cri })
    }

    #[must_use]
    pub fn agent(&self) -> &Agent {
        &self.node.agent
    }

    /// kubectl in the test's namespace, which must succeed: its stdout.
    ///
    /// # Errors
    /// kubectl failed.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-n", self.ns.as_str()];
        all.extend_from_slice(args);
        self.cluster.kubectl_ok(&all)
    }

    /// The pods of the test's namespace.
    #[must_use]
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.client(), &self.ns)
    }

    /// Creates `pod` bound to the node, in the test's namespace.
    ///
    /// # Errors
    /// The API server refused it.
    pub async fn create(&self, pod: serde_json::Value) -> Result<Pod> {
        self.node.create_pod(&self.ns, pod).await
    }

    /// The pod `name` of the test's namespace.
    ///
    /// # Errors
    /// It is not there.
    pub async fn get(&self, name: &str) -> Result<Pod> {
        Ok(self.pods().get(name).await?)
    }

    /// [`ClusterNode::eventually_pod`] in the test's namespace.
    ///
    /// # Errors
    /// Not reached in `timeout`.
    pub async fn eventually(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        check: impl Fn(&Pod) -> bool,
    ) -> Result<Pod> {
        self.node.eventually_pod(&self.ns, name, timeout, what, check).await
    }

    /// Deletes the pod (its grace period) and waits until the API server has removed it.
    ///
    /// # Errors
    /// Not removed within a minute.
    pub async fn delete(&self, name: &str) -> Result<()> {
        self.pods().delete(name, &DeleteParams::default()).await?;
        let deadline = Instant::now() + Duration::from_mins(1);
        while self.pods().get_opt(name).await?.is_some() {
            ensure!(Instant::now() < deadline, "{name} not removed in a minute\n{}", tail(&self.agent().log(), 40));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// [`ClusterNode::leave`].
    ///
    /// # Errors
    /// As [`ClusterNode::leave`].
    pub async fn leave(self) -> Result<()> {
        self.node.leave(&self.cri).await
    }
}

/// An API pod spec running `script` in the test bed's busybox (labelled `app: <name>`),
/// stopping at once on SIGTERM.
#[must_use]
pub fn busybox_pod(name: &str, script: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": crate::pods::BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("trap 'exit 0' TERM; {script}")],
            }]
        }
    })
}

/// The status of a node condition.
#[must_use]
pub fn node_condition<'a>(node: &'a Node, type_: &str) -> Option<&'a str> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str())
}

/// The status of a pod condition.
#[must_use]
pub fn pod_condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a str> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str())
}

/// The pod's phase.
#[must_use]
pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

async fn kube_client(kubeconfig: &Path) -> Result<kube::Client> {
    let mut kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    // An agent in the node container names its certificate files by the node's paths.
    if let Some((node, _)) = crate::node::node_target()? {
        for auth in kc.auth_infos.iter_mut().filter_map(|a| a.auth_info.as_mut()) {
            for file in [&mut auth.client_certificate, &mut auth.client_key].into_iter().flatten() {
                if !Path::new(file.as_str()).exists() {
                    *file = node.resolved_file(file).display().to_string();
                }
            }
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

fn alive(pid: i32) -> bool {
    // SAFETY: WNOHANG on a pid that is not our child fails with ECHILD; a restarted
    // component that is our child is reaped here once it exits.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|st| st != "Z" && st != "X")
    })
}

fn terminate(pid: i32, grace: Duration) -> Result<()> {
    // SAFETY: plain syscall on a pid whose command line the caller matched.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        // SAFETY: as above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            ensure!(Instant::now() < deadline, "pid {pid} survived SIGKILL");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}
