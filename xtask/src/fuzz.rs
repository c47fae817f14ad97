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
//! `fuzz/target/corpus/<target>/` (kept between runs, never committed; `--minimize` folds
//! it into the committed corpus, at most [`CORPUS_MAX_FILES`] inputs, see [`minimize`]). A crash, a panic, a timeout
//! ([`TIMEOUT_SECS`] for one input) or running out of memory fails the run, printing the
//! input's path under `fuzz/artifacts/<target>/`. Each run gets an empty scratch `TMPDIR`
//! (the targets write their fixtures there), removed afterwards.

use std::{
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap, HashSet},
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
/// CI builds the targets without optimisations (`cargo fuzz --dev`): on a fresh 2-core
/// machine that halves the build, which is most of the step, while 20 s of slower
/// executions still run every seed and thousands of new inputs per target.
pub const CI_DEV: bool = true;
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

/// Runs `targets` (every one when empty) for `secs` each, built without optimisations
/// when `dev`; fails on the first that finds a problem, after printing what every run did.
pub fn run(ctx: &Ctx, secs: u64, targets: &[String], dev: bool) -> Result<()> {
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
    if dev {
        build.arg("--dev");
    }
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
        let result = run_target(ctx, target, secs, dev);
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
fn run_target(ctx: &Ctx, target: &str, secs: u64, dev: bool) -> Result<RunStats> {
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
    if dev {
        cmd.arg("--dev");
    }
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

/// Inputs kept per target in `fuzz/corpus/<target>/`.
pub const CORPUS_MAX_FILES: usize = 200;
/// Bytes kept per target in `fuzz/corpus/<target>/`.
pub const CORPUS_MAX_BYTES: u64 = 1 << 20;

/// `--minimize`: replaces `fuzz/corpus/<target>/` with at most [`CORPUS_MAX_FILES`] inputs
/// ([`CORPUS_MAX_BYTES`]) of it and of what runs found (`fuzz/target/corpus/<target>/`):
/// the hand-written seeds (the names that are not libFuzzer's SHA-1s), then, one at a
/// time, the input that adds the most coverage edges. A set-cover merge run without hit
/// counters (`-set_cover_merge=1 -use_counters=0`) writes, per input, every feature it
/// reaches, which is then its edges (plus a few stack-depth features) into the merge
/// control file. `cargo fuzz cmin` alone keeps every input with a feature of its own:
/// thousands here.
pub fn minimize(ctx: &Ctx, targets: &[String]) -> Result<()> {
    let targets: Vec<&str> =
        if targets.is_empty() { TARGETS.to_vec() } else { targets.iter().map(String::as_str).collect() };
    if !nightly_available() {
        bail!("no nightly toolchain: cargo-fuzz needs one (rustup toolchain install nightly)");
    }
    ensure_cargo_fuzz(ctx)?;
    let compiled = nightly(ctx, &["cargo", "fuzz", "build", "--sanitizer", "none"])
        .status()
        .context("running cargo fuzz build")?;
    if !compiled.success() {
        bail!("cargo fuzz build exited with {compiled}");
    }
    for target in targets {
        minimize_target(ctx, target)?;
    }
    Ok(())
}

fn minimize_target(ctx: &Ctx, target: &str) -> Result<()> {
    let fuzz = fuzz_dir(ctx);
    let seeds = fuzz.join("corpus").join(target);
    let work = fuzz.join("target").join("corpus").join(target);
    let scratch = fuzz.join("target").join("scratch").join(format!("minimize-{target}"));
    remove_dir(&scratch)?;
    let empty = scratch.join("empty");
    fs::create_dir_all(&empty).with_context(|| format!("creating {}", empty.display()))?;
    let control = scratch.join("control");
    let binary = fuzz.join("target").join("x86_64-unknown-linux-gnu").join("release").join(target);
    let mut cmd = Command::new(&binary);
    cmd.args(["-merge=1", "-set_cover_merge=1", "-use_counters=0"])
        .arg(format!("-merge_control_file={}", control.display()))
        .arg(&empty)
        .arg(&seeds);
    if work.is_dir() {
        cmd.arg(&work);
    }
    let merged = cmd
        .env("TMPDIR", &scratch)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running {}", binary.display()))?;
    if !merged.success() {
        bail!("the coverage merge of {target} exited with {merged}");
    }
    let text = fs::read_to_string(&control).with_context(|| format!("reading {}", control.display()))?;
    let inputs = parse_control_file(&text)?;
    let chosen = choose(&inputs, CORPUS_MAX_FILES, CORPUS_MAX_BYTES);
    let staged = scratch.join("corpus");
    fs::create_dir_all(&staged).with_context(|| format!("creating {}", staged.display()))?;
    for input in &chosen {
        let name = input.path.file_name().context("an input without a file name")?;
        fs::copy(&input.path, staged.join(name)).with_context(|| format!("copying {}", input.path.display()))?;
    }
    let edges = |set: &[&Input]| set.iter().flat_map(|i| i.edges.iter()).collect::<BTreeSet<_>>().len();
    let all: Vec<&Input> = inputs.iter().collect();
    println!(
        "{target}: {} of {} inputs kept ({} bytes), {} of {} coverage features (edges)",
        chosen.len(),
        inputs.len(),
        chosen.iter().map(|i| i.size).sum::<u64>(),
        edges(&chosen),
        edges(&all)
    );
    remove_dir(&seeds)?;
    fs::rename(&staged, &seeds).with_context(|| format!("replacing {}", seeds.display()))?;
    remove_dir(&scratch)
}

/// One input of a merge control file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub path: PathBuf,
    pub size: u64,
    pub edges: Vec<u32>,
}

impl Input {
    /// Written by hand: libFuzzer names what it finds by the SHA-1 of the content.
    fn hand_written(&self) -> bool {
        let name = self.path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        !(name.len() == 40 && name.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// Reads libFuzzer's merge control file: the number of inputs, the number in the first
/// corpus, the paths, then per input `STARTED <i> <size>`, `FT <i> <feature>...` and
/// `COV <i> ...`. The features are all the input's only in a set-cover merge (otherwise
/// those no earlier input had); `COV` lists only new edges in either case, so it is not
/// read.
pub fn parse_control_file(text: &str) -> Result<Vec<Input>> {
    let mut lines = text.lines();
    let count: usize = lines.next().context("an empty control file")?.trim().parse().context("the input count")?;
    lines.next().context("a control file without its second line")?;
    let mut inputs: Vec<Input> = lines
        .by_ref()
        .take(count)
        .map(|path| Input { path: PathBuf::from(path), size: 0, edges: Vec::new() })
        .collect();
    for line in lines {
        let mut words = line.split_whitespace();
        let (Some(kind), Some(index)) = (words.next(), words.next().and_then(|i| i.parse::<usize>().ok())) else {
            continue;
        };
        let Some(input) = inputs.get_mut(index) else { continue };
        match kind {
            "STARTED" => input.size = words.next().and_then(|s| s.parse().ok()).unwrap_or(0),
            "FT" => input.edges = words.filter_map(|e| e.parse().ok()).collect(),
            _ => {}
        }
    }
    Ok(inputs)
}

/// The hand-written inputs, then greedily the input adding the most edges not yet covered
/// (the smaller on a tie) while one adds any, within `max_files` and `max_bytes`. Lazily:
/// what an input adds only shrinks as more is covered, so a gain computed earlier bounds
/// the current one, and an input whose fresh gain still leads is the greedy choice.
pub fn choose(inputs: &[Input], max_files: usize, max_bytes: u64) -> Vec<&Input> {
    let mut chosen: Vec<&Input> = inputs.iter().filter(|i| i.hand_written()).collect();
    let mut covered: HashSet<u32> = chosen.iter().flat_map(|i| i.edges.iter().copied()).collect();
    let mut bytes: u64 = chosen.iter().map(|i| i.size).sum();
    let gain = |i: &Input, covered: &HashSet<u32>| i.edges.iter().filter(|e| !covered.contains(e)).count();
    let mut queue: BinaryHeap<(usize, Reverse<u64>, Reverse<usize>)> = inputs
        .iter()
        .enumerate()
        .filter(|(_, i)| !i.hand_written())
        .map(|(n, i)| (gain(i, &covered), Reverse(i.size), Reverse(n)))
        .collect();
    while chosen.len() < max_files {
        let Some((stale, size, Reverse(n))) = queue.pop() else { break };
        let fresh = gain(&inputs[n], &covered);
        if fresh == 0 {
            // Nothing left adds anything: every other bound is at most this one's.
            if stale == 0 {
                break;
            }
            continue;
        }
        if fresh < stale && queue.peek().is_some_and(|&(next, next_size, _)| (next, next_size) > (fresh, size)) {
            queue.push((fresh, size, Reverse(n)));
            continue;
        }
        if bytes + inputs[n].size > max_bytes {
            break;
        }
        covered.extend(inputs[n].edges.iter().copied());
        bytes += inputs[n].size;
        chosen.push(&inputs[n]);
    }
    chosen
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

    #[test]
    fn keeps_the_seeds_then_the_inputs_adding_the_most_edges() {
        let control = "4\n0\n\
            corpus/seed.yaml\n\
            target/corpus/1111111111111111111111111111111111111111\n\
            target/corpus/2222222222222222222222222222222222222222\n\
            target/corpus/3333333333333333333333333333333333333333\n\
            STARTED 0 10\nFT 0 1 2\nCOV 0 7\n\
            STARTED 1 5\nFT 1 2 3\nCOV 1 8\n\
            STARTED 2 7\nFT 2 3 4 5\n\
            STARTED 3 100\nFT 3 1\n";
        let inputs = parse_control_file(control).unwrap();
        assert_eq!(
            inputs[2],
            Input {
                path: "target/corpus/2222222222222222222222222222222222222222".into(),
                size: 7,
                edges: vec![3, 4, 5]
            }
        );
        let names = |chosen: Vec<&Input>| chosen.iter().map(|i| i.path.display().to_string()).collect::<Vec<_>>();
        // The seed, then 2 (three new edges); 1 adds nothing after that, 3 nothing at all.
        assert_eq!(
            names(choose(&inputs, 10, 1000)),
            ["corpus/seed.yaml", "target/corpus/2222222222222222222222222222222222222222"]
        );
        assert_eq!(names(choose(&inputs, 1, 1000)), ["corpus/seed.yaml"], "at most one file");
        assert_eq!(names(choose(&inputs, 10, 15)), ["corpus/seed.yaml"], "at most 15 bytes");
    }
}
