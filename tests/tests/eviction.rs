//! Node-pressure eviction with real memory: the pods cgroup is made small (a memory limit
//! on `kubepods`), `evictionHard` `allocatableMemory.available` fits inside it, and a
//! `BestEffort` pod allocates steadily. The agent must evict it — on the kernel's memcg
//! threshold signal, before the kernel's OOM killer acts — and leave the Guaranteed pod
//! beside it alone.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use swiftlet_tests::apiserver::{Options, TestApiServer};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, testbed_lock};

const MIB: u64 = 1024 * 1024;

/// A pod with a memory-backed emptyDir at `/mem` (tmpfs: what is written there is
/// charged to the pod's memory cgroup, like anonymous memory).
fn pod(name: &str, script: &str, resources: &serde_json::Value) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "e2e-node",
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}}],
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", script], "resources": resources,
                            "volumeMounts": [{"name": "mem", "mountPath": "/mem"}]}]
        }
    }))?)
}

fn main_state(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    p.status.as_ref()?.container_statuses.as_ref()?.first()?.state.as_ref()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_evicted_before_the_oom_killer_and_the_guaranteed_pod_stays() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    // The pods cgroup, limited to 400 MiB before the agent starts (its threshold watcher
    // reads the limit).
    let cgroup_root = format!("/swiftlet-e2e-{}", std::process::id());
    let kubepods = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory{cgroup_root}/kubepods"));
    std::fs::create_dir_all(&kubepods)?;
    std::fs::write(kubepods.join("memory.limit_in_bytes"), (400 * MIB).to_string())?;
    let api = TestApiServer::start(Options::default()).await?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        extra_config: "evictionHard:\n  allocatableMemory.available: 150Mi\nevictionPressureTransitionPeriod: 30s\n"
            .into(),
        ..AgentOptions::default()
    })
    .await?;
    assert_eq!(agent.cgroup_root, cgroup_root);

    // Whatever happens, the pods go and the agent stops (a hog left running would
    // disturb every later test).
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let steady = "trap 'exit 0' TERM; while true; do sleep 1; done";
        let guaranteed =
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}});
        api.create(&pod("guaranteed", steady, &guaranteed)?)?;
        let running = |p: &Pod| main_state(p).is_some_and(|s| s.running.is_some());
        api.wait_for::<Pod>(Some("default"), "guaranteed", Duration::from_mins(1), |p| p.is_some_and(running)).await?;

        // 8 MiB of tmpfs every 0.2 s, charged to the pod: it would reach the 400 MiB limit
        // (the kernel's OOM kill) about 7 s after crossing the eviction threshold.
        let hog =
            "i=0; while true; do dd if=/dev/zero of=/mem/f$i bs=1M count=8 2>/dev/null; i=$((i+1)); sleep 0.2; done";
        api.create(&pod("hog", hog, &json!({}))?)?;
        let evicted = api
            .wait_for::<Pod>(Some("default"), "hog", Duration::from_mins(2), |p| {
                p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
            })
            .await
            .map_err(|e| {
                let hog = api.get::<Pod>(Some("default"), "hog").and_then(|p| p.status);
                anyhow::anyhow!("hog not evicted: {e}\nstatus: {hog:?}\n{}", swiftlet_tests::tail(&agent.log(), 40))
            })?
            .expect("present");
        let status = evicted.status.clone().unwrap_or_default();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let message = status.message.clone().unwrap_or_default();
        assert!(message.starts_with("The node was low on resource: memory. Threshold quantity: 150Mi"), "{message}");
        assert!(message.contains("Container main was using"), "{message}");
        // The kernel never had to kill: no OOMKilled anywhere.
        let terminated_reason = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .or(c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))
                })
                .and_then(|t| t.reason.clone())
                .unwrap_or_default()
        };
        assert_ne!(terminated_reason(&evicted), "OOMKilled", "{status:?}");
        let g = api.get::<Pod>(Some("default"), "guaranteed").expect("guaranteed pod");
        assert!(running(&g), "the Guaranteed pod still runs: {:?}", g.status);
        let restarts = g
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map_or(0, |c| c.restart_count);
        assert_eq!(restarts, 0);
        // Counted once the kill is done.
        let counted = "kubelet_evictions{eviction_signal=\"allocatableMemory.available\"} 1";
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (_, text) = agent.get("/metrics").await?;
            if text.lines().any(|l| l == counted) {
                break;
            }
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("kubelet_evictions")).collect();
            anyhow::ensure!(std::time::Instant::now() < deadline, "no {counted}: {lines:#?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The kernel's signal, not the 10 s pass, decided.
        let kernel_decisions = agent
            .metric("swiftlet_eviction_signal_to_decision_seconds_count{source=\"memcg_threshold\"}")
            .await
            .unwrap_or(0.0)
            + agent.metric("swiftlet_eviction_signal_to_decision_seconds_count{source=\"psi\"}").await.unwrap_or(0.0)
            + agent
                .metric("swiftlet_eviction_signal_to_decision_seconds_count{source=\"ebpf_reclaim\"}")
                .await
                .unwrap_or(0.0);
        assert!(
            kernel_decisions >= 1.0,
            "no eviction decided on a kernel signal\n{}",
            swiftlet_tests::tail(&agent.log(), 40)
        );
        let events: Vec<(String, String)> = api
            .list::<k8s_openapi::api::core::v1::Event>(Some("default"))
            .into_iter()
            .map(|e| (e.involved_object.name.unwrap_or_default(), e.reason.unwrap_or_default()))
            .collect();
        assert!(events.iter().any(|(n, r)| n == "hog" && r == "Evicted"), "{events:?}");
        anyhow::Ok(())
    }))
    .await;
    for name in ["guaranteed", "hog"] {
        let _ = api.delete::<Pod>(Some("default"), name, Some(0));
    }
    let stopped = agent.shutdown(&cri).await;
    match outcome {
        Ok(result) => result.and(stopped),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// PID pressure: `pid.available` (`pid_max` − running processes) set just below what
/// the node has free now, and a pod that forks 300 sleepers (bounded by podPidsLimit):
/// that pod is evicted, the Guaranteed pod beside it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_loop_is_evicted_under_pid_pressure() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let api = TestApiServer::start(Options::default()).await?;
    // What the node has free, as the agent counts it (a first agent, without thresholds).
    let probe = Agent::start(AgentOptions::default()).await?;
    let (_, summary) = probe.get("/stats/summary").await?;
    probe.shutdown(&cri).await?;
    let summary: serde_json::Value = serde_json::from_str(&summary)?;
    let rlimit = &summary["node"]["rlimit"];
    let (max, cur) = (rlimit["maxpid"].as_i64().unwrap_or(0), rlimit["curproc"].as_i64().unwrap_or(0));
    anyhow::ensure!(max > 0 && cur > 0, "no rlimit stats: {rlimit}");
    // Pressure once 150 more processes run than now.
    let threshold = max - cur - 150;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        extra_config: format!("evictionHard:\n  pid.available: \"{threshold}\"\npodPidsLimit: 400\n"),
        ..AgentOptions::default()
    })
    .await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let steady = "trap 'exit 0' TERM; while true; do sleep 1; done";
        let guaranteed =
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}});
        api.create(&pod("guaranteed", steady, &guaranteed)?)?;
        let running = |p: &Pod| main_state(p).is_some_and(|s| s.running.is_some());
        api.wait_for::<Pod>(Some("default"), "guaranteed", Duration::from_mins(1), |p| p.is_some_and(running)).await?;
        let forker = "i=0; while [ $i -lt 300 ]; do sleep 1000 & i=$((i+1)); done; wait";
        api.create(&pod("forker", forker, &json!({}))?)?;
        let evicted = api
            .wait_for::<Pod>(Some("default"), "forker", Duration::from_mins(1), |p| {
                p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
            })
            .await
            .map_err(|e| anyhow::anyhow!("forker not evicted: {e}\n{}", swiftlet_tests::tail(&agent.log(), 30)))?
            .expect("present");
        let message = evicted.status.and_then(|s| s.message).unwrap_or_default();
        assert!(message.starts_with("The node was low on resource: pids."), "{message}");
        let g = api.get::<Pod>(Some("default"), "guaranteed").expect("guaranteed pod");
        assert!(running(&g), "the Guaranteed pod still runs: {:?}", g.status);
        anyhow::Ok(())
    }))
    .await;
    for name in ["guaranteed", "forker"] {
        let _ = api.delete::<Pod>(Some("default"), name, Some(0));
    }
    let stopped = agent.shutdown(&cri).await;
    match outcome {
        Ok(result) => result.and(stopped),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
