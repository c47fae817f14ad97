//! Node-pressure eviction with real memory: the pods cgroup is made small (a memory limit
//! on `kubepods`), `evictionHard` `allocatableMemory.available` fits inside it, and a
//! `BestEffort` pod allocates steadily. The agent must evict it — on the kernel's memcg
//! threshold signal, before the kernel's OOM killer acts — and leave the Guaranteed pod
//! beside it alone. Also: PID pressure with a fork loop, and disk pressure on a loop-mounted
//! node filesystem.

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

/// Waits until `kubelet_evictions` counts one eviction on `signal` (counted once the kill
/// is done).
async fn counted_once(agent: &Agent, signal: &str) -> Result<()> {
    let counted = format!("kubelet_evictions{{eviction_signal=\"{signal}\"}} 1");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = agent.get("/metrics").await?;
        if text.lines().any(|l| l == counted) {
            return Ok(());
        }
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("kubelet_evictions")).collect();
        anyhow::ensure!(std::time::Instant::now() < deadline, "no {counted}: {lines:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_evicted_before_the_oom_killer_and_the_guaranteed_pod_stays() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    // The pods cgroup gets 400 MiB: the node allocatable the agent enforces on it, with
    // everything else reserved for the system.
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no MemTotal in /proc/meminfo"))?;
    let reserved_kib = total_kib - 400 * MIB / 1024;
    let api = TestApiServer::start(Options::default()).await?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        extra_config: format!(
            "evictionHard:\n  allocatableMemory.available: 150Mi\nevictionPressureTransitionPeriod: 30s\n\
             systemReserved:\n  memory: {reserved_kib}Ki\n"
        ),
        ..AgentOptions::default()
    })
    .await?;
    // Node allocatable, enforced on the real pods cgroup.
    let kubepods = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory{}/kubepods", agent.cgroup_root));
    let limit = std::fs::read_to_string(kubepods.join("memory.limit_in_bytes"))?;
    assert_eq!(limit.trim().parse::<u64>()?, 400 * MIB, "the kubepods memory limit");
    let cpus = u64::try_from(std::thread::available_parallelism()?.get())?;
    let shares = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu{}/kubepods/cpu.shares", agent.cgroup_root))?;
    assert_eq!(shares.trim().parse::<u64>()?, cpus * 1024, "the kubepods cpu.shares: all CPUs, none reserved");

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
        counted_once(&agent, "allocatableMemory.available").await?;
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

/// A pod whose emptyDir is on the node filesystem (the agent's root dir).
fn disk_pod(name: &str, script: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "e2e-node",
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", script],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
        }
    }))?)
}

/// `DiskPressure`'s status on the node object, if reported.
fn disk_pressure(api: &TestApiServer) -> Option<String> {
    let node = api.get::<k8s_openapi::api::core::v1::Node>(None, "e2e-node")?;
    node.status?.conditions?.into_iter().find(|c| c.type_ == "DiskPressure").map(|c| c.status)
}

/// Disk pressure on a node filesystem of its own: the agent's root dir (where emptyDir
/// volumes live) on a 128 MiB loop-mounted ext4, `evictionHard` `nodefs.available` 50 %.
/// A pod that writes 80 MiB into its emptyDir is evicted and the node reports
/// `DiskPressure`; the pod beside it, which wrote 1 MiB, stays. Once the evicted pod's
/// volume is gone, the space is back and the condition clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_filling_the_node_filesystem_is_evicted_under_disk_pressure() -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let mut nodefs = swiftlet_tests::scratch::LoopFs::create(128)?;
    let api = TestApiServer::start(Options::default()).await?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        root_dir: Some(nodefs.mountpoint.join("kubelet")),
        extra_config: "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 50%\n\
                       evictionPressureTransitionPeriod: 5s\nnodeStatusUpdateFrequency: 2s\n"
            .into(),
        ..AgentOptions::default()
    })
    .await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let steady = "trap 'exit 0' TERM; while true; do sleep 1; done";
        let running = |p: &Pod| main_state(p).is_some_and(|s| s.running.is_some());
        api.create(&disk_pod("quiet", &format!("dd if=/dev/zero of=/data/f bs=1M count=1; {steady}"))?)?;
        api.wait_for::<Pod>(Some("default"), "quiet", Duration::from_mins(1), |p| p.is_some_and(running)).await?;
        let node_ready = api
            .wait_for::<Node>(None, "e2e-node", Duration::from_secs(30), |n| {
                n.is_some() && disk_pressure(&api).as_deref() == Some("False")
            })
            .await;
        node_ready.map_err(|e| anyhow::anyhow!("no DiskPressure=False before the test: {e}"))?;
        let (capacity, available) = nodefs.space()?;
        anyhow::ensure!(available * 2 > capacity, "the node filesystem is already half full: {available}/{capacity}");

        api.create(&disk_pod("filler", &format!("dd if=/dev/zero of=/data/f bs=1M count=80; sync; {steady}"))?)?;
        let evicted = api
            .wait_for::<Pod>(Some("default"), "filler", Duration::from_mins(1), |p| {
                p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
            })
            .await
            .map_err(|e| anyhow::anyhow!("filler not evicted: {e}\n{}", swiftlet_tests::tail(&agent.log(), 40)))?
            .expect("present");
        let status = evicted.status.clone().unwrap_or_default();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let message = status.message.unwrap_or_default();
        assert!(
            message.starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
            "{message}"
        );
        assert!(message.contains("Container main was using"), "{message}");
        api.wait_for::<Node>(None, "e2e-node", Duration::from_secs(30), |_| {
            disk_pressure(&api).as_deref() == Some("True")
        })
        .await
        .map_err(|e| anyhow::anyhow!("the node never reported DiskPressure: {e}"))?;
        let quiet = api.get::<Pod>(Some("default"), "quiet").expect("quiet pod");
        assert!(running(&quiet), "the quiet pod still runs: {:?}", quiet.status);
        counted_once(&agent, "nodefs.available").await?;

        // The evicted pod's emptyDir goes with it: the space comes back, the condition clears.
        api.wait_for::<Node>(None, "e2e-node", Duration::from_mins(1), |_| {
            disk_pressure(&api).as_deref() == Some("False")
        })
        .await
        .map_err(|e| {
            let space = nodefs.space().map(|(c, a)| format!("{a}/{c} bytes available")).unwrap_or_default();
            anyhow::anyhow!("DiskPressure did not clear ({space}): {e}\n{}", swiftlet_tests::tail(&agent.log(), 30))
        })?;
        let (capacity, available) = nodefs.space()?;
        assert!(available * 2 > capacity, "the space did not come back: {available}/{capacity}");
        anyhow::Ok(())
    }))
    .await;
    for name in ["quiet", "filler"] {
        let _ = api.delete::<Pod>(Some("default"), name, Some(0));
    }
    let stopped = agent.shutdown(&cri).await;
    let unmounted = nodefs.remove();
    match outcome {
        Ok(result) => result.and(stopped).and(unmounted),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Local storage limits, with no node pressure at all: a pod whose emptyDir outgrows its
/// `sizeLimit`, a pod one of whose containers writes past its own `ephemeral-storage`
/// limit, and a pod over the sum of its containers' limits are evicted with upstream's
/// messages; the pod within its limits stays. Disk usage is walked
/// every `volumeStatsAggPeriod` (2 s here instead of 1 min).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_their_local_storage_limits_are_evicted() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let api = TestApiServer::start(Options::default()).await?;
    let agent = Agent::start(AgentOptions {
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        extra_config: "volumeStatsAggPeriod: 2s\n".into(),
        ..AgentOptions::default()
    })
    .await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let steady = "trap 'exit 0' TERM; while true; do sleep 1; done";
        let pod = |name: &str, script: &str, size_limit: &str, limit: &str| -> Result<Pod> {
            let mut p = disk_pod(name, &format!("{script}; {steady}"))?;
            let spec = p.spec.as_mut().expect("spec");
            if !size_limit.is_empty() {
                spec.volumes.as_mut().expect("volumes")[0].empty_dir.as_mut().expect("emptyDir").size_limit =
                    Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(size_limit.into()));
            }
            if !limit.is_empty() {
                spec.containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
                    limits: Some(std::collections::BTreeMap::from([(
                        "ephemeral-storage".to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(limit.into()),
                    )])),
                    ..Default::default()
                });
            }
            Ok(p)
        };
        api.create(&pod("within", "dd if=/dev/zero of=/data/f bs=1M count=1", "8Mi", "8Mi")?)?;
        api.create(&pod("volume-over", "dd if=/dev/zero of=/data/f bs=1M count=4", "1Mi", "")?)?;
        // Two containers: the pod's total limit (2Mi + 100Mi) holds, the writer's own does not.
        let mut layer = pod("layer-over", "dd if=/dev/zero of=/tmp/f bs=1M count=4", "", "2Mi")?;
        let containers = &mut layer.spec.as_mut().expect("spec").containers;
        let mut side = containers[0].clone();
        side.name = "side".into();
        side.command = Some(vec!["sh".into(), "-c".into(), steady.into()]);
        side.volume_mounts = None;
        if let Some(limits) = side.resources.as_mut().and_then(|r| r.limits.as_mut()) {
            limits.insert(
                "ephemeral-storage".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("100Mi".into()),
            );
        }
        containers.push(side);
        api.create(&layer)?;
        api.create(&pod("pod-over", "dd if=/dev/zero of=/tmp/f bs=1M count=4", "", "2Mi")?)?;
        let evicted = |name: &'static str| {
            let api = &api;
            let agent = &agent;
            async move {
                api.wait_for::<Pod>(Some("default"), name, Duration::from_mins(1), |p| {
                    p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
                })
                .await
                .map_err(|e| anyhow::anyhow!("{name} not evicted: {e}\n{}", swiftlet_tests::tail(&agent.log(), 30)))
                .map(|p| p.and_then(|p| p.status).and_then(|s| s.message).unwrap_or_default())
            }
        };
        assert_eq!(evicted("volume-over").await?, "Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". ");
        assert_eq!(evicted("layer-over").await?, "Container main exceeded its local ephemeral storage limit \"2Mi\". ");
        assert_eq!(
            evicted("pod-over").await?,
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "
        );
        let within = api.get::<Pod>(Some("default"), "within").expect("within");
        assert!(main_state(&within).is_some_and(|s| s.running.is_some()), "{:?}", within.status);
        anyhow::Ok(())
    }))
    .await;
    for name in ["within", "volume-over", "layer-over", "pod-over"] {
        let _ = api.delete::<Pod>(Some("default"), name, Some(0));
    }
    let stopped = agent.shutdown(&cri).await;
    match outcome {
        Ok(result) => result.and(stopped),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
