//! The CPU and topology managers against real containers (the test bed's containerd, real
//! cgroups). The machine has CPUs 0-1 on one NUMA node; `reservedSystemCPUs: "0"` leaves
//! CPU 1 for exclusive use.
//!
//! - static policy: a Guaranteed container with `cpu: 1` runs on CPU 1 alone; a Burstable
//!   container started before it shrinks to CPU 0 (the reconcile loop's
//!   `UpdateContainerResources`), and grows back to 0-1 once the Guaranteed pod is gone;
//!   the checkpoint holds the assignment and survives a crash of the agent; a restart with
//!   another policy refuses to start.
//! - memory manager `Static`: a Guaranteed container's memory is reserved on NUMA node 0
//!   and its `cpuset.mems` set through CRI; `reservedMemory` that does not add up to node
//!   allocatable's reservation stops the agent with upstream's message.
//! - topology admission: with `single-numa-node` and `restricted`, a Guaranteed pod asking
//!   for more exclusive CPUs than are free has no NUMA hint and is refused with
//!   `TopologyAffinityError`, and with scope `pod` so is a pod of two one-CPU containers
//!   (each would fit alone); a pod that fits is admitted next to it and gets the CPU. Without a topology
//!   policy the CPU manager's own refusal rejects it (`UnexpectedAdmissionError`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

const STATIC: &str = "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerReconcilePeriod: 1s\n";

fn manifest(name: &str, resources: &Value) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", "sleep 3600"], "resources": resources}]
        }
    })
    .to_string()
}

fn guaranteed(cpu: &str) -> Value {
    json!({"requests": {"cpu": cpu, "memory": "32Mi"}, "limits": {"cpu": cpu, "memory": "32Mi"}})
}

fn burstable() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "16Mi"}})
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
}

fn uid(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap_or_default().to_owned()
}

/// The file `file` of the cgroup named `name` (a container id, `pod<uid>`) on the host:
/// under the v1 hierarchy `controller`, or the unified one. Under the systemd driver the
/// same cgroups are `cri-containerd-<id>.scope` and `kubepods-…-pod<uid_>.slice`.
fn cgroup_file(agent: &Agent, controller: &str, name: &str, file: &str) -> Result<PathBuf> {
    fn find(dir: &Path, names: &[String], file: &str) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            if !e.file_type().ok()?.is_dir() {
                continue;
            }
            let here = e.file_name().to_string_lossy().into_owned();
            if names.iter().any(|n| here == *n || (n.starts_with('-') && here.ends_with(n.as_str()))) {
                return Some(e.path().join(file));
            }
            if let Some(p) = find(&e.path(), names, file) {
                return Some(p);
            }
        }
        None
    }
    let names = if agent.systemd_driver() {
        vec![format!("cri-containerd-{name}.scope"), format!("-{}.slice", name.replace('-', "_"))]
    } else {
        vec![name.to_owned()]
    };
    let bases = [agent.cgroup_dir(controller, &agent.cgroup_root).ok(), agent.cgroup_dir("", &agent.cgroup_root).ok()];
    for base in bases.iter().flatten() {
        if let Some(p) = find(base, &names, file).filter(|p| p.exists()) {
            return Ok(p);
        }
    }
    bail!("no {file} for cgroup {name} under {}", agent.cgroup_root)
}

/// The `cpuset.cpus` file of a container's cgroup on the host (cgroup v1 or v2).
fn cpuset_file(agent: &Agent, id: &str) -> Result<PathBuf> {
    cgroup_file(agent, "cpuset", id, "cpuset.cpus")
}

/// The CFS quota of the cgroup `name`: v1 `cpu.cfs_quota_us`, else the first field of v2
/// `cpu.max` (`max` read as -1).
fn cfs_quota(agent: &Agent, name: &str) -> Result<i64> {
    if let Ok(p) = cgroup_file(agent, "cpu", name, "cpu.cfs_quota_us") {
        return Ok(std::fs::read_to_string(p)?.trim().parse()?);
    }
    let max = std::fs::read_to_string(cgroup_file(agent, "cpu", name, "cpu.max")?)?;
    let quota = max.split_whitespace().next().unwrap_or_default();
    Ok(if quota == "max" { -1 } else { quota.parse()? })
}

/// The container of `uid` (its only one).
async fn container_id(cri: &Cri, uid: &str) -> Result<String> {
    let c = cri.containers(uid).await?;
    Ok(c.first().context("pod has no container")?.id.clone())
}

/// What the container runs on: the host's cgroup file and the kernel's view from inside.
async fn cpus(agent: &Agent, cri: &Cri, id: &str) -> Result<(String, String)> {
    let host = std::fs::read_to_string(cpuset_file(agent, id)?)?.trim().to_owned();
    let (code, out) = cri.exec(id, &["sh", "-c", "grep Cpus_allowed_list /proc/self/status"]).await?;
    if code != 0 {
        bail!("exec in {id} failed: {out}");
    }
    let inside = out.split(':').nth(1).unwrap_or_default().trim().to_owned();
    Ok((host, inside))
}

/// Polls until the container runs on `want` (host cgroup and inside agree).
async fn wait_cpus(agent: &Agent, cri: &Cri, id: &str, want: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = cpus(agent, cri, id).await?;
        if got.0 == want && got.1 == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("container {id} runs on {got:?}, want {want}\n{}", tail(&agent.log(), 60));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Linux resources of a container's runtime spec (containerd's verbose status).
async fn runtime_cpu_spec(cri: &Cri, id: &str) -> Result<Value> {
    let status = cri.container_status(id).await?;
    let info: Value = serde_json::from_str(status.info.get("info").context("no verbose info")?)?;
    Ok(info["runtimeSpec"]["linux"]["resources"]["cpu"].clone())
}

async fn start(extra: &str) -> Result<(Agent, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let agent =
        Agent::start(AgentOptions { extra_config: extra.to_owned(), evented_pleg: false, ..AgentOptions::default() })
            .await?;
    Ok((agent, cri))
}

#[tokio::test]
async fn static_policy_pins_guaranteed_containers_and_reconciles_the_shared_pool() -> Result<()> {
    let _g = testbed_lock().await;
    let (mut agent, cri) = start(STATIC).await?;
    let t = Duration::from_mins(1);

    // The Burstable pod starts on the whole shared pool.
    agent.write_manifest("shared.json", &manifest("shared", &burstable()))?;
    let shared = agent.wait_pod("shared", t, running).await?;
    let shared_id = container_id(&cri, &uid(&shared)).await?;
    wait_cpus(&agent, &cri, &shared_id, "0-1").await?;

    // The Guaranteed pod gets CPU 1 to itself; the shared container is moved off it.
    agent.write_manifest("pinned.json", &manifest("pinned", &guaranteed("1")))?;
    let pinned = agent.wait_pod("pinned", t, running).await?;
    assert_eq!(pinned["status"]["qosClass"], "Guaranteed");
    let pinned_uid = uid(&pinned);
    let pinned_container = container_id(&cri, &pinned_uid).await?;
    wait_cpus(&agent, &cri, &pinned_container, "1").await?;
    wait_cpus(&agent, &cri, &shared_id, "0").await?;
    // The runtime was told (CreateContainer, then UpdateContainerResources).
    assert_eq!(runtime_cpu_spec(&cri, &pinned_container).await?["cpus"], "1");
    assert_eq!(runtime_cpu_spec(&cri, &shared_id).await?["cpus"], "0");
    // DisableCPUQuotaWithExclusiveCPUs (on by default): the pinned container and its pod
    // cgroup run without a CFS quota, although the pod limits its CPU.
    assert_eq!(runtime_cpu_spec(&cri, &pinned_container).await?["quota"], -1);
    assert_eq!(cfs_quota(&agent, &pinned_container)?, -1);
    assert_eq!(cfs_quota(&agent, &format!("pod{pinned_uid}"))?, -1);

    // The checkpoint holds the assignment in upstream's format.
    let state: Value = serde_json::from_str(&std::fs::read_to_string(agent.root_dir.join("cpu_manager_state"))?)?;
    assert_eq!(state["policyName"], "static");
    assert_eq!(state["defaultCpuSet"], "0");
    assert_eq!(state["entries"][&pinned_uid]["main"], "1");
    assert!(state["checksum"].as_u64().is_some_and(|c| c > 0), "{state}");
    // /configz shows the configuration as given (the reserved CPU only moves into
    // node allocatable).
    let (_, configz) = agent.get("/configz").await?;
    let configz: Value = serde_json::from_str(&configz)?;
    assert_eq!(configz["kubeletconfig"]["reservedSystemCPUs"], "0");
    assert!(configz["kubeletconfig"].get("systemReserved").is_none(), "{configz}");
    assert_eq!(agent.metric("kubelet_cpu_manager_pinning_requests_total").await? as u64, 1);
    assert_eq!(agent.metric("kubelet_cpu_manager_pinning_errors_total").await? as u64, 0);

    // A crash and a restart keep the assignment: the pinned container is not restarted
    // and stays alone on CPU 1.
    agent.kill9()?;
    agent.spawn().await?;
    agent.wait_pod("pinned", t, running).await?;
    assert_eq!(container_id(&cri, &pinned_uid).await?, pinned_container, "not restarted");
    wait_cpus(&agent, &cri, &pinned_container, "1").await?;
    wait_cpus(&agent, &cri, &shared_id, "0").await?;
    let state: Value = serde_json::from_str(&std::fs::read_to_string(agent.root_dir.join("cpu_manager_state"))?)?;
    assert_eq!(state["entries"][&pinned_uid]["main"], "1", "{state}");

    // Gone: its CPU returns to the shared pool and the shared container grows back.
    agent.remove_manifest("pinned.json")?;
    let deadline = Instant::now() + t;
    while agent.pod("pinned").await?.is_some() {
        if Instant::now() > deadline {
            bail!("pinned pod not removed\n{}", tail(&agent.log(), 60));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_cpus(&agent, &cri, &shared_id, "0-1").await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state: Value = serde_json::from_str(&std::fs::read_to_string(agent.root_dir.join("cpu_manager_state"))?)?;
        if state["defaultCpuSet"] == "0-1" && state["entries"].get(&pinned_uid).is_none() {
            break;
        }
        if Instant::now() > deadline {
            bail!("checkpoint still holds the removed pod: {state}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A restart with another policy finds the static checkpoint and refuses to start.
    agent.stop()?;
    agent.rewrite_config(|c| c.replace("cpuManagerPolicy: static", "cpuManagerPolicy: none"))?;
    let err = agent.spawn().await.expect_err("a checkpoint of another policy must stop the agent").to_string();
    assert!(
        err.contains("configured policy \\\"none\\\" differs from state checkpoint policy \\\"static\\\"")
            || err.contains("configured policy \"none\" differs from state checkpoint policy \"static\""),
        "{err}"
    );
    // Back to static: it starts again and the shared pod keeps running.
    agent.rewrite_config(|c| c.replace("cpuManagerPolicy: none", "cpuManagerPolicy: static"))?;
    agent.spawn().await?;
    agent.wait_pod("shared", t, running).await?;
    agent.shutdown(&cri).await
}

/// Two Guaranteed containers of one exclusive CPU each.
fn two_container_manifest(name: &str) -> String {
    let c = |n: &str| {
        json!({"name": n, "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
               "command": ["sh", "-c", "sleep 3600"], "resources": guaranteed("1")})
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [c("a"), c("b")]}
    })
    .to_string()
}

async fn rejects_with_topology_affinity_error(policy: &str, scope: &str, big: &str) -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) =
        start(&format!("{STATIC}topologyManagerPolicy: {policy}\ntopologyManagerScope: {scope}\n")).await?;
    let t = Duration::from_mins(1);

    // Two exclusive CPUs while one is free: no NUMA node can hold them.
    agent.write_manifest("big.json", big)?;
    let big = agent.wait_pod("big", t, |p| p["status"]["phase"] == "Failed").await?;
    assert_eq!(big["status"]["reason"], "TopologyAffinityError", "{}", big["status"]);
    assert_eq!(big["status"]["message"], "Pod was rejected: Resources cannot be allocated with Topology locality");
    assert!(cri.sandboxes(&uid(&big)).await?.is_empty(), "a rejected pod never runs");

    // One fits, and gets the free CPU.
    agent.write_manifest("small.json", &manifest("small", &guaranteed("1")))?;
    let small = agent.wait_pod("small", t, running).await?;
    let id = container_id(&cri, &uid(&small)).await?;
    wait_cpus(&agent, &cri, &id, "1").await?;
    assert_eq!(agent.metric("kubelet_topology_manager_admission_requests_total").await? as u64, 2);
    assert_eq!(agent.metric("kubelet_topology_manager_admission_errors_total").await? as u64, 1);
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn single_numa_node_rejects_what_does_not_fit_one_node() -> Result<()> {
    rejects_with_topology_affinity_error("single-numa-node", "container", &manifest("big", &guaranteed("2"))).await
}

#[tokio::test]
async fn restricted_rejects_what_has_no_preferred_hint() -> Result<()> {
    rejects_with_topology_affinity_error("restricted", "container", &manifest("big", &guaranteed("2"))).await
}

#[tokio::test]
async fn pod_scope_rejects_a_pod_whose_containers_together_do_not_fit() -> Result<()> {
    // Each container alone would fit; the pod's hint is for both.
    rejects_with_topology_affinity_error("single-numa-node", "pod", &two_container_manifest("big")).await
}

#[tokio::test]
async fn static_memory_policy_reserves_numa_memory_and_checks_reserved_memory() -> Result<()> {
    let _g = testbed_lock().await;
    // The test agent's evictionHard memory.available is 100Mi: reservedMemory must match.
    let config = "memoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 100Mi\n";
    let (mut agent, cri) = start(config).await?;
    let t = Duration::from_mins(1);
    agent.write_manifest("mem.json", &manifest("mem", &guaranteed("500m")))?;
    let p = agent.wait_pod("mem", t, running).await?;
    let id = container_id(&cri, &uid(&p)).await?;
    assert_eq!(runtime_cpu_spec(&cri, &id).await?["mems"], "0");
    let state: Value = serde_json::from_str(&std::fs::read_to_string(agent.root_dir.join("memory_manager_state"))?)?;
    assert_eq!(state["policyName"], "Static");
    let block = &state["entries"][uid(&p)]["main"][0];
    assert_eq!(block["numaAffinity"], json!([0]), "{state}");
    assert_eq!(block["size"], 32 << 20);
    assert_eq!(state["machineState"]["0"]["memoryMap"]["memory"]["reserved"], 32 << 20);
    assert_eq!(state["machineState"]["0"]["memoryMap"]["memory"]["systemReserved"], 100 << 20);

    // A reservation that does not match node allocatable's stops the agent.
    agent.stop()?;
    agent.rewrite_config(|c| c.replace("memory: 100Mi\n", "memory: 200Mi\n"))?;
    let err = agent.spawn().await.expect_err("a wrong reservedMemory must stop the agent").to_string();
    assert!(
        err.contains("is not equal to the value") && err.contains("determined by Node Allocatable feature"),
        "{err}"
    );
    agent.rewrite_config(|c| c.replace("memory: 200Mi\n", "memory: 100Mi\n"))?;
    agent.spawn().await?;
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn without_a_topology_policy_the_cpu_manager_refusal_rejects_the_pod() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = start(STATIC).await?;
    agent.write_manifest("big.json", &manifest("big", &guaranteed("2")))?;
    let big = agent.wait_pod("big", Duration::from_mins(1), |p| p["status"]["phase"] == "Failed").await?;
    assert_eq!(big["status"]["reason"], "UnexpectedAdmissionError", "{}", big["status"]);
    assert_eq!(
        big["status"]["message"],
        "Pod was rejected: Allocate failed due to not enough cpus available to satisfy request: requested=2, available=1, which is unexpected"
    );
    assert_eq!(agent.metric("kubelet_cpu_manager_pinning_errors_total").await? as u64, 1);
    assert_eq!(agent.metric("kubelet_topology_manager_admission_errors_total").await? as u64, 1);
    let state: Value = serde_json::from_str(&std::fs::read_to_string(agent.root_dir.join("cpu_manager_state"))?)?;
    assert_eq!(state["defaultCpuSet"], "0-1", "a refused pod takes nothing: {state}");
    agent.shutdown(&cri).await
}
