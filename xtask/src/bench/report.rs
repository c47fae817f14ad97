//! The figures of a `bench pleg` run and their rendering: one table with both PLEGs side
//! by side, the upstream kubelet's figures and the targets, as plain text (stdout) and as
//! Markdown (`target/bench/pleg.md`, for the README to quote).

use std::fmt::Write as _;

use crate::bench::{agent::PlegMode, latency::Summary};

/// What the latency phase measured.
#[derive(Debug, Clone, Default)]
pub struct LatencyFigures {
    pub pods: usize,
    pub containers: usize,
    /// Seconds from writing the manifests until every container ran.
    pub start_secs: f64,
    /// Containers killed (each once).
    pub kills: usize,
    /// Containers not killed because their process was already gone.
    pub skipped: usize,
    /// Kernel exit → pod worker (evented events only).
    pub exit_to_worker: Option<Summary>,
    /// Kill → kernel exit (evented events only).
    pub kill_to_exit: Option<Summary>,
    /// Kill → pod worker.
    pub kill_to_worker: Option<Summary>,
    /// Pod worker → status updated.
    pub worker_to_status: Option<Summary>,
    /// (b) Kill → status updated.
    pub kill_to_status: Option<Summary>,
    /// Kill → status shows the container running again.
    pub kill_to_running: Option<Summary>,
    /// `ContainerDied` dispatches that carried no kernel time (found by a relist).
    pub without_kernel_time: usize,
    /// `ContainerDied` events of containers the bench did not kill, during the kill phase.
    pub unexpected_exits: usize,
    /// Kills whose dispatch / status / restart was not seen within the per-kill wait.
    pub timeouts: [usize; 3],
    /// Agent CPU seconds and wall seconds over the kill phase.
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
    /// Agent CPU with the same pods and no kills, measured just before the kill phase.
    pub background_cores: f64,
}

impl LatencyFigures {
    /// Agent CPU seconds per 1000 kill+restart cycles, all of the kill phase's CPU.
    pub fn cpu_per_1000(&self) -> Option<f64> {
        (self.kills > 0).then(|| self.cpu_seconds / self.kills as f64 * 1000.0)
    }

    /// The same without the background: what the kills themselves cost.
    pub fn net_cpu_per_1000(&self) -> Option<f64> {
        (self.kills > 0).then(|| {
            (self.cpu_seconds - self.background_cores * self.wall_seconds).max(0.0) / self.kills as f64 * 1000.0
        })
    }
}

/// What the idle phase measured.
#[derive(Debug, Clone, Default)]
pub struct IdleFigures {
    pub pods: usize,
    pub start_secs: f64,
    pub window_secs: f64,
    /// Agent CPU over the window, in cores.
    pub cores: f64,
    /// containerd's CPU over the same window (the relist's cost lands there too).
    pub containerd_cores: Option<f64>,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct ModeResult {
    pub mode: PlegMode,
    pub latency: LatencyFigures,
    pub idle: IdleFigures,
}

/// Where the figures were taken.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    pub date: String,
    pub kernel: String,
    pub cpu: String,
    pub cores: usize,
    pub runtime: String,
    pub commit: String,
}

impl Environment {
    /// The head of a bench's Markdown report: the title (`command`) and where it ran, with
    /// `build` saying how the agent measured was built and configured.
    pub fn markdown_head(&self, command: &str, build: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# `{command}`\n");
        let _ = writeln!(out, "- date: {}", self.date);
        let _ = writeln!(out, "- machine: {}, {} cores, kernel {}", self.cpu, self.cores, self.kernel);
        let _ = writeln!(out, "- runtime: {}", self.runtime);
        let _ = writeln!(out, "- swiftlet: {} ({build})", self.commit);
        out
    }
}

/// The upstream kubelet 1.28 in kind on this machine (from the issue).
const UPSTREAM_KILL_TO_API_P50: &str = "481 ms";
const UPSTREAM_KILL_TO_API_P99: &str = "984 ms";
const UPSTREAM_IDLE_CORES: &str = "0.047";
const UPSTREAM_IDLE_RSS: &str = "115 MiB";

/// Targets (from the issue).
const TARGET_A_P99_NS: u64 = 5_000_000;
const TARGET_B_P99_NS: u64 = 50_000_000;
const TARGET_IDLE_CORES: f64 = 0.01;
const TARGET_RSS_BYTES: u64 = 30 * 1024 * 1024;

const MIB: f64 = 1024.0 * 1024.0;

/// `ns` as milliseconds with about three significant digits.
pub fn fmt_ms(ns: u64) -> String {
    format!("{} ms", three_digits(ns as f64 / 1e6))
}

/// The decimals a figure gets: how many of the thresholds of `ladder` (largest first, each
/// a tenth of the one before) `x` is below, one more decimal for each, so that a figure
/// keeps about as many significant digits at any size.
pub fn decimals(x: f64, ladder: &[f64]) -> usize {
    ladder.iter().position(|&t| x >= t).unwrap_or(ladder.len())
}

/// `x` with about three significant digits (no decimals from 100 up, 3 below 1).
pub fn three_digits(x: f64) -> String {
    let n = decimals(x, &[100.0, 10.0, 1.0]);
    format!("{x:.n$}")
}

fn check(text: &str, ok: bool) -> String {
    format!("{text} {}", if ok { "✓" } else { "✗" })
}

/// One row: metric, evented, relist, upstream, target.
struct Row([String; 5]);

/// Formats a figure of each mode's result; `not run` for a mode that did not run.
fn per_mode(results: &[ModeResult], f: impl Fn(&ModeResult) -> String) -> [String; 2] {
    [PlegMode::Evented, PlegMode::Relist]
        .map(|m| results.iter().find(|r| r.mode == m).map_or_else(|| "not run".to_owned(), &f))
}

fn row(metric: &str, cells: [String; 2], upstream: &str, target: &str) -> Row {
    let [e, r] = cells;
    Row([metric.to_owned(), e, r, upstream.to_owned(), target.to_owned()])
}

fn summary_cell(s: Option<&Summary>, pick: impl Fn(&Summary) -> u64, target_ns: Option<u64>) -> String {
    match s {
        None => "—".to_owned(),
        Some(s) => {
            let v = pick(s);
            match target_ns {
                Some(t) => check(&fmt_ms(v), v < t),
                None => fmt_ms(v),
            }
        }
    }
}

fn p50_p99(s: Option<&Summary>) -> String {
    s.map_or_else(|| "—".to_owned(), |s| format!("{} / {}", fmt_ms(s.p50), fmt_ms(s.p99)))
}

/// The (a) latency of a mode: kernel exit → pod worker for the evented PLEG, kill → pod
/// worker for the relist PLEG (its events carry no kernel time).
fn latency_a(r: &ModeResult) -> Option<&Summary> {
    match r.mode {
        PlegMode::Evented => r.latency.exit_to_worker.as_ref(),
        PlegMode::Relist => r.latency.kill_to_worker.as_ref(),
    }
}

fn rows(results: &[ModeResult]) -> Vec<Row> {
    type Pick = fn(&Summary) -> u64;
    type Stage = fn(&LatencyFigures) -> Option<&Summary>;
    let mut rows = Vec::new();
    rows.push(row(
        "containers killed (once each)",
        per_mode(results, |r| match r.latency.skipped {
            0 => r.latency.kills.to_string(),
            n => format!("{} ({n} already gone)", r.latency.kills),
        }),
        "",
        "≥ 200",
    ));
    let stats: [(&str, Pick); 4] = [("p50", |s| s.p50), ("p90", |s| s.p90), ("p99", |s| s.p99), ("max", |s| s.max)];
    for (name, pick) in stats {
        let target = (name == "p99").then_some(TARGET_A_P99_NS);
        rows.push(row(
            &format!("(a) exit → pod worker¹, {name}"),
            per_mode(results, |r| summary_cell(latency_a(r), pick, target)),
            "",
            if name == "p99" { "< 5 ms" } else { "" },
        ));
    }
    rows.push(row("(a) n", per_mode(results, |r| latency_a(r).map_or(0, |s| s.n).to_string()), "", ""));
    for (name, pick) in stats {
        let target = (name == "p99").then_some(TARGET_B_P99_NS);
        let upstream = match name {
            "p50" => UPSTREAM_KILL_TO_API_P50,
            "p99" => UPSTREAM_KILL_TO_API_P99,
            _ => "",
        };
        rows.push(row(
            &format!("(b) kill → pod status updated², {name}"),
            per_mode(results, |r| summary_cell(r.latency.kill_to_status.as_ref(), pick, target)),
            upstream,
            if name == "p99" { "< 50 ms" } else { "" },
        ));
    }
    rows.push(row(
        "(b) n",
        per_mode(results, |r| r.latency.kill_to_status.as_ref().map_or(0, |s| s.n).to_string()),
        "",
        "",
    ));
    let stages: [(&str, Stage); 4] = [
        ("kill → kernel exit", |l| l.kill_to_exit.as_ref()),
        ("kill → pod worker", |l| l.kill_to_worker.as_ref()),
        ("pod worker → status updated", |l| l.worker_to_status.as_ref()),
        ("kill → running again (restarted)", |l| l.kill_to_running.as_ref()),
    ];
    for (stage, pick) in stages {
        rows.push(row(&format!("{stage}, p50 / p99"), per_mode(results, |r| p50_p99(pick(&r.latency))), "", ""));
    }
    rows.push(row(
        "ContainerDied without kernel time³",
        per_mode(results, |r| match r.mode {
            PlegMode::Evented => r.latency.without_kernel_time.to_string(),
            PlegMode::Relist => "all".to_owned(),
        }),
        "",
        "",
    ));
    rows.push(row(
        "exits the bench did not cause",
        per_mode(results, |r| r.latency.unexpected_exits.to_string()),
        "",
        "0",
    ));
    rows.push(row(
        "timeouts⁴ (dispatch / status / restart)",
        per_mode(results, |r| {
            let [d, s, x] = r.latency.timeouts;
            format!("{d} / {s} / {x}")
        }),
        "",
        "0",
    ));
    rows.push(row(
        "agent CPU per 1000 kill+restart cycles⁵",
        per_mode(results, |r| r.latency.cpu_per_1000().map_or_else(|| "—".to_owned(), |c| format!("{c:.2} CPU-s"))),
        "",
        "",
    ));
    rows.push(row(
        "… net of the background⁵",
        per_mode(results, |r| r.latency.net_cpu_per_1000().map_or_else(|| "—".to_owned(), |c| format!("{c:.2} CPU-s"))),
        "",
        "",
    ));
    rows.push(row(
        "agent background CPU, latency pods, no kills",
        per_mode(results, |r| format!("{:.4} cores", r.latency.background_cores)),
        "",
        "",
    ));
    rows.push(row(
        "agent CPU during the kill phase",
        per_mode(results, |r| {
            let l = &r.latency;
            format!("{:.3} cores over {:.0} s", l.cpu_seconds / l.wall_seconds.max(1e-9), l.wall_seconds)
        }),
        "",
        "",
    ));
    let pods = results.first().map_or(0, |r| r.idle.pods);
    rows.push(row(
        &format!("idle agent CPU, {pods} pods"),
        per_mode(results, |r| check(&format!("{:.4} cores", r.idle.cores), r.idle.cores < TARGET_IDLE_CORES)),
        UPSTREAM_IDLE_CORES,
        "< 0.01",
    ));
    rows.push(row(
        &format!("idle containerd CPU, {pods} pods⁶"),
        per_mode(results, |r| r.idle.containerd_cores.map_or_else(|| "—".to_owned(), |c| format!("{c:.4} cores"))),
        "",
        "",
    ));
    rows.push(row(
        &format!("agent RSS, {pods} pods"),
        per_mode(results, |r| {
            check(&format!("{:.1} MiB", r.idle.rss_bytes as f64 / MIB), r.idle.rss_bytes < TARGET_RSS_BYTES)
        }),
        UPSTREAM_IDLE_RSS,
        "< 30 MiB",
    ));
    rows.push(row(
        "agent peak RSS (whole run)",
        per_mode(results, |r| format!("{:.1} MiB", r.idle.peak_rss_bytes as f64 / MIB)),
        "",
        "",
    ));
    rows
}

const HEADER: [&str; 5] = ["", "evented PLEG (eBPF)", "relist PLEG (1 s)", "kubelet 1.28 (kind)", "target"];

fn footnotes(results: &[ModeResult]) -> Vec<String> {
    let kills = results.first().map_or(0, |r| r.latency.kills);
    vec![
        "¹ evented: from the kernel's exit time (`sched_process_exit`, CLOCK_MONOTONIC) to the event at the pod \
         worker; relist: from the kill, as relist events carry no kernel time."
            .to_owned(),
        format!(
            "² from `kill(2)` to the first pod status computed that shows the container exited (or restarted); \
             {kills} containers in pods of 10, each SIGKILLed once, one at a time, after a random 0–1 s pause so \
             kills are not in phase with the 1 s relist."
        ),
        "³ evented: ContainerDied events found by the safety relist instead of the sensors.".to_owned(),
        "⁴ kills whose dispatch, status update or restart was not seen within 5 s.".to_owned(),
        "⁵ each kill causes a restart, so this is per kill+restart cycle: agent CPU over the whole kill phase \
         (including background work such as relists during the pauses) divided by the kills; net: minus the \
         background CPU measured over 10 s with the same pods just before the kills."
            .to_owned(),
        "⁶ the runtime's CPU over the same idle window: relisting costs containerd CPU too.".to_owned(),
        "kubelet 1.28 (kind, this machine): (b) is kill → terminated in the API; idle with 100 pods.".to_owned(),
    ]
}

/// The table as aligned plain text.
pub fn text(results: &[ModeResult]) -> String {
    let mut rows = rows(results);
    // Figures with and without a ✓/✗ line up on their last digit.
    for Row(cells) in &mut rows {
        for c in &mut cells[1..=2] {
            if !(c.ends_with('✓') || c.ends_with('✗')) {
                c.push_str("  ");
            }
        }
    }
    let mut widths = HEADER.map(|h| h.chars().count());
    for Row(cells) in &rows {
        for (w, c) in widths.iter_mut().zip(cells) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String; 5]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - c.chars().count();
            if i == 0 {
                let _ = write!(s, "{c}{}", " ".repeat(pad));
            } else {
                let _ = write!(s, "  {}{c}", " ".repeat(pad));
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = String::new();
    out.push_str(&line(&HEADER.map(str::to_owned)));
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for Row(cells) in &rows {
        out.push_str(&line(cells));
        out.push('\n');
    }
    out.push('\n');
    for f in footnotes(results) {
        out.push_str(&f);
        out.push('\n');
    }
    out
}

/// The whole report as Markdown.
pub fn markdown(results: &[ModeResult], env: &Environment) -> String {
    let mut out = env.markdown_head("cargo xtask bench pleg", "release build");
    for r in results {
        let _ = writeln!(
            out,
            "- {}: {} containers in {} pods running {:.0} s after their manifests appeared; {} idle pods in {:.0} s; \
             idle window {:.0} s",
            r.mode,
            r.latency.containers,
            r.latency.pods,
            r.latency.start_secs,
            r.idle.pods,
            r.idle.start_secs,
            r.idle.window_secs
        );
    }
    out.push('\n');
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(out, "|---|---:|---:|---:|---|");
    for Row(cells) in rows(results) {
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out.push('\n');
    for f in footnotes(results) {
        let _ = writeln!(out, "{f}  ");
    }
    out
}

/// Aligned plain text: first column left, the others right.
pub fn text_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = " ".repeat(w - c.chars().count());
            if i == 0 {
                let _ = write!(s, "{c}{pad}");
            } else {
                let _ = write!(s, "  {pad}{c}");
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = line(&header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>());
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

/// A Markdown table: first column left, the others right.
pub fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<String> = cells.map(|c| if c.is_empty() { " ".to_owned() } else { format!(" {c} ") }).collect();
        format!("|{}|\n", cells.join("|"))
    };
    let mut out = line(&mut header.iter().copied());
    let _ = writeln!(out, "|---|{}", "---:|".repeat(header.len().saturating_sub(1)));
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
pub fn utc_date(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", secs / 3600, secs % 3600 / 60)
}

/// The `model name` of the first CPU in `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_owned())
    })
}

/// Writes a bench's Markdown report to `target/bench/<file>` and prints its table under a
/// title line naming the machine. `incomplete`: what the bench did not get to measure
/// (a note in the report, a mark on the title).
pub fn publish(
    ctx: &crate::Ctx,
    file: &str,
    title: &str,
    env: &Environment,
    mut md: String,
    table: &str,
    incomplete: Option<&str>,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    if let Some(what) = incomplete {
        let _ = writeln!(md, "\n**Incomplete**: the bench failed before it measured every {what} it was asked to.");
    }
    let dir = super::pleg::bench_dir(ctx);
    let path = dir.join(file);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!();
    println!(
        "{title}, {} ({}, {} cores, kernel {}, {}){}",
        env.date,
        env.cpu,
        env.cores,
        env.kernel,
        env.runtime,
        if incomplete.is_some() { " — INCOMPLETE" } else { "" }
    );
    println!();
    print!("{table}");
    println!();
    println!("written to {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(p50: u64, p99: u64) -> Summary {
        Summary { n: 200, p50, p90: p50, p99, max: p99 }
    }

    fn result(mode: PlegMode) -> ModeResult {
        ModeResult {
            mode,
            latency: LatencyFigures {
                kills: 200,
                exit_to_worker: Some(summary(40_000, 900_000)),
                kill_to_worker: Some(summary(500_000_000, 990_000_000)),
                kill_to_status: Some(summary(20_000_000, 60_000_000)),
                cpu_seconds: 1.0,
                wall_seconds: 100.0,
                background_cores: 0.004,
                ..LatencyFigures::default()
            },
            idle: IdleFigures { pods: 100, cores: 0.002, rss_bytes: 20 * 1024 * 1024, ..IdleFigures::default() },
        }
    }

    #[test]
    fn formats_milliseconds() {
        assert_eq!(fmt_ms(40_000), "0.040 ms");
        assert_eq!(fmt_ms(4_321_000), "4.32 ms");
        assert_eq!(fmt_ms(43_210_000), "43.2 ms");
        assert_eq!(fmt_ms(481_400_000), "481 ms");
    }

    #[test]
    fn table_puts_modes_side_by_side_with_checks() {
        let t = text(&[result(PlegMode::Evented), result(PlegMode::Relist)]);
        let a_p99 = t.lines().find(|l| l.starts_with("(a) exit → pod worker¹, p99")).unwrap();
        // Evented (a) is from the kernel time, relist (a) from the kill.
        assert!(a_p99.contains("0.900 ms ✓") && a_p99.contains("990 ms ✗") && a_p99.ends_with("< 5 ms"), "{a_p99}");
        let b_p99 = t.lines().find(|l| l.starts_with("(b) kill → pod status updated², p99")).unwrap();
        assert!(b_p99.contains("60.0 ms ✗") && b_p99.contains("984 ms"), "{b_p99}");
        // 1 CPU-s over 200 kills.
        assert!(t.contains("5.00 CPU-s"));
        // Net: (1 - 0.004 × 100) / 200 × 1000.
        assert!(t.contains("3.00 CPU-s"));
        assert!(t.contains("0.0020 cores ✓"));
        // Columns line up: every row of the table is as wide as its longest cell allows.
        // Right-aligned columns: the header and the figures end in the same column.
        let end_of = |line: &str, cell: &str| line.find(cell).map(|i| line[..i].chars().count() + cell.chars().count());
        let header = t.lines().next().unwrap();
        assert_eq!(end_of(header, "evented PLEG (eBPF)"), end_of(a_p99, "0.900 ms ✓"), "{t}");
        assert_eq!(end_of(header, "relist PLEG (1 s)"), end_of(a_p99, "990 ms ✗"), "{t}");
        let a_p50 = t.lines().find(|l| l.starts_with("(a) exit → pod worker¹, p50")).unwrap();
        assert_eq!(end_of(a_p50, "0.040 ms").map(|e| e + 2), end_of(a_p99, "0.900 ms ✓"), "{t}");
    }

    #[test]
    fn a_mode_that_did_not_run_says_so() {
        let md = markdown(&[result(PlegMode::Evented)], &Environment::default());
        assert!(md.contains("| not run |"));
        assert!(md.contains("|---|---:|---:|---:|---|"));
    }

    #[test]
    fn dates_and_cpu_model() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(951_827_696), "2000-02-29 12:34 UTC");
        assert_eq!(utc_date(1_798_675_200), "2026-12-31 00:00 UTC");
        assert_eq!(
            cpu_model("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n").as_deref(),
            Some("AMD EPYC")
        );
        assert_eq!(cpu_model("processor: 0\n"), None);
    }
}
