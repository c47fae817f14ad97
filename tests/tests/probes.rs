//! End-to-end tests of container probes and lifecycle hooks: a real `swiftlet` probing
//! static pods in the real containerd of the test bed (`cargo xtask testbed up`), and what
//! it makes of the results as the upstream kubelet does: restarts, `ready` and `started`,
//! the pod's `Ready` / `ContainersReady` conditions, events, and `/metrics/probes`.
//!
//! The scenarios of one test share one agent and run side by side, each on a pod of its
//! own, to keep the run short. Probes run every second with small thresholds. Nothing is
//! asserted on wall time except where a hook must be cut short, and there only against a
//! bound far from what the hook would take; a "this has not happened" is asserted only
//! after `/metrics/probes` shows that the probes that would have made it happen did run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, tail, testbed_lock};
use tonic_health::ServingStatus;

const BUSYBOX: &str = "localhost/busybox:latest";
/// A container that runs until SIGTERM and then exits at once.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";
/// How long any one expected change may take.
const TIMEOUT: Duration = Duration::from_mins(1);
/// The upstream capture `/metrics/probes` is compared with, kept in the repository
/// (`SWIFTLET_REFERENCE_DIR` overrides the directory).
const REFERENCE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/reference/kubelet-1.28");
/// The Prometheus client's default histogram buckets, which upstream's probe duration
/// histogram uses.
const DEFAULT_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, f64::INFINITY];

// --- manifests -------------------------------------------------------------------------

/// A static pod (restart policy `Always`) with `spec_extra` (lines indented by two spaces)
/// under `spec` and the `containers` list.
fn pod_yaml(name: &str, grace_seconds: u32, spec_extra: &str, containers: &[String]) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: {grace_seconds}
{spec_extra}  containers:
{}",
        containers.concat()
    )
}

/// A busybox container running `script` with `sh -c`, with `extra` (lines indented by
/// four spaces) added to it. `script` must not contain `"` or `\`.
fn container_yaml(name: &str, script: &str, extra: &str) -> String {
    format!(
        "  - name: {name}
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: [\"sh\", \"-c\", \"{script}\"]
{extra}"
    )
}

/// A `kind` probe (`livenessProbe`, ...) with `handler` (a YAML flow mapping such as
/// `exec: {command: [true]}`), every second. The timeout is generous (5 s) so that a slow
/// `ExecSync` on a busy machine does not count as a failure.
fn probe_yaml(kind: &str, handler: &str, failure_threshold: u32) -> String {
    format!(
        "    {kind}:\n      {handler}\n      periodSeconds: 1\n      timeoutSeconds: 5\n      failureThreshold: {failure_threshold}\n"
    )
}

// --- pod status ------------------------------------------------------------------------

fn full_name(agent: &Agent, name: &str) -> String {
    format!("{name}-{}", agent.node_name)
}

fn uid(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap_or_default().to_string()
}

fn container<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["status"]["containerStatuses"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

fn restarts(p: &Value, name: &str) -> i64 {
    container(p, name)["restartCount"].as_i64().unwrap_or(-1)
}

fn running(p: &Value, name: &str) -> bool {
    !container(p, name)["state"]["running"].is_null()
}

fn ready(p: &Value, name: &str) -> bool {
    container(p, name)["ready"] == true
}

fn started(p: &Value, name: &str) -> bool {
    container(p, name)["started"] == true
}

/// The CRI id of a container (its `containerID` without `containerd://`).
fn container_id(p: &Value, name: &str) -> String {
    let id = container(p, name)["containerID"].as_str().unwrap_or_default();
    id.split_once("://").map_or(id, |(_, id)| id).to_string()
}

fn condition<'a>(p: &'a Value, type_: &str) -> &'a Value {
    p["status"]["conditions"].as_array().and_then(|a| a.iter().find(|c| c["type"] == type_)).unwrap_or(&Value::Null)
}

/// Whether the pod's `Ready` and `ContainersReady` conditions are both `status`.
fn pod_ready_is(p: &Value, status: &str) -> bool {
    condition(p, "Ready")["status"] == status && condition(p, "ContainersReady")["status"] == status
}

async fn setup(opts: AgentOptions) -> Result<(Agent, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let agent = Agent::start(opts).await?;
    Ok((agent, cri))
}

fn log_tail(agent: &Agent) -> String {
    format!("\n--- agent log tail ---\n{}", tail(&agent.log(), 60))
}

/// Fails with `what` and the agent's log once `timeout` has passed since `start`.
fn check_deadline(agent: &Agent, start: Instant, timeout: Duration, what: impl FnOnce() -> String) -> Result<()> {
    if start.elapsed() > timeout {
        bail!("{} (not within {timeout:?}){}", what(), log_tail(agent));
    }
    Ok(())
}

async fn pause() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Runs `cmd` in a container through CRI and requires exit code 0.
async fn exec_ok(cri: &Cri, id: &str, cmd: &[&str]) -> Result<String> {
    let (code, out) = cri.exec(id, cmd).await?;
    ensure!(code == 0, "{cmd:?} in {id} exited with {code}: {out}");
    Ok(out)
}

// --- events ----------------------------------------------------------------------------

/// The events of `/events` about the pod with this UID.
async fn pod_events(agent: &Agent, uid: &str) -> Result<Vec<Value>> {
    let (code, body) = agent.get("/events").await?;
    ensure!(code == 200, "/events answered {code}: {body}");
    let v: Value = serde_json::from_str(&body)?;
    Ok(v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["involvedObject"]["uid"] == uid)
        .collect())
}

fn message(e: &Value) -> &str {
    e["message"].as_str().unwrap_or_default()
}

fn is_event(e: &Value, type_: &str, reason: &str) -> bool {
    e["type"] == type_ && e["reason"] == reason
}

fn describe_events(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("{} {} [{}]: {}", e["type"], e["reason"], e["involvedObject"]["fieldPath"], message(e)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls `/events` until an event about the pod matches `pred`.
async fn wait_event(agent: &Agent, uid: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    let start = Instant::now();
    loop {
        let events = pod_events(agent, uid).await?;
        if let Some(e) = events.iter().find(|e| pred(e)) {
            return Ok(e.clone());
        }
        check_deadline(agent, start, TIMEOUT, || {
            format!("no {what} event; events of the pod:\n{}", describe_events(&events))
        })?;
        pause().await;
    }
}

// --- /metrics/probes -------------------------------------------------------------------

/// One sample line of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Sample {
    /// A label's value ("" when the sample does not have it).
    fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// A parsed Prometheus text exposition.
#[derive(Debug, Default)]
struct Exposition {
    help: BTreeMap<String, String>,
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
    text: String,
}

impl Exposition {
    fn parse(text: &str) -> Result<Self> {
        let mut e = Self { text: text.to_string(), ..Self::default() };
        for line in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                e.help.insert(name.to_string(), help.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, type_) = rest.split_once(' ').with_context(|| format!("bad TYPE line {line:?}"))?;
                e.types.insert(name.to_string(), type_.to_string());
            } else if !line.starts_with('#') {
                e.samples.push(parse_sample(line).with_context(|| format!("bad sample line {line:?}"))?);
            }
        }
        Ok(e)
    }

    /// The family a sample belongs to: the one of its name, or the histogram or summary
    /// its `_bucket` / `_sum` / `_count` series is part of.
    fn family_of<'a>(&'a self, sample: &'a str) -> &'a str {
        if self.types.contains_key(sample) {
            return sample;
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = sample.strip_suffix(suffix)
                && self.types.get(base).is_some_and(|t| t == "histogram" || t == "summary")
            {
                return base;
            }
        }
        sample
    }

    fn samples_of<'a>(&'a self, family: &'a str) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| self.family_of(&s.name) == family)
    }

    /// The sum of the samples named `name` that have all of `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v)))
            .map(|s| s.value)
            .sum()
    }

    /// The `prober_probe_total` lines, for failure messages.
    fn probe_lines(&self) -> String {
        self.text.lines().filter(|l| l.starts_with("prober_probe_total")).collect::<Vec<_>>().join("\n")
    }
}

/// Parses `name{k="v",...} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample> {
    let name_end = line.find(['{', ' ']).context("no value")?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let end = 'pairs: loop {
            let mut key = String::new();
            loop {
                match chars.next() {
                    Some((i, '}')) if key.trim().is_empty() => break 'pairs i,
                    Some((_, '=')) => break,
                    Some((_, ',')) if key.trim().is_empty() => {}
                    Some((_, c)) => key.push(c),
                    None => bail!("unterminated label set"),
                }
            }
            ensure!(matches!(chars.next(), Some((_, '"'))), "label {key} has no quoted value");
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => bail!("unterminated escape"),
                    },
                    Some((_, '"')) => break,
                    Some((_, c)) => value.push(c),
                    None => bail!("unterminated label value"),
                }
            }
            labels.insert(key.trim().to_string(), value);
        };
        rest = &body[end + 1..];
    }
    let value = rest.split_whitespace().next().context("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().with_context(|| format!("bad value {v:?}"))?,
    };
    Ok(Sample { name, labels, value })
}

async fn probe_metrics(agent: &Agent) -> Result<Exposition> {
    let (code, body) = agent.get("/metrics/probes").await?;
    ensure!(code == 200, "/metrics/probes answered {code}: {body}");
    Exposition::parse(&body)
}

/// `prober_probe_total` of one container of a pod in `default` for `probe_type`
/// (`Liveness`, `Readiness`, `Startup`) and `result` (`successful`, `failed`, `unknown`;
/// empty for all).
fn probe_total(m: &Exposition, pod: &str, container: &str, probe_type: &str, result: &str) -> u64 {
    let mut labels = vec![("namespace", "default"), ("pod", pod), ("container", container), ("probe_type", probe_type)];
    if !result.is_empty() {
        labels.push(("result", result));
    }
    m.sum("prober_probe_total", &labels).round() as u64
}

/// Polls `/metrics/probes` until `pred` holds.
async fn wait_probe_metrics(agent: &Agent, what: &str, pred: impl Fn(&Exposition) -> bool) -> Result<Exposition> {
    let start = Instant::now();
    loop {
        let m = probe_metrics(agent).await?;
        if pred(&m) {
            return Ok(m);
        }
        check_deadline(agent, start, TIMEOUT, || {
            format!("/metrics/probes: {what}; probe counts:\n{}", m.probe_lines())
        })?;
        pause().await;
    }
}

/// One family of the upstream capture.
#[derive(Debug)]
struct ReferenceFamily {
    type_: String,
    labels: BTreeSet<String>,
    help: String,
}

/// The families of the upstream `/metrics/probes` capture: tab-separated family, TYPE,
/// sorted label names (`-` for none), sample count, HELP.
fn reference_inventory() -> Result<BTreeMap<String, ReferenceFamily>> {
    let dir = std::env::var("SWIFTLET_REFERENCE_DIR").map_or_else(|_| PathBuf::from(REFERENCE_DIR), PathBuf::from);
    let path = dir.join("metrics-probes.txt");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading the reference {}", path.display()))?;
    let mut families = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let cols: Vec<&str> = line.split('\t').collect();
        ensure!(cols.len() == 5, "{}: expected 5 columns: {line:?}", path.display());
        let labels = if cols[2] == "-" { BTreeSet::new() } else { cols[2].split(',').map(str::to_string).collect() };
        families.insert(
            cols[0].to_string(),
            ReferenceFamily { type_: cols[1].to_string(), labels, help: cols[4].to_string() },
        );
    }
    ensure!(!families.is_empty(), "{} lists no family", path.display());
    Ok(families)
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

// --- liveness, readiness, startup ------------------------------------------------------

/// Liveness: an exec probe (`cat /tmp/healthy`, every second, failureThreshold 2) passes
/// while the file is there. Once the test deletes it, two failures in a row get the
/// container killed and started again (restartCount 1), with upstream's `Unhealthy`
/// (`Liveness probe failed: <output>`, on `spec.containers{main}`) and `Killing`
/// (`Container main failed liveness probe, will be restarted`) events; the failures and
/// successes are counted in `/metrics/probes`, and the same probe goes on against the new
/// container, which passes.
async fn liveness_failure_restarts_the_container(agent: &Agent, cri: &Cri) -> Result<()> {
    let name = "liveness";
    let pod = full_name(agent, name);
    let probe = probe_yaml("livenessProbe", r#"exec: {command: ["cat", "/tmp/healthy"]}"#, 2);
    let main = container_yaml("main", &format!("touch /tmp/healthy; {SERVE}"), &probe);
    agent.write_manifest("liveness.yaml", &pod_yaml(name, 2, "", &[main]))?;
    let p = agent.wait_pod(name, TIMEOUT, |p| running(p, "main")).await?;
    let uid = uid(&p);
    let first = container_id(&p, "main");
    wait_probe_metrics(agent, "a successful liveness probe", |m| {
        probe_total(m, &pod, "main", "Liveness", "successful") >= 1
    })
    .await?;
    let p = agent.pod(name).await?.context("liveness pod gone")?;
    assert_eq!(restarts(&p, "main"), 0, "a passing liveness probe restarts nothing");
    assert_eq!(container_id(&p, "main"), first);

    exec_ok(cri, &first, &["rm", "/tmp/healthy"]).await?;
    let p = agent.wait_pod(name, TIMEOUT, |p| restarts(p, "main") >= 1 && running(p, "main")).await?;
    assert_ne!(container_id(&p, "main"), first, "the failing container was replaced");
    // The runtime agrees: the first container is no longer running.
    let old = cri.containers(&uid).await?.into_iter().find(|c| c.id == first);
    assert!(
        old.is_none_or(|c| c.state != k8s_cri::v1::ContainerState::ContainerRunning as i32),
        "the container that failed its liveness probe still runs"
    );

    let unhealthy = wait_event(agent, &uid, "Unhealthy (liveness)", |e| {
        is_event(e, "Warning", "Unhealthy") && message(e).starts_with("Liveness probe failed:")
    })
    .await?;
    assert!(message(&unhealthy).contains("/tmp/healthy"), "the event carries the probe's output: {unhealthy}");
    assert_eq!(unhealthy["involvedObject"]["fieldPath"], "spec.containers{main}", "{unhealthy}");
    let killing = wait_event(agent, &uid, "Killing (liveness)", |e| {
        is_event(e, "Normal", "Killing") && message(e).contains("failed liveness probe, will be restarted")
    })
    .await?;
    assert_eq!(message(&killing), "Container main failed liveness probe, will be restarted");
    assert_eq!(killing["involvedObject"]["fieldPath"], "spec.containers{main}", "{killing}");

    // At least failureThreshold failures were counted before the kill, and the probe
    // keeps running against the new container, which creates the file again and passes.
    let m = probe_metrics(agent).await?;
    let failed = probe_total(&m, &pod, "main", "Liveness", "failed");
    assert!(failed >= 2, "failureThreshold failures counted; probe counts:\n{}", m.probe_lines());
    let successes = probe_total(&m, &pod, "main", "Liveness", "successful");
    assert!(successes >= 1, "{}", m.probe_lines());
    wait_probe_metrics(agent, "liveness passing on the restarted container", |m| {
        probe_total(m, &pod, "main", "Liveness", "successful") > successes
    })
    .await?;
    let p = agent.wait_pod(name, TIMEOUT, |p| running(p, "main") && started(p, "main") && ready(p, "main")).await?;
    assert_eq!(restarts(&p, "main"), 1, "the new container is healthy and stays{}", log_tail(agent));
    Ok(())
}

/// Readiness: an exec probe (`cat /tmp/ready`, failureThreshold 1) on a file the test
/// creates and deletes in the container. The container turns ready, and the pod's `Ready`
/// and `ContainersReady` conditions `True`; with the file gone they go back to `False`
/// (reason `ContainersNotReady`, `containers with unready status: [main]`). A failing
/// readiness probe never restarts the container.
async fn readiness_flips_both_ways_without_restarts(agent: &Agent, cri: &Cri) -> Result<()> {
    let name = "readiness";
    let pod = full_name(agent, name);
    let probe = probe_yaml("readinessProbe", r#"exec: {command: ["cat", "/tmp/ready"]}"#, 1);
    agent.write_manifest("readiness.yaml", &pod_yaml(name, 2, "", &[container_yaml("main", SERVE, &probe)]))?;
    let p = agent.wait_pod(name, TIMEOUT, |p| running(p, "main")).await?;
    let uid = uid(&p);
    let id = container_id(&p, "main");
    wait_probe_metrics(agent, "a failed readiness probe", |m| probe_total(m, &pod, "main", "Readiness", "failed") >= 1)
        .await?;
    let not_ready = |p: &Value| {
        running(p, "main")
            && started(p, "main")
            && !ready(p, "main")
            && pod_ready_is(p, "False")
            && condition(p, "Ready")["reason"] == "ContainersNotReady"
            && condition(p, "ContainersReady")["reason"] == "ContainersNotReady"
    };
    let p = agent.wait_pod(name, TIMEOUT, not_ready).await?;
    assert_eq!(condition(&p, "Ready")["message"], "containers with unready status: [main]");

    exec_ok(cri, &id, &["touch", "/tmp/ready"]).await?;
    agent.wait_pod(name, TIMEOUT, |p| ready(p, "main") && pod_ready_is(p, "True")).await?;

    exec_ok(cri, &id, &["rm", "/tmp/ready"]).await?;
    let p = agent.wait_pod(name, TIMEOUT, not_ready).await?;
    assert_eq!(condition(&p, "ContainersReady")["message"], "containers with unready status: [main]");
    assert_eq!(restarts(&p, "main"), 0, "readiness never restarts a container");
    assert_eq!(container_id(&p, "main"), id);

    let e = wait_event(agent, &uid, "Unhealthy (readiness)", |e| {
        is_event(e, "Warning", "Unhealthy") && message(e).starts_with("Readiness probe failed:")
    })
    .await?;
    assert_eq!(e["involvedObject"]["fieldPath"], "spec.containers{main}", "{e}");
    let events = pod_events(agent, &uid).await?;
    assert!(!events.iter().any(|e| e["reason"] == "Killing"), "nothing killed:\n{}", describe_events(&events));
    let m = probe_metrics(agent).await?;
    assert!(probe_total(&m, &pod, "main", "Readiness", "successful") >= 1, "{}", m.probe_lines());
    assert!(probe_total(&m, &pod, "main", "Readiness", "failed") >= 2, "{}", m.probe_lines());
    Ok(())
}

/// Startup: a startup probe (`cat /tmp/started`, failureThreshold 120) holds back a
/// liveness probe that would fail at once (`cat /tmp/started`, failureThreshold 1). While
/// the startup probe fails, the liveness probe does not run at all (no `Liveness` sample
/// in `/metrics/probes`), the container is neither `started` nor `ready`, and nothing is
/// restarted. Once the test creates the file the startup probe passes once and stops,
/// the container is `started` and `ready`, and the liveness probe runs; deleting the file
/// now gets the container restarted by the liveness probe, and the new container is back
/// behind its startup probe (`started` false).
async fn startup_probe_holds_back_liveness(agent: &Agent, cri: &Cri) -> Result<()> {
    let name = "startup";
    let pod = full_name(agent, name);
    let handler = r#"exec: {command: ["cat", "/tmp/started"]}"#;
    let probes = format!("{}{}", probe_yaml("startupProbe", handler, 120), probe_yaml("livenessProbe", handler, 1));
    agent.write_manifest("startup.yaml", &pod_yaml(name, 2, "", &[container_yaml("main", SERVE, &probes)]))?;
    let p = agent.wait_pod(name, TIMEOUT, |p| running(p, "main")).await?;
    let uid = uid(&p);
    let id = container_id(&p, "main");
    let m = wait_probe_metrics(agent, "three failed startup probes", |m| {
        probe_total(m, &pod, "main", "Startup", "failed") >= 3
    })
    .await?;
    assert_eq!(
        probe_total(&m, &pod, "main", "Liveness", ""),
        0,
        "the liveness probe ran before the startup probe passed:\n{}",
        m.probe_lines()
    );
    assert_eq!(probe_total(&m, &pod, "main", "Startup", "successful"), 0);
    let p = agent.pod(name).await?.context("startup pod gone")?;
    assert!(running(&p, "main") && !started(&p, "main") && !ready(&p, "main"), "{}", p["status"]);
    assert!(pod_ready_is(&p, "False"), "{}", p["status"]);
    assert_eq!(restarts(&p, "main"), 0);

    exec_ok(cri, &id, &["touch", "/tmp/started"]).await?;
    let p =
        agent.wait_pod(name, TIMEOUT, |p| started(p, "main") && ready(p, "main") && pod_ready_is(p, "True")).await?;
    assert_eq!(restarts(&p, "main"), 0);
    assert_eq!(container_id(&p, "main"), id);
    let m = wait_probe_metrics(agent, "a successful liveness probe after startup", |m| {
        probe_total(m, &pod, "main", "Liveness", "successful") >= 1
    })
    .await?;
    assert_eq!(
        probe_total(&m, &pod, "main", "Startup", "successful"),
        1,
        "the startup probe stops once it passed:\n{}",
        m.probe_lines()
    );
    assert_eq!(probe_total(&m, &pod, "main", "Liveness", "failed"), 0, "{}", m.probe_lines());

    // The liveness probe is live now: it restarts the container when it fails.
    exec_ok(cri, &id, &["rm", "/tmp/started"]).await?;
    let p = agent.wait_pod(name, TIMEOUT, |p| restarts(p, "main") >= 1 && running(p, "main")).await?;
    assert_ne!(container_id(&p, "main"), id);
    wait_event(agent, &uid, "Killing (liveness after startup)", |e| {
        is_event(e, "Normal", "Killing") && message(e) == "Container main failed liveness probe, will be restarted"
    })
    .await?;
    // The new container has no /tmp/started: it is behind its startup probe again.
    let p = agent.pod(name).await?.context("startup pod gone")?;
    assert!(!started(&p, "main") && !ready(&p, "main"), "{}", p["status"]);
    let events = pod_events(agent, &uid).await?;
    assert!(
        events.iter().any(|e| is_event(e, "Warning", "Unhealthy") && message(e).starts_with("Startup probe failed:")),
        "{}",
        describe_events(&events)
    );
    Ok(())
}

/// `/metrics/probes` serves the families of the upstream capture
/// (`metrics-probes.txt`) and no others, with the same TYPE, HELP and label names
/// (`le` included for the histogram), and its numbers agree with the probes that ran
/// in the scenarios above (their pods still run): the liveness pod's failures reached
/// its failureThreshold, every probe type that ran has its series labelled with the
/// pod's name, namespace and UID, durations are observed for successful probes only,
/// in the default buckets, and `process_start_time_seconds` is this agent's start.
async fn probe_metrics_match_the_kubelet_inventory(agent: &Agent, test_start: f64) -> Result<()> {
    let reference = reference_inventory()?;
    let m = probe_metrics(agent).await?;
    let ours: BTreeSet<&str> = m.types.keys().map(String::as_str).collect();
    let theirs: BTreeSet<&str> = reference.keys().map(String::as_str).collect();
    assert_eq!(ours, theirs, "metric families of /metrics/probes:\n{}", m.text);
    for (family, r) in &reference {
        assert_eq!(m.types.get(family), Some(&r.type_), "TYPE of {family}");
        assert_eq!(m.help.get(family), Some(&r.help), "HELP of {family}");
        let samples: Vec<&Sample> = m.samples_of(family).collect();
        assert!(!samples.is_empty(), "{family} has no samples while probes run:\n{}", m.text);
        let names: BTreeSet<String> = samples.iter().flat_map(|s| s.labels.keys().cloned()).collect();
        assert_eq!(names, r.labels, "label names of {family}");
        // Every sample has every label (but `le`, on buckets only).
        for s in &samples {
            let expected = r.labels.iter().filter(|l| *l != "le" || s.name.ends_with("_bucket")).count();
            assert_eq!(s.labels.len(), expected, "labels of {s:?}");
        }
    }

    // Each probe type that ran, with the pod's identity.
    for (name, probe_type) in [("liveness", "Liveness"), ("readiness", "Readiness"), ("startup", "Startup")] {
        let p = agent.pod(name).await?.with_context(|| format!("{name} pod gone"))?;
        let pod = full_name(agent, name);
        let series: Vec<&Sample> = m
            .samples
            .iter()
            .filter(|s| s.name == "prober_probe_total" && s.label("pod") == pod && s.label("probe_type") == probe_type)
            .collect();
        assert!(!series.is_empty(), "no {probe_type} series for {pod}:\n{}", m.probe_lines());
        for s in series {
            assert_eq!(s.label("pod_uid"), uid(&p), "{s:?}");
            assert_eq!(s.label("namespace"), "default", "{s:?}");
            assert_eq!(s.label("container"), "main", "{s:?}");
            assert!(["successful", "failed", "unknown"].contains(&s.label("result")), "{s:?}");
        }
    }

    // The liveness pod: failures up to the threshold, durations for successes only.
    let pod = full_name(agent, "liveness");
    let failed = probe_total(&m, &pod, "main", "Liveness", "failed");
    let successful = probe_total(&m, &pod, "main", "Liveness", "successful");
    let unknown = probe_total(&m, &pod, "main", "Liveness", "unknown");
    assert!(failed >= 2 && successful >= 2, "{}", m.probe_lines());
    let series = [("namespace", "default"), ("pod", pod.as_str()), ("container", "main"), ("probe_type", "Liveness")];
    let count = m.sum("prober_probe_duration_seconds_count", &series).round() as u64;
    // A probe may finish between the two families of one scrape: allow one either way.
    // Failures (at least two) must not be in the histogram.
    assert!(
        count.abs_diff(successful + unknown) <= 1,
        "duration count {count} for {successful} successful + {unknown} unknown (+ {failed} failed) probes"
    );
    let mut buckets: Vec<(f64, f64)> = m
        .samples
        .iter()
        .filter(|s| s.name == "prober_probe_duration_seconds_bucket")
        .filter(|s| series.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v)))
        .map(|s| (parse_le(s.label("le")), s.value))
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let bounds: Vec<f64> = buckets.iter().map(|b| b.0).collect();
    assert_eq!(bounds, DEFAULT_BUCKETS, "bucket bounds");
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "cumulative buckets: {buckets:?}");
    assert_eq!(buckets.last().map_or(0, |b| b.1.round() as u64), count, "+Inf bucket equals the count: {buckets:?}");
    assert!(m.sum("prober_probe_duration_seconds_sum", &series) > 0.0);

    let start = m.sum("process_start_time_seconds", &[]);
    // The agent started during this test (its /proc start time is to the second).
    assert!(start >= test_start - 2.0 && start <= unix_now() + 2.0, "process_start_time_seconds {start}");
    Ok(())
}

fn parse_le(le: &str) -> f64 {
    if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) }
}

/// Liveness, readiness and startup probes on one agent, then the `/metrics/probes`
/// inventory while their pods still run (see each scenario's comment).
#[tokio::test]
async fn liveness_readiness_and_startup_probes() -> Result<()> {
    let _g = testbed_lock().await;
    let test_start = unix_now();
    let (agent, cri) = setup(AgentOptions::default()).await?;
    tokio::try_join!(
        liveness_failure_restarts_the_container(&agent, &cri),
        readiness_flips_both_ways_without_restarts(&agent, &cri),
        startup_probe_holds_back_liveness(&agent, &cri),
    )?;
    probe_metrics_match_the_kubelet_inventory(&agent, test_start).await?;
    agent.shutdown(&cri).await
}

// --- handlers --------------------------------------------------------------------------

/// httpGet, tcpSocket and exec handlers, each in a passing and a failing form, as
/// readiness probes of the containers of one pod (one network namespace). `http-ok`
/// serves `/www` with busybox `httpd` on port 8080, declared as the named port `http`
/// that its probe (`/ok.html`) uses; `http-missing` asks the same server for a file that
/// is not there (404); `tcp-open` connects to 8080, `tcp-closed` to 8081 where nothing
/// listens; `exec-ok` runs `true`, `exec-fail` `sh -c 'exit 1'`. The passing ones turn
/// ready; the failing ones stay unready after several failed runs and none passed, with
/// upstream's failure messages in the `Unhealthy` events, and the pod is not ready.
async fn http_tcp_and_exec_handlers(agent: &Agent) -> Result<()> {
    let name = "handlers";
    let pod = full_name(agent, name);
    // Three failures in a row to turn unready: a passing probe stays ready through a
    // hiccup, and a failing one is unready from the start anyway.
    let readiness = |handler: &str| probe_yaml("readinessProbe", handler, 3);
    let web = "mkdir -p /www; echo ok > /www/ok.html; httpd -p 8080 -h /www; ".to_string() + SERVE;
    let http_port = "    ports:\n    - name: http\n      containerPort: 8080\n";
    let containers = [
        container_yaml("http-ok", &web, &format!("{http_port}{}", readiness("httpGet: {path: /ok.html, port: http}"))),
        container_yaml("http-missing", SERVE, &readiness("httpGet: {path: /missing.html, port: 8080}")),
        container_yaml("tcp-open", SERVE, &readiness("tcpSocket: {port: 8080}")),
        container_yaml("tcp-closed", SERVE, &readiness("tcpSocket: {port: 8081}")),
        container_yaml("exec-ok", SERVE, &readiness(r#"exec: {command: ["true"]}"#)),
        container_yaml("exec-fail", SERVE, &readiness(r#"exec: {command: ["sh", "-c", "exit 1"]}"#)),
    ];
    agent.write_manifest("handlers.yaml", &pod_yaml(name, 2, "", &containers))?;
    let passing = ["http-ok", "tcp-open", "exec-ok"];
    let failing = ["http-missing", "tcp-closed", "exec-fail"];
    let p = agent.wait_pod(name, TIMEOUT, |p| passing.iter().all(|c| running(p, c) && ready(p, c))).await?;
    let uid = uid(&p);
    let ip = p["status"]["podIP"].as_str().unwrap_or_default().to_string();
    assert!(!ip.is_empty(), "the pod has an IP");

    let m = wait_probe_metrics(agent, "three failed runs of each failing readiness probe", |m| {
        failing.iter().all(|c| probe_total(m, &pod, c, "Readiness", "failed") >= 3)
    })
    .await?;
    for c in failing {
        assert_eq!(probe_total(&m, &pod, c, "Readiness", "successful"), 0, "{c}:\n{}", m.probe_lines());
    }
    for c in passing {
        assert!(probe_total(&m, &pod, c, "Readiness", "successful") >= 1, "{c}:\n{}", m.probe_lines());
    }
    let p = agent.pod(name).await?.context("handlers pod gone")?;
    for c in failing {
        assert!(running(&p, c) && !ready(&p, c), "{c} must not be ready: {}", container(&p, c));
        assert_eq!(restarts(&p, c), 0, "{c}");
    }
    for c in passing {
        assert!(ready(&p, c), "{c} must stay ready: {}", container(&p, c));
    }
    assert!(pod_ready_is(&p, "False"), "{}", p["status"]);
    let unready = condition(&p, "Ready")["message"].as_str().unwrap_or_default().to_string();
    assert!(unready.starts_with("containers with unready status: ["), "{unready}");
    for c in failing {
        assert!(unready.contains(c), "{c} listed in {unready:?}");
    }
    for c in passing {
        assert!(!unready.split(['[', ']', ' ']).any(|w| w == c), "{c} not listed in {unready:?}");
    }

    let failed_with = |container: &'static str, text: String| {
        let field_path = format!("spec.containers{{{container}}}");
        move |e: &Value| {
            is_event(e, "Warning", "Unhealthy")
                && e["involvedObject"]["fieldPath"] == field_path.as_str()
                && message(e).starts_with(&text)
        }
    };
    wait_event(
        agent,
        &uid,
        "Unhealthy (http 404)",
        failed_with("http-missing", "Readiness probe failed: HTTP probe failed with statuscode: 404".into()),
    )
    .await?;
    wait_event(
        agent,
        &uid,
        "Unhealthy (tcp refused)",
        failed_with("tcp-closed", format!("Readiness probe failed: dial tcp {ip}:8081: connect: connection refused")),
    )
    .await?;
    wait_event(agent, &uid, "Unhealthy (exec exit 1)", failed_with("exec-fail", "Readiness probe failed:".into()))
        .await?;
    Ok(())
}

/// The interfaces of the IPv4 default routes (`/proc/net/route`).
fn default_route_interfaces() -> Vec<String> {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() > 1 && cols[1] == "00000000").then(|| cols[0].to_string())
        })
        .collect()
}

/// A non-loopback IPv4 address of this host, for `--node-ip` (the pod IP of a
/// `hostNetwork` pod): one of the default route's interface if there is one, else one of
/// an interface that is up and running, else any. The agent dials it from the host, so
/// any local address reaches the test's server; the default route's is the realistic one.
fn host_ipv4() -> Result<Ipv4Addr> {
    let default_ifaces = default_route_interfaces();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list that is freed below.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        bail!("getifaddrs: {}", std::io::Error::last_os_error());
    }
    let mut candidates = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list from getifaddrs, not freed yet.
        let ifa = unsafe { &*cur };
        let flags = ifa.ifa_flags;
        // SAFETY: a non-null `ifa_addr` points to a sockaddr of the list.
        if !ifa.ifa_addr.is_null()
            && i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET
            && flags & libc::IFF_LOOPBACK as u32 == 0
        {
            // SAFETY: as above. For AF_INET, sa_data holds the port (2 bytes), then the
            // address in network order.
            let d = unsafe { (*ifa.ifa_addr).sa_data };
            let ip = Ipv4Addr::new(d[2] as u8, d[3] as u8, d[4] as u8, d[5] as u8);
            // SAFETY: `ifa_name` is a NUL-terminated string of the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
            let up_and_running = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
            let rank = if default_ifaces.contains(&name) {
                0
            } else if flags & up_and_running == up_and_running {
                1
            } else {
                2
            };
            candidates.push((rank, ip));
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no reference into it is left.
    unsafe { libc::freeifaddrs(list) };
    candidates.sort();
    candidates.first().map(|c| c.1).context("this host has no non-loopback IPv4 address")
}

/// Aborts the test's gRPC server when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// gRPC: a `hostNetwork` pod (pod IP = the node IP) whose readiness probe checks
/// `grpc.health.v1` on a port where the test itself serves the health service. The
/// container is ready while the server answers `SERVING`, turns unready on
/// `NOT_SERVING` (event `Readiness probe failed: service unhealthy (responded with
/// "NOT_SERVING")`), and ready again on `SERVING`.
async fn grpc_handler_follows_the_health_service(agent: &Agent, node_ip: Ipv4Addr) -> Result<()> {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).await?;
    let port = listener.local_addr()?.port();
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter.set_service_status("", ServingStatus::Serving).await;
    let _server = AbortOnDrop(tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        if let Err(e) = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await {
            eprintln!("test gRPC health server: {e}");
        }
    }));

    let name = "grpc";
    let pod = full_name(agent, name);
    let probe = probe_yaml("readinessProbe", &format!("grpc: {{port: {port}}}"), 1);
    agent.write_manifest(
        "grpc.yaml",
        &pod_yaml(name, 2, "  hostNetwork: true\n", &[container_yaml("main", SERVE, &probe)]),
    )?;
    let p =
        agent.wait_pod(name, TIMEOUT, |p| running(p, "main") && ready(p, "main") && pod_ready_is(p, "True")).await?;
    let uid = uid(&p);
    assert_eq!(p["status"]["podIP"], node_ip.to_string(), "a hostNetwork pod has the node's IP");

    reporter.set_service_status("", ServingStatus::NotServing).await;
    agent.wait_pod(name, TIMEOUT, |p| running(p, "main") && !ready(p, "main") && pod_ready_is(p, "False")).await?;
    wait_event(agent, &uid, "Unhealthy (gRPC NOT_SERVING)", |e| {
        is_event(e, "Warning", "Unhealthy")
            && message(e) == r#"Readiness probe failed: service unhealthy (responded with "NOT_SERVING")"#
    })
    .await?;

    reporter.set_service_status("", ServingStatus::Serving).await;
    let p = agent.wait_pod(name, TIMEOUT, |p| ready(p, "main") && pod_ready_is(p, "True")).await?;
    assert_eq!(restarts(&p, "main"), 0);
    let m = probe_metrics(agent).await?;
    assert!(probe_total(&m, &pod, "main", "Readiness", "successful") >= 2, "{}", m.probe_lines());
    assert!(probe_total(&m, &pod, "main", "Readiness", "failed") >= 1, "{}", m.probe_lines());
    Ok(())
}

/// Every probe handler, passing and failing (see each scenario's comment). The agent
/// gets `--node-ip` so that the `hostNetwork` pod of the gRPC scenario has an IP.
#[tokio::test]
async fn probe_handlers_succeed_and_fail() -> Result<()> {
    let _g = testbed_lock().await;
    let node_ip = host_ipv4()?;
    let (agent, cri) =
        setup(AgentOptions { extra_flags: vec![format!("--node-ip={node_ip}")], ..AgentOptions::default() }).await?;
    tokio::try_join!(http_tcp_and_exec_handlers(&agent), grpc_handler_follows_the_health_service(&agent, node_ip))?;
    agent.shutdown(&cri).await
}

// --- lifecycle hooks -------------------------------------------------------------------

/// The lines of a marker file (none while it does not exist).
fn marker_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

/// Polls a marker file until it has the line `line`.
async fn wait_marker(agent: &Agent, path: &Path, line: &str) -> Result<()> {
    let start = Instant::now();
    while !marker_lines(path).iter().any(|l| l == line) {
        check_deadline(agent, start, TIMEOUT, || {
            format!("{} has no line {line:?}: {:?}", path.display(), marker_lines(path))
        })?;
        pause().await;
    }
    Ok(())
}

/// Polls until none of the pod's containers runs in the runtime, for at most `timeout`.
async fn wait_no_running_container(agent: &Agent, cri: &Cri, uid: &str, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let containers = cri.containers(uid).await?;
        if !containers.iter().any(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32) {
            return Ok(());
        }
        check_deadline(agent, start, timeout, || format!("a container of pod {uid} still runs"))?;
        pause().await;
    }
}

/// Polls until the pod is gone from `/pods` and the runtime.
async fn wait_pod_gone(agent: &Agent, cri: &Cri, name: &str, uid: &str) -> Result<()> {
    let start = Instant::now();
    while agent.pod(name).await?.is_some() || !cri.sandboxes(uid).await?.is_empty() {
        check_deadline(agent, start, TIMEOUT, || format!("pod {name} not removed"))?;
        pause().await;
    }
    Ok(())
}

/// A pod whose container writes to `/marker/<file>` (a hostPath of the test's
/// directory `dir`), with a preStop exec hook.
fn marker_pod(name: &str, grace: u32, dir: &Path, script: &str, pre_stop: &str) -> Result<String> {
    // The agent's name for the directory (the node's, for an agent in the node container).
    let at = swiftlet_tests::agent_path(dir)?;
    let volumes = format!("  volumes:\n  - name: marker\n    hostPath: {{path: {}, type: Directory}}\n", at.display());
    let extra = format!(
        "    volumeMounts:\n    - {{name: marker, mountPath: /marker}}\n    lifecycle:\n      preStop:\n        exec:\n          command: [\"sh\", \"-c\", \"{pre_stop}\"]\n"
    );
    Ok(pod_yaml(name, grace, &volumes, &[container_yaml("main", script, &extra)]))
}

/// preStop: removing the manifest of a pod (grace period 5 s) runs the container's
/// preStop hook (`echo prestop >> /marker/order; sleep 1`) to its end before the
/// container gets SIGTERM, which its trap records (`term`): the file reads `started`,
/// `prestop`, `term` in that order.
async fn prestop_runs_before_sigterm(agent: &Agent, cri: &Cri, dir: &Path) -> Result<()> {
    let name = "prestop";
    let file = dir.join("order");
    let script =
        "trap 'echo term >> /marker/order; exit 0' TERM; echo started >> /marker/order; while true; do sleep 1; done";
    agent
        .write_manifest("prestop.yaml", &marker_pod(name, 5, dir, script, "echo prestop >> /marker/order; sleep 1")?)?;
    let p = agent.wait_pod(name, TIMEOUT, |p| running(p, "main")).await?;
    let uid = uid(&p);
    wait_marker(agent, &file, "started").await?;
    agent.remove_manifest("prestop.yaml")?;
    wait_marker(agent, &file, "term").await?;
    wait_pod_gone(agent, cri, name, &uid).await?;
    assert_eq!(marker_lines(&file), ["started", "prestop", "term"], "preStop runs to its end before SIGTERM");
    Ok(())
}

/// preStop longer than the grace period: a container that ignores SIGTERM (its trap
/// only writes `term`) with a preStop hook that would sleep 60 s (`prestop`, then
/// `prestop-done` at the end) and a grace period of 3 s. Once the hook has started, the
/// container is gone well before the hook could end — the hook is cut at the grace
/// period and SIGKILL follows the (minimum 2 s) stop grace — and `prestop-done` is never
/// written.
async fn prestop_is_cut_at_the_grace_period(agent: &Agent, cri: &Cri, dir: &Path) -> Result<()> {
    let name = "prestop-slow";
    let file = dir.join("slow");
    let script = "trap 'echo term >> /marker/slow' TERM; echo started >> /marker/slow; while true; do sleep 1; done";
    let pre_stop = "echo prestop >> /marker/slow; sleep 60; echo prestop-done >> /marker/slow";
    agent.write_manifest("prestop-slow.yaml", &marker_pod(name, 3, dir, script, pre_stop)?)?;
    let p = agent.wait_pod(name, TIMEOUT, |p| running(p, "main")).await?;
    let uid = uid(&p);
    wait_marker(agent, &file, "started").await?;
    agent.remove_manifest("prestop-slow.yaml")?;
    wait_marker(agent, &file, "prestop").await?;
    // From the hook's start: the grace period (3 s), then the stop's minimum grace (2 s)
    // before SIGKILL, so about 5 s; the bound leaves room for a slow machine and is still
    // far from the hook's 60 s.
    wait_no_running_container(agent, cri, &uid, Duration::from_secs(3 + 2 + 15)).await?;
    wait_pod_gone(agent, cri, name, &uid).await?;
    let lines = marker_lines(&file);
    assert_eq!(lines[..2], ["started", "prestop"], "{lines:?}");
    assert!(!lines.iter().any(|l| l == "prestop-done"), "the hook was not cut short: {lines:?}");
    assert!(lines[2..].iter().all(|l| l == "term"), "{lines:?}");
    Ok(())
}

/// postStart failure: a postStart exec hook that exits 1 gets the container killed and
/// restarted (restart policy `Always`) with a `FailedPostStartHook` warning event
/// (message `PostStartHook failed`, as upstream, without the command's details) and a
/// `Killing` event with upstream's message `FailedPostStartHook`.
async fn poststart_failure_restarts_the_container(agent: &Agent) -> Result<()> {
    let name = "poststart-fail";
    let hook = "    lifecycle:\n      postStart:\n        exec:\n          command: [\"sh\", \"-c\", \"exit 1\"]\n";
    agent.write_manifest("poststart-fail.yaml", &pod_yaml(name, 2, "", &[container_yaml("main", SERVE, hook)]))?;
    let p = agent.wait_pod(name, TIMEOUT, |p| restarts(p, "main") >= 1).await?;
    let uid = uid(&p);
    let e = wait_event(agent, &uid, "FailedPostStartHook", |e| is_event(e, "Warning", "FailedPostStartHook")).await?;
    assert_eq!(message(&e), "PostStartHook failed");
    assert_eq!(e["involvedObject"]["fieldPath"], "spec.containers{main}", "{e}");
    // Upstream kills the container with the message `FailedPostStartHook`.
    let killing = wait_event(agent, &uid, "Killing (postStart)", |e| {
        is_event(e, "Normal", "Killing") && message(e) == "FailedPostStartHook"
    })
    .await?;
    assert_eq!(killing["involvedObject"]["fieldPath"], "spec.containers{main}", "{killing}");
    Ok(())
}

/// postStart success: the hook writes `/tmp/poststart`, which the container's command
/// waits for before it writes `/tmp/main-saw-poststart`; the container runs on without a
/// restart or a `FailedPostStartHook` event.
async fn poststart_runs_in_the_container(agent: &Agent, cri: &Cri) -> Result<()> {
    let name = "poststart-ok";
    let script = format!("until [ -f /tmp/poststart ]; do sleep 1; done; touch /tmp/main-saw-poststart; {SERVE}");
    let hook = "    lifecycle:\n      postStart:\n        exec:\n          command: [\"sh\", \"-c\", \"echo hook > /tmp/poststart\"]\n";
    agent.write_manifest("poststart-ok.yaml", &pod_yaml(name, 2, "", &[container_yaml("main", &script, hook)]))?;
    let p = agent.wait_pod(name, TIMEOUT, |p| running(p, "main")).await?;
    let uid = uid(&p);
    let id = container_id(&p, "main");
    let start = Instant::now();
    while cri.exec(&id, &["cat", "/tmp/main-saw-poststart"]).await?.0 != 0 {
        check_deadline(agent, start, TIMEOUT, || "the container never saw the postStart hook's file".into())?;
        pause().await;
    }
    assert_eq!(exec_ok(cri, &id, &["cat", "/tmp/poststart"]).await?.trim(), "hook");
    let p = agent.pod(name).await?.context("poststart-ok pod gone")?;
    assert_eq!(restarts(&p, "main"), 0);
    assert_eq!(container_id(&p, "main"), id);
    let events = pod_events(agent, &uid).await?;
    assert!(!events.iter().any(|e| e["reason"] == "FailedPostStartHook"), "{}", describe_events(&events));
    Ok(())
}

/// preStop and postStart hooks on one agent (see each scenario's comment). The preStop
/// scenarios write into a directory of the test, mounted as a hostPath.
#[tokio::test]
async fn lifecycle_hooks_run_at_the_right_moments() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup(AgentOptions::default()).await?;
    let markers = swiftlet_tests::agent_tempdir("swiftlet-e2e-hooks-")?;
    tokio::try_join!(
        prestop_runs_before_sigterm(&agent, &cri, markers.path()),
        prestop_is_cut_at_the_grace_period(&agent, &cri, markers.path()),
        poststart_failure_restarts_the_container(&agent),
        poststart_runs_in_the_container(&agent, &cri),
    )?;
    agent.shutdown(&cri).await
}
