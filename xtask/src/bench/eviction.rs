//! `cargo xtask bench eviction`: how long after memory runs short the agent decides to
//! evict, with the kernel's signals (the default: memcg threshold, PSI, eBPF reclaim wake
//! the eviction manager) and with the periodic 10 s pass alone
//! (`--eviction-kernel-signals=false`, upstream's behaviour without
//! `kernelMemcgNotification`), side by side. Target: p99 < 500 ms with kernel signals.
//!
//! # Set-up (as `tests/tests/eviction.rs`)
//! Per mode, a release agent joined as a node to the test bed's real control plane
//! (kube-apiserver v1.37.2, [`Cluster`]), its
//! pods cgroup (`<cgroupRoot>/kubepods`, cgroup v1 memory) limited to 300 MiB by the
//! agent's node allocatable enforcement (`systemReserved` memory = `MemTotal` − 300 MiB),
//! and `evictionHard: allocatableMemory.available: 100Mi`, so the pods'
//! working set may reach 200 MiB. `evictionPressureTransitionPeriod` is 1 s, so that the
//! `MemoryPressure` condition (which refuses `BestEffort` pods) clears soon after each run.
//!
//! # One run
//! A `BestEffort` API pod (static pods are critical and never evicted) writes 150 MiB into
//! a memory-backed emptyDir at once, then 4 MiB every 0.1 s up to 242 MiB, and holds:
//! it crosses the threshold about 1.3 s after it starts and never reaches the limit, so
//! the kernel's OOM killer has no reason to act, even when only the 10 s pass looks.
//! The run waits for the agent's decision, then for `Evicted` in the API, deletes the pod
//! and waits until the node is quiet again (no bench sandbox, the pods' working set under
//! 50 MiB, no `MemoryPressure` in the agent's last condition change). With the 10 s pass
//! alone, each run first waits a pseudo-random 0–10 s, so the crossings fall at every
//! phase of the pass.
//!
//! # What is measured
//! - **Threshold crossed**: observed by the bench, not by the agent. A thread reads the pods
//!   cgroup's `memory.usage_in_bytes` and `memory.stat` `total_inactive_file` every 2 ms
//!   (the agent's own formula: available = limit − (usage − inactive file)) and takes
//!   `CLOCK_MONOTONIC` at the first reading with less than 100 MiB available. Its
//!   resolution is the poll interval (the largest gap between readings is reported).
//! - **Decision**: the agent's `EVICTION_DECIDED` record on its event API (`bench::records`,
//!   written when a pass picks the pod, before the kill), which carries `CLOCK_MONOTONIC`
//!   times of the decision, of the start of that pass and of the kernel signal that
//!   started it.
//! - crossed → decision (the headline), crossed → `Evicted` seen by the bench's own watch
//!   on the API server (kill and status write included), crossed → start of the deciding
//!   pass, and signal → decision, which is what the agent's histogram
//!   `swiftlet_eviction_signal_to_decision_seconds{source}` records (from the moment the
//!   agent's watcher received the kernel's signal, so it leaves out the kernel's part; the
//!   periodic pass records nothing there).
//!
//! The report goes to stdout and `target/bench/eviction.md`. The bench needs the test bed
//! to itself, like `bench pleg`, and cgroup v1 (the memcg threshold is v1's).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use clap::ValueEnum;

use crate::{
    Ctx,
    bench::{
        agent::{self, BenchAgent, PlegMode},
        apiserver::ApiServer,
        cluster::Cluster,
        latency::Summary,
        pleg::{self, Pauses},
        procfs,
        records::{EvictionDecision, Record, RecordStream},
        report::{self, Environment},
        watch,
    },
    cri::CriClient,
    testbed::{self, Layout},
};

const MIB: u64 = 1024 * 1024;
/// The pods cgroup's memory limit.
pub const LIMIT_BYTES: u64 = 300 * MIB;
/// `evictionHard: allocatableMemory.available`.
pub const THRESHOLD_BYTES: u64 = 100 * MIB;
/// The hog: written at once, then in steps, up to the cap (see the module docs).
const PREFILL_MIB: u64 = 150;
const STEP_MIB: u64 = 4;
const STEPS: u64 = 23;
const STEP_PAUSE: &str = "0.1";
/// The node is quiet again once the pods' working set is under this.
const QUIET_BYTES: u64 = 50 * MIB;
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// The longest a run waits for the decision after creating the hog.
const DECISION_WAIT: Duration = Duration::from_mins(1);
/// The longest it then waits for `Evicted` in the API.
const EVICTED_WAIT: Duration = Duration::from_secs(30);
const QUIET_WAIT: Duration = Duration::from_secs(90);
/// Hogs refused at admission (the node still under `MemoryPressure`) before giving up.
const MAX_REJECTIONS: usize = 5;
/// The target with kernel signals.
pub const TARGET_P99_NS: u64 = 500_000_000;

/// How the agent notices memory pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Kernel signals (memcg threshold, PSI, eBPF) and the 10 s pass: the default.
    Kernel,
    /// `--eviction-kernel-signals=false`: the 10 s pass alone.
    Polling,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Polling => "polling",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::Kernel => "kernel signals (default)",
            Self::Polling => "10 s pass only",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Self::Kernel => &[],
            Self::Polling => &["--eviction-kernel-signals=false"],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Kernel,
    Polling,
    Both,
}

impl ModeArg {
    fn modes(self) -> Vec<Mode> {
        match self {
            Self::Kernel => vec![Mode::Kernel],
            Self::Polling => vec![Mode::Polling],
            Self::Both => vec![Mode::Kernel, Mode::Polling],
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct EvictionArgs {
    /// Evictions to measure per mode.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub runs: u32,
    /// Which modes to measure.
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    pub mode: ModeArg,
    #[command(flatten)]
    pub bed: super::BedArgs,
}

// ---------------------------------------------------------------------------------------
// Figures.

/// One eviction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOutcome {
    pub pod: String,
    /// The hog's create request was sent.
    pub created_ns: u64,
    /// The bench first saw less than the threshold available.
    pub crossed_ns: Option<u64>,
    pub decision: Option<EvictionDecision>,
    /// The bench's watch first showed the pod `Evicted`.
    pub evicted_api_ns: Option<u64>,
    /// The largest gap between two memory readings (the crossing's resolution).
    pub max_poll_gap_ns: u64,
    /// The pods' largest working set seen.
    pub peak_working_set: u64,
}

impl RunOutcome {
    /// Crossed → decision; 0 when the decision came before the bench's reading saw the
    /// crossing (see [`Self::decided_before_seen`]).
    pub fn crossed_to_decision_ns(&self) -> Option<u64> {
        Some(self.decision.as_ref()?.mono_ns.saturating_sub(self.crossed_ns?))
    }

    pub fn decided_before_seen(&self) -> bool {
        matches!((&self.decision, self.crossed_ns), (Some(d), Some(c)) if d.mono_ns < c)
    }

    pub fn crossed_to_evicted_api_ns(&self) -> Option<u64> {
        Some(self.evicted_api_ns?.saturating_sub(self.crossed_ns?))
    }

    /// Crossed → start of the pass that decided (the wait for a pass).
    pub fn crossed_to_pass_ns(&self) -> Option<u64> {
        Some(self.decision.as_ref()?.pass_mono_ns.saturating_sub(self.crossed_ns?))
    }

    /// Kernel signal received → decision (the agent's histogram); `None` for a periodic pass.
    pub fn signal_to_decision_ns(&self) -> Option<u64> {
        let d = self.decision.as_ref()?;
        (d.signal_mono_ns > 0).then(|| d.mono_ns.saturating_sub(d.signal_mono_ns))
    }
}

/// What one mode measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeResult {
    pub mode: Mode,
    pub runs: Vec<RunOutcome>,
    /// Hogs refused at admission (`MemoryPressure` still set) and created again.
    pub rejections: usize,
}

impl ModeResult {
    fn summary(&self, f: impl Fn(&RunOutcome) -> Option<u64>) -> Option<Summary> {
        Summary::of(self.runs.iter().filter_map(f))
    }

    pub fn crossed_to_decision(&self) -> Option<Summary> {
        self.summary(RunOutcome::crossed_to_decision_ns)
    }

    pub fn crossed_to_evicted_api(&self) -> Option<Summary> {
        self.summary(RunOutcome::crossed_to_evicted_api_ns)
    }

    /// Runs with no decision (or no crossing seen) within the wait.
    pub fn undecided(&self) -> usize {
        self.runs.iter().filter(|r| r.crossed_to_decision_ns().is_none()).count()
    }

    /// `trigger ×n` for each trigger of the decisions, most frequent first.
    pub fn triggers(&self) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for d in self.runs.iter().filter_map(|r| r.decision.as_ref()) {
            match counts.iter_mut().find(|(t, _)| *t == d.trigger) {
                Some((_, n)) => *n += 1,
                None => counts.push((d.trigger.clone(), 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        if counts.is_empty() {
            return "—".to_owned();
        }
        counts.iter().map(|(t, n)| format!("{t} ×{n}")).collect::<Vec<_>>().join(", ")
    }
}

// ---------------------------------------------------------------------------------------
// Rendering.

fn cell(s: Option<Summary>, f: impl Fn(&Summary) -> String) -> String {
    s.as_ref().map_or_else(|| "—".to_owned(), f)
}

fn p50_p90_p99_max(s: &Summary) -> String {
    format!(
        "{} / {} / {} / {}",
        report::fmt_ms(s.p50),
        report::fmt_ms(s.p90),
        report::fmt_ms(s.p99),
        report::fmt_ms(s.max)
    )
}

fn p50_p99(s: &Summary) -> String {
    format!("{} / {}", report::fmt_ms(s.p50), report::fmt_ms(s.p99))
}

/// The verdict on the target: kernel-signal p99 < 500 ms.
pub fn meets_target(r: &ModeResult) -> Option<bool> {
    (r.mode == Mode::Kernel)
        .then(|| r.undecided() == 0 && r.crossed_to_decision().is_some_and(|s| s.p99 < TARGET_P99_NS))
}

const HEADER: [&str; 4] = ["", "kernel signals (default)", "10 s pass only", "target"];

pub fn rows(results: &[ModeResult]) -> Vec<Vec<String>> {
    let per_mode = |f: &dyn Fn(&ModeResult) -> String| -> [String; 2] {
        [Mode::Kernel, Mode::Polling]
            .map(|m| results.iter().find(|r| r.mode == m).map_or_else(|| "not run".to_owned(), f))
    };
    let row = |name: &str, cells: [String; 2], target: &str| {
        let [a, b] = cells;
        vec![name.to_owned(), a, b, target.to_owned()]
    };
    vec![
        row(
            "evictions measured",
            per_mode(&|r| {
                let mut s = (r.runs.len() - r.undecided()).to_string();
                if r.undecided() > 0 {
                    let _ = write!(s, " ({} undecided)", r.undecided());
                }
                if r.rejections > 0 {
                    let _ = write!(s, " ({} hogs refused at admission, created again)", r.rejections);
                }
                s
            }),
            "≥ 20",
        ),
        row(
            "threshold crossed → decision¹, p50 / p90 / p99 / max",
            per_mode(&|r| {
                let c = cell(r.crossed_to_decision(), p50_p90_p99_max);
                match meets_target(r) {
                    Some(ok) => format!("{c} {}", if ok { "✓" } else { "✗" }),
                    None => c,
                }
            }),
            "p99 < 500 ms",
        ),
        row(
            "threshold crossed → Evicted in the API², p50 / p99",
            per_mode(&|r| cell(r.crossed_to_evicted_api(), p50_p99)),
            "",
        ),
        row(
            "threshold crossed → deciding pass starts, p50 / p99",
            per_mode(&|r| cell(r.summary(RunOutcome::crossed_to_pass_ns), p50_p99)),
            "",
        ),
        row(
            "kernel signal → decision³, p50 / p99",
            per_mode(&|r| cell(r.summary(RunOutcome::signal_to_decision_ns), p50_p99)),
            "",
        ),
        row("decided by", per_mode(&|r| r.triggers()), ""),
        row(
            "decided before the bench saw the crossing⁴",
            per_mode(&|r| r.runs.iter().filter(|o| o.decided_before_seen()).count().to_string()),
            "",
        ),
        row(
            "memory reading gap, max",
            per_mode(&|r| {
                r.runs.iter().map(|o| o.max_poll_gap_ns).max().map_or_else(|| "—".to_owned(), report::fmt_ms)
            }),
            "",
        ),
    ]
}

pub fn footnotes() -> Vec<String> {
    vec![
        format!(
            "¹ from the first of the bench's readings (every {} ms) of the pods cgroup showing less than {} MiB \
             available (limit {} MiB − working set) to the agent's EVICTION_DECIDED record (CLOCK_MONOTONIC both).",
            POLL_INTERVAL.as_millis(),
            THRESHOLD_BYTES / MIB,
            LIMIT_BYTES / MIB
        ),
        "² the bench's own watch on the test bed's kube-apiserver shows the pod Failed/Evicted (kill and status write \
         included)."
            .to_owned(),
        "³ what swiftlet_eviction_signal_to_decision_seconds records: from the agent's receipt of the kernel's \
         signal; the periodic pass has none."
            .to_owned(),
        "⁴ the decision came between two of the bench's readings; counted as 0 ms.".to_owned(),
    ]
}

pub fn text(results: &[ModeResult]) -> String {
    let mut out = report::text_table(&HEADER, &rows(results));
    out.push('\n');
    for f in footnotes() {
        let _ = writeln!(out, "{f}");
    }
    out
}

pub fn markdown(results: &[ModeResult], env: &Environment) -> String {
    let mut out = env.markdown_head("cargo xtask bench eviction", "release build");
    let _ = writeln!(
        out,
        "- pods cgroup limit {} MiB, evictionHard allocatableMemory.available {} MiB; a BestEffort API pod writes {} \
         MiB to a memory emptyDir, then {} MiB every {} s up to {} MiB\n",
        LIMIT_BYTES / MIB,
        THRESHOLD_BYTES / MIB,
        PREFILL_MIB,
        STEP_MIB,
        STEP_PAUSE,
        PREFILL_MIB + STEP_MIB * STEPS
    );
    out.push_str(&report::markdown_table(&HEADER, &rows(results)));
    out.push('\n');
    for f in footnotes() {
        let _ = writeln!(out, "{f}  ");
    }
    for r in results {
        let _ = writeln!(out, "\n## Runs, {}\n", r.mode.title());
        let header = [
            "pod",
            "crossed → decision",
            "crossed → pass",
            "signal → decision",
            "crossed → API",
            "trigger",
            "peak working set",
        ];
        let opt = |v: Option<u64>| v.map_or_else(|| "—".to_owned(), report::fmt_ms);
        let runs: Vec<Vec<String>> = r
            .runs
            .iter()
            .map(|o| {
                vec![
                    o.pod.clone(),
                    opt(o.crossed_to_decision_ns()),
                    opt(o.crossed_to_pass_ns()),
                    opt(o.signal_to_decision_ns()),
                    opt(o.crossed_to_evicted_api_ns()),
                    o.decision.as_ref().map_or_else(|| "none".to_owned(), |d| d.trigger.clone()),
                    format!("{:.0} MiB", o.peak_working_set as f64 / MIB as f64),
                ]
            })
            .collect();
        out.push_str(&report::markdown_table(&header, &runs));
    }
    out
}

// ---------------------------------------------------------------------------------------
// The hog and the memory readings.

/// The hog's shell script (see the module docs).
pub fn hog_script() -> String {
    format!(
        "trap 'exit 0' TERM; dd if=/dev/zero of=/mem/base bs=1M count={PREFILL_MIB} 2>/dev/null; i=0; while [ $i -lt \
         {STEPS} ]; do dd if=/dev/zero of=/mem/f$i bs=1M count={STEP_MIB} 2>/dev/null; i=$((i+1)); sleep {STEP_PAUSE}; \
         done; while true; do sleep 1; done"
    )
}

/// `total_inactive_file` of a v1 `memory.stat` (hierarchical, as the agent reads it).
pub fn total_inactive_file(stat: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix("total_inactive_file ")).and_then(|v| v.trim().parse().ok())
}

/// Available memory as the agent computes it: limit − (usage − inactive file), floored
/// at zero; and the working set.
pub fn available(limit: u64, usage: u64, inactive_file: u64) -> (u64, u64) {
    let working_set = usage.saturating_sub(inactive_file);
    (limit.saturating_sub(working_set), working_set)
}

/// The pods cgroup's working set now.
pub fn working_set(cgroup: &Path) -> Result<u64> {
    let usage: u64 = fs::read_to_string(cgroup.join("memory.usage_in_bytes"))?.trim().parse()?;
    let stat = fs::read_to_string(cgroup.join("memory.stat"))?;
    Ok(available(0, usage, total_inactive_file(&stat).unwrap_or(0)).1)
}

/// What a [`MemoryPoller`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readings {
    pub crossed_ns: Option<u64>,
    pub max_gap_ns: u64,
    pub peak_working_set: u64,
}

/// Reads the pods cgroup's memory every [`POLL_INTERVAL`] on its own thread until
/// stopped, noting when less than the threshold was first available.
#[derive(Debug)]
pub struct MemoryPoller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Readings>>>,
}

impl MemoryPoller {
    pub fn start(cgroup: &Path, threshold: u64) -> Result<Self> {
        let limit: u64 = fs::read_to_string(cgroup.join("memory.limit_in_bytes"))
            .with_context(|| format!("reading the memory limit of {}", cgroup.display()))?
            .trim()
            .parse()?;
        let (stop, cgroup) = (Arc::new(AtomicBool::new(false)), cgroup.to_path_buf());
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new().name("bench-memory".into()).spawn(move || {
                let mut r = Readings::default();
                let mut last = 0;
                while !stop.load(Ordering::Relaxed) {
                    let usage: u64 = fs::read_to_string(cgroup.join("memory.usage_in_bytes"))?.trim().parse()?;
                    let stat = fs::read_to_string(cgroup.join("memory.stat"))?;
                    let now = procfs::monotonic_ns();
                    let (avail, ws) = available(limit, usage, total_inactive_file(&stat).unwrap_or(0));
                    if last > 0 {
                        r.max_gap_ns = r.max_gap_ns.max(now - last);
                    }
                    last = now;
                    r.peak_working_set = r.peak_working_set.max(ws);
                    if r.crossed_ns.is_none() && avail < threshold {
                        r.crossed_ns = Some(now);
                    }
                    std::thread::sleep(POLL_INTERVAL);
                }
                Ok(r)
            })?
        };
        Ok(Self { stop, thread: Some(thread) })
    }

    pub fn finish(mut self) -> Result<Readings> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .context("poller already finished")?
            .join()
            .map_err(|_| anyhow!("the memory poller panicked"))?
    }
}

impl Drop for MemoryPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether the agent's last node-condition change (its log) left `MemoryPressure` on.
pub fn memory_pressure_in_log(log: &str) -> bool {
    log.lines()
        .rev()
        .find(|l| l.contains("eviction manager: node conditions changed"))
        .is_some_and(|l| l.contains("MemoryPressure"))
}

// ---------------------------------------------------------------------------------------
// The run.

/// What the API benches run, shared by `bench eviction` and the summary bench: the agent's
/// binary and the control plane its nodes join.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub swiftlet: PathBuf,
    pub api: ApiServer,
}

/// The agent under measurement, to undo however the bench ends.
#[derive(Debug, Default)]
struct Session {
    cluster: Option<Cluster>,
    env: Option<Environment>,
    results: Vec<ModeResult>,
}

impl Session {
    async fn end_cluster(&mut self, ctx: &Ctx, layout: &Layout) -> Result<()> {
        end_cluster(&mut self.cluster, ctx, layout).await
    }
}

/// Ends the cluster in `slot`, if any, keeping the agent's log under `target/bench/`.
pub async fn end_cluster(slot: &mut Option<Cluster>, ctx: &Ctx, layout: &Layout) -> Result<()> {
    let Some(mut c) = slot.take() else { return Ok(()) };
    let keep = pleg::bench_dir(ctx).join(format!("{}-agent.log", c.agent.label));
    c.end(layout, &keep).await
}

/// The agent of one mode, set up with the small pods cgroup, joined to the control plane
/// and started.
async fn prepare(binaries: &Binaries, layout: &Layout, mode: Mode, slot: &mut Option<Cluster>) -> Result<()> {
    let agent = BenchAgent::named(
        &format!("eviction-{}", mode.name()),
        PlegMode::Evented,
        &binaries.swiftlet,
        &layout.endpoint(),
        10,
    )?
    .with_config(&format!(
        "evictionHard:\n  allocatableMemory.available: {}Mi\nevictionPressureTransitionPeriod: 1s\n\
         systemReserved:\n  memory: {}Ki\n",
        THRESHOLD_BYTES / MIB,
        reserved_for_limit()? / 1024
    ))
    .with_flags(mode.flags());
    agent.memory_cgroup_root().context(
        "bench eviction needs the cgroup v1 memory controller (/sys/fs/cgroup/memory): the agent's memcg threshold \
         signal is v1's",
    )?;
    let cluster = slot.insert(Cluster::prepare(&binaries.api, agent)?);
    cluster.start().await?;
    Ok(())
}

/// The `systemReserved` memory that leaves [`LIMIT_BYTES`] to pods: the agent enforces
/// node allocatable (capacity − reservations) as the pods cgroup's memory limit.
fn reserved_for_limit() -> Result<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    let total = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("no MemTotal in /proc/meminfo")?
        * 1024;
    ensure!(total > 2 * LIMIT_BYTES, "this machine has too little memory ({total} bytes) for the bench");
    Ok(total - LIMIT_BYTES)
}

/// Measures `runs` evictions in `mode` with a fresh cluster, left in `slot` for the caller
/// to end (also when this fails).
pub async fn measure_mode(
    binaries: &Binaries,
    layout: &Layout,
    cri: &mut CriClient,
    mode: Mode,
    runs: usize,
    slot: &mut Option<Cluster>,
) -> Result<ModeResult> {
    prepare(binaries, layout, mode, slot).await?;
    let cluster = slot.as_mut().context("no cluster")?;
    let kubepods = cluster.agent.memory_cgroup_root().context("no memory cgroup")?.join("kubepods");
    let limit: u64 = fs::read_to_string(kubepods.join("memory.limit_in_bytes"))?.trim().parse()?;
    ensure!(
        limit == LIMIT_BYTES,
        "the pods cgroup's memory limit is {limit} bytes, not the {LIMIT_BYTES} that systemReserved should leave; the \
         bench's threshold arithmetic would be wrong"
    );
    let socket =
        cluster.agent.event_socket().context("the eviction bench runs swiftlet, which serves the event API")?;
    let mut tail = RecordStream::connect(&socket).await?;
    let mut records: Vec<Record> = Vec::new();
    let mut pauses = Pauses::new();
    let mut result = ModeResult { mode, runs: Vec::with_capacity(runs), rejections: 0 };
    let mut attempt = 0;
    while result.runs.len() < runs {
        ensure!(
            result.rejections <= MAX_REJECTIONS,
            "{} hogs refused at admission: the node stays under MemoryPressure",
            result.rejections
        );
        wait_quiet(cluster, cri, &kubepods).await?;
        if mode == Mode::Polling {
            tokio::time::sleep(Duration::from_millis(pauses.next_ms(10_000))).await;
        }
        let name = format!("hog-{}-{attempt:02}", mode.name());
        attempt += 1;
        let Some(outcome) = run_once(cluster, cri, &kubepods, &name, &mut tail, &mut records).await? else {
            eprintln!("bench: {name} was refused at admission (MemoryPressure still set): again");
            result.rejections += 1;
            continue;
        };
        let ms = |v: Option<u64>| v.map_or_else(|| "—".to_owned(), report::fmt_ms);
        eprintln!(
            "bench: {}/{runs} {name}: crossed → decision {} ({}), → Evicted in the API {}",
            result.runs.len() + 1,
            ms(outcome.crossed_to_decision_ns()),
            outcome.decision.as_ref().map_or("no decision", |d| d.trigger.as_str()),
            ms(outcome.crossed_to_evicted_api_ns()),
        );
        result.runs.push(outcome);
    }
    Ok(result)
}

/// Waits until no bench sandbox is ready, the pods' working set is small and the agent's
/// last condition change cleared `MemoryPressure`.
async fn wait_quiet(cluster: &mut Cluster, cri: &mut CriClient, kubepods: &Path) -> Result<()> {
    let deadline = Instant::now() + QUIET_WAIT;
    loop {
        cluster.agent.ensure_alive()?;
        let ready = agent::ready_bench_sandboxes(cri).await?.len();
        let ws = working_set(kubepods)?;
        let log = fs::read_to_string(&cluster.agent.log_path).unwrap_or_default();
        let pressure = memory_pressure_in_log(&log);
        if ready == 0 && ws < QUIET_BYTES && !pressure {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the node did not quiet down within {QUIET_WAIT:?}: {ready} ready sandbox(es), pods working set {} MiB, \
                 MemoryPressure {pressure}; agent log tail:\n{}",
                ws / MIB,
                cluster.agent.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One hog, from its creation until it is gone again; `None` if it was refused at
/// admission.
async fn run_once(
    cluster: &mut Cluster,
    cri: &mut CriClient,
    kubepods: &Path,
    name: &str,
    tail: &mut RecordStream,
    records: &mut Vec<Record>,
) -> Result<Option<RunOutcome>> {
    let poller = MemoryPoller::start(kubepods, THRESHOLD_BYTES)?;
    let pod = cluster.pod(name, &hog_script(), true);
    let namespace = cluster.namespace.clone();
    let created_ns = procfs::monotonic_ns();
    let uid = cluster.client()?.create_pod(&namespace, &pod).await?;
    let find = |records: &[Record]| {
        records.iter().find_map(|r| match r {
            Record::Eviction(d) if d.uid == uid => Some(d.clone()),
            _ => None,
        })
    };
    let deadline = Instant::now() + DECISION_WAIT;
    let decision = loop {
        records.extend(tail.poll()?);
        if let Some(d) = find(records) {
            break Some(d);
        }
        cluster.agent.ensure_alive()?;
        if cluster.watch()?.with_events(|e| watch::rejected(e, name))? {
            drop(poller);
            cluster.delete_and_wait(cri, &[name.to_owned()], Duration::from_mins(1)).await?;
            return Ok(None);
        }
        if Instant::now() > deadline {
            let last = cluster.watch()?.with_events(|e| watch::latest(e, name).cloned())?;
            eprintln!(
                "bench: WARNING: {name} not evicted within {DECISION_WAIT:?} (last status: {:?}); agent log tail:\n{}",
                last.map(|e| (e.phase, e.reason, e.containers)),
                cluster.agent.log_tail(20)
            );
            break None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut evicted_api_ns = None;
    if decision.is_some() {
        let deadline = Instant::now() + EVICTED_WAIT;
        while evicted_api_ns.is_none() && Instant::now() < deadline {
            evicted_api_ns = cluster.watch()?.with_events(|e| watch::evicted_at(e, name))?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let readings = poller.finish()?;
    cluster.delete_and_wait(cri, &[name.to_owned()], Duration::from_mins(1)).await?;
    Ok(Some(RunOutcome {
        pod: name.to_owned(),
        created_ns,
        crossed_ns: readings.crossed_ns,
        decision,
        evicted_api_ns,
        max_poll_gap_ns: readings.max_gap_ns,
        peak_working_set: readings.peak_working_set,
    }))
}

/// Builds (or takes) the agent, brings the test bed and its control plane up (each if it
/// is not) and checks the test bed is ours alone.
pub async fn prepare_bench(
    ctx: &Ctx,
    layout: &Layout,
    swiftlet_bin: Option<&Path>,
) -> Result<(Binaries, CriClient, Environment, Option<i32>)> {
    let state = super::bed_up(ctx, layout, &["curl", "openssl"]).await?;
    let api = ApiServer::up(ctx, layout)?;
    let (swiftlet, cri, env) = super::agent_and_runtime(ctx, layout, swiftlet_bin).await?;
    Ok((Binaries { swiftlet, api }, cri, env, state.containerd_pid))
}

pub async fn run(ctx: &Ctx, layout: &Layout, args: &EvictionArgs) -> Result<()> {
    testbed::require_root()?;
    let bed_was_up = super::bed_was_up(layout);
    let mut session = Session::default();
    let outcome =
        super::until_interrupted(std::pin::pin!(bench(ctx, layout, args, &mut session)), "pods are deleted first")
            .await;
    let cleanup = super::said(session.end_cluster(ctx, layout).await);
    let published = match &session.env {
        Some(env) if !session.results.is_empty() => publish(ctx, &session.results, env, outcome.is_err()),
        _ => Ok(()),
    };
    super::finish(ctx, layout, bed_was_up || args.bed.keep_testbed, outcome, cleanup, published).await
}

async fn bench(ctx: &Ctx, layout: &Layout, args: &EvictionArgs, session: &mut Session) -> Result<()> {
    eprintln!("==> bench eviction: test bed");
    let (binaries, mut cri, env, _) = prepare_bench(ctx, layout, args.bed.swiftlet_bin.as_deref()).await?;
    session.env = Some(env);
    for mode in args.mode.modes() {
        eprintln!();
        eprintln!("==> bench eviction: {}", mode.title());
        let result = measure_mode(&binaries, layout, &mut cri, mode, args.runs as usize, &mut session.cluster)
            .await
            .with_context(|| format!("{} run", mode.name()))?;
        session.results.push(result);
        session.end_cluster(ctx, layout).await.with_context(|| format!("tearing down the {} run", mode.name()))?;
    }
    Ok(())
}

fn publish(ctx: &Ctx, results: &[ModeResult], env: &Environment, incomplete: bool) -> Result<()> {
    let (md, table) = (markdown(results, env), text(results));
    super::report::publish(
        ctx,
        "eviction.md",
        "swiftlet eviction benchmark",
        env,
        md,
        &table,
        incomplete.then_some("mode"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(mono: u64, pass: u64, signal: u64, trigger: &str) -> EvictionDecision {
        EvictionDecision {
            mono_ns: mono,
            pass_mono_ns: pass,
            signal_mono_ns: signal,
            trigger: trigger.into(),
            uid: "u".into(),
            eviction_signal: "allocatableMemory.available".into(),
        }
    }

    fn outcome(crossed: u64, d: Option<EvictionDecision>, api: Option<u64>) -> RunOutcome {
        RunOutcome {
            pod: "hog-kernel-00".into(),
            created_ns: 1,
            crossed_ns: Some(crossed),
            decision: d,
            evicted_api_ns: api,
            max_poll_gap_ns: 2_500_000,
            peak_working_set: 210 * MIB,
        }
    }

    #[test]
    fn latencies_are_taken_from_the_crossing() {
        let o = outcome(1_000, Some(decision(31_000, 20_000, 19_000, "memcg_threshold")), Some(81_000));
        assert_eq!(o.crossed_to_decision_ns(), Some(30_000));
        assert_eq!(o.crossed_to_pass_ns(), Some(19_000));
        assert_eq!(o.signal_to_decision_ns(), Some(12_000));
        assert_eq!(o.crossed_to_evicted_api_ns(), Some(80_000));
        assert!(!o.decided_before_seen());
        // The decision fell between two readings: 0, and flagged.
        let early = outcome(5_000, Some(decision(4_000, 3_000, 0, "periodic")), None);
        assert_eq!(early.crossed_to_decision_ns(), Some(0));
        assert!(early.decided_before_seen());
        assert_eq!(early.signal_to_decision_ns(), None, "a periodic pass has no signal");
        assert_eq!(outcome(1, None, None).crossed_to_decision_ns(), None);
        let unseen = RunOutcome { crossed_ns: None, ..o };
        assert_eq!(unseen.crossed_to_decision_ns(), None);
    }

    #[test]
    fn memory_arithmetic_is_the_agents() {
        let stat = "cache 1000\nrss 5\ntotal_cache 9000\ntotal_inactive_file 4096\ninactive_file 7\n";
        assert_eq!(total_inactive_file(stat), Some(4096));
        assert_eq!(total_inactive_file("cache 1\n"), None);
        assert_eq!(available(300, 250, 40), (90, 210));
        // More inactive file than usage, more working set than the limit: floored.
        assert_eq!(available(300, 10, 40), (300, 0));
        assert_eq!(available(300, 400, 0), (0, 400));
    }

    #[test]
    fn the_hog_crosses_the_threshold_and_stays_under_the_limit() {
        const {
            // The prefill alone must not cross; the cap crosses with room to spare and
            // stays clear of the OOM killer.
            assert!(PREFILL_MIB * MIB < LIMIT_BYTES - THRESHOLD_BYTES);
            assert!((PREFILL_MIB + STEP_MIB * STEPS) * MIB > LIMIT_BYTES - THRESHOLD_BYTES + 20 * MIB);
            assert!((PREFILL_MIB + STEP_MIB * STEPS) * MIB < LIMIT_BYTES - 40 * MIB);
        }
        let s = hog_script();
        assert!(s.starts_with("trap 'exit 0' TERM; dd if=/dev/zero of=/mem/base bs=1M count=150"), "{s}");
        assert!(s.contains("while [ $i -lt 23 ]; do dd if=/dev/zero of=/mem/f$i bs=1M count=4"), "{s}");
    }

    #[test]
    fn pressure_is_the_last_condition_change() {
        let log = "a INFO eviction manager: node conditions changed conditions=[MemoryPressure]\nb INFO other\n";
        assert!(memory_pressure_in_log(log));
        let cleared = format!("{log}c INFO eviction: eviction manager: node conditions changed conditions=[]\n");
        assert!(!memory_pressure_in_log(&cleared));
        assert!(!memory_pressure_in_log("nothing yet\n"));
    }

    fn result(mode: Mode, ms: &[u64], triggers: &[&str]) -> ModeResult {
        let runs = ms
            .iter()
            .zip(triggers.iter().cycle())
            .map(|(ms, t)| {
                let d = decision(1_000 + ms * 1_000_000, 1_000, if *t == "periodic" { 0 } else { 1_000 }, t);
                outcome(1_000, Some(d), Some(2_000 + ms * 1_000_000))
            })
            .collect();
        ModeResult { mode, runs, rejections: 0 }
    }

    #[test]
    fn the_target_is_the_kernel_p99() {
        let fast = result(Mode::Kernel, &(1..=20).collect::<Vec<_>>(), &["memcg_threshold"]);
        assert_eq!(meets_target(&fast), Some(true));
        let slow = result(Mode::Kernel, &[10, 20, 600], &["memcg_threshold"]);
        assert_eq!(meets_target(&slow), Some(false));
        let mut undecided = fast.clone();
        undecided.runs[0].decision = None;
        assert_eq!(meets_target(&undecided), Some(false), "every run must decide");
        assert_eq!(meets_target(&result(Mode::Polling, &[1], &["periodic"])), None);
    }

    #[test]
    fn triggers_are_counted() {
        let r = result(Mode::Kernel, &[1, 2, 3], &["memcg_threshold", "psi", "memcg_threshold"]);
        assert_eq!(r.triggers(), "memcg_threshold ×2, psi ×1");
        assert_eq!(ModeResult { mode: Mode::Kernel, runs: vec![], rejections: 0 }.triggers(), "—");
    }

    #[test]
    fn the_report_puts_the_modes_side_by_side() {
        let results = [
            result(Mode::Kernel, &(1..=20).collect::<Vec<_>>(), &["memcg_threshold"]),
            result(Mode::Polling, &[5_000, 9_000], &["periodic"]),
        ];
        let t = text(&results);
        let line = t.lines().find(|l| l.starts_with("threshold crossed → decision¹")).unwrap();
        assert!(line.contains("10.0 ms / 18.0 ms / 20.0 ms / 20.0 ms ✓"), "{line}");
        assert!(line.contains("5000 ms / 9000 ms / 9000 ms / 9000 ms"), "{line}");
        assert!(line.ends_with("p99 < 500 ms"), "{line}");
        assert!(t.contains("memcg_threshold ×20") && t.contains("periodic ×2"), "{t}");
        let md = markdown(&results, &Environment::default());
        assert!(
            md.contains("| | kernel signals (default) | 10 s pass only | target |\n|---|---:|---:|---:|\n"),
            "{md}"
        );
        assert!(md.contains("## Runs, 10 s pass only"));
        assert!(md.contains("| hog-kernel-00 | 10.0 ms |"), "{md}");
        let only_kernel = text(&results[..1]);
        assert!(only_kernel.contains("not run"));
    }
}
