//! `cargo xtask chaos <scenario>`: the long fault scenarios of `swiftlet_tests::chaos`
//! against the test bed, at full size, with their figures printed. They take minutes to
//! tens of minutes, so they never run in CI; the fault matrix's tests
//! (`tests/tests/faults`) run the same code smaller there.
//!
//! Builds the agent and `swiftlet-chaos` (the tests crate's binary that runs a scenario)
//! and runs it with the test bed's environment, as `cargo xtask test` runs the tests. A
//! new scenario is a function in `tests/src/chaos.rs`, a subcommand of `swiftlet-chaos`
//! and a variant of [`Scenario`].

use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use clap::ValueEnum;

use crate::{Ctx, cluster, testbed::Layout};

/// The scenarios (each a subcommand of `swiftlet-chaos` of the same name).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Scenario {
    /// 1,000 static pods created and deleted, 100 at a time, after a warm-up round of
    /// 100: the agent's memory and descriptors back at their baseline, nothing of any pod
    /// left (about 12 minutes).
    Churn,
    /// kube-apiserver stopped for 5 minutes under a joined node (`swiftlet_tests::outage`;
    /// CI runs it for 60 s): pods run and are probed, the agent restarts what dies alone,
    /// status, Lease and node converge after, no pod evicted (about 7 minutes; needs
    /// `testbed up --cluster`).
    ApiOutage,
}

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// The scenario.
    scenario: Scenario,
    /// Run release builds (default: the debug builds the tests run).
    #[arg(long)]
    release: bool,
    /// More arguments for the scenario, after `--` (`cargo xtask chaos churn -- --help`).
    #[arg(last = true)]
    args: Vec<String>,
}

pub fn run(ctx: &Ctx, layout: &Layout, args: &ChaosArgs) -> Result<()> {
    let name = args.scenario.to_possible_value().context("a scenario has a name")?.get_name().to_owned();
    run_scenario(ctx, layout, &name, &args.args, args.release, &[])
}

/// Builds the agent and `swiftlet-chaos` and runs its scenario `name` with `args` and the
/// test bed's environment plus `env`.
pub fn run_scenario(
    ctx: &Ctx,
    layout: &Layout,
    name: &str,
    args: &[String],
    release: bool,
    env: &[(&str, &str)],
) -> Result<()> {
    ensure!(layout.socket().exists(), "the test bed is not up: run `cargo xtask testbed up` first");
    let bin_dir = ctx.build_bins(&["swiftlet", "swiftlet-chaos"], release)?;
    eprintln!("==> swiftlet-chaos {name} {}", args.join(" "));
    let status = Command::new(bin_dir.join("swiftlet-chaos"))
        .arg(name)
        .args(args)
        .current_dir(&ctx.workspace)
        .env("SWIFTLET_BIN", bin_dir.join("swiftlet"))
        .env("SWIFTLET_CRI_ENDPOINT", layout.endpoint())
        .env("SWIFTLET_TESTBED", "1")
        .env("SWIFTLET_REGISTRY_STATE", layout.registry_state_file())
        .env("SWIFTLET_CLUSTER_STATE", cluster::state_file(layout))
        .envs(env.iter().copied())
        .status()
        .context("running swiftlet-chaos")?;
    ensure!(status.success(), "{name} failed ({status})");
    Ok(())
}
