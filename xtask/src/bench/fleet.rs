//! `cargo xtask bench cluster`: several nodes on this one machine joined to the test bed's
//! real control plane, a Deployment the real scheduler spreads across them, and what each
//! node costs the API server — for swiftlet, then for as many upstream kubelets — with a
//! model of a fleet of 5,000 nodes × 110 pods built from the per-node figures.
//!
//! - **Nodes**: `--nodes` (3; 1 to 5) node containers of [`nodectr`] beside the test bed's
//!   own ([`nodectr::Spec::bench`]): systemd as PID 1, Debian's containerd 1.6 with the
//!   systemd cgroup driver, a network namespace with its own address, veth and pod subnet,
//!   a root filesystem unpacked from the cached tarball. They are booted once and host
//!   swiftlet's run and then the upstream kubelet's; each agent is a transient systemd unit
//!   of its node (`systemd-run`), joins by TLS bootstrap as `swiftlet-bench-fleet-<agent>-<i>`
//!   with the bench nodes' taint. A node container rather than a network namespace on the
//!   host: the node's systemd and containerd, its cgroups and its mounts all end with the
//!   container, so that the clean-up is one `poweroff`, and the agents run as on a node.
//! - **The API server from inside a node**: kube-apiserver listens on the host's loopback
//!   only and its certificate names 127.0.0.1, so each node gets a forwarder
//!   ([`Forwarder`]): a listener on 127.0.0.1:6443 in the node's network namespace whose
//!   connections xtask copies to the host's. It counts the bytes both ways: every byte the
//!   node's agent exchanges with the API server (TLS included), **exact** and per node.
//! - **Workload**: a Deployment of `--replicas` (12) busybox pods that tolerate the bench
//!   taint, restricted to the bench's nodes by node affinity and spread one per node at a
//!   time (`topologySpreadConstraints`, `maxSkew: 1`). Start-up of each pod is the time
//!   from its first watch event (`ADDED`, when the `ReplicaSet` controller created it) to the
//!   first event that shows it `Running`, on the bench's own watch: scheduling, the agent,
//!   the runtime and the status write, as a user sees it.
//! - **Windows**: the control plane alone (no agent: the baseline), then per agent an idle
//!   window (`--idle-secs`, every pod Running, nothing changing) and a churn window
//!   (`--churn-cycles` of scale to 2 × replicas, every new pod Running, scale back, every
//!   removed pod gone from the API).
//! - **What is exact, what is estimated** (see [`apiload`]): the agents' request total is
//!   exact (the node flow schemas of API Priority and Fairness), divided by the node count;
//!   open watches by resource are exact (`apiserver_longrunning_requests{verb="WATCH"}`
//!   less the baseline's, which already holds the bench's own pod watch); bytes are exact
//!   (the forwarders). Requests by verb and resource are estimated: the delta of
//!   `apiserver_request_total` less the baseline rate, the bench's own requests (the
//!   scale requests, its `/metrics` reads) and the controllers' requests the workload
//!   causes and the bench can count (a `POST pods` and a `POST pods/binding` per pod
//!   created, a `DELETE pods` per pod the `ReplicaSet` controller removes). The controller
//!   manager's and the scheduler's events (`SuccessfulCreate`, `Scheduled`, ...) cannot be
//!   told from the agents' and stay in `POST events`/`PATCH events` during churn: an upper
//!   bound there.
//!
//! Everything is undone in any state: the Deployment and namespace deleted, each unit
//! stopped, every sandbox left removed through the node's CRI, the nodes deleted from the
//! API, the host's kernel settings the upstream kubelet rewrites restored, the node
//! containers powered off and removed (cgroups, veths, root filesystems).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use crate::{
    Ctx,
    bench::{
        BedArgs,
        agent::{self, NAMESPACE},
        apiload::{self, Counters, Reading, Window},
        apiserver::{self, ApiClient, ApiServer, BENCH_TAINT, NODE_PREFIX},
        latency::Summary,
        procfs, report,
        watch::{EventKind, PodEvent, PodWatch, WatchTarget},
    },
    cri::CriClient,
    images, nodectr,
    testbed::Layout,
};

#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub bed: BedArgs,
    /// Node containers, one agent each (1 to 5).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The Deployment's replicas at idle (the churn scales to twice as many and back).
    #[arg(long, default_value_t = 12)]
    pub replicas: usize,
    /// Scale up and down cycles in the churn window.
    #[arg(long, default_value_t = 2)]
    pub churn_cycles: usize,
    /// Length of the idle window.
    #[arg(long, default_value_t = 60)]
    pub idle_secs: u64,
    /// The agent beside swiftlet: `upstream` (the upstream kubelet of `target/upstream/`),
    /// a path, or `none` for swiftlet alone.
    #[arg(long, default_value = "upstream")]
    pub other_agent: String,
    /// The fleet the model scales to: nodes.
    #[arg(long, default_value_t = 5000)]
    pub fleet_nodes: u64,
    /// The fleet the model scales to: pods per node.
    #[arg(long, default_value_t = 110)]
    pub fleet_pods_per_node: u64,
    /// The fleet the model scales to: pods started (and as many stopped) a second across
    /// the fleet (its churn; 0 for an idle fleet).
    #[arg(long, default_value_t = 50.0)]
    pub fleet_churn: f64,
}

/// The most nodes one run boots (a 2-core machine).
const MAX_NODES: usize = 5;
/// The control plane's own window.
const BASELINE: Duration = Duration::from_secs(40);
/// The Deployment's name.
const DEPLOYMENT: &str = "fleet";
/// Where an agent's files live in its node.
const NODE_DIR: &str = "/var/lib/swiftlet-bench";
/// The node's containerd.
const NODE_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Host kernel settings the upstream kubelet rewrites (its node shares the kernel).
const KERNEL_SETTINGS: [&str; 3] = ["vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"];

/// One agent kind under measurement.
#[derive(Debug, Clone)]
struct AgentKind {
    /// `swiftlet` or `kubelet`.
    label: String,
    binary: PathBuf,
    swiftlet: bool,
}

/// What one agent's run measured.
#[derive(Debug, Clone, Default)]
pub struct AgentRun {
    pub label: String,
    pub nodes: usize,
    /// Pods per node after the first roll-out, by node.
    pub spread: BTreeMap<String, usize>,
    /// Start-up (ns) of every pod: the first roll-out and each scale-up.
    pub startup: Vec<u64>,
    pub idle: Option<Phase>,
    pub churn: Option<Phase>,
}

/// One window of one agent's run, for all its nodes.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub window: Window,
    /// The agents' watches open at the window's end by resource, less the baseline's.
    pub watches: BTreeMap<String, f64>,
    /// Bytes the nodes sent to and received from the API server in the window (all nodes).
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Pods started and stopped in the window.
    pub started: usize,
    pub stopped: usize,
}

impl Phase {
    /// Requests a second per node (exact).
    pub fn per_node_rate(&self, nodes: usize) -> f64 {
        self.window.agent_rate() / nodes.max(1) as f64
    }

    /// Bytes a second per node, both ways.
    pub fn per_node_bytes(&self, nodes: usize) -> f64 {
        if self.window.secs > 0.0 {
            (self.bytes_up + self.bytes_down) as f64 / self.window.secs / nodes.max(1) as f64
        } else {
            0.0
        }
    }

    /// Open watches per node by resource.
    pub fn per_node_watches(&self, nodes: usize) -> BTreeMap<String, f64> {
        self.watches.iter().map(|(k, v)| (k.clone(), v / nodes.max(1) as f64)).collect()
    }

    /// Requests a second per node by request key (estimated, see the module docs).
    pub fn per_node_requests(&self, baseline: &Window, nodes: usize) -> BTreeMap<String, f64> {
        self.window
            .agent_by_request(Some(baseline))
            .into_iter()
            .filter(|(k, _)| !controllers_only(k))
            .map(|(k, v)| (k, v / nodes.max(1) as f64))
            .collect()
    }
}

/// `apiserver_longrunning_requests{verb="WATCH"}` summed by resource.
pub fn open_watches(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in apiload::samples(metrics, "apiserver_longrunning_requests") {
        if s.label("verb") == Some("WATCH") {
            let resource = s.label("resource").unwrap_or_default();
            let key = if resource.is_empty() { "(none)".to_owned() } else { resource.to_owned() };
            *out.entry(key).or_insert(0.0) += s.value;
        }
    }
    out
}

/// `after − before` by key, dropping what did not grow.
pub fn gauge_delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// One reading of kube-apiserver's `/metrics`: the counters and the open watches.
async fn read(client: &mut ApiClient) -> Result<(Reading, BTreeMap<String, f64>)> {
    let (code, text) = client.get_text("/metrics").await?;
    ensure!(code == 200, "GET /metrics of kube-apiserver: {code}: {text:.300}");
    Ok((Reading { counters: Counters::parse(&text), at: Instant::now() }, open_watches(&text)))
}

// ---------------------------------------------------------------------------------------
// The forwarder.

/// A listener on `addr` in a node's network namespace whose connections are copied to
/// `addr` on the host, counting the bytes each way. Stops accepting when dropped; the
/// copies end with their connections (the agent's, stopped before).
#[derive(Debug)]
pub struct Forwarder {
    stop: Arc<AtomicBool>,
    pub up: Arc<AtomicU64>,
    pub down: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    pub fn start(init_pid: i32, addr: SocketAddr) -> Result<Self> {
        let netns = fs::File::open(format!("/proc/{init_pid}/ns/net")).context("opening the node's netns")?;
        // A socket stays in the namespace it was made in: a short-lived thread enters the
        // node's and binds; the accepting thread stays in the host's, where the copies go.
        let listener = std::thread::spawn(move || -> Result<TcpListener> {
            // SAFETY: setns(2) on this short-lived thread only, with a namespace fd it owns.
            let rc = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) };
            ensure!(rc == 0, "entering the node's network namespace: {}", std::io::Error::last_os_error());
            Ok(TcpListener::bind(addr)?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
        .with_context(|| format!("listening on {addr} in the node"))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let thread = {
            let (stop, up, down) = (stop.clone(), up.clone(), down.clone());
            std::thread::Builder::new().name("bench-forward".into()).spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let _ = client.set_nonblocking(false);
                            let Ok(server) = TcpStream::connect(addr) else { continue };
                            let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                            copy(client, server, up.clone());
                            copy(s2, c2, down.clone());
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })?
        };
        Ok(Self { stop, up, down, thread: Some(thread) })
    }

    /// Bytes (node → server, server → node) so far.
    pub fn bytes(&self) -> (u64, u64) {
        (self.up.load(Ordering::Relaxed), self.down.load(Ordering::Relaxed))
    }
}

/// Copies `from` to `to` on a thread of its own, counting into `count`.
fn copy(mut from: TcpStream, mut to: TcpStream, count: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    count.fetch_add(n as u64, Ordering::Relaxed);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The nodes.

/// A booted node container and its forwarder.
#[derive(Debug)]
struct BenchNode {
    spec: nodectr::Spec,
    state: nodectr::State,
    forwarder: Option<Forwarder>,
}

impl BenchNode {
    fn run(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.state.init_pid.to_string())
            .args(["-m", "-u", "-i", "-n", "-p", "-C"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("nsenter {}", args.join(" ")))
    }

    fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args)?;
        ensure!(
            out.status.success(),
            "in {}, {} failed: {}{}",
            self.spec.name,
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// A node path's file on the host.
    fn file(&self, path: &str) -> PathBuf {
        self.spec.rootfs.join(path.trim_start_matches('/'))
    }

    fn bytes(&self) -> (u64, u64) {
        self.forwarder.as_ref().map_or((0, 0), Forwarder::bytes)
    }

    async fn cri(&self) -> Result<CriClient> {
        let socket = PathBuf::from(format!("/proc/{}/root/run/containerd/containerd.sock", self.state.init_pid));
        CriClient::connect(&socket).await
    }
}

/// The node name of agent `label` in node `index`.
fn node_name(label: &str, index: usize) -> String {
    format!("{NODE_PREFIX}fleet-{label}-{index}")
}

/// The unit the agent runs as in its node.
fn unit(label: &str) -> String {
    format!("{label}-bench.service")
}

/// The agent's `KubeletConfiguration` in a node.
fn agent_config(kind: &AgentKind, max_pods: usize) -> String {
    let mut c = String::from(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
cgroupRoot: /
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failSwapOn: false
evictionHard:
  memory.available: 100Mi
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
",
    );
    let _ = writeln!(c, "maxPods: {}", max_pods.max(110));
    if !kind.swiftlet {
        // From 1.35 on the kubelet refuses a cgroup v1 host unless told.
        c.push_str("failCgroupV1: false\n");
    }
    c.push_str(&apiserver::register_with_taint());
    c
}

/// The agent's command line in node `index` (at `address`).
fn agent_command(kind: &AgentKind, index: usize, address: &str) -> Vec<String> {
    let dir = format!("{NODE_DIR}/{}", kind.label);
    vec![
        format!("/usr/local/bin/{}-bench", kind.label),
        format!("--config={dir}/config.yaml"),
        format!("--container-runtime-endpoint={NODE_ENDPOINT}"),
        format!("--root-dir={dir}/root"),
        format!("--cert-dir={dir}/pki"),
        format!("--hostname-override={}", node_name(&kind.label, index)),
        format!("--node-ip={address}"),
        format!("--bootstrap-kubeconfig={dir}/bootstrap.kubeconfig"),
        format!("--kubeconfig={dir}/kubelet.conf"),
    ]
}

/// Installs and starts agent `kind` in `node` as a transient unit.
fn start_agent(node: &BenchNode, index: usize, kind: &AgentKind, api: &ApiServer, max_pods: usize) -> Result<()> {
    let dir = format!("{NODE_DIR}/{}", kind.label);
    let host_dir = node.file(&dir);
    fs::create_dir_all(&host_dir)?;
    let bin = node.file(&format!("/usr/local/bin/{}-bench", kind.label));
    fs::copy(&kind.binary, &bin)
        .with_context(|| format!("copying {} into {}", kind.binary.display(), node.spec.name))?;
    fs::write(host_dir.join("config.yaml"), agent_config(kind, max_pods))?;
    // The bootstrap kubeconfig with the CA at a path of the node.
    let text = fs::read_to_string(&api.bootstrap_kubeconfig)?;
    let ca = apiserver::kubeconfig_tls(&format!("{text}\nclient-certificate: x\nclient-key: x\n"))
        .context("the bootstrap kubeconfig names no certificate-authority")?
        .ca;
    fs::copy(&ca, host_dir.join("ca.crt"))?;
    let text = text.replace(&ca.display().to_string(), &format!("{dir}/ca.crt"));
    fs::write(host_dir.join("bootstrap.kubeconfig"), text)?;
    let unit = unit(&kind.label);
    let _ = node.run(&["systemctl", "reset-failed", &unit]);
    let log = format!("{dir}/agent.log");
    let mut cmd = vec![
        "systemd-run".to_owned(),
        format!("--unit={unit}"),
        "--collect".to_owned(),
        "--quiet".to_owned(),
        format!("--property=StandardOutput=append:{log}"),
        format!("--property=StandardError=append:{log}"),
        "--property=TimeoutStopSec=20".to_owned(),
        "--setenv=RUST_LOG=info".to_owned(),
        "--".to_owned(),
    ];
    cmd.extend(agent_command(kind, index, &node.spec.address));
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    node.ok(&cmd)?;
    Ok(())
}

/// The last `lines` of the agent's log in `node`.
fn agent_log_tail(node: &BenchNode, label: &str, lines: usize) -> String {
    crate::containerd::log_tail(&node.file(&format!("{NODE_DIR}/{label}/agent.log")), lines)
}

/// Stops the agent's unit, removes every sandbox left through the node's CRI and keeps the
/// agent's log under `target/bench/`.
async fn stop_agent(node: &BenchNode, label: &str, keep_log: &Path) -> Result<()> {
    let mut failures = Vec::new();
    let unit = unit(label);
    if let Err(e) = node.ok(&["systemctl", "stop", &unit]) {
        failures.push(format!("{e:#}"));
    }
    match node.cri().await {
        Ok(mut cri) => match cri.list_pod_sandboxes().await {
            Ok(sandboxes) => {
                for s in sandboxes {
                    if s.metadata.as_ref().is_some_and(|m| agent::is_bench_namespace(&m.namespace)) {
                        let _ = cri.stop_pod_sandbox(&s.id).await;
                        if let Err(e) = cri.remove_pod_sandbox(&s.id).await {
                            failures.push(format!("removing sandbox {}: {e:#}", s.id));
                        }
                    }
                }
            }
            Err(e) => failures.push(format!("listing sandboxes: {e:#}")),
        },
        Err(e) => failures.push(format!("CRI of {}: {e:#}", node.spec.name)),
    }
    let log = node.file(&format!("{NODE_DIR}/{label}/agent.log"));
    if log.exists() {
        if let Some(p) = keep_log.parent() {
            let _ = fs::create_dir_all(p);
        }
        let _ = fs::copy(&log, keep_log);
    }
    if failures.is_empty() { Ok(()) } else { bail!("{}: {}", node.spec.name, failures.join("; ")) }
}

// ---------------------------------------------------------------------------------------
// The workload.

/// The Deployment: `replicas` busybox pods on the bench's `nodes`, one per node at a time.
pub fn deployment(namespace: &str, replicas: usize, nodes: &[String]) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": DEPLOYMENT, "namespace": namespace },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": DEPLOYMENT } },
            "template": {
                "metadata": { "labels": { "app": DEPLOYMENT } },
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "automountServiceAccountToken": false,
                    "tolerations": [{ "key": BENCH_TAINT, "operator": "Exists" }],
                    "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{ "matchExpressions": [{
                            "key": "kubernetes.io/hostname", "operator": "In", "values": nodes,
                        }] }],
                    } } },
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": { "matchLabels": { "app": DEPLOYMENT } },
                    }],
                    "containers": [{
                        "name": "c0",
                        "image": images::BUSYBOX_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                    }],
                },
            },
        },
    })
}

/// The pods the watch has seen and not seen deleted, with when each was first seen.
pub fn live_pods(events: &[PodEvent]) -> BTreeMap<String, u64> {
    let mut live = BTreeMap::new();
    for e in events {
        match e.kind {
            EventKind::Deleted => {
                live.remove(&e.name);
            }
            _ => {
                live.entry(e.name.clone()).or_insert(e.at_ns);
            }
        }
    }
    live
}

/// Pods first seen after `after_ns` and the first time each was seen Running (if it was).
pub fn startups(events: &[PodEvent], after_ns: u64) -> BTreeMap<String, (u64, Option<u64>)> {
    let mut out: BTreeMap<String, (u64, Option<u64>)> = BTreeMap::new();
    let mut seen_before = BTreeSet::new();
    for e in events {
        if e.at_ns < after_ns {
            seen_before.insert(e.name.clone());
            continue;
        }
        if seen_before.contains(&e.name) {
            continue;
        }
        let entry = out.entry(e.name.clone()).or_insert((e.at_ns, None));
        if entry.1.is_none() && e.is_running() {
            entry.1 = Some(e.at_ns);
        }
    }
    out
}

/// Scales the Deployment (the `scale` subresource).
async fn scale(client: &mut ApiClient, namespace: &str, replicas: usize) -> Result<()> {
    let path = format!("/apis/apps/v1/namespaces/{namespace}/deployments/{DEPLOYMENT}/scale");
    let body = json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": { "name": DEPLOYMENT, "namespace": namespace },
        "spec": { "replicas": replicas },
    });
    let (code, out) = client.request("PUT", &path, Some(&body)).await?;
    ensure!(code == 200, "scaling {DEPLOYMENT} to {replicas}: {code}: {out}");
    Ok(())
}

/// Waits until the watch shows exactly `replicas` live pods, each Running once since it
/// appeared; returns the start-ups (ns) of the pods first seen after `after_ns`.
async fn wait_settled(
    watch: &PodWatch,
    replicas: usize,
    after_ns: u64,
    timeout: Duration,
    nodes: &[BenchNode],
    label: &str,
) -> Result<(Vec<u64>, usize)> {
    let deadline = Instant::now() + timeout;
    let mut last_note = Instant::now();
    loop {
        let (live, started) = watch.with_events(|ev| (live_pods(ev), startups(ev, after_ns)))?;
        let new: Vec<&(u64, Option<u64>)> = started.values().collect();
        let running_new = new.iter().filter(|(_, r)| r.is_some()).count();
        let live_new = started.keys().filter(|n| live.contains_key(*n)).count();
        if live.len() == replicas && running_new >= live_new {
            let lat = new.iter().filter_map(|(a, r)| r.map(|r| r.saturating_sub(*a))).collect();
            return Ok((lat, started.len()));
        }
        if Instant::now() > deadline {
            let mut tails = String::new();
            for n in nodes {
                let _ = write!(tails, "\n{}:\n{}", n.spec.name, agent_log_tail(n, label, 8));
            }
            bail!(
                "{} live pods ({running_new}/{live_new} new ones Running), want {replicas}, after {timeout:?}; agent \
                 logs:{tails}",
                live.len()
            );
        }
        if last_note.elapsed() > Duration::from_secs(10) {
            eprintln!("bench: {} live pods, {running_new}/{live_new} new ones Running", live.len());
            last_note = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The nodes' pod counts (`spec.nodeName` of the namespace's pods).
async fn spread(client: &mut ApiClient, namespace: &str) -> Result<BTreeMap<String, usize>> {
    let (code, list) = client.request("GET", &format!("/api/v1/namespaces/{namespace}/pods"), None).await?;
    ensure!(code == 200, "listing pods: {code}: {list}");
    let mut out = BTreeMap::new();
    for p in list["items"].as_array().into_iter().flatten() {
        let node = p["spec"]["nodeName"].as_str().unwrap_or("(unscheduled)").to_owned();
        *out.entry(node).or_insert(0) += 1;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The run.

/// `bench cluster` (holding the test bed's lock).
pub async fn run(ctx: &Ctx, layout: &Layout, args: &ClusterArgs) -> Result<()> {
    ensure!((1..=MAX_NODES).contains(&args.nodes), "--nodes {}: expected 1 to {MAX_NODES}", args.nodes);
    ensure!(args.replicas >= args.nodes, "--replicas {} is fewer than --nodes {}", args.replicas, args.nodes);
    ensure!(args.replicas * 2 <= 110 * args.nodes, "--replicas {}: at most 55 per node", args.replicas);
    let leave_bed_up = super::bed_was_up(layout) || args.bed.keep_testbed;
    super::bed_up(ctx, layout, &["curl"]).await?;
    let api = ApiServer::up(ctx, layout)?;
    let swiftlet = super::pleg::swiftlet_binary(ctx, args.bed.swiftlet_bin.as_deref())?;
    let mut kinds = vec![AgentKind { label: "swiftlet".into(), binary: swiftlet, swiftlet: true }];
    if args.other_agent != "none" {
        let binary = super::summary::other_agent(ctx, Path::new(&args.other_agent))?;
        kinds.push(AgentKind { label: "kubelet".into(), binary, swiftlet: false });
    }
    let version = {
        let mut cri = CriClient::connect(&layout.socket()).await?;
        cri.version().await?
    };
    let mut env = super::pleg::environment(ctx, &version, args.bed.swiftlet_bin.as_deref());
    env.runtime = format!("{} node containers, each systemd + containerd 1.6 (systemd cgroup driver)", args.nodes);

    let mut nodes: Vec<BenchNode> = Vec::new();
    let mut runs: Vec<AgentRun> = Vec::new();
    let mut baseline: Option<Window> = None;
    let outcome = {
        let bench = measure(ctx, layout, args, &api, &kinds, &mut nodes, &mut runs, &mut baseline);
        let mut bench = std::pin::pin!(bench);
        super::until_interrupted(bench.as_mut(), "stopping the agents, removing the node containers").await
    };
    let mut failures = Vec::new();
    let bench_dir = super::pleg::bench_dir(ctx);
    for (i, node) in nodes.iter_mut().enumerate() {
        node.forwarder = None;
        if let Err(e) = nodectr::down_spec(&node.spec) {
            failures.push(format!("{e:#}"));
        }
        // The node's console (its systemd's log) is kept with the agents' logs.
        if node.spec.console.exists() {
            let _ = fs::create_dir_all(&bench_dir);
            let _ = fs::copy(&node.spec.console, bench_dir.join(format!("cluster-node-{}-console.log", i + 1)));
            let _ = fs::remove_file(&node.spec.console);
        }
    }
    let cleanup = if failures.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("{}", failures.join("; "))) };
    let published = match &baseline {
        Some(b) if !runs.is_empty() => publish(ctx, &env, args, b, &runs, outcome.is_err()),
        _ => Ok(()),
    };
    super::finish(ctx, layout, leave_bed_up, outcome, super::said(cleanup), published).await
}

/// Boots the nodes, measures the baseline and each agent; fills `nodes`, `runs` and
/// `baseline` as it goes (the caller cleans up and reports whatever was reached).
#[expect(clippy::too_many_arguments, reason = "the run's outputs are filled for the caller's clean-up")]
async fn measure(
    ctx: &Ctx,
    layout: &Layout,
    args: &ClusterArgs,
    api: &ApiServer,
    kinds: &[AgentKind],
    nodes: &mut Vec<BenchNode>,
    runs: &mut Vec<AgentRun>,
    baseline: &mut Option<Window>,
) -> Result<()> {
    let mut client = api.client();
    client.remove_stale().await?;
    let api_addr: SocketAddr =
        api.host.parse().with_context(|| format!("the API server {} is not ip:port", api.host))?;
    for i in 1..=args.nodes {
        let spec = nodectr::Spec::bench(layout, i)?;
        // Recorded before it boots: a failed boot is still cleaned up.
        nodes.push(BenchNode {
            state: nodectr::State {
                launcher_pid: 0,
                init_pid: 0,
                cgroups: Vec::new(),
                rootfs: spec.rootfs.clone(),
                address: spec.address.clone(),
            },
            spec: spec.clone(),
            forwarder: None,
        });
        let state = nodectr::up_spec(ctx, &spec).await?;
        let node = nodes.last_mut().context("no node")?;
        node.forwarder = Some(Forwarder::start(state.init_pid, api_addr)?);
        node.state = state;
    }

    // The control plane alone, with the bench's own pod watch open (it stays open through
    // every window: its watch is the baseline's, not an agent's).
    let namespace = format!("{NAMESPACE}-{}-fleet", std::process::id());
    client.create_namespace(&namespace).await?;
    let result = async {
        let (_, rv) = client.list_pods(&namespace).await?;
        let target = WatchTarget { host: api.host.clone(), tls: api.tls.clone(), namespace: namespace.clone() };
        let watch = PodWatch::start(target, &rv)?;
        eprintln!("bench: the control plane alone for {} s (the baseline)", BASELINE.as_secs());
        let (before, _) = read(&mut client).await?;
        tokio::time::sleep(BASELINE).await;
        let (after, base_watches) = read(&mut client).await?;
        *baseline = Some(Window::between(&before, &after, &[]));
        for kind in kinds {
            let mut run = AgentRun { label: kind.label.clone(), nodes: args.nodes, ..AgentRun::default() };
            let r =
                agent_run(ctx, args, api, kind, nodes, &mut client, &namespace, &watch, &base_watches, &mut run).await;
            runs.push(run);
            r?;
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = client.delete_namespace(&namespace).await {
        eprintln!("bench: deleting namespace {namespace}: {e:#}");
    }
    result
}

/// The host's kernel settings the upstream kubelet rewrites, to restore after it.
fn kernel_settings() -> Vec<(PathBuf, String)> {
    KERNEL_SETTINGS
        .iter()
        .filter_map(|k| {
            let p = Path::new("/proc/sys").join(k);
            fs::read_to_string(&p).ok().map(|v| (p, v.trim().to_owned()))
        })
        .collect()
}

/// One agent on every node: join, roll out, idle, churn, tear down.
#[expect(clippy::too_many_arguments, reason = "one agent's run over the shared nodes, client and watch")]
async fn agent_run(
    ctx: &Ctx,
    args: &ClusterArgs,
    api: &ApiServer,
    kind: &AgentKind,
    nodes: &[BenchNode],
    client: &mut ApiClient,
    namespace: &str,
    watch: &PodWatch,
    base_watches: &BTreeMap<String, f64>,
    run: &mut AgentRun,
) -> Result<()> {
    let label = kind.label.as_str();
    let saved = kernel_settings();
    let names: Vec<String> = (1..=nodes.len()).map(|i| node_name(label, i)).collect();
    let result = async {
        for (i, node) in nodes.iter().enumerate() {
            start_agent(node, i + 1, kind, api, args.replicas * 2)?;
        }
        for (node, name) in nodes.iter().zip(&names) {
            if let Err(e) = client.wait_node_ready(name, Duration::from_mins(2)).await {
                bail!("{e:#}; agent log tail:\n{}", agent_log_tail(node, label, 30));
            }
        }
        eprintln!("bench: {label}: {} nodes Ready; settling 10 s", nodes.len());
        tokio::time::sleep(Duration::from_secs(10)).await;

        // Roll-out.
        let t0 = procfs::monotonic_ns();
        let path = format!("/apis/apps/v1/namespaces/{namespace}/deployments");
        let (code, body) = client.request("POST", &path, Some(&deployment(namespace, args.replicas, &names))).await?;
        ensure!(code == 201, "creating the Deployment: {code}: {body}");
        let (lat, _) = wait_settled(watch, args.replicas, t0, Duration::from_mins(3), nodes, label).await?;
        run.startup.extend(lat);
        run.spread = spread(client, namespace).await?;
        eprintln!("bench: {label}: {} pods Running, spread {:?}", args.replicas, run.spread);
        tokio::time::sleep(Duration::from_secs(10)).await;

        // Idle.
        eprintln!("bench: {label}: idle window, {} s", args.idle_secs);
        let bytes0: Vec<(u64, u64)> = nodes.iter().map(BenchNode::bytes).collect();
        let (before, _) = read(client).await?;
        tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
        let (after, watches) = read(client).await?;
        let bytes1: Vec<(u64, u64)> = nodes.iter().map(BenchNode::bytes).collect();
        run.idle = Some(phase(&before, &after, &[], &watches, base_watches, &bytes0, &bytes1, 0, 0));

        // Churn.
        eprintln!(
            "bench: {label}: churn, {} × scale {} → {} → {}",
            args.churn_cycles,
            args.replicas,
            args.replicas * 2,
            args.replicas
        );
        let bytes0: Vec<(u64, u64)> = nodes.iter().map(BenchNode::bytes).collect();
        let (before, _) = read(client).await?;
        let (mut started, mut stopped) = (0, 0);
        for _ in 0..args.churn_cycles {
            let t = procfs::monotonic_ns();
            scale(client, namespace, args.replicas * 2).await?;
            let (lat, n) = wait_settled(watch, args.replicas * 2, t, Duration::from_mins(3), nodes, label).await?;
            run.startup.extend(lat);
            started += n;
            scale(client, namespace, args.replicas).await?;
            wait_settled(watch, args.replicas, procfs::monotonic_ns(), Duration::from_mins(3), nodes, label).await?;
            stopped += args.replicas;
        }
        let (after, watches) = read(client).await?;
        let bytes1: Vec<(u64, u64)> = nodes.iter().map(BenchNode::bytes).collect();
        let own = controllers_share(&before, &after, started, stopped, args.churn_cycles * 2);
        let own: Vec<(&str, f64)> = own.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        run.churn = Some(phase(&before, &after, &own, &watches, base_watches, &bytes0, &bytes1, started, stopped));
        anyhow::Ok(())
    }
    .await;

    // Tear-down, whatever happened.
    let mut failures = Vec::new();
    let path = format!("/apis/apps/v1/namespaces/{namespace}/deployments/{DEPLOYMENT}");
    match client.request("DELETE", &path, Some(&json!({"propagationPolicy": "Foreground"}))).await {
        Ok((200 | 202 | 404, _)) => {
            if let Err(e) = wait_settled(watch, 0, procfs::monotonic_ns(), Duration::from_mins(2), nodes, label).await {
                failures.push(format!("the Deployment's pods did not go: {e:#}"));
            }
        }
        Ok((code, body)) => failures.push(format!("deleting the Deployment: {code}: {body}")),
        Err(e) => failures.push(format!("deleting the Deployment: {e:#}")),
    }
    for (i, node) in nodes.iter().enumerate() {
        let keep = super::pleg::bench_dir(ctx).join(format!("cluster-{label}-{}.log", i + 1));
        if let Err(e) = stop_agent(node, label, &keep).await {
            failures.push(format!("{e:#}"));
        }
    }
    for name in &names {
        if let Err(e) = client.delete_node(name).await {
            failures.push(format!("deleting node {name}: {e:#}"));
        }
    }
    for (path, value) in &saved {
        if fs::read_to_string(path).is_ok_and(|v| v.trim() != value) {
            eprintln!("bench: restoring {} to {value} (the {label} changed it)", path.display());
            if let Err(e) = fs::write(path, value) {
                failures.push(format!("restoring {}: {e}", path.display()));
            }
        }
    }
    match (result, failures.is_empty()) {
        (Err(e), _) => Err(e),
        (Ok(()), true) => Ok(()),
        (Ok(()), false) => bail!("{label}: cleanup incomplete: {}", failures.join("; ")),
    }
}

/// Resources only the control plane's controllers write (or read) for the workload: the
/// agents never touch them, so the estimate leaves them out whole.
const CONTROLLER_RESOURCES: [&str; 3] = ["deployments", "replicasets", "limitranges"];

/// Whether a request key (`PUT replicasets/status`) is of a [`CONTROLLER_RESOURCES`].
pub fn controllers_only(key: &str) -> bool {
    let resource = key.split_once(' ').map_or("", |(_, r)| r);
    let resource = resource.split_once('/').map_or(resource, |(r, _)| r);
    CONTROLLER_RESOURCES.contains(&resource)
}

/// The requests of the churn window that the bench and the controllers made for the
/// workload, by request key, to leave out of the agents' estimate: the bench's scale
/// requests; per pod created, the `ReplicaSet` controller's `POST pods` and the
/// scheduler's `POST pods/binding`; per pod removed, the controller's `DELETE pods`; and
/// the controllers' events — `SuccessfulCreate` and `Scheduled` per pod created,
/// `SuccessfulDelete` per pod removed, `ScalingReplicaSet` per scale — which their event
/// correlators send as a `POST` or, once aggregated, a `PATCH`: taken from the window's
/// `POST events` first, the rest from its `PATCH events` (an estimate).
pub fn controllers_share(
    before: &Reading,
    after: &Reading,
    started: usize,
    stopped: usize,
    scales: usize,
) -> Vec<(String, f64)> {
    let delta = |key: &str| {
        (after.counters.by_request.get(key).copied().unwrap_or(0.0)
            - before.counters.by_request.get(key).copied().unwrap_or(0.0))
        .max(0.0)
    };
    let events = (2 * started + stopped + scales) as f64;
    let posts = events.min(delta("POST events"));
    vec![
        ("PUT deployments/scale".to_owned(), scales as f64),
        ("POST pods".to_owned(), started as f64),
        ("POST pods/binding".to_owned(), started as f64),
        ("DELETE pods".to_owned(), stopped as f64),
        ("POST events".to_owned(), posts),
        ("PATCH events".to_owned(), events - posts),
    ]
}

/// A window's figures from its readings and byte counts.
#[expect(clippy::too_many_arguments, reason = "a plain constructor of the window's parts")]
fn phase(
    before: &Reading,
    after: &Reading,
    own: &[(&str, f64)],
    watches: &BTreeMap<String, f64>,
    base_watches: &BTreeMap<String, f64>,
    bytes0: &[(u64, u64)],
    bytes1: &[(u64, u64)],
    started: usize,
    stopped: usize,
) -> Phase {
    let sum = |b: &[(u64, u64)]| b.iter().fold((0, 0), |(u, d), (x, y)| (u + x, d + y));
    let (u0, d0) = sum(bytes0);
    let (u1, d1) = sum(bytes1);
    Phase {
        window: Window::between(before, after, own),
        watches: gauge_delta(watches, base_watches),
        bytes_up: u1.saturating_sub(u0),
        bytes_down: d1.saturating_sub(d0),
        started,
        stopped,
    }
}

// ---------------------------------------------------------------------------------------
// The fleet model.

/// What the control plane serves for a fleet of one agent, scaled from the measured
/// per-node figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetModel {
    /// Requests a second, all nodes, by request key: idle.
    pub idle: BTreeMap<String, f64>,
    /// Requests a second the fleet's churn adds, by request key.
    pub churn: BTreeMap<String, f64>,
    pub idle_total: f64,
    pub churn_total: f64,
    pub watches: BTreeMap<String, f64>,
    /// Bytes a second, idle and with churn.
    pub idle_bytes: f64,
    pub churn_bytes: f64,
}

/// The inputs of the model for one agent, per node (measured).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PerNode {
    /// Requests a second at idle: exact total and estimated split.
    pub idle_total: f64,
    pub idle_split: BTreeMap<String, f64>,
    /// Requests per pod lifecycle (one start and one stop): exact total and split.
    pub per_pod_total: f64,
    pub per_pod_split: BTreeMap<String, f64>,
    pub watches: BTreeMap<String, f64>,
    pub idle_bytes: f64,
    /// Bytes per pod lifecycle.
    pub per_pod_bytes: f64,
    /// Pods per node at idle.
    pub pods: f64,
}

impl PerNode {
    /// Per-node inputs from one agent's run (`None` before its churn was measured). The
    /// churn window's requests beyond the idle rate over its length are the pods'
    /// lifecycles' (starts plus stops, counted as pairs).
    pub fn of(run: &AgentRun, baseline: &Window) -> Option<Self> {
        let (idle, churn) = (run.idle.as_ref()?, run.churn.as_ref()?);
        let n = run.nodes.max(1) as f64;
        let lifecycles = (churn.started.max(churn.stopped) as f64).max(1.0);
        let idle_split = idle.per_node_requests(baseline, run.nodes);
        let churn_split = churn.per_node_requests(baseline, run.nodes);
        let per_pod_split: BTreeMap<String, f64> = churn_split
            .iter()
            .filter_map(|(k, r)| {
                let extra = (r - idle_split.get(k).copied().unwrap_or(0.0)) * churn.window.secs * n / lifecycles;
                (extra > 0.0).then(|| (k.clone(), extra))
            })
            .collect();
        let extra_total = (churn.per_node_rate(run.nodes) - idle.per_node_rate(run.nodes)) * churn.window.secs * n;
        let extra_bytes = (churn.per_node_bytes(run.nodes) - idle.per_node_bytes(run.nodes)) * churn.window.secs * n;
        let pods = run.spread.values().sum::<usize>() as f64 / n;
        Some(Self {
            idle_total: idle.per_node_rate(run.nodes),
            idle_split,
            per_pod_total: (extra_total / lifecycles).max(0.0),
            per_pod_split,
            watches: idle.per_node_watches(run.nodes),
            idle_bytes: idle.per_node_bytes(run.nodes),
            per_pod_bytes: (extra_bytes / lifecycles).max(0.0),
            pods,
        })
    }

    /// The fleet of `nodes` with `churn` pod lifecycles a second across it. Idle figures
    /// scale with the nodes (measured idle requests do not grow with the pod count when
    /// nothing changes; the pods here mount no secrets or config maps, whose watches
    /// would), churn figures with the fleet's pod lifecycles.
    pub fn fleet(&self, nodes: u64, churn: f64) -> FleetModel {
        let n = nodes as f64;
        FleetModel {
            idle: self.idle_split.iter().map(|(k, v)| (k.clone(), v * n)).collect(),
            churn: self.per_pod_split.iter().map(|(k, v)| (k.clone(), v * churn)).collect(),
            idle_total: self.idle_total * n,
            churn_total: self.per_pod_total * churn,
            watches: self.watches.iter().map(|(k, v)| (k.clone(), v * n)).collect(),
            idle_bytes: self.idle_bytes * n,
            churn_bytes: self.per_pod_bytes * churn,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The report.

fn fmt_bytes(b: f64) -> String {
    if b >= 1e6 {
        format!("{} MB", report::three_digits(b / 1e6))
    } else if b >= 1e3 {
        format!("{} kB", report::three_digits(b / 1e3))
    } else {
        format!("{} B", report::three_digits(b))
    }
}

fn fmt_count(x: f64) -> String {
    report::three_digits(x)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.2}×", a / b) } else { "—".to_owned() }
}

/// The per-node table (swiftlet, the other agent, ratio) and the fleet model, as text and
/// Markdown.
pub fn render(args: &ClusterArgs, baseline: &Window, runs: &[AgentRun]) -> (String, String) {
    let per: Vec<Option<PerNode>> = runs.iter().map(|r| PerNode::of(r, baseline)).collect();
    let mut header = vec!["per node".to_owned()];
    header.extend(runs.iter().map(|r| r.label.clone()));
    if runs.len() == 2 {
        header.push(format!("{} ÷ {}", runs[0].label, runs[1].label));
    }
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut row = |name: &str, values: Vec<Option<f64>>, fmt: &dyn Fn(f64) -> String| {
        rows.push(ratio_row(name, &values, fmt));
    };
    let startup = |r: &AgentRun| Summary::of(r.startup.iter().copied());
    row(
        "pod start-up p50 (create → Running on a watch)",
        runs.iter().map(|r| startup(r).map(|s| s.p50 as f64 / 1e6)).collect(),
        &|v| format!("{} ms", report::three_digits(v)),
    );
    row("pod start-up p99", runs.iter().map(|r| startup(r).map(|s| s.p99 as f64 / 1e6)).collect(), &|v| {
        format!("{} ms", report::three_digits(v))
    });
    row("pods started (n)", runs.iter().map(|r| Some(r.startup.len() as f64)).collect(), &|v| format!("{v:.0}"));
    row("idle: requests/s (exact)", per.iter().map(|p| p.as_ref().map(|p| p.idle_total)).collect(), &apiload::fmt_rate);
    row(
        "idle: bytes/s to and from the API server (exact)",
        per.iter().map(|p| p.as_ref().map(|p| p.idle_bytes)).collect(),
        &|v| format!("{}/s", fmt_bytes(v)),
    );
    row("open watches (exact)", per.iter().map(|p| p.as_ref().map(|p| p.watches.values().sum())).collect(), &fmt_count);
    row(
        "churn: requests/s (exact)",
        runs.iter().map(|r| r.churn.as_ref().map(|c| c.per_node_rate(r.nodes))).collect(),
        &apiload::fmt_rate,
    );
    row(
        "churn: bytes/s (exact)",
        runs.iter().map(|r| r.churn.as_ref().map(|c| c.per_node_bytes(r.nodes))).collect(),
        &|v| format!("{}/s", fmt_bytes(v)),
    );
    row(
        "requests per pod started and stopped (exact)",
        per.iter().map(|p| p.as_ref().map(|p| p.per_pod_total)).collect(),
        &fmt_count,
    );
    row(
        "bytes per pod started and stopped (exact)",
        per.iter().map(|p| p.as_ref().map(|p| p.per_pod_bytes)).collect(),
        &fmt_bytes,
    );
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut text = report::text_table(&header_refs, &rows);
    let mut md = report::markdown_table(&header_refs, &rows);

    let _ = writeln!(md, "\nBy verb and resource (estimated, requests/s per node; see `bench/fleet.rs`):\n");
    let _ = writeln!(text, "\nBy verb and resource (estimated, requests/s per node):");
    for (r, p) in runs.iter().zip(&per) {
        let Some(p) = p else { continue };
        let idle = apiload::fmt_top(&p.idle_split, usize::MAX);
        let churn = r.churn.as_ref().map(|c| apiload::fmt_top(&c.per_node_requests(baseline, r.nodes), 12));
        let watches = apiload::fmt_top(&p.watches, usize::MAX);
        for (out, bullet) in [(&mut text, "  "), (&mut md, "- ")] {
            let _ = writeln!(out, "{bullet}{} idle: {idle}", r.label);
            let _ = writeln!(out, "{bullet}{} churn: {}", r.label, churn.clone().unwrap_or_default());
            let _ = writeln!(out, "{bullet}{} open watches by resource: {watches}", r.label);
            let _ = writeln!(out, "{bullet}{} spread after the roll-out: {:?}", r.label, r.spread);
        }
    }

    // The model.
    let (nodes, pods, churn) = (args.fleet_nodes, args.fleet_pods_per_node, args.fleet_churn);
    let _ = writeln!(
        md,
        "\n### Model: {nodes} nodes × {pods} pods, {churn} pods started and as many stopped a second\n\nInputs: \
         the per-node figures above (idle requests and bytes per node, open watches per node, requests and bytes \
         per pod started and stopped); idle figures × {nodes} nodes, churn figures × {churn} pod lifecycles a \
         second. Idle figures were measured with about {} pods per node and are taken as independent of the pod \
         count (nothing changes at idle, and these pods mount no secret or config map); that is an assumption \
         at {pods} pods, which the density bench measures. A node status report the agents send every 5 \
         minutes when nothing changed (`nodeStatusReportFrequency`) may fall outside the idle window.\n",
        per.iter().flatten().map(|p| format!("{:.1}", p.pods)).collect::<Vec<_>>().join(" / ")
    );
    let _ = writeln!(text, "\nModel: {nodes} nodes × {pods} pods, fleet churn {churn} pods/s");
    let mut mrows = Vec::new();
    let models: Vec<Option<FleetModel>> = per.iter().map(|p| p.as_ref().map(|p| p.fleet(nodes, churn))).collect();
    let mut mrow = |name: &str, values: Vec<Option<f64>>, fmt: &dyn Fn(f64) -> String| {
        mrows.push(ratio_row(name, &values, fmt));
    };
    mrow("idle fleet: requests/s", models.iter().map(|m| m.as_ref().map(|m| m.idle_total)).collect(), &fmt_count);
    mrow("churn adds: requests/s", models.iter().map(|m| m.as_ref().map(|m| m.churn_total)).collect(), &fmt_count);
    mrow(
        "total: requests/s",
        models.iter().map(|m| m.as_ref().map(|m| m.idle_total + m.churn_total)).collect(),
        &fmt_count,
    );
    mrow("watches open", models.iter().map(|m| m.as_ref().map(|m| m.watches.values().sum())).collect(), &fmt_count);
    mrow("idle fleet: bytes/s", models.iter().map(|m| m.as_ref().map(|m| m.idle_bytes)).collect(), &|v| {
        format!("{}/s", fmt_bytes(v))
    });
    mrow("total: bytes/s", models.iter().map(|m| m.as_ref().map(|m| m.idle_bytes + m.churn_bytes)).collect(), &|v| {
        format!("{}/s", fmt_bytes(v))
    });
    let mut mheader = vec!["fleet".to_owned()];
    mheader.extend(runs.iter().map(|r| r.label.clone()));
    if runs.len() == 2 {
        mheader.push("ratio".to_owned());
    }
    let mheader: Vec<&str> = mheader.iter().map(String::as_str).collect();
    text.push_str(&report::text_table(&mheader, &mrows));
    md.push_str(&report::markdown_table(&mheader, &mrows));
    md.push('\n');
    for (r, m) in runs.iter().zip(&models) {
        let Some(m) = m else { continue };
        for (out, bullet) in [(&mut text, "  "), (&mut md, "- ")] {
            let _ = writeln!(
                out,
                "{bullet}{} fleet idle by verb and resource (estimated): {}",
                r.label,
                apiload::fmt_top(&m.idle, 8)
            );
            let _ =
                writeln!(out, "{bullet}{} fleet churn adds (estimated): {}", r.label, apiload::fmt_top(&m.churn, 8));
            let _ = writeln!(
                out,
                "{bullet}{} fleet watches by resource: {}",
                r.label,
                apiload::fmt_top(&m.watches, usize::MAX)
            );
        }
    }
    (text, md)
}

fn publish(
    ctx: &Ctx,
    env: &report::Environment,
    args: &ClusterArgs,
    baseline: &Window,
    runs: &[AgentRun],
    incomplete: bool,
) -> Result<()> {
    let (text, body) = render(args, baseline, runs);
    let mut md = env.markdown_head(
        "cargo xtask bench cluster",
        &format!("release; {} nodes, {} replicas, {} churn cycles", args.nodes, args.replicas, args.churn_cycles),
    );
    let _ = writeln!(md, "- baseline: the control plane alone, {:.0} s\n", baseline.secs);
    md.push_str(&body);
    report::publish(
        ctx,
        "cluster.md",
        "swiftlet cluster bench (API load per node, fleet model)",
        env,
        md,
        &text,
        incomplete.then_some("agent"),
    )
}

/// A table row: its name, each agent's value (`—` for none), and with two agents the
/// ratio of the first to the second.
fn ratio_row(name: &str, values: &[Option<f64>], fmt: &dyn Fn(f64) -> String) -> Vec<String> {
    let mut r = vec![name.to_owned()];
    r.extend(values.iter().map(|v| v.map_or("—".to_owned(), fmt)));
    if let [Some(a), Some(b)] = values[..] {
        r.push(ratio(a, b));
    } else if values.len() == 2 {
        r.push("—".to_owned());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::watch::ContainerView;

    fn event(at_ns: u64, kind: EventKind, name: &str, running: bool) -> PodEvent {
        PodEvent {
            at_ns,
            kind,
            name: name.into(),
            uid: format!("u-{name}"),
            resource_version: at_ns.to_string(),
            phase: Some(if running { "Running" } else { "Pending" }.into()),
            reason: None,
            message: None,
            deleting: false,
            containers: vec![ContainerView { name: "c0".into(), id: None, running, terminated: false, restarts: 0 }],
        }
    }

    #[test]
    fn start_ups_run_from_first_sight_to_running_for_new_pods_only() {
        let ev = [
            event(5, EventKind::Added, "old", false),
            event(10, EventKind::Added, "a", false),
            event(12, EventKind::Modified, "old", true),
            event(30, EventKind::Modified, "a", true),
            event(40, EventKind::Modified, "a", true),
            event(20, EventKind::Added, "b", false),
            event(50, EventKind::Deleted, "old", false),
        ];
        let s = startups(&ev, 8);
        assert_eq!(s.get("a"), Some(&(10, Some(30))));
        assert_eq!(s.get("b"), Some(&(20, None)));
        assert!(!s.contains_key("old"), "{s:?}");
        let live = live_pods(&ev);
        assert_eq!(live.keys().cloned().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn open_watches_sum_by_resource_and_subtract_the_baseline() {
        let text = r#"apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 2
apiserver_longrunning_requests{component="apiserver",group="",resource="nodes",scope="resource",subresource="",verb="WATCH",version="v1"} 4
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="GET",version="v1"} 9
"#;
        let w = open_watches(text);
        assert_eq!(w, BTreeMap::from([("nodes".to_owned(), 4.0), ("pods".to_owned(), 5.0)]));
        let base = BTreeMap::from([("pods".to_owned(), 4.0), ("services".to_owned(), 1.0)]);
        assert_eq!(gauge_delta(&w, &base), BTreeMap::from([("nodes".to_owned(), 4.0), ("pods".to_owned(), 1.0)]));
    }

    fn window(secs: f64, agent: f64, by_request: &[(&str, f64)]) -> Window {
        Window {
            secs,
            agent,
            agent_watches: 0.0,
            by_request: by_request.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            bench: BTreeMap::new(),
        }
    }

    /// 2 nodes: idle 60 s with 24 requests (0.2/s per node); churn 100 s with 2,020
    /// requests for 50 pods started and 50 stopped: (2,020 − 0.4 × 100) / 50 = 39.6 a pod.
    #[test]
    fn the_model_scales_idle_by_nodes_and_churn_by_pod_lifecycles() {
        let base = window(20.0, 0.0, &[("PUT leases", 20.0)]);
        let run = AgentRun {
            label: "swiftlet".into(),
            nodes: 2,
            spread: BTreeMap::from([("n1".into(), 3), ("n2".into(), 3)]),
            startup: vec![1, 2],
            idle: Some(Phase {
                window: window(60.0, 24.0, &[("PUT leases", 60.0 + 24.0)]),
                watches: BTreeMap::from([("pods".into(), 2.0), ("nodes".into(), 2.0)]),
                bytes_up: 1200,
                bytes_down: 6000,
                started: 0,
                stopped: 0,
            }),
            churn: Some(Phase {
                window: window(100.0, 2020.0, &[("PUT leases", 100.0 + 40.0), ("PATCH pods/status", 1980.0)]),
                watches: BTreeMap::new(),
                bytes_up: 2000 + 100_000,
                bytes_down: 10_000 + 500_000,
                started: 50,
                stopped: 50,
            }),
        };
        let p = PerNode::of(&run, &base).unwrap();
        assert!((p.idle_total - 0.2).abs() < 1e-9, "{p:?}");
        assert!((p.per_pod_total - 39.6).abs() < 1e-9, "{p:?}");
        assert!((p.idle_split["PUT leases"] - 0.2).abs() < 1e-9, "{p:?}");
        assert!((p.per_pod_split["PATCH pods/status"] - 39.6).abs() < 1e-9, "{p:?}");
        assert!(!p.per_pod_split.contains_key("PUT leases"), "{p:?}");
        assert!((p.idle_bytes - 60.0).abs() < 1e-9 && (p.per_pod_bytes - 12_000.0).abs() < 1e-6, "{p:?}");
        assert_eq!(p.watches, BTreeMap::from([("nodes".to_owned(), 1.0), ("pods".to_owned(), 1.0)]));
        assert!((p.pods - 3.0).abs() < 1e-9);
        let f = p.fleet(5000, 10.0);
        assert!((f.idle_total - 1000.0).abs() < 1e-6 && (f.churn_total - 396.0).abs() < 1e-6, "{f:?}");
        assert!((f.watches["pods"] - 5000.0).abs() < 1e-9);
        assert!((f.idle_bytes - 300_000.0).abs() < 1e-6 && (f.churn_bytes - 120_000.0).abs() < 1e-6);
        // No churn measured: no model.
        assert_eq!(PerNode::of(&AgentRun { churn: None, ..run.clone() }, &base), None);
        let (text, md) = render(
            &ClusterArgs {
                bed: BedArgs::default(),
                nodes: 2,
                replicas: 6,
                churn_cycles: 1,
                idle_secs: 60,
                other_agent: "none".into(),
                fleet_nodes: 5000,
                fleet_pods_per_node: 110,
                fleet_churn: 10.0,
            },
            &base,
            &[run],
        );
        assert!(text.contains("idle fleet: requests/s") && text.contains("1000"), "{text}");
        assert!(md.contains("### Model: 5000 nodes × 110 pods"), "{md}");
    }

    #[test]
    fn the_controllers_share_of_the_churn_is_left_out() {
        let t = Instant::now();
        let reading = |events: f64, patches: f64| Reading {
            counters: Counters {
                node_requests: 0.0,
                node_watches: 0.0,
                by_request: BTreeMap::from([("POST events".to_owned(), events), ("PATCH events".to_owned(), patches)]),
            },
            at: t,
        };
        // 8 started, 8 stopped, 4 scales: 28 controller events; 20 POSTed in the window.
        let share = controllers_share(&reading(100.0, 0.0), &reading(120.0, 30.0), 8, 8, 4);
        let get = |k: &str| share.iter().find(|(key, _)| key == k).map(|(_, v)| *v);
        assert_eq!(get("POST events"), Some(20.0));
        assert_eq!(get("PATCH events"), Some(8.0));
        assert_eq!((get("POST pods"), get("POST pods/binding"), get("DELETE pods")), (Some(8.0), Some(8.0), Some(8.0)));
        assert_eq!(get("PUT deployments/scale"), Some(4.0));
        assert!(controllers_only("PUT replicasets/status") && controllers_only("LIST limitranges"));
        assert!(!controllers_only("PATCH pods/status") && !controllers_only("GET /metrics"));
    }

    #[test]
    fn the_deployment_spreads_over_the_bench_nodes_only() {
        let nodes = vec![node_name("swiftlet", 1), node_name("swiftlet", 2)];
        let d = deployment("ns", 6, &nodes);
        assert_eq!(d["spec"]["replicas"], 6);
        let terms = &d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0];
        assert_eq!(terms["values"], json!(["swiftlet-bench-fleet-swiftlet-1", "swiftlet-bench-fleet-swiftlet-2"]));
        assert_eq!(d["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["maxSkew"], 1);
        assert!(node_name("kubelet", 3).starts_with(NODE_PREFIX));
    }

    #[test]
    fn agents_in_nodes_get_the_systemd_driver_and_their_own_paths() {
        let sw = AgentKind { label: "swiftlet".into(), binary: PathBuf::from("/b/swiftlet"), swiftlet: true };
        let kl = AgentKind { label: "kubelet".into(), binary: PathBuf::from("/b/kubelet"), swiftlet: false };
        let c = agent_config(&sw, 24);
        assert!(c.contains("cgroupDriver: systemd\n") && c.contains("maxPods: 110\n") && !c.contains("failCgroupV1"));
        assert!(c.contains(&format!("key: {BENCH_TAINT}")));
        assert!(
            agent_config(&kl, 300).contains("failCgroupV1: false\nmaxPods: 300\n")
                || agent_config(&kl, 300).contains("maxPods: 300\nfailCgroupV1: false\n")
        );
        let cmd = agent_command(&kl, 2, "10.231.77.12");
        assert_eq!(cmd[0], "/usr/local/bin/kubelet-bench");
        assert!(cmd.contains(&"--hostname-override=swiftlet-bench-fleet-kubelet-2".to_owned()), "{cmd:?}");
        assert!(cmd.contains(&"--node-ip=10.231.77.12".to_owned()));
        assert!(cmd.contains(&format!("--root-dir={NODE_DIR}/kubelet/root")));
    }
}
