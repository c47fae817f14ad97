//! `cargo xtask bench [<what>]`: benchmarks on this machine against the test bed. They print
//! figures (and write them under `target/bench/`); they are not tests and never run in CI.
//!
//! - no subcommand, or `all`: one table of every figure with a target — pod start-up
//!   (single pod, 30- and 100-pod bursts, against the runtime's own start), exit
//!   detection, idle cost, scrape cost, eviction reaction — for swiftlet and optionally
//!   another node agent (`--other-agent`), beside the upstream kubelet's figures.
//! - `pleg`: container exit → pod worker → pod status latency, CPU per event, idle CPU and
//!   RSS, for the evented (eBPF) PLEG and the 1 s relisting PLEG side by side.
//! - `scrape`: wall time and agent CPU per scrape of `/metrics`, `/metrics/cadvisor`,
//!   `/metrics/resource` and `/stats/summary` with 100 and 250 running containers, against
//!   the upstream kubelet's figures.
//! - `eviction`: memory threshold crossed → eviction decision, with the kernel's signals
//!   and with the periodic 10 s pass alone.

mod agent;
mod apiserver;
mod cluster;
mod eviction;
mod https;
mod latency;
mod pleg;
mod procfs;
mod records;
mod report;
mod scrape;
mod summary;
mod watch;

use anyhow::Result;
use clap::Subcommand;

pub use summary::AllArgs;

use crate::{Ctx, testbed::Layout};

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Everything with a target in one table (what `cargo xtask bench` alone runs): pod
    /// start-up, exit detection, idle cost, scrape cost, eviction; swiftlet and
    /// `--other-agent`. About 7 minutes for swiftlet alone, 13 with another agent; needs
    /// the machine and the test bed to itself.
    All(AllArgs),
    /// PLEG latency (kill → pod worker → pod status), CPU per event, idle CPU and RSS with
    /// many pods: evented vs relist. Takes about 12 minutes; needs the machine and the test bed to itself.
    Pleg(pleg::PlegArgs),
    /// Wall time and agent CPU per scrape of /metrics, /metrics/cadvisor, /metrics/resource
    /// and /stats/summary at 100 and 250 running containers, against kubelet 1.28. Takes
    /// 10 to 15 minutes; needs the machine and the test bed to itself.
    Scrape(scrape::ScrapeArgs),
    /// Memory threshold crossed → eviction decision, with the kernel's signals (the
    /// default) and with the periodic 10 s pass alone, side by side (20 runs each by
    /// default, about 2 and 5 minutes); needs the machine and the test bed to itself.
    Eviction(eviction::EvictionArgs),
}

/// Runs `command`, or the summary (`all`) with `all` when there is none.
pub async fn run(ctx: &Ctx, layout: &Layout, command: Option<BenchCmd>, all: AllArgs) -> Result<()> {
    let Some(command) = command else { return summary::run(ctx, layout, &all).await };
    match command {
        BenchCmd::All(args) => summary::run(ctx, layout, &args).await,
        BenchCmd::Pleg(args) => pleg::run(ctx, layout, &args).await,
        BenchCmd::Scrape(args) => scrape::run(ctx, layout, &args).await,
        BenchCmd::Eviction(args) => eviction::run(ctx, layout, &args).await,
    }
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
