//! `cargo xtask bench density`: one node as its pod count grows (`--pods 250,500`, maxPods
//! raised to match): at each count the agent's idle CPU and RSS, the exit of a container
//! seen in the API (kill → pod status on the bench's watch, the PLEG's latency as a user
//! sees it), the agent's API requests a second at idle (its status writes, which should
//! not grow with the pods when nothing changes), the cost of a scrape of each endpoint,
//! and the start-up of the pods added to reach the count — with `--other-agent` (the
//! upstream kubelet) beside it, one agent after the other. The figures go to
//! `target/bench/density.md`, one SVG plot per curve beside it (`density-*.svg`).
//!
//! The agent is a [`BenchAgent`] joined to the test bed's control plane ([`Cluster`]) on
//! the test bed's containerd, as the summary's; the pods are API pods bound to its node,
//! one busybox container each, added in steps (the pods of one count stay for the next).
//! The idle window counts the agent's requests exactly (the node flow schemas, see
//! [`apiload`]: one agent at a time); the exit latency kills `--kills` containers of
//! different pods, one every 1.5 s, with SIGKILL from the host.
//!
//! At 250 and 500 pods a run takes the machine for 15–25 minutes (start-up alone: 78 s for
//! 250 and 245 s for 500 pods here, ENVIRONMENT.md); validate it at small counts
//! (`--pods 20,40`).

use std::{collections::BTreeSet, fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    Ctx,
    bench::{
        BedArgs,
        agent::{BenchAgent, PlegMode},
        apiload::{self, Window},
        apiserver::ApiServer,
        cluster::Cluster,
        latency::{self, Kill, Summary},
        pleg, procfs,
        profile::{self, Perf},
        records::RecordStream,
        report, scrape,
        svg::{self, Series},
        watch,
    },
    testbed::Layout,
};

#[derive(Debug, Clone, clap::Args)]
pub struct DensityArgs {
    #[command(flatten)]
    pub bed: BedArgs,
    /// Pod counts, ascending (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "250,500")]
    pub pods: Vec<usize>,
    /// Containers killed at each count (in different pods) for the exit latency.
    #[arg(long, default_value_t = 20)]
    pub kills: usize,
    /// Length of the idle window at each count.
    #[arg(long, default_value_t = 30)]
    pub idle_secs: u64,
    /// Scrapes of each endpoint at each count.
    #[arg(long, default_value_t = 3)]
    pub scrapes: usize,
    /// Another agent measured the same way after swiftlet (`upstream`: the upstream
    /// kubelet of `target/upstream/`, or a path).
    #[arg(long)]
    pub other_agent: Option<std::path::PathBuf>,
    /// Profile each agent over each idle window (`perf record`, when perf is installed)
    /// and keep its memory breakdown (`smaps_rollup`, `status`), in `target/bench/` as
    /// `density-<agent>-<pods>-idle.*`. perf's sampling costs the agent some CPU: a
    /// profiled run's idle figure reads a little high.
    #[arg(long)]
    pub profile: bool,
}

/// What one agent measured at one pod count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point {
    pub pods: usize,
    /// Start-up (create → Running on the watch) of the pods added for this count.
    pub startup: Option<Summary>,
    pub idle_cores: f64,
    pub rss_bytes: u64,
    /// The agent's API requests a second at idle (exact).
    pub idle_requests: f64,
    /// Its `PATCH pods/status` a second at idle (estimated against the baseline).
    pub idle_status_writes: f64,
    /// Kill → the container's exit in the pod's status on the watch.
    pub exit_to_api: Option<Summary>,
    /// Kill → the pod status that shows the exit, computed in the agent (swiftlet's
    /// records): the API's share of a slow kill is the difference.
    pub exit_in_agent: Option<Summary>,
    /// Median agent CPU per scrape (ms) by endpoint path.
    pub scrape_cpu_ms: Vec<(String, f64)>,
    /// swiftlet's mean status change → the API server's answer to its write, over the
    /// status writes of the kill phase (`kubelet_pod_status_sync_duration_seconds`): the
    /// API side of a kill is this and the watch's delivery. Not the upstream kubelet's:
    /// its figure runs from each pod's first status.
    pub status_write_ms: Option<f64>,
}

/// One agent's curve.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Curve {
    pub label: String,
    pub points: Vec<Point>,
}

pub async fn run(ctx: &Ctx, layout: &Layout, args: &DensityArgs) -> Result<()> {
    ensure!(!args.pods.is_empty(), "--pods: give at least one count");
    ensure!(args.pods.windows(2).all(|w| w[0] < w[1]), "--pods {:?}: counts must ascend", args.pods);
    ensure!(args.kills <= args.pods[0], "--kills {} is more than the first count {}", args.kills, args.pods[0]);
    let most = *args.pods.last().context("no counts")?;
    let room = pod_addresses(crate::containerd::POD_SUBNET).context("the test bed's pod subnet")?;
    ensure!(
        most <= room,
        "--pods {most}: the test bed's pod network {} (host-local IPAM, the bridge's gateway \
         included) has addresses for {room} pods; a count above that needs a wider pod subnet \
         (`containerd::POD_SUBNET`)",
        crate::containerd::POD_SUBNET
    );
    let leave_bed_up = super::bed_was_up(layout) || args.bed.keep_testbed;
    super::bed_up(ctx, layout, &["curl"]).await?;
    let api = ApiServer::up(ctx, layout)?;
    let (binary, mut cri, env) = super::agent_and_runtime(ctx, layout, args.bed.swiftlet_bin.as_deref()).await?;
    let mut agents = vec![("swiftlet".to_owned(), binary, true)];
    if let Some(other) = &args.other_agent {
        agents.push(("kubelet".to_owned(), super::summary::other_agent(ctx, other)?, false));
    }
    let mut curves = Vec::new();
    let mut slot: Option<Cluster> = None;
    let mut outcome = Ok(());
    let dir = pleg::bench_dir(ctx);
    for (label, binary, swiftlet) in &agents {
        let mut curve = Curve { label: label.clone(), points: Vec::new() };
        let r = {
            let bench = curve_of(layout, args, &api, (label, &dir), binary, *swiftlet, &mut slot, &mut curve);
            let mut bench = std::pin::pin!(bench);
            super::until_interrupted(bench.as_mut(), "removing the pods, stopping the agent").await
        };
        let cleanup = match slot.take() {
            Some(mut c) => c.end(layout, &dir.join(format!("density-{label}.log"))).await,
            None => Ok(()),
        };
        curves.push(curve);
        if let Err(e) = r.and(super::said(cleanup)) {
            outcome = Err(e);
            break;
        }
    }
    let _ = super::agent::remove_bench_sandboxes(&mut cri).await;
    let published = publish(ctx, &env, args, &curves, outcome.is_err());
    super::finish(ctx, layout, leave_bed_up, outcome, Ok(()), published).await
}

/// One agent from the first count to the last.
#[expect(clippy::too_many_arguments, reason = "one agent's run, its slot filled for the caller's clean-up")]
async fn curve_of(
    layout: &Layout,
    args: &DensityArgs,
    api: &ApiServer,
    (label, bench_dir): (&str, &Path),
    binary: &Path,
    swiftlet: bool,
    slot: &mut Option<Cluster>,
    curve: &mut Curve,
) -> Result<()> {
    let most = *args.pods.last().context("no counts")?;
    let mut agent = BenchAgent::named(label, PlegMode::Evented, binary, &layout.endpoint(), most + 10)?
        .with_config("evictionHard:\n  memory.available: 100Mi\nfailSwapOn: false\n")
        .with_cluster_dns()
        // The upstream kubelet removes stopped sandboxes in its garbage collection, minutes
        // later: what is left after a minute is removed through CRI.
        .with_drain_timeout(Duration::from_mins(1));
    if !swiftlet {
        agent = agent.other_agent();
    }
    let mut metrics = api.client();
    // The control plane alone (the agent's status writes are estimated against it).
    let before = apiload::read(&mut metrics).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let baseline = Window::between(&before, &apiload::read(&mut metrics).await?, &[]);
    let c = slot.insert(Cluster::prepare(api, agent)?);
    c.start().await?;
    let mut cri = crate::cri::CriClient::connect(&layout.socket()).await?;
    let mut names: Vec<String> = Vec::new();
    for &count in &args.pods {
        eprintln!("bench: {label}: adding {} pods to reach {count}", count - names.len());
        let new: Vec<String> = (names.len()..count).map(|i| format!("dense-{i:04}")).collect();
        let pods: Vec<_> = new.iter().map(|n| c.pod(n, pleg::SLEEPER, false)).collect();
        let sent = c.create_pods(&pods).await?;
        let timeout =
            Duration::from_mins(2) + Duration::from_millis(800) * u32::try_from(new.len()).unwrap_or(u32::MAX);
        let running = c.wait_running(&new, &sent, timeout).await?;
        let startup = Summary::of(running.iter().zip(&sent).map(|(r, s)| r.saturating_sub(*s)));
        names.extend(new);
        tokio::time::sleep(Duration::from_secs(10)).await;

        // Idle.
        let pid = c.agent.pid().context("agent pid")?;
        let cpu0 = procfs::cpu_seconds(pid)?;
        let r0 = apiload::read(&mut metrics).await?;
        let stem = format!("density-{label}-{count}-idle");
        let perf = if args.profile { Perf::start(pid, &bench_dir.join(format!("{stem}.perf.data"))) } else { None };
        let t0 = std::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
        let cpu1 = procfs::cpu_seconds(pid)?;
        if let Some(perf) = perf
            && let Some(path) = perf.finish().await
        {
            eprintln!("bench: {label} at {count} pods: CPU profile of the idle window in {}", path.display());
        }
        if args.profile {
            let files = profile::memory_breakdown(pid, bench_dir, &stem)?;
            eprintln!("bench: {label} at {count} pods: memory breakdown in {}", files[0].display());
        }
        let secs = t0.elapsed().as_secs_f64();
        let window = Window::between(&r0, &apiload::read(&mut metrics).await?, &[]);
        let (rss, _) = procfs::memory(pid)?;
        let status_writes = window.agent_by_request(Some(&baseline)).get("PATCH pods/status").copied().unwrap_or(0.0);

        // Scrapes.
        let mut scrape_cpu_ms = Vec::new();
        for endpoint in &scrape::ENDPOINTS {
            let s = scrape::scrape_endpoint(&mut c.agent, None, endpoint, args.scrapes).await?;
            let mut cpu: Vec<u64> = s.iter().map(|s| s.cpu_ns).collect();
            cpu.sort_unstable();
            let median = cpu.get(cpu.len() / 2).copied().unwrap_or(0);
            scrape_cpu_ms.push((endpoint.path.to_owned(), median as f64 / 1e6));
        }

        // Exits.
        let synced_before = if swiftlet { status_syncs(&c.agent.metrics_text().await?) } else { None };
        let (exits, in_agent) = kill_and_watch(c, &mut cri, &names, args.kills).await?;
        let synced_after = if swiftlet { status_syncs(&c.agent.metrics_text().await?) } else { None };
        let status_write_ms = synced_before
            .zip(synced_after)
            .and_then(|((s0, n0), (s1, n1))| (n1 > n0).then(|| (s1 - s0) / (n1 - n0) * 1e3));
        if let Some(ms) = status_write_ms {
            eprintln!(
                "bench: {label} at {count} pods: status change → API write, mean over the kill phase: {ms:.1} ms"
            );
        }
        let point = Point {
            pods: count,
            startup,
            idle_cores: (cpu1 - cpu0) / secs,
            rss_bytes: rss,
            idle_requests: window.agent_rate(),
            idle_status_writes: status_writes,
            exit_to_api: Summary::of(exits),
            exit_in_agent: Summary::of(in_agent),
            scrape_cpu_ms,
            status_write_ms,
        };
        eprintln!(
            "bench: {label} at {count} pods: idle {:.4} cores, RSS {:.0} MiB, {} req/s, kill → API p99 {}",
            point.idle_cores,
            point.rss_bytes as f64 / 1_048_576.0,
            apiload::fmt_rate(point.idle_requests),
            point.exit_to_api.map_or("—".to_owned(), |s| report::fmt_ms(s.p99))
        );
        curve.points.push(point);
    }
    Ok(())
}

/// `kubelet_pod_status_sync_duration_seconds`' sum (seconds) and count in a `/metrics` text.
fn status_syncs(text: &str) -> Option<(f64, f64)> {
    let sample = |name| apiload::samples(text, name).next().map(|s| s.value);
    Some((
        sample("kubelet_pod_status_sync_duration_seconds_sum")?,
        sample("kubelet_pod_status_sync_duration_seconds_count")?,
    ))
}

/// The pause before each kill.
const KILL_SPACING: Duration = Duration::from_millis(1500);

/// A kill whose agent side, or whose API side, took longer than this is said on stderr.
const API_SHARE_NOTED: u64 = 30_000_000;

/// Kills container `c0` of `kills` different pods, each [`KILL_SPACING`] after the previous
/// one showed in the API (the first as long after the scrapes and the bench's reads);
/// returns kill → the exit on the bench's watch for each and, from swiftlet's records,
/// kill → the pod status computed in the agent (each kill whose API latency is above the
/// agent's by more than [`API_SHARE_NOTED`], or whose agent latency is above it, is said
/// on stderr, split), then waits until every killed pod runs again.
async fn kill_and_watch(
    c: &mut Cluster,
    cri: &mut crate::cri::CriClient,
    names: &[String],
    kills: usize,
) -> Result<(Vec<u64>, Vec<u64>)> {
    let step = (names.len() / kills.max(1)).max(1);
    let chosen: Vec<&String> = names.iter().step_by(step).take(kills).collect();
    let views = c.agent.pods().await?;
    let stream = match c.agent.event_socket() {
        Some(socket) => Some(RecordStream::connect(&socket).await?),
        None => None,
    };
    let mut done = Vec::new();
    let mut killed = BTreeSet::new();
    for name in chosen {
        let Some(view) = views.iter().find(|p| &p.name == name) else { bail!("pod {name} is not in /pods") };
        let Some(container) = view.containers.iter().find(|c| c.name == "c0" && c.running) else {
            bail!("pod {name}: c0 does not run")
        };
        let id = container.id.clone().context("c0 without id")?;
        let status = cri.container_status_verbose(&id).await?;
        let pid = pleg::pid_from_info(&status.info).context("no pid in the container's status")?;
        ensure!(procfs::in_container(pid, &id), "pid {pid} is no longer container {id}'s");
        // Each kill on a quiet node: the one before it done, and the first not on the heels
        // of the scrapes and of this bench's own reads (the agent's /pods of every pod, its
        // record stream just opened), whose work would be counted in its latency.
        tokio::time::sleep(KILL_SPACING).await;
        let at = procfs::monotonic_ns();
        pleg::sig_kill(pid)?;
        killed.insert(name.clone());
        let kill = Kill {
            pod_uid: view.uid.clone(),
            container: "c0".into(),
            container_id: id.clone(),
            restarts_before: container.restarts,
            t_kill_ns: at,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen = c.watch()?.with_events(|ev| watch::exit_seen_at(ev, name, "c0", container.restarts, at))?;
            if let Some(seen) = seen {
                done.push((name.clone(), kill, seen.saturating_sub(at)));
                break;
            }
            ensure!(std::time::Instant::now() < deadline, "the kill of {name}'s c0 did not show in the API in 30 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut in_agent = Vec::new();
    if let Some(stream) = stream {
        let records = stream.all()?;
        for (name, kill, api) in &done {
            let o = latency::outcome(kill, &records);
            let Some(status) = o.kill_to_status_ns else {
                eprintln!("bench: kill of {name}/c0: no pod status showing it in the agent's records");
                continue;
            };
            in_agent.push(status);
            if status > API_SHARE_NOTED || api.saturating_sub(status) > API_SHARE_NOTED {
                eprintln!(
                    "bench: kill of {name}/c0: → pod worker {}, → pod status in the agent {}, → API {}",
                    o.kill_to_worker_ns.map_or("—".to_owned(), report::fmt_ms),
                    report::fmt_ms(status),
                    report::fmt_ms(*api)
                );
            }
        }
    }
    // Every killed pod runs again (restartPolicy Always) before the next count.
    let deadline = std::time::Instant::now() + Duration::from_mins(3);
    loop {
        let views = c.agent.pods().await?;
        let down = views.iter().filter(|p| killed.contains(&p.name) && p.running_containers() == 0).count();
        if down == 0 {
            return Ok((done.into_iter().map(|(_, _, api)| api).collect(), in_agent));
        }
        ensure!(std::time::Instant::now() < deadline, "{down} killed pods did not run again within 3 min");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// ---------------------------------------------------------------------------------------
// The report.

/// The plots: (file stem, title, y label, value of a point).
type Metric = (&'static str, &'static str, &'static str, fn(&Point) -> Option<f64>);

const METRICS: [Metric; 6] = [
    ("idle-cpu", "Agent CPU at idle", "cores", |p| Some(p.idle_cores)),
    ("rss", "Agent RSS", "MiB", |p| Some(p.rss_bytes as f64 / 1_048_576.0)),
    ("exit-to-api", "Container kill → pod status in the API, p99", "ms", |p| {
        p.exit_to_api.map(|s| s.p99 as f64 / 1e6)
    }),
    ("startup", "Pod start-up (create → Running), p99", "ms", |p| p.startup.map(|s| s.p99 as f64 / 1e6)),
    ("api-idle", "Agent API requests at idle", "requests/s", |p| Some(p.idle_requests)),
    ("scrape-cadvisor", "Agent CPU per /metrics/cadvisor scrape", "ms", |p| {
        p.scrape_cpu_ms.iter().find(|(e, _)| e == "/metrics/cadvisor").map(|(_, v)| *v)
    }),
];

/// The SVG plots (file name, document) of `curves`.
pub fn plots(curves: &[Curve]) -> Vec<(String, String)> {
    METRICS
        .iter()
        .map(|(stem, title, unit, value)| {
            let series: Vec<Series> = curves
                .iter()
                .map(|c| Series {
                    name: c.label.clone(),
                    points: c.points.iter().filter_map(|p| Some((p.pods as f64, value(p)?))).collect(),
                })
                .collect();
            (format!("density-{stem}.svg"), svg::line_chart(title, "pods on the node", unit, &series))
        })
        .collect()
}

/// The figures as a table: one row per agent and count.
pub fn table(curves: &[Curve]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "agent",
        "pods",
        "idle CPU (cores)",
        "RSS",
        "kill → API p50 / p99",
        "kill → status in the agent p50 / p99",
        "status change → API write, mean",
        "start-up p50 / p99",
        "API req/s idle",
        "PATCH pods/status /s (est.)",
        "CPU per scrape (ms): metrics / cadvisor / resource / summary",
    ];
    let ms = |s: Option<Summary>| {
        s.map_or("—".to_owned(), |s| format!("{} / {}", report::fmt_ms(s.p50), report::fmt_ms(s.p99)))
    };
    let rows = curves
        .iter()
        .flat_map(|c| {
            c.points.iter().map(|p| {
                vec![
                    c.label.clone(),
                    p.pods.to_string(),
                    format!("{:.4}", p.idle_cores),
                    format!("{:.1} MiB", p.rss_bytes as f64 / 1_048_576.0),
                    ms(p.exit_to_api),
                    ms(p.exit_in_agent),
                    p.status_write_ms.map_or("—".to_owned(), |v| report::fmt_ms((v * 1e6) as u64)),
                    ms(p.startup),
                    apiload::fmt_rate(p.idle_requests),
                    apiload::fmt_rate(p.idle_status_writes),
                    p.scrape_cpu_ms.iter().map(|(_, v)| report::three_digits(*v)).collect::<Vec<_>>().join(" / "),
                ]
            })
        })
        .collect();
    (header, rows)
}

fn publish(ctx: &Ctx, env: &report::Environment, args: &DensityArgs, curves: &[Curve], incomplete: bool) -> Result<()> {
    let dir = pleg::bench_dir(ctx);
    fs::create_dir_all(&dir)?;
    let (header, rows) = table(curves);
    let mut md = env.markdown_head(
        "cargo xtask bench density",
        &format!("release; pods {:?}, {} kills, {} s idle", args.pods, args.kills, args.idle_secs),
    );
    md.push('\n');
    md.push_str(&report::markdown_table(&header, &rows));
    md.push('\n');
    for (file, svg) in plots(curves) {
        fs::write(dir.join(&file), svg).with_context(|| format!("writing {file}"))?;
        let _ = writeln!(md, "![{file}]({file})");
    }
    report::publish(
        ctx,
        "density.md",
        "swiftlet density bench",
        env,
        md,
        &report::text_table(&header, &rows),
        incomplete.then_some("pod count"),
    )
}

/// How many pods a host-local IPAM range of `subnet` (`a.b.c.d/p`) gives addresses to: all
/// of it but the network and broadcast addresses and the bridge's gateway.
fn pod_addresses(subnet: &str) -> Option<usize> {
    let prefix: u32 = subnet.split_once('/')?.1.parse().ok()?;
    let size = 1usize.checked_shl(32u32.checked_sub(prefix)?)?;
    size.checked_sub(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_24_holds_253_pods() {
        assert_eq!(pod_addresses("10.217.0.0/24"), Some(253));
        assert_eq!(pod_addresses("10.217.0.0/22"), Some(1021));
        assert_eq!(pod_addresses("10.217.0.0"), None);
    }

    fn point(pods: usize, cores: f64) -> Point {
        Point {
            pods,
            startup: Summary::of([1_000_000, 3_000_000]),
            idle_cores: cores,
            rss_bytes: 30 * 1_048_576,
            idle_requests: 0.2,
            idle_status_writes: 0.0,
            exit_to_api: None,
            exit_in_agent: None,
            scrape_cpu_ms: vec![("/metrics/cadvisor".into(), 2.5)],
            status_write_ms: None,
        }
    }

    #[test]
    fn status_syncs_are_read_from_the_metrics_text() {
        let text = "# TYPE kubelet_pod_status_sync_duration_seconds histogram\n\
                    kubelet_pod_status_sync_duration_seconds_bucket{le=\"0.01\"} 3\n\
                    kubelet_pod_status_sync_duration_seconds_sum 0.25\n\
                    kubelet_pod_status_sync_duration_seconds_count 10\n";
        assert_eq!(status_syncs(text), Some((0.25, 10.0)));
        assert_eq!(status_syncs("kubelet_pod_status_sync_duration_seconds_sum 1\n"), None);
    }

    #[test]
    fn each_metric_gets_a_plot_with_a_series_per_agent() {
        let curves = [
            Curve { label: "swiftlet".into(), points: vec![point(20, 0.01), point(40, 0.02)] },
            Curve { label: "kubelet".into(), points: vec![point(20, 0.05)] },
        ];
        let plots = plots(&curves);
        assert_eq!(plots.len(), METRICS.len());
        let (name, cpu) = &plots[0];
        assert_eq!(name, "density-idle-cpu.svg");
        assert_eq!(cpu.matches("<polyline").count(), 2);
        assert_eq!(cpu.matches("<circle").count(), 3);
        // No exit figures: the series are empty, the chart is still drawn.
        assert_eq!(plots[2].1.matches("<circle").count(), 0);
        let (header, rows) = table(&curves);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].len(), header.len());
        assert_eq!(rows[1][..3], ["swiftlet".to_owned(), "40".to_owned(), "0.0200".to_owned()]);
        assert_eq!(rows[2][4], "—");
    }
}
