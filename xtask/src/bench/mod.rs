//! `cargo xtask bench [<what>]`: benchmarks on this machine against the test bed. They print
//! figures (and write them under `target/bench/`); they are not tests and never run in CI.
//!
//! - no subcommand, or `all`: one table of every figure with a target — pod start-up
//!   (single pod, 30- and 100-pod bursts, against the runtime's own start), exit
//!   detection, idle cost, scrape cost, API load, eviction reaction — for swiftlet and
//!   optionally another node agent (`--other-agent`, in alternating rounds, with the
//!   ratio swiftlet ÷ it from the same run).
//! - `pleg`: container exit → pod worker → pod status latency, CPU per event, idle CPU and
//!   RSS, for the evented (eBPF) PLEG and the 1 s relisting PLEG side by side.
//! - `scrape`: wall time and agent CPU per scrape of `/metrics`, `/metrics/cadvisor`,
//!   `/metrics/resource` and `/stats/summary` with 100 and 250 running containers, against
//!   the upstream kubelet's figures.
//! - `eviction`: memory threshold crossed → eviction decision, with the kernel's signals
//!   and with the periodic 10 s pass alone.
//! - `cluster`: several nodes (node containers) joined to the control plane, a Deployment
//!   spread across them; pod start-up and the API load per node at idle and during churn,
//!   for swiftlet and the upstream kubelet, and a model of a 5,000-node fleet ([`fleet`]).
//! - `density`: one node at growing pod counts (`--pods 250,500`): idle CPU and RSS,
//!   kill → pod status, API requests at idle, scrape cost, start-up; SVG plots ([`density`]).
//! - `runtime-events`: what CRI `GetContainerEvents` adds to the kernel's events, with the
//!   agent in the node container on containerd 2.x (`swiftlet_tests::runtime_events`, run
//!   by the tests crate's `swiftlet-chaos`, which takes the test bed's lock itself).
//!
//! The API benches (the summary, `eviction`) join their agents as nodes to the test bed's
//! real control plane (kube-apiserver, controller-manager and scheduler v1.37.2 of
//! `testbed up --cluster`, brought up if they are not; see [`cluster`]) and create and
//! watch their pods through kube-apiserver as the cluster admin.
//!
//! Every bench holds the test bed's cross-process lock for its whole run: an exclusive
//! `flock(2)` on `/run/swiftlet-testbed/e2e.lock`, the one each end-to-end test takes
//! (`swiftlet_tests::testbed_lock`). A bench agent shares the test bed's containerd, and an
//! agent stops the pods there that are not its own: an end-to-end test running meanwhile
//! would lose its pods to the bench's agent, and the bench its figures to the test's.

pub(crate) mod agent;
mod apiload;
pub(crate) mod apiserver;
mod burstcpu;
pub(crate) mod cluster;
mod density;
mod eviction;
mod fleet;
pub(crate) mod https;
mod latency;
mod pleg;
pub(crate) use pleg::preflight;
mod procfs;
mod profile;
mod records;
mod report;
mod scrape;
mod summary;
mod svg;
mod verdict;
pub(crate) mod watch;

use std::{
    fs,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    pin::Pin,
};

use anyhow::{Context as _, Result, anyhow};
use clap::Subcommand;

pub use summary::AllArgs;

use crate::{
    Ctx, apt, containerd,
    cri::CriClient,
    testbed::{self, Layout, State},
};

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Everything with a target in one table (what `cargo xtask bench` alone runs): pod
    /// start-up, exit detection, idle cost, scrape cost, eviction; swiftlet and
    /// `--other-agent`, in alternating rounds. About 7 minutes for swiftlet alone, 14 with
    /// the upstream kubelet (2 rounds of about 6); needs the machine and the test bed to itself.
    All(AllArgs),
    /// PLEG latency (kill → pod worker → pod status), CPU per event, idle CPU and RSS with
    /// many pods: evented vs relist. Takes about 12 minutes; needs the machine and the test bed to itself.
    Pleg(pleg::PlegArgs),
    /// Wall time and agent CPU per scrape of /metrics, /metrics/cadvisor, /metrics/resource
    /// and /stats/summary at 100 and 250 running containers, against kubelet 1.28. Takes
    /// 10 to 15 minutes; needs the machine and the test bed to itself.
    Scrape(scrape::ScrapeArgs),
    /// What the runtime's own event stream (CRI `GetContainerEvents`) adds to the
    /// kernel's events: 100 containers killed from the host, one at a time then all at
    /// once, with the agent in the node container on containerd 2.4.2 (needs `testbed up
    /// --node-container`); which source told each stop first and how far the runtime's
    /// event lagged. About 3 minutes.
    RuntimeEvents(RuntimeEventsArgs),
    /// Memory threshold crossed → eviction decision, with the kernel's signals (the
    /// default) and with the periodic 10 s pass alone, side by side (20 runs each by
    /// default, about 2 and 5 minutes); needs the machine and the test bed to itself.
    Eviction(eviction::EvictionArgs),
    /// Three (`--nodes`, up to 5) node containers joined to the test bed's control plane,
    /// a Deployment spread across them: pod start-up and the API server's load per node
    /// (requests by verb and resource, watches, bytes) at idle and during churn, for
    /// swiftlet and as many upstream kubelets, and a model of 5,000 nodes × 110 pods.
    /// About 8 minutes; needs the machine and the test bed to itself.
    Cluster(fleet::ClusterArgs),
    /// One node as its pod count grows (`--pods 250,500`, maxPods raised): idle CPU and
    /// RSS, kill → pod status, API requests at idle, scrape cost and pod start-up at each
    /// count, SVG plots in `target/bench/`; `--other-agent upstream` beside it. 15 to 25
    /// minutes at 250 and 500 pods; needs the machine and the test bed to itself.
    Density(density::DensityArgs),
}

/// Runs `command`, or the summary (`all`) with `all` when there is none, holding the test
/// bed's lock (see the module docs).
pub async fn run(ctx: &Ctx, layout: &Layout, command: Option<BenchCmd>, all: AllArgs) -> Result<()> {
    crate::testbed::require_root()?;
    // Run by the tests crate's `swiftlet-chaos`, which takes the lock itself.
    if let Some(BenchCmd::RuntimeEvents(args)) = &command {
        return runtime_events(ctx, layout, args);
    }
    let _lock = testbed_lock(layout)?;
    let Some(command) = command else { return summary::run(ctx, layout, &all).await };
    match command {
        BenchCmd::All(args) => summary::run(ctx, layout, &args).await,
        BenchCmd::Pleg(args) => pleg::run(ctx, layout, &args).await,
        BenchCmd::Scrape(args) => scrape::run(ctx, layout, &args).await,
        BenchCmd::Eviction(args) => eviction::run(ctx, layout, &args).await,
        BenchCmd::Cluster(args) => fleet::run(ctx, layout, &args).await,
        BenchCmd::Density(args) => density::run(ctx, layout, &args).await,
        BenchCmd::RuntimeEvents(args) => runtime_events(ctx, layout, &args),
    }
}

#[derive(Debug, clap::Args)]
pub struct RuntimeEventsArgs {
    /// Pods of 10 containers.
    #[arg(long, default_value_t = 10)]
    pods: usize,
    /// Where the agent runs: `containerd2` (the node container's containerd 2.4.2),
    /// `containerd1.6` (the node container's containerd 1.6, no event stream) or `host`
    /// (the test bed's containerd 1.6).
    #[arg(long, default_value = "containerd2")]
    node: String,
}

/// `bench runtime-events`: `swiftlet_tests::runtime_events` at full size, release builds.
fn runtime_events(ctx: &Ctx, layout: &Layout, args: &RuntimeEventsArgs) -> Result<()> {
    let mut env = Vec::new();
    if args.node != "host" {
        anyhow::ensure!(
            crate::nodectr::state_file(layout).exists(),
            "the node container is not up: run `cargo xtask testbed up --node-container` first"
        );
        env.push(("SWIFTLET_E2E_NODE", args.node.as_str()));
    }
    let pods = args.pods.to_string();
    let scenario_args = ["--pods".to_owned(), pods, "--containers".to_owned(), "10".to_owned()];
    crate::chaos::run_scenario(ctx, layout, "runtime-events", &scenario_args, true, &env)
}

/// The options every bench takes: what it leaves of the test bed and which agent it measures.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct BedArgs {
    /// Leave the test bed up at the end even if the bench had to bring it up.
    #[arg(long)]
    pub keep_testbed: bool,
    /// Benchmark this swiftlet binary instead of building `target/release/swiftlet`.
    #[arg(long, value_name = "PATH")]
    pub swiftlet_bin: Option<PathBuf>,
}

/// The file whose `flock` serializes the users of one test bed (the end-to-end tests'
/// `CROSS_PROCESS_LOCK`).
fn lock_file(layout: &Layout) -> std::path::PathBuf {
    layout.state.join("e2e.lock")
}

/// Takes the test bed's cross-process lock, waiting for whoever holds it; held until the
/// file is dropped.
pub(crate) fn testbed_lock(layout: &Layout) -> Result<fs::File> {
    fs::create_dir_all(&layout.state).with_context(|| format!("creating {}", layout.state.display()))?;
    let path = lock_file(layout);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let flock = |op| {
        // SAFETY: flock on a descriptor this function owns; the lock goes with the file.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
    };
    if let Err(e) = flock(libc::LOCK_EX | libc::LOCK_NB) {
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(e).with_context(|| format!("flock {}", path.display()));
        }
        eprintln!(
            "bench: waiting for the test bed's lock {} (end-to-end tests or another bench hold it)",
            path.display()
        );
        loop {
            match flock(libc::LOCK_EX) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).with_context(|| format!("flock {}", path.display())),
            }
        }
    }
    eprintln!("bench: holding the test bed's lock {}", path.display());
    Ok(file)
}

/// The end of every bench: takes the test bed down unless `leave_bed_up` (it was up before,
/// or `--keep-testbed`), and returns the first failure among the bench itself, its
/// clean-up, taking the test bed down and writing its report.
pub async fn finish(
    ctx: &Ctx,
    layout: &Layout,
    leave_bed_up: bool,
    outcome: Result<()>,
    cleanup: Result<()>,
    published: Result<()>,
) -> Result<()> {
    let bed = if leave_bed_up {
        Ok(())
    } else {
        eprintln!("bench: the test bed was down before the bench: taking it down");
        crate::testbed::down(ctx, layout).await
    };
    match (outcome, cleanup, bed, published) {
        (Ok(()), Ok(()), Ok(()), Ok(())) => Ok(()),
        (Err(e), ..) | (Ok(()), Err(e), ..) => Err(e),
        (Ok(()), Ok(()), Err(e), _) => Err(e.context("taking the test bed down")),
        (Ok(()), Ok(()), Ok(()), Err(e)) => Err(e.context("writing the report")),
    }
}

/// Whether the test bed is up (its containerd runs) before a bench: a bench leaves it as it
/// found it.
/// Whether the test bed's containerd runs (a bench, fidelity or conformance run leaves the
/// bed as it found it).
pub(crate) fn bed_was_up(layout: &Layout) -> bool {
    State::load(layout).ok().flatten().and_then(|s| s.containerd_pid).is_some_and(containerd::is_alive)
}

/// Runs a bench until it ends or the process is interrupted (SIGINT, SIGTERM); when it
/// stopped, says so and that the clean-up follows (`cleaning`: what it does first). The
/// bench is pinned by the caller, so that its (large) future is not moved into this one.
async fn until_interrupted(bench: Pin<&mut impl Future<Output = Result<()>>>, cleaning: &str) -> Result<()> {
    let outcome = tokio::select! {
        r = bench => r,
        sig = pleg::interrupted() => Err(anyhow!("interrupted ({sig})")),
    };
    if let Err(e) = &outcome {
        eprintln!("bench: stopped: {e:#}");
        eprintln!("bench: cleaning up ({cleaning})");
    }
    outcome
}

/// A bench's clean-up, its failure printed (and returned).
fn said(cleanup: Result<()>) -> Result<()> {
    if let Err(e) = &cleanup {
        eprintln!("bench: {e:#}");
    }
    cleanup
}

/// Brings the test bed up (if it is not) with the host `packages` a bench needs.
async fn bed_up(ctx: &Ctx, layout: &Layout, packages: &[&str]) -> Result<State> {
    let state = testbed::up(ctx, layout).await.context("bringing the test bed up")?;
    apt::ensure(packages)?;
    Ok(state)
}

/// The agent to bench (see [`pleg::swiftlet_binary`]), a CRI client checked to have the
/// test bed to itself, and the environment the report names.
async fn agent_and_runtime(
    ctx: &Ctx,
    layout: &Layout,
    swiftlet_bin: Option<&Path>,
) -> Result<(PathBuf, CriClient, report::Environment)> {
    let binary = pleg::swiftlet_binary(ctx, swiftlet_bin)?;
    let mut cri = CriClient::connect(&layout.socket()).await?;
    pleg::preflight(&mut cri, layout).await?;
    let version = cri.version().await?;
    let env = pleg::environment(ctx, &version, swiftlet_bin);
    Ok((binary, cri, env))
}
