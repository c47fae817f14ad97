//! The test bed's host-path CSI driver deployed for one node, as a cluster deploys a CSI
//! driver: the driver itself (`swiftlet-test-csi-driver`, serving CSI on
//! `<root-dir>/plugins/<name>/csi.sock` and the plugin registration API on
//! `<root-dir>/plugins_registry/<name>-reg.sock`), upstream's `csi-provisioner` and
//! `csi-resizer` (and `csi-attacher` for an attachable driver; built by `cargo xtask
//! upstream build` into `target/upstream/`) talking to the test bed's API server, the
//! `CSIDriver` object and the storage class [`STORAGE_CLASS`].
//!
//! The driver and its sidecars run either as processes beside the agent (the default:
//! the node's agent may start before or after them, or not at all) or, with
//! [`Deployment::Pods`], as a pod on the node (a `DaemonSet`, as upstream deploys CSI
//! drivers; see [`crate::csi_pods`]): then the node's agent must be running,
//! it runs the driver that it mounts through.
//!
//! [`CsiHostPath::stop`] (or dropping it) stops the processes it started (by pid) or
//! deletes the pod (waiting until the agent has stopped it), unmounts what is still
//! mounted from its volumes, detaches its loop devices, and deletes the `CSIDriver`, the
//! storage class and the persistent volumes of its driver.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::csi_driver::{self, CsiCall, DEFAULT_NAME, Store, VolumeRecord};
use crate::{csi_pods, plugin_pods};

/// The storage class of the driver's volumes (Immediate binding, expansion allowed).
pub const STORAGE_CLASS: &str = "swiftlet-csi-hostpath";

/// What to deploy.
#[expect(
    clippy::struct_excessive_bools,
    reason = "one switch per sidecar and CSIDriver field, as a deployment lists them"
)]
#[derive(Clone, Debug)]
pub struct CsiHostPathOptions {
    /// The driver's name (default [`DEFAULT_NAME`]).
    pub driver_name: String,
    /// The storage class's name (default [`STORAGE_CLASS`]).
    pub storage_class: String,
    /// `NodeGetInfo`'s `max_volumes_per_node` (0: no limit).
    pub max_volumes_per_node: i64,
    /// Run `csi-provisioner` (persistent volumes for claims of the storage class).
    pub provisioner: bool,
    /// Run `csi-resizer` (claims' expansion).
    pub resizer: bool,
    /// The `CSIDriver`'s `fsGroupPolicy` (`File`, `ReadWriteOnceWithFSType`, `None`).
    pub fs_group_policy: String,
    /// The `CSIDriver`'s `podInfoOnMount`.
    pub pod_info_on_mount: bool,
    /// The `CSIDriver`'s `attachRequired` (default false): the attach/detach controller
    /// then makes a `VolumeAttachment` for each volume on the node, which `csi-attacher`
    /// attaches through the driver's `ControllerPublishVolume`.
    pub attach_required: bool,
    /// The `CSIDriver`'s `requiresRepublish`: the agent publishes each volume again at
    /// every sync of its pod.
    pub requires_republish: bool,
    /// The `CSIDriver`'s `tokenRequests` (`{"audience": ..., "expirationSeconds": ...}`):
    /// the pod's service-account tokens in each publish call's volume context.
    pub token_requests: Vec<serde_json::Value>,
    /// Run `csi-attacher` from the start (default false; see
    /// [`CsiHostPath::start_attacher`]). It runs as a process beside the agent in either
    /// [`Deployment`].
    pub attacher: bool,
    pub attacher_flags: Vec<String>,
    /// More sidecar flags, e.g. `--feature-gates=...`.
    pub provisioner_flags: Vec<String>,
    pub resizer_flags: Vec<String>,
    /// How the driver and its sidecars run.
    pub deployment: Deployment,
}

/// How the driver and its sidecars run (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Deployment {
    /// Processes beside the node's agent.
    #[default]
    Processes,
    /// A pod on the node, run by its agent.
    Pods,
}

impl Default for CsiHostPathOptions {
    fn default() -> Self {
        Self {
            driver_name: DEFAULT_NAME.into(),
            storage_class: STORAGE_CLASS.into(),
            max_volumes_per_node: 0,
            provisioner: true,
            resizer: true,
            fs_group_policy: "File".into(),
            pod_info_on_mount: true,
            attach_required: false,
            requires_republish: false,
            token_requests: Vec::new(),
            attacher: false,
            attacher_flags: Vec::new(),
            provisioner_flags: Vec::new(),
            resizer_flags: Vec::new(),
            deployment: Deployment::Processes,
        }
    }
}

/// A process the harness started, and its log file.
#[derive(Debug)]
struct Proc {
    name: &'static str,
    child: Child,
}

/// The driver deployed for one node. See the module documentation.
#[derive(Debug)]
pub struct CsiHostPath {
    pub driver_name: String,
    pub storage_class: String,
    pub node_name: String,
    /// The CSI socket, `<root-dir>/plugins/<name>/csi.sock`.
    pub csi_socket: PathBuf,
    /// `<root-dir>/plugins_registry/<name>-reg.sock`.
    pub registration_socket: PathBuf,
    /// Where the volumes live.
    pub state_dir: PathBuf,
    /// The driver's calls, one JSON line each ([`CsiCall`]).
    pub calls_log: PathBuf,
    dir: tempfile::TempDir,
    cluster: Cluster,
    driver_argv: Vec<String>,
    procs: Vec<Proc>,
    /// The pod deployment's namespace and cluster role, when it runs as pods.
    pods: Option<(String, String)>,
    cleaned: bool,
    attacher_flags: Vec<String>,
}

/// The mounts below an agent's root directory `root` (read from this host's mount table)
/// but the root's own (the agent makes it a shared mount, as upstream's kubelet does) and
/// those of the driver's own pod (uid `driver_pod`, when it runs as one): what volumes
/// left mounted.
#[must_use]
pub fn mounts_under(root: &Path, driver_pod: Option<&str>) -> Vec<String> {
    let driver_pod = driver_pod.map(|uid| root.join("pods").join(uid));
    // Strictly below `dir`.
    let below = |m: &Path, dir: &Path| m != dir && m.starts_with(dir);
    csi_driver::mounts()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|m| below(m, root) && !driver_pod.as_deref().is_some_and(|d| below(m, d)))
        .map(|m| m.display().to_string())
        .collect()
}

/// The driver's binary, built beside the test executables
/// (`target/<profile>/swiftlet-test-csi-driver`), or `SWIFTLET_TEST_CSI_DRIVER`.
///
/// # Errors
/// It is not there.
pub fn driver_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SWIFTLET_TEST_CSI_DRIVER") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("test executable has no parent")?;
    // target/debug/deps/<test> and target/debug/<bin> alike.
    if dir.ends_with("deps") {
        dir = dir.parent().context("deps has no parent")?;
    }
    let bin = dir.join("swiftlet-test-csi-driver");
    ensure!(bin.is_file(), "{} not found: run `cargo build -p swiftlet-tests --bins` first", bin.display());
    Ok(bin)
}

/// A sidecar built by `cargo xtask upstream build`: in `SWIFTLET_CSI_SIDECARS`, else
/// beside the control plane's binaries.
fn sidecar_bin(cluster: &Cluster, name: &str) -> Result<PathBuf> {
    let dir = std::env::var_os("SWIFTLET_CSI_SIDECARS").map_or_else(|| cluster.state.bin_dir.clone(), PathBuf::from);
    let bin = dir.join(name);
    ensure!(bin.is_file(), "{} not found: run `cargo xtask upstream build`", bin.display());
    Ok(bin)
}

/// A child in a session of its own (out of the test's terminal signals) that gets
/// SIGTERM when the test process dies, so a killed test leaves no sidecar behind.
fn spawn(name: &'static str, argv: &[String], log: &Path) -> Result<Proc> {
    use std::os::unix::process::CommandExt as _;
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    // SAFETY: setsid and prctl are async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("starting {}", argv[0]))?;
    Ok(Proc { name, child })
}

/// SIGTERM, then SIGKILL after `grace`; reaps it.
fn terminate(p: &mut Proc, grace: Duration) {
    if matches!(p.child.try_wait(), Ok(Some(_))) {
        return;
    }
    if let Ok(pid) = i32::try_from(p.child.id()) {
        // SAFETY: kill(2) of our own child, not yet reaped (so the pid is still ours).
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(p.child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
}

impl CsiHostPath {
    /// Deploys the driver for node `node_name`, whose agent's `--root-dir` is
    /// `kubelet_root_dir`: starts the driver and waits for it to answer, starts the
    /// sidecars and waits until they have asked the driver its capabilities, and
    /// creates the `CSIDriver` and the storage class (replacing any a failed test left).
    /// The agent finds the driver through the registration socket, whenever it runs.
    ///
    /// # Errors
    /// A binary is missing, a process did not come up, or the API server refused.
    pub async fn start(
        cluster: &Cluster,
        node_name: &str,
        kubelet_root_dir: &Path,
        opts: CsiHostPathOptions,
    ) -> Result<Self> {
        if crate::node::node_target()?.is_some() {
            bail!("the CSI host-path driver runs beside agents on the host, not in the node container");
        }
        let dir = tempfile::Builder::new().prefix("swiftlet-csi-").tempdir()?;
        let name = opts.driver_name.clone();
        let csi_socket = kubelet_root_dir.join("plugins").join(&name).join("csi.sock");
        let registration_dir = kubelet_root_dir.join("plugins_registry");
        let registration_socket = registration_dir.join(format!("{name}-reg.sock"));
        let state_dir = dir.path().join("state");
        let calls_log = dir.path().join("calls.jsonl");
        std::fs::create_dir_all(&state_dir)?;
        let common_args: Vec<String> = vec![
            format!("--name={name}"),
            format!("--endpoint={}", csi_socket.display()),
            format!("--state-dir={}", state_dir.display()),
            format!("--registration-dir={}", registration_dir.display()),
            format!("--calls-log={}", calls_log.display()),
            format!("--max-volumes-per-node={}", opts.max_volumes_per_node),
        ];
        let mut driver_argv = vec![driver_bin()?.display().to_string()];
        driver_argv.extend(common_args.iter().cloned());
        driver_argv.push(format!("--node-id={node_name}"));
        let mut this = Self {
            driver_name: name.clone(),
            storage_class: opts.storage_class.clone(),
            node_name: node_name.to_owned(),
            csi_socket,
            registration_socket,
            state_dir,
            calls_log,
            dir,
            cluster: cluster.clone(),
            driver_argv,
            procs: Vec::new(),
            pods: None,
            cleaned: false,
            attacher_flags: opts.attacher_flags.clone(),
        };
        this.delete_objects()?;

        let mut sidecars: Vec<(&'static str, Vec<String>)> = Vec::new();
        if opts.provisioner {
            let mut args = this.sidecar_args();
            args.push("--extra-create-metadata".into());
            args.extend(opts.provisioner_flags.iter().cloned());
            sidecars.push(("csi-provisioner", args));
        }
        if opts.resizer {
            let mut args = this.sidecar_args();
            args.extend(opts.resizer_flags.iter().cloned());
            sidecars.push(("csi-resizer", args));
        }
        if opts.deployment == Deployment::Pods {
            this.deploy_pods(kubelet_root_dir, common_args, &sidecars).await?;
        } else {
            this.start_driver().await?;
            let kubeconfig = format!("--kubeconfig={}", cluster.state.admin_kubeconfig.display());
            for (program, args) in &sidecars {
                let mut argv = vec![sidecar_bin(cluster, program)?.display().to_string(), kubeconfig.clone()];
                argv.extend(args.iter().cloned());
                this.procs.push(spawn(program, &argv, &this.log_path(program))?);
            }
        }
        this.wait_capability_calls(sidecars.len(), "the sidecars").await?;

        let driver = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": name},
            "spec": {
                "attachRequired": opts.attach_required,
                "podInfoOnMount": opts.pod_info_on_mount,
                "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                "fsGroupPolicy": opts.fs_group_policy,
                "requiresRepublish": opts.requires_republish,
                "tokenRequests": opts.token_requests,
            }
        });
        let class = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": opts.storage_class},
            "provisioner": name,
            "reclaimPolicy": "Delete",
            "allowVolumeExpansion": true,
            "volumeBindingMode": "Immediate",
        });
        cluster.kubectl_apply(&driver.to_string())?;
        cluster.kubectl_apply(&class.to_string())?;
        if opts.attacher {
            this.start_attacher().await?;
        }
        Ok(this)
    }

    /// Starts upstream's `csi-attacher` (once; later calls do nothing) and waits until it
    /// has asked the driver its capabilities: from then on it attaches the driver's
    /// `VolumeAttachment`s through `ControllerPublishVolume`.
    ///
    /// # Errors
    /// The binary is missing or it did not reach the driver in 60 s.
    pub async fn start_attacher(&mut self) -> Result<()> {
        if self.procs.iter().any(|p| p.name == "csi-attacher") {
            return Ok(());
        }
        let before = self.calls_of("ControllerGetCapabilities").len();
        let mut argv = vec![
            sidecar_bin(&self.cluster, "csi-attacher")?.display().to_string(),
            format!("--kubeconfig={}", self.cluster.state.admin_kubeconfig.display()),
        ];
        argv.extend(self.sidecar_args());
        argv.extend(self.attacher_flags.iter().cloned());
        self.procs.push(spawn("csi-attacher", &argv, &self.log_path("csi-attacher"))?);
        self.wait_capability_calls(before + 1, "csi-attacher").await
    }

    /// The arguments every sidecar gets: the driver's socket, no leader election (one
    /// replica), short timeouts and retries, and a log that shows its calls.
    fn sidecar_args(&self) -> Vec<String> {
        vec![
            format!("--csi-address={}", self.csi_socket.display()),
            "--leader-election=false".into(),
            "--timeout=30s".into(),
            "--retry-interval-start=500ms".into(),
            "--retry-interval-max=5s".into(),
            "--v=4".into(),
        ]
    }

    /// Waits (60 s) until the driver has answered `count` `ControllerGetCapabilities`
    /// calls: each sidecar asks the driver's name and capabilities before it serves.
    async fn wait_capability_calls(&mut self, count: usize, who: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_mins(1);
        while self.calls_of("ControllerGetCapabilities").len() < count {
            if let Some(failure) = self.failure() {
                bail!("{failure}");
            }
            ensure!(Instant::now() < deadline, "{who} did not reach the driver in 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// The output of one process or container: `driver`, `csi-provisioner`,
    /// `csi-resizer` or `csi-attacher`.
    #[must_use]
    pub fn log(&self, name: &str) -> String {
        match &self.pods {
            Some((namespace, _)) => {
                let container = if name == "driver" { csi_pods::DRIVER_CONTAINER } else { name };
                plugin_pods::logs(&self.cluster, namespace, csi_pods::DAEMONSET, container)
            }
            None => std::fs::read_to_string(self.log_path(name)).unwrap_or_default(),
        }
    }

    /// Why the driver or a sidecar cannot serve, if it cannot: a process exited, or a
    /// container of the pod is failing (with its output).
    fn failure(&mut self) -> Option<String> {
        if let Some((namespace, _)) = &self.pods {
            let pod = plugin_pods::pod(&self.cluster, namespace, csi_pods::DAEMONSET).ok()??;
            let why = plugin_pods::failing(&pod)?;
            let container = why.split(':').next().unwrap_or_default().to_owned();
            return Some(format!("the CSI driver's pod: {why}\n{}", crate::tail(&self.log(&container), 40)));
        }
        let (name, status) = self.procs.iter_mut().find_map(|p| Some((p.name, p.child.try_wait().ok()??)))?;
        Some(format!("{name} exited ({status}):\n{}", crate::tail(&self.log(name), 40)))
    }

    /// Runs the driver and the sidecars as a pod on the node (the image imported into the
    /// test bed's containerd first) and waits (60 s) until the driver's socket answers.
    async fn deploy_pods(
        &mut self,
        kubelet_root_dir: &Path,
        driver_args: Vec<String>,
        sidecars: &[(&'static str, Vec<String>)],
    ) -> Result<()> {
        let programs = sidecars.iter().map(|(p, _)| sidecar_bin(&self.cluster, p)).collect::<Result<Vec<_>>>()?;
        csi_pods::ensure_image(&driver_bin()?, &programs, self.dir.path()).await?;
        let namespace = plugin_pods::namespace("csi", &self.node_name);
        let cluster_role = format!("swiftlet-csi-hostpath-{}", self.node_name);
        let spec = csi_pods::PodsSpec {
            namespace: &namespace,
            cluster_role: &cluster_role,
            node_name: &self.node_name,
            kubelet_root_dir,
            driver_args,
            sidecars: sidecars.iter().map(|(p, a)| ((*p).to_owned(), a.clone())).collect(),
            shared_dirs: vec![self.dir.path().to_path_buf()],
            server: &self.cluster.state.server,
        };
        self.cluster.kubectl_apply(&csi_pods::manifests(&spec)?.to_string())?;
        self.pods = Some((namespace, cluster_role));
        self.wait_driver(Duration::from_mins(1)).await
    }

    /// Starts the driver process and waits (30 s) until its socket answers `Probe`.
    async fn start_driver(&mut self) -> Result<()> {
        let argv = self.driver_argv.clone();
        self.procs.insert(0, spawn("driver", &argv, &self.log_path("driver"))?);
        self.wait_driver(Duration::from_secs(30)).await
    }

    /// Waits until the driver's socket answers `Probe`.
    async fn wait_driver(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.csi_socket.exists()
                && let Ok(channel) = csi_driver::connect(&self.csi_socket).await
            {
                let mut identity = swiftlet::volumes::csi::proto::identity_client::IdentityClient::new(channel);
                if identity.probe(swiftlet::volumes::csi::proto::ProbeRequest {}).await.is_ok() {
                    return Ok(());
                }
            }
            if let Some(failure) = self.failure() {
                bail!("the CSI driver does not serve: {failure}");
            }
            if Instant::now() >= deadline {
                let events = match &self.pods {
                    Some((namespace, _)) => plugin_pods::events(&self.cluster, namespace),
                    None => String::new(),
                };
                bail!("the CSI driver did not answer in {timeout:?}:\n{}\n{events}", self.log("driver"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the driver (SIGKILL: no goodbye, its sockets stay) and starts it again on
    /// the same sockets and volumes; the sidecars reconnect by themselves.
    ///
    /// # Errors
    /// It did not come back, or it runs as a pod (whose restarts are its agent's).
    pub async fn restart_driver(&mut self) -> Result<()> {
        ensure!(self.pods.is_none(), "the driver runs as a pod: its agent restarts it");
        if let Some(i) = self.procs.iter().position(|p| p.name == "driver") {
            let mut p = self.procs.remove(i);
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        self.start_driver().await
    }

    /// The uid of the driver's pod, when it runs as a pod and has one.
    #[must_use]
    pub fn driver_pod_uid(&self) -> Option<String> {
        let (namespace, _) = self.pods.as_ref()?;
        plugin_pods::pod_uid(&self.cluster, namespace, csi_pods::DAEMONSET).ok()?
    }

    /// Every call the driver answered so far, in order.
    #[must_use]
    pub fn calls(&self) -> Vec<CsiCall> {
        csi_driver::read_calls(&self.calls_log)
    }

    /// The calls of one method (`NodePublishVolume`, ...).
    #[must_use]
    pub fn calls_of(&self, method: &str) -> Vec<CsiCall> {
        self.calls().into_iter().filter(|c| c.method == method).collect()
    }

    /// Waits until a call matches `pred`; returns the first that does.
    ///
    /// # Errors
    /// None within `timeout`; the error lists the calls seen.
    pub async fn wait_for_call(&self, timeout: Duration, pred: impl Fn(&CsiCall) -> bool) -> Result<CsiCall> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.calls().into_iter().find(|c| pred(c)) {
                return Ok(c);
            }
            if Instant::now() >= deadline {
                let seen: Vec<String> =
                    self.calls().iter().map(|c| format!("{} {} {}", c.method, c.volume_id, c.code)).collect();
                bail!("no such CSI call in {timeout:?}; seen:\n{}", seen.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The volumes the driver holds now.
    #[must_use]
    pub fn volumes(&self) -> Vec<VolumeRecord> {
        Store::new(&self.state_dir).all()
    }

    /// A persistent volume claim of the storage class: `size` (a quantity), `Filesystem` or
    /// `Block` mode, `ReadWriteOnce`.
    #[must_use]
    pub fn claim(&self, name: &str, size: &str, block: bool) -> Value {
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "storageClassName": self.storage_class,
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": if block { "Block" } else { "Filesystem" },
                "resources": {"requests": {"storage": size}},
            }
        })
    }

    /// Creates the claim `claim` (see [`CsiHostPath::claim`]) in `namespace` and waits
    /// until it is bound; returns the bound persistent volume.
    ///
    /// # Errors
    /// The API server refused, or it was not bound within `timeout`.
    pub async fn create_bound_claim(
        &self,
        namespace: &str,
        claim: Value,
        timeout: Duration,
    ) -> Result<PersistentVolume> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.cluster.client(), namespace);
        let claim: PersistentVolumeClaim = serde_json::from_value(claim)?;
        let name = claim.metadata.name.clone().context("claim without a name")?;
        claims.create(&kube::api::PostParams::default(), &claim).await?;
        self.wait_bound(namespace, &name, timeout).await
    }

    /// Waits until the claim is bound; returns its persistent volume.
    ///
    /// # Errors
    /// Not bound within `timeout`; the error has the provisioner's log.
    pub async fn wait_bound(&self, namespace: &str, name: &str, timeout: Duration) -> Result<PersistentVolume> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.cluster.client(), namespace);
        let volumes: Api<PersistentVolume> = Api::all(self.cluster.client());
        let deadline = Instant::now() + timeout;
        loop {
            let c = claims.get(name).await?;
            let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Bound")
                && let Some(pv) = c.spec.as_ref().and_then(|s| s.volume_name.as_deref())
            {
                return Ok(volumes.get(pv).await?);
            }
            ensure!(
                Instant::now() < deadline,
                "claim {namespace}/{name} not bound in {timeout:?} (phase {phase:?}); provisioner:\n{}",
                crate::tail(&self.log("csi-provisioner"), 30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes the `CSIDriver`, the storage class, and the persistent volumes and volume
    /// attachments of the driver (their finalizers dropped: the sidecar that would remove
    /// them may be gone).
    fn delete_objects(&self) -> Result<()> {
        let out = self.cluster.kubectl_ok(&["get", "pv", "-o", "json"])?;
        let list: Value = serde_json::from_str(&out)?;
        for pv in list["items"].as_array().into_iter().flatten() {
            if pv["spec"]["csi"]["driver"] != self.driver_name.as_str() {
                continue;
            }
            let Some(name) = pv["metadata"]["name"].as_str() else { continue };
            let _ = self.cluster.kubectl(&["delete", "pv", name, "--ignore-not-found", "--wait=false"]);
            let _ = self.cluster.kubectl(&[
                "patch",
                "pv",
                name,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
        }
        // Attachments of its volumes (the attacher's finalizer dropped: it may be gone).
        let out = self.cluster.kubectl_ok(&["get", "volumeattachments", "-o", "json"])?;
        let list: Value = serde_json::from_str(&out)?;
        for va in list["items"].as_array().into_iter().flatten() {
            if va["spec"]["attacher"] != self.driver_name.as_str() {
                continue;
            }
            let Some(name) = va["metadata"]["name"].as_str() else { continue };
            let _ = self.cluster.kubectl(&[
                "patch",
                "volumeattachment",
                name,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
            let _ = self.cluster.kubectl(&["delete", "volumeattachment", name, "--ignore-not-found", "--wait=false"]);
        }
        let driver = format!("csidriver/{}", self.driver_name);
        let class = format!("storageclass/{}", self.storage_class);
        self.cluster.kubectl_ok(&["delete", &driver, &class, "--ignore-not-found", "--wait=false"])?;
        Ok(())
    }

    /// The loop devices of the driver's block volumes.
    fn loop_devices(&self) -> Vec<PathBuf> {
        let store = Store::new(&self.state_dir);
        self.volumes()
            .iter()
            .filter(|r| r.block)
            .flat_map(|r| csi_driver::loop_devices_of(&store.image_path(&r.id)).unwrap_or_default())
            .collect()
    }

    /// Mount points whose source is one of the driver's volumes (a bind mount of a
    /// directory in the state dir, or of one of `loops`), or that are inside the state
    /// dir; deepest first.
    fn our_mounts(&self, loops: &[PathBuf]) -> Vec<PathBuf> {
        use std::os::unix::fs::MetadataExt as _;
        let Ok(state) = std::fs::canonicalize(&self.state_dir) else { return Vec::new() };
        let Ok(dev) = std::fs::metadata(&state).map(|m| m.dev()) else { return Vec::new() };
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        // The state dir's path inside the file system it is on (its mount's root is `/`
        // for the usual root file system, which is what the root field is relative to).
        let loop_roots: Vec<PathBuf> =
            loops.iter().filter_map(|l| l.file_name()).map(|n| Path::new("/").join(n)).collect();
        let mut found: Vec<PathBuf> = csi_driver::mounts()
            .into_iter()
            .filter(|m| {
                m.mount_point.starts_with(&state)
                    || (m.dev == (major, minor) && m.root.starts_with(&state))
                    || (m.fs_type == "devtmpfs" && loop_roots.contains(&m.root))
            })
            .map(|m| m.mount_point)
            .collect();
        found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        found.dedup();
        found
    }

    fn cleanup(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.cleaned {
            return errors;
        }
        self.cleaned = true;
        // Sidecars first (nothing new provisioned), the driver last.
        for mut p in self.procs.drain(..).rev() {
            terminate(&mut p, Duration::from_secs(5));
        }
        if let Some((namespace, cluster_role)) = self.pods.take()
            && let Err(e) = plugin_pods::delete(&self.cluster, &namespace, csi_pods::DAEMONSET, &cluster_role)
        {
            errors.push(format!("{e:#}"));
        }
        let loops = self.loop_devices();
        for m in self.our_mounts(&loops) {
            let Ok(path) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else { continue };
            // SAFETY: umount2 with a NUL-terminated path; MNT_DETACH cannot fail half-way.
            if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
                errors.push(format!("unmounting {}: {}", m.display(), std::io::Error::last_os_error()));
            }
        }
        for l in &loops {
            if let Err(e) = Command::new("losetup").arg("-d").arg(l).status() {
                errors.push(format!("detaching {}: {e}", l.display()));
            }
        }
        for s in [&self.csi_socket, &self.registration_socket] {
            let _ = std::fs::remove_file(s);
        }
        if let Some(d) = self.csi_socket.parent() {
            let _ = std::fs::remove_dir(d);
        }
        if let Err(e) = self.delete_objects() {
            errors.push(format!("deleting the objects: {e:#}"));
        }
        errors
    }

    /// Stops everything it started and removes what its volumes left (see the module
    /// documentation).
    ///
    /// # Errors
    /// Something could not be undone; the rest was.
    pub fn stop(mut self) -> Result<()> {
        let errors = self.cleanup();
        ensure!(errors.is_empty(), "CSI host-path clean-up: {}", errors.join("; "));
        Ok(())
    }
}

impl Drop for CsiHostPath {
    fn drop(&mut self) {
        for e in self.cleanup() {
            eprintln!("CSI host-path clean-up: {e}");
        }
    }
}
