//! Graceful node shutdown with real containers, on a node joined to the test bed's real
//! control plane (`swiftlet_tests::cluster`): the agent talks to a logind stand-in on a
//! private system bus (`swiftlet_tests::logind`). It takes the `delay` inhibitor lock at
//! start (after raising logind's too short `InhibitDelayMaxUSec` through its drop-in and
//! a reload); on `PrepareForShutdown(true)` the node turns not ready, new pods are
//! rejected, regular pods are terminated first and critical ones after, each within its
//! group's period, with upstream's pod status; then the lock is released. A cancellation
//! takes the lock again and the node admits pods again.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};
use swiftlet_tests::cluster::{Cluster, ClusterNode};
use swiftlet_tests::logind::Logind;
use swiftlet_tests::{AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

/// Regular pods get 8 − 4 = 4 s, critical pods 4 s.
const CONFIG: &str = "shutdownGracePeriod: 8s\nshutdownGracePeriodCriticalPods: 4s\n";
/// Ignores SIGTERM: the container stops only when its grace period is over.
const STUBBORN: &str = "trap '' TERM; while true; do sleep 1; done";

fn pod(name: &str, critical: bool) -> Value {
    let mut spec = json!({
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", STUBBORN]}]
    });
    if critical {
        // The real API server's Priority admission resolves the class to its value
        // (2000001000); a pod may state the value only if it is that one.
        spec["priorityClassName"] = json!("system-node-critical");
        spec["priority"] = json!(2_000_001_000);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn main_state(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    p.status.as_ref()?.container_statuses.as_ref()?.first()?.state.as_ref()
}

fn finished_at(p: &Pod) -> Option<jiff::Timestamp> {
    main_state(p)?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0)
}

fn running(p: &Pod) -> bool {
    main_state(p).is_some_and(|s| s.running.is_some())
}

/// The node's `Ready` condition: (status, reason, message).
async fn ready(node: &ClusterNode) -> Result<Option<(String, String, String)>> {
    let Some(n) = node.node().await? else { return Ok(None) };
    let c = n.status.and_then(|s| s.conditions).and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"));
    Ok(c.map(|c| (c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default())))
}

async fn wait_ready(
    node: &ClusterNode,
    timeout: Duration,
    pred: impl Fn(&(String, String, String)) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let now = ready(node).await?;
        if now.as_ref().is_some_and(&pred) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "node Ready condition is {now:?} after {timeout:?}\n{}",
            tail(&node.agent.log(), 40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_pod(node: &ClusterNode, ns: &str, name: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Result<Pod> {
    node.eventually_pod(ns, name, Duration::from_mins(1), &format!("{name}: {what}"), pred).await
}

/// Waits for a `NodeShutdown` event on the node with `message`. The agent records Node
/// events in the `default` namespace (a Node has none), as upstream's recorder does.
async fn wait_node_event(cluster: &Cluster, node: &str, message: &str) -> Result<()> {
    let events = Api::<Event>::namespaced(cluster.client(), "default");
    let selector = format!("involvedObject.name={node}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<(String, String, String)> = events
            .list(&ListParams::default().fields(&selector))
            .await?
            .items
            .into_iter()
            .map(|e| {
                (
                    e.involved_object.kind.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect();
        if found.iter().any(|(k, r, m)| k == "Node" && r == "NodeShutdown" && m == message) {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "no NodeShutdown event {message:?} on node {node}: {found:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn seconds_between(a: jiff::Timestamp, b: jiff::Timestamp) -> f64 {
    (b.as_millisecond() - a.as_millisecond()) as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_terminates_regular_then_critical_pods_and_releases_the_inhibitor_lock() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    // logind allows 5 s: less than the 8 s the agent needs.
    let logind = Logind::start(Duration::from_secs(5)).await?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster
        .join(
            "shutdown",
            AgentOptions { extra_config: CONFIG.into(), env: logind.agent_env(), ..AgentOptions::default() },
        )
        .await?;
    let ns = node.namespace("shutdown").await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let (node, agent) = (&node, &node.agent);
        let pods = Api::<Pod>::namespaced(cluster.client(), &ns);
        // At start: the drop-in, the reload, the lock.
        let locks = logind
            .wait_inhibitors(Duration::from_secs(20), "the agent's lock", |i| i.len() == 1)
            .await
            .with_context(|| tail(&agent.log(), 30))?;
        let lock = &locks[0];
        assert_eq!((lock.what.as_str(), lock.who.as_str(), lock.mode.as_str()), ("shutdown", "kubelet", "delay"));
        assert_eq!(lock.released, None);
        let drop_in = std::fs::read_to_string(logind.conf_dir().join("99-kubelet.conf"))?;
        assert_eq!(drop_in, "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=8\n");
        assert_eq!((logind.reloads(), logind.inhibit_delay()), (1, Duration::from_secs(8)));

        wait_ready(node, Duration::from_mins(1), |(s, _, _)| s == "True").await?;
        node.create_pod(&ns, pod("regular", false)).await?;
        let critical = node.create_pod(&ns, pod("critical", true)).await?;
        assert_eq!(critical.spec.as_ref().and_then(|s| s.priority), Some(2_000_001_000));
        for name in ["regular", "critical"] {
            wait_pod(node, &ns, name, "running", running).await?;
        }

        let t0 = jiff::Timestamp::now();
        let t0_instant = Instant::now();
        logind.prepare_for_shutdown(true).await?;

        // The node reports it at once (not at the next 10 s status update).
        wait_ready(node, Duration::from_secs(5), |(s, r, m)| {
            s == "False" && r == "KubeletNotReady" && m == "node is shutting down"
        })
        .await?;
        wait_node_event(&cluster, &node.name, "Shutdown manager detected shutdown event").await?;
        // A pod arriving now is rejected.
        node.create_pod(&ns, pod("late", false)).await?;
        let late = wait_pod(node, &ns, "late", "rejected", |p| {
            p.status.as_ref().is_some_and(|s| s.phase.as_deref() == Some("Failed"))
        })
        .await?;
        let status = late.status.context("status")?;
        assert_eq!(status.reason.as_deref(), Some("NodeShutdown"));
        assert_eq!(status.message.as_deref(), Some("Pod was rejected: Pod was rejected as the node is shutting down."));

        // Both terminated, with upstream's status.
        let mut finished = Vec::new();
        for name in ["regular", "critical"] {
            let p = wait_pod(node, &ns, name, "terminated for the shutdown", |p| {
                finished_at(p).is_some() && p.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some("Terminated"))
            })
            .await?;
            let s = p.status.as_ref().context("status")?;
            assert_eq!(s.phase.as_deref(), Some("Failed"), "{name}");
            assert_eq!(s.message.as_deref(), Some("Pod was terminated in response to imminent node shutdown."));
            let c = s
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "DisruptionTarget")
                .with_context(|| format!("{name}: no DisruptionTarget condition: {:?}", s.conditions))?;
            assert_eq!(c.status, "True");
            assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
            assert_eq!(c.message.as_deref(), Some("Pod was terminated in response to imminent node shutdown."));
            finished.push(finished_at(&p).context("finishedAt")?);
        }
        // Times in the API have whole seconds: one second of slack each way.
        let (regular, critical) = (seconds_between(t0, finished[0]), seconds_between(t0, finished[1]));
        ensure!(
            (3.0..=7.0).contains(&regular),
            "the regular pod stopped {regular}s after the shutdown began (its 4 s grace period)"
        );
        ensure!(
            critical - regular >= 3.0,
            "the critical pod stopped {critical}s after the shutdown began, only {}s after the regular one: \
             it must be terminated once the regular group is done, and ignore SIGTERM for its 4 s",
            critical - regular
        );
        ensure!(critical <= 12.0, "the critical pod stopped {critical}s after the shutdown began (8 s in all)");

        // Then the lock goes.
        let locks = logind
            .wait_inhibitors(Duration::from_secs(20), "the lock's release", |i| i[0].released.is_some())
            .await
            .with_context(|| tail(&agent.log(), 30))?;
        let released = locks[0].released.context("released")?.duration_since(t0_instant).as_secs_f64();
        ensure!(
            released + 1.0 >= critical,
            "lock released {released}s in, before the critical pod stopped ({critical}s)"
        );
        ensure!(released <= 15.0, "lock released {released}s after the shutdown began");
        eprintln!("shutdown: regular stopped at {regular}s, critical at {critical}s, lock released at {released:.2}s");

        // The state file and the metrics.
        let state: Value =
            serde_json::from_str(&std::fs::read_to_string(agent.root_dir.join("graceful_node_shutdown_state"))?)?;
        let start: jiff::Timestamp = state["startTime"].as_str().context("startTime")?.parse()?;
        let end: jiff::Timestamp = state["endTime"].as_str().context("endTime")?.parse()?;
        ensure!(seconds_between(t0, start).abs() < 2.0 && end > start, "state file: {state}");
        let started = agent.metric("kubelet_graceful_shutdown_start_time_seconds").await?;
        let ended = agent.metric("kubelet_graceful_shutdown_end_time_seconds").await?;
        let t0_seconds = t0.as_second() as f64;
        ensure!(
            (started - t0_seconds).abs() <= 2.0 && ended >= started,
            "metrics: start {started}, end {ended}, shutdown began at {t0_seconds}"
        );
        assert_eq!(ready(node).await?.map(|r| r.2).as_deref(), Some("node is shutting down"));
        // The pods stay, terminal, in the API (the kubelet does not delete them).
        for name in ["regular", "critical", "late"] {
            let p = pods.get(name).await?;
            assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Failed"), "{name}");
        }

        // Cancelled: a new lock, ready again, pods admitted again.
        logind.prepare_for_shutdown(false).await?;
        let locks = logind
            .wait_inhibitors(Duration::from_secs(10), "a new lock", |i| i.len() == 2 && i[1].released.is_none())
            .await?;
        assert_eq!(locks[1].mode, "delay");
        wait_node_event(&cluster, &node.name, "Shutdown manager detected shutdown cancellation").await?;
        wait_ready(node, Duration::from_secs(30), |(s, _, _)| s == "True").await?;
        node.create_pod(&ns, pod("after", false)).await?;
        wait_pod(node, &ns, "after", "running after the cancellation", running).await?;
        anyhow::Ok(())
    }))
    .await;
    // Whatever the outcome: the pods go at once (`late` and `after` ignore SIGTERM for
    // their 30 s), the namespace goes, the agent stops, the node is deleted.
    let pods = Api::<Pod>::namespaced(cluster.client(), &ns);
    for name in ["regular", "critical", "late", "after"] {
        let _ = pods.delete(name, &DeleteParams::default().grace_period(0)).await;
    }
    let left = node.leave(&cri).await;
    match outcome {
        Ok(result) => result.and(left),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Without a system bus the agent logs upstream's error and runs on without the feature:
/// it still serves, and its node is Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_system_bus_the_agent_runs_on_and_says_why() -> Result<()> {
    let _g = testbed_lock().await;
    ensure!(
        swiftlet_tests::node::node_target()?.is_none(),
        "under the systemd cgroup driver (the node container) the agent needs the system bus to start, as upstream's: \
         this test is the host's (cgroupfs)"
    );
    let cri = Cri::connect(&cri_endpoint()?)?;
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("no_bus_here");
    let cluster = Cluster::connect().await?;
    let node = cluster
        .join(
            "no-bus",
            AgentOptions {
                extra_config: CONFIG.into(),
                env: vec![("DBUS_SYSTEM_BUS_ADDRESS".into(), format!("unix:path={}", missing.display()))],
                ..AgentOptions::default()
            },
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = node.agent.log();
        if log.contains("Failed to start node shutdown manager") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let line = log.lines().find(|l| l.contains("Failed to start node shutdown manager")).map(str::to_owned);
    let healthy = node.agent.healthz().await;
    let ready = ready(&node).await;
    node.leave(&cri).await?;
    let line = line.with_context(|| format!("no start failure logged:\n{}", tail(&log, 30)))?;
    ensure!(line.contains(&missing.display().to_string()), "the message names the bus address: {line}");
    ensure!(healthy.is_ok_and(|(code, _)| code == 200), "the agent still serves /healthz");
    let ready = ready?;
    ensure!(ready.as_ref().is_some_and(|(s, _, _)| s == "True"), "the node is Ready: {ready:?}");
    Ok(())
}
