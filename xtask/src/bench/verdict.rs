//! The summary's table ([`super::summary`]): one row per figure, both agents, the ratio
//! swiftlet ÷ the other agent from the same run, the runtime's floor where one applies,
//! the target and a verdict.
//!
//! Targets, with another agent measured (ratios swiftlet ÷ it, from the same run):
//! - single pod create → Running: p50 ≤ 0.4×, and within 60 ms of the runtime's own
//!   sandbox + container start p50;
//! - 30- and 100-pod bursts: p50 ≤ 0.5×, and p99 within 5 % of the runtime's own burst of
//!   the same size;
//! - exit detection (kill → status in the API): p99 ≤ 0.05×;
//! - idle CPU at 100 pods ≤ 0.2×; RSS at 100 pods ≤ 0.4×;
//! - each metrics endpoint ≤ 0.2× in wall time (p50) and in CPU (mean);
//! - API requests at idle ≤ 1× (the burst's are shown, without a target);
//! - eviction decision p99 < 500 ms (swiftlet alone).
//!
//! Without another agent the upstream kubelet 1.28's figures stand in, as history: at
//! least 2× better than them, and the floors as above.
//!
//! A row that misses names where to look: the agents' logs for the latency rows, the
//! `perf record` of the idle window or of the scrape phase for the CPU rows (or that
//! `perf` was missing), `smaps_rollup` and `status` for the RSS row.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use crate::bench::{
    apiload::{self, Window},
    burstcpu::Split,
    eviction,
    latency::Summary,
    profile,
    report::{self, Environment},
    scrape::Stats,
    summary::{AgentFigures, AllArgs, Figures, Idle, MIB, UPSTREAM, summary},
};

/// Upstream kubelet 1.28 on this machine kind (issues 1, 2 and 10): history.
const REF_SINGLE_P50_NS: u64 = 680_000_000;
const REF_SINGLE_P99_NS: u64 = 1_200_000_000;
/// Burst size → create → Running p99.
const REF_BURST_P99_NS: [(usize, u64); 2] = [(30, 4_800_000_000), (100, 15_100_000_000)];
/// Kill → pod status updated, p50 and p99 (the `bench pleg` reference).
const REF_EXIT_NS: (u64, u64) = (481_000_000, 984_000_000);
const REF_IDLE_CORES: f64 = 0.047;
const REF_RSS_BYTES: u64 = 115 * 1024 * 1024;
/// Against the history: at least this many times better.
const HISTORY_FACTOR: f64 = 2.0;

/// Single-pod p50 at most this much above the runtime's own p50.
const RUNTIME_MARGIN_NS: u64 = 60_000_000;
/// A burst's p99 at most this share above the runtime's own burst's p99.
const BURST_FLOOR_MARGIN: f64 = 0.05;
/// The targets, swiftlet ÷ the other agent, at most.
pub const SINGLE_P50_SHARE: f64 = 0.4;
pub const BURST_P50_SHARE: f64 = 0.5;
pub const EXIT_P99_SHARE: f64 = 0.05;
pub const IDLE_CPU_SHARE: f64 = 0.2;
pub const RSS_SHARE: f64 = 0.4;
pub const SCRAPE_SHARE: f64 = 0.2;
pub const API_IDLE_SHARE: f64 = 1.0;

/// One row: metric, swiftlet, the other agent, swiftlet ÷ other, the runtime's floor,
/// kubelet 1.28 (history), target, verdict; `ok` for a row with a verdict, `look`:
/// where to look when it misses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub metric: String,
    pub swiftlet: String,
    pub other: String,
    pub ratio: String,
    pub floor: String,
    pub reference: String,
    pub target: String,
    pub verdict: String,
    pub ok: Option<bool>,
    pub look: Vec<String>,
}

/// One condition of a row's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub ok: bool,
    pub text: String,
}

/// `ours ÷ theirs`; 0 when both are 0, infinite when only theirs is.
pub fn share(ours: f64, theirs: f64) -> f64 {
    if theirs > 0.0 {
        ours / theirs
    } else if ours > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// A share with two significant digits (`0.35×`, `0.021×`, `1.2×`).
pub fn fmt_share(r: f64) -> String {
    if r.is_infinite() {
        "∞".to_owned()
    } else {
        let n = 1 + report::decimals(r, &[1.0, 0.1, 0.01]);
        format!("{r:.n$}×")
    }
}

/// `what` of ours ÷ theirs at most `limit`.
pub fn at_most(what: &str, ours: f64, theirs: f64, limit: f64) -> Check {
    let r = share(ours, theirs);
    let text = if what.is_empty() { fmt_share(r) } else { format!("{what} {}", fmt_share(r)) };
    Check { ok: r <= limit, text }
}

/// History: `reference ÷ ours` at least [`HISTORY_FACTOR`].
fn history(what: &str, ours: f64, reference: f64) -> Check {
    let r = if ours > 0.0 { reference / ours } else { f64::INFINITY };
    let times = if r.is_infinite() { "∞".to_owned() } else { format!("{r:.1}×") };
    let text = if what.is_empty() { format!("{times} better") } else { format!("{what} {times} better") };
    Check { ok: r >= HISTORY_FACTOR, text }
}

/// A p50 at most [`RUNTIME_MARGIN_NS`] above the runtime's own.
pub fn within_margin(ours_ns: u64, floor_ns: u64) -> Check {
    // The two are measured minutes apart on a noisy runtime: the agent's p50 can come
    // out below the runtime's own.
    let (sign, by) = if ours_ns >= floor_ns { ("+", ours_ns - floor_ns) } else { ("−", floor_ns - ours_ns) };
    Check { ok: ours_ns <= floor_ns + RUNTIME_MARGIN_NS, text: format!("p50 floor {sign} {}", report::fmt_ms(by)) }
}

/// A p99 at most [`BURST_FLOOR_MARGIN`] above the runtime's own burst's.
pub fn within_share(ours_ns: u64, floor_ns: u64) -> Check {
    let over = if floor_ns > 0 { ours_ns as f64 / floor_ns as f64 - 1.0 } else { f64::INFINITY };
    let ok = ours_ns as f64 <= floor_ns as f64 * (1.0 + BURST_FLOOR_MARGIN);
    let pct = over * 100.0;
    let text = if pct >= 0.0 { format!("p99 floor + {pct:.1} %") } else { format!("p99 floor − {:.1} %", -pct) };
    Check { ok, text }
}

fn mark(ok: bool) -> &'static str {
    if ok { "✓" } else { "✗" }
}

/// The verdict of a row's checks: ✓ when every one holds; `None` without any.
pub fn verdict_of(checks: &[Check]) -> Option<(bool, String)> {
    if checks.is_empty() {
        return None;
    }
    let ok = checks.iter().all(|c| c.ok);
    let text = checks.iter().map(|c| c.text.as_str()).collect::<Vec<_>>().join(", ");
    Some((ok, format!("{} {text}", mark(ok))))
}

fn ns(v: u64) -> f64 {
    v as f64
}

fn p50_p90_p99(s: Option<&Summary>) -> String {
    s.map_or_else(
        || "—".to_owned(),
        |s| format!("{} / {} / {}", report::fmt_ms(s.p50), report::fmt_ms(s.p90), report::fmt_ms(s.p99)),
    )
}

fn p50_p99(s: Option<&Summary>) -> String {
    s.map_or_else(|| "—".to_owned(), |s| format!("{} / {}", report::fmt_ms(s.p50), report::fmt_ms(s.p99)))
}

/// `p50 0.35×, p99 0.40×` of two latency summaries.
fn latency_ratio(ours: Option<&Summary>, theirs: Option<&Summary>) -> String {
    match (ours, theirs) {
        (Some(o), Some(t)) => {
            format!("p50 {}, p99 {}", fmt_share(share(ns(o.p50), ns(t.p50))), fmt_share(share(ns(o.p99), ns(t.p99))))
        }
        _ => String::new(),
    }
}

fn files(paths: &[std::path::PathBuf]) -> Vec<String> {
    paths.iter().map(|p| p.display().to_string()).collect()
}

/// A row's verdict and target filled in from its checks.
fn with_verdict(mut row: Row, checks: &[Check], target: String) -> Row {
    if let Some((ok, text)) = verdict_of(checks) {
        row.ok = Some(ok);
        row.verdict = text;
        row.target = target;
    }
    row
}

pub fn rows(f: &Figures) -> Vec<Row> {
    let other = f.other.as_ref();
    let measured = other.is_some();
    let ours = &f.swiftlet;
    let cell = |pick: &dyn Fn(&AgentFigures) -> String| other.map_or_else(String::new, pick);
    let logs = files(&ours.files.logs);
    let mut rows = Vec::new();

    // Start-up.
    let floor = summary(&f.runtime_start);
    let single = summary(&ours.single);
    let their_single = other.and_then(|o| summary(&o.single));
    let mut checks = Vec::new();
    if let Some(s) = &single {
        match (&their_single, measured) {
            (Some(t), _) => checks.push(at_most("p50", ns(s.p50), ns(t.p50), SINGLE_P50_SHARE)),
            (None, false) => {
                checks.push(history("p50", ns(s.p50), ns(REF_SINGLE_P50_NS)));
                checks.push(history("p99", ns(s.p99), ns(REF_SINGLE_P99_NS)));
            }
            (None, true) => {}
        }
        if let Some(r) = &floor {
            checks.push(within_margin(s.p50, r.p50));
        }
    }
    let target = if measured {
        format!("p50 ≤ {SINGLE_P50_SHARE}×; p50 ≤ floor + 60 ms")
    } else {
        format!("≥ {HISTORY_FACTOR:.0}× better; p50 ≤ floor + 60 ms")
    };
    rows.push(with_verdict(
        Row {
            metric: format!("single pod, create → Running¹ ({} runs), p50 / p90 / p99", ours.single.len()),
            swiftlet: p50_p90_p99(single.as_ref()),
            other: cell(&|o| p50_p90_p99(summary(&o.single).as_ref())),
            ratio: latency_ratio(single.as_ref(), their_single.as_ref()),
            floor: floor.as_ref().map_or_else(String::new, |r| format!("{}² ({} runs)", p50_p99(Some(r)), r.n)),
            reference: format!("{} / — / {}", report::fmt_ms(REF_SINGLE_P50_NS), report::fmt_ms(REF_SINGLE_P99_NS)),
            look: logs.clone(),
            ..Row::default()
        },
        &checks,
        target,
    ));

    for (size, lat) in &ours.bursts {
        let s = summary(lat);
        let theirs = other.and_then(|o| o.burst(*size)).and_then(summary);
        let floor = f.runtime_burst(*size).and_then(|b| summary(&b.latencies).map(|s| (s, b.in_flight)));
        let reference = REF_BURST_P99_NS.iter().find(|(n, _)| n == size).map(|(_, p99)| *p99);
        let mut checks = Vec::new();
        if let Some(s) = &s {
            match (&theirs, measured, reference) {
                (Some(t), ..) => checks.push(at_most("p50", ns(s.p50), ns(t.p50), BURST_P50_SHARE)),
                (None, false, Some(r)) => checks.push(history("p99", ns(s.p99), ns(r))),
                _ => {}
            }
            if let Some((fl, _)) = &floor {
                checks.push(within_share(s.p99, fl.p99));
            }
        }
        let target = if measured {
            format!("p50 ≤ {BURST_P50_SHARE}×; p99 ≤ floor + 5 %")
        } else if reference.is_some() {
            format!("≥ {HISTORY_FACTOR:.0}× better; p99 ≤ floor + 5 %")
        } else {
            "p99 ≤ floor + 5 %".to_owned()
        };
        rows.push(with_verdict(
            Row {
                metric: format!("{size}-pod burst, create → Running¹ per pod, p50 / p90 / p99"),
                swiftlet: p50_p90_p99(s.as_ref()),
                other: cell(&|o| p50_p90_p99(o.burst(*size).and_then(summary).as_ref())),
                ratio: latency_ratio(s.as_ref(), theirs.as_ref()),
                floor: floor
                    .as_ref()
                    .map_or_else(String::new, |(fl, k)| format!("{}⁷ (≤ {k} at a time)", p50_p99(Some(fl)))),
                reference: reference.map_or_else(String::new, |r| format!("— / — / {}", report::fmt_ms(r))),
                look: logs.iter().cloned().chain(std::iter::once("the CPU of the burst¹⁰ below".to_owned())).collect(),
                ..Row::default()
            },
            &checks,
            target,
        ));
    }

    // Exit detection.
    let exit = summary(&ours.exit_api);
    let their_exit = other.and_then(|o| summary(&o.exit_api));
    let mut checks = Vec::new();
    if let Some(e) = &exit {
        match (&their_exit, measured) {
            (Some(t), _) => checks.push(at_most("p99", ns(e.p99), ns(t.p99), EXIT_P99_SHARE)),
            (None, false) => {
                checks.push(history("p50", ns(e.p50), ns(REF_EXIT_NS.0)));
                checks.push(history("p99", ns(e.p99), ns(REF_EXIT_NS.1)));
            }
            (None, true) => {}
        }
    }
    rows.push(with_verdict(
        Row {
            metric: format!("exit detection, kill → status in the API³ ({} kills), p50 / p99", ours.exit_api.len()),
            swiftlet: p50_p99(exit.as_ref()),
            other: cell(&|o| p50_p99(summary(&o.exit_api).as_ref())),
            ratio: latency_ratio(exit.as_ref(), their_exit.as_ref()),
            reference: format!("{} / {}", report::fmt_ms(REF_EXIT_NS.0), report::fmt_ms(REF_EXIT_NS.1)),
            look: logs.clone(),
            ..Row::default()
        },
        &checks,
        if measured { format!("p99 ≤ {EXIT_P99_SHARE}×") } else { format!("≥ {HISTORY_FACTOR:.0}× better") },
    ));
    if !ours.exit_agent.is_empty() {
        rows.push(Row {
            metric: "exit detection, kill → pod status computed in the agent⁴, p50 / p99".to_owned(),
            swiftlet: p50_p99(summary(&ours.exit_agent).as_ref()),
            other: cell(&|_| "—".to_owned()),
            ..Row::default()
        });
    }

    // Cost at rest.
    if let Some(idle) = ours.pooled_idle() {
        let their_idle = other.and_then(AgentFigures::pooled_idle);
        let per_round = |a: &AgentFigures, show: &dyn Fn(&Idle) -> String| {
            if a.idle.len() > 1 {
                format!(" ({})", a.idle.iter().map(show).collect::<Vec<_>>().join(", "))
            } else {
                String::new()
            }
        };
        let cores = |i: &Idle| format!("{:.4}", i.cores);
        let mib = |i: &Idle| format!("{:.1}", i.rss_bytes as f64 / MIB);
        let cpu_check = match (their_idle, measured) {
            (Some(t), _) => Some(at_most("", idle.cores, t.cores, IDLE_CPU_SHARE)),
            (None, false) => Some(history("", idle.cores, REF_IDLE_CORES)),
            (None, true) => None,
        };
        let idle_look = if !f.perf {
            vec![profile::PERF_MISSING.to_owned()]
        } else if ours.files.idle_perf.is_empty() {
            vec!["no profile was written (see the bench's output)".to_owned()]
        } else {
            files(&ours.files.idle_perf)
        };
        rows.push(with_verdict(
            Row {
                metric: format!("idle agent CPU, {} pods⁵", idle.pods),
                swiftlet: format!("{:.4} cores{}", idle.cores, per_round(ours, &cores)),
                other: cell(&|o| {
                    o.pooled_idle()
                        .map_or_else(|| "—".to_owned(), |i| format!("{:.4} cores{}", i.cores, per_round(o, &cores)))
                }),
                ratio: their_idle.map_or_else(String::new, |t| fmt_share(share(idle.cores, t.cores))),
                reference: format!("{REF_IDLE_CORES} cores"),
                look: idle_look,
                ..Row::default()
            },
            &cpu_check.into_iter().collect::<Vec<_>>(),
            if measured { format!("≤ {IDLE_CPU_SHARE}×") } else { format!("≥ {HISTORY_FACTOR:.0}× better") },
        ));
        let rss_check = match (their_idle, measured) {
            (Some(t), _) => Some(at_most("", idle.rss_bytes as f64, t.rss_bytes as f64, RSS_SHARE)),
            (None, false) => Some(history("", idle.rss_bytes as f64, REF_RSS_BYTES as f64)),
            (None, true) => None,
        };
        rows.push(with_verdict(
            Row {
                metric: format!("agent RSS, {} pods", idle.pods),
                swiftlet: format!("{:.1} MiB{}", idle.rss_bytes as f64 / MIB, per_round(ours, &mib)),
                other: cell(&|o| {
                    o.pooled_idle().map_or_else(
                        || "—".to_owned(),
                        |i| format!("{:.1} MiB{}", i.rss_bytes as f64 / MIB, per_round(o, &mib)),
                    )
                }),
                ratio: their_idle
                    .map_or_else(String::new, |t| fmt_share(share(idle.rss_bytes as f64, t.rss_bytes as f64))),
                reference: format!("{:.0} MiB", REF_RSS_BYTES as f64 / MIB),
                look: files(&ours.files.memory),
                ..Row::default()
            },
            &rss_check.into_iter().collect::<Vec<_>>(),
            if measured { format!("≤ {RSS_SHARE}×") } else { format!("≥ {HISTORY_FACTOR:.0}× better") },
        ));
    }

    // Scrapes.
    let pods = ours.pooled_idle().map_or(0, |i| i.pods);
    let scrape_look = if !f.perf {
        vec![profile::PERF_MISSING.to_owned()]
    } else if ours.files.scrape_perf.is_empty() {
        vec!["no profile was written (see the bench's output)".to_owned()]
    } else {
        files(&ours.files.scrape_perf)
    };
    for e in &ours.scrapes {
        let mine = Stats::of(&e.scrapes);
        let find = |o: &AgentFigures| {
            o.scrapes.iter().find(|x| x.endpoint.path == e.endpoint.path).and_then(|x| Stats::of(&x.scrapes))
        };
        let theirs = other.and_then(find);
        let show = |s: Option<&Stats>| {
            s.map_or_else(
                || "—".to_owned(),
                |s| format!("{} / {}", report::fmt_ms(s.wall_p50_ns), report::fmt_ms(s.cpu_mean_ns.round() as u64)),
            )
        };
        let up = e.endpoint.upstream;
        let checks = match (&mine, &theirs, measured) {
            (Some(m), Some(t), _) => vec![
                at_most("wall", ns(m.wall_p50_ns), ns(t.wall_p50_ns), SCRAPE_SHARE),
                at_most("CPU", m.cpu_mean_ns, t.cpu_mean_ns, SCRAPE_SHARE),
            ],
            (Some(m), None, false) => {
                vec![
                    history("wall", ns(m.wall_p50_ns), up.wall_ms * 1e6),
                    history("CPU", m.cpu_mean_ns, up.cpu_ms * 1e6),
                ]
            }
            _ => Vec::new(),
        };
        rows.push(with_verdict(
            Row {
                metric: format!(
                    "scrape {}, {pods} pods, wall p50 / CPU mean⁶ ({} scrapes)",
                    e.endpoint.path,
                    e.scrapes.len()
                ),
                swiftlet: show(mine.as_ref()),
                other: cell(&|o| show(find(o).as_ref())),
                ratio: match (&mine, &theirs) {
                    (Some(m), Some(t)) => format!(
                        "wall {}, CPU {}",
                        fmt_share(share(ns(m.wall_p50_ns), ns(t.wall_p50_ns))),
                        fmt_share(share(m.cpu_mean_ns, t.cpu_mean_ns))
                    ),
                    _ => String::new(),
                },
                reference: format!("{:.0} ms / {:.0} ms", up.wall_ms, up.cpu_ms),
                look: scrape_look.clone(),
                ..Row::default()
            },
            &checks,
            if measured { format!("≤ {SCRAPE_SHARE}× both") } else { format!("≥ {HISTORY_FACTOR:.0}× better") },
        ));
    }

    // API load.
    let idle_api = Window::pool(&ours.api_idle);
    if let Some(w) = &idle_api {
        let theirs = other.and_then(|o| Window::pool(&o.api_idle));
        let checks: Vec<Check> = theirs.iter().map(|t| at_most("", w.agent_share(t), 1.0, API_IDLE_SHARE)).collect();
        rows.push(with_verdict(
            Row {
                metric: format!("API requests at idle, {pods} pods⁸ ({:.0} s)", w.secs),
                swiftlet: format!("{} req/s", apiload::fmt_rate(w.agent_rate())),
                other: cell(&|o| {
                    Window::pool(&o.api_idle)
                        .map_or_else(|| "—".to_owned(), |t| format!("{} req/s", apiload::fmt_rate(t.agent_rate())))
                }),
                ratio: theirs.as_ref().map_or_else(String::new, |t| fmt_share(w.agent_share(t))),
                look: {
                    let mut l = vec!["API requests by verb below".to_owned()];
                    l.extend(logs.iter().cloned());
                    l
                },
                ..Row::default()
            },
            &checks,
            format!("≤ {API_IDLE_SHARE}×"),
        ));
    }
    if let Some(w) = Window::pool(&ours.api_burst) {
        let per_pod = |a: &AgentFigures, w: &Window| {
            let pods = (a.api_burst_pods * a.api_burst.len()) as f64;
            if pods > 0.0 { w.agent / pods } else { 0.0 }
        };
        let show = |a: &AgentFigures, w: &Window| {
            format!("{} req/s, {:.1} per pod", apiload::fmt_rate(w.agent_rate()), per_pod(a, w))
        };
        let theirs = other.and_then(|o| Window::pool(&o.api_burst));
        rows.push(Row {
            metric: format!("API requests in the {}-pod burst⁸", ours.api_burst_pods),
            swiftlet: show(ours, &w),
            other: cell(&|o| Window::pool(&o.api_burst).map_or_else(|| "—".to_owned(), |t| show(o, &t))),
            ratio: match (&theirs, other) {
                (Some(t), Some(o)) => format!(
                    "rate {}, per pod {}",
                    fmt_share(share(w.agent_rate(), t.agent_rate())),
                    fmt_share(share(per_pod(ours, &w), per_pod(o, t)))
                ),
                _ => String::new(),
            },
            ..Row::default()
        });
    }

    // Eviction.
    if let Some(ev) = &ours.eviction {
        let decision = ev.crossed_to_decision();
        let ok = eviction::meets_target(ev).unwrap_or(false);
        rows.push(Row {
            metric: format!("eviction, threshold crossed → decision⁹ ({} runs), p50 / p99", ev.runs.len()),
            swiftlet: p50_p99(decision.as_ref()),
            other: cell(&|_| "not measured⁹".to_owned()),
            reference: "next 10 s pass".to_owned(),
            target: "p99 < 500 ms".to_owned(),
            verdict: if decision.is_some() { format!("{} ({})", mark(ok), ev.triggers()) } else { String::new() },
            ok: decision.is_some().then_some(ok),
            look: vec![report_log("eviction-kernel")],
            ..Row::default()
        });
        rows.push(Row {
            metric: "eviction, threshold crossed → Evicted in the API⁹, p50 / p99".to_owned(),
            swiftlet: p50_p99(ev.crossed_to_evicted_api().as_ref()),
            other: cell(&|_| "not measured⁹".to_owned()),
            ..Row::default()
        });
    }
    rows
}

fn report_log(label: &str) -> String {
    format!("target/bench/{label}-agent.log")
}

/// Which of an agent's API windows.
type WindowsOf = fn(&AgentFigures) -> &[Window];

/// The API requests by verb (estimated, see [`apiload`]): one row per window kind, a
/// column per agent, and the control plane alone.
pub fn verb_rows(f: &Figures) -> Vec<Vec<String>> {
    let baseline = Window::pool(&f.api_baseline);
    let pods = f.swiftlet.pooled_idle().map_or(0, |i| i.pods);
    let agents: Vec<&AgentFigures> = std::iter::once(&f.swiftlet).chain(&f.other).collect();
    let mut out = Vec::new();
    let kinds: [(String, WindowsOf); 2] = [
        (format!("at idle, {pods} pods"), |a| &a.api_idle),
        (format!("in the {}-pod burst", f.swiftlet.api_burst_pods), |a| &a.api_burst),
    ];
    for (what, pick) in kinds {
        let pooled: Vec<Option<Window>> = agents.iter().map(|a| Window::pool(pick(a))).collect();
        let mut verbs = vec![what];
        let mut top = vec!["  the most, by verb and resource".to_owned()];
        for w in &pooled {
            let Some(w) = w else {
                verbs.push("—".to_owned());
                top.push("—".to_owned());
                continue;
            };
            let by_request = w.agent_by_request(baseline.as_ref());
            verbs.push(format!(
                "{} ({} in all)",
                apiload::fmt_verbs(&apiload::by_verb(&by_request)),
                apiload::fmt_rate(w.agent_rate())
            ));
            top.push(apiload::fmt_top(&by_request, 4));
        }
        out.push(verbs);
        out.push(top);
    }
    if let Some(b) = &baseline {
        let rates: BTreeMap<String, f64> = b.others_rate();
        let mut row =
            vec![format!("the control plane alone ({:.0} s)", b.secs), apiload::fmt_verbs(&apiload::by_verb(&rates))];
        row.extend(agents.iter().skip(1).map(|_| "(same)".to_owned()));
        out.push(row);
    }
    out
}

fn header(f: &Figures) -> Vec<String> {
    let mut h = vec![String::new(), "swiftlet".to_owned()];
    match &f.other {
        Some(o) => h.extend([o.label.clone(), format!("swiftlet ÷ {}", o.label), "runtime's floor".to_owned()]),
        None => h.extend(["runtime's floor".to_owned(), "kubelet 1.28 (history)".to_owned()]),
    }
    h.extend(["target".to_owned(), "verdict".to_owned()]);
    h
}

fn cells(f: &Figures, rows: Vec<Row>) -> Vec<Vec<String>> {
    rows.into_iter()
        .map(|r| {
            let mut c = vec![r.metric, r.swiftlet];
            if f.other.is_some() {
                c.extend([r.other, r.ratio, r.floor]);
            } else {
                c.extend([r.floor, r.reference]);
            }
            c.extend([r.target, r.verdict]);
            c
        })
        .collect()
}

pub fn footnotes(f: &Figures) -> Vec<String> {
    let other = f.other.as_ref().map_or("the other agent", |o| o.label.as_str());
    let mut notes = vec![
        format!(
            "{} round(s){}; each agent's figures and the runtime's floor pooled over them (latencies and scrapes \
             together, idle CPU and RSS averaged: per round in brackets).",
            f.rounds,
            if f.other.is_some() {
                format!(", alternating: the runtime's floor, swiftlet, {other}")
            } else {
                ": the runtime's floor, swiftlet".to_owned()
            }
        ),
        "¹ from just before the create request to the test bed's kube-apiserver until the bench's own watch on it \
         shows phase Running (one busybox container, image present)."
            .to_owned(),
        "² RunPodSandbox + CreateContainer + StartContainer of the same pod straight over CRI, no agent running; \
         shaped as a kubelet's (sandbox under the RuntimeDefault seccomp profile, /etc/hosts and the termination \
         log mounted); p50 / p99."
            .to_owned(),
        "³ SIGKILL of a container's init process until the bench's watch shows the container stopped or restarted; \
         kubelet 1.28: kill → pod status updated (bench pleg's reference)."
            .to_owned(),
        "⁴ the agent's pod_status records (CLOCK_MONOTONIC), as bench pleg.".to_owned(),
        format!(
            "⁵ the agent's CPU over the idle window, 10 s after the last burst ran; profiled with perf record --call-graph dwarf -F 99 -p \
             <agent> over the same window{}.",
            if f.perf { "" } else { " (profile not taken: perf missing)" }
        ),
        "⁶ one kept-alive HTTPS connection per endpoint, as bench scrape; the kubelet 1.28 figures are at 100 pods."
            .to_owned(),
        "⁷ the same burst's sandbox + container starts straight over CRI, no agent running: all requested at once, \
         with at most as many RunPodSandbox and as many CreateContainer + StartContainer pairs in flight as the \
         agent's default --runtime-start-concurrency; each pod from the burst's start until its StartContainer \
         returned; p50 / p99. What the runtime alone takes: no agent's burst can end sooner."
            .to_owned(),
        "⁸ kube-apiserver's own /metrics: the agent's requests are those API Priority and Fairness dispatched in \
         the flow schemas system-node-high and system-nodes (apiserver_flowcontrol_dispatched_requests_total; a \
         node's credentials go there and nothing else does: the bench is exempt, the controllers have schemas of \
         their own); exact. By verb and resource (below): apiserver_request_total's delta, less the control \
         plane's own rate of the same verb and resource measured while the runtime's floor ran, less the bench's \
         own requests; an estimate. Watches: those APF started in the same schemas \
         (apiserver_flowcontrol_request_execution_seconds_count, type watch), exact."
            .to_owned(),
        "⁹ bench eviction's kernel-signal mode: the bench's own reading of the pods cgroup crossing the threshold \
         until the agent's EVICTION_DECIDED record; the periodic pass alone (upstream) decides at the next 10 s \
         pass. Another agent is not measured: upstream derives allocatableMemory.available from the node's \
         allocatable, not from the pods cgroup's limit."
            .to_owned(),
        "¹⁰ every process's CPU (/proc/<pid>/stat: its own and its waited-for children's) and the machine's busy \
         time (/proc/stat) from just before the burst's first create request (the floor: its first CRI request) \
         until its last pod was seen Running (the floor: its last StartContainer returned); means over the \
         rounds. The runtime is CPU-bound here: what an agent's burst adds (its own CPU, the control plane's \
         for its requests) comes out of the runtime's share, and is its distance from the floor."
            .to_owned(),
        if f.other.is_some() {
            format!(
                "Verdicts: ratios swiftlet ÷ {other} from this run (below 1: swiftlet takes less) and the runtime's \
                 floor from this run; the kubelet 1.28 figures are history and no longer judged against."
            )
        } else {
            format!(
                "Verdicts: the runtime's floor from this run, and ✓ at ≥ {HISTORY_FACTOR:.0}× better than the \
                 upstream kubelet 1.28's figures (history; with --other-agent the verdicts are ratios from the same \
                 run)."
            )
        },
    ];
    for r in rows(f) {
        if r.ok == Some(false) {
            let look = if r.look.is_empty() { "nothing kept".to_owned() } else { r.look.join(", ") };
            notes.push(format!("✗ {}: look at {look}", r.metric));
        }
    }
    for a in std::iter::once(&f.swiftlet).chain(&f.other) {
        if let Some(why) = &a.failed {
            notes.push(format!("INCOMPLETE: {} stopped early: {why}", a.label));
        }
    }
    notes
}

/// The largest burst whose CPU was split, with the runtime's floor's and each agent's
/// windows of that size.
fn largest_burst_cpu(f: &Figures) -> Option<(usize, Vec<Option<Split>>)> {
    let agents = std::iter::once(&f.swiftlet).chain(&f.other);
    let size = agents.clone().flat_map(|a| a.burst_cpu.iter().map(|(n, _)| *n)).max()?;
    let of_agent = |a: &AgentFigures| {
        let windows: Vec<Split> = a.burst_cpu.iter().filter(|(n, _)| *n == size).map(|(_, s)| *s).collect();
        Split::mean(&windows)
    };
    let floor = f.runtime_burst(size).and_then(|b| Split::mean(&b.cpu));
    Some((size, std::iter::once(floor).chain(agents.map(of_agent)).collect()))
}

/// Where the machine's CPU went in the largest burst: a row per part, a column for the
/// runtime's floor and each agent (means over the rounds).
pub fn cpu_rows(f: &Figures) -> Vec<Vec<String>> {
    let Some((size, cols)) = largest_burst_cpu(f) else { return Vec::new() };
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) as f64;
    let cells = |show: &dyn Fn(&Split) -> String| -> Vec<String> {
        cols.iter().map(|c| c.as_ref().map_or_else(|| "—".to_owned(), show)).collect()
    };
    let secs = |pick: fn(&Split) -> f64| move |s: &Split| format!("{:.2} s", pick(s));
    let mut rows = Vec::new();
    let mut push = |what: &str, cells: Vec<String>| rows.push(std::iter::once(what.to_owned()).chain(cells).collect());
    push(&format!("the burst's wall time, {size}-pod burst"), cells(&|s| format!("{:.1} s", s.wall)));
    push(
        "the machine busy",
        cells(&|s| {
            format!("{:.2} s ({:.0} % of {cores:.0} cores)", s.busy, 100.0 * s.busy / (s.wall * cores).max(1e-9))
        }),
    );
    push("  agent (and its children)", cells(&secs(|s| s.agent)));
    push("  control plane (kube-apiserver, etcd, controller-manager, scheduler)", cells(&secs(|s| s.control_plane)));
    push("  runtime (containerd, shims, runc, CNI plugins)", cells(&secs(|s| s.runtime)));
    push("  the pods' processes (pause, containers)", cells(&secs(|s| s.pods)));
    push("  the bench (its requests and watch; the floor's CRI calls)", cells(&secs(|s| s.bench)));
    push("  other (kernel threads, interrupts, the rest)", cells(&secs(Split::other)));
    push("runtime and pods, per pod", cells(&|s| format!("{:.0} ms", 1000.0 * (s.runtime + s.pods) / size as f64)));
    rows
}

fn cpu_header(f: &Figures) -> Vec<String> {
    let mut h = vec!["CPU-seconds in the burst¹⁰".to_owned(), "runtime's floor".to_owned(), "swiftlet".to_owned()];
    h.extend(f.other.iter().map(|o| o.label.clone()));
    h
}

fn verb_header(f: &Figures) -> Vec<String> {
    let mut h = vec!["API requests/s by verb⁸".to_owned(), "swiftlet".to_owned()];
    h.extend(f.other.iter().map(|o| o.label.clone()));
    h
}

pub fn text(f: &Figures) -> String {
    let h = header(f);
    let h: Vec<&str> = h.iter().map(String::as_str).collect();
    let mut out = report::text_table(&h, &cells(f, rows(f)));
    let verbs = verb_rows(f);
    if verbs.len() > 1 || f.swiftlet.api_idle.len() + f.swiftlet.api_burst.len() > 0 {
        out.push('\n');
        let vh = verb_header(f);
        let vh: Vec<&str> = vh.iter().map(String::as_str).collect();
        out.push_str(&report::text_table(&vh, &verbs));
    }
    let cpu = cpu_rows(f);
    if !cpu.is_empty() {
        out.push('\n');
        let ch = cpu_header(f);
        let ch: Vec<&str> = ch.iter().map(String::as_str).collect();
        out.push_str(&report::text_table(&ch, &cpu));
    }
    out.push('\n');
    for n in footnotes(f) {
        let _ = writeln!(out, "{n}");
    }
    out
}

pub fn markdown(f: &Figures, env: &Environment, args: &AllArgs) -> String {
    let mut out = env.markdown_head("cargo xtask bench", "release build, evented PLEG, kernel eviction signals");
    let _ = writeln!(
        out,
        "- control plane: the test bed's kube-apiserver, controller-manager and scheduler {}",
        crate::upstream::VERSION
    );
    if let Some(o) = &args.other_agent {
        if o == Path::new(UPSTREAM) {
            let _ = writeln!(
                out,
                "- other agent: the upstream kubelet {} (target/upstream/kubelet)",
                crate::upstream::VERSION
            );
        } else {
            let _ = writeln!(out, "- other agent: {}", o.display());
        }
    }
    let _ = writeln!(
        out,
        "- sizes: {} round(s) of {} single-pod runs, bursts {:?}, {} CRI runs, {} kills, {} scrapes per endpoint; {} \
         evictions; idle window {} s\n",
        args.rounds(),
        args.single(),
        args.bursts,
        args.cri_runs,
        args.kills(),
        args.scrapes(),
        args.evictions,
        args.idle_secs
    );
    let h = header(f);
    let h: Vec<&str> = h.iter().map(String::as_str).collect();
    out.push_str(&report::markdown_table(&h, &cells(f, rows(f))));
    out.push('\n');
    let verbs = verb_rows(f);
    if f.swiftlet.api_idle.len() + f.swiftlet.api_burst.len() > 0 {
        let vh = verb_header(f);
        let vh: Vec<&str> = vh.iter().map(String::as_str).collect();
        out.push_str(&report::markdown_table(&vh, &verbs));
        out.push('\n');
    }
    let cpu = cpu_rows(f);
    if !cpu.is_empty() {
        let ch = cpu_header(f);
        let ch: Vec<&str> = ch.iter().map(String::as_str).collect();
        out.push_str(&report::markdown_table(&ch, &cpu));
        out.push('\n');
    }
    for n in footnotes(f) {
        let _ = writeln!(out, "{n}  ");
    }
    // Opened profiles are read with perf report; say how once.
    if f.perf {
        let _ = writeln!(
            out,
            "\nProfiles: `perf report -i target/bench/<file>.perf.data` (call graphs, the agent's process)."
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Instant};

    use super::*;
    use crate::bench::{
        apiload::{Counters, Reading},
        eviction::{ModeResult, RunOutcome},
        records::EvictionDecision,
        scrape::{ENDPOINTS, EndpointFigures, Scrape},
        summary::{Files, RuntimeBurst},
    };

    fn ms(v: u64) -> u64 {
        v * 1_000_000
    }

    /// An API window of `secs` with `agent` node requests and `by_verb` counted in all.
    fn window(secs: u64, agent: f64, by_verb: &[(&str, f64)]) -> Window {
        let t0 = Instant::now();
        let at = |node, verbs: &[(&str, f64)], t| Reading {
            counters: Counters {
                node_requests: node,
                node_watches: 0.0,
                by_request: verbs.iter().map(|(v, n)| ((*v).to_owned(), *n)).collect(),
            },
            at: t,
        };
        let zero: Vec<(&str, f64)> = by_verb.iter().map(|(v, _)| (*v, 0.0)).collect();
        Window::between(&at(0.0, &zero, t0), &at(agent, by_verb, t0 + std::time::Duration::from_secs(secs)), &[])
    }

    /// A burst's CPU split: `wall` s on 2 cores, the runtime busy 8 s and the pods 2 s, the
    /// bench 0.5 s, 1 s of other, and the agent's and the control plane's as given.
    fn cpu(wall: f64, agent: f64, control_plane: f64) -> Split {
        Split {
            wall,
            busy: 8.0 + 2.0 + 0.5 + 1.0 + agent + control_plane,
            agent,
            control_plane,
            runtime: 8.0,
            pods: 2.0,
            bench: 0.5,
        }
    }

    /// swiftlet, and with `other` a kubelet `k` times slower (and costlier) everywhere.
    fn figures(other: Option<u64>) -> Figures {
        let agent = |label: &str, k: u64| AgentFigures {
            label: label.into(),
            rounds: 2,
            single: (1..=20).map(|i| ms(300 + i) * k).collect(),
            bursts: vec![
                (30, (1..=30).map(|i| ms(1000 + 10 * i) * k).collect()),
                (100, (1..=100).map(|i| ms(2000 + 10 * i) * k).collect()),
            ],
            idle: vec![
                Idle { pods: 100, cores: 0.001 * k as f64, rss_bytes: 28 * 1024 * 1024 * k },
                Idle { pods: 100, cores: 0.003 * k as f64, rss_bytes: 30 * 1024 * 1024 * k },
            ],
            scrapes: vec![EndpointFigures {
                endpoint: ENDPOINTS[0],
                scrapes: vec![Scrape {
                    wall_ns: ms(4) * k,
                    cpu_ns: ms(3) * k,
                    runtime_cpu_ns: None,
                    bytes: 10,
                    series: Some(1),
                }],
            }],
            exit_api: (1..=20).map(|i| ms(10 + i) * k * k).collect(),
            exit_agent: if label == "swiftlet" { (1..=20).map(|i| ms(5 + i)).collect() } else { vec![] },
            eviction: None,
            api_idle: vec![window(
                30,
                6.0 * k as f64,
                &[("GET nodes", 2.0 * k as f64), ("GET /metrics", 1.0), ("PUT leases", 30.0)],
            )],
            api_burst: vec![window(10, 100.0 * k as f64, &[("PATCH pods/status", 100.0 * k as f64)])],
            api_burst_pods: 100,
            // The 100-pod burst's CPU in two rounds; the agent's and the control plane's
            // grow with `k`.
            burst_cpu: vec![
                (30, cpu(5.0, 1.0 * k as f64, 2.0)),
                (100, cpu(10.0, 1.0 * k as f64, 2.0 * k as f64)),
                (100, cpu(12.0, 2.0 * k as f64, 2.0 * k as f64)),
            ],
            files: Files {
                logs: vec![PathBuf::from(format!("target/bench/{label}-round1-agent.log"))],
                idle_perf: vec![PathBuf::from(format!("target/bench/{label}-round1-idle.perf.data"))],
                scrape_perf: vec![],
                memory: vec![PathBuf::from(format!("target/bench/{label}-round1.smaps_rollup"))],
            },
            failed: None,
        };
        let mut swiftlet = agent("swiftlet", 1);
        swiftlet.eviction = Some(ModeResult {
            mode: eviction::Mode::Kernel,
            runs: (1..=5)
                .map(|i| RunOutcome {
                    pod: format!("hog-kernel-{i:02}"),
                    crossed_ns: Some(1),
                    decision: Some(EvictionDecision {
                        mono_ns: 1 + ms(20 * i),
                        pass_mono_ns: 1,
                        signal_mono_ns: 1,
                        trigger: "memcg_threshold".into(),
                        uid: "u".into(),
                        eviction_signal: "allocatableMemory.available".into(),
                    }),
                    evicted_api_ns: Some(1 + ms(200 * i)),
                    ..RunOutcome::default()
                })
                .collect(),
            rejections: 0,
        });
        Figures {
            rounds: 2,
            runtime_start: (1..=10).map(|i| ms(270 + i)).collect(),
            runtime_bursts: vec![
                RuntimeBurst {
                    pods: 30,
                    in_flight: 4,
                    latencies: (1..=30).map(|i| ms(1000 + 10 * i)).collect(),
                    cpu: Vec::new(),
                },
                RuntimeBurst {
                    pods: 100,
                    in_flight: 4,
                    latencies: (1..=100).map(|i| ms(25 * i)).collect(),
                    cpu: vec![cpu(9.0, 0.0, 0.5)],
                },
            ],
            // The control plane alone: 1 GET and 1 PUT of leases a second (and the bench's
            // GET /metrics).
            api_baseline: vec![window(60, 0.0, &[("GET leases", 60.0), ("GET /metrics", 1.0), ("PUT leases", 60.0)])],
            perf: true,
            swiftlet,
            other: other.map(|k| agent("kubelet", k)),
        }
    }

    fn row<'a>(rows: &'a [Row], prefix: &str) -> &'a Row {
        rows.iter().find(|r| r.metric.starts_with(prefix)).unwrap_or_else(|| panic!("no row {prefix}: {rows:#?}"))
    }

    #[test]
    fn shares_and_checks() {
        assert!((share(1.0, 4.0) - 0.25).abs() < 1e-12);
        assert!(share(1.0, 0.0).is_infinite());
        assert!(share(0.0, 0.0).abs() < f64::EPSILON);
        assert_eq!(fmt_share(0.354), "0.35×");
        assert_eq!(fmt_share(0.0213), "0.021×");
        assert_eq!(fmt_share(0.00213), "0.0021×");
        assert_eq!(fmt_share(1.25), "1.2×");
        assert_eq!(fmt_share(f64::INFINITY), "∞");
        assert_eq!(at_most("p50", 40.0, 100.0, 0.4), Check { ok: true, text: "p50 0.40×".into() });
        assert!(!at_most("p50", 41.0, 100.0, 0.4).ok);
        assert_eq!(within_margin(ms(335), ms(275)), Check { ok: true, text: "p50 floor + 60.0 ms".into() });
        assert!(!within_margin(ms(336), ms(275)).ok);
        assert_eq!(within_margin(ms(250), ms(275)).text, "p50 floor − 25.0 ms");
        assert_eq!(within_share(ms(1050), ms(1000)), Check { ok: true, text: "p99 floor + 5.0 %".into() });
        assert!(!within_share(ms(1051), ms(1000)).ok);
        assert_eq!(within_share(ms(900), ms(1000)).text, "p99 floor − 10.0 %");
        assert_eq!(verdict_of(&[]), None);
        let (ok, text) = verdict_of(&[at_most("a", 1.0, 10.0, 0.2), at_most("b", 3.0, 10.0, 0.2)]).unwrap();
        assert_eq!((ok, text.as_str()), (false, "✗ a 0.10×, b 0.30×"));
        assert_eq!(history("", 0.0, 0.047).text, "∞ better");
    }

    #[test]
    fn rows_are_ratios_from_the_same_run_with_another_agent() {
        // The kubelet 3× slower and costlier everywhere (exit detection 9×).
        let f = figures(Some(3));
        let rows = rows(&f);
        let single = row(&rows, "single pod");
        assert_eq!(single.swiftlet, "310 ms / 318 ms / 320 ms");
        assert_eq!(single.other, "930 ms / 954 ms / 960 ms");
        assert_eq!(single.ratio, "p50 0.33×, p99 0.33×");
        assert_eq!(single.floor, "275 ms / 280 ms² (10 runs)");
        // p50 310 ms: 0.33× of 930 ms (≤ 0.4×), 35 ms above the floor's 275 ms (≤ 60 ms).
        assert_eq!(single.verdict, "✓ p50 0.33×, p50 floor + 35.0 ms");
        assert_eq!(single.target, "p50 ≤ 0.4×; p50 ≤ floor + 60 ms");
        // The 30-pod burst sits on its floor; the 100-pod one is 0.33× the kubelet's p50
        // but its p99 (2990 ms) is 21 % above the floor's (2475 ms).
        let b30 = row(&rows, "30-pod burst");
        assert_eq!(b30.floor, "1150 ms / 1300 ms⁷ (≤ 4 at a time)");
        assert_eq!((b30.ok, b30.verdict.as_str()), (Some(true), "✓ p50 0.33×, p99 floor + 0.0 %"));
        let b100 = row(&rows, "100-pod burst");
        assert_eq!((b100.ok, b100.verdict.as_str()), (Some(false), "✗ p50 0.33×, p99 floor + 20.8 %"));
        assert_eq!(b100.target, "p50 ≤ 0.5×; p99 ≤ floor + 5 %");
        // Exit detection: 0.11× misses 0.05×.
        let exit = row(&rows, "exit detection, kill → status in the API");
        assert_eq!((exit.ok, exit.verdict.as_str()), (Some(false), "✗ p99 0.11×"));
        // Idle: averaged over the rounds, each round in brackets.
        let idle = row(&rows, "idle agent CPU");
        assert_eq!(idle.swiftlet, "0.0020 cores (0.0010, 0.0030)");
        assert_eq!((idle.ratio.as_str(), idle.ok, idle.target.as_str()), ("0.33×", Some(false), "≤ 0.2×"));
        assert_eq!(idle.look, vec!["target/bench/swiftlet-round1-idle.perf.data".to_owned()]);
        let rss = row(&rows, "agent RSS");
        assert_eq!((rss.swiftlet.as_str(), rss.other.as_str()), ("29.0 MiB (28.0, 30.0)", "87.0 MiB (84.0, 90.0)"));
        assert_eq!((rss.ok, rss.verdict.as_str()), (Some(true), "✓ 0.33×"));
        let scrape = row(&rows, "scrape /metrics,");
        assert_eq!(scrape.ratio, "wall 0.33×, CPU 0.33×");
        assert_eq!((scrape.ok, scrape.verdict.as_str()), (Some(false), "✗ wall 0.33×, CPU 0.33×"));
        // API at idle: 6 against 18 requests in 30 s.
        let api = row(&rows, "API requests at idle");
        assert_eq!((api.swiftlet.as_str(), api.other.as_str()), ("0.200 req/s", "0.600 req/s"));
        assert_eq!((api.ok, api.verdict.as_str()), (Some(true), "✓ 0.33×"));
        let burst_api = row(&rows, "API requests in the 100-pod burst");
        assert_eq!(burst_api.swiftlet, "10.0 req/s, 1.0 per pod");
        assert_eq!((burst_api.ratio.as_str(), burst_api.ok), ("rate 0.33×, per pod 0.33×", None));
        let ev = row(&rows, "eviction, threshold crossed → decision");
        assert_eq!((ev.other.as_str(), ev.ok), ("not measured⁹", Some(true)));
        assert_eq!(row(&rows, "exit detection, kill → pod status computed").other, "—");
        // No row judges against the 1.28 history.
        assert!(rows.iter().all(|r| !r.verdict.contains("better")), "{rows:#?}");
    }

    #[test]
    fn rows_against_the_history_without_another_agent() {
        let f = figures(None);
        let rows = rows(&f);
        let single = &rows[0];
        assert_eq!(single.reference, "680 ms / — / 1200 ms");
        // 680 / 310 = 2.19, 1200 / 320 = 3.75; p50 310 − floor 275 = 35 ms.
        assert_eq!(single.verdict, "✓ p50 2.2× better, p99 3.8× better, p50 floor + 35.0 ms");
        let b100 = row(&rows, "100-pod burst");
        // 15.1 s / 2.99 s = 5.05, but 21 % above its floor.
        assert_eq!(b100.verdict, "✗ p99 5.1× better, p99 floor + 20.8 %");
        assert_eq!(row(&rows, "30-pod burst").reference, "— / — / 4800 ms");
        let idle = row(&rows, "idle agent CPU");
        assert_eq!(idle.verdict, "✓ 23.5× better");
        assert_eq!(row(&rows, "scrape /metrics,").verdict, "✓ wall 45.0× better, CPU 12.3× better");
        let ev = row(&rows, "eviction, threshold crossed → decision");
        assert_eq!((ev.swiftlet.as_str(), ev.verdict.as_str()), ("60.0 ms / 100 ms", "✓ (memcg_threshold ×5)"));
        assert!(rows.iter().all(|r| r.other.is_empty() && r.ratio.is_empty()));
        // The API row has no target without another agent to compare with.
        assert_eq!(row(&rows, "API requests at idle").ok, None);
    }

    #[test]
    fn missed_rows_name_their_profiles() {
        let mut f = figures(Some(3));
        let notes = footnotes(&f);
        let idle = notes.iter().find(|n| n.starts_with("✗ idle agent CPU")).unwrap();
        assert!(idle.ends_with("look at target/bench/swiftlet-round1-idle.perf.data"), "{idle}");
        assert!(notes.iter().any(|n| n.starts_with("✗ 100-pod burst") && n.contains("swiftlet-round1-agent.log")));
        assert!(!notes.iter().any(|n| n.starts_with("✗ agent RSS")));
        // Without perf the row says so.
        f.perf = false;
        f.swiftlet.files.idle_perf.clear();
        let notes = footnotes(&f);
        let idle = notes.iter().find(|n| n.starts_with("✗ idle agent CPU")).unwrap();
        assert!(idle.ends_with("look at profile not taken: perf missing"), "{idle}");
        let scrape = notes.iter().find(|n| n.starts_with("✗ scrape /metrics")).unwrap();
        assert!(scrape.ends_with(profile::PERF_MISSING), "{scrape}");
        // An RSS row that misses names the memory breakdown.
        f.swiftlet.idle[0].rss_bytes *= 10;
        let notes = footnotes(&f);
        let rss = notes.iter().find(|n| n.starts_with("✗ agent RSS")).unwrap();
        assert!(rss.ends_with("target/bench/swiftlet-round1.smaps_rollup"), "{rss}");
    }

    #[test]
    fn api_requests_by_verb_less_the_control_plane_and_the_bench() {
        let f = figures(Some(3));
        let v = verb_rows(&f);
        // swiftlet at idle: 2 GET of its node in 30 s; 30 PUT of leases, all the
        // control plane's (1 a second); the bench's GET /metrics left out. In all 6 in
        // 30 s (APF).
        assert_eq!(v[0], vec!["at idle, 100 pods", "GET 0.067 (0.200 in all)", "GET 0.200 (0.600 in all)"]);
        assert_eq!(v[1], vec!["  the most, by verb and resource", "GET nodes 0.067", "GET nodes 0.200"]);
        assert_eq!(v[2][1], "PATCH 10.0 (10.0 in all)");
        assert_eq!(v[3][2], "PATCH pods/status 30.0");
        assert_eq!(v[4], vec!["the control plane alone (60 s)", "GET 1.00, PUT 1.00", "(same)"]);
    }

    #[test]
    fn the_largest_burst_cpu_by_part_for_the_floor_and_each_agent() {
        let f = figures(Some(3));
        let rows = cpu_rows(&f);
        let row = |prefix: &str| rows.iter().find(|r| r[0].starts_with(prefix)).unwrap().clone();
        // Means of the two 100-pod rounds (the 30-pod burst is not shown); the floor's one.
        assert_eq!(row("the burst's wall time"), ["the burst's wall time, 100-pod burst", "9.0 s", "11.0 s", "11.0 s"]);
        assert_eq!(row("  agent")[1..], ["0.00 s", "1.50 s", "4.50 s"]);
        assert_eq!(row("  control plane")[1..], ["0.50 s", "2.00 s", "6.00 s"]);
        assert_eq!(row("  other")[1..], ["1.00 s", "1.00 s", "1.00 s"]);
        // 12 s busy of 2 × 9 s.
        assert!(row("the machine busy")[1].starts_with("12.00 s (67 % of "), "{:?}", row("the machine busy"));
        // (8 + 2) s over 100 pods.
        assert_eq!(row("runtime and pods, per pod")[1..], ["100 ms", "100 ms", "100 ms"]);
        let t = text(&f);
        assert!(t.contains("CPU-seconds in the burst¹⁰") && t.contains("¹⁰ every process's CPU"), "{t}");
        // Nothing split (an old figures file, a failed run): no table.
        let mut none = figures(None);
        none.swiftlet.burst_cpu.clear();
        assert!(cpu_rows(&none).is_empty());
        assert!(!text(&none).contains("CPU-seconds in the burst"));
    }

    #[test]
    fn the_table_renders_one_column_per_agent() {
        let t = text(&figures(Some(3)));
        let header = t.lines().next().unwrap();
        assert!(
            header.contains("swiftlet") && header.contains("swiftlet ÷ kubelet") && header.contains("runtime's floor"),
            "{header}"
        );
        assert!(!header.contains("1.28"), "{header}");
        assert!(t.contains("API requests/s by verb"));
        assert!(t.contains("Verdicts: ratios swiftlet ÷ kubelet from this run"));
        let alone = text(&figures(None));
        assert!(alone.lines().next().unwrap().contains("kubelet 1.28 (history)"));
        let mut failed = figures(Some(3));
        failed.other.as_mut().unwrap().failed = Some("no node".into());
        let args = AllArgs { other_agent: Some("upstream".into()), ..AllArgs::default() };
        let md = markdown(&failed, &Environment::default(), &args);
        assert!(md.starts_with("# `cargo xtask bench`\n"));
        assert!(md.contains("- sizes: 2 round(s) of 10 single-pod runs"), "{md}");
        assert!(
            md.contains(
                "| | swiftlet | kubelet | swiftlet ÷ kubelet | runtime's floor | target | verdict |\n\
                 |---|---:|---:|---:|---:|---:|---:|\n"
            ),
            "{md}"
        );
        assert!(md.contains("INCOMPLETE: kubelet stopped early: no node"));
    }
}
