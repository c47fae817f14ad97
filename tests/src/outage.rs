//! A kube-apiserver outage of a chosen length under a node joined to the test bed's real
//! control plane: the scenario behind `tests/cluster.rs`'s 60 s test (in CI) and
//! `cargo xtask chaos api-outage` (5 minutes, outside CI).
//!
//! While the API server is away the node's pods must keep running and probing, and the
//! agent must act on its own: a container that dies is restarted, a failing liveness probe
//! restarts its container, a failing readiness probe is noted. Once the API server is
//! back, the Lease is renewed, the node is Ready (no `unreachable` taint left by the node
//! lifecycle controller), every pod's status shows what happened meanwhile, and no pod
//! was evicted or replaced.

use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_cri::v1::ContainerState;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;

use crate::cluster::{Cluster, ClusterNode, busybox_pod as pod, phase, pod_condition};
use crate::{AgentOptions, Cri, cri_endpoint, tail};

const API_SERVER: &str = "kube-apiserver";

/// What the scenario measured.
#[derive(Debug, Clone)]
pub struct OutageFigures {
    /// How long the API server was stopped.
    pub outage: Duration,
    /// Probes the agent ran on one pod while the API server was away.
    pub probes_during: f64,
    /// From the API server's return to the Lease renewed.
    pub lease_renewed_after: Duration,
    /// From the API server's return to the node Ready without an `unreachable` taint.
    pub node_ready_after: Duration,
    /// From the API server's return to every pod's status showing the outage's events.
    pub status_converged_after: Duration,
}

impl fmt::Display for OutageFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "API server away {:.0} s; {} readiness probes run meanwhile on one pod; after its return: \
             Lease renewed in {:.1} s, node Ready and untainted in {:.1} s, every pod status converged in {:.1} s",
            self.outage.as_secs_f64(),
            self.probes_during,
            self.lease_renewed_after.as_secs_f64(),
            self.node_ready_after.as_secs_f64(),
            self.status_converged_after.as_secs_f64()
        )
    }
}

/// A pod whose exec probe of `kind` (`livenessProbe`, `readinessProbe`) reads `file`,
/// which the container creates at start; each probe adds a line to `/tmp/probes`.
fn probed_pod(name: &str, kind: &str, file: &str) -> serde_json::Value {
    let mut p = pod(name, &format!("touch {file}; while true; do sleep 1; done"));
    p["spec"]["containers"][0][kind] = json!({
        "exec": {"command": ["sh", "-c", format!("echo >> /tmp/probes; cat {file}")]},
        "periodSeconds": 2,
        "failureThreshold": 2,
    });
    p
}

fn running_and_ready(p: &Pod) -> bool {
    phase(p) == "Running" && pod_condition(p, "Ready") == Some("True")
}

fn restarts(p: &Pod) -> i32 {
    p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first()).map_or(0, |c| c.restart_count)
}

fn last_terminated(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.last_state.as_ref())
        .is_some_and(|l| l.terminated.is_some())
}

/// The pods of the scenario, their UIDs and the runtime's view of them.
struct Pods {
    ns: String,
    uids: Vec<(&'static str, String)>,
}

impl Pods {
    fn uid(&self, name: &str) -> Result<&str> {
        self.uids.iter().find(|(n, _)| *n == name).map(|(_, u)| u.as_str()).with_context(|| format!("no pod {name}"))
    }
}

/// Runs the scenario with the API server stopped for `outage`, on a node named after
/// `test`; the node leaves afterwards (pods and namespace removed), whatever the outcome.
///
/// # Errors
/// Any check failed (the message says which, with the agent's log).
pub async fn api_server_outage(test: &str, outage: Duration) -> Result<OutageFigures> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join(test, AgentOptions::default()).await?;
    let outcome = run(&mut node, &cri, outage).await;
    if outcome.is_err() && !node.cluster.is_running(API_SERVER)? {
        // Failed while the API server was away: bring it back for the clean-up.
        node.cluster.start_component(API_SERVER).await?;
    }
    let left = node.leave(&cri).await;
    let figures = outcome?;
    left?;
    Ok(figures)
}

/// The running container of the pod `uid`.
async fn running_container(cri: &Cri, uid: &str) -> Result<String> {
    cri.containers(uid)
        .await?
        .into_iter()
        .find(|c| c.state == ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
        .with_context(|| format!("no running container in pod {uid}"))
}

/// Waits (while the API server is away) until the runtime shows the pod's container
/// replaced: two containers, one running.
async fn wait_replaced(node: &ClusterNode, cri: &Cri, uid: &str, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cs = cri.containers(uid).await?;
        let running = cs.iter().filter(|c| c.state == ContainerState::ContainerRunning as i32).count();
        if cs.len() == 2 && running == 1 {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{what}: not restarted by the agent alone\n{}", tail(&node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How often the probe of the pod `uid` ran: its probe command appends a line to
/// `/tmp/probes` (read through the runtime: while the API server is away the agent's own
/// `/metrics/probes` cannot authorize a scrape, as upstream's webhook authorizer).
async fn probes_run(cri: &Cri, uid: &str) -> Result<f64> {
    let id = running_container(cri, uid).await?;
    let (code, out) = cri.exec(&id, &["sh", "-c", "cat /tmp/probes 2>/dev/null | wc -l"]).await?;
    ensure!(code == 0, "counting probes: exit {code}: {out}");
    Ok(out.trim().parse()?)
}

async fn lease_renew_time(node: &ClusterNode) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(node.cluster.client(), "kube-node-lease").get(&node.name).await?;
    Ok(lease.spec.and_then(|s| s.renew_time).map(|t| format!("{t:?}")))
}

async fn run(node: &mut ClusterNode, cri: &Cri, outage: Duration) -> Result<OutageFigures> {
    let ns = node.namespace("outage").await?;
    let mut crasher = pod("crasher", "");
    // `wait` lets the TERM trap run at once (a foreground sleep would hold it back).
    crasher["spec"]["containers"][0]["command"] = json!(["sh", "-c", "trap 'exit 1' TERM; sleep 1000 & wait"]);
    let specs = [
        ("survivor", pod("survivor", "while true; do sleep 1; done")),
        ("crasher", crasher),
        ("prober", probed_pod("prober", "livenessProbe", "/tmp/healthy")),
        ("unready", probed_pod("unready", "readinessProbe", "/tmp/ready")),
    ];
    let mut uids = Vec::new();
    for (name, spec) in specs {
        let created = node.create_pod(&ns, spec).await?;
        uids.push((name, created.metadata.uid.context("uid")?));
    }
    let pods = Pods { ns, uids };
    for (name, _) in &pods.uids {
        node.eventually_pod(&pods.ns, name, Duration::from_mins(1), "pod running and ready", running_and_ready).await?;
    }
    let survivor = running_container(cri, pods.uid("survivor")?).await?;
    let lease_before = lease_renew_time(node).await?;

    node.cluster.stop_component(API_SERVER)?;
    let stopped = Instant::now();
    let probes_before = probes_run(cri, pods.uid("unready")?).await?;
    // A container dies: the agent restarts it alone.
    let crasher = running_container(cri, pods.uid("crasher")?).await?;
    cri.exec(&crasher, &["sh", "-c", "kill 1"]).await?;
    wait_replaced(node, cri, pods.uid("crasher")?, "the killed container").await?;
    // A liveness probe starts failing: the agent restarts the container alone.
    let prober = running_container(cri, pods.uid("prober")?).await?;
    cri.exec(&prober, &["rm", "/tmp/healthy"]).await?;
    wait_replaced(node, cri, pods.uid("prober")?, "the container failing its liveness probe").await?;
    // A readiness probe starts failing: noted, reported once the API server is back.
    let unready = running_container(cri, pods.uid("unready")?).await?;
    cri.exec(&unready, &["rm", "/tmp/ready"]).await?;
    // The rest of the outage: the agent stays healthy, the other pods run untouched.
    while stopped.elapsed() < outage {
        let (code, body) = node.agent.healthz().await?;
        ensure!(code == 200, "healthz {code} during the outage: {body}");
        ensure!(
            running_container(cri, pods.uid("survivor")?).await? == survivor,
            "the survivor's container was replaced during the outage"
        );
        tokio::time::sleep(outage.saturating_sub(stopped.elapsed()).min(Duration::from_secs(10))).await;
    }
    let probes_during = probes_run(cri, pods.uid("unready")?).await? - probes_before;
    // One probe every 2 s.
    let expected = outage.as_secs_f64() / 2.0;
    ensure!(
        probes_during >= expected * 0.9,
        "{probes_during} readiness probes in a {outage:?} outage (one every 2 s expected)"
    );
    node.cluster.start_component(API_SERVER).await?;
    let back = Instant::now();

    let deadline = back + Duration::from_mins(1);
    while lease_renew_time(node).await.ok().flatten() == lease_before {
        ensure!(Instant::now() < deadline, "Lease not renewed a minute after the API server's return");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lease_renewed_after = back.elapsed();

    let deadline = back + Duration::from_mins(2);
    loop {
        let ready = node.wait_ready(deadline.saturating_duration_since(Instant::now())).await?;
        let tainted = ready
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" || t.key == "node.kubernetes.io/not-ready");
        if !tainted {
            break;
        }
        ensure!(Instant::now() < deadline, "the node kept the node lifecycle controller's taint");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let node_ready_after = back.elapsed();

    let converge = Duration::from_mins(1);
    let restarted_once = |p: &Pod| running_and_ready(p) && restarts(p) == 1 && last_terminated(p);
    node.eventually_pod(&pods.ns, "crasher", converge, "the restart during the outage reported", restarted_once)
        .await?;
    node.eventually_pod(&pods.ns, "prober", converge, "the liveness restart reported", restarted_once).await?;
    node.eventually_pod(&pods.ns, "unready", converge, "the failing readiness reported", |p| {
        phase(p) == "Running" && pod_condition(p, "Ready") == Some("False") && restarts(p) == 0
    })
    .await?;
    node.eventually_pod(&pods.ns, "survivor", converge, "the survivor untouched", |p| {
        running_and_ready(p) && restarts(p) == 0
    })
    .await?;
    let status_converged_after = back.elapsed();

    // Nothing was evicted or replaced: the same pods, none terminating.
    let api = Api::<Pod>::namespaced(node.cluster.client(), &pods.ns);
    for (name, uid) in &pods.uids {
        let p = api.get(name).await?;
        ensure!(p.metadata.uid.as_deref() == Some(uid.as_str()), "pod {name} was replaced");
        ensure!(p.metadata.deletion_timestamp.is_none(), "pod {name} is being deleted after the outage");
    }
    Ok(OutageFigures {
        outage: back.duration_since(stopped),
        probes_during,
        lease_renewed_after,
        node_ready_after,
        status_converged_after,
    })
}
