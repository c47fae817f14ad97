//! Measures the sensors on this node: kernel event -> userspace receive latency of
//! process exits, and what each program costs in the kernel.
//!
//! Phases: exits of unrelated processes (the filter's cost); exits of main processes,
//! each in a fresh cgroup like a container (forced wakeups), idle and with every CPU
//! busy; exits of further processes in one cgroup (no wakeup: delivered by the next
//! wakeup or the reader's periodic flush).
//!
//! Run as root: `cargo run --release -p swiftlet-ebpf --example latency [-- <exits>]`
//! (default 200 exits per phase). It creates `swiftlet-ebpf-latency-<pid>` in the memory
//! and cgroup2 hierarchies and removes it on exit.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use swiftlet_ebpf::{CancellationToken, ProgramStats, SensorConfig, SensorEvent, Sensors};
use tokio::sync::mpsc;

const MEMORY: &str = "/sys/fs/cgroup/memory";
const UNIFIED: &str = "/sys/fs/cgroup/unified";

/// The cgroups the example creates, removed on drop.
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            // Children first, whatever a failed phase left behind.
            if let Ok(entries) = fs::read_dir(dir) {
                for entry in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                    rmdir_retrying(&entry.path());
                }
            }
            rmdir_retrying(dir);
        }
    }
}

/// rmdir, waiting up to 2 s for exiting tasks to leave the cgroup.
fn rmdir_retrying(dir: &Path) {
    for _ in 0..100 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("warning: cannot remove {}", dir.display());
}

fn main() -> Result<()> {
    let exits: usize = std::env::args().nth(1).map(|a| a.parse()).transpose().context("exits")?.unwrap_or(200);
    // SAFETY: geteuid has no preconditions.
    ensure!(unsafe { libc::geteuid() } == 0, "run as root: the sensors need CAP_BPF/CAP_PERFMON and cgroups");

    let name = format!("swiftlet-ebpf-latency-{}", std::process::id());
    let root = Dual { memory: Path::new(MEMORY).join(&name), unified: Path::new(UNIFIED).join(&name) };
    let _scratch = Scratch(vec![root.memory.clone(), root.unified.clone()]);
    root.create()?;

    let mut sensors = Sensors::load(&SensorConfig::default())?;
    sensors.watch_cgroup(&root.memory)?;
    sensors.watch_cgroup(&root.unified)?;
    // Run-time statistics for as long as this fd is open.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enable BPF run-time stats")?;
    let cpus = thread::available_parallelism().map_or(2, std::num::NonZero::get);

    // The consumer runs on a current-thread runtime, as a single agent task would.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let cancel = CancellationToken::new();
        let mut rx = sensors.take_event_stream(&cancel)?;

        let before = sensors.program_stats();
        for _ in 0..exits {
            Command::new("/bin/true").status()?;
        }
        let unrelated = delta(&before, &sensors.program_stats());

        let before = sensors.program_stats();
        let main_idle = measure(&mut rx, exits, &root, Mode::MainProcesses, 0).await?;
        let main_cost = delta(&before, &sensors.program_stats());
        let main_loaded = measure(&mut rx, exits, &root, Mode::MainProcesses, cpus).await?;

        let before = sensors.program_stats();
        let other = measure(&mut rx, exits, &root, Mode::OtherProcesses, 0).await?;
        let other_cost = delta(&before, &sensors.program_stats());

        println!("exit -> receive latency (kernel ktime to the consumer task):");
        report("main processes, idle", &main_idle);
        report(&format!("main processes, {cpus} CPU hogs"), &main_loaded);
        report("other processes (no wakeup)", &other);
        println!("\nkernel cost per program run (bpf_stats, includes the stats overhead):");
        print_cost("unrelated tasks", &unrelated);
        print_cost("main processes", &main_cost);
        print_cost("other processes", &other_cost);
        println!("\ndrops: {}, decode errors: {}", sensors.drops(), sensors.decode_errors());
        cancel.cancel();
        Ok::<_, anyhow::Error>(())
    })
}

/// One cgroup in the memory hierarchy and in cgroup2.
#[derive(Clone)]
struct Dual {
    memory: PathBuf,
    unified: PathBuf,
}

impl Dual {
    fn create(&self) -> Result<()> {
        for dir in [&self.memory, &self.unified] {
            fs::create_dir(dir).with_context(|| format!("mkdir {}", dir.display()))?;
        }
        Ok(())
    }

    fn child(&self, name: &str) -> Self {
        Self { memory: self.memory.join(name), unified: self.unified.join(name) }
    }

    fn remove(&self) {
        rmdir_retrying(&self.memory);
        rmdir_retrying(&self.unified);
    }

    /// Runs `/bin/true` inside; the sh moves itself in before exec'ing it.
    fn run_true(&self) -> Result<()> {
        let script = format!(
            "echo 0 > {}/cgroup.procs && echo 0 > {}/cgroup.procs && exec /bin/true",
            self.memory.display(),
            self.unified.display()
        );
        let status = Command::new("/bin/sh").arg("-c").arg(&script).stdout(Stdio::null()).status()?;
        ensure!(status.success(), "child failed: {status}");
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every process in a fresh cgroup: each is its cgroup's main process.
    MainProcesses,
    /// Every process in one cgroup after a first one: none is the main process.
    OtherProcesses,
}

/// Latencies (ns) of `exits` exits, with `hogs` busy threads.
async fn measure(
    rx: &mut mpsc::Receiver<SensorEvent>,
    exits: usize,
    root: &Dual,
    mode: Mode,
    hogs: usize,
) -> Result<Vec<u64>> {
    let stop = Arc::new(AtomicBool::new(false));
    let hog_threads: Vec<_> = (0..hogs)
        .map(|_| {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
                }
            })
        })
        .collect();

    // Processes start from another thread so the consumer's thread only consumes.
    let root = root.clone();
    let spawner = thread::spawn(move || -> Result<()> {
        let shared = root.child("shared");
        if mode == Mode::OtherProcesses {
            shared.create()?;
            shared.run_true()?; // the main process, not measured
        }
        for i in 0..exits {
            if mode == Mode::MainProcesses {
                let fresh = root.child(&format!("c{i}"));
                fresh.create()?;
                fresh.run_true()?;
                fresh.remove();
            } else {
                shared.run_true()?;
            }
        }
        shared.remove();
        Ok(())
    });

    let mut latencies = Vec::with_capacity(exits);
    let mut skipped_main = mode == Mode::MainProcesses;
    let deadline = Instant::now() + Duration::from_mins(5);
    while latencies.len() < exits {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(event)) = tokio::time::timeout(remaining, rx.recv()).await else {
            bail!("only {} of {exits} exits arrived", latencies.len());
        };
        if let SensorEvent::Exit { ktime_ns, main_process, .. } = event {
            if main_process && !skipped_main {
                // The shared cgroup's own main process.
                skipped_main = true;
                continue;
            }
            latencies.push(Sensors::monotonic_now_ns().saturating_sub(ktime_ns));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for hog in hog_threads {
        let _ = hog.join();
    }
    spawner.join().map_err(|_| anyhow::anyhow!("spawner panicked"))??;
    Ok(latencies)
}

fn report(phase: &str, latencies: &[u64]) {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let pct = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    println!(
        "  {phase:34} n={} p50={:.1}us p90={:.1}us p99={:.1}us max={:.1}us",
        sorted.len(),
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(1.0)
    );
}

fn delta(before: &[ProgramStats], after: &[ProgramStats]) -> Vec<ProgramStats> {
    after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.program == a.program);
            ProgramStats {
                run_count: a.run_count - b.map_or(0, |b| b.run_count),
                run_time_ns: a.run_time_ns - b.map_or(0, |b| b.run_time_ns),
                ..a.clone()
            }
        })
        .collect()
}

fn print_cost(phase: &str, stats: &[ProgramStats]) {
    for s in stats.iter().filter(|s| s.run_count > 0) {
        println!(
            "  {phase:16} {:24} runs={:6} avg={:6}ns  (verified insns {:?}, jited {} B)",
            s.program,
            s.run_count,
            s.run_time_ns / s.run_count,
            s.verified_instructions,
            s.jited_bytes
        );
    }
}
