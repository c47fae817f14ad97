//! `cargo xtask bench <what>`: benchmarks on this machine against the test bed. They print
//! figures (and write them under `target/bench/`); they are not tests and never run in CI.
//!
//! - `pleg`: container exit → pod worker → pod status latency, CPU per event, idle CPU and
//!   RSS, for the evented (eBPF) PLEG and the 1 s relisting PLEG side by side.

mod agent;
mod latency;
mod pleg;
mod procfs;
mod records;
mod report;

use anyhow::Result;
use clap::Subcommand;

use crate::{Ctx, testbed::Layout};

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// PLEG latency (kill → pod worker → pod status), CPU per event, idle CPU and RSS with
    /// many pods: evented vs relist. Takes about 12 minutes; needs the machine and the test bed to itself.
    Pleg(pleg::PlegArgs),
}

pub async fn run(ctx: &Ctx, layout: &Layout, command: BenchCmd) -> Result<()> {
    match command {
        BenchCmd::Pleg(args) => pleg::run(ctx, layout, &args).await,
    }
}
