//! End-to-end test support: the shared containerd test bed (brought up by
//! `cargo xtask testbed up`), a CRI client to check what really runs, and [`Agent`],
//! a real `swiftlet` process with its own directories, ports and cgroup root.
//!
//! One containerd is shared by every end-to-end test, and a kubelet owns every pod it
//! finds in its runtime, so the tests take [`testbed_lock`] and run one at a time.

pub mod chaos;
pub mod cluster;
pub mod containerd;
pub mod csi_driver;
pub mod csi_hostpath;
pub mod csi_pods;
pub mod device_plugin;
pub mod dra_driver;
pub mod h2_authority;
pub mod logind;
pub mod node;
pub mod outage;
pub mod plugin_pods;
pub mod pods;
pub mod prometheus;
pub mod registry;
pub mod runtime_events;
pub mod scratch;
pub mod spdy;
pub mod streaming;
pub mod tcp_proxy;

pub use registry::TestRegistry;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint, Uri};

/// Where `cargo xtask testbed up` records the test bed.
pub const TESTBED_STATE: &str = "/run/swiftlet-testbed/testbed.json";

/// The CRI endpoint of the test bed: `SWIFTLET_CRI_ENDPOINT`, else the test bed state file.
pub fn cri_endpoint() -> Result<String> {
    if let Some((node, runtime)) = node::node_target()? {
        return Ok(node.cri_endpoint(*runtime));
    }
    if let Ok(e) = std::env::var("SWIFTLET_CRI_ENDPOINT") {
        return Ok(e);
    }
    let text = std::fs::read_to_string(TESTBED_STATE)
        .with_context(|| format!("no test bed: run `cargo xtask testbed up` first (reading {TESTBED_STATE})"))?;
    let v: Value = serde_json::from_str(&text)?;
    v["cri_endpoint"].as_str().map(str::to_string).context("test bed state has no cri_endpoint")
}

/// Polls `check` every 250 ms until it gives `Some`, for at most `timeout`; the error
/// names `what` and the last error `check` returned.
///
/// # Errors
/// Not reached within `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if Instant::now() > deadline {
            bail!("{what} not within {timeout:?} (last error: {last_error:?})");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The file whose `flock` serializes test processes on one test bed.
const CROSS_PROCESS_LOCK: &str = "/run/swiftlet-testbed/e2e.lock";

/// Held while a test uses the shared test bed: the lock of the tests of this process,
/// and an exclusive `flock` that keeps out the tests of other processes (two test
/// binaries run at once, say, by two developers' `cargo test` on one machine). Agents
/// share one containerd, and an agent stops the pods in it that are not its own: two
/// tests at once would kill each other's pods.
#[derive(Debug)]
pub struct TestbedGuard {
    _in_process: tokio::sync::MutexGuard<'static, ()>,
    _across_processes: Option<std::fs::File>,
}

/// Serializes tests that use the shared test bed, within this process and across
/// processes (see [`TestbedGuard`]). Without a test bed there is nothing to share and
/// only the in-process lock is taken.
pub async fn testbed_lock() -> TestbedGuard {
    let in_process = LOCK.lock().await;
    let across = tokio::task::spawn_blocking(|| {
        use std::os::fd::AsRawFd as _;
        let file =
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(CROSS_PROCESS_LOCK).ok()?;
        // SAFETY: flock on a descriptor this function owns; the lock goes with the file.
        (unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0).then_some(file)
    })
    .await
    .ok()
    .flatten();
    TestbedGuard { _in_process: in_process, _across_processes: across }
}

/// The `swiftlet` binary built next to the test executables (`target/<profile>/swiftlet`),
/// or `SWIFTLET_BIN`.
pub fn swiftlet_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SWIFTLET_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    // target/debug/deps/e2e-xxxx -> target/debug/swiftlet
    let bin = exe.parent().and_then(Path::parent).context("test executable has no parent")?.join("swiftlet");
    if !bin.exists() {
        bail!("{} not found: run `cargo build -p swiftlet` first", bin.display());
    }
    // `cargo test -p swiftlet-tests` does not build the agent: a binary older than its
    // sources would test code that is not the checkout's.
    let built = std::fs::metadata(&bin)?.modified()?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("the workspace")?;
    let sources =
        ["agent/src", "agent/build.rs", "agent/Cargo.toml", "ebpf/src", "ebpf/bpf", "ebpf/build.rs", "ebpf/Cargo.toml"];
    if let Some(newer) = newer_source(sources.iter().map(|p| workspace.join(p)).collect(), built) {
        bail!(
            "{} is older than {}: run `cargo build -p swiftlet` first (or set SWIFTLET_BIN)",
            bin.display(),
            newer.display()
        );
    }
    Ok(bin)
}

/// A file among `paths` or under those that are directories modified after `than`.
fn newer_source(mut paths: Vec<PathBuf>, than: std::time::SystemTime) -> Option<PathBuf> {
    while let Some(path) = paths.pop() {
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if meta.is_dir() {
            paths.extend(std::fs::read_dir(&path).into_iter().flatten().flatten().map(|e| e.path()));
        } else if meta.modified().is_ok_and(|m| m > than) {
            return Some(path);
        }
    }
    None
}

/// A CRI runtime client to check the runtime's truth.
#[derive(Clone, Debug)]
pub struct Cri {
    client: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    /// The node container whose runtime this is, when the end-to-end agents run there:
    /// the runtime's process ids are the node's, translated for the host.
    node: Option<&'static node::Node>,
}

impl Cri {
    pub fn connect(endpoint: &str) -> Result<Self> {
        let path = PathBuf::from(endpoint.trim_start_matches("unix://"));
        let channel = Endpoint::from_static("http://cri.invalid").connect_with_connector_lazy(tower::service_fn(
            move |_: Uri| {
                let path = path.clone();
                async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
            },
        ));
        let node = node::in_node().filter(|(n, r)| n.cri_endpoint(*r) == endpoint).map(|(n, _)| n);
        Ok(Self { client: RuntimeServiceClient::new(channel.clone()), images: ImageServiceClient::new(channel), node })
    }

    fn selector(uid: &str) -> HashMap<String, String> {
        HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.to_string())])
    }

    /// Sandboxes of a pod.
    pub async fn sandboxes(&self, uid: &str) -> Result<Vec<cri::PodSandbox>> {
        let req = cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter { label_selector: Self::selector(uid), ..Default::default() }),
        };
        Ok(self.client.clone().list_pod_sandbox(req).await?.into_inner().items)
    }

    /// Containers of a pod.
    pub async fn containers(&self, uid: &str) -> Result<Vec<cri::Container>> {
        let req = cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter { label_selector: Self::selector(uid), ..Default::default() }),
        };
        Ok(self.client.clone().list_containers(req).await?.into_inner().containers)
    }

    /// Every sandbox in the runtime.
    pub async fn all_sandboxes(&self) -> Result<Vec<cri::PodSandbox>> {
        Ok(self.client.clone().list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }).await?.into_inner().items)
    }

    /// Stops and removes every sandbox (and so every container): a test that failed
    /// half-way must not leave pods for the next one, whose agent would adopt them.
    pub async fn remove_all(&self) -> Result<()> {
        for sb in self.all_sandboxes().await? {
            let mut c = self.client.clone();
            c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sb.id.clone() }).await?;
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sb.id }).await?;
        }
        Ok(())
    }

    /// CRI `Version`: the runtime answers.
    /// The runtime's `Status` (its conditions, features and runtime handlers).
    pub async fn status(&self) -> Result<cri::StatusResponse> {
        Ok(self.client.clone().status(cri::StatusRequest { verbose: false }).await?.into_inner())
    }

    /// Whether the runtime's default handler supports user namespaces (CRI `Status`).
    pub async fn supports_user_namespaces(&self) -> Result<bool> {
        let status = self.status().await?;
        Ok(status
            .runtime_handlers
            .iter()
            .find(|h| h.name.is_empty())
            .and_then(|h| h.features)
            .is_some_and(|f| f.user_namespaces))
    }

    pub async fn version(&self) -> Result<cri::VersionResponse> {
        Ok(self.client.clone().version(cri::VersionRequest { version: String::new() }).await?.into_inner())
    }

    /// The runtime's `(major, minor)` version (`v2.4.2` and `1.6.20~ds1` alike).
    pub async fn runtime_release(&self) -> Result<(u32, u32)> {
        Ok(release_of(&self.version().await?.runtime_version))
    }

    /// Pulls `image` (CRI `PullImage`, no credentials); returns its image reference.
    pub async fn pull_image(&self, image: &str) -> Result<String> {
        let req = cri::PullImageRequest {
            image: Some(cri::ImageSpec { image: image.into(), ..Default::default() }),
            ..Default::default()
        };
        Ok(self.images.clone().pull_image(req).await?.into_inner().image_ref)
    }

    /// Whether the runtime has `image` (CRI `ImageStatus`).
    pub async fn has_image(&self, image: &str) -> Result<bool> {
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec { image: image.into(), ..Default::default() }),
            verbose: false,
        };
        Ok(self.images.clone().image_status(req).await?.into_inner().image.is_some())
    }

    /// The id of `image` in the runtime, if it has it (CRI `ImageStatus`).
    pub async fn image_id(&self, image: &str) -> Result<Option<String>> {
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec { image: image.into(), ..Default::default() }),
            verbose: false,
        };
        Ok(self.images.clone().image_status(req).await?.into_inner().image.map(|i| i.id))
    }

    /// Removes `image` if the runtime has it (CRI `RemoveImage`).
    pub async fn remove_image(&self, image: &str) -> Result<()> {
        if self.has_image(image).await? {
            let req =
                cri::RemoveImageRequest { image: Some(cri::ImageSpec { image: image.into(), ..Default::default() }) };
            self.images.clone().remove_image(req).await?;
        }
        Ok(())
    }

    /// Runs a command in a container (CRI `ExecSync`): (exit code, stdout).
    pub async fn exec(&self, id: &str, cmd: &[&str]) -> Result<(i32, String)> {
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(ToString::to_string).collect(),
            timeout: 10,
        };
        let resp = self.client.clone().exec_sync(req).await?.into_inner();
        Ok((resp.exit_code, String::from_utf8_lossy(&resp.stdout).into_owned()))
    }

    /// Full status of a container (verbose: includes the runtime spec with cgroup paths).
    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatusResponse> {
        let req = cri::ContainerStatusRequest { container_id: id.into(), verbose: true };
        Ok(self.client.clone().container_status(req).await?.into_inner())
    }

    /// The main pid of a container, from its verbose status, as the host's pid (a runtime
    /// in the node container counts pids in the node's namespace).
    pub async fn container_pid(&self, id: &str) -> Result<i32> {
        let st = self.container_status(id).await?;
        let info: Value = serde_json::from_str(st.info.get("info").map_or("{}", String::as_str))?;
        let pid = info["pid"].as_i64().and_then(|p| i32::try_from(p).ok()).context("no pid in the container's info")?;
        match self.node {
            Some(node) => node.host_pid(pid),
            None => Ok(pid),
        }
    }

    /// Sandbox status (verbose).
    pub async fn sandbox_status(&self, id: &str) -> Result<cri::PodSandboxStatusResponse> {
        let req = cri::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true };
        Ok(self.client.clone().pod_sandbox_status(req).await?.into_inner())
    }
}

/// A free port on 127.0.0.1 for a server the test starts, below the kernel's ephemeral
/// range: a port from that range (what binding port 0 gives) can be taken, between this
/// check and the server's own bind, as the local port of any outgoing connection, which
/// failed an agent's start with "Address already in use" once.
///
/// # Errors
/// No port could be bound.
pub fn free_port() -> Result<u16> {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000, first_ephemeral.max(10_001));
    for _ in 0..256 {
        let port = rand::random_range(low..high);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Options of one agent process.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub sync_frequency: &'static str,
    pub extra_config: String,
    /// `--evented-pleg`: the eBPF PLEG (true) or the relisting PLEG alone (false).
    pub evented_pleg: bool,
    pub extra_flags: Vec<String>,
    /// `--kubeconfig`: API-server mode against this kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// The runtime, when not the test bed's (e.g. a [`scratch::ScratchContainerd`]).
    pub cri_endpoint: Option<String>,
    /// `--root-dir` (the node filesystem), when not a directory of the agent's own.
    pub root_dir: Option<PathBuf>,
    /// More environment variables of the process (e.g. [`logind::Logind::agent_env`]).
    pub env: Vec<(String, String)>,
    /// `--hostname-override` (default `e2e-node`).
    pub node_name: Option<String>,
    /// The config's `authentication` and `authorization` blocks (default: anonymous
    /// requests allowed, `AlwaysAllow`).
    pub authentication: Option<String>,
    /// A PEM certificate and key (one file each) the test's own HTTPS requests to the agent
    /// present, for an agent that refuses anonymous requests.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            sync_frequency: "10s",
            extra_config: String::new(),
            evented_pleg: true,
            extra_flags: Vec::new(),
            kubeconfig: None,
            cri_endpoint: None,
            root_dir: None,
            env: Vec::new(),
            node_name: None,
            authentication: None,
            client_identity: None,
        }
    }
}

/// A running `swiftlet` with its own root dir, manifests dir, ports and cgroup root.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub manifests: PathBuf,
    pub logs_dir: PathBuf,
    pub https_port: u16,
    pub healthz_port: u16,
    pub cgroup_root: String,
    pub node_name: String,
    config_path: PathBuf,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    endpoint: String,
    flags: Vec<String>,
    env: Vec<(String, String)>,
    http: reqwest::Client,
    log_path: PathBuf,
    /// The agent's unit, for an agent in the node container.
    node: Option<NodeAgent>,
}

/// Where the agents in the node container keep their directories (a node path).
const NODE_AGENT_DIRS: &str = "/var/lib/swiftlet-e2e";

/// The node's copy of the `swiftlet` binary the agents there run.
const NODE_AGENT_BIN: &str = "/usr/local/bin/swiftlet-e2e";

/// A temporary directory the agent can use: on the host, or in the node container's root
/// filesystem for an agent there (see [`node::node_target`]).
pub fn agent_tempdir(prefix: &str) -> Result<tempfile::TempDir> {
    match node::node_target()? {
        Some((n, _)) => {
            let parent = n.file(NODE_AGENT_DIRS);
            std::fs::create_dir_all(&parent)?;
            Ok(tempfile::Builder::new().prefix(prefix).tempdir_in(parent)?)
        }
        None => Ok(tempfile::Builder::new().prefix(prefix).tempdir()?),
    }
}

/// The agent's name for a host path: the path itself, or for an agent in the node
/// container the node's path of a file in its root filesystem.
pub fn agent_path(host: &Path) -> Result<PathBuf> {
    match node::node_target()? {
        Some((n, _)) => n.inside(host),
        None => Ok(host.to_path_buf()),
    }
}

/// The last part of a temporary directory's name (its random suffix).
fn dir_suffix(dir: &Path) -> String {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.rsplit('-').next().unwrap_or_default().to_ascii_lowercase()
}

/// An agent in the node container: a transient systemd unit of the node (as a
/// `swiftlet.service` would run it there), its output appended to the agent's log file.
#[derive(Debug)]
struct NodeAgent {
    node: &'static node::Node,
    unit: String,
    /// The runtime's endpoint in the node.
    endpoint: String,
}

/// A unit's `ActiveState` while it starts or runs.
fn unit_running(state: &str) -> bool {
    matches!(state, "active" | "activating" | "reloading")
}

/// A unit's `ActiveState` once it has ended (`inactive`, `failed`; a `--collect`ed unit
/// that is gone reads `inactive` too).
fn unit_ended(state: &str) -> bool {
    !unit_running(state) && state != "deactivating"
}

impl NodeAgent {
    /// Installs the binary in the node (once per build) and starts the unit.
    fn start(&self, agent: &Agent) -> Result<()> {
        let bin = swiftlet_bin()?;
        let copy = self.node.file(NODE_AGENT_BIN);
        let same = |a: &Path, b: &Path| -> Option<bool> {
            let (a, b) = (std::fs::metadata(a).ok()?, std::fs::metadata(b).ok()?);
            Some(a.len() == b.len() && a.modified().ok()? <= b.modified().ok()?)
        };
        if same(&bin, &copy) != Some(true) {
            let tmp = copy.with_extension("tmp");
            std::fs::copy(&bin, &tmp).with_context(|| format!("copying swiftlet into the node ({})", tmp.display()))?;
            std::fs::rename(&tmp, &copy)?;
        }
        let log = self.node.inside(&agent.log_path)?.display().to_string();
        let _ = self.node.run(&["systemctl", "reset-failed", &self.unit]);
        let mut cmd = vec![
            "systemd-run".to_owned(),
            format!("--unit={}", self.unit),
            "--collect".to_owned(),
            "--quiet".to_owned(),
            format!("--property=StandardOutput=append:{log}"),
            format!("--property=StandardError=append:{log}"),
            "--property=TimeoutStopSec=20".to_owned(),
        ];
        cmd.extend(agent.env.iter().map(|(k, v)| format!("--setenv={k}={v}")));
        cmd.push("--".to_owned());
        cmd.extend(agent.args(Path::new(NODE_AGENT_BIN), &self.endpoint, |p| self.node.inside(p))?);
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        self.node.ok(&cmd)?;
        Ok(())
    }

    /// Whether the unit is still starting or running.
    fn running(&self) -> Result<bool> {
        Ok(unit_running(&self.node.unit_property(&self.unit, "ActiveState")?))
    }

    /// Whether the unit has ended: not running, and not still stopping either (a unit
    /// `deactivating` still holds its name, and a new one under it would be refused).
    fn ended(&self) -> Result<bool> {
        Ok(unit_ended(&self.node.unit_property(&self.unit, "ActiveState")?))
    }

    /// The host's pid of the unit's main process.
    fn host_pid(&self) -> Result<i32> {
        let pid: i32 = self.node.unit_property(&self.unit, "MainPID")?.parse()?;
        ensure!(pid > 0, "{} has no main process", self.unit);
        self.node.host_pid(pid)
    }

    /// Waits (20 s at most) for the unit to end.
    fn wait_ended(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.ended()? {
            ensure!(Instant::now() < deadline, "{} did not end in 20 s", self.unit);
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// SIGKILL to the agent (a crash); the unit ends.
    fn kill9(&self) -> Result<()> {
        if self.running()? {
            let _ = self.node.run(&["systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", &self.unit]);
        }
        self.wait_ended()
    }

    /// `systemctl stop`: SIGTERM, and SIGKILL after 20 s.
    fn stop(&self) -> Result<()> {
        if self.running()? {
            self.node.ok(&["systemctl", "stop", &self.unit])?;
        }
        self.wait_ended()
    }
}

impl Agent {
    /// An in-test OTLP trace receiver, a CRI client, and an agent of the default options
    /// that exports every trace (sampling one in one) to the receiver.
    pub async fn traced() -> Result<(swiftlet::telemetry::test_collector::TestCollector, Cri, Self)> {
        let (collector, addr) = swiftlet::telemetry::test_collector::TestCollector::start().await;
        if let Some((node, _)) = node::node_target()? {
            node.forward_loopback(addr)?;
        }
        let cri = Cri::connect(&cri_endpoint()?)?;
        let agent = Self::start(AgentOptions {
            extra_config: format!("tracing:\n  endpoint: {addr}\n  samplingRatePerMillion: 1000000\n"),
            ..AgentOptions::default()
        })
        .await?;
        Ok((collector, cri, agent))
    }

    /// Writes the config and starts the agent; returns once `/healthz` answers. With
    /// `SWIFTLET_E2E_NODE` set ([`node::node_target`]) the agent runs in the node
    /// container with `cgroupDriver: systemd` (see [`NodeAgent`]).
    pub async fn start(opts: AgentOptions) -> Result<Self> {
        let node = node::node_target()?;
        if node.is_some() {
            ensure!(
                opts.cri_endpoint.is_none(),
                "an agent in the node container runs on one of the node's runtimes, not a runtime of the test's own"
            );
        }
        let endpoint = match opts.cri_endpoint.clone() {
            Some(e) => e,
            None => cri_endpoint()?,
        };
        Cri::connect(&endpoint)?.remove_all().await?;
        let dir = agent_tempdir("swiftlet-e2e-")?;
        // The agent's own paths: the node's, for an agent in the node.
        let seen = agent_path;
        let manifests = dir.path().join("manifests");
        let logs_dir = dir.path().join("pod-logs");
        std::fs::create_dir_all(&manifests)?;
        let https_port = free_port()?;
        let healthz_port = free_port()?;
        let cgroup_root = if node.is_some() {
            // systemd's root slice, as kubeadm's nodes run: the QoS slices are
            // `/kubepods.slice/...` and outlive each test's agent, as upstream leaves them.
            "/".to_owned()
        } else {
            let root = format!("/swiftlet-e2e-{}", std::process::id());
            // The kubelet requires cgroupRoot to exist; create it in every hierarchy.
            for h in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
                if h.file_type()?.is_dir() {
                    std::fs::create_dir_all(h.path().join(root.trim_start_matches('/')))?;
                }
            }
            root
        };
        let (bind, driver) = if node.is_some() { ("0.0.0.0", "systemd") } else { ("127.0.0.1", "cgroupfs") };
        let config_path = dir.path().join("config.yaml");
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {manifests}
podLogsDir: {logs}
syncFrequency: {sync}
fileCheckFrequency: 20s
address: {bind}
port: {https_port}
healthzPort: {healthz_port}
healthzBindAddress: {bind}
cgroupRoot: {cgroup_root}
cgroupDriver: {driver}
{auth}{eviction}{extra}
",
            auth = opts.authentication.as_deref().unwrap_or(
                "authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
"
            ),
            manifests = seen(&manifests)?.display(),
            logs = seen(&logs_dir)?.display(),
            sync = opts.sync_frequency,
            extra = opts.extra_config,
            // The host's disks are the test's nodefs and imagefs: a full developer disk must
            // not put the node under pressure (and refuse every pod). Tests of eviction set
            // their own thresholds.
            eviction = if opts.extra_config.contains("evictionHard") {
                ""
            } else {
                "evictionHard:\n  memory.available: 100Mi\n"
            },
        );
        std::fs::write(&config_path, config)?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut http = reqwest::Client::builder().danger_accept_invalid_certs(true).timeout(Duration::from_secs(10));
        if let Some((cert, key)) = &opts.client_identity {
            let mut pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
            pem.extend(std::fs::read(key).with_context(|| format!("reading {}", key.display()))?);
            http = http.identity(reqwest::Identity::from_pem(&pem)?);
        }
        let http = http.build()?;
        let log_path = dir.path().join("swiftlet.log");
        let mut flags = opts.extra_flags.clone();
        flags.push(format!("--evented-pleg={}", opts.evented_pleg));
        flags.push(format!("--event-api-socket={}", seen(&dir.path().join("events.sock"))?.display()));
        if let Some(k) = &opts.kubeconfig {
            flags.push(format!("--kubeconfig={}", seen(k)?.display()));
        }
        let root_dir = opts.root_dir.clone().unwrap_or_else(|| dir.path().join("root"));
        let node = match node {
            Some((n, runtime)) => {
                seen(&root_dir)?;
                Some(NodeAgent {
                    node: n,
                    unit: format!("swiftlet-e2e-{}-{}.service", std::process::id(), dir_suffix(dir.path())),
                    endpoint: format!("unix://{}", runtime.socket()),
                })
            }
            None => None,
        };
        let mut agent = Self {
            flags,
            env: opts.env.clone(),
            child: None,
            manifests,
            logs_dir,
            https_port,
            healthz_port,
            cgroup_root,
            node_name: opts.node_name.clone().unwrap_or_else(|| "e2e-node".into()),
            config_path,
            root_dir,
            endpoint,
            http,
            log_path,
            dir,
            node,
        };
        agent.spawn().await?;
        Ok(agent)
    }

    /// Adds a command-line flag for the next [`Self::spawn`].
    pub fn add_flag(&mut self, flag: &str) {
        self.flags.push(flag.to_owned());
    }

    /// Changes the config file (the next [`Self::spawn`] reads it).
    pub fn rewrite_config(&self, change: impl FnOnce(&str) -> String) -> Result<()> {
        let config = std::fs::read_to_string(&self.config_path)?;
        std::fs::write(&self.config_path, change(&config))?;
        Ok(())
    }

    /// Starts (or restarts) the process with the same config and directories.
    pub async fn spawn(&mut self) -> Result<()> {
        if let Some(node) = &self.node {
            node.start(self)?;
        } else {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path)?;
            let bin = swiftlet_bin()?;
            let child = Command::new(&bin)
                .args(self.args(&bin, &self.endpoint, |p| Ok(p.to_path_buf()))?.iter().skip(1))
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
            self.child = Some(child);
        }
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!("swiftlet exited at start with {status}; log:\n{}", self.log());
            }
            if let Some(node) = &self.node
                && !node.running()?
            {
                bail!("swiftlet's unit {} ended at start; log:\n{}", node.unit, self.log());
            }
            if self.healthz().await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("swiftlet did not become healthy in 60s; log:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The command line: the binary `bin`, then the flags, with the agent's paths as
    /// `seen` maps them (the node's paths for an agent in the node).
    fn args(&self, bin: &Path, endpoint: &str, seen: impl Fn(&Path) -> Result<PathBuf>) -> Result<Vec<String>> {
        let mut args = vec![bin.display().to_string()];
        for (flag, value) in [
            ("--config", seen(&self.config_path)?.display().to_string()),
            ("--container-runtime-endpoint", endpoint.to_owned()),
            ("--root-dir", seen(&self.root_dir)?.display().to_string()),
            ("--cert-dir", seen(&self.dir.path().join("pki"))?.display().to_string()),
            ("--hostname-override", self.node_name.clone()),
            ("--v", "4".to_owned()),
        ] {
            args.push(flag.to_owned());
            args.push(value);
        }
        args.extend(self.flags.iter().cloned());
        Ok(args)
    }

    /// The host the agent's ports answer on: the node's address for an agent in the node.
    #[must_use]
    pub fn host(&self) -> &str {
        self.node.as_ref().map_or("127.0.0.1", |n| n.node.address.as_str())
    }

    /// Where the agent's HTTPS API listens: ([`Self::host`], its port).
    #[must_use]
    pub fn https_addr(&self) -> (&str, u16) {
        (self.host(), self.https_port)
    }

    /// The agent's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The event API socket of this agent.
    #[must_use]
    pub fn event_socket(&self) -> PathBuf {
        self.dir.path().join("events.sock")
    }

    /// `/metrics`, which must answer 200.
    pub async fn metrics_text(&self) -> Result<String> {
        let (code, body) = self.get("/metrics").await?;
        ensure!(code == 200, "/metrics answered {code}: {body}");
        Ok(body)
    }

    /// The value of a metric sample line `name{labels} value` in `/metrics` (0 if absent).
    pub async fn metric(&self, series: &str) -> Result<f64> {
        let body = self.metrics_text().await?;
        Ok(body
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0))
    }

    /// The sum of the samples of `family` on `/metrics` whose labels include `label`
    /// (`name="value"`), whatever their other labels; 0 when there is none.
    pub async fn metric_sum(&self, family: &str, label: &str) -> Result<f64> {
        let body = self.metrics_text().await?;
        Ok(body
            .lines()
            .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
            .filter_map(|rest| rest.split_once("} "))
            .filter(|(labels, _)| labels.split(',').any(|l| l == label))
            .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
            .sum())
    }

    /// The process id (the host's, also for an agent in the node).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        match &self.node {
            Some(node) => node.host_pid().ok().and_then(|p| u32::try_from(p).ok()),
            None => self.child.as_ref().map(Child::id),
        }
    }

    /// Whether the agent runs with the systemd cgroup driver (in the node container).
    #[must_use]
    pub fn systemd_driver(&self) -> bool {
        self.node.is_some()
    }

    /// The pods cgroup (`<root>/kubepods`; `/kubepods.slice` under systemd), a path of the
    /// agent's cgroup namespace.
    #[must_use]
    pub fn kubepods_cgroup(&self) -> String {
        if self.systemd_driver() {
            "/kubepods.slice".to_owned()
        } else {
            format!("{}/kubepods", self.cgroup_root.trim_end_matches('/'))
        }
    }

    /// A pod's cgroup for its class (`guaranteed`, `burstable` or `besteffort`), as the
    /// agent's driver names it.
    #[must_use]
    pub fn pod_cgroup(&self, qos: &str, uid: &str) -> String {
        let kubepods = self.kubepods_cgroup();
        match (self.systemd_driver(), qos) {
            (false, "guaranteed") => format!("{kubepods}/pod{uid}"),
            (false, _) => format!("{kubepods}/{qos}/pod{uid}"),
            (true, "guaranteed") => format!("{kubepods}/kubepods-pod{}.slice", uid.replace('-', "_")),
            (true, _) => format!("{kubepods}/kubepods-{qos}.slice/kubepods-{qos}-pod{}.slice", uid.replace('-', "_")),
        }
    }

    /// A container's cgroup in its pod's cgroup (containerd's scope under systemd).
    #[must_use]
    pub fn container_cgroup(&self, pod_cgroup: &str, container_id: &str) -> String {
        if self.systemd_driver() {
            format!("{pod_cgroup}/cri-containerd-{container_id}.scope")
        } else {
            format!("{pod_cgroup}/{container_id}")
        }
    }

    /// The host directory of the agent's cgroup `relative` in the hierarchy mounted at
    /// `/sys/fs/cgroup/<hierarchy>`.
    pub fn cgroup_dir(&self, hierarchy: &str, relative: &str) -> Result<PathBuf> {
        match &self.node {
            Some(n) => n.node.cgroup_dir(hierarchy, relative).with_context(|| format!("the node has no {hierarchy}")),
            None => Ok(Path::new("/sys/fs/cgroup").join(hierarchy).join(relative.trim_start_matches('/'))),
        }
    }

    /// `GET /healthz` on the healthz port: (status code, body).
    pub async fn healthz(&self) -> Result<(u16, String)> {
        let r = self.http.get(format!("http://{}:{}/healthz", self.host(), self.healthz_port)).send().await?;
        Ok((r.status().as_u16(), r.text().await?))
    }

    /// `GET` a path on the HTTPS port: (status code, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        let r = self.http.get(format!("https://{}:{}{path}", self.host(), self.https_port)).send().await?;
        Ok((r.status().as_u16(), r.text().await?))
    }

    /// GET `path` over HTTPS with an `Accept` header.
    pub async fn get_accepting(&self, path: &str, accept: &str) -> Result<(u16, String)> {
        let r = self
            .http
            .get(format!("https://{}:{}{path}", self.host(), self.https_port))
            .header("Accept", accept)
            .send()
            .await?;
        Ok((r.status().as_u16(), r.text().await?))
    }

    /// GET with `headers`; the status, the `Content-Encoding` and the body's bytes as sent.
    pub async fn get_raw(&self, path: &str, headers: &[(&str, &str)]) -> Result<(u16, Option<String>, Vec<u8>)> {
        let mut req = self.http.get(format!("https://{}:{}{path}", self.host(), self.https_port));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.send().await?;
        let encoding = r.headers().get("content-encoding").and_then(|v| v.to_str().ok()).map(str::to_owned);
        Ok((r.status().as_u16(), encoding, r.bytes().await?.to_vec()))
    }

    /// Items of `/pods`.
    pub async fn pods(&self) -> Result<Vec<Value>> {
        let (code, body) = self.get("/pods").await?;
        if code != 200 {
            bail!("/pods answered {code}: {body}");
        }
        let v: Value = serde_json::from_str(&body)?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// The pod named `<name>-<node>` in `/pods`, if present.
    pub async fn pod(&self, name: &str) -> Result<Option<Value>> {
        let full = format!("{name}-{}", self.node_name);
        Ok(self.pods().await?.into_iter().find(|p| p["metadata"]["name"] == full.as_str()))
    }

    /// Polls `/pods` until `pred` holds for the pod, or fails after `timeout` with the
    /// last status seen and the agent log.
    pub async fn wait_pod(&self, name: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(p) = self.pod(name).await? {
                if pred(&p) {
                    return Ok(p);
                }
                last = Some(p);
            }
            if Instant::now() > deadline {
                bail!(
                    "pod {name}: condition not met within {timeout:?}; last: {}\n--- agent log tail ---\n{}",
                    last.map_or_else(
                        || "absent".into(),
                        |p| serde_json::to_string_pretty(&p["status"]).unwrap_or_default()
                    ),
                    tail(&self.log(), 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Writes a manifest into the static pod directory (atomically, as editors and
    /// config management do).
    pub fn write_manifest(&self, file: &str, text: &str) -> Result<()> {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, self.manifests.join(file))?;
        Ok(())
    }

    pub fn remove_manifest(&self, file: &str) -> Result<()> {
        std::fs::remove_file(self.manifests.join(file))?;
        Ok(())
    }

    /// Sends SIGKILL (a crash) and reaps the process.
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(node) = &self.node {
            return node.kill9();
        }
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// SIGTERM and wait (the agent leaves pods running, as the kubelet does).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(node) = &self.node {
            return node.stop();
        }
        if let Some(mut c) = self.child.take() {
            let pid = i32::try_from(c.id())?;
            kill(pid, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    c.kill()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            c.wait()?;
        }
        Ok(())
    }

    /// Removes every manifest, waits until the runtime has nothing left of this agent's
    /// pods, stops the agent and removes its cgroup root. Every test ends with this.
    pub async fn shutdown(mut self, cri: &Cri) -> Result<()> {
        for e in std::fs::read_dir(&self.manifests)? {
            std::fs::remove_file(e?.path())?;
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let pods = self.pods().await.unwrap_or_default();
            let left = cri.all_sandboxes().await?;
            if pods.is_empty() && left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!("pods left after removing all manifests: {} sandboxes\n{}", left.len(), tail(&self.log(), 80));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.stop()?;
        if self.node.is_none() {
            remove_cgroup_tree(&self.cgroup_root);
        }
        Ok(())
    }
}

impl Drop for Agent {
    /// Kills the agent if it still runs, and unmounts what it left mounted under its
    /// directories (the volumes of pods a failed test left behind), so that the
    /// temporary directories go and `testbed check-clean` finds no mount of a test.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(node) = &self.node {
            let _ = node.kill9();
            for dir in [self.dir.path(), &self.root_dir] {
                let Ok(inside) = node.node.inside(dir) else { continue };
                for mount in node.node.mounts_under(&inside) {
                    let _ = node.node.run(&["umount", "-l", &mount.display().to_string()]);
                }
            }
            return;
        }
        for mount in mounts_under(&[self.dir.path(), &self.root_dir]) {
            let Ok(path) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else { continue };
            // SAFETY: umount2 with a NUL-terminated path; MNT_DETACH cannot fail halfway.
            unsafe {
                libc::umount2(path.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// The mount points of this process's mount namespace below any of `roots`, deepest
/// first.
fn mounts_under(roots: &[&Path]) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    mount_points_under(&info, roots)
}

/// The mount points of a `mountinfo` below any of `roots`, deepest first.
fn mount_points_under(info: &str, roots: &[&Path]) -> Vec<PathBuf> {
    // The fifth field is the mount point, with space, tab, newline and backslash escaped
    // in octal.
    let unescape =
        |s: &str| s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\");
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape(m)))
        .filter(|m| roots.iter().any(|r| m.starts_with(r)))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found.dedup();
    found
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is a child we spawned.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Removes a cgroup directory tree (depth first) in every hierarchy; ignores absence.
pub fn remove_cgroup_tree(root: &str) {
    let rel = root.trim_start_matches('/');
    if let Some((node, _)) = node::in_node() {
        // Never the node's own root (an agent there has cgroupRoot `/`).
        if !rel.is_empty() {
            node.cgroup_dirs(rel).iter().for_each(|d| remove_tree(d));
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    for h in entries.flatten() {
        let base = h.path().join(rel);
        remove_tree(&base);
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Paths of a cgroup under every v1 hierarchy and the unified mount that exist now.
#[must_use]
pub fn existing_cgroup_dirs(relative: &str) -> Vec<PathBuf> {
    let rel = relative.trim_start_matches('/');
    if let Some((node, _)) = node::in_node() {
        return node.cgroup_dirs(rel).into_iter().filter(|p| p.is_dir()).collect();
    }
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else { return Vec::new() };
    entries.flatten().map(|h| h.path().join(rel)).filter(|p| p.is_dir()).collect()
}

/// The last `n` lines of `s`.
#[must_use]
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Shared handle type for tests.
pub type SharedCri = Arc<Cri>;

/// `(major, minor)` of a runtime version string (`v2.4.2`, `1.6.20~ds1`); 0 where a part
/// is missing or not a number.
fn release_of(version: &str) -> (u32, u32) {
    let mut parts = version.trim_start_matches('v').split(['.', '~', '-', '+']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_newer_than_the_binary_is_found_in_files_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src/deep")).unwrap();
        std::fs::write(dir.path().join("src/deep/a.rs"), "").unwrap();
        std::fs::write(dir.path().join("build.rs"), "").unwrap();
        let paths = || vec![dir.path().join("src"), dir.path().join("build.rs"), dir.path().join("missing")];
        let later = std::time::SystemTime::now() + std::time::Duration::from_mins(1);
        assert_eq!(newer_source(paths(), later), None);
        let earlier = std::time::SystemTime::now() - std::time::Duration::from_mins(1);
        let found = newer_source(paths(), earlier).unwrap();
        assert!(found.ends_with("build.rs") || found.ends_with("src/deep/a.rs"), "{}", found.display());
        assert_eq!(newer_source(vec![dir.path().join("src")], earlier), Some(dir.path().join("src/deep/a.rs")));
    }

    #[test]
    fn runtime_releases_parse_from_containerds_versions() {
        assert_eq!(release_of("v2.4.2"), (2, 4));
        assert_eq!(release_of("1.6.20~ds1"), (1, 6));
        assert_eq!(release_of("weird"), (0, 0));
    }

    /// A unit still stopping has not ended: waiting for the end waits for it too.
    #[test]
    fn a_deactivating_unit_is_neither_running_nor_ended() {
        for (state, running, ended) in [
            ("active", true, false),
            ("activating", true, false),
            ("reloading", true, false),
            ("deactivating", false, false),
            ("inactive", false, true),
            ("failed", false, true),
        ] {
            assert_eq!((unit_running(state), unit_ended(state)), (running, ended), "{state}");
        }
    }

    fn mount_tmpfs(at: &Path) {
        std::fs::create_dir_all(at).unwrap();
        let target = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mount(2) with NUL-terminated strings.
        let rc = unsafe { libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) };
        assert_eq!(rc, 0, "mount {}: {}", at.display(), std::io::Error::last_os_error());
    }

    /// What a failed test's agent left mounted is found deepest first, and nothing
    /// outside the agent's directories.
    #[test]
    fn mounts_under_lists_nested_mounts_deepest_first() {
        let dir = tempfile::tempdir().unwrap();
        let outer = dir.path().join("pods/volumes/a");
        let inner = outer.join("b");
        mount_tmpfs(&outer);
        mount_tmpfs(&inner);
        let found = mounts_under(&[dir.path()]);
        let other = mounts_under(&[Path::new("/nonexistent-root")]);
        for m in [&inner, &outer] {
            let path = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: umount2 with a NUL-terminated path.
            unsafe {
                libc::umount2(path.as_ptr(), libc::MNT_DETACH);
            }
        }
        assert_eq!(found, vec![inner, outer]);
        assert!(other.is_empty());
    }
}
