//! One `swiftlet` process under benchmark, set up the way the end-to-end tests set one up
//! (`tests/src/lib.rs`): its own directory (config, manifests, root dir, certificates, pod
//! logs, event socket, log file), free ports on 127.0.0.1, and a fresh `cgroupRoot`
//! created in every cgroup hierarchy. Its HTTPS API has a self-signed certificate and
//! anonymous access, and is read with `curl -sk` (xtask stays pure Rust: no TLS stack).
//!
//! The same set-up runs another kubelet-compatible agent (`bench --other-agent`): the
//! same config file and the upstream flags, without swiftlet's own (`--evented-pleg`,
//! `--event-api-socket`); and either agent can join the test bed's control plane as a node
//! of its own name ([`BenchAgent::joining`]: TLS bootstrap with the bootstrap token, as a
//! kubeadm node joins).
//!
//! [`BenchAgent::teardown`] undoes everything whatever state the run stopped in: pods
//! (through the agent, else through CRI), the process, the cgroups, the directory.

use std::{
    collections::BTreeSet,
    fmt, fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::{
    cleanup, containerd,
    cri::{CriClient, PodSandbox},
    testbed::Layout,
};

/// `PodSandboxState::SANDBOX_READY`.
pub const SANDBOX_READY: i32 = 0;

/// Namespace of every bench pod: CRI sandboxes in it, or in a namespace named after it
/// (`swiftlet-bench-<pid>-<label>`, an API bench's: see [`is_bench_namespace`]), are the
/// bench's.
pub const NAMESPACE: &str = "swiftlet-bench";

/// Whether pods of `namespace` are the bench's: [`NAMESPACE`] (static pods, the runtime's
/// own pods) or `NAMESPACE-...` (the namespaces of the API benches).
pub fn is_bench_namespace(namespace: &str) -> bool {
    namespace.strip_prefix(NAMESPACE).is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}
/// `--hostname-override`: static pod names get `-bench` appended.
pub const NODE_NAME: &str = "bench";
/// What the agent logs (the benches read their records from the event API, see
/// `bench::records`).
const RUST_LOG: &str = "info";

/// Which PLEG the agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlegMode {
    /// `--evented-pleg=true`: eBPF sensors, safety relist every 30 s.
    Evented,
    /// `--evented-pleg=false`: the upstream 1 s relist alone.
    Relist,
}

impl PlegMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Evented => "evented",
            Self::Relist => "relist",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Self::Evented => "--evented-pleg=true",
            Self::Relist => "--evented-pleg=false",
        }
    }

    /// What `/healthz?verbose` must say when this PLEG is the one running.
    pub fn health_marker(self) -> &'static str {
        match self {
            Self::Evented => "[+]pleg ok (evented",
            Self::Relist => "[+]pleg ok (relisting only",
        }
    }
}

impl fmt::Display for PlegMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Evented => "evented PLEG (eBPF)",
            Self::Relist => "relist PLEG (1 s)",
        })
    }
}

/// A container as `/pods` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    pub name: String,
    /// The runtime's id, without the `containerd://` prefix.
    pub id: Option<String>,
    pub running: bool,
    pub restarts: u32,
}

/// A pod as `/pods` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub containers: Vec<ContainerView>,
}

impl PodView {
    pub fn running_containers(&self) -> usize {
        self.containers.iter().filter(|c| c.running && c.id.is_some()).count()
    }
}

/// The pods of a `/pods` `PodList`.
pub fn parse_pods(body: &str) -> Result<Vec<PodView>> {
    let list: Value = serde_json::from_str(body).context("/pods is not JSON")?;
    // An empty list's items are `null` from the upstream kubelet (Go's nil slice).
    let items = match &list["items"] {
        Value::Null if list["kind"] == "PodList" => &[][..],
        items => items.as_array().context("/pods has no items")?,
    };
    Ok(items
        .iter()
        .map(|p| PodView {
            name: p["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
            uid: p["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
            containers: p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| ContainerView {
                    name: c["name"].as_str().unwrap_or_default().to_owned(),
                    id: c["containerID"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map(|s| s.split_once("://").map_or(s, |(_, id)| id).to_owned()),
                    running: c["state"]["running"].is_object(),
                    restarts: c["restartCount"].as_u64().unwrap_or(0) as u32,
                })
                .collect(),
        })
        .collect())
}

/// `GET url` with `curl -sk`: (status code, body).
pub async fn http_get(url: &str) -> Result<(u16, String)> {
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "--max-time", "30", "-w", "\n%{http_code}", url])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running curl (apt package curl)")?;
    if !out.status.success() {
        bail!("curl {url}: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').with_context(|| format!("curl {url}: no status code"))?;
    Ok((code.trim().parse().with_context(|| format!("curl {url}: status {code:?}"))?, body.to_owned()))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A bench agent: paths and ports are fixed at construction, nothing exists until
/// [`setup`](Self::setup), and [`teardown`](Self::teardown) copes with any state between.
#[derive(Debug)]
pub struct BenchAgent {
    pub mode: PlegMode,
    /// What the logs call this agent (`evented`, `relist`, `swiftlet`, `kubelet`, ...).
    pub label: String,
    binary: PathBuf,
    endpoint: String,
    max_pods: usize,
    /// swiftlet (its own flags are given), or another kubelet-compatible agent.
    swiftlet: bool,
    /// `--hostname-override`: [`NODE_NAME`] unless joined under another name.
    node_name: String,
    /// `--bootstrap-kubeconfig` (and `--kubeconfig`, written by the TLS bootstrap, in the
    /// agent's directory): join the control plane as node `node_name`.
    bootstrap_kubeconfig: Option<PathBuf>,
    /// `KubeletConfiguration` lines appended to the config.
    extra_config: String,
    extra_flags: Vec<String>,
    /// How long [`teardown`](Self::teardown) waits for the agent to remove its pods.
    drain_timeout: Duration,
    child: Option<Child>,
    pub dir: PathBuf,
    pub manifests: PathBuf,
    pub log_path: PathBuf,
    pub https_port: u16,
    pub healthz_port: u16,
    /// `address`: where the HTTPS API listens (loopback unless the API server must reach
    /// it, see [`Self::serving_the_api_server`]).
    address: &'static str,
    /// `cgroupRoot`, e.g. `/swiftlet-bench-4242-evented`.
    pub cgroup_root: String,
}

impl BenchAgent {
    pub fn new(mode: PlegMode, binary: &Path, endpoint: &str, max_pods: usize) -> Result<Self> {
        Self::named(mode.name(), mode, binary, endpoint, max_pods)
    }

    /// An agent whose directory and cgroup root carry `label` (unique within one bench).
    pub fn named(label: &str, mode: PlegMode, binary: &Path, endpoint: &str, max_pods: usize) -> Result<Self> {
        let tag = format!("swiftlet-bench-{}-{label}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        Ok(Self {
            mode,
            label: label.to_owned(),
            binary: binary.to_path_buf(),
            endpoint: endpoint.to_owned(),
            max_pods,
            swiftlet: true,
            node_name: NODE_NAME.to_owned(),
            bootstrap_kubeconfig: None,
            extra_config: String::new(),
            extra_flags: Vec::new(),
            drain_timeout: Duration::from_mins(3),
            child: None,
            manifests: dir.join("manifests"),
            log_path: dir.join("swiftlet.log"),
            dir,
            https_port: free_port()?,
            healthz_port: free_port()?,
            address: "127.0.0.1",
            cgroup_root: format!("/{tag}"),
        })
    }

    /// Serves the HTTPS API on every address (the kubelet's default) instead of loopback:
    /// the API server reaches a node at its `InternalIP` for logs, exec and port-forward,
    /// which the conformance suite uses.
    #[must_use]
    pub fn serving_the_api_server(mut self) -> Self {
        self.address = "0.0.0.0";
        self
    }

    /// Runs another kubelet-compatible agent: no swiftlet-only flags.
    #[must_use]
    pub fn other_agent(mut self) -> Self {
        self.swiftlet = false;
        self
    }

    /// Joins the control plane as node `node_name` by TLS bootstrap with `bootstrap` (a
    /// kubeconfig with a bootstrap token): the kubelet flags `--bootstrap-kubeconfig` and
    /// `--kubeconfig` (the signed certificate's kubeconfig, in the agent's directory).
    /// `registration` is appended to the config (the bench nodes' taint). No `--node-ip`:
    /// the bench never has the API server call the node, and the upstream kubelet refuses
    /// a loopback one.
    #[must_use]
    pub fn joining(mut self, node_name: &str, bootstrap: &Path, registration: &str) -> Self {
        node_name.clone_into(&mut self.node_name);
        self.bootstrap_kubeconfig = Some(bootstrap.to_path_buf());
        self.with_config(registration)
    }

    /// The node name (`--hostname-override`).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The agent's `--root-dir` (where a CSI driver registers with it in
    /// `plugins_registry`).
    pub fn root_dir(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// The kubeconfig the agent uses once joined (written by its TLS bootstrap).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubelet.conf")
    }

    /// Configures the cluster's DNS as a cluster's nodes have it (`clusterDNS`,
    /// `clusterDomain`). Without it, each new pod with the default `ClusterFirst` policy
    /// costs four `MissingClusterDNS` warning events (two on the pod, two on the node), on
    /// either agent: API work in a start-up burst that a configured node never does. Only
    /// where pods do no DNS lookups: the test bed serves no DNS at the address.
    #[must_use]
    pub fn with_cluster_dns(self) -> Self {
        self.with_config(&format!("clusterDNS:\n- {}\nclusterDomain: cluster.local\n", crate::cluster::CLUSTER_DNS))
    }

    /// Appends `KubeletConfiguration` lines (YAML, top level) to the config.
    #[must_use]
    pub fn with_config(mut self, yaml: &str) -> Self {
        self.extra_config.push_str(yaml);
        if !self.extra_config.ends_with('\n') {
            self.extra_config.push('\n');
        }
        self
    }

    /// Adds command-line flags.
    #[must_use]
    pub fn with_flags(mut self, flags: &[&str]) -> Self {
        self.extra_flags.extend(flags.iter().map(|f| (*f).to_owned()));
        self
    }

    /// How long the teardown waits for the agent to remove its pods (default 3 min).
    #[must_use]
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// The cgroup root's directory in the v1 memory hierarchy (`None` without one).
    pub fn memory_cgroup_root(&self) -> Option<PathBuf> {
        let memory = Path::new("/sys/fs/cgroup/memory");
        memory.join("memory.limit_in_bytes").exists().then(|| memory.join(self.cgroup_root.trim_start_matches('/')))
    }

    /// The cgroup root's directory in every hierarchy.
    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let rel = self.cgroup_root.trim_start_matches('/');
        cleanup::cgroup_hierarchies().into_iter().map(|h| h.join(rel)).collect()
    }

    /// Creates the directories, the config and the cgroup root.
    pub fn setup(&self) -> Result<()> {
        for d in [&self.manifests, &self.dir.join("pod-logs")] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        // The kubelet requires cgroupRoot to exist, in every hierarchy.
        for d in self.cgroup_dirs() {
            fs::create_dir_all(&d).with_context(|| format!("creating cgroup {}", d.display()))?;
        }
        if !self.swiftlet {
            share_root_dir(&self.root_dir())?;
        }
        let config = self.config();
        let path = self.dir.join("config.yaml");
        fs::write(&path, config).with_context(|| format!("writing {}", path.display()))
    }

    /// The `KubeletConfiguration` file's text.
    pub fn config(&self) -> String {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {manifests}
{logs}address: {address}
port: {https}
healthzPort: {healthz}
healthzBindAddress: 127.0.0.1
cgroupRoot: {cgroup_root}
maxPods: {max_pods}
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
{cgroup_v1}{eviction}{image_gc}{extra}",
            manifests = self.manifests.display(),
            // podLogsDir is newer than some kubelets (1.28 refuses it): another agent
            // writes its pod logs to its default, /var/log/pods.
            logs = if self.swiftlet {
                format!("podLogsDir: {}\n", self.dir.join("pod-logs").display())
            } else {
                String::new()
            },
            address = self.address,
            https = self.https_port,
            healthz = self.healthz_port,
            cgroup_root = self.cgroup_root,
            max_pods = self.max_pods.max(110),
            // Kubelets from 1.35 on refuse to start on a cgroup v1 host unless told (this
            // test bed's hosts are v1); older ones ignore the field with a warning.
            cgroup_v1 = if self.swiftlet { "" } else { "failCgroupV1: false\n" },
            // The host's disk is the agents' nodefs and imagefs: a nearly full developer
            // disk must not put the node under disk pressure (whose passes would be
            // measured too). Benches that test eviction set their own thresholds.
            eviction = if self.extra_config.contains("evictionHard") {
                ""
            } else {
                "evictionHard:\n  memory.available: 100Mi\n"
            },
            // Nor must it set image GC going: at 85 % used (the default high threshold)
            // the upstream kubelet removed the sandbox image, which containerd 1.6 does
            // not pin, six minutes into a conformance run, and every later pod failed to
            // start. Runs that test image GC set their own thresholds.
            image_gc = if self.extra_config.contains("imageGC") {
                ""
            } else {
                "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n"
            },
            extra = self.extra_config,
        )
    }

    /// The command-line flags after `--config` (the binary's own directory layout, the
    /// runtime, the node name, the API server, swiftlet's own flags for swiftlet).
    pub fn flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--container-runtime-endpoint".to_owned(),
            self.endpoint.clone(),
            "--root-dir".to_owned(),
            self.root_dir().display().to_string(),
            "--cert-dir".to_owned(),
            self.dir.join("pki").display().to_string(),
            "--hostname-override".to_owned(),
            self.node_name.clone(),
        ];
        if let Some(b) = &self.bootstrap_kubeconfig {
            flags.push(format!("--bootstrap-kubeconfig={}", b.display()));
            flags.push(format!("--kubeconfig={}", self.kubeconfig().display()));
        }
        if let Some(socket) = self.event_socket() {
            flags.push(format!("--event-api-socket={}", socket.display()));
            flags.push(self.mode.flag().to_owned());
        }
        flags.extend(self.extra_flags.iter().cloned());
        flags
    }

    /// The event API socket swiftlet serves (where the benches read its records); `None`
    /// for the upstream kubelet.
    pub fn event_socket(&self) -> Option<PathBuf> {
        self.swiftlet.then(|| self.dir.join("events.sock"))
    }

    /// Starts the process and waits until `/healthz` answers.
    pub async fn spawn(&mut self) -> Result<()> {
        let log = fs::File::create(&self.log_path).with_context(|| format!("creating {}", self.log_path.display()))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--config")
            .arg(self.dir.join("config.yaml"))
            .args(self.flags())
            .env("RUST_LOG", RUST_LOG)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Ctrl-C reaches only xtask, which drains the pods before it stops the agent.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent. Should
        // xtask die without cleaning up, the agent gets SIGTERM instead of running on.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", self.binary.display()))?;
        let what = if self.swiftlet { format!("swiftlet ({})", self.mode) } else { self.label.clone() };
        eprintln!("bench: started {what} pid {}, log {}", child.id(), self.log_path.display());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            self.ensure_alive()?;
            if http_get(&self.healthz_url("")).await.is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not answer /healthz within 60 s; log tail:\n{}", self.label, self.log_tail(40));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }

    /// Fails (with the log's tail) if the agent is not running.
    pub fn ensure_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else { bail!("the agent ({}) is not running", self.label) };
        if let Some(status) = child.try_wait()? {
            self.child = None;
            bail!("the agent ({}) exited unexpectedly with {status}; log tail:\n{}", self.label, self.log_tail(40));
        }
        Ok(())
    }

    pub fn log_tail(&self, lines: usize) -> String {
        containerd::log_tail(&self.log_path, lines)
    }

    fn healthz_url(&self, query: &str) -> String {
        format!("http://127.0.0.1:{}/healthz{query}", self.healthz_port)
    }

    /// The body of `/healthz?verbose`.
    pub async fn healthz_verbose(&self) -> Result<String> {
        Ok(http_get(&self.healthz_url("?verbose")).await?.1)
    }

    pub async fn pods(&self) -> Result<Vec<PodView>> {
        let url = format!("https://127.0.0.1:{}/pods", self.https_port);
        let (code, body) = http_get(&url).await?;
        if code != 200 {
            bail!("GET {url}: {code}: {body}");
        }
        parse_pods(&body)
    }

    /// The body of `/metrics`.
    pub async fn metrics_text(&self) -> Result<String> {
        let url = format!("https://127.0.0.1:{}/metrics", self.https_port);
        let (code, body) = http_get(&url).await?;
        ensure!(code == 200, "GET {url}: {code}: {body}");
        Ok(body)
    }

    /// Writes a manifest atomically (the agent ignores dot files).
    pub fn write_manifest(&self, file: &str, manifest: &Value) -> Result<()> {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        fs::write(&tmp, serde_json::to_vec_pretty(manifest)?).with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, self.manifests.join(file)).with_context(|| format!("renaming {}", tmp.display()))
    }

    pub fn remove_manifests(&self) -> Result<()> {
        let Ok(entries) = fs::read_dir(&self.manifests) else { return Ok(()) };
        for e in entries {
            let p = e?.path();
            fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
        Ok(())
    }

    /// Waits until `/pods` is empty and CRI has no bench sandbox left.
    pub async fn wait_drained(&mut self, cri: &mut CriClient, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last_note = Instant::now();
        loop {
            self.ensure_alive()?;
            let pods = self.pods().await?.len();
            let sandboxes = bench_sandboxes(cri).await?.len();
            if pods == 0 && sandboxes == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{pods} pod(s) in /pods and {sandboxes} sandbox(es) in CRI {timeout:?} after removing every \
                     manifest; log tail:\n{}",
                    self.log_tail(40)
                );
            }
            if last_note.elapsed() > Duration::from_secs(15) {
                eprintln!("bench: draining: {pods} pod(s) in /pods, {sandboxes} sandbox(es) in CRI");
                last_note = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// SIGTERM (the agent's graceful shutdown, which leaves pods running), then SIGKILL.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let pid = i32::try_from(child.id())?;
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        containerd::signal(pid, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                eprintln!("bench: {} pid {pid} ignored SIGTERM for 30 s: SIGKILL", self.label);
                child.kill()?;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = child.wait()?;
        eprintln!("bench: {} pid {pid} stopped ({status})", self.label);
        Ok(())
    }

    /// Removes everything this agent made, whatever state it is in: its pods (through the
    /// agent while it runs, else through CRI), the process, the cgroup root tree and the
    /// directory. The log is first copied to `keep_log`. Every step runs even when an
    /// earlier one failed; the failures are returned together.
    pub async fn teardown(&mut self, layout: &Layout, keep_log: &Path) -> Result<()> {
        let mut failures = Vec::new();
        let mut cri = match CriClient::connect(&layout.socket()).await {
            Ok(c) => Some(c),
            Err(e) => {
                failures.push(format!("connecting to CRI: {e:#}"));
                None
            }
        };
        if self.child.is_some() && self.ensure_alive().is_ok() {
            if let Err(e) = self.remove_manifests() {
                failures.push(format!("removing manifests: {e:#}"));
            }
            if let Some(cri) = cri.as_mut() {
                eprintln!("bench: removing the pods of the {} run", self.label);
                if let Err(e) = self.wait_drained(cri, self.drain_timeout).await {
                    eprintln!("bench: the agent did not remove its pods ({e:#}); removing them through CRI");
                }
            }
        }
        if let Err(e) = self.stop() {
            failures.push(format!("stopping the agent: {e:#}"));
        }
        if let Some(cri) = cri.as_mut()
            && let Err(e) = remove_bench_sandboxes(cri).await
        {
            failures.push(format!("removing sandboxes through CRI: {e:#}"));
        }
        for root in self.cgroup_dirs() {
            for dir in cleanup::cgroup_tree(&root) {
                if let Err(e) = fs::remove_dir(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    failures.push(format!("removing cgroup {}: {e}", dir.display()));
                }
            }
        }
        if self.log_path.exists() {
            if let Some(parent) = keep_log.parent() {
                let _ = fs::create_dir_all(parent);
            }
            match fs::copy(&self.log_path, keep_log) {
                Ok(_) => eprintln!("bench: agent log kept at {}", keep_log.display()),
                Err(e) => failures.push(format!("keeping the agent log: {e}")),
            }
        }
        if !self.swiftlet
            && let Err(e) = remove_pod_log_dirs(Path::new(UPSTREAM_POD_LOGS))
        {
            failures.push(format!("removing pod logs under {UPSTREAM_POD_LOGS}: {e:#}"));
        }
        if let Err(e) =
            cleanup::unmount_all_under(std::slice::from_ref(&self.dir)).and_then(|()| cleanup::remove_dir(&self.dir))
        {
            failures.push(format!("removing {}: {e:#}", self.dir.display()));
        }
        if failures.is_empty() { Ok(()) } else { bail!("cleanup incomplete: {}", failures.join("; ")) }
    }
}

impl Drop for BenchAgent {
    /// Last resort (teardown is the real way): never leave the process running.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where another agent writes its pod logs (its default `podLogsDir`).
const UPSTREAM_POD_LOGS: &str = "/var/log/pods";

/// Whether a pod log directory (`<namespace>_<name>_<uid>`) is a bench pod's.
pub fn is_bench_pod_log_dir(name: &str) -> bool {
    name.split_once('_').is_some_and(|(namespace, _)| is_bench_namespace(namespace))
}

/// Removes the bench pods' log directories under `dir` (another agent leaves those of the
/// pods removed through CRI).
fn remove_pod_log_dirs(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else { return Ok(()) };
    for e in entries {
        let e = e?;
        if e.file_name().to_str().is_some_and(is_bench_pod_log_dir) {
            fs::remove_dir_all(e.path()).with_context(|| format!("removing {}", e.path().display()))?;
        }
    }
    Ok(())
}

/// What is wrong with the test bed's sandboxes for a measurement that expects exactly the
/// ready sandboxes `ours` in the bench namespace and nothing else, if anything.
///
/// The test bed is shared: an end-to-end test starting meanwhile removes every sandbox
/// (the bench's too), and its pods would be taken over by the bench's agent. Either makes
/// the figures wrong, so the bench stops rather than print them.
pub fn disturbance(sandboxes: &[PodSandbox], ours: &BTreeSet<String>) -> Option<String> {
    if let Some(why) = foreign_pods(sandboxes) {
        return Some(why);
    }
    let ready: BTreeSet<String> = sandboxes
        .iter()
        .filter(|s| s.state == SANDBOX_READY && s.metadata.as_ref().is_some_and(|m| is_bench_namespace(&m.namespace)))
        .map(|s| s.id.clone())
        .collect();
    if &ready != ours {
        return Some(format!(
            "{} of the bench's {} pod sandboxes stopped or vanished and {} appeared: something else (an end-to-end \
             test's clean-up?) is stopping pods in the test bed",
            ours.difference(&ready).count(),
            ours.len(),
            ready.difference(ours).count()
        ));
    }
    None
}

/// What is foreign in the test bed (sandboxes outside the bench namespace), if anything.
pub fn foreign_pods(sandboxes: &[PodSandbox]) -> Option<String> {
    let foreign: Vec<String> = sandboxes
        .iter()
        .filter(|s| s.metadata.as_ref().is_none_or(|m| !is_bench_namespace(&m.namespace)))
        .map(|s| s.metadata.as_ref().map_or_else(|| s.id.clone(), |m| format!("{}/{}", m.namespace, m.name)))
        .collect();
    (!foreign.is_empty()).then(|| {
        format!(
            "pods of someone else appeared in the test bed ({}): another agent or an end-to-end test is using it",
            foreign.join(", ")
        )
    })
}

/// The ready sandboxes of the bench namespace.
pub async fn ready_bench_sandboxes(cri: &mut CriClient) -> Result<BTreeSet<String>> {
    Ok(cri
        .list_pod_sandboxes()
        .await?
        .into_iter()
        .filter(|s| s.state == SANDBOX_READY && s.metadata.as_ref().is_some_and(|m| is_bench_namespace(&m.namespace)))
        .map(|s| s.id)
        .collect())
}

/// Fails if the test bed is not as the measurement left it (see [`disturbance`]).
pub async fn ensure_undisturbed(cri: &mut CriClient, ours: &BTreeSet<String>) -> Result<()> {
    match disturbance(&cri.list_pod_sandboxes().await?, ours) {
        Some(why) => bail!("the test bed was disturbed during the measurement, the figures would be wrong: {why}"),
        None => Ok(()),
    }
}

/// CRI sandboxes in the bench namespaces.
pub async fn bench_sandboxes(cri: &mut CriClient) -> Result<Vec<String>> {
    Ok(cri
        .list_pod_sandboxes()
        .await?
        .into_iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| is_bench_namespace(&m.namespace)))
        .map(|s| s.id)
        .collect())
}

/// Stops and removes every sandbox in the bench namespace (and so its containers).
pub async fn remove_bench_sandboxes(cri: &mut CriClient) -> Result<usize> {
    let ids = bench_sandboxes(cri).await?;
    for id in &ids {
        cri.stop_pod_sandbox(id).await?;
        cri.remove_pod_sandbox(id).await?;
    }
    if !ids.is_empty() {
        eprintln!("bench: removed {} bench sandbox(es) through CRI", ids.len());
    }
    Ok(ids.len())
}

/// Makes `root` (the upstream kubelet's `--root-dir`) a bind mount of itself with shared
/// propagation, before the kubelet starts. On a systemd host `/` is shared and the
/// kubelet finds nothing to do; on this test machine it is not, and the kubelet makes the
/// bind mount itself (`MakeRShared`) while another of its goroutines creates the pods
/// API socket in that directory: kubelet 1.37.2 then exits at start, now and then, with
/// "failed to move temporary file ... invalid cross-device link" (its listener renames
/// the socket across the new mount). Done here, the kubelet starts as on a real node.
/// The bench's teardown unmounts it with everything else under the agent's directory.
fn share_root_dir(root: &Path) -> Result<()> {
    use std::ffi::CString;
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    if cleanup::mounts_under(&cleanup::mounts()?, &[root.to_path_buf()]).iter().any(|m| m == root) {
        return Ok(());
    }
    let path = CString::new(root.as_os_str().as_encoded_bytes()).context("a root dir with a NUL byte")?;
    // SAFETY: plain mount(2) calls with valid NUL-terminated strings and null data.
    let bind = unsafe {
        libc::mount(path.as_ptr(), path.as_ptr(), std::ptr::null(), libc::MS_BIND | libc::MS_REC, std::ptr::null())
    };
    if bind != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("bind-mounting {}", root.display()));
    }
    // SAFETY: as above; only the propagation of the mount just made changes.
    let shared = unsafe {
        libc::mount(std::ptr::null(), path.as_ptr(), std::ptr::null(), libc::MS_SHARED | libc::MS_REC, std::ptr::null())
    };
    if shared != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("making {} shared", root.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::PodSandboxMetadata;

    fn sandbox(id: &str, namespace: &str, state: i32) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: format!("pod-{id}"),
                uid: id.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            state,
        }
    }

    #[test]
    fn bench_namespaces_are_the_bench_namespace_and_those_named_after_it() {
        assert!(is_bench_namespace(NAMESPACE));
        assert!(is_bench_namespace("swiftlet-bench-4242-kubelet"));
        assert!(!is_bench_namespace("swiftlet-benchmark") && !is_bench_namespace("default"));
        assert!(is_bench_pod_log_dir("swiftlet-bench-19315-kubelet_warmup_01f6c5f2-65bf-47ea-8ba1-4aa801a612c1"));
        assert!(is_bench_pod_log_dir("swiftlet-bench_lat-00-bench_u1"));
        assert!(!is_bench_pod_log_dir("default_web-0_u2") && !is_bench_pod_log_dir("swiftlet-bench"));
    }

    #[test]
    fn notices_foreign_and_replaced_sandboxes() {
        let ours: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let fine = [sandbox("a", NAMESPACE, 0), sandbox("b", NAMESPACE, 0)];
        assert_eq!(disturbance(&fine, &ours), None);

        let foreign = [sandbox("a", NAMESPACE, 0), sandbox("b", NAMESPACE, 0), sandbox("x", "default", 0)];
        assert!(disturbance(&foreign, &ours).unwrap().contains("default/pod-x"));

        // b was stopped (NOTREADY) and a replaced by c.
        let stopped = [sandbox("c", NAMESPACE, 0), sandbox("b", NAMESPACE, 1)];
        assert!(disturbance(&stopped, &ours).unwrap().starts_with("2 of the bench's 2 pod sandboxes"));
    }

    #[test]
    fn another_agent_gets_the_upstream_flags_and_config_only() {
        let ours =
            BenchAgent::named("swiftlet", PlegMode::Evented, Path::new("/bin/swiftlet"), "unix:///cri.sock", 100)
                .unwrap()
                .joining("swiftlet-bench-swiftlet", Path::new("/tmp/bootstrap.conf"), "registerWithTaints: []\n")
                .with_config("failSwapOn: false")
                .with_flags(&["--eviction-kernel-signals=false"]);
        let flags = ours.flags();
        assert!(flags.windows(2).any(|w| w == ["--hostname-override", "swiftlet-bench-swiftlet"]), "{flags:?}");
        assert!(flags.contains(&"--bootstrap-kubeconfig=/tmp/bootstrap.conf".to_owned()), "{flags:?}");
        assert!(flags.contains(&format!("--kubeconfig={}", ours.dir.join("kubelet.conf").display())), "{flags:?}");
        assert!(!flags.iter().any(|f| f.starts_with("--node-ip")), "{flags:?}");
        assert!(flags.contains(&"--evented-pleg=true".to_owned()), "{flags:?}");
        assert!(flags.iter().any(|f| f.starts_with("--event-api-socket=")), "{flags:?}");
        assert_eq!(flags.last().map(String::as_str), Some("--eviction-kernel-signals=false"));
        let config = ours.config();
        assert!(
            config.contains("\npodLogsDir: ")
                && config.ends_with(
                    "mode: AlwaysAllow\nevictionHard:\n  memory.available: 100Mi\nimageGCHighThresholdPercent: \
                     100\nimageGCLowThresholdPercent: 99\nregisterWithTaints: []\nfailSwapOn: false\n"
                ),
            "{config}"
        );
        assert!(config.contains("maxPods: 110\n") && config.contains(&format!("cgroupRoot: {}\n", ours.cgroup_root)));
        assert!(
            ours.cgroup_root.ends_with("-swiftlet") && ours.dir.ends_with(ours.cgroup_root.trim_start_matches('/'))
        );

        let other = BenchAgent::named("kubelet", PlegMode::Evented, Path::new("/bin/kubelet"), "unix:///cri.sock", 200)
            .unwrap()
            .other_agent();
        let flags = other.flags();
        assert!(
            !flags.iter().any(|f| f.starts_with("--evented-pleg") || f.starts_with("--event-api-socket")),
            "{flags:?}"
        );
        assert_eq!(&flags[..2], ["--container-runtime-endpoint", "unix:///cri.sock"]);
        assert!(flags.windows(2).any(|w| w == ["--hostname-override", NODE_NAME]));
        assert!(!other.config().contains("podLogsDir") && other.config().contains("maxPods: 200\n"));
        assert!(other.config().contains("\nfailCgroupV1: false\n") && !ours.config().contains("failCgroupV1"));
        // A full developer disk sets neither agent's image GC going (it took the sandbox
        // image from the upstream kubelet); a run about image GC sets its own thresholds.
        assert!(other.config().contains("\nimageGCHighThresholdPercent: 100\n"), "{}", other.config());
        let gc = other.with_config("imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 40").config();
        assert_eq!(gc.matches("imageGCHighThresholdPercent").count(), 1, "{gc}");
        assert!(!flags.iter().any(|f| f.starts_with("--kubeconfig") || f.starts_with("--bootstrap")), "{flags:?}");
    }

    #[test]
    fn reads_pods_and_container_ids() {
        let body = r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
          {"metadata":{"name":"lat-00-bench","uid":"u1"},
           "status":{"containerStatuses":[
             {"name":"c0","containerID":"containerd://abc","restartCount":2,"state":{"running":{"startedAt":"x"}}},
             {"name":"c1","containerID":"","restartCount":0,"state":{"waiting":{"reason":"ContainerCreating"}}}]}},
          {"metadata":{"name":"idle-000-bench","uid":"u2"},"status":{}}]}"#;
        let pods = parse_pods(body).unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(
            pods[0].containers[0],
            ContainerView { name: "c0".into(), id: Some("abc".into()), running: true, restarts: 2 }
        );
        assert_eq!(pods[0].containers[1].id, None);
        assert_eq!(pods[0].running_containers(), 1);
        assert_eq!((pods[1].uid.as_str(), pods[1].containers.len()), ("u2", 0));
        assert!(parse_pods("not json").is_err());
        // The upstream kubelet's empty list.
        assert_eq!(parse_pods(r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":null}"#).unwrap(), []);
        assert!(parse_pods(r#"{"kind":"Status"}"#).is_err());
    }
}
