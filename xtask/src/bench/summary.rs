//! `cargo xtask bench` (or `bench all`): one command, one table. Every figure the issues
//! set a target for, for swiftlet and — with `--other-agent PATH`, or `--other-agent
//! upstream` for the upstream kubelet built into `target/upstream/` — for another
//! kubelet-compatible node agent under the same conditions, in alternating rounds, with
//! the ratio swiftlet ÷ the other agent from the same run, the runtime's own floor where
//! one applies and a verdict per row (targets: [`super::verdict`]).
//!
//! One release build, one test bed, then `--rounds` rounds (2 with another agent, 1
//! alone), each of:
//! 1. **The runtime's own floor** (no agent running): `RunPodSandbox`, `CreateContainer`
//!    and `StartContainer` of a one-container busybox pod straight over CRI, timed from the
//!    first request to the last answer (`--cri-runs`, after one unmeasured warm-up; each
//!    pod removed before the next), then, for each burst size, the runtime's own burst:
//!    as many pods requested at once with at most the agent's default
//!    `--runtime-start-concurrency` in flight. The configs are a kubelet's for such a pod
//!    (sandbox seccomp `RuntimeDefault`, the managed `/etc/hosts` and termination-log
//!    mounts), so the runtime does the work it does for the agents' pods. The same
//!    minutes are the API server's baseline: kube-apiserver's `/metrics` read before and
//!    after, once the namespaces of the round before are gone ([`super::apiload`]).
//! 2. **swiftlet, then the other agent**, each joined as a node of its own to the test
//!    bed's real control plane (kube-apiserver, controller-manager and scheduler v1.37.2,
//!    brought up if they are not) by TLS bootstrap, a namespace of its own ([`Cluster`];
//!    the same `KubeletConfiguration` and the upstream flags for both agents), the
//!    bench's own watch on the pods through the API server as the cluster admin
//!    ([`super::watch`]):
//!    - *single pod*: `--single` times (after one warm-up), one API pod (a sleeping
//!      busybox) is created and the bench waits for its watch to show phase `Running`;
//!      create → Running is from just before the create request to the arrival of that
//!      event. The pod is deleted and the node quiet again before the next.
//!    - *bursts* (`--bursts`, 30 and 100): that many pods created back to back as fast as
//!      the API server answers; create → Running per pod, as above; over the largest,
//!      the agent's API requests. The last burst's pods stay for the next steps.
//!    - *idle*: 10 s after the last burst runs, the agent's CPU over `--idle-secs`, its
//!      API requests over the same window, `perf record --call-graph dwarf -p <agent>` over it (when
//!      `perf` is installed) and, at its end, its RSS with `/proc/<pid>/smaps_rollup`
//!      and `status` kept.
//!    - *scrape cost*: as `bench scrape`, `--scrapes` per endpoint on a kept-alive
//!      connection once `/stats/summary` has CPU rates (profiled as the idle window).
//!    - *exit detection*: `--kills` containers (one per pod) killed with SIGKILL, one at a
//!      time; kill → the first watch event showing the container stopped or restarted.
//!      For swiftlet also kill → the pod status computed in the agent (its `pod_status`
//!      records, as `bench pleg`).
//!
//!    Rounds alternate the agents (floor, swiftlet, other, floor, swiftlet, other, …) so
//!    that the host's drift falls on both; each agent's figures, and the floor's, are
//!    pooled over the rounds (latencies and scrapes together, idle CPU and RSS averaged,
//!    API windows summed).
//! 3. **Eviction** (swiftlet, once; `--evictions` runs): `bench eviction`'s kernel-signal
//!    mode. The other agent is not measured there: upstream derives
//!    `allocatableMemory.available` from the node's allocatable memory, not from the pods
//!    cgroup's limit, so the bench's small pods cgroup cannot put it under pressure short of
//!    filling the machine.
//!
//! The report goes to stdout and `target/bench/summary.md`; beside it each agent's log per
//! round (`<label>-round<k>-agent.log`), its idle and scrape profiles
//! (`<label>-round<k>-idle.perf.data`, `-scrape.perf.data`; `perf report -i <file>`) and
//! its memory at rest (`<label>-round<k>.smaps_rollup`, `.status`); a row that misses its
//! target names the files to look at. The control plane's logs are the test bed's, under
//! its cluster directory. With the defaults the whole takes about 7 minutes for swiftlet
//! alone on the 2-core machine, about 14 with the upstream kubelet (a default round took
//! 6.0 minutes: the floor 0.8, swiftlet 2.0, the kubelet 3.2; then the evictions; builds
//! not counted).

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

use crate::{
    Ctx,
    bench::{
        agent::{self, BenchAgent, NAMESPACE, PlegMode},
        apiload::{self, Window},
        apiserver::{ApiClient, BENCH_LABEL},
        burstcpu,
        cluster::Cluster,
        eviction::{self, Binaries},
        latency::{self, Kill, Summary},
        pleg::{self, Pauses},
        procfs::{self, CpuSample},
        profile::{self, Perf},
        records::RecordStream,
        report::{self, Environment},
        scrape::{self, ENDPOINTS, EndpointFigures},
        verdict, watch,
    },
    cleanup,
    cri::{self, CriClient},
    images::BUSYBOX_IMAGE,
    testbed::Layout,
    upstream::Upstream,
};

pub const MIB: f64 = 1024.0 * 1024.0;
/// How long to let the agent settle before the idle window.
const SETTLE: Duration = Duration::from_secs(10);
/// The shortest baseline window of the control plane's requests.
const BASELINE_MIN: Duration = Duration::from_secs(30);
/// How long to wait for a kill to show in the API.
const KILL_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct AllArgs {
    /// Another node agent to measure under the same conditions (kubelet-compatible flags:
    /// --config, --bootstrap-kubeconfig, --kubeconfig, --container-runtime-endpoint,
    /// --root-dir, --cert-dir, --hostname-override); `upstream`: the upstream
    /// kubelet of `target/upstream/` (built by `cargo xtask upstream build` if missing).
    #[arg(long, value_name = "PATH|upstream")]
    pub other_agent: Option<PathBuf>,
    /// Rounds (each: the runtime's floor, swiftlet, the other agent); figures are pooled
    /// over them. Default: 2 with --other-agent, 1 alone.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub rounds: Option<u32>,
    /// Single-pod start-ups per agent and round (after one warm-up). Default: 10 per
    /// round with --other-agent, 15 alone.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub single: Option<u32>,
    /// Burst sizes, comma-separated; the pods of the last one stay for the idle, scrape and
    /// exit measurements. At most 200 (the test bed's pod subnet is a /24).
    #[arg(long, value_delimiter = ',', default_value = "30,100", value_parser = clap::value_parser!(u32).range(1..=200))]
    pub bursts: Vec<u32>,
    /// Sandbox + container starts straight over CRI (the runtime's own time), per round.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub cri_runs: u32,
    /// Containers killed (one per pod of the last burst) for exit detection, per agent and
    /// round. Default: 10 per round with --other-agent, 20 alone.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub kills: Option<u32>,
    /// Measured scrapes per endpoint (1.5 s apart), per agent and round. Default: 3 per
    /// round with --other-agent, 5 alone.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub scrapes: Option<u32>,
    /// Evictions measured (kernel signals; 0 skips them).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub evictions: u32,
    /// Seconds of the idle CPU window.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(5..=600))]
    pub idle_secs: u64,
    #[command(flatten)]
    pub bed: super::BedArgs,
}

impl Default for AllArgs {
    fn default() -> Self {
        Self {
            other_agent: None,
            rounds: None,
            single: None,
            bursts: vec![30, 100],
            cri_runs: 10,
            kills: None,
            scrapes: None,
            evictions: 5,
            idle_secs: 30,
            bed: super::BedArgs::default(),
        }
    }
}

impl AllArgs {
    /// `with_other` with another agent, `alone` without.
    fn by_mode(&self, given: Option<u32>, with_other: u32, alone: u32) -> u32 {
        given.unwrap_or(if self.other_agent.is_some() { with_other } else { alone })
    }

    pub fn rounds(&self) -> u32 {
        self.by_mode(self.rounds, 2, 1)
    }

    pub fn single(&self) -> u32 {
        self.by_mode(self.single, 10, 15)
    }

    pub fn kills(&self) -> u32 {
        self.by_mode(self.kills, 10, 20)
    }

    pub fn scrapes(&self) -> u32 {
        self.by_mode(self.scrapes, 3, 5)
    }
}

// ---------------------------------------------------------------------------------------
// Figures.

/// One idle window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Idle {
    pub pods: usize,
    pub cores: f64,
    pub rss_bytes: u64,
}

/// What the bench kept of an agent to explain its figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Files {
    /// The agent's log of each round.
    pub logs: Vec<PathBuf>,
    /// `perf record` of each idle window.
    pub idle_perf: Vec<PathBuf>,
    /// `perf record` of each scrape phase.
    pub scrape_perf: Vec<PathBuf>,
    /// `smaps_rollup` and `status` at the end of each idle window.
    pub memory: Vec<PathBuf>,
}

/// What one agent measured, pooled over the rounds (filled as it goes: a failure keeps
/// what came before).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentFigures {
    pub label: String,
    /// Rounds begun.
    pub rounds: usize,
    /// Single pod: create → Running (ns).
    pub single: Vec<u64>,
    /// Burst size → create → Running of each pod (ns).
    pub bursts: Vec<(usize, Vec<u64>)>,
    /// Each round's idle window.
    pub idle: Vec<Idle>,
    pub scrapes: Vec<EndpointFigures>,
    /// Kill → the API shows it (ns).
    pub exit_api: Vec<u64>,
    /// Kill → pod status computed in the agent (ns; swiftlet's records only).
    pub exit_agent: Vec<u64>,
    pub eviction: Option<eviction::ModeResult>,
    /// The API server's counts over each idle window.
    pub api_idle: Vec<Window>,
    /// The API server's counts over each largest burst (create of the first pod → the
    /// last one Running), and that burst's size.
    pub api_burst: Vec<Window>,
    pub api_burst_pods: usize,
    /// Where the machine's CPU went in each burst (create of the first pod → the last one
    /// Running), by burst size, every round's.
    pub burst_cpu: Vec<(usize, burstcpu::Split)>,
    pub files: Files,
    /// Why the measurement stopped early, if it did.
    pub failed: Option<String>,
}

impl AgentFigures {
    /// The idle windows as one: CPU and RSS averaged over the rounds.
    pub fn pooled_idle(&self) -> Option<Idle> {
        let n = self.idle.len();
        (n > 0).then(|| Idle {
            pods: self.idle[0].pods,
            cores: self.idle.iter().map(|i| i.cores).sum::<f64>() / n as f64,
            rss_bytes: self.idle.iter().map(|i| i.rss_bytes).sum::<u64>() / n as u64,
        })
    }

    /// Every pod's create → Running of the bursts of `size`, over the rounds.
    pub fn burst(&self, size: usize) -> Option<&[u64]> {
        self.bursts.iter().find(|(n, _)| *n == size).map(|(_, l)| l.as_slice())
    }

    pub fn add_burst(&mut self, size: usize, latencies: Vec<u64>) {
        match self.bursts.iter_mut().find(|(n, _)| *n == size) {
            Some((_, l)) => l.extend(latencies),
            None => self.bursts.push((size, latencies)),
        }
    }

    pub fn add_scrapes(&mut self, figures: EndpointFigures) {
        match self.scrapes.iter_mut().find(|e| e.endpoint.path == figures.endpoint.path) {
            Some(e) => e.scrapes.extend(figures.scrapes),
            None => self.scrapes.push(figures),
        }
    }
}

/// The runtime's own burst ([`runtime_burst`]), pooled over the rounds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeBurst {
    pub pods: usize,
    pub in_flight: usize,
    pub latencies: Vec<u64>,
    /// Where the machine's CPU went in each round's burst (first request → last start).
    pub cpu: Vec<burstcpu::Split>,
}

/// Everything the summary shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// Rounds begun.
    pub rounds: usize,
    /// The runtime's own sandbox + container start (ns), every round's.
    pub runtime_start: Vec<u64>,
    /// The runtime's own bursts, straight over CRI, one per size: the burst's size, how
    /// many starts were in flight at most, and each pod's burst start → container
    /// started (ns), every round's.
    pub runtime_bursts: Vec<RuntimeBurst>,
    /// The API server's counts while the floor was measured (the control plane alone).
    pub api_baseline: Vec<Window>,
    /// Whether `perf` was there to profile the agents.
    pub perf: bool,
    pub swiftlet: AgentFigures,
    pub other: Option<AgentFigures>,
}

impl Figures {
    pub fn runtime_burst(&self, size: usize) -> Option<&RuntimeBurst> {
        self.runtime_bursts.iter().find(|b| b.pods == size)
    }

    pub fn add_runtime_burst(&mut self, burst: RuntimeBurst) {
        match self.runtime_bursts.iter_mut().find(|b| b.pods == burst.pods) {
            Some(b) => {
                b.latencies.extend(burst.latencies);
                b.cpu.extend(burst.cpu);
            }
            None => self.runtime_bursts.push(burst),
        }
    }
}

pub(super) fn summary(values: &[u64]) -> Option<Summary> {
    Summary::of(values.iter().copied())
}

pub(super) fn opt_ms(v: Option<u64>) -> String {
    v.map_or_else(|| "—".to_owned(), report::fmt_ms)
}

// ---------------------------------------------------------------------------------------
// The runtime's own start.

/// The agent's default `--runtime-start-concurrency` (twice the CPUs, at least 4), which
/// the runtime's own burst keeps to.
fn default_start_concurrency() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (2 * cpus).max(4)
}

/// Times `n` sandbox + container starts straight over CRI (after one warm-up), removing
/// each pod before the next. Sandboxes are in the bench namespace and their cgroups under
/// `/<tag>`, both removed at the end whatever happens.
async fn runtime_start(cri: &mut CriClient, n: usize) -> Result<Vec<u64>> {
    let tag = format!("swiftlet-bench-{}-cri", std::process::id());
    let dir = std::env::temp_dir().join(&tag);
    let result = async {
        let mut out = Vec::with_capacity(n);
        for i in 0..=n {
            let (sandbox, container) = cri_pod(&tag, &dir, i)?;
            let t0 = Instant::now();
            let id = cri.run_pod_sandbox(sandbox.clone()).await?;
            let started = async {
                let c = cri.create_container(&id, container, sandbox).await?;
                cri.start_container(&c).await
            }
            .await;
            let took = t0.elapsed();
            cri.stop_pod_sandbox(&id).await?;
            cri.remove_pod_sandbox(&id).await?;
            started?;
            if i > 0 {
                out.push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
            }
        }
        anyhow::Ok(out)
    }
    .await;
    let removed = remove_cri_pods(cri, &tag, &dir).await;
    let out = result?;
    removed?;
    Ok(out)
}

/// The CRI configs of the bench's own pod `i` (sandbox and its one sleeping container),
/// logging under `dir`, in cgroups under `/<tag>`. Shaped as a kubelet asks for a plain
/// pod, so that the runtime does the same work for it: the sandbox under the
/// `RuntimeDefault` seccomp profile (upstream always sets it on the sandbox, and runc
/// compiling it is a good part of a sandbox's start), the container with the kubelet's
/// managed `/etc/hosts` and its termination-message file mounted.
fn cri_pod(tag: &str, dir: &Path, i: usize) -> Result<(cri::PodSandboxConfig, cri::ContainerConfig)> {
    let uid = format!("{tag}-{i:03}");
    let log_dir = dir.join(&uid);
    fs::create_dir_all(&log_dir)?;
    let hosts = log_dir.join("etc-hosts");
    fs::write(&hosts, format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n10.88.0.2\tcri-{i:03}\n"))?;
    let termination_log = log_dir.join("termination-log");
    fs::write(&termination_log, "")?;
    let mount = |container_path: &str, host: &Path| cri::Mount {
        container_path: container_path.into(),
        host_path: host.display().to_string(),
        readonly: false,
    };
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("cri-{i:03}"),
            uid: uid.clone(),
            namespace: NAMESPACE.into(),
            attempt: 0,
        }),
        hostname: format!("cri-{i:03}"),
        log_directory: log_dir.display().to_string(),
        port_mappings: Vec::new(),
        labels: HashMap::from([("swiftlet.io/xtask".to_owned(), "bench".to_owned())]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/{tag}/kubepods/besteffort/pod{uid}"),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                seccomp: Some(cri::SecurityProfile { profile_type: 0 }),
            }),
        }),
    };
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: "c0".into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: BUSYBOX_IMAGE.into() }),
        command: vec!["sh".into(), "-c".into(), pleg::SLEEPER.into()],
        args: Vec::new(),
        mounts: vec![mount("/etc/hosts", &hosts), mount("/dev/termination-log", &termination_log)],
        log_path: "c0.log".into(),
    };
    Ok((sandbox, container))
}

/// Removes what a CRI measurement tagged `tag` left: its sandboxes, cgroups and log folder.
async fn remove_cri_pods(cri: &mut CriClient, tag: &str, dir: &Path) -> Result<()> {
    let removed = agent::remove_bench_sandboxes(cri).await;
    for h in cleanup::cgroup_hierarchies() {
        for d in cleanup::cgroup_tree(&h.join(tag)) {
            let _ = fs::remove_dir(&d);
        }
    }
    let _ = fs::remove_dir_all(dir);
    removed.map(drop)
}

/// The runtime's own `n`-pod burst: every pod's sandbox + container start requested at once
/// straight over CRI, with at most `in_flight` sandbox starts and `in_flight` container
/// create + start pairs running (the agent's default limit); each pod's burst start →
/// container started (ns). Everything is removed again.
async fn runtime_burst(cri: &CriClient, n: usize, in_flight: usize) -> Result<RuntimeBurst> {
    let tag = format!("swiftlet-bench-{}-cri-burst", std::process::id());
    let dir = std::env::temp_dir().join(&tag);
    let result = async {
        let pods = (0..n).map(|i| cri_pod(&tag, &dir, i)).collect::<Result<Vec<_>>>()?;
        let sandboxes = Arc::new(tokio::sync::Semaphore::new(in_flight));
        let containers = Arc::new(tokio::sync::Semaphore::new(in_flight));
        let cpu_before = burstcpu::Snapshot::take();
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (sandbox, container) in pods {
            let (mut cri, sandboxes, containers) = (cri.clone(), sandboxes.clone(), containers.clone());
            tasks.spawn(async move {
                let id = {
                    let _permit = sandboxes.acquire().await?;
                    cri.run_pod_sandbox(sandbox.clone()).await?
                };
                let _permit = containers.acquire().await?;
                let c = cri.create_container(&id, container, sandbox).await?;
                cri.start_container(&c).await?;
                anyhow::Ok(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX))
            });
        }
        let mut latencies = Vec::with_capacity(n);
        while let Some(r) = tasks.join_next().await {
            latencies.push(r??);
        }
        let cpu = burstcpu::Split::between(&cpu_before, &burstcpu::Snapshot::take(), None);
        anyhow::Ok(RuntimeBurst { pods: n, in_flight, latencies, cpu: vec![cpu] })
    }
    .await;
    let mut cri = cri.clone();
    let removed = remove_cri_pods(&mut cri, &tag, &dir).await;
    let out = result?;
    removed?;
    // Removing 100 pods leaves the runtime and the kernel work to finish (snapshots,
    // network namespaces): let that end before an agent is measured.
    wait_machine_quiet().await;
    Ok(out)
}

/// Waits (at most a minute) until the machine has been under 10 % busy for a second.
async fn wait_machine_quiet() {
    const QUIET: f64 = 0.10;
    let deadline = Instant::now() + Duration::from_mins(1);
    let mut last = None;
    while Instant::now() < deadline {
        let before = procfs::machine_cpu_times();
        tokio::time::sleep(Duration::from_secs(1)).await;
        last = before.zip(procfs::machine_cpu_times()).and_then(|(b, a)| procfs::busy_share(&b, &a));
        if last.is_none_or(|b| b < QUIET) {
            return;
        }
    }
    eprintln!("bench: the machine is still {:.0} % busy after a minute; measuring anyway", last.unwrap_or(0.0) * 100.0);
}

// ---------------------------------------------------------------------------------------
// One agent.

/// What is being measured, to publish and to undo however the bench ends.
#[derive(Debug, Default)]
struct Session {
    cluster: Option<Cluster>,
    env: Option<Environment>,
    figures: Figures,
    /// The other agent is being measured (a failure is its own, not swiftlet's).
    measuring_other: bool,
}

/// Which agent.
#[derive(Debug, Clone)]
enum Which {
    Swiftlet,
    Other(PathBuf),
}

fn label_of(which: &Which) -> String {
    match which {
        Which::Swiftlet => "swiftlet".to_owned(),
        Which::Other(p) => p.file_name().and_then(|n| n.to_str()).unwrap_or("other").to_owned(),
    }
}

fn sleeper(cluster: &Cluster, name: &str) -> Value {
    cluster.pod(name, pleg::SLEEPER, false)
}

/// One pod: create → Running, then deleted and the node quiet again.
async fn single_pod(cluster: &mut Cluster, cri: &mut CriClient, name: &str) -> Result<u64> {
    let names = [name.to_owned()];
    let sent = cluster.create_pods(&[sleeper(cluster, name)]).await?;
    let running = cluster.wait_running(&names, &sent, Duration::from_mins(1)).await?;
    cluster.delete_and_wait(cri, &names, Duration::from_mins(1)).await?;
    Ok(running[0].saturating_sub(sent[0]))
}

/// Where one agent's round writes and what it reads the API server with.
struct RoundCtx<'a> {
    round: usize,
    /// `target/bench/`.
    dir: &'a Path,
    /// The bench's reader of kube-apiserver's `/metrics`.
    metrics: &'a mut ApiClient,
}

#[expect(clippy::too_many_arguments, reason = "one agent's measurement: what it runs against and where it writes")]
async fn measure_agent(
    which: &Which,
    binaries: &Binaries,
    layout: &Layout,
    cri: &mut CriClient,
    args: &AllArgs,
    containerd_pid: Option<i32>,
    slot: &mut Option<Cluster>,
    f: &mut AgentFigures,
    rc: RoundCtx<'_>,
) -> Result<()> {
    let label = label_of(which);
    f.label.clone_from(&label);
    f.rounds = rc.round;
    let stem = format!("{label}-round{}", rc.round);
    let largest = args.bursts.iter().copied().max().unwrap_or(1) as usize;
    let binary = match which {
        Which::Swiftlet => binaries.swiftlet.clone(),
        Which::Other(p) => p.clone(),
    };
    let mut agent = BenchAgent::named(&label, PlegMode::Evented, &binary, &layout.endpoint(), largest + 10)?
        // The host's disks are the node's: a nearly full developer disk must not refuse pods.
        .with_config("evictionHard:\n  memory.available: 100Mi\nfailSwapOn: false\n")
        .with_cluster_dns()
        .with_drain_timeout(Duration::from_mins(1));
    if matches!(which, Which::Other(_)) {
        agent = agent.other_agent();
    }
    let c = slot.insert(Cluster::prepare(&binaries.api, agent)?);
    c.start().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    eprintln!("bench: {label}: single-pod start-up, 1 warm-up + {}", args.single());
    single_pod(c, cri, "warmup").await.context("warm-up pod")?;
    for i in 0..args.single() {
        f.single.push(single_pod(c, cri, &format!("single-{i:03}")).await?);
    }
    eprintln!("bench: {label}: single pod p50 {} (all rounds)", opt_ms(summary(&f.single).map(|s| s.p50)));

    let mut last_names = Vec::new();
    for (k, &size) in args.bursts.iter().enumerate() {
        let size = size as usize;
        let names: Vec<String> = (0..size).map(|j| format!("burst{size}-{j:03}")).collect();
        eprintln!("bench: {label}: {size}-pod burst");
        let pods: Vec<Value> = names.iter().map(|n| sleeper(c, n)).collect();
        let before = if size == largest { Some(apiload::read(rc.metrics).await?) } else { None };
        let cpu_before = burstcpu::Snapshot::take();
        let sent = c.create_pods(&pods).await?;
        let timeout = Duration::from_mins(2) + Duration::from_millis(500) * u32::try_from(size).unwrap_or(u32::MAX);
        let running = c.wait_running(&names, &sent, timeout).await?;
        let cpu = burstcpu::Split::between(&cpu_before, &burstcpu::Snapshot::take(), c.agent.pid());
        eprintln!(
            "bench: {label}: {size}-pod burst, CPU-seconds in {:.1} s: agent {:.2}, control plane {:.2}, runtime {:.2}, \
             pods {:.2}, bench {:.2}, other {:.2}",
            cpu.wall,
            cpu.agent,
            cpu.control_plane,
            cpu.runtime,
            cpu.pods,
            cpu.bench,
            cpu.other()
        );
        f.burst_cpu.push((size, cpu));
        if let Some(before) = before {
            let after = apiload::read(rc.metrics).await?;
            let w = Window::between(&before, &after, &[("POST pods", size as f64)]);
            eprintln!(
                "bench: {label}: {size}-pod burst, API requests of the agent: {:.0} ({} req/s)",
                w.agent,
                apiload::fmt_rate(w.agent_rate())
            );
            f.api_burst.push(w);
            f.api_burst_pods = size;
        }
        let lat: Vec<u64> = running.iter().zip(&sent).map(|(r, s)| r.saturating_sub(*s)).collect();
        eprintln!("bench: {label}: {size}-pod burst p99 {}", opt_ms(summary(&lat).map(|s| s.p99)));
        f.add_burst(size, lat);
        if k + 1 < args.bursts.len() {
            c.delete_and_wait(cri, &names, Duration::from_mins(3)).await?;
        } else {
            last_names = names;
        }
    }
    let sandboxes = agent::ready_bench_sandboxes(cri).await?;
    ensure!(
        sandboxes.len() == last_names.len(),
        "{} ready bench sandboxes for {} pods",
        sandboxes.len(),
        last_names.len()
    );

    // Idle.
    eprintln!("bench: {label}: idle, {} pods: settling {SETTLE:?}, then {} s", last_names.len(), args.idle_secs);
    tokio::time::sleep(SETTLE).await;
    let pid = c.agent.pid().context("agent pid")?;
    let api_before = apiload::read(rc.metrics).await?;
    let perf = Perf::start(pid, &rc.dir.join(format!("{stem}-idle.perf.data")));
    let before = CpuSample::take(pid)?;
    let window_end = Instant::now() + Duration::from_secs(args.idle_secs);
    while let Some(left) = window_end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
        tokio::time::sleep(left.min(Duration::from_secs(5))).await;
        agent::ensure_undisturbed(cri, &sandboxes).await?;
    }
    c.agent.ensure_alive()?;
    let (cpu, wall) = CpuSample::take(pid)?.since(&before);
    let (rss_bytes, _) = procfs::memory(pid)?;
    let api_after = apiload::read(rc.metrics).await?;
    if let Some(p) = perf {
        f.files.idle_perf.extend(p.finish().await);
    }
    match profile::memory_breakdown(pid, rc.dir, &stem) {
        Ok(files) => f.files.memory.extend(files),
        Err(e) => eprintln!("bench: {label}: memory breakdown: {e:#}"),
    }
    let idle = Idle { pods: last_names.len(), cores: cpu / wall, rss_bytes };
    let api = Window::between(&api_before, &api_after, &[]);
    eprintln!(
        "bench: {label}: idle {:.4} cores, RSS {:.1} MiB, {} API requests/s",
        idle.cores,
        rss_bytes as f64 / MIB,
        apiload::fmt_rate(api.agent_rate())
    );
    f.idle.push(idle);
    f.api_idle.push(api);

    // Scrapes.
    if !scrape::wait_for_stats(&mut c.agent, last_names.len()).await? {
        eprintln!("bench: {label}: WARNING: scraping before /stats/summary has CPU rates for every pod");
    }
    let perf = Perf::start(pid, &rc.dir.join(format!("{stem}-scrape.perf.data")));
    for endpoint in ENDPOINTS {
        let scrapes = scrape::scrape_endpoint(&mut c.agent, containerd_pid, &endpoint, args.scrapes() as usize)
            .await
            .with_context(|| format!("scraping {}", endpoint.path))?;
        f.add_scrapes(EndpointFigures { endpoint, scrapes });
    }
    if let Some(p) = perf {
        f.files.scrape_perf.extend(p.finish().await);
    }
    agent::ensure_undisturbed(cri, &sandboxes).await?;

    // Exit detection.
    let kills = (args.kills() as usize).min(last_names.len());
    eprintln!("bench: {label}: exit detection, {kills} kills");
    let (api, agent_side) = exit_detection(c, cri, &last_names[..kills], matches!(which, Which::Swiftlet)).await?;
    f.exit_api.extend(api);
    f.exit_agent.extend(agent_side);
    c.delete_and_wait(cri, &last_names, Duration::from_mins(3)).await?;
    Ok(())
}

/// Kills container `c0` of each pod once, one at a time after a pseudo-random 0–1 s
/// pause; returns kill → API latencies and (with the agent's records) kill → status
/// computed in the agent.
async fn exit_detection(
    c: &mut Cluster,
    cri: &mut CriClient,
    names: &[String],
    records: bool,
) -> Result<(Vec<u64>, Vec<u64>)> {
    let events = c.watch()?.events()?;
    let mut targets = Vec::new();
    for name in names {
        let e = watch::latest(&events, name).with_context(|| format!("no watch event of {name}"))?;
        let ctr = e.container("c0").with_context(|| format!("{name} has no container c0 in its status"))?;
        let id = ctr.id.clone().with_context(|| format!("{name}/c0 has no container id"))?;
        let status = cri.container_status_verbose(&id).await?;
        let pid = pleg::pid_from_info(&status.info).with_context(|| format!("no pid for container {id}"))?;
        targets.push((name.clone(), e.uid.clone(), id, ctr.restarts, pid));
    }
    // swiftlet's records, from before the first kill.
    let stream = match c.agent.event_socket().filter(|_| records) {
        Some(socket) => Some(RecordStream::connect(&socket).await?),
        None => None,
    };
    let mut pauses = Pauses::new();
    let mut api = Vec::new();
    let mut kills = Vec::new();
    for (name, uid, id, restarts, pid) in targets {
        tokio::time::sleep(Duration::from_millis(pauses.next_ms(1000))).await;
        c.agent.ensure_alive()?;
        if !procfs::in_container(pid, &id) {
            eprintln!("bench: container {id} (pid {pid}) is already gone: not killed");
            continue;
        }
        let t_kill = procfs::monotonic_ns();
        if let Err(e) = pleg::sig_kill(pid) {
            eprintln!("bench: kill({pid}, SIGKILL) of container {id}: {e}");
            continue;
        }
        kills.push(Kill {
            pod_uid: uid,
            container: "c0".into(),
            container_id: id,
            restarts_before: restarts,
            t_kill_ns: t_kill,
        });
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            if let Some(at) = c.watch()?.with_events(|e| watch::exit_seen_at(e, &name, "c0", restarts, t_kill))? {
                api.push(at - t_kill);
                break;
            }
            if Instant::now() > deadline {
                eprintln!("bench: kill of {name}/c0 not seen in the API within {KILL_WAIT:?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let agent_side = match stream {
        Some(stream) => {
            let all = stream.all()?;
            kills.iter().filter_map(|k| latency::outcome(k, &all).kill_to_status_ns).collect()
        }
        None => Vec::new(),
    };
    Ok((api, agent_side))
}

// ---------------------------------------------------------------------------------------
// The run.

pub async fn run(ctx: &Ctx, layout: &Layout, args: &AllArgs) -> Result<()> {
    crate::testbed::require_root()?;
    ensure!(!args.bursts.is_empty(), "--bursts: no burst size");
    let bed_was_up = super::bed_was_up(layout);
    let started = Instant::now();
    let mut session = Session::default();
    let outcome =
        super::until_interrupted(std::pin::pin!(bench(ctx, layout, args, &mut session)), "pods are deleted first")
            .await;
    if let Err(e) = &outcome {
        let agent = if session.measuring_other {
            session.figures.other.get_or_insert_with(AgentFigures::default)
        } else {
            &mut session.figures.swiftlet
        };
        agent.failed = Some(format!("{e:#}"));
    }
    let cleanup = super::said(end_agent(&mut session, ctx, layout).await);
    let published = match &session.env {
        Some(env) => publish(ctx, &session.figures, env, args),
        None => Ok(()),
    };
    eprintln!("bench: took {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    super::finish(ctx, layout, bed_was_up || args.bed.keep_testbed, outcome, cleanup, published).await
}

/// Ends the agent's cluster, if any, and keeps its log as `<label>-round<k>-agent.log`
/// (in the agent's figures' files).
async fn end_agent(session: &mut Session, ctx: &Ctx, layout: &Layout) -> Result<()> {
    let Some(label) = session.cluster.as_ref().map(|c| c.agent.label.clone()) else { return Ok(()) };
    let ended = eviction::end_cluster(&mut session.cluster, ctx, layout).await;
    let f = &mut session.figures;
    // By the agent being measured: another build of swiftlet has swiftlet's label.
    let figures = if session.measuring_other {
        f.other.as_mut().filter(|o| o.label == label)
    } else {
        (f.swiftlet.label == label).then_some(&mut f.swiftlet)
    };
    if let Some(a) = figures {
        let dir = pleg::bench_dir(ctx);
        let kept = dir.join(format!("{label}-agent.log"));
        let to = dir.join(format!("{label}-round{}-agent.log", a.rounds));
        if fs::rename(&kept, &to).is_ok() {
            a.files.logs.push(to);
        }
    }
    ended
}

async fn bench(ctx: &Ctx, layout: &Layout, args: &AllArgs, session: &mut Session) -> Result<()> {
    eprintln!("==> bench: test bed and builds");
    let other = args.other_agent.as_deref().map(|p| other_agent(ctx, p)).transpose()?;
    let (binaries, mut cri, env, containerd_pid) =
        eviction::prepare_bench(ctx, layout, args.bed.swiftlet_bin.as_deref()).await?;
    // A row that misses is reported with its profile: perf (Debian's linux-perf) takes it.
    if let Err(e) = crate::apt::ensure(&["linux-perf"]) {
        eprintln!("bench: cannot install linux-perf ({e:#}): rows that miss get no profile");
    }
    session.env = Some(env);
    let dir = pleg::bench_dir(ctx);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    session.figures.perf = profile::perf_available();
    if !session.figures.perf {
        eprintln!("bench: perf is not installed: the agents' CPU is not profiled ({})", profile::PERF_MISSING);
    }
    let mut metrics = binaries.api.client();
    let rounds = args.rounds() as usize;
    let started = Instant::now();
    let at = || format!("{:.1} min in", started.elapsed().as_secs_f64() / 60.0);

    for round in 1..=rounds {
        session.figures.rounds = round;
        eprintln!();
        eprintln!(
            "==> bench: round {round}/{rounds}: the runtime's own floor (and the control plane's API baseline), {}",
            at()
        );
        floor(&mut cri, args, &mut metrics, &mut session.figures).await?;

        eprintln!();
        eprintln!("==> bench: round {round}/{rounds}: swiftlet, {}", at());
        session.measuring_other = false;
        let Session { cluster, figures, .. } = session;
        let rc = RoundCtx { round, dir: &dir, metrics: &mut metrics };
        measure_agent(
            &Which::Swiftlet,
            &binaries,
            layout,
            &mut cri,
            args,
            containerd_pid,
            cluster,
            &mut figures.swiftlet,
            rc,
        )
        .await
        .context("swiftlet")?;
        end_agent(session, ctx, layout).await.context("tearing down swiftlet")?;

        if let Some(path) = &other {
            let which = Which::Other(path.clone());
            if session.figures.other.as_ref().is_some_and(|o| o.failed.is_some()) {
                eprintln!("bench: {} stopped in an earlier round: not measured again", label_of(&which));
                continue;
            }
            eprintln!();
            eprintln!("==> bench: round {round}/{rounds}: {}, {}", label_of(&which), at());
            // The other agent may fail on the way: its figures so far are kept and the
            // report says where it stopped, swiftlet's stand.
            session.measuring_other = true;
            let Session { cluster, figures, .. } = session;
            let f = figures.other.get_or_insert_with(AgentFigures::default);
            let rc = RoundCtx { round, dir: &dir, metrics: &mut metrics };
            if let Err(e) =
                measure_agent(&which, &binaries, layout, &mut cri, args, containerd_pid, cluster, f, rc).await
            {
                eprintln!("bench: {} stopped: {e:#}", label_of(&which));
                f.failed = Some(format!("{e:#}"));
            }
            end_agent(session, ctx, layout).await.context("tearing down the other agent")?;
            session.measuring_other = false;
        }
    }

    if args.evictions > 0 {
        eprintln!();
        eprintln!("==> bench: swiftlet eviction ({} runs), {}", args.evictions, at());
        let r = eviction::measure_mode(
            &binaries,
            layout,
            &mut cri,
            eviction::Mode::Kernel,
            args.evictions as usize,
            &mut session.cluster,
        )
        .await
        .context("eviction");
        if let Ok(r) = &r {
            session.figures.swiftlet.eviction = Some(r.clone());
        }
        eviction::end_cluster(&mut session.cluster, ctx, layout).await.context("tearing down the eviction agent")?;
        r?;
    }
    Ok(())
}

/// One round's floor: the runtime's own start and its own burst of each size, straight
/// over CRI with no agent running; meanwhile the API server's counts of the control plane
/// alone (the baseline of [`apiload`]).
async fn floor(cri: &mut CriClient, args: &AllArgs, metrics: &mut ApiClient, f: &mut Figures) -> Result<()> {
    // The namespace and node of the agent before are being removed by the
    // controller-manager: its requests are not the baseline's.
    wait_bench_namespaces_gone(metrics).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = apiload::read(metrics).await?;
    eprintln!("bench: the runtime's own sandbox + container start ({} runs)", args.cri_runs);
    f.runtime_start.extend(runtime_start(cri, args.cri_runs as usize).await.context("CRI start-up runs")?);
    let mut sizes = args.bursts.clone();
    sizes.sort_unstable();
    sizes.dedup();
    for n in sizes {
        let in_flight = default_start_concurrency();
        eprintln!("bench: the runtime's own {n}-pod burst (at most {in_flight} at a time)");
        let b = runtime_burst(cri, n as usize, in_flight).await.context("CRI burst")?;
        eprintln!("bench: the runtime's own {n}-pod burst p99 {}", opt_ms(summary(&b.latencies).map(|s| s.p99)));
        f.add_runtime_burst(b);
    }
    // A short floor (small bursts) would leave the baseline to a few requests.
    if let Some(left) = BASELINE_MIN.checked_sub(before.at.elapsed()) {
        tokio::time::sleep(left).await;
    }
    let after = apiload::read(metrics).await?;
    let w = Window::between(&before, &after, &[]);
    eprintln!(
        "bench: the control plane alone: {} API requests/s over {:.0} s ({})",
        apiload::fmt_rate(w.others_rate().values().sum()),
        w.secs,
        apiload::fmt_verbs(&apiload::by_verb(&w.others_rate()))
    );
    f.api_baseline.push(w);
    Ok(())
}

/// Waits (at most 2 minutes) until no namespace of a bench is left in the cluster.
async fn wait_bench_namespaces_gone(client: &mut ApiClient) -> Result<()> {
    let deadline = Instant::now() + Duration::from_mins(2);
    loop {
        let (code, list) =
            client.request("GET", &format!("/api/v1/namespaces?labelSelector={BENCH_LABEL}"), None).await?;
        ensure!(code == 200, "listing namespaces: {code}: {list}");
        let left = list["items"].as_array().map_or(0, Vec::len);
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            eprintln!("bench: {left} bench namespace(s) still terminating after 2 minutes; measuring anyway");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What `--other-agent` names: `upstream` is the upstream kubelet of `target/upstream/`
/// (built if it is missing; `./upstream` for a file of that name), anything else a path.
pub(super) fn other_agent(ctx: &Ctx, given: &Path) -> Result<PathBuf> {
    if given != Path::new(UPSTREAM) {
        return pleg::given_binary(given, "--other-agent");
    }
    let upstream = Upstream::new(ctx);
    let kubelet = upstream.bin("kubelet");
    if !kubelet.is_file() {
        eprintln!("bench: {} is missing: building the upstream binaries", kubelet.display());
        upstream.build()?;
    }
    ensure!(kubelet.is_file(), "{} is missing after the upstream build", kubelet.display());
    Ok(kubelet)
}

/// `--other-agent`'s value for the upstream kubelet.
pub const UPSTREAM: &str = "upstream";

fn publish(ctx: &Ctx, f: &Figures, env: &Environment, args: &AllArgs) -> Result<()> {
    report::publish(
        ctx,
        "summary.md",
        "swiftlet benchmark summary",
        env,
        verdict::markdown(f, env, args),
        &verdict::text(f),
        None,
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: AllArgs,
    }

    #[test]
    fn defaults_fit_the_time_budget() {
        let a = Cli::try_parse_from(["x"]).unwrap().args;
        assert_eq!(a, AllArgs::default());
        // Alone: one round, today's counts.
        assert_eq!(
            (a.rounds(), a.single(), a.bursts.clone(), a.kills(), a.scrapes(), a.evictions),
            (1, 15, vec![30, 100], 20, 5, 5)
        );
        // With another agent: 2 rounds of fewer each, as many in all.
        let a = Cli::try_parse_from(["x", "--other-agent", "upstream"]).unwrap().args;
        assert_eq!(a.other_agent.as_deref(), Some(Path::new(UPSTREAM)));
        assert_eq!((a.rounds(), a.single(), a.kills(), a.scrapes(), a.cri_runs), (2, 10, 10, 3, 10));
        let a = Cli::try_parse_from([
            "x",
            "--other-agent",
            "/usr/bin/kubelet",
            "--bursts",
            "10",
            "--evictions",
            "0",
            "--rounds",
            "3",
            "--single",
            "4",
        ])
        .unwrap()
        .args;
        assert_eq!(
            (a.other_agent.clone().unwrap(), a.bursts.clone(), a.evictions, a.rounds(), a.single()),
            (PathBuf::from("/usr/bin/kubelet"), vec![10], 0, 3, 4)
        );
        assert!(Cli::try_parse_from(["x", "--bursts", "30,201"]).is_err());
        assert!(Cli::try_parse_from(["x", "--rounds", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--apiserver-bin", "/x"]).is_err(), "the test API server is retired");
    }

    #[test]
    fn rounds_pool_into_one_figure_per_agent() {
        let mut a = AgentFigures::default();
        a.add_burst(30, vec![1, 2]);
        a.add_burst(100, vec![5]);
        a.add_burst(30, vec![3]);
        assert_eq!(a.burst(30), Some(&[1, 2, 3][..]));
        assert_eq!(a.burst(100), Some(&[5][..]));
        assert_eq!(a.burst(10), None);
        let scrape = |wall| scrape::Scrape { wall_ns: wall, cpu_ns: 1, runtime_cpu_ns: None, bytes: 1, series: None };
        a.add_scrapes(EndpointFigures { endpoint: ENDPOINTS[0], scrapes: vec![scrape(1)] });
        a.add_scrapes(EndpointFigures { endpoint: ENDPOINTS[1], scrapes: vec![scrape(2)] });
        a.add_scrapes(EndpointFigures { endpoint: ENDPOINTS[0], scrapes: vec![scrape(3)] });
        assert_eq!(a.scrapes.len(), 2);
        assert_eq!(a.scrapes[0].scrapes.iter().map(|s| s.wall_ns).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(a.pooled_idle(), None);
        a.idle = vec![Idle { pods: 100, cores: 0.01, rss_bytes: 40 }, Idle { pods: 100, cores: 0.03, rss_bytes: 50 }];
        let idle = a.pooled_idle().unwrap();
        assert!((idle.cores - 0.02).abs() < 1e-12);
        assert_eq!((idle.pods, idle.rss_bytes), (100, 45));
        let mut f = Figures::default();
        f.add_runtime_burst(RuntimeBurst { pods: 30, in_flight: 4, latencies: vec![1], cpu: Vec::new() });
        f.add_runtime_burst(RuntimeBurst { pods: 100, in_flight: 4, latencies: vec![2], cpu: Vec::new() });
        f.add_runtime_burst(RuntimeBurst { pods: 30, in_flight: 4, latencies: vec![3], cpu: Vec::new() });
        assert_eq!(f.runtime_burst(30).unwrap().latencies, vec![1, 3]);
        assert_eq!(f.runtime_bursts.len(), 2);
    }
}
