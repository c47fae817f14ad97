//! `cargo xtask test` / `cargo xtask ci`: the whole CI run on one machine.
//!
//! Steps run in order and a failing step does not stop the later ones (except that tests
//! need a build and a test bed), so one run reports every problem. The test bed is always
//! taken down and checked clean, whatever happened before. The last line of stdout is a
//! plain `tests: N passed, N failed, N skipped` summed over every `cargo test` binary, so
//! the result is readable even though `down`'s output follows the test run.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    Ctx, cluster, conformance, fidelity, fuzz, layering, nodectr,
    testbed::{self, Layout},
    upstream,
};

/// The test binaries of the node container's run (see [`NODE_SUITE`]).
const NODE_SUITE_BINARIES: &[&str] = &["e2e", "eviction", "resize", "resource_managers", "security_context", "dra"];

/// The end-to-end tests that run a second time with the agent in the node container
/// (`SWIFTLET_E2E_NODE=containerd2`: systemd as PID 1, `cgroupDriver: systemd`,
/// containerd 2.x), as `cargo test` name filters: the lifecycle, `QoS`, resource manager
/// and eviction scenarios the README's test matrix lists, user namespaces,
/// `supplementalGroupsPolicy: Strict`, image volumes, DRA's CDI devices and the runtime's
/// event stream;
/// about three minutes. Every
/// end-to-end test can run there (`SWIFTLET_E2E_NODE=containerd2 cargo test ...`).
pub const NODE_SUITE: &[&str] = &[
    "evented_pleg::static_pod_runs_with_its_cgroup_and_resources_and_is_removed_completely",
    "evented_pleg::restart_policies_always_onfailure_never",
    "evented_pleg::agent_kill9_and_restart_restarts_no_container",
    "container_killed_from_the_host_is_seen_by_the_kernel",
    "containers_running_before_an_agent_restart_are_adopted_by_the_sensors",
    "oom_killed_container_is_reported_as_oomkilled",
    "cpu_and_memory_resize_in_place_without_restart",
    "static_policy_pins_guaranteed_containers_and_reconciles_the_shared_pool",
    "static_memory_policy_reserves_numa_memory_and_checks_reserved_memory",
    "a_memory_hog_is_evicted_before_the_oom_killer_and_the_guaranteed_pod_stays",
    "a_pod_filling_the_node_filesystem_is_evicted_under_disk_pressure",
    // Features only containerd 2.x has (on 1.6 the same tests check the refusal).
    "host_users_false_runs_the_pod_in_a_user_namespace_of_its_own",
    "supplemental_groups_policy_strict_leaves_out_the_images_groups",
    "an_image_volume_is_mounted_read_only_with_its_sub_path_and_a_missing_image_holds_back_its_container",
    // CDI devices of a DRA claim reach the container (containerd 1.6 has no CDI).
    "a_claim_is_prepared_for_its_pod_its_cdi_device_handed_to_the_container_and_unprepared_after",
    "an_extended_resource_served_by_dra_is_admitted_prepared_and_its_cdi_device_handed_to_the_container",
    // What containerd 2's GetContainerEvents adds (`bench runtime-events` at full size).
    "the_runtimes_event_stream_is_counted_and_timed_against_the_kernel",
];

/// Totals over the `test result:` lines of a `cargo test` run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestTotals {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    pub binaries: u64,
}

impl TestTotals {
    /// Adds one libtest summary line, e.g.
    /// `test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; ...`.
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        self.binaries += 1;
        for part in rest.split([';', '.']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

struct Report {
    results: Vec<(String, Result<(), String>, f64)>,
    step: usize,
    total: usize,
    /// Where the build output goes: the disk whose free space each header shows.
    target_dir: PathBuf,
    /// Free bytes there before the first step, and the least seen before any step since
    /// (with that step's name): a run that fills the disk says where it did.
    disk_start: Option<u64>,
    disk_low: Option<(u64, String)>,
}

impl Report {
    fn new(target_dir: &Path, total: usize) -> Self {
        let disk_start = free_bytes(target_dir);
        if let Some(free) = disk_start {
            println!("disk: {} free on the file system of {}", gb(free), target_dir.display());
            if free < DISK_WANTED {
                println!(
                    "warning: a cold run writes about {} (cargo's target/ and fuzz/target, the Go build and \
                     module caches, the test bed's images); only {} is free",
                    gb(DISK_WANTED),
                    gb(free)
                );
            }
        }
        Self { results: Vec::new(), step: 0, total, target_dir: target_dir.to_path_buf(), disk_start, disk_low: None }
    }

    fn header(&mut self, name: &str) -> Instant {
        self.step += 1;
        let free = free_bytes(&self.target_dir);
        if let Some(free) = free
            && self.disk_low.as_ref().is_none_or(|(low, _)| free < *low)
        {
            self.disk_low = Some((free, name.to_owned()));
        }
        println!();
        let disk = free.map(|f| format!(" [disk: {} free]", gb(f))).unwrap_or_default();
        println!("==> [{}/{}] {name}{disk}", self.step, self.total);
        flush();
        Instant::now()
    }

    /// One line on the disk: free at the start, at the least, at the end.
    fn disk_line(&self) -> Option<String> {
        let start = self.disk_start?;
        let end = free_bytes(&self.target_dir)?;
        let low = self.disk_low.as_ref().map_or(String::new(), |(low, step)| format!(", {} before {step}", gb(*low)));
        Some(format!("disk: {} free at the start{low}, {} at the end", gb(start), gb(end)))
    }

    fn record(&mut self, name: &str, started: Instant, result: Result<()>) -> bool {
        let secs = started.elapsed().as_secs_f64();
        let ok = result.is_ok();
        match &result {
            Ok(()) => println!("<== {name}: ok ({secs:.0}s)"),
            Err(e) => println!("<== {name}: FAILED ({secs:.0}s): {e:#}"),
        }
        flush();
        self.results.push((name.to_owned(), result.map_err(|e| format!("{e:#}")), secs));
        ok
    }

    fn skip(&mut self, name: &str, why: &str) {
        self.step += 1;
        println!();
        println!("==> [{}/{}] {name}: SKIPPED ({why})", self.step, self.total);
        self.results.push((name.to_owned(), Err(format!("skipped: {why}")), 0.0));
    }
}

/// About what a cold run (a fresh machine) writes, summed from its parts as measured on
/// this machine kind on 2026-12-06: cargo's `target/` about 11 GB (the workspace build 8.4,
/// clippy's and xtask's own), the Go build cache about 7 GB (4.1 for the control plane's
/// binaries, the rest for e2e.test, containerd 2 and the CSI sidecars), the Go module
/// cache 2 GB, `fuzz/target` 5.4 GB (the fuzz step's `--dev` builds), the upstream
/// binaries, the test bed's images and the node container. Below it, the run warns at its
/// start why a later step may fail for want of space.
const DISK_WANTED: u64 = 30_000_000_000;

/// Free bytes for an unprivileged writer on the file system holding `path` (`None` when
/// it cannot be asked).
fn free_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is NUL-terminated and outlives the call; `st` is written by a statvfs
    // that returns 0 and read only then.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Bytes as gigabytes with one decimal.
fn gb(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / 1e9;
    format!("{g:.1} GB")
}

fn flush() {
    let _ = std::io::stdout().flush();
}

fn run_status(mut cmd: Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} exited with {status}");
    }
    Ok(())
}

/// Runs `cargo test`, copying its stdout through line by line (CI reads it) and summing
/// its results. `--no-fail-fast`: a failing test binary must not hide the results of the
/// binaries after it.
fn cargo_test(ctx: &Ctx, layout: &Layout, test_args: &[String], totals: &mut TestTotals) -> Result<()> {
    cargo_test_of(ctx, layout, &["--workspace"], test_args, &[], totals)
}

/// `cargo test <selection> --locked --no-fail-fast -- <test_args>` with the test bed's
/// environment and `env`.
fn cargo_test_of(
    ctx: &Ctx,
    layout: &Layout,
    selection: &[&str],
    test_args: &[String],
    env: &[(&str, &str)],
    totals: &mut TestTotals,
) -> Result<()> {
    let mut cmd = ctx.cargo(&["test"]);
    cmd.args(selection).args(["--locked", "--no-fail-fast"]);
    if !test_args.is_empty() {
        cmd.arg("--").args(test_args);
    }
    cmd.envs(env.iter().copied());
    cmd.env("SWIFTLET_CRI_ENDPOINT", layout.endpoint())
        .env("SWIFTLET_TESTBED", "1")
        .env("SWIFTLET_REGISTRY_STATE", layout.registry_state_file())
        .env("SWIFTLET_CLUSTER_STATE", cluster::state_file(layout))
        .env("SWIFTLET_NODE_CONTAINER_STATE", nodectr::state_file(layout))
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().context("running cargo test")?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        println!("{line}");
        totals.add_line(&line);
    }
    flush();
    let status = child.wait().context("waiting for cargo test")?;
    if !status.success() {
        bail!("cargo test exited with {status}");
    }
    if totals.binaries == 0 {
        bail!("cargo test ran no test binary");
    }
    Ok(())
}

pub async fn run(ctx: &Ctx, layout: &Layout, test_args: &[String]) -> Result<()> {
    let mut r = Report::new(&ctx.target_dir, 15);
    let mut totals = TestTotals::default();

    let t = r.header("testbed up (apt packages, images, containerd, registries)");
    let bed_up = r.record("testbed up", t, testbed::up(ctx, layout).await.map(drop));

    // The real control plane the API-mode tests run against: the upstream binaries are
    // built from the Go modules (skipped when go.mod/go.sum are unchanged since the last
    // build) and started once for every test.
    let cluster_up = if bed_up {
        let t = r.header(&format!("upstream {} binaries, control plane (testbed up --cluster)", upstream::VERSION));
        r.record("cluster up", t, cluster::up(&upstream::Upstream::new(ctx), layout).map(drop))
    } else {
        r.skip("cluster up", "test bed is not up");
        false
    };

    // A node with systemd as PID 1 for the systemd cgroup driver's end-to-end test
    // (tests/tests/systemd_node.rs); its root filesystem is cached after the first run.
    let node_up = if bed_up {
        let t = r.header("node container (testbed up --node-container: systemd, containerd with SystemdCgroup)");
        r.record("node container up", t, nodectr::up(ctx, layout).await.map(drop))
    } else {
        r.skip("node container up", "test bed is not up");
        false
    };

    let t = r.header("cargo build --workspace --all-targets --locked");
    let built = r.record(
        "build",
        t,
        run_status(ctx.cargo(&["build", "--workspace", "--all-targets", "--locked"]), "cargo build"),
    );

    let t = r.header("cargo fmt --all --check");
    r.record("fmt", t, run_status(ctx.cargo(&["fmt", "--all", "--check"]), "cargo fmt --check"));

    // Reads the sources: the leaf modules use only leaves (and the module cycles, printed).
    let t = r.header("cargo xtask layering (leaf modules use only leaves)");
    r.record("layering", t, layering::run(&ctx.workspace));

    let t = r.header("cargo clippy --workspace --all-targets --locked -- -D warnings");
    r.record(
        "clippy",
        t,
        run_status(
            ctx.cargo(&["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"]),
            "cargo clippy",
        ),
    );

    // A short run of every fuzz target on its committed seeds (cargo-fuzz needs nightly:
    // without it the step is skipped, and so failed).
    if fuzz::nightly_available() {
        let dev = if fuzz::CI_DEV { " --dev" } else { "" };
        let t = r.header(&format!("cargo xtask fuzz{dev} --time {} (each target)", fuzz::CI_SECS));
        r.record("fuzz", t, fuzz::run(ctx, fuzz::CI_SECS, &[], fuzz::CI_DEV));
    } else {
        r.skip("fuzz", "no nightly toolchain for cargo-fuzz (rustup toolchain install nightly)");
    }

    if bed_up {
        let t = r.header("testbed smoke (CNI pod, hostPort)");
        r.record("testbed smoke", t, testbed::smoke(layout, false).await);
    } else {
        r.skip("testbed smoke", "test bed is not up");
    }

    if !cluster_up {
        println!("warning: no control plane: the tests on the real kube-apiserver (tests/tests/cluster.rs) will fail");
    }
    if built && bed_up {
        let t = r.header(&format!(
            "cargo test --workspace --locked (SWIFTLET_CRI_ENDPOINT={}, SWIFTLET_TESTBED=1)",
            layout.endpoint()
        ));
        let result = cargo_test(ctx, layout, test_args, &mut totals);
        r.record("test", t, result);
    } else {
        r.skip("test", if built { "test bed is not up" } else { "build failed" });
    }

    // The lifecycle, QoS (resize), resource manager and eviction scenarios of NODE_SUITE
    // again with the agent in the node container: systemd as PID 1, `cgroupDriver:
    // systemd`, containerd 2.x (the README's table says which combinations run where).
    if built && node_up {
        let t = r.header("node e2e: a subset in the node container (systemd driver, containerd 2.x)");
        let mut args: Vec<String> = NODE_SUITE.iter().map(|t| (*t).to_owned()).collect();
        args.push("--test-threads=1".to_owned());
        // `--workspace` (not `-p swiftlet-tests`): the same features as the build step's, so
        // the test binaries are the ones already built (see `Ctx::build_bins`).
        let mut selection = vec!["--workspace"];
        selection.extend(NODE_SUITE_BINARIES.iter().flat_map(|b| ["--test", *b]));
        let env = [("SWIFTLET_E2E_NODE", "containerd2")];
        r.record("node e2e", t, cargo_test_of(ctx, layout, &selection, &args, &env, &mut totals));
    } else {
        r.skip("node e2e", if built { "the node container is not up" } else { "build failed" });
    }

    // The same fast scenarios on swiftlet and on the upstream kubelet, and the diff of what
    // the API shows (fails on a difference the README does not document).
    if built && cluster_up {
        let t = r.header("cargo xtask fidelity --fast (swiftlet beside the upstream kubelet)");
        let args = fidelity::FidelityArgs { fast: true, scenarios: Vec::new(), swiftlet_bin: None, keep_testbed: true };
        r.record("fidelity", t, fidelity::run(ctx, layout, &args).await);
    } else {
        r.skip("fidelity", if built { "no control plane" } else { "build failed" });
    }

    // A fixed subset of upstream's node conformance suite (built from the Go modules) on
    // a swiftlet node; the whole suite, beside the upstream kubelet, is `cargo xtask
    // conformance`.
    if built && cluster_up {
        let t = r.header("cargo xtask conformance --ci (a subset of upstream's node e2e suite on swiftlet)");
        let args = conformance::ConformanceArgs {
            focus: None,
            skip: None,
            agents: Vec::new(),
            procs: None,
            ci: true,
            list: false,
            swiftlet_bin: None,
            keep_testbed: true,
        };
        r.record("conformance", t, conformance::run(ctx, layout, &args).await);
    } else {
        r.skip("conformance", if built { "no control plane" } else { "build failed" });
    }

    // Always: whatever failed above, leave the machine as we found it.
    let t = r.header("testbed down");
    r.record("testbed down", t, testbed::down(ctx, layout).await);
    let t = r.header("testbed check-clean");
    r.record("check-clean", t, testbed::check_clean_cmd(ctx, layout));

    println!();
    println!("==> summary");
    let mut failed = Vec::new();
    for (name, result, secs) in &r.results {
        match result {
            Ok(()) => println!("    ok      {name} ({secs:.0}s)"),
            Err(e) => {
                println!("    FAILED  {name}: {}", first_line(e));
                failed.push(name.clone());
            }
        }
    }
    if let Some(disk) = r.disk_line() {
        println!("{disk}");
    }
    println!("tests: {} passed, {} failed, {} skipped", totals.passed, totals.failed, totals.ignored);
    flush();
    if failed.is_empty() { Ok(()) } else { bail!("failed: {}", failed.join(", ")) }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_read_through_the_nearest_existing_directory() {
        let dir = std::env::temp_dir();
        let free = free_bytes(&dir).expect("statvfs of the temporary directory");
        assert!(free > 0);
        // A target directory not made yet is on the disk of its parent.
        let missing = dir.join(format!("swiftlet-xtask-{}/target/debug", std::process::id()));
        assert!(!missing.exists());
        let later = free_bytes(&missing).expect("statvfs through the parent");
        assert!(later.abs_diff(free) < 1_000_000_000, "{later} vs {free}");
        assert_eq!(gb(1_240_000_000), "1.2 GB");
        assert_eq!(gb(41_960_000_000), "42.0 GB");
    }

    #[test]
    fn sums_libtest_result_lines() {
        let mut t = TestTotals::default();
        t.add_line("test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s");
        t.add_line("   Doc-tests swiftlet");
        t.add_line(
            "test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 5 filtered out; finished in 1.50s",
        );
        t.add_line("test foo ... ok");
        assert_eq!(t, TestTotals { passed: 13, failed: 2, ignored: 1, binaries: 2 });
    }
}
