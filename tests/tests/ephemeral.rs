//! End-to-end tests of ephemeral containers (`kubectl debug`): a real `swiftlet` joined to
//! the test bed's real control plane; debuggers are added as kubectl adds them (a
//! strategic merge patch of the `ephemeralcontainers` subresource) and run in the test
//! bed's containerd; their logs, exec and attach go through the API server with kubectl. A debugger with `targetContainerName` shares its
//! target's pid namespace: its `/proc/1` is the target's main process.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use swiftlet_tests::cluster::TestNode as Bed;
use swiftlet_tests::{Agent, AgentOptions, Cri, testbed_lock};

const BUSYBOX: &str = "localhost/busybox:latest";
/// Part of the target's command line, so that a debugger can tell it sees the target.
const MARKER: &str = "marker-31415";

/// A container that idles until SIGTERM, its command line carrying [`MARKER`].
fn idler(name: &str) -> Value {
    json!({
        "name": name,
        "image": BUSYBOX,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", format!("trap 'exit 0' TERM; while true; do sleep 1; done # {MARKER}")],
    })
}

fn pod(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["terminationGracePeriodSeconds"] = json!(2);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

/// What `kubectl debug` sends: a strategic merge patch of the `ephemeralcontainers`
/// subresource adding `debugger`.
async fn debug(bed: &Bed, pod: &str, debugger: Value) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(bed.cluster.client(), &bed.ns);
    let patch = json!({"spec": {"ephemeralContainers": [debugger]}});
    Ok(pods.patch_subresource("ephemeralcontainers", pod, &PatchParams::default(), &Patch::Strategic(patch)).await?)
}

/// A debugger running `script` in busybox, in `target`'s pid namespace if given.
fn debugger(name: &str, target: Option<&str>, script: &str) -> Value {
    let mut d = json!({
        "name": name,
        "image": BUSYBOX,
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePolicy": "File",
        "command": ["sh", "-c", script],
    });
    if let Some(t) = target {
        d["targetContainerName"] = json!(t);
    }
    d
}

fn status_of(p: &Pod, list: &str, name: &str) -> Option<Value> {
    let status = serde_json::to_value(p.status.as_ref()?).ok()?;
    status[list].as_array()?.iter().find(|c| c["name"] == name).cloned()
}

fn ephemeral(p: &Pod, name: &str) -> Option<Value> {
    status_of(p, "ephemeralContainerStatuses", name)
}

fn running(c: Option<&Value>) -> bool {
    c.is_some_and(|c| !c["state"]["running"].is_null())
}

fn condition(p: &Pod, type_: &str) -> Option<String> {
    let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)?;
    Some(c.status.clone())
}

/// Polls until `check` holds for the API pod, with the pod's status and the agent's log
/// on failure.
async fn eventually(bed: &Bed, name: &str, what: &str, check: impl Fn(&Pod) -> bool) -> Result<Pod> {
    bed.eventually(name, Duration::from_mins(1), what, check).await
}

/// Polls `/metrics` until `series` is `want` (gauges follow the API's watch).
async fn metric_is(agent: &Agent, series: &str, want: f64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = agent.metric(series).await?;
        if (got - want).abs() < 0.5 {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{series} is {got}, not {want}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The runtime's containers of pod `uid` named `name`.
async fn containers_named(cri: &Cri, uid: &str, name: &str) -> Result<Vec<k8s_cri::v1::Container>> {
    Ok(cri.containers(uid).await?.into_iter().filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name)).collect())
}

/// Deletes the API pod and waits until the agent has terminated it and the API server
/// removed it; then nothing of it may run.
async fn delete_and_check_stopped(bed: &Bed, name: &str, uid: &str) -> Result<()> {
    bed.delete(name).await?;
    let left: Vec<String> = bed
        .cri
        .containers(uid)
        .await?
        .into_iter()
        .filter(|c| c.state == 1)
        .filter_map(|c| c.metadata.map(|m| m.name))
        .collect();
    ensure!(left.is_empty(), "still running after the pod's deletion: {left:?}");
    Ok(())
}

/// A debugger in the target's pid namespace sees its processes, its logs are served, it
/// exits and is never started again; a second one without a target has its own pid
/// namespace, answers exec and attach; both go with the pod.
#[tokio::test]
async fn a_debugger_sees_its_target_runs_once_and_goes_with_the_pod() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("debug", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let created = bed.create(pod("dbg", json!({"containers": [idler("app")]}))).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    eventually(&bed, "dbg", "app running", |p| running(status_of(p, "containerStatuses", "app").as_ref())).await?;

    // In the target's pid namespace: pid 1 is the app's shell, and ps lists it.
    let script = "echo \"pid1=$(tr '\\0' ' ' < /proc/1/cmdline)\"; ps; echo ps-done";
    let patched = debug(&bed, "dbg", debugger("debug-ps", Some("app"), script)).await?;
    assert_eq!(patched.metadata.generation, Some(2));
    let p = eventually(&bed, "dbg", "debug-ps ran to completion", |p| {
        ephemeral(p, "debug-ps").is_some_and(|c| c["state"]["terminated"]["exitCode"] == 0)
    })
    .await?;
    let d = ephemeral(&p, "debug-ps").context("status")?;
    assert_eq!(d["state"]["terminated"]["reason"], "Completed", "{d}");
    assert!(d["containerID"].as_str().is_some_and(|id| id.starts_with("containerd://")), "{d}");
    assert_eq!(
        (d["ready"].as_bool(), d["restartCount"].as_i64(), d.get("started")),
        (Some(false), Some(0), None),
        "{d}"
    );
    assert!(["image", "imageID"].iter().all(|f| d[f].as_str().is_some_and(|i| !i.is_empty())), "{d}");
    // The debugger neither made the pod unready nor changed its phase.
    assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
    assert_eq!(condition(&p, "Ready").as_deref(), Some("True"));

    let logs = bed.kubectl(&["logs", "dbg", "-c", "debug-ps"])?;
    let pid1 = logs.lines().find_map(|l| l.strip_prefix("pid1=")).context(logs.clone())?;
    assert!(pid1.starts_with("sh -c trap") && pid1.contains(MARKER), "pid 1 is not the target's: {logs}");
    assert!(logs.lines().any(|l| l.contains(MARKER) && l.trim_start().starts_with("1 ")), "ps shows no target: {logs}");
    assert!(logs.contains("ps-done"), "{logs}");

    // A second debugger, without a target, that echoes its stdin: its own pid namespace.
    let own = "echo \"own-pid1=$(tr '\\0' ' ' < /proc/1/cmdline)\"; while read l; do echo \"got $l\"; done";
    let mut echo = debugger("debug-sh", None, own);
    echo["stdin"] = json!(true);
    debug(&bed, "dbg", echo).await?;
    let p = eventually(&bed, "dbg", "debug-sh running", |p| running(ephemeral(p, "debug-sh").as_ref())).await?;
    // The sync that started it left the exited debugger alone, as every later one will.
    let d = ephemeral(&p, "debug-ps").context("status")?;
    assert!(!d["state"]["terminated"].is_null() && d["restartCount"] == 0, "{d}");
    assert_eq!(containers_named(cri, &uid, "debug-ps").await?.len(), 1, "debug-ps was started again");
    assert_eq!(containers_named(cri, &uid, "debug-sh").await?.len(), 1);
    let logs = bed.kubectl(&["logs", "dbg", "-c", "debug-sh"])?;
    assert!(logs.starts_with("own-pid1=sh -c echo") && !logs.contains(MARKER), "{logs}");

    // Exec and attach find it by name, as any container.
    let out = bed.kubectl(&["exec", "dbg", "-c", "debug-sh", "--", "echo", "exec-ok"])?;
    assert_eq!(out, "exec-ok\n");
    bed.cluster.attach_and_expect(&["-n", &bed.ns, "dbg", "-c", "debug-sh"], "ping", "got ping").await?;

    metric_is(agent, "kubelet_started_containers_total{container_type=\"ephemeral_container\"}", 2.0).await?;
    metric_is(agent, "kubelet_managed_ephemeral_containers", 2.0).await?;

    delete_and_check_stopped(&bed, "dbg", &uid).await?;
    metric_is(agent, "kubelet_managed_ephemeral_containers", 0.0).await?;
    bed.leave().await
}

/// A debugger starts while the pod's init container keeps failing (upstream starts them
/// first), and one whose target has stopped is refused by the runtime and tried again at
/// each sync, as upstream: nothing is created, the status says why.
#[tokio::test]
async fn debuggers_start_during_failing_init_and_wait_for_a_running_target() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("debug-init", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let failing_init = json!({"name": "init", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                              "command": ["sh", "-c", "exit 1"]});
    let created =
        bed.create(pod("stuck", json!({"initContainers": [failing_init], "containers": [idler("app")]}))).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    eventually(&bed, "stuck", "init failed once", |p| {
        status_of(p, "initContainerStatuses", "init").is_some_and(|c| c["restartCount"].as_i64() >= Some(1))
    })
    .await?;
    debug(&bed, "stuck", debugger("debug", None, "trap 'exit 0' TERM; while true; do sleep 1; done")).await?;
    let p = eventually(&bed, "stuck", "debugger running", |p| running(ephemeral(p, "debug").as_ref())).await?;
    assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));
    assert!(status_of(&p, "containerStatuses", "app").is_some_and(|c| c["state"]["running"].is_null()));
    delete_and_check_stopped(&bed, "stuck", &uid).await?;

    // A target that ran and exited (restartPolicy Never; the pod runs on with `app`).
    let short = json!({"name": "short", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": ["true"]});
    let spec = json!({"restartPolicy": "Never", "containers": [idler("app"), short]});
    let created = bed.create(pod("gone", spec)).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    eventually(&bed, "gone", "short exited", |p| {
        status_of(p, "containerStatuses", "short").is_some_and(|c| !c["state"]["terminated"].is_null())
    })
    .await?;
    debug(&bed, "gone", debugger("debug", Some("short"), "ps")).await?;
    let p = eventually(&bed, "gone", "debugger refused", |p| {
        ephemeral(p, "debug").is_some_and(|c| c["state"]["waiting"]["reason"] == "CreateContainerError")
    })
    .await?;
    let d = ephemeral(&p, "debug").context("status")?;
    assert!(d["state"]["waiting"]["message"].as_str().is_some_and(|m| m.contains("not running")), "{d}");
    assert!(containers_named(cri, &uid, "debug").await?.is_empty());
    let errors = agent.metric_sum("kubelet_started_containers_errors_total", "code=\"CreateContainerError\"").await?;
    assert!(errors >= 1.0, "{errors}");
    assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
    delete_and_check_stopped(&bed, "gone", &uid).await?;
    bed.leave().await
}
