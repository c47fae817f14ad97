//! swiftlet developer tasks: `cargo xtask <command>`.
//!
//! - `testbed up|down|status|check-clean|smoke`: a private containerd with CNI and local
//!   images, for end-to-end tests (see `testbed`).
//! - `testbed up --cluster`: the same plus the real control plane (etcd, kube-apiserver,
//!   kube-controller-manager, kube-scheduler) on loopback (see `cluster`).
//! - `upstream build`: the upstream Kubernetes binaries and the CSI sidecars from the Go
//!   modules (see `upstream`).
//! - `registry up|down|status`: the test bed's image registries on loopback (plain HTTP,
//!   and HTTPS with basic auth), holding the local images (see `registry`).
//! - `test` (alias `ci`): what CI runs: test bed up, build, fmt, layering, clippy, fuzz, tests,
//!   test bed down, check-clean.
//! - `demo`: the agent in the foreground against the test bed.
//! - `bench` (`bench all`): every figure with a target in one table, swiftlet and
//!   optionally another node agent (figures, not a test).
//! - `bench pleg`: PLEG latency and agent cost, evented vs relist.
//! - `bench scrape`: wall time and agent CPU per scrape of each metrics endpoint.
//! - `bench eviction`: memory threshold crossed → eviction decision, kernel signals vs
//!   the 10 s pass.
//! - `fidelity [--fast]`: the same scenarios on swiftlet and on the upstream kubelet, and
//!   the diff of what the API shows of them (see `fidelity`).
//! - `conformance [--focus RE] [--agent swiftlet|upstream]`: upstream's node conformance
//!   tests (the e2e suite, built from the Go modules) against a swiftlet node and an
//!   upstream kubelet node, side by side (see `conformance`).
//! - `chaos <scenario>`: long fault scenarios (`churn`: 1,000 pods created and deleted),
//!   figures printed (never in CI; the fault matrix's tests run them smaller).
//! - `layering`: checks that the leaf modules of `agent/src` use only leaves, and prints
//!   the cycles between its top-level modules (see `layering`; a CI step).
//! - `fuzz [--time SECS] [TARGET...]`: the cargo-fuzz targets of `fuzz/`; `fuzz --minimize`
//!   folds what they found into the committed corpora (see `fuzz`).
//!
//! xtask builds with no system tools (no protoc, no clang): it is what installs them.

mod apt;
mod bench;
mod chaos;
mod ci;
mod cleanup;
mod cluster;
mod conformance;
mod containerd;
mod containerd2;
mod cri;
mod demo;
mod fidelity;
mod fuzz;
mod images;
mod layering;
mod nodectr;
mod registry;
mod testbed;
mod upstream;

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = "swiftlet developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Manage the containerd test bed.
    Testbed {
        #[command(subcommand)]
        command: TestbedCmd,
    },
    /// Manage the test bed's image registries (`testbed up` starts them too).
    Registry {
        #[command(subcommand)]
        command: RegistryCmd,
        /// The test bed root dir (default: the standard test bed's).
        #[arg(long, global = true, requires = "state_dir")]
        root_dir: Option<PathBuf>,
        /// The test bed state dir (default: the standard test bed's).
        #[arg(long, global = true, requires = "root_dir")]
        state_dir: Option<PathBuf>,
    },
    /// Run what CI runs: test bed up, build, fmt, layering, clippy, fuzz, tests, test bed down,
    /// check-clean.
    Test {
        /// Extra arguments for the test binaries (after `cargo test ... --`).
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// Same as `test`.
    Ci {
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// Bring the test bed up and run the agent against it in the foreground.
    Demo {
        /// Join the test bed's real control plane (`testbed up --cluster`, kube-apiserver on
        /// 127.0.0.1:6443) by TLS bootstrap instead of running standalone, and run a
        /// Deployment on the node.
        #[arg(long)]
        cluster: bool,
    },
    /// The upstream Kubernetes binaries (kube-apiserver, kube-controller-manager,
    /// kube-scheduler, kubelet, kubectl, etcd) and the CSI sidecars (csi-provisioner,
    /// csi-resizer) built from the Go modules.
    Upstream {
        #[command(subcommand)]
        command: UpstreamCmd,
    },
    /// Benchmarks against the test bed; they print figures (never run in CI). Without a
    /// subcommand: the summary of every figure with a target (`bench all`).
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        command: Option<bench::BenchCmd>,
        #[command(flatten)]
        all: bench::AllArgs,
    },
    /// The same scenarios on swiftlet and on the upstream kubelet, joined in turn to the test
    /// bed's real control plane, and the diff of what the API shows (fails on any
    /// difference the README does not document).
    Fidelity(fidelity::FidelityArgs),
    /// Upstream's node conformance tests (`[NodeConformance]` and sig-node `[Conformance]`
    /// of the e2e suite v1.37.2, built from the Go modules) against a swiftlet node and an
    /// upstream kubelet node; fails when a test passes on the kubelet and not on swiftlet.
    Conformance(conformance::ConformanceArgs),
    /// Long fault scenarios against the test bed, at full size; they print figures and
    /// fail when their checks do (never run in CI).
    Chaos(chaos::ChaosArgs),
    /// Check that the leaf modules of `agent/src` use only leaves (reads the sources, no
    /// build), and print the cycles between its top-level modules.
    Layering,
    /// Run the fuzz targets of `fuzz/` (cargo-fuzz, nightly), each for a fixed time.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = fuzz::DEFAULT_SECS)]
        time: u64,
        /// Instead of fuzzing: fold what runs found into `fuzz/corpus/<target>/`, keeping
        /// at most 200 inputs (the hand-written seeds, then those adding the most edges).
        #[arg(long, conflicts_with = "time")]
        minimize: bool,
        /// Build the targets without optimisations (`cargo fuzz --dev`; CI does): a faster
        /// build, slower runs. `--minimize` needs a run without it first.
        #[arg(long, conflicts_with = "minimize")]
        dev: bool,
        /// The targets (default: all of them).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(fuzz::TARGETS))]
        targets: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum TestbedCmd {
    /// Install packages, build and import images, start containerd; print the endpoint.
    Up {
        /// Also build the upstream binaries and start the real control plane (etcd,
        /// kube-apiserver, kube-controller-manager, kube-scheduler) on 127.0.0.1.
        #[arg(long)]
        cluster: bool,
        /// Also boot a node in a container: systemd as its PID 1, containerd with the
        /// systemd cgroup driver, its own address on the bridge swl-nodes (`nodectr`).
        #[arg(long)]
        node_container: bool,
    },
    /// Drain pods, stop containerd and remove everything the test bed created.
    Down {
        /// Only the node container (`up --node-container`): the rest stays up.
        #[arg(long)]
        node_container: bool,
    },
    /// Show whether the test bed is up (exit 1 if not).
    Status,
    /// List anything the test bed left behind (exit 1 if any).
    CheckClean,
    /// Run one CNI pod with a hostPort and check it answers.
    Smoke {
        /// Leave the pod running (to exercise `down`).
        #[arg(long)]
        keep: bool,
    },
}

#[derive(Debug, Subcommand)]
enum UpstreamCmd {
    /// Build them into `target/upstream/` unless go.mod and go.sum are unchanged since.
    Build,
}

#[derive(Debug, Subcommand)]
enum RegistryCmd {
    /// Install docker-registry and skopeo, start both registries, push the local images.
    Up {
        /// Port of the plain HTTP registry on 127.0.0.1.
        #[arg(long, default_value_t = registry::Ports::default().plain)]
        plain_port: u16,
        /// Port of the HTTPS + basic auth registry on 127.0.0.1.
        #[arg(long, default_value_t = registry::Ports::default().tls)]
        tls_port: u16,
    },
    /// Stop the registries and remove their files.
    Down,
    /// Show whether the registries are up (exit 1 if not).
    Status,
}

/// Where the workspace and its build output are.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub workspace: PathBuf,
    pub target_dir: PathBuf,
    /// The cargo that runs us (`$CARGO`), for the build and test steps.
    pub cargo: PathBuf,
}

impl Ctx {
    fn from_env() -> Self {
        let workspace =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), PathBuf::from);
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            // A relative CARGO_TARGET_DIR is relative to where cargo was started.
            .map_or_else(|| workspace.join("target"), |t| std::env::current_dir().unwrap_or_default().join(t));
        let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
        Self { workspace, target_dir, cargo }
    }

    /// `cargo <args>` in the workspace, without the package variables `cargo run` gave this
    /// process (`CARGO_PKG_*`, `CARGO_MANIFEST_*`): build scripts that declare them with
    /// `rerun-if-env-changed` (ring's does) would otherwise see other values than in a
    /// shell's `cargo build`, and the two would rebuild ring and all above it in turn.
    #[must_use]
    pub fn cargo(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.cargo);
        cmd.args(args).current_dir(&self.workspace);
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_") || key.starts_with("CARGO_MANIFEST_") {
                cmd.env_remove(key.as_ref());
            }
        }
        cmd
    }

    /// Builds the workspace binaries `bins` and returns the directory they are in
    /// (`<target>/debug` or `<target>/release`).
    ///
    /// Always `--workspace`: Cargo turns on a dependency's features according to the
    /// packages a command selects, so `cargo build -p swiftlet` compiles about 150
    /// dependencies a second time beside those of CI's `cargo build --workspace
    /// --all-targets` (80 s and gigabytes of `target/` on two cores, enough to fill a CI
    /// machine's disk). Selected from the workspace, the binaries reuse that build and the
    /// step is a relink at most.
    pub fn build_bins(&self, bins: &[&str], release: bool) -> anyhow::Result<PathBuf> {
        let mut cmd = self.cargo(&["build", "--workspace", "--locked"]);
        for bin in bins {
            cmd.args(["--bin", bin]);
        }
        if release {
            cmd.arg("--release");
        }
        eprintln!(
            "==> cargo build --workspace{} --bin {}",
            if release { " --release" } else { "" },
            bins.join(" --bin ")
        );
        let status = cmd.status().context("running cargo build")?;
        anyhow::ensure!(status.success(), "cargo build of {} failed ({status})", bins.join(", "));
        Ok(self.target_dir.join(if release { "release" } else { "debug" }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let ctx = Ctx::from_env();
    let layout = testbed::Layout::standard();
    let result = match cli.command {
        Cmd::Testbed { command } => match command {
            TestbedCmd::Up { cluster, node_container } => {
                let up = testbed::up(&ctx, &layout).await.and_then(|_| {
                    if cluster { cluster::up(&upstream::Upstream::new(&ctx), &layout).map(drop) } else { Ok(()) }
                });
                match up {
                    Ok(()) if node_container => nodectr::up(&ctx, &layout).await.map(drop),
                    other => other,
                }
            }
            TestbedCmd::Down { node_container: true } => nodectr::down(&layout),
            TestbedCmd::Down { node_container: false } => testbed::down(&ctx, &layout).await,
            TestbedCmd::Status => testbed::status(&layout).await,
            TestbedCmd::CheckClean => testbed::check_clean_cmd(&ctx, &layout),
            TestbedCmd::Smoke { keep } => testbed::smoke(&layout, keep).await,
        },
        Cmd::Registry { command, root_dir, state_dir } => {
            let layout = match (root_dir, state_dir) {
                (Some(root), Some(state)) => testbed::Layout::new(root, state),
                _ => layout,
            };
            match command {
                RegistryCmd::Up { plain_port, tls_port } => {
                    registry::up_cmd(&ctx, &layout, registry::Ports { plain: plain_port, tls: tls_port })
                }
                RegistryCmd::Down => registry::down(&ctx, &layout),
                RegistryCmd::Status => registry::status(&layout),
            }
        }
        Cmd::Upstream { command: UpstreamCmd::Build } => upstream::Upstream::new(&ctx).build(),
        Cmd::Test { test_args } | Cmd::Ci { test_args } => ci::run(&ctx, &layout, &test_args).await,
        Cmd::Demo { cluster } => demo::run(&ctx, &layout, cluster).await,
        Cmd::Bench { command, all } => bench::run(&ctx, &layout, command, all).await,
        Cmd::Chaos(args) => chaos::run(&ctx, &layout, &args),
        Cmd::Fidelity(args) => fidelity::run(&ctx, &layout, &args).await,
        Cmd::Conformance(args) => conformance::run(&ctx, &layout, &args).await,
        Cmd::Layering => layering::run(&ctx.workspace),
        Cmd::Fuzz { time, targets, minimize, dev } => {
            if minimize {
                fuzz::minimize(&ctx, &targets)
            } else {
                fuzz::run(&ctx, time, &targets, dev)
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
