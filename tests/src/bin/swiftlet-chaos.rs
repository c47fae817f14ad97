//! `swiftlet-chaos <scenario>`: a long fault scenario of `swiftlet_tests::chaos` (or
//! `swiftlet_tests::outage`) against
//! the test bed, at full size, printing its figures; what `cargo xtask chaos` runs (never
//! in CI: the fault matrix's tests run the same scenarios smaller). Exits 1 when the
//! scenario fails or its figures fail their checks.
//!
//! Needs the test bed (`cargo xtask testbed up`) and the agent binary (`SWIFTLET_BIN`);
//! takes the test bed lock, so it waits for running end-to-end tests and they for it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use swiftlet_tests::chaos::{self, ChurnPlan};
use swiftlet_tests::runtime_events;

#[derive(Debug, Parser)]
#[command(name = "swiftlet-chaos", about = "long fault scenarios against the test bed")]
struct Args {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Static pods created and deleted by the hundred: the agent's memory and descriptors
    /// back at their baseline, nothing of any pod left.
    Churn {
        /// Rounds after the warm-up round.
        #[arg(long, default_value_t = ChurnPlan::FULL.rounds)]
        rounds: usize,
        /// Pods per round.
        #[arg(long, default_value_t = ChurnPlan::FULL.pods)]
        pods: usize,
    },
    /// Containers killed from the host, one at a time then all at once: what the
    /// runtime's `GetContainerEvents` stream adds to the kernel's events
    /// (`swiftlet_tests::runtime_events`; `cargo xtask bench runtime-events`).
    RuntimeEvents {
        /// Pods.
        #[arg(long, default_value_t = runtime_events::Plan::FULL.pods)]
        pods: usize,
        /// Containers per pod.
        #[arg(long, default_value_t = runtime_events::Plan::FULL.containers)]
        containers: usize,
    },
    /// kube-apiserver stopped under a joined node (`swiftlet_tests::outage`).
    ApiOutage {
        /// How long the API server stays away, in seconds.
        #[arg(long, default_value_t = 300)]
        seconds: u64,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let _lock = swiftlet_tests::testbed_lock().await;
    let started = std::time::Instant::now();
    let outcome = match args.scenario {
        Scenario::Churn { rounds, pods } => match chaos::churn(ChurnPlan { pods, rounds }).await {
            Ok(report) => {
                println!("{}", report.summary());
                report.check()
            }
            Err(e) => Err(e),
        },
        Scenario::RuntimeEvents { pods, containers } => {
            let plan = runtime_events::Plan { pods, containers, ..runtime_events::Plan::FULL };
            match runtime_events::run(plan).await {
                Ok(report) => {
                    println!("{}", report.table());
                    report.check()
                }
                Err(e) => Err(e),
            }
        }
        Scenario::ApiOutage { seconds } => {
            swiftlet_tests::outage::api_server_outage("chaos-outage", std::time::Duration::from_secs(seconds))
                .await
                .map(|figures| println!("{figures}"))
        }
    };
    println!("chaos: {:.0} s", started.elapsed().as_secs_f64());
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chaos: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}
