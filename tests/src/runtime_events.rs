//! What the runtime's own event stream (CRI `GetContainerEvents`, containerd 2.x) adds to
//! the kernel's events, measured on a standalone agent: containers killed from the host
//! (SIGKILL to their init), first one at a time, then all at once, and for each phase
//! what the agent counted and timed (`/metrics`):
//!
//! - `kubelet_evented_pleg_runtime_events_total{kind="stopped",first}`: which source told
//!   each stop first: the kernel, the runtime (a change the kernel path missed), or none
//!   (no news);
//! - `kubelet_evented_pleg_runtime_event_lag_seconds{kind}`: how long after the kernel the
//!   runtime's event came, for the changes the kernel told first;
//! - `kubelet_evented_pleg_event_latency_seconds`: the kernel's exit to the pod worker, for
//!   comparison.
//!
//! Run in the node container on containerd 2.x (`SWIFTLET_E2E_NODE=containerd2`) it is
//! `cargo xtask bench runtime-events` (full size) and an end-to-end test of `NODE_SUITE`
//! (small). On a runtime without the stream (containerd 1.6) the same run checks that
//! the agent counted no runtime event.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

use crate::pods::{BUSYBOX, SERVE, container};
use crate::{Agent, AgentOptions, Cri, cri_endpoint};

/// The size of a run: `pods` pods of `containers` containers, killed one at a time with
/// `pause` between kills, then all at once.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub pods: usize,
    pub containers: usize,
    pub pause: Duration,
}

impl Plan {
    /// The end-to-end test's: 6 containers.
    pub const CI: Self = Self { pods: 2, containers: 3, pause: Duration::from_millis(100) };
    /// `cargo xtask bench runtime-events`: 100 containers.
    pub const FULL: Self = Self { pods: 10, containers: 10, pause: Duration::from_millis(200) };
}

/// A histogram's cumulative buckets (`le` → count) as `/metrics` shows them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets(pub Vec<(f64, f64)>);

impl Buckets {
    /// The buckets of `family` whose labels are exactly `labels` (plus `le`) in `text`.
    #[must_use]
    pub fn parse(text: &str, family: &str, labels: &str) -> Self {
        let prefix = format!("{family}_bucket{{");
        let mut out = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else { continue };
            let Some((set, value)) = rest.split_once("} ") else { continue };
            let mut le = None;
            let mut others = Vec::new();
            for l in set.split(',') {
                match l.strip_prefix("le=") {
                    Some(v) => le = Some(v.trim_matches('"')),
                    None => others.push(l),
                }
            }
            if others.join(",") != labels {
                continue;
            }
            let (Some(le), Ok(count)) = (le, value.trim().parse::<f64>()) else { continue };
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
            out.push((le, count));
        }
        Self(out)
    }

    /// `self - earlier`, bucket by bucket (what was observed in between).
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        let before: BTreeMap<u64, f64> = earlier.0.iter().map(|(le, c)| (le.to_bits(), *c)).collect();
        Self(self.0.iter().map(|(le, c)| (*le, c - before.get(&le.to_bits()).copied().unwrap_or(0.0))).collect())
    }

    /// The observations.
    #[must_use]
    pub fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |(_, c)| *c)
    }

    /// The upper bound of the bucket holding quantile `q` (`None` without observations).
    #[must_use]
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        self.0.iter().find(|(_, c)| *c >= q * total).map(|(le, _)| *le)
    }
}

/// One phase's figures.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub name: &'static str,
    pub kills: usize,
    /// `kubelet_evented_pleg_runtime_events_total{kind="stopped"}` by `first`, in the phase.
    pub stopped_first: BTreeMap<String, f64>,
    /// The runtime's stop events' lag behind the kernel, in the phase.
    pub stop_lag: Buckets,
    /// Kernel exit → pod worker, in the phase.
    pub kernel_to_worker: Buckets,
    pub wall: Duration,
}

/// What a run found.
#[derive(Clone, Debug)]
pub struct Report {
    pub runtime: String,
    /// Whether the runtime serves `GetContainerEvents`.
    pub stream: bool,
    pub phases: Vec<Phase>,
}

/// A bucket bound in milliseconds, as a table shows it.
fn ms(bound: Option<f64>) -> String {
    match bound {
        None => "—".into(),
        Some(b) if b.is_infinite() => "> 13 s".into(),
        Some(b) => format!("≤ {:.1} ms", b * 1e3),
    }
}

impl Report {
    /// The figures as a Markdown table.
    #[must_use]
    pub fn table(&self) -> String {
        let mut out = format!(
            "runtime {} ({})\n\n| phase | kills | runtime's stop events: kernel first / runtime first / no news | runtime's lag behind the kernel p50 / p99 | kernel exit → pod worker p50 / p99 |\n|---|---|---|---|---|\n",
            self.runtime,
            if self.stream { "GetContainerEvents served" } else { "no GetContainerEvents" }
        );
        for p in &self.phases {
            let first = |k: &str| p.stopped_first.get(k).copied().unwrap_or(0.0);
            let _ = writeln!(
                out,
                "| {} | {} | {} / {} / {} | {} / {} | {} / {} |",
                p.name,
                p.kills,
                first("kernel"),
                first("runtime"),
                first("none"),
                ms(p.stop_lag.quantile_bound(0.5)),
                ms(p.stop_lag.quantile_bound(0.99)),
                ms(p.kernel_to_worker.quantile_bound(0.5)),
                ms(p.kernel_to_worker.quantile_bound(0.99)),
            );
        }
        out
    }

    /// What must hold: with the stream, every kill's stop reached the agent from the
    /// runtime too, each told first by one source, and every stop the kernel told first
    /// timed; without it, no runtime event counted.
    pub fn check(&self) -> Result<()> {
        for p in &self.phases {
            let first = |k: &str| p.stopped_first.get(k).copied().unwrap_or(0.0);
            if self.stream {
                let told = first("kernel") + first("runtime");
                ensure!(told >= p.kills as f64, "{}: {told} stops told first for {} kills", p.name, p.kills);
                ensure!(
                    (p.stop_lag.count() - first("kernel")).abs() < 0.5,
                    "{}: {} lags timed for {} stops the kernel told first",
                    p.name,
                    p.stop_lag.count(),
                    first("kernel")
                );
            } else {
                ensure!(
                    p.stopped_first.values().all(|v| *v == 0.0),
                    "{}: runtime events counted without a stream",
                    p.name
                );
            }
            ensure!(p.kernel_to_worker.count() >= p.kills as f64, "{}: the kernel path missed exits", p.name);
        }
        Ok(())
    }
}

/// The agent's counters and histograms this measures, at one moment.
struct Snapshot {
    stopped_first: BTreeMap<String, f64>,
    stop_lag: Buckets,
    kernel_to_worker: Buckets,
}

async fn snapshot(agent: &Agent) -> Result<Snapshot> {
    let text = agent.metrics_text().await?;
    let mut stopped_first = BTreeMap::new();
    for first in ["kernel", "runtime", "none"] {
        let series = format!("kubelet_evented_pleg_runtime_events_total{{kind=\"stopped\",first=\"{first}\"}} ");
        let v = text.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok()).unwrap_or(0.0);
        stopped_first.insert(first.to_owned(), v);
    }
    Ok(Snapshot {
        stopped_first,
        stop_lag: Buckets::parse(&text, "kubelet_evented_pleg_runtime_event_lag_seconds", "kind=\"stopped\""),
        kernel_to_worker: Buckets::parse(&text, "kubelet_evented_pleg_event_latency_seconds", ""),
    })
}

/// Whether the runtime serves `GetContainerEvents`: containerd 1.7 and later.
async fn serves_events(cri: &Cri) -> Result<(String, bool)> {
    let v = cri.version().await?;
    Ok((format!("{} {}", v.runtime_name, v.runtime_version), cri.runtime_release().await? >= (1, 7)))
}

/// The pod manifest: `containers` sleeping busybox containers `c0`, `c1`, ...
fn manifest(name: &str, containers: usize) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n"
    );
    for i in 0..containers {
        let _ = write!(
            out,
            "  - name: c{i}\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"{SERVE}\"]\n"
        );
    }
    out
}

/// The pods' containers as `(pod, container, runtime id, restart count)`.
fn containers_of(pods: &[Value], plan: Plan) -> Result<Vec<(String, String, String, i64)>> {
    let mut out = Vec::new();
    for p in pods {
        let pod = p["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        for i in 0..plan.containers {
            let name = format!("c{i}");
            let c = container(p, &name);
            let id = c["containerID"].as_str().context("no containerID")?.trim_start_matches("containerd://");
            out.push((pod.clone(), name, id.to_owned(), c["restartCount"].as_i64().unwrap_or(0)));
        }
    }
    Ok(out)
}

/// The run's pods, each once every container runs (restarted at least `restarts` times).
async fn wait_all(agent: &Agent, plan: Plan, restarts: &BTreeMap<(String, String), i64>) -> Result<Vec<Value>> {
    let mut pods = Vec::new();
    for i in 0..plan.pods {
        let name = format!("rtev-{i}");
        let p = agent
            .wait_pod(&name, Duration::from_mins(2), |p| {
                (0..plan.containers).all(|c| {
                    let s = container(p, &format!("c{c}"));
                    let want = restarts.get(&(name.clone(), format!("c{c}"))).copied().unwrap_or(0);
                    !s["state"]["running"].is_null() && s["restartCount"].as_i64().unwrap_or(0) >= want
                })
            })
            .await?;
        pods.push(p);
    }
    Ok(pods)
}

/// Kills `targets` (runtime ids) from the host, `pause` apart (none: all at once).
async fn kill(cri: &Cri, targets: &[String], pause: Option<Duration>) -> Result<()> {
    let mut pids = Vec::new();
    for id in targets {
        pids.push(cri.container_pid(id).await?);
    }
    for pid in pids {
        // SAFETY: kill(2) on a container's init process, found through CRI just now.
        ensure!(unsafe { libc::kill(pid, libc::SIGKILL) } == 0, "kill {pid}: {}", std::io::Error::last_os_error());
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
    }
    Ok(())
}

/// Runs `plan` on a standalone agent (in the node container when `SWIFTLET_E2E_NODE` says
/// so) and removes its pods afterwards.
pub async fn run(plan: Plan) -> Result<Report> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let (runtime, stream) = serves_events(&cri).await?;
    let agent = Agent::start(AgentOptions { sync_frequency: "1m", ..AgentOptions::default() }).await?;
    let (_, health) = agent.get("/healthz?verbose").await?;
    ensure!(health.contains("[+]pleg ok (evented"), "the evented PLEG must be active (root, BTF): {health}");
    for i in 0..plan.pods {
        agent.write_manifest(&format!("rtev-{i}.yaml"), &manifest(&format!("rtev-{i}"), plan.containers))?;
    }
    let mut restarts = BTreeMap::new();
    let mut phases = Vec::new();
    for (name, pause) in [("one at a time", Some(plan.pause)), ("all at once", None)] {
        let pods = wait_all(&agent, plan, &restarts).await?;
        let targets = containers_of(&pods, plan)?;
        let before = snapshot(&agent).await?;
        let started = Instant::now();
        // One at a time: each kill's restart is awaited before the next, so that the
        // phase measures lone exits; all at once: one burst.
        if let Some(p) = pause {
            for (pod, c, id, count) in &targets {
                kill(&cri, std::slice::from_ref(id), None).await?;
                restarts.insert((pod.clone(), c.clone()), count + 1);
                wait_all(&agent, plan, &restarts).await?;
                tokio::time::sleep(p).await;
            }
        } else {
            let ids: Vec<String> = targets.iter().map(|t| t.2.clone()).collect();
            kill(&cri, &ids, None).await?;
            for (pod, c, _, count) in &targets {
                restarts.insert((pod.clone(), c.clone()), count + 1);
            }
            wait_all(&agent, plan, &restarts).await?;
        }
        let wall = started.elapsed();
        // The runtime's stop events may trail the restarts a little.
        let kills = targets.len();
        let deadline = Instant::now() + Duration::from_secs(10);
        let after = loop {
            let now = snapshot(&agent).await?;
            let told: f64 = now.stopped_first.values().sum::<f64>() - before.stopped_first.values().sum::<f64>();
            if !stream || told >= kills as f64 || Instant::now() > deadline {
                break now;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        phases.push(Phase {
            name,
            kills,
            stopped_first: after
                .stopped_first
                .iter()
                .map(|(k, v)| (k.clone(), v - before.stopped_first.get(k).copied().unwrap_or(0.0)))
                .collect(),
            stop_lag: after.stop_lag.since(&before.stop_lag),
            kernel_to_worker: after.kernel_to_worker.since(&before.kernel_to_worker),
            wall,
        });
    }
    for i in 0..plan.pods {
        agent.remove_manifest(&format!("rtev-{i}.yaml"))?;
    }
    agent.shutdown(&cri).await?;
    Ok(Report { runtime, stream, phases })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_parse_subtract_and_bound_quantiles() {
        let text = "x_bucket{kind=\"stopped\",le=\"0.001\"} 1\nx_bucket{kind=\"stopped\",le=\"0.002\"} 3\n\
                    x_bucket{kind=\"stopped\",le=\"+Inf\"} 4\nx_bucket{kind=\"started\",le=\"0.001\"} 9\n";
        let now = Buckets::parse(text, "x", "kind=\"stopped\"");
        assert_eq!(now.0, [(0.001, 1.0), (0.002, 3.0), (f64::INFINITY, 4.0)]);
        let before = Buckets(vec![(0.001, 1.0), (0.002, 1.0), (f64::INFINITY, 1.0)]);
        let d = now.since(&before);
        assert!((d.count() - 3.0).abs() < f64::EPSILON);
        assert_eq!(d.quantile_bound(0.5), Some(0.002));
        assert_eq!(d.quantile_bound(0.99), Some(f64::INFINITY));
        assert_eq!(Buckets::default().quantile_bound(0.5), None);
    }
}
