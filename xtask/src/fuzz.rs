//! `cargo xtask fuzz [--time SECS] [TARGET...]`: the cargo-fuzz targets of `fuzz/` (the
//! configuration and flags, static pod manifests, quantities, the HTTP API's paths and
//! queries), each for a fixed time; CI runs every one for [`CI_SECS`].
//!
//! cargo-fuzz needs the nightly toolchain: without one this fails and says how to install
//! it (CI then reports the step as skipped, which fails the run). A missing `cargo-fuzz`
//! is installed from crates.io (`cargo install cargo-fuzz --locked`), saying so first.
//!
//! The targets are built once, without a sanitizer (they are safe Rust; debug assertions
//! and overflow checks stay on, as cargo-fuzz builds them), in `fuzz/target/`. Each run
//! reads the committed seeds in `fuzz/corpus/<target>/` and writes what it finds to
//! `fuzz/target/corpus/<target>/` (kept between runs, never committed; `cargo fuzz cmin`
//! folds it into the seeds, see README "Fuzzing"). A crash, a panic, a timeout
//! ([`TIMEOUT_SECS`] for one input) or running out of memory fails the run, printing the
//! input's path under `fuzz/artifacts/<target>/`. Each run gets an empty scratch `TMPDIR`
//! (the targets write their fixtures there), removed afterwards.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::Ctx;

/// Every target, in the order they run.
pub const TARGETS: [&str; 4] = ["config", "manifest", "quantity", "http_paths"];
/// Seconds per target of `cargo xtask fuzz` without `--time`.
pub const DEFAULT_SECS: u64 = 60;
/// Seconds per target in CI.
pub const CI_SECS: u64 = 20;
/// One input taking longer than this is a hang (libFuzzer `-timeout`).
pub const TIMEOUT_SECS: u64 = 10;

/// What libFuzzer's final statistics say about one run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunStats {
    pub executions: u64,
    pub execs_per_sec: u64,
    pub new_units: u64,
    /// The input that failed (`Test unit written to <path>`), if one did.
    pub artifact: Option<String>,
}

impl RunStats {
    /// Reads one line of libFuzzer's output (`stat::...` with `-print_final_stats=1`).
    pub fn add_line(&mut self, line: &str) {
        if let Some(path) = line.split("Test unit written to ").nth(1) {
            self.artifact = Some(path.trim().to_owned());
            return;
        }
        let Some((name, value)) = line.trim().strip_prefix("stat::").and_then(|s| s.split_once(':')) else {
            return;
        };
        let Ok(value) = value.trim().parse::<u64>() else { return };
        match name {
            "number_of_executed_units" => self.executions = value,
            "average_exec_per_sec" => self.execs_per_sec = value,
            "new_units_added" => self.new_units = value,
            // Not `peak_rss_mb`: cargo-fuzz execs the fuzzer, which inherits cargo's peak.
            _ => {}
        }
    }
}

/// Whether `rustup` has a nightly toolchain (cargo-fuzz needs one).
pub fn nightly_available() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A command run with the nightly toolchain in `fuzz/`, without the variables the outer
/// cargo set for the stable one.
fn nightly(ctx: &Ctx, args: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly"]).args(args).current_dir(fuzz_dir(ctx));
    for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTC_WRAPPER", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR"] {
        cmd.env_remove(var);
    }
    cmd
}

fn fuzz_dir(ctx: &Ctx) -> PathBuf {
    ctx.workspace.join("fuzz")
}

/// Installs cargo-fuzz when `cargo fuzz` is not there.
fn ensure_cargo_fuzz(ctx: &Ctx) -> Result<()> {
    let present = nightly(ctx, &["cargo", "fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    println!();
    println!("!!! cargo-fuzz is not installed: installing it from crates.io (cargo install cargo-fuzz --locked) !!!");
    println!();
    let status = nightly(ctx, &["cargo", "install", "cargo-fuzz", "--locked"])
        .status()
        .context("running cargo install cargo-fuzz")?;
    if !status.success() {
        bail!("cargo install cargo-fuzz --locked exited with {status}");
    }
    Ok(())
}

/// Runs `targets` (every one when empty) for `secs` each; fails on the first that finds
/// a problem, after printing what every run did.
pub fn run(ctx: &Ctx, secs: u64, targets: &[String]) -> Result<()> {
    let targets: Vec<&str> =
        if targets.is_empty() { TARGETS.to_vec() } else { targets.iter().map(String::as_str).collect() };
    if let Some(unknown) = targets.iter().find(|t| !TARGETS.contains(t)) {
        bail!("no fuzz target {unknown:?}; the targets are {}", TARGETS.join(", "));
    }
    if secs == 0 {
        bail!("--time must be at least 1 second");
    }
    if !nightly_available() {
        bail!("no nightly toolchain: cargo-fuzz needs one (rustup toolchain install nightly)");
    }
    ensure_cargo_fuzz(ctx)?;

    let mut build = nightly(ctx, &["cargo", "fuzz", "build", "--sanitizer", "none"]);
    if targets.len() == 1 {
        build.arg(targets[0]);
    }
    let compiled = build.status().context("running cargo fuzz build")?;
    if !compiled.success() {
        bail!("cargo fuzz build exited with {compiled}");
    }

    let mut results = Vec::new();
    for target in &targets {
        println!();
        println!("==> fuzz {target} for {secs}s");
        let result = run_target(ctx, target, secs);
        match &result {
            Ok(stats) => println!(
                "<== fuzz {target}: ok, {} executions ({} per second), {} new inputs",
                stats.executions, stats.execs_per_sec, stats.new_units
            ),
            Err(e) => println!("<== fuzz {target}: FAILED: {e:#}"),
        }
        results.push((*target, result));
    }

    println!();
    println!("==> fuzz summary ({secs}s per target)");
    println!("    {:<12} {:>12} {:>10} {:>8}  result", "target", "executions", "execs/s", "new");
    let mut failed = Vec::new();
    for (target, result) in &results {
        match result {
            Ok(s) => {
                println!("    {target:<12} {:>12} {:>10} {:>8}  ok", s.executions, s.execs_per_sec, s.new_units);
            }
            Err(e) => {
                println!("    {target:<12} {:>12} {:>10} {:>8}  FAILED: {e:#}", "-", "-", "-");
                failed.push(*target);
            }
        }
    }
    if failed.is_empty() { Ok(()) } else { bail!("fuzz targets failed: {}", failed.join(", ")) }
}

/// One target for `secs`: its output is passed through and its statistics read.
fn run_target(ctx: &Ctx, target: &str, secs: u64) -> Result<RunStats> {
    let fuzz = fuzz_dir(ctx);
    let seeds = fuzz.join("corpus").join(target);
    let work = fuzz.join("target").join("corpus").join(target);
    let artifacts = fuzz.join("artifacts").join(target);
    let scratch = fuzz.join("target").join("scratch").join(target);
    for dir in [&work, &artifacts] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    remove_dir(&scratch)?;
    fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;

    let mut cmd = nightly(ctx, &["cargo", "fuzz", "run", "--sanitizer", "none", target]);
    // New inputs go to the first directory: the work corpus, not the committed seeds.
    // cargo-fuzz sets `-artifact_prefix` to `fuzz/artifacts/<target>/` itself.
    cmd.arg(&work).arg(&seeds).arg("--").args([
        format!("-max_total_time={secs}"),
        format!("-timeout={TIMEOUT_SECS}"),
        "-print_final_stats=1".to_owned(),
    ]);
    cmd.env("TMPDIR", &scratch).stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("running cargo fuzz run {target}"))?;
    let stderr = child.stderr.take().context("cargo fuzz stderr")?;
    let mut stats = RunStats::default();
    for line in BufReader::new(stderr).lines() {
        let line = line.context("reading the fuzzer's output")?;
        eprintln!("{line}");
        stats.add_line(&line);
    }
    let exit = child.wait().context("waiting for cargo fuzz run")?;
    remove_dir(&scratch)?;
    if let Some(artifact) = &stats.artifact {
        bail!(
            "{target} failed on the input {artifact} (reproduce: cd fuzz && cargo +nightly fuzz run -s none {target} {artifact})"
        );
    }
    if !exit.success() {
        bail!("cargo fuzz run {target} exited with {exit}");
    }
    if stats.executions == 0 {
        bail!("{target} ran no input");
    }
    Ok(stats)
}

fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_final_stats_and_artifacts() {
        let mut stats = RunStats::default();
        for line in [
            "#2097152\tpulse  cov: 1234 ft: 5678 corp: 90/1Kb exec/s: 69905 rss: 88Mb",
            "Done 2097152 runs in 31 second(s)",
            "stat::number_of_executed_units: 2097152",
            "stat::average_exec_per_sec:     67650",
            "stat::new_units_added:          12",
            "stat::slowest_unit_time_sec:    0",
            "stat::peak_rss_mb:              88",
        ] {
            stats.add_line(line);
        }
        assert_eq!(stats, RunStats { executions: 2_097_152, execs_per_sec: 67_650, new_units: 12, artifact: None });
        stats.add_line(
            "artifact_prefix='fuzz/artifacts/config/'; Test unit written to fuzz/artifacts/config/crash-da39a3ee",
        );
        assert_eq!(stats.artifact.as_deref(), Some("fuzz/artifacts/config/crash-da39a3ee"));
    }
}
