//! `cargo xtask fidelity`: does a node run by swiftlet look exactly like a kubelet node
//! from the API? The same scenarios ([`scenarios`]) run on swiftlet and on the upstream
//! kubelet (`target/upstream/kubelet`, v1.37.2), each joined in turn as a node of its own
//! to the test bed's real control plane, on the test bed's containerd; what the API then
//! shows of each scenario's pod (phase, conditions and their reasons, container states,
//! exit codes, restart counts, the events about it) and of the node (conditions, what it
//! reports of itself) is reduced to normalized facts ([`observe`]) and diffed. Every
//! difference is either one of [`documented::DOCUMENTED`], with its reason, one of
//! swiftlet's known defects ([`documented::AWAITING_FIX`]), with the fix it awaits, or a
//! failure.
//!
//! Per agent, every selected scenario's pod is created at once (pods bound to the node,
//! as the scheduler binds them, or placed by the scheduler where it must wait for the
//! pod's claims; in a namespace of the run's own); the runner polls the API
//! every 250 ms, acts on each pod once its container runs (a SIGKILL from the host, a
//! graceful delete, a `ConfigMap` update) and takes the scenario's facts when its outcome is
//! there or its timeout has passed (then the fact `outcome` says `timed out`, which is a
//! difference if the other agent got there). The node-pressure eviction runs on a node of
//! its own whose `memory.available` threshold is set below what is available at its start.
//! When a `csi-*` scenario is chosen, the test bed's host-path CSI driver is deployed
//! beside the node of each agent in turn ([`csi`]) and the node's CSI facts (its
//! `CSINode`, its node id annotation, its volumes in use) are taken with its own. When a
//! `dra-*` scenario is chosen, upstream's DRA test driver runs beside the node of each
//! agent in turn and the DRA device classes are created ([`dra`]); the claims of each
//! scenario are taken with its facts, and the node's `ResourceSlices` with the node's.
//!
//! The facts are taken at moments of two agents' schedules, so a difference in a pod's
//! facts can be one of timing on this host at that moment (CI once saw two that no local
//! run showed). The scenarios with undocumented differences therefore run once more on
//! both agents (on nodes and in namespaces of their own), and only what differs again fails
//! the run; the report shows both runs. A difference in the node's own facts fails at once.
//!
//! `--fast` (CI) runs the scenarios that end within 40 s: about 2 minutes for both agents.
//! The report goes to stdout and `target/fidelity/report.md`, the facts of each agent to
//! `target/fidelity/<agent>.json`, the agents' logs beside them (and the CSI driver's in
//! `<node label>-csi/`).

mod csi;
mod documented;
mod dra;
mod observe;
mod scenarios;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, ensure};
use serde_json::{Value, json};

use self::{
    csi::CsiDeployment,
    dra::DraDriver,
    observe::{Difference, Facts, Normalizer},
    scenarios::{Action, Placement, Scenario},
};
use crate::{
    Ctx, apt,
    bench::{
        self,
        agent::{BenchAgent, PlegMode},
        apiserver::{ApiClient, ApiServer},
        cluster::Cluster,
    },
    cluster as control_plane, containerd,
    cri::CriClient,
    registry, testbed,
    testbed::Layout,
    upstream::Upstream,
};

#[derive(Debug, Clone, clap::Args)]
pub struct FidelityArgs {
    /// Only the scenarios that end within 40 s (what CI runs).
    #[arg(long)]
    pub fast: bool,
    /// Only the scenarios whose name contains this (repeatable).
    #[arg(long = "scenario")]
    pub scenarios: Vec<String>,
    /// The swiftlet binary (default: a debug build of the workspace's).
    #[arg(long)]
    pub swiftlet_bin: Option<PathBuf>,
    /// Leave the test bed up at the end even if it was down before.
    #[arg(long)]
    pub keep_testbed: bool,
}

/// The two agents compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Swiftlet,
    Kubelet,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Self::Swiftlet => "swiftlet",
            Self::Kubelet => "kubelet",
        }
    }
}

/// What every phase runs with: the test bed, its control plane, when a `csi-*`
/// scenario is chosen the CSI driver's binary (`swiftlet-test-csi-driver`), and when a
/// `dra-*` one is, the DRA test driver's binary and the kubeconfig it runs with.
struct Bed<'a> {
    ctx: &'a Ctx,
    layout: &'a Layout,
    api: &'a ApiServer,
    csi_driver: Option<PathBuf>,
    dra_driver: Option<(PathBuf, PathBuf)>,
}

/// What one agent's run showed: per scenario its facts, and the facts of each of its
/// nodes (`node`, `node pressure`).
#[derive(Debug, Default, Clone)]
struct AgentRun {
    facts: BTreeMap<String, Facts>,
}

pub async fn run(ctx: &Ctx, layout: &Layout, args: &FidelityArgs) -> Result<()> {
    testbed::require_root()?;
    let _lock = bench::testbed_lock(layout)?;
    let bed_was_up = bench::bed_was_up(layout);
    let started = Instant::now();
    let outcome = fidelity(ctx, layout, args).await;
    eprintln!("fidelity: took {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    bench::finish(ctx, layout, bed_was_up || args.keep_testbed, outcome, Ok(()), Ok(())).await
}

fn selected(args: &FidelityArgs, pull_registry: &str) -> Vec<Scenario> {
    scenarios::all(pull_registry)
        .into_iter()
        .filter(|s| !args.fast || s.fast)
        .filter(|s| args.scenarios.is_empty() || args.scenarios.iter().any(|f| s.name.contains(f.as_str())))
        .collect()
}

async fn fidelity(ctx: &Ctx, layout: &Layout, args: &FidelityArgs) -> Result<()> {
    eprintln!("==> fidelity: test bed, control plane and binaries");
    testbed::up(ctx, layout).await.context("bringing the test bed up")?;
    apt::ensure(&["curl", "openssl"])?;
    let api = ApiServer::up(ctx, layout)?;
    let swiftlet = swiftlet_binary(ctx, args.swiftlet_bin.as_deref())?;
    let upstream = Upstream::new(ctx);
    let kubelet = upstream.bin("kubelet");
    if !kubelet.is_file() {
        upstream.build()?;
    }
    let mut cri = CriClient::connect(&layout.socket()).await?;
    bench::preflight(&mut cri, layout).await?;
    let pull_registry =
        registry::State::load(layout).ok().flatten().map_or_else(|| "127.0.0.1:9".to_owned(), |s| s.plain.endpoint);
    let chosen = selected(args, &pull_registry);
    ensure!(!chosen.is_empty(), "no scenario selected");
    eprintln!(
        "fidelity: {} scenario(s): {}",
        chosen.len(),
        chosen.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
    );

    // The CSI scenarios' driver: the tests crate's, with upstream's sidecars.
    let csi_driver = if chosen.iter().any(|s| s.csi) {
        upstream.build_csi().context("building the CSI sidecars")?;
        Some(csi::driver_binary(ctx)?)
    } else {
        None
    };
    // The DRA scenarios' driver: upstream's test driver, as the cluster's admin.
    let dra_driver = if chosen.iter().any(|s| s.dra) {
        if !upstream.bin("test-driver").is_file() {
            upstream.build()?;
        }
        let state = control_plane::State::load(layout)?.context("no control plane state")?;
        Some((upstream.bin("test-driver"), state.admin_kubeconfig))
    } else {
        None
    };
    let bed = Bed { ctx, layout, api: &api, csi_driver, dra_driver };

    let agents = [(Which::Swiftlet, swiftlet.as_path()), (Which::Kubelet, kubelet.as_path())];
    let runs = run_both(&bed, agents, "fidelity", &chosen, &mut cri).await?;
    let out = ctx.target_dir.join("fidelity");
    fs::create_dir_all(&out)?;
    for (name, run) in &runs {
        let path = out.join(format!("{name}.json"));
        fs::write(&path, serde_json::to_vec_pretty(&json!(run.facts))?)?;
    }
    let (mut report_text, mut undocumented) = report(&runs["swiftlet"], &runs["kubelet"]);
    // The facts are taken at moments of two agents' schedules, so a difference in a pod's
    // facts may be one of timing on this host at this moment. Those scenarios run once more
    // on both agents, and only what differs again fails the run; the report keeps both.
    let again: Vec<Scenario> =
        chosen.iter().filter(|s| undocumented.iter().any(|d| d.scenario == s.name)).cloned().collect();
    let node_level = undocumented.iter().any(|d| !again.iter().any(|s| s.name == d.scenario));
    if !again.is_empty() && !node_level {
        eprintln!(
            "fidelity: {} undocumented difference(s) in {}; running them once more on both agents",
            undocumented.len(),
            again.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        );
        // Nodes and namespaces of their own: the first run's are still being deleted.
        let reruns = run_both(&bed, agents, "fidelity-again", &again, &mut cri).await.context("the second run")?;
        let (second, still) = report(&reruns["swiftlet"], &reruns["kubelet"]);
        let _ = write!(
            report_text,
            "\n# Run again: the scenarios with undocumented differences\n\nOnly what differs again fails the \
             run.\n\n{}",
            second.split_once('\n').map_or("", |(_, rest)| rest).trim_start()
        );
        undocumented = still;
    }
    print!("{report_text}");
    fs::write(out.join("report.md"), &report_text)?;
    eprintln!("fidelity: report in {}", out.join("report.md").display());
    // The error names each difference: CI's summary shows this line, not the report.
    ensure!(
        undocumented.is_empty(),
        "{} undocumented difference(s) between swiftlet and the upstream kubelet: {}",
        undocumented.len(),
        undocumented.iter().map(describe).collect::<Vec<_>>().join("; ")
    );
    Ok(())
}

/// `chosen` on each agent in turn, by agent name; `prefix` starts the names of the nodes,
/// namespaces and logs.
async fn run_both(
    bed: &Bed<'_>,
    agents: [(Which, &Path); 2],
    prefix: &str,
    chosen: &[Scenario],
    cri: &mut CriClient,
) -> Result<BTreeMap<&'static str, AgentRun>> {
    let mut runs = BTreeMap::new();
    for (which, binary) in agents {
        eprintln!();
        eprintln!("==> fidelity: {}", which.name());
        let run = run_agent(bed, (which, binary), prefix, chosen, cri)
            .await
            .with_context(|| format!("the {} run", which.name()))?;
        runs.insert(which.name(), run);
    }
    Ok(runs)
}

/// One difference on one line.
fn describe(d: &Difference) -> String {
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
    format!("{} / {}: swiftlet {}, kubelet {}", d.scenario, d.key, show(&d.swiftlet), show(&d.kubelet))
}

/// The swiftlet binary to run: `given` (`--swiftlet-bin`), else a debug build of the
/// workspace's ([`Ctx::build_bins`]: a relink at most when CI has built the workspace).
pub(crate) fn swiftlet_binary(ctx: &Ctx, given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return fs::canonicalize(p).with_context(|| format!("--swiftlet-bin {}", p.display()));
    }
    Ok(ctx.build_bins(&["swiftlet"], false)?.join("swiftlet"))
}

/// The run of one agent: the ordinary scenarios on one node, the pressure ones on
/// another.
async fn run_agent(
    bed: &Bed<'_>,
    (which, binary): (Which, &Path),
    prefix: &str,
    chosen: &[Scenario],
    cri: &mut CriClient,
) -> Result<AgentRun> {
    let mut run = AgentRun::default();
    let plain: Vec<&Scenario> = chosen.iter().filter(|s| !s.pressure).collect();
    let pressure: Vec<&Scenario> = chosen.iter().filter(|s| s.pressure).collect();
    if !plain.is_empty() {
        let (facts, node) = phase(bed, which, binary, &format!("{prefix}-{}", which.name()), &plain, "", cri).await?;
        run.facts.extend(facts);
        run.facts.insert("node".into(), node);
    }
    if !pressure.is_empty() {
        let threshold = memory_available_mib()?.saturating_sub(scenarios::HOG_MIB / 2);
        eprintln!("fidelity: the pressure node's memory.available threshold: {threshold}Mi");
        let config = format!(
            "evictionHard:\n  memory.available: {threshold}Mi\n  nodefs.available: 1%\n  imagefs.available: 1%\n  \
             nodefs.inodesFree: 1%\nevictionPressureTransitionPeriod: 30s\n"
        );
        let label = format!("{prefix}-pressure-{}", which.name());
        let (facts, node) = phase(bed, which, binary, &label, &pressure, &config, cri).await?;
        run.facts.extend(facts);
        run.facts.insert("node pressure".into(), node);
    }
    Ok(run)
}

/// `memory.available` as a kubelet computes it: the machine's memory less the root
/// memory cgroup's working set (usage less inactive file pages), in MiB.
fn memory_available_mib() -> Result<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo")?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no MemTotal in /proc/meminfo")?;
    let root = Path::new("/sys/fs/cgroup/memory");
    let (usage, inactive) = if root.join("memory.usage_in_bytes").exists() {
        let usage: u64 = fs::read_to_string(root.join("memory.usage_in_bytes"))?.trim().parse()?;
        let stat = fs::read_to_string(root.join("memory.stat"))?;
        (usage, stat_field(&stat, "total_inactive_file"))
    } else {
        let root = Path::new("/sys/fs/cgroup");
        let stat = fs::read_to_string(root.join("memory.stat"))?;
        let used = stat_field(&stat, "anon") + stat_field(&stat, "file") + stat_field(&stat, "kernel");
        (used, stat_field(&stat, "inactive_file"))
    };
    Ok((total_kib * 1024).saturating_sub(usage.saturating_sub(inactive)) / (1024 * 1024))
}

fn stat_field(stat: &str, name: &str) -> u64 {
    stat.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The fact key of a scenario's timeline (shown in the report, never compared).
const TIMELINE: &str = "~timeline";

/// How long a scenario's outcome must have been there before its facts are taken: the
/// agents write events and status apart, and neither waits for the other.
const SETTLE: Duration = Duration::from_secs(3);

/// Where one scenario stands in a phase.
#[derive(Debug, Default)]
struct Progress {
    /// When container `c0` was first seen running.
    running_since: Option<Instant>,
    acted_at: Option<Instant>,
    /// When its outcome was first there.
    done_at: Option<Instant>,
    facts: Option<Facts>,
    /// What the API showed of the pod, each time it changed: seconds since the pods were
    /// created and a one-line summary (for the report; not compared).
    timeline: Vec<(f64, String)>,
}

/// One line of a pod's timeline: phase, and each container's state and restarts.
fn summary(pod: Option<&Value>) -> String {
    let Some(pod) = pod else { return "gone".into() };
    let mut out = pod["status"]["phase"].as_str().unwrap_or("-").to_owned();
    for list in ["initContainerStatuses", "containerStatuses"] {
        for c in pod["status"][list].as_array().into_iter().flatten() {
            let state = &c["state"];
            let what = if let Some(w) = state.get("waiting") {
                format!("waiting {}", w["reason"].as_str().unwrap_or(""))
            } else if let Some(t) = state.get("terminated") {
                format!("terminated {} {}", t["reason"].as_str().unwrap_or(""), t["exitCode"])
            } else if state.get("running").is_some() {
                "running".into()
            } else {
                "-".into()
            };
            let _ = write!(out, ", {} {what} (restarts {})", c["name"].as_str().unwrap_or(""), c["restartCount"]);
        }
    }
    out
}

/// One node: the agent joined, the CSI driver deployed (a pod on the node) and the DRA
/// test driver started beside it if a scenario needs them, the scenarios' pods run to their
/// outcome, the facts taken, everything removed again (also when the phase fails; the CSI
/// driver once the scenarios' pods are gone and before the node, whose agent stops its pod;
/// the DRA driver after the node, whose agent needs it to unprepare the pods' claims).
async fn phase(
    bed: &Bed<'_>,
    which: Which,
    binary: &Path,
    label: &str,
    chosen: &[&Scenario],
    config: &str,
    cri: &mut CriClient,
) -> Result<(BTreeMap<String, Facts>, Facts)> {
    let mut agent = BenchAgent::named(label, PlegMode::Evented, binary, &bed.layout.endpoint(), 110)?;
    if which == Which::Kubelet {
        agent = agent.other_agent();
    }
    if !config.is_empty() {
        agent = agent.with_config(config);
    }
    let mut cluster = Cluster::prepare(bed.api, agent)?;
    let out = bed.ctx.target_dir.join("fidelity");
    let mut deployment = None;
    let mut dra_driver: Option<DraDriver> = None;
    let outcome = async {
        cluster.start().await?;
        if chosen.iter().any(|s| s.csi) {
            let driver = bed.csi_driver.as_deref().context("the CSI driver was not built")?;
            let node = cluster.agent.node_name().to_owned();
            let root = cluster.agent.root_dir();
            let state = control_plane::state_file(bed.layout);
            let logs = out.join(format!("{label}-csi"));
            deployment = Some(CsiDeployment::start(driver, &state, &node, &root, &logs).await?);
            csi::wait_registered(cluster.client()?, &node, scenarios::CSI_DRIVER, Duration::from_mins(1)).await?;
        }
        if chosen.iter().any(|s| s.dra) {
            let (binary, kubeconfig) = bed.dra_driver.as_ref().context("no DRA test driver")?;
            let node = cluster.agent.node_name().to_owned();
            dra::create_objects(cluster.client()?, &node).await?;
            let dir = out.join(format!("{label}-dra"));
            let _ = fs::remove_dir_all(&dir);
            let driver =
                dra_driver.insert(DraDriver::start(binary, kubeconfig, &node, &cluster.agent.root_dir(), &dir)?);
            driver.wait_registered().await?;
        }
        observe_phase(&mut cluster, chosen, dra_driver.as_ref(), cri).await
    }
    .await;
    // The CSI driver runs as a pod on the node: its agent stops it, after the scenarios'
    // pods are gone (their volumes unmounted through it).
    let removed = match deployment {
        Some(d) => {
            let drained = cluster.delete_pods_and_wait().await;
            d.stop().and(drained)
        }
        None => Ok(()),
    };
    let ended = cluster.end(bed.layout, &out.join(format!("{label}.log"))).await;
    let dra_removed = match dra_driver {
        Some(driver) => {
            driver.stop();
            let node = cluster.agent.node_name().to_owned();
            dra::delete_objects(&mut bed.api.client(), &node).await
        }
        None => Ok(()),
    };
    match (outcome, ended, removed, dra_removed) {
        (Ok(r), Ok(()), Ok(()), Ok(())) => Ok(r),
        (Err(e), _, _, _) => Err(e),
        (Ok(_), Err(e), _, _) => Err(e.context("cleaning up")),
        (Ok(_), Ok(()), Err(e), _) => Err(e.context("removing the CSI driver")),
        (Ok(_), Ok(()), Ok(()), Err(e)) => Err(e.context("removing the DRA device classes")),
    }
}

async fn observe_phase(
    cluster: &mut Cluster,
    chosen: &[&Scenario],
    dra_driver: Option<&DraDriver>,
    cri: &mut CriClient,
) -> Result<(BTreeMap<String, Facts>, Facts)> {
    let namespace = cluster.namespace.clone();
    let node = cluster.agent.node_name().to_owned();
    let norm = Normalizer::new(&node, &namespace);
    let client = cluster.client()?;
    for s in chosen {
        for cm in &s.config_maps {
            let (code, body) =
                client.request("POST", &format!("/api/v1/namespaces/{namespace}/configmaps"), Some(cm)).await?;
            ensure!(code == 201, "creating ConfigMap for {}: {code}: {body}", s.name);
        }
        for claim in &s.claims {
            let path = format!("/api/v1/namespaces/{namespace}/persistentvolumeclaims");
            let (code, body) = client.request("POST", &path, Some(claim)).await?;
            ensure!(code == 201, "creating PersistentVolumeClaim for {}: {code}: {body}", s.name);
        }
        for claim in &s.resource_claims {
            let collection =
                if claim["kind"] == "ResourceClaimTemplate" { "resourceclaimtemplates" } else { "resourceclaims" };
            let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/{collection}");
            let (code, body) = client.request("POST", &path, Some(claim)).await?;
            ensure!(code == 201, "creating {} for {}: {code}: {body}", claim["kind"], s.name);
        }
    }
    let claims: Vec<&str> =
        chosen.iter().flat_map(|s| &s.claims).filter_map(|c| c["metadata"]["name"].as_str()).collect();
    wait_bound(client, &namespace, &claims, Duration::from_mins(1)).await?;
    let started = Instant::now();
    for s in chosen {
        let mut pod = s.pod.clone();
        if s.placement == Placement::Scheduled {
            pod["spec"]["nodeSelector"] = json!({ "kubernetes.io/hostname": node });
        } else {
            pod["spec"]["nodeName"] = json!(node);
        }
        client.create_pod(&namespace, &pod).await?;
    }
    let csi_chosen = chosen.iter().any(|s| s.csi);
    let dra_chosen = chosen.iter().any(|s| s.dra);
    let resource_claims_path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims");
    let mut progress: BTreeMap<&str, Progress> = chosen.iter().map(|s| (s.name, Progress::default())).collect();
    let mut last_note = Instant::now();
    while progress.values().any(|p| p.facts.is_none()) {
        cluster.agent.ensure_alive()?;
        let client = cluster.client()?;
        let pods = list(client, &format!("/api/v1/namespaces/{namespace}/pods")).await?;
        let events = list(client, &format!("/api/v1/namespaces/{namespace}/events")).await?;
        let resource_claims = if dra_chosen { list(client, &resource_claims_path).await? } else { Vec::new() };
        for s in chosen {
            let p = progress.get_mut(s.name).expect("every scenario has its progress");
            if p.facts.is_some() {
                continue;
            }
            let pod = pods.iter().find(|p| p["metadata"]["name"] == s.name);
            let line = summary(pod);
            if p.timeline.last().is_none_or(|(_, l)| *l != line) {
                p.timeline.push((started.elapsed().as_secs_f64(), line));
            }
            let about: Vec<&Value> = events
                .iter()
                .filter(|e| e["involvedObject"]["kind"] == "Pod" && e["involvedObject"]["name"] == s.name)
                .collect();
            if p.running_since.is_none() && pod.is_some_and(scenarios::c0_running) {
                p.running_since = Some(Instant::now());
            }
            if p.acted_at.is_none()
                && s.action != Action::None
                && let Some(pod) = pod
                && scenarios::c0_running(pod)
                && p.running_since.is_some_and(|t| t.elapsed() >= s.action.after_running())
            {
                act(client, cri, &namespace, s, pod).await.with_context(|| format!("scenario {}", s.name))?;
                p.acted_at = Some(Instant::now());
            }
            let ready_to_judge = s.action == Action::None || p.acted_at.is_some();
            if p.done_at.is_none() && ready_to_judge && s.done.holds(pod, &about, &resource_claims) {
                p.done_at = Some(Instant::now());
            }
            let complete = p.done_at.is_some_and(|t| t.elapsed() >= SETTLE);
            let timed_out = started.elapsed() > s.timeout + SETTLE;
            if complete || timed_out {
                let mut facts = Facts::new();
                facts.insert("outcome".into(), if complete { "complete" } else { "timed out" }.into());
                if let Some(pod) = pod {
                    observe::pod_facts(pod, &norm, &mut facts);
                }
                observe::event_facts(&events, s.name, &norm, &mut facts);
                if s.csi {
                    let all = list(client, &format!("/api/v1/namespaces/{namespace}/persistentvolumeclaims")).await?;
                    observe::claim_facts(&claims_of(s, &all), &norm, &mut facts);
                }
                if s.dra {
                    let prepared = |uid: &str| dra_driver.is_some_and(|d| d.prepared(uid));
                    observe::resource_claim_facts(
                        &resource_claims_of(s, &resource_claims),
                        &prepared,
                        &norm,
                        &mut facts,
                    );
                }
                if s.action == Action::Delete
                    && let Some(at) = p.acted_at
                {
                    let grace = s.pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
                    let took = p.done_at.map_or_else(|| at.elapsed(), |d| d.duration_since(at));
                    facts.insert("deletion".into(), deletion_bucket(took, grace).into());
                }
                eprintln!(
                    "fidelity: {} {} after {:.1} s",
                    s.name,
                    if complete { "done" } else { "TIMED OUT" },
                    started.elapsed().as_secs_f64()
                );
                p.facts = Some(facts);
            }
        }
        if last_note.elapsed() > Duration::from_secs(15) {
            let waiting: Vec<&str> = progress.iter().filter(|(_, p)| p.facts.is_none()).map(|(n, _)| *n).collect();
            eprintln!("fidelity: waiting for {}", waiting.join(", "));
            last_note = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A node under pressure shows it at its next status update (every 10 s) and gets the
    // node lifecycle controller's taint after: the node's facts are taken once both are
    // there (or 40 s have passed).
    let under_pressure = chosen.iter().any(|s| s.pressure);
    let waited = Instant::now();
    let node_obj = loop {
        let client = cluster.client()?;
        let (code, node_obj) = client.request("GET", &format!("/api/v1/nodes/{node}"), None).await?;
        ensure!(code == 200, "GET node {node}: {code}");
        if !under_pressure || shows_memory_pressure(&node_obj) || waited.elapsed() > Duration::from_secs(40) {
            break node_obj;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mut node_facts = observe::node_facts(&node_obj, &norm);
    if csi_chosen {
        let ran = progress
            .iter()
            .filter(|(name, _)| chosen.iter().any(|s| s.csi && s.name == **name))
            .filter_map(|(_, p)| p.running_since)
            .max();
        node_facts.extend(csi_node_facts(cluster, chosen, &node, ran, &norm).await?);
    }
    if dra_chosen {
        let slices = list(cluster.client()?, "/apis/resource.k8s.io/v1/resourceslices").await?;
        node_facts.extend(observe::resource_slice_facts(&slices, &node, &norm));
    }
    let mut facts = BTreeMap::new();
    for (name, p) in progress {
        let mut f = p.facts.unwrap_or_default();
        // Kept beside the facts under a key the diff leaves out.
        let timeline: Vec<String> = p.timeline.iter().map(|(t, l)| format!("{t:.1} s {l}")).collect();
        f.insert(TIMELINE.into(), timeline.join("\n"));
        facts.insert(name.to_owned(), f);
    }
    Ok((facts, node_facts))
}

/// Waits until the claims `names` of `namespace` are bound.
async fn wait_bound(client: &mut ApiClient, namespace: &str, names: &[&str], timeout: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let all = list(client, &format!("/api/v1/namespaces/{namespace}/persistentvolumeclaims")).await?;
        let unbound: Vec<&&str> = names
            .iter()
            .filter(|n| !all.iter().any(|c| c["metadata"]["name"] == **n && c["status"]["phase"] == "Bound"))
            .collect();
        if unbound.is_empty() {
            if !names.is_empty() {
                eprintln!("fidelity: claims bound ({:.1} s)", started.elapsed().as_secs_f64());
            }
            return Ok(());
        }
        ensure!(started.elapsed() < timeout, "claims {unbound:?} not bound after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The claims of scenario `s` among `all`: those it creates, and those of its pod's
/// generic ephemeral volumes (which the pod owns).
fn claims_of<'a>(s: &Scenario, all: &'a [Value]) -> Vec<&'a Value> {
    all.iter()
        .filter(|c| {
            let name = &c["metadata"]["name"];
            s.claims.iter().any(|own| own["metadata"]["name"] == *name)
                || c["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|o| o["kind"] == "Pod" && o["name"] == s.name)
        })
        .collect()
}

/// The `ResourceClaims` of scenario `s` among `all`: those it creates, and those its pod
/// owns (made from its templates, or by the scheduler for its extended resources).
fn resource_claims_of<'a>(s: &Scenario, all: &'a [Value]) -> Vec<&'a Value> {
    all.iter()
        .filter(|c| {
            let name = &c["metadata"]["name"];
            s.resource_claims.iter().any(|own| own["kind"] == "ResourceClaim" && own["metadata"]["name"] == *name)
                || c["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|o| o["kind"] == "Pod" && o["name"] == s.name)
        })
        .collect()
}

/// The unique volume names (`kubernetes.io/csi/<driver>^<handle>`) of the attachable CSI
/// volumes of the claims of the running pods among `pods`: what their node's
/// `volumesInUse` lists once its agent has shown it. A kubelet lists a volume in use only
/// if its plugin attaches it, which a CSI driver's does unless its `CSIDriver` (among
/// `drivers`) says `attachRequired: false`.
fn attachable_volumes_in_use(
    pods: &[Value],
    claims: &[Value],
    volumes: &[Value],
    drivers: &[Value],
) -> BTreeSet<String> {
    let attaches = |driver: &str| {
        drivers.iter().find(|d| d["metadata"]["name"] == driver).is_none_or(|d| d["spec"]["attachRequired"] != false)
    };
    let mut names = BTreeSet::new();
    for pod in pods.iter().filter(|p| p["status"]["phase"] == "Running") {
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
            let claim = if let Some(c) = v["persistentVolumeClaim"]["claimName"].as_str() {
                c.to_owned()
            } else if v.get("ephemeral").is_some() {
                format!("{pod_name}-{}", v["name"].as_str().unwrap_or_default())
            } else {
                continue;
            };
            let Some(pv) = claims
                .iter()
                .find(|c| c["metadata"]["name"] == claim.as_str())
                .and_then(|c| c["spec"]["volumeName"].as_str())
            else {
                continue;
            };
            if let Some(csi) = volumes.iter().find(|v| v["metadata"]["name"] == pv).map(|v| &v["spec"]["csi"])
                && let (Some(driver), Some(handle)) = (csi["driver"].as_str(), csi["volumeHandle"].as_str())
                && attaches(driver)
            {
                names.insert(format!("kubernetes.io/csi/{driver}^{handle}"));
            }
        }
    }
    names
}

/// How long after the CSI scenarios' pods ran their node's CSI facts are taken at the
/// earliest: an agent shows a change of `volumesInUse` at its next node status update,
/// every 10 s (`nodeStatusUpdateFrequency`).
const CSI_NODE_SETTLE: Duration = Duration::from_secs(12);

/// The CSI facts of the node (see [`observe::csi_node_facts`]), taken once
/// [`CSI_NODE_SETTLE`] has passed since the CSI scenarios' pods last started running
/// (`ran`) and its `volumesInUse` lists the attachable CSI volumes of the running pods,
/// or 30 s have passed.
async fn csi_node_facts(
    cluster: &mut Cluster,
    chosen: &[&Scenario],
    node: &str,
    ran: Option<Instant>,
    norm: &Normalizer,
) -> Result<Facts> {
    let namespace = cluster.namespace.clone();
    let client = cluster.client()?;
    let waited = Instant::now();
    loop {
        let pods = list(client, &format!("/api/v1/namespaces/{namespace}/pods")).await?;
        let csi_pods: Vec<Value> =
            pods.into_iter().filter(|p| chosen.iter().any(|s| s.csi && p["metadata"]["name"] == s.name)).collect();
        let claims = list(client, &format!("/api/v1/namespaces/{namespace}/persistentvolumeclaims")).await?;
        let volumes = list(client, "/api/v1/persistentvolumes").await?;
        let drivers = list(client, "/apis/storage.k8s.io/v1/csidrivers").await?;
        let (code, node_obj) = client.request("GET", &format!("/api/v1/nodes/{node}"), None).await?;
        ensure!(code == 200, "GET node {node}: {code}");
        let expected = attachable_volumes_in_use(&csi_pods, &claims, &volumes, &drivers);
        let shown: BTreeSet<&str> =
            node_obj["status"]["volumesInUse"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let settled = ran.is_none_or(|t| t.elapsed() >= CSI_NODE_SETTLE);
        let listed = expected.iter().all(|v| shown.contains(v.as_str()));
        if (settled && listed) || waited.elapsed() > Duration::from_secs(30) {
            let (code, csinode) =
                client.request("GET", &format!("/apis/storage.k8s.io/v1/csinodes/{node}"), None).await?;
            let csinode = (code == 200).then_some(&csinode);
            return Ok(observe::csi_node_facts(&node_obj, csinode, &volumes, norm));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether a Node shows `MemoryPressure: True` and the taint that goes with it.
fn shows_memory_pressure(node: &Value) -> bool {
    let condition = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "MemoryPressure" && c["status"] == "True");
    let taint = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == "node.kubernetes.io/memory-pressure");
    condition && taint
}

/// How long a graceful deletion took against the grace period.
fn deletion_bucket(took: Duration, grace_secs: u64) -> &'static str {
    let grace = Duration::from_secs(grace_secs);
    if took < grace {
        "before the grace period ran out"
    } else if took < grace + Duration::from_secs(5) {
        "when the grace period ran out"
    } else {
        "more than 5 s after the grace period"
    }
}

async fn list(client: &mut ApiClient, path: &str) -> Result<Vec<Value>> {
    let (code, body) = client.request("GET", path, None).await?;
    ensure!(code == 200, "GET {path}: {code}: {body}");
    Ok(body["items"].as_array().cloned().unwrap_or_default())
}

/// Takes scenario `s`'s action on its running `pod`.
async fn act(client: &mut ApiClient, cri: &mut CriClient, namespace: &str, s: &Scenario, pod: &Value) -> Result<()> {
    match &s.action {
        Action::None => Ok(()),
        Action::KillFromHost => {
            let id = scenarios::c0(pod)
                .and_then(|c| c["containerID"].as_str())
                .and_then(|id| id.split_once("://").map(|(_, id)| id.to_owned()))
                .context("no container id for c0")?;
            let pid = container_pid(cri, &id).await?;
            eprintln!("fidelity: {}: SIGKILL to pid {pid} (container {id:.12}) from the host", s.name);
            containerd::signal(pid, libc::SIGKILL);
            Ok(())
        }
        Action::Delete => {
            let path = format!("/api/v1/namespaces/{namespace}/pods/{}", s.name);
            let (code, body) = client.request("DELETE", &path, None).await?;
            ensure!(code == 200 || code == 202, "deleting pod {}: {code}: {body}", s.name);
            Ok(())
        }
        Action::UpdateConfigMap { name, key, value } => {
            let path = format!("/api/v1/namespaces/{namespace}/configmaps/{name}");
            let (code, mut cm) = client.request("GET", &path, None).await?;
            ensure!(code == 200, "GET {path}: {code}");
            cm["data"][*key] = json!(value);
            let (code, body) = client.request("PUT", &path, Some(&cm)).await?;
            ensure!(code == 200, "PUT {path}: {code}: {body}");
            Ok(())
        }
    }
}

/// The host pid of a container's main process, from the runtime's verbose status.
async fn container_pid(cri: &mut CriClient, id: &str) -> Result<i32> {
    let r = cri.container_status_verbose(id).await?;
    let info: Value = serde_json::from_str(r.info.get("info").map_or("{}", String::as_str))?;
    info["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| anyhow!("the runtime gives no pid for container {id}"))
}

/// The report (markdown) and the undocumented differences, with the known defects of
/// [`documented::AWAITING_FIX`].
fn report(swiftlet: &AgentRun, kubelet: &AgentRun) -> (String, Vec<Difference>) {
    report_with(swiftlet, kubelet, documented::AWAITING_FIX)
}

/// [`report`] with `defects` as the known defects awaiting a fix.
fn report_with(
    swiftlet: &AgentRun,
    kubelet: &AgentRun,
    defects: &[documented::Documented],
) -> (String, Vec<Difference>) {
    let awaiting_fix = |d: &Difference| defects.iter().find(|k| k.covers(d)).map(|k| k.why);
    let mut names: Vec<&String> = swiftlet.facts.keys().chain(kubelet.facts.keys()).collect();
    names.sort();
    names.dedup();
    let empty = Facts::new();
    let mut out = String::from("# `cargo xtask fidelity`: swiftlet against the upstream kubelet\n\n");
    let mut rows = String::new();
    let mut details = String::new();
    let mut timelines = String::new();
    let (mut undocumented, mut documented_n, mut defects_n) = (Vec::new(), 0, 0);
    let mut stale = String::new();
    for name in names {
        let strip = |f: Option<&Facts>| -> Facts {
            f.unwrap_or(&empty).iter().filter(|(k, _)| *k != TIMELINE).map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let (a, b) = (&strip(swiftlet.facts.get(name)), &strip(kubelet.facts.get(name)));
        let diffs: Vec<Difference> = observe::diff(name, a, b);
        for (agent, run) in [("swiftlet", swiftlet), ("kubelet", kubelet)] {
            if let Some(t) = run.facts.get(name).and_then(|f| f.get(TIMELINE)).filter(|t| !t.is_empty()) {
                let _ = writeln!(timelines, "- {name}, {agent}:");
                for line in t.lines() {
                    let _ = writeln!(timelines, "  - {line}");
                }
            }
        }
        let same = a.keys().filter(|k| a.get(*k) == b.get(*k)).count();
        let (doc, undoc): (Vec<&Difference>, Vec<&Difference>) =
            diffs.iter().partition(|d| documented::reason(d).is_some() || awaiting_fix(d).is_some());
        undocumented.extend(undoc.iter().map(|d| (*d).clone()));
        defects_n += doc.iter().filter(|d| awaiting_fix(d).is_some()).count();
        documented_n += doc.len();
        // A known defect whose facts were taken and no longer differ: fixed, or shown
        // only at times.
        for k in defects.iter().filter(|k| k.scenario == name.as_str()) {
            let taken = a.keys().chain(b.keys()).any(|key| key.starts_with(k.key));
            if taken && !diffs.iter().any(|d| k.covers(d)) {
                let _ = writeln!(
                    stale,
                    "- {name} / `{}`: listed as a known defect but the same on both agents: if swiftlet is fixed, \
                     remove it from `AWAITING_FIX` (xtask/src/fidelity/documented.rs)",
                    k.key
                );
            }
        }
        let verdict = if undoc.is_empty() { "✓" } else { "✗" };
        let _ = writeln!(rows, "| {name} | {same} | {} | {} | {verdict} |", doc.len(), undoc.len());
        for d in &diffs {
            let why = documented::reason(d)
                .map(|w| format!("documented: {w}"))
                .or_else(|| awaiting_fix(d).map(|w| format!("known swiftlet defect, awaiting its fix: {w}")))
                .unwrap_or_else(|| "**UNDOCUMENTED**".to_owned());
            let _ = writeln!(
                details,
                "- {name} / `{}`: swiftlet `{}`, kubelet `{}` — {why}",
                d.key,
                d.swiftlet.as_deref().unwrap_or("(none)"),
                d.kubelet.as_deref().unwrap_or("(none)")
            );
        }
    }
    let _ = writeln!(out, "| scenario | same facts | documented differences | undocumented | |");
    let _ = writeln!(out, "|---|---:|---:|---:|---|");
    out.push_str(&rows);
    let _ = writeln!(out);
    if details.is_empty() {
        let _ = writeln!(out, "No difference.");
    } else {
        let _ = writeln!(out, "## Differences\n\n{details}");
    }
    if !stale.is_empty() {
        let _ = writeln!(out, "\n## Known defects not seen\n\n{stale}");
    }
    let _ = writeln!(
        out,
        "\n{} undocumented, {documented_n} documented difference(s) ({defects_n} of them known defects awaiting a \
         fix).",
        undocumented.len()
    );
    if !timelines.is_empty() {
        let _ = writeln!(
            out,
            "\n## What the API showed, as it changed (seconds since the pods were created)\n\n{timelines}"
        );
    }
    (out, undocumented)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_is_judged_against_the_grace_period() {
        assert_eq!(deletion_bucket(Duration::from_millis(900), 3), "before the grace period ran out");
        assert_eq!(deletion_bucket(Duration::from_millis(3400), 3), "when the grace period ran out");
        assert_eq!(deletion_bucket(Duration::from_secs(9), 3), "more than 5 s after the grace period");
    }

    #[test]
    fn the_report_counts_documented_and_undocumented_differences() {
        let facts = |v: &[(&str, &str)]| -> Facts { v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect() };
        let a = AgentRun {
            facts: [
                ("node".into(), facts(&[("nodeInfo kubeletVersion", "v1.37.2-swiftlet"), ("condition Ready", "True")])),
                ("crash-loop".into(), facts(&[("phase", "Running")])),
            ]
            .into(),
        };
        let b = AgentRun {
            facts: [
                ("node".into(), facts(&[("nodeInfo kubeletVersion", "v1.37.2"), ("condition Ready", "True")])),
                ("crash-loop".into(), facts(&[("phase", "Failed")])),
            ]
            .into(),
        };
        let (text, undocumented) = report(&a, &b);
        let lines: Vec<String> = undocumented.iter().map(describe).collect();
        assert_eq!(lines, ["crash-loop / phase: swiftlet Running, kubelet Failed"]);
        assert!(text.contains("| crash-loop | 0 | 0 | 1 | ✗ |"), "{text}");
        assert!(text.contains("| node | 1 | 1 | 0 | ✓ |"), "{text}");
        assert!(
            text.contains("crash-loop / `phase`: swiftlet `Running`, kubelet `Failed` — **UNDOCUMENTED**"),
            "{text}"
        );
        let (same, none) = report(&a, &a);
        assert!(none.is_empty(), "{none:?}");
        assert!(same.contains("No difference."));
    }

    #[test]
    fn known_defects_pass_apart_and_are_told_when_they_no_longer_show() {
        // A defect of this test's own (the production list is empty when none awaits a fix).
        let defects = [documented::Documented {
            scenario: "node",
            key: "csi volumesInUse",
            why: "swiftlet lists volumes the kubelet does not",
        }];
        let report = |a: &AgentRun, b: &AgentRun| report_with(a, b, &defects);
        let facts = |v: &[(&str, &str)]| -> Facts { v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect() };
        let run = |in_use: &str| AgentRun { facts: [("node".into(), facts(&[("csi volumesInUse", in_use)]))].into() };
        let (text, undocumented) = report(&run("kubernetes.io/csi/d^<volume of claim c>"), &run(""));
        assert!(undocumented.is_empty(), "{undocumented:?}");
        assert!(text.contains("known swiftlet defect, awaiting its fix: swiftlet lists"), "{text}");
        assert!(text.contains("(1 of them known defects awaiting a fix)"), "{text}");
        assert!(!text.contains("Known defects not seen"), "{text}");
        let (text, _) = report(&run(""), &run(""));
        assert!(text.contains("node / `csi volumesInUse`: listed as a known defect but the same"), "{text}");
        // Not taken (no CSI scenario ran): nothing to say.
        let (text, _) = report(&AgentRun::default(), &AgentRun::default());
        assert!(!text.contains("Known defects not seen"), "{text}");
    }

    #[test]
    fn only_attachable_csi_volumes_of_running_pods_are_expected_in_use() {
        let pod = |name: &str, phase: &str, volumes: Value| json!({"metadata": {"name": name}, "spec": {"volumes": volumes}, "status": {"phase": phase}});
        let pods = [
            pod(
                "a",
                "Running",
                json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}, {"name": "e", "emptyDir": {}}]),
            ),
            pod("b", "Running", json!([{"name": "s", "ephemeral": {}}, {"name": "i", "csi": {"driver": "attaching"}}])),
            pod("c", "Pending", json!([{"name": "d", "persistentVolumeClaim": {"claimName": "other"}}])),
        ];
        let claim = |name: &str, pv: &str| json!({"metadata": {"name": name}, "spec": {"volumeName": pv}});
        let claims = [claim("data", "pv-1"), claim("b-s", "pv-2"), claim("other", "pv-3")];
        let pv = |name: &str, driver: &str, handle: &str| json!({"metadata": {"name": name}, "spec": {"csi": {"driver": driver, "volumeHandle": handle}}});
        let volumes = [pv("pv-1", "attaching", "h1"), pv("pv-2", "hostpath", "h2"), pv("pv-3", "attaching", "h3")];
        let drivers = [json!({"metadata": {"name": "hostpath"}, "spec": {"attachRequired": false}})];
        let expected = attachable_volumes_in_use(&pods, &claims, &volumes, &drivers);
        assert_eq!(expected.into_iter().collect::<Vec<_>>(), ["kubernetes.io/csi/attaching^h1"]);
        // A driver without a CSIDriver attaches.
        let all = attachable_volumes_in_use(&pods, &claims, &volumes, &[]);
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn stat_fields_are_read_by_exact_name() {
        let stat = "inactive_file 10\ntotal_inactive_file 20\nanon 5\n";
        assert_eq!(stat_field(stat, "total_inactive_file"), 20);
        assert_eq!(stat_field(stat, "inactive_file"), 10);
        assert_eq!(stat_field(stat, "file"), 0);
    }
}
