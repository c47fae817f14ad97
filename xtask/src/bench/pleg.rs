//! `cargo xtask bench pleg`: how fast a container's exit reaches the pod worker and the
//! pod's status, what that costs, and what the agent costs at rest, for the evented PLEG
//! (eBPF sensors, 30 s safety relist) and the upstream-style 1 s relisting PLEG.
//!
//! Per PLEG, one release-built agent against the test bed ([`BenchAgent`]):
//! 1. Latency: `exits / 10` static pods of 10 sleeping containers. Once all run, each
//!    container's init process is killed with SIGKILL once (one restart each, never a back-off),
//!    one at a time after a random 0–1 s pause, and the bench waits (at most 5 s) until
//!    the agent's event API has shown the `ContainerDied` dispatch, the status update and
//!    the restart. Latencies come from the agent's records ([`records`]) matched to the kill
//!    times ([`latency`]); CPU is the agent's over the whole kill phase, and over 10 s
//!    without kills just before (its background, to report the kills' own cost).
//! 2. Idle: the latency pods go, `idle_pods` single-container pods come; once all run and
//!    10 s have passed, the agent's CPU over 30 s and its RSS.
//! 3. Teardown: every manifest removed, pods drained, agent stopped, cgroups and
//!    directories removed — also on error and on Ctrl-C ([`Session`]). The test bed is
//!    left as it was found.
//!
//! The bench needs the test bed to itself: a kubelet owns every pod in its runtime.

use std::{
    collections::{BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::ValueEnum;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    Ctx,
    bench::{
        agent::{self, BenchAgent, NAMESPACE, NODE_NAME, PlegMode, PodView},
        latency::{Kill, KillOutcome, Summary, outcome},
        procfs::{self, CpuSample},
        records::{Record, RecordStream},
        report::{self, Environment, IdleFigures, LatencyFigures, ModeResult},
    },
    cleanup, containerd,
    cri::{CriClient, VersionResponse},
    images::BUSYBOX_IMAGE,
    testbed::{self, Layout},
};

const CONTAINERS_PER_POD: usize = 10;
const GRACE_SECONDS: u32 = 2;
/// How long to wait for a kill's dispatch, status update and restart.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Pauses between kills are uniform in [0, this): one relist period, so kills fall at
/// every phase of the relist.
const KILL_PAUSE_MAX_MS: u64 = 1000;
/// How often the collected records are looked at while waiting for a kill's records. The latencies
/// come from the records' own timestamps; this only paces the kills.
const LOG_POLL: Duration = Duration::from_millis(2);
const SETTLE: Duration = Duration::from_secs(10);
/// How long the agent's background CPU is measured with the latency pods running, before
/// the kills: what the kill phase would cost without kills.
const BACKGROUND_WINDOW: Duration = Duration::from_secs(10);
const IDLE_WINDOW: Duration = Duration::from_secs(30);
const DRAIN_TIMEOUT: Duration = Duration::from_mins(3);
/// The containers' command: sleeps until killed; a graceful stop (SIGTERM) ends it at once.
pub(super) const SLEEPER: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Evented,
    Relist,
    Both,
}

impl ModeArg {
    fn modes(self) -> Vec<PlegMode> {
        match self {
            Self::Evented => vec![PlegMode::Evented],
            Self::Relist => vec![PlegMode::Relist],
            Self::Both => vec![PlegMode::Evented, PlegMode::Relist],
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct PlegArgs {
    /// Container exits to measure per PLEG (containers killed once each, 10 per pod).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=2000))]
    exits: u32,
    /// Running single-container pods during the idle measurement.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=500))]
    idle_pods: u32,
    /// Which PLEG to measure.
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    mode: ModeArg,
    #[command(flatten)]
    bed: super::BedArgs,
}

/// What outlives the bench however it ends: the agent of the PLEG being measured (to
/// undo) and the figures of the PLEGs measured so far (to publish).
#[derive(Debug, Default)]
struct Session {
    agent: Option<BenchAgent>,
    env: Option<Environment>,
    results: Vec<ModeResult>,
}

impl Session {
    /// Tears the current agent down (see [`BenchAgent::teardown`]), keeping its log.
    async fn end_agent(&mut self, ctx: &Ctx, layout: &Layout) -> Result<()> {
        let Some(mut agent) = self.agent.take() else { return Ok(()) };
        let keep = bench_dir(ctx).join(format!("pleg-{}-agent.log", agent.mode.name()));
        agent.teardown(layout, &keep).await
    }
}

pub(super) fn bench_dir(ctx: &Ctx) -> PathBuf {
    ctx.target_dir.join("bench")
}

/// Resolves on the first SIGINT or SIGTERM.
pub(super) async fn interrupted() -> &'static str {
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

pub async fn run(ctx: &Ctx, layout: &Layout, args: &PlegArgs) -> Result<()> {
    testbed::require_root()?;
    let bed_was_up = super::bed_was_up(layout);
    let mut session = Session::default();
    let outcome = super::until_interrupted(
        std::pin::pin!(bench(ctx, layout, args, &mut session)),
        "this can take a minute; pods are drained first",
    )
    .await;
    let cleanup = super::said(session.end_agent(ctx, layout).await);
    // The PLEGs measured before a failure or an interrupt still have their figures.
    let published = match &session.env {
        Some(env) if !session.results.is_empty() => publish(ctx, &session.results, env, outcome.is_err()),
        _ => Ok(()),
    };
    super::finish(ctx, layout, bed_was_up || args.bed.keep_testbed, outcome, cleanup, published).await
}

async fn bench(ctx: &Ctx, layout: &Layout, args: &PlegArgs, session: &mut Session) -> Result<()> {
    eprintln!("==> bench pleg: test bed");
    let state = super::bed_up(ctx, layout, &["curl"]).await?;
    let (binary, mut cri, env) = super::agent_and_runtime(ctx, layout, args.bed.swiftlet_bin.as_deref()).await?;
    session.env = Some(env);

    for mode in args.mode.modes() {
        eprintln!();
        eprintln!("==> bench pleg: {mode}");
        let result = run_mode(layout, args, mode, &binary, &mut cri, state.containerd_pid, session)
            .await
            .with_context(|| format!("{} run", mode.name()))?;
        session.end_agent(ctx, layout).await.with_context(|| format!("tearing down the {} run", mode.name()))?;
        session.results.push(result);
    }
    Ok(())
}

/// Prints the table and writes it as Markdown to `target/bench/pleg.md`.
fn publish(ctx: &Ctx, results: &[ModeResult], env: &Environment, incomplete: bool) -> Result<()> {
    let md = report::markdown(results, env);
    let table = report::text(results);
    report::publish(ctx, "pleg.md", "swiftlet PLEG benchmark", env, md, &table, incomplete.then_some("PLEG"))
}

/// A binary given on the command line (`flag`), as an absolute path.
pub(super) fn given_binary(path: &Path, flag: &str) -> Result<PathBuf> {
    fs::canonicalize(path).with_context(|| format!("{flag} {}", path.display()))
}

/// The agent to bench: the one given with `--swiftlet-bin`, else a fresh release build.
pub(super) fn swiftlet_binary(ctx: &Ctx, given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(p) => given_binary(p, "--swiftlet-bin"),
        None => build_release(ctx),
    }
}

/// Builds the agent in release.
fn build_release(ctx: &Ctx) -> Result<PathBuf> {
    let dir = ctx.build_bins(&["swiftlet"], true).context("--swiftlet-bin runs a binary built elsewhere")?;
    Ok(dir.join("swiftlet"))
}

/// The pid in a `swiftlet-bench-<pid>-<mode>` name (the bench's cgroup roots and dirs).
fn bench_owner(name: &str) -> Option<i32> {
    name.strip_prefix("swiftlet-bench-")?.split('-').next()?.parse().ok()
}

/// Makes sure the test bed is ours alone, and removes what earlier benches that could
/// not clean up (killed with SIGKILL) left: sandboxes in the bench namespace, cgroup roots
/// and directories of bench processes that are gone.
pub(crate) async fn preflight(cri: &mut CriClient, layout: &Layout) -> Result<()> {
    let socket = layout.socket().display().to_string();
    let others = containerd::find_processes(|a| {
        a.first().is_some_and(|a0| Path::new(a0).file_name().is_some_and(|n| n == "swiftlet"))
            && a.iter().any(|x| x.contains(&socket))
    });
    ensure!(
        others.is_empty(),
        "another swiftlet uses the test bed (pid {others:?}); the bench needs the test bed to itself"
    );
    agent::remove_bench_sandboxes(cri).await.context("removing sandboxes an earlier bench left")?;
    if let Some(why) = agent::foreign_pods(&cri.list_pod_sandboxes().await?) {
        bail!("{why}; the agents this run starts would take them over. Try again when the test bed is idle.");
    }
    let stale = |p: &Path| {
        p.file_name().and_then(|n| n.to_str()).and_then(bench_owner).is_some_and(|pid| !containerd::is_alive(pid))
    };
    for h in cleanup::cgroup_hierarchies() {
        for root in fs::read_dir(&h).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| stale(p)) {
            eprintln!("bench: removing cgroup tree {} of an earlier bench", root.display());
            for dir in cleanup::cgroup_tree(&root) {
                let _ = fs::remove_dir(&dir);
            }
        }
    }
    for dir in fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| stale(p))
    {
        eprintln!("bench: removing {} of an earlier bench", dir.display());
        cleanup::unmount_all_under(std::slice::from_ref(&dir)).and_then(|()| cleanup::remove_dir(&dir))?;
    }
    Ok(())
}

pub(super) fn environment(ctx: &Ctx, version: &VersionResponse, swiftlet_bin: Option<&Path>) -> Environment {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&ctx.workspace)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = if let Some(p) = swiftlet_bin {
        p.display().to_string()
    } else {
        let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown commit".to_owned());
        let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        if dirty { format!("{head} + uncommitted changes") } else { head }
    };
    Environment {
        date: report::utc_date(now),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned()),
        cpu: fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| report::cpu_model(&c))
            .unwrap_or_else(|| "unknown CPU".to_owned()),
        cores: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        runtime: format!("{} {} (CRI {})", version.runtime_name, version.runtime_version, version.runtime_api_version),
        commit,
    }
}

async fn run_mode(
    layout: &Layout,
    args: &PlegArgs,
    mode: PlegMode,
    binary: &Path,
    cri: &mut CriClient,
    containerd_pid: Option<i32>,
    session: &mut Session,
) -> Result<ModeResult> {
    let exits = args.exits as usize;
    let idle_pods = args.idle_pods as usize;
    let max_pods = exits.div_ceil(CONTAINERS_PER_POD).max(idle_pods);
    let agent = session.agent.insert(BenchAgent::new(mode, binary, &layout.endpoint(), max_pods)?);
    agent.setup()?;
    agent.spawn().await?;
    check_pleg(agent).await?;
    let latency = latency_phase(agent, cri, exits).await.context("latency phase")?;
    eprintln!("bench: removing the latency pods");
    agent.remove_manifests()?;
    agent.wait_drained(cri, DRAIN_TIMEOUT).await.context("removing the latency pods")?;
    let idle = idle_phase(agent, cri, idle_pods, containerd_pid).await.context("idle phase")?;
    Ok(ModeResult { mode, latency, idle })
}

/// Fails unless `/healthz?verbose` says the PLEG of `agent.mode` is the one running (an
/// evented agent whose sensors failed to load falls back to relisting).
async fn check_pleg(agent: &mut BenchAgent) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        agent.ensure_alive()?;
        let body = agent.healthz_verbose().await?;
        if let Some(line) = body.lines().find(|l| l.starts_with(agent.mode.health_marker())) {
            eprintln!("bench: healthz: {line}");
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the agent does not run the {} (expected `{}` in /healthz?verbose):\n{body}",
                agent.mode,
                agent.mode.health_marker()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A static pod manifest: `containers` sleeping busybox containers `c0`, `c1`, ...
pub fn pod_manifest(name: &str, containers: usize) -> Value {
    let containers: Vec<Value> = (0..containers)
        .map(|i| {
            json!({
                "name": format!("c{i}"),
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", SLEEPER],
            })
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": GRACE_SECONDS,
            "containers": containers,
        },
    })
}

/// The host pid of a container's init process from CRI's verbose `info["info"]` JSON
/// (containerd: `{"pid": 1234, ...}`).
pub fn pid_from_info(info: &HashMap<String, String>) -> Option<i32> {
    let v: Value = serde_json::from_str(info.get("info")?).ok()?;
    v["pid"].as_i64().and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0)
}

/// (pod index, container index) of the first `n` containers to kill, taking one container
/// of every pod before a second of any, so consecutive kills hit different pod workers.
pub fn kill_order(containers_per_pod: &[usize], n: usize) -> Vec<(usize, usize)> {
    let most = containers_per_pod.iter().copied().max().unwrap_or(0);
    (0..most)
        .flat_map(|c| containers_per_pod.iter().enumerate().filter(move |(_, k)| c < **k).map(move |(p, _)| (p, c)))
        .take(n)
        .collect()
}

/// A deterministic pause sequence (xorshift64), the same in every run and mode.
#[derive(Debug)]
pub struct Pauses(u64);

impl Pauses {
    pub fn new() -> Self {
        Self(0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_ms(&mut self, max: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % max.max(1)
    }
}

/// Polls `/pods` until exactly the pods `names` are there, each with `per_pod` running
/// containers, and returns them sorted by name.
pub(super) async fn wait_running(
    agent: &mut BenchAgent,
    cri: &mut CriClient,
    names: &[String],
    per_pod: usize,
) -> Result<Vec<PodView>> {
    let want: BTreeSet<String> = names.iter().map(|n| format!("{n}-{NODE_NAME}")).collect();
    let total = names.len() * per_pod;
    // Half a second per container and per sandbox (what many single-container pods cost).
    let timeout =
        Duration::from_mins(2) + Duration::from_millis(500) * u32::try_from(total + names.len()).unwrap_or(u32::MAX);
    let started = Instant::now();
    let mut last_note = Instant::now();
    loop {
        agent.ensure_alive()?;
        // Only foreign pods count here: the bench's own sandboxes are still coming.
        if let Some(why) = agent::foreign_pods(&cri.list_pod_sandboxes().await?) {
            bail!("the test bed is not the bench's alone: {why}");
        }
        let pods = agent.pods().await?;
        let others = pods.iter().filter(|p| !want.contains(&p.name)).count();
        let mut ours: Vec<PodView> = pods.into_iter().filter(|p| want.contains(&p.name)).collect();
        let running: usize = ours.iter().map(|p| p.running_containers().min(per_pod)).sum();
        if others == 0 && ours.len() == want.len() && running == total {
            ours.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(ours);
        }
        if started.elapsed() > timeout {
            bail!(
                "{running}/{total} containers running in {}/{} pods ({others} other pods) after {timeout:?}; log \
                 tail:\n{}",
                ours.len(),
                want.len(),
                agent.log_tail(40)
            );
        }
        if last_note.elapsed() > Duration::from_secs(10) {
            eprintln!("bench: {running}/{total} containers running after {:.0} s", started.elapsed().as_secs_f64());
            last_note = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A container to kill.
#[derive(Debug)]
struct Target {
    pod_uid: String,
    container: String,
    id: String,
    restarts: u32,
    pid: i32,
}

pub(super) fn sig_kill(pid: i32) -> std::io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid was just checked to be
    // the init process of one of the bench's containers.
    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

fn opt_ms(ns: Option<u64>) -> String {
    ns.map_or_else(|| "—".to_owned(), report::fmt_ms)
}

/// `ContainerDied` events between `from_ns` and `to_ns` of containers the bench did not
/// kill: in a healthy run there are none.
pub fn unexpected_exits(records: &[Record], kills: &[Kill], from_ns: u64, to_ns: u64) -> usize {
    let killed: BTreeSet<&str> = kills.iter().map(|k| k.container_id.as_str()).collect();
    records
        .iter()
        .filter(|r| {
            matches!(r, Record::Dispatch(d) if d.kind == "ContainerDied"
                && (from_ns..=to_ns).contains(&d.mono_ns)
                && !killed.contains(d.id.as_str()))
        })
        .count()
}

async fn latency_phase(agent: &mut BenchAgent, cri: &mut CriClient, exits: usize) -> Result<LatencyFigures> {
    let n_pods = exits.div_ceil(CONTAINERS_PER_POD);
    let names: Vec<String> = (0..n_pods).map(|i| format!("lat-{i:02}")).collect();
    eprintln!("bench: latency phase: {n_pods} pods of {CONTAINERS_PER_POD} containers");
    let started = Instant::now();
    for name in &names {
        agent.write_manifest(&format!("{name}.json"), &pod_manifest(name, CONTAINERS_PER_POD))?;
    }
    let pods = wait_running(agent, cri, &names, CONTAINERS_PER_POD).await?;
    let start_secs = started.elapsed().as_secs_f64();
    eprintln!("bench: {} containers running after {start_secs:.0} s", n_pods * CONTAINERS_PER_POD);

    let per_pod: Vec<usize> = pods.iter().map(|p| p.containers.len()).collect();
    let mut targets = Vec::with_capacity(exits);
    for (p, c) in kill_order(&per_pod, exits) {
        let (pod, ctr) = (&pods[p], &pods[p].containers[c]);
        let id = ctr.id.clone().with_context(|| format!("{}/{} has no container id", pod.name, ctr.name))?;
        let status = cri.container_status_verbose(&id).await?;
        let pid = pid_from_info(&status.info)
            .with_context(|| format!("CRI's verbose status of {id} has no pid: {:?}", status.info.keys()))?;
        targets.push(Target { pod_uid: pod.uid.clone(), container: ctr.name.clone(), id, restarts: ctr.restarts, pid });
    }
    // Let the agent finish the work of the start-up before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sandboxes = agent::ready_bench_sandboxes(cri).await?;
    ensure!(sandboxes.len() == n_pods, "{} ready bench sandboxes for {n_pods} pods", sandboxes.len());

    let agent_pid = agent.pid().context("agent pid")?;
    let socket = agent.event_socket().context("the PLEG bench runs swiftlet, which serves the event API")?;
    let mut tail = RecordStream::connect(&socket).await?;
    let mut records = Vec::new();
    let mut pauses = Pauses::new();
    let mut kills = Vec::with_capacity(targets.len());
    let mut skipped = 0;
    let mut timeouts = [0; 3];
    let background_before = CpuSample::take(agent_pid)?;
    tokio::time::sleep(BACKGROUND_WINDOW).await;
    let cpu_before = CpuSample::take(agent_pid)?;
    let (background_cpu, background_wall) = cpu_before.since(&background_before);
    let background_cores = background_cpu / background_wall;
    eprintln!("bench: background CPU with {n_pods} pods and no kills: {background_cores:.4} cores");
    eprintln!("bench: killing {} containers one at a time", targets.len());
    for (i, t) in targets.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(pauses.next_ms(KILL_PAUSE_MAX_MS))).await;
        agent.ensure_alive()?;
        if i % 10 == 0 {
            agent::ensure_undisturbed(cri, &sandboxes).await?;
        }
        if !procfs::in_container(t.pid, &t.id) {
            eprintln!("bench: container {} (pid {}) is already gone: not killed", t.id, t.pid);
            skipped += 1;
            continue;
        }
        records.extend(tail.poll()?);
        let from = records.len();
        let t_kill_ns = procfs::monotonic_ns();
        if let Err(e) = sig_kill(t.pid) {
            eprintln!("bench: kill({}, SIGKILL) of container {}: {e}", t.pid, t.id);
            skipped += 1;
            continue;
        }
        let kill = Kill {
            pod_uid: t.pod_uid.clone(),
            container: t.container.clone(),
            container_id: t.id.clone(),
            restarts_before: t.restarts,
            t_kill_ns,
        };
        let deadline = Instant::now() + KILL_WAIT;
        let seen = loop {
            records.extend(tail.poll()?);
            let o = outcome(&kill, &records[from..]);
            if o.complete() || Instant::now() >= deadline {
                break o;
            }
            tokio::time::sleep(LOG_POLL).await;
        };
        for (n, missing) in timeouts.iter_mut().zip([
            seen.kill_to_worker_ns.is_none(),
            seen.kill_to_status_ns.is_none(),
            seen.kill_to_running_ns.is_none(),
        ]) {
            *n += usize::from(missing);
        }
        if !seen.complete() {
            eprintln!(
                "bench: kill {} ({}): not all seen within {KILL_WAIT:?}: pod worker {}, status {}, running {}",
                i + 1,
                t.id,
                opt_ms(seen.kill_to_worker_ns),
                opt_ms(seen.kill_to_status_ns),
                opt_ms(seen.kill_to_running_ns)
            );
        }
        kills.push(kill);
        if (i + 1) % 20 == 0 || i + 1 == targets.len() {
            eprintln!(
                "bench: {}/{} killed; last: pod worker after {}, status after {}, running after {}",
                i + 1,
                targets.len(),
                opt_ms(seen.kill_to_worker_ns),
                opt_ms(seen.kill_to_status_ns),
                opt_ms(seen.kill_to_running_ns)
            );
        }
    }
    let cpu_after = CpuSample::take(agent_pid)?;
    let cpu_after_mono_ns = procfs::monotonic_ns();
    let (cpu_seconds, wall_seconds) = cpu_after.since(&cpu_before);
    agent::ensure_undisturbed(cri, &sandboxes).await?;

    // The figures come from every record: one that came after the wait still counts.
    let all = tail.all()?;
    let outcomes: Vec<KillOutcome> = kills.iter().map(|k| outcome(k, &all)).collect();
    let unexpected_exits =
        kills.first().map_or(0, |first| unexpected_exits(&all, &kills, first.t_kill_ns, cpu_after_mono_ns));
    let of = |f: fn(&KillOutcome) -> Option<u64>| Summary::of(outcomes.iter().filter_map(f));
    Ok(LatencyFigures {
        pods: n_pods,
        containers: n_pods * CONTAINERS_PER_POD,
        start_secs,
        kills: kills.len(),
        skipped,
        exit_to_worker: of(|o| o.exit_to_worker_ns),
        kill_to_exit: of(|o| o.kill_to_exit_ns),
        kill_to_worker: of(|o| o.kill_to_worker_ns),
        worker_to_status: of(|o| Some(o.kill_to_status_ns?.saturating_sub(o.kill_to_worker_ns?))),
        kill_to_status: of(|o| o.kill_to_status_ns),
        kill_to_running: of(|o| o.kill_to_running_ns),
        without_kernel_time: outcomes.iter().filter(|o| o.dispatched_without_kernel_time()).count(),
        unexpected_exits,
        timeouts,
        cpu_seconds,
        wall_seconds,
        background_cores,
    })
}

async fn idle_phase(
    agent: &mut BenchAgent,
    cri: &mut CriClient,
    n: usize,
    containerd_pid: Option<i32>,
) -> Result<IdleFigures> {
    let names: Vec<String> = (0..n).map(|i| format!("idle-{i:03}")).collect();
    eprintln!("bench: idle phase: {n} single-container pods");
    let started = Instant::now();
    for name in &names {
        agent.write_manifest(&format!("{name}.json"), &pod_manifest(name, 1))?;
    }
    wait_running(agent, cri, &names, 1).await?;
    let start_secs = started.elapsed().as_secs_f64();
    let sandboxes = agent::ready_bench_sandboxes(cri).await?;
    ensure!(sandboxes.len() == n, "{} ready bench sandboxes for {n} pods", sandboxes.len());
    eprintln!("bench: {n} pods running after {start_secs:.0} s; settling {SETTLE:?}, then measuring {IDLE_WINDOW:?}");
    tokio::time::sleep(SETTLE).await;
    let pid = agent.pid().context("agent pid")?;
    let before = CpuSample::take(pid)?;
    let containerd_before = containerd_pid.and_then(|p| CpuSample::take(p).ok());
    // Checked every few seconds (a ListPodSandbox costs containerd well under 1 % of this
    // window): should another agent's pods appear, stop before ours takes them over.
    let window_end = Instant::now() + IDLE_WINDOW;
    while let Some(left) = window_end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
        tokio::time::sleep(left.min(Duration::from_secs(5))).await;
        agent::ensure_undisturbed(cri, &sandboxes).await?;
    }
    agent.ensure_alive()?;
    let after = CpuSample::take(pid)?;
    let containerd_cores = containerd_pid.and_then(|p| CpuSample::take(p).ok()).zip(containerd_before).map(|(a, b)| {
        let (cpu, wall) = a.since(&b);
        cpu / wall
    });
    let (rss_bytes, peak_rss_bytes) = procfs::memory(pid)?;
    let (cpu, wall) = after.since(&before);
    agent::ensure_undisturbed(cri, &sandboxes).await?;
    Ok(IdleFigures {
        pods: n,
        start_secs,
        window_secs: wall,
        cores: cpu / wall,
        containerd_cores,
        rss_bytes,
        peak_rss_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_static_pods_of_sleepers() {
        let m = pod_manifest("lat-03", 10);
        assert_eq!(m["metadata"]["namespace"], NAMESPACE);
        assert_eq!(m["spec"]["restartPolicy"], "Always");
        assert_eq!(m["spec"]["terminationGracePeriodSeconds"], 2);
        let cs = m["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 10);
        assert_eq!(cs[9]["name"], "c9");
        assert_eq!(cs[0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(cs[0]["command"][2], SLEEPER);
    }

    #[test]
    fn pid_comes_from_containerds_info_json() {
        let info = HashMap::from([("info".to_owned(), r#"{"sandboxID":"x","pid":4242,"removing":false}"#.to_owned())]);
        assert_eq!(pid_from_info(&info), Some(4242));
        let exited = HashMap::from([("info".to_owned(), r#"{"pid":0}"#.to_owned())]);
        assert_eq!(pid_from_info(&exited), None);
        assert_eq!(pid_from_info(&HashMap::new()), None);
    }

    #[test]
    fn kills_go_round_the_pods() {
        assert_eq!(kill_order(&[2, 2, 2], 5), vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]);
        // Uneven pods: a pod with fewer containers is skipped once it has none left.
        assert_eq!(kill_order(&[1, 3], 10), vec![(0, 0), (1, 0), (1, 1), (1, 2)]);
        assert!(kill_order(&[], 3).is_empty());
    }

    #[test]
    fn pauses_are_deterministic_and_in_range() {
        let (mut a, mut b) = (Pauses::new(), Pauses::new());
        let xs: Vec<u64> = (0..1000).map(|_| a.next_ms(1000)).collect();
        assert!(xs.iter().all(|x| *x < 1000));
        assert_eq!(xs, (0..1000).map(|_| b.next_ms(1000)).collect::<Vec<_>>());
        // Spread over the range, not stuck in one part of it.
        assert!(xs.iter().any(|x| *x < 100) && xs.iter().any(|x| *x >= 900));
    }

    #[test]
    fn counts_exits_the_bench_did_not_cause() {
        use crate::bench::records::Dispatch;
        let died = |mono: u64, id: &str| {
            Record::Dispatch(Dispatch {
                mono_ns: mono,
                kernel_ns: 0,
                uid: "u".into(),
                id: id.into(),
                kind: "ContainerDied".into(),
            })
        };
        let kill = Kill {
            pod_uid: "u".into(),
            container: "c0".into(),
            container_id: "mine".into(),
            restarts_before: 0,
            t_kill_ns: 100,
        };
        let mut started = died(150, "other");
        if let Record::Dispatch(d) = &mut started {
            d.kind = "ContainerStarted".into();
        }
        let records = [died(50, "before"), died(150, "mine"), started, died(160, "other"), died(900, "after")];
        assert_eq!(unexpected_exits(&records, &[kill], 100, 500), 1);
    }

    #[test]
    fn bench_names_carry_their_owner() {
        assert_eq!(bench_owner("swiftlet-bench-4242-evented"), Some(4242));
        assert_eq!(bench_owner("swiftlet-bench-x"), None);
        assert_eq!(bench_owner("swiftlet-e2e-4242"), None);
    }
}
