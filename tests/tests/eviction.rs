//! Node-pressure eviction with real memory, on a node joined to the test bed's real
//! control plane (`swiftlet_tests::cluster`): the pods cgroup is made small (a memory
//! limit on `kubepods`), `evictionHard` `allocatableMemory.available` fits inside it, and
//! a `BestEffort` pod allocates steadily. The agent must evict it — on the kernel's memcg
//! threshold signal, before the kernel's OOM killer acts — and leave the Guaranteed pod
//! beside it alone. Also: PID pressure with a fork loop, disk pressure on a loop-mounted
//! node filesystem (the real Node's `DiskPressure` condition), and local storage limits.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use swiftlet_tests::cluster::{TestNode as Bed, node_condition};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

const MIB: u64 = 1024 * 1024;
/// Stops at once on SIGTERM.
const STEADY: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

async fn wait_running(bed: &Bed, name: &str) -> Result<Pod> {
    bed.node.eventually_pod(&bed.ns, name, Duration::from_mins(1), &format!("{name} running"), running).await
}

/// Waits until the pod's status says `Evicted`.
async fn wait_evicted(bed: &Bed, name: &str, timeout: Duration) -> Result<Pod> {
    bed.node
        .eventually_pod(&bed.ns, name, timeout, &format!("{name} evicted"), |p| {
            p.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
        })
        .await
}

/// The node's `DiskPressure` status, if reported.
async fn disk_pressure(bed: &Bed) -> Result<Option<String>> {
    Ok(bed.node.node().await?.and_then(|n| node_condition(&n, "DiskPressure").map(str::to_owned)))
}

/// Waits until the node reports `DiskPressure` `want`.
async fn wait_disk_pressure(bed: &Bed, want: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let now = disk_pressure(bed).await?;
        if now.as_deref() == Some(want) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the node's DiskPressure is {now:?}, not {want}, after {timeout:?}\n{}",
            tail(&bed.agent().log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whatever the test's outcome (an error or a panic), the node leaves: its namespace
/// and pods go (a hog left running would disturb every later test) and the agent
/// stops.
async fn finish(bed: Bed, outcome: std::thread::Result<Result<()>>) -> Result<()> {
    let left = bed.leave().await;
    match outcome {
        Ok(result) => result.and(left),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A pod with a memory-backed emptyDir at `/mem` (tmpfs: what is written there is
/// charged to the pod's memory cgroup, like anonymous memory).
fn pod(name: &str, script: &str, resources: &Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}}],
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", script], "resources": resources,
                            "volumeMounts": [{"name": "mem", "mountPath": "/mem"}]}]
        }
    })
}

fn guaranteed() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}})
}

fn main_state(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    p.status.as_ref()?.container_statuses.as_ref()?.first()?.state.as_ref()
}

fn running(p: &Pod) -> bool {
    main_state(p).is_some_and(|s| s.running.is_some())
}

/// The events in the test's namespace: (involved object, reason).
async fn events(bed: &Bed) -> Result<Vec<(String, String)>> {
    Ok(Api::<Event>::namespaced(bed.cluster.client(), &bed.ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|e| (e.involved_object.name.unwrap_or_default(), e.reason.unwrap_or_default()))
        .collect())
}

/// The kernel's OOM kills since boot, machine-wide (`oom_kill` in `/proc/vmstat`).
fn kernel_oom_kills() -> Result<u64> {
    let vmstat = std::fs::read_to_string("/proc/vmstat")?;
    vmstat
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .context("no oom_kill in /proc/vmstat")
}

/// Waits until `kubelet_evictions` counts one eviction on `signal` (counted once the kill
/// is done).
async fn counted_once(agent: &Agent, signal: &str) -> Result<()> {
    let counted = format!("kubelet_evictions{{eviction_signal=\"{signal}\"}} 1");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, text) = agent.get("/metrics").await?;
        ensure!(code == 200, "/metrics answered {code}: {text}");
        if text.lines().any(|l| l == counted) {
            return Ok(());
        }
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("kubelet_evictions")).collect();
        ensure!(Instant::now() < deadline, "no {counted}: {lines:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_evicted_before_the_oom_killer_and_the_guaranteed_pod_stays() -> Result<()> {
    let _g = testbed_lock().await;
    // The pods cgroup gets 400 MiB: the node allocatable the agent enforces on it, with
    // everything else reserved for the system.
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no MemTotal in /proc/meminfo")?;
    let reserved_kib = total_kib - 400 * MIB / 1024;
    let bed = Bed::join(
        "evict-memory",
        AgentOptions {
            extra_config: format!(
                "evictionHard:\n  allocatableMemory.available: 150Mi\nevictionPressureTransitionPeriod: 30s\n\
                 systemReserved:\n  memory: {reserved_kib}Ki\n"
            ),
            ..AgentOptions::default()
        },
    )
    .await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let agent = bed.agent();
        // Node allocatable, enforced on the real pods cgroup.
        let kubepods = agent.cgroup_dir("memory", &agent.kubepods_cgroup())?;
        let limit = std::fs::read_to_string(kubepods.join("memory.limit_in_bytes"))?;
        assert_eq!(limit.trim().parse::<u64>()?, 400 * MIB, "the kubepods memory limit");
        let cpus = u64::try_from(std::thread::available_parallelism()?.get())?;
        let shares = std::fs::read_to_string(agent.cgroup_dir("cpu", &agent.kubepods_cgroup())?.join("cpu.shares"))?;
        assert_eq!(shares.trim().parse::<u64>()?, cpus * 1024, "the kubepods cpu.shares: all CPUs, none reserved");

        bed.create(pod("guaranteed", STEADY, &guaranteed())).await?;
        wait_running(&bed, "guaranteed").await?;
        let oom_kills_before = kernel_oom_kills()?;
        // The pods' peak memory is measured from here on.
        std::fs::write(kubepods.join("memory.max_usage_in_bytes"), "0")?;
        let hog_created = Instant::now();

        // 8 MiB of tmpfs every 0.2 s, charged to the pod: it would reach the 400 MiB limit
        // (the kernel's OOM kill) about 7 s after crossing the eviction threshold.
        let hog =
            "i=0; while true; do dd if=/dev/zero of=/mem/f$i bs=1M count=8 2>/dev/null; i=$((i+1)); sleep 0.2; done";
        bed.create(pod("hog", hog, &json!({}))).await?;
        let evicted = wait_evicted(&bed, "hog", Duration::from_mins(2)).await?;
        let evicted_after = hog_created.elapsed();
        // Not one kernel OOM kill anywhere on the machine while the hog grew and went.
        assert_eq!(kernel_oom_kills()?, oom_kills_before, "the kernel OOM killer acted");
        let peak = std::fs::read_to_string(kubepods.join("memory.max_usage_in_bytes"))?.trim().parse::<u64>()?;
        assert!(peak < 400 * MIB, "the pods reached their limit: {peak}");
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
        let g = bed.get("guaranteed").await?;
        assert!(running(&g), "the Guaranteed pod still runs: {:?}", g.status);
        let restarts = g
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map_or(0, |c| c.restart_count);
        assert_eq!(restarts, 0);
        counted_once(agent, "allocatableMemory.available").await?;
        // The kernel's signal, not the 10 s pass, decided.
        let mut kernel_decisions = 0.0;
        for source in ["memcg_threshold", "psi", "ebpf_reclaim"] {
            kernel_decisions += agent
                .metric(&format!("swiftlet_eviction_signal_to_decision_seconds_count{{source=\"{source}\"}}"))
                .await?;
        }
        assert!(kernel_decisions >= 1.0, "no eviction decided on a kernel signal\n{}", tail(&agent.log(), 40));
        let mut latencies = Vec::new();
        for source in ["memcg_threshold", "psi", "ebpf_reclaim"] {
            let family = "swiftlet_eviction_signal_to_decision_seconds";
            let count = agent.metric(&format!("{family}_count{{source=\"{source}\"}}")).await?;
            if count > 0.0 {
                let sum = agent.metric(&format!("{family}_sum{{source=\"{source}\"}}")).await?;
                latencies.push(format!("{source} {count} decision(s), mean {:.1} ms", sum / count * 1e3));
            }
        }
        println!(
            "figures: hog evicted {:.1} s after its creation; the pods' peak memory {} MiB of their 400 MiB limit \
             ({} MiB from the kernel OOM kill); kernel OOM kills 0; signal to decision: {}",
            evicted_after.as_secs_f64(),
            peak / MIB,
            (400 * MIB - peak) / MIB,
            latencies.join(", ")
        );
        // The Evicted event, as the real API server stored it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let events = events(&bed).await?;
            if events.iter().any(|(n, r)| n == "hog" && r == "Evicted") {
                break;
            }
            ensure!(Instant::now() < deadline, "no Evicted event on hog: {events:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::Ok(())
    }))
    .await;
    finish(bed, outcome).await
}

/// PID pressure: `pid.available` (`pid_max` − running processes) set just below what
/// the node has free now, and a pod that forks 300 sleepers (bounded by podPidsLimit):
/// that pod is evicted, the Guaranteed pod beside it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_loop_is_evicted_under_pid_pressure() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    // What the node has free, as the agent counts it (a first agent, standalone and
    // without thresholds).
    let probe = Agent::start(AgentOptions::default()).await?;
    let (_, summary) = probe.get("/stats/summary").await?;
    probe.shutdown(&cri).await?;
    let summary: Value = serde_json::from_str(&summary)?;
    let rlimit = &summary["node"]["rlimit"];
    let (max, cur) = (rlimit["maxpid"].as_i64().unwrap_or(0), rlimit["curproc"].as_i64().unwrap_or(0));
    ensure!(max > 0 && cur > 0, "no rlimit stats: {rlimit}");
    // Pressure once 150 more processes run than now.
    let threshold = max - cur - 150;
    let bed = Bed::join(
        "evict-pids",
        AgentOptions {
            extra_config: format!("evictionHard:\n  pid.available: \"{threshold}\"\npodPidsLimit: 400\n"),
            ..AgentOptions::default()
        },
    )
    .await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        bed.create(pod("guaranteed", STEADY, &guaranteed())).await?;
        wait_running(&bed, "guaranteed").await?;
        let forker = "i=0; while [ $i -lt 300 ]; do sleep 1000 & i=$((i+1)); done; wait";
        bed.create(pod("forker", forker, &json!({}))).await?;
        let evicted = wait_evicted(&bed, "forker", Duration::from_mins(1)).await?;
        let message = evicted.status.and_then(|s| s.message).unwrap_or_default();
        assert!(message.starts_with("The node was low on resource: pids."), "{message}");
        let g = bed.get("guaranteed").await?;
        assert!(running(&g), "the Guaranteed pod still runs: {:?}", g.status);
        anyhow::Ok(())
    }))
    .await;
    finish(bed, outcome).await
}

/// A pod whose emptyDir is on the node filesystem (the agent's root dir).
fn disk_pod(name: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "main", "image": "localhost/busybox:latest", "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", script],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
        }
    })
}

/// Disk pressure on a node filesystem of its own: the agent's root dir (where emptyDir
/// volumes live) on a 128 MiB loop-mounted ext4, `evictionHard` `nodefs.available` 50 %.
/// A pod that writes 80 MiB into its emptyDir is evicted and the node reports
/// `DiskPressure`; the pod beside it, which wrote 1 MiB, stays. Once the evicted pod's
/// volume is gone, the space is back and the condition clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_filling_the_node_filesystem_is_evicted_under_disk_pressure() -> Result<()> {
    let _g = testbed_lock().await;
    let mut nodefs = swiftlet_tests::scratch::LoopFs::create(128)?;
    let bed = Bed::join(
        "evict-disk",
        AgentOptions {
            root_dir: Some(nodefs.mountpoint.join("kubelet")),
            extra_config: "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 50%\n\
                           evictionPressureTransitionPeriod: 5s\nnodeStatusUpdateFrequency: 2s\n"
                .into(),
            ..AgentOptions::default()
        },
    )
    .await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        bed.create(disk_pod("quiet", &format!("dd if=/dev/zero of=/data/f bs=1M count=1; {STEADY}"))).await?;
        wait_running(&bed, "quiet").await?;
        wait_disk_pressure(&bed, "False", Duration::from_secs(30))
            .await
            .context("no DiskPressure=False before the test")?;
        let (capacity, available) = nodefs.space()?;
        ensure!(available * 2 > capacity, "the node filesystem is already half full: {available}/{capacity}");

        bed.create(disk_pod("filler", &format!("dd if=/dev/zero of=/data/f bs=1M count=80; sync; {STEADY}"))).await?;
        let evicted = wait_evicted(&bed, "filler", Duration::from_mins(1)).await?;
        let status = evicted.status.clone().unwrap_or_default();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let message = status.message.unwrap_or_default();
        assert!(
            message.starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
            "{message}"
        );
        assert!(message.contains("Container main was using"), "{message}");
        wait_disk_pressure(&bed, "True", Duration::from_secs(30))
            .await
            .context("the node never reported DiskPressure")?;
        let quiet = bed.get("quiet").await?;
        assert!(running(&quiet), "the quiet pod still runs: {:?}", quiet.status);
        counted_once(bed.agent(), "nodefs.available").await?;

        // The evicted pod's emptyDir goes with it: the space comes back, the condition clears.
        wait_disk_pressure(&bed, "False", Duration::from_mins(1)).await.with_context(|| {
            let space = nodefs.space().map(|(c, a)| format!("{a}/{c} bytes available")).unwrap_or_default();
            format!("DiskPressure did not clear ({space})")
        })?;
        let (capacity, available) = nodefs.space()?;
        assert!(available * 2 > capacity, "the space did not come back: {available}/{capacity}");
        anyhow::Ok(())
    }))
    .await;
    let finished = finish(bed, outcome).await;
    // After the agent has stopped: nothing of it holds the filesystem any more.
    let unmounted = nodefs.remove();
    finished.and(unmounted)
}

/// Local storage limits, with no node pressure at all: a pod whose emptyDir outgrows its
/// `sizeLimit`, a pod one of whose containers writes past its own `ephemeral-storage`
/// limit, and a pod over the sum of its containers' limits are evicted with upstream's
/// messages; the pod within its limits stays. Disk usage is walked
/// every `volumeStatsAggPeriod` (2 s here instead of 1 min).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_their_local_storage_limits_are_evicted() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join(
        "evict-local",
        AgentOptions { extra_config: "volumeStatsAggPeriod: 2s\n".into(), ..AgentOptions::default() },
    )
    .await?;
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let pod = |name: &str, script: &str, size_limit: &str, limit: &str| -> Value {
            let mut p = disk_pod(name, &format!("{script}; {STEADY}"));
            if !size_limit.is_empty() {
                p["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = json!(size_limit);
            }
            if !limit.is_empty() {
                p["spec"]["containers"][0]["resources"] = json!({"limits": {"ephemeral-storage": limit}});
            }
            p
        };
        bed.create(pod("within", "dd if=/dev/zero of=/data/f bs=1M count=1", "8Mi", "8Mi")).await?;
        bed.create(pod("volume-over", "dd if=/dev/zero of=/data/f bs=1M count=4", "1Mi", "")).await?;
        // Two containers: the pod's total limit (2Mi + 100Mi) holds, the writer's own does not.
        let mut layer = pod("layer-over", "dd if=/dev/zero of=/tmp/f bs=1M count=4", "", "2Mi");
        let mut side = layer["spec"]["containers"][0].clone();
        side["name"] = json!("side");
        side["command"] = json!(["sh", "-c", STEADY]);
        side.as_object_mut().context("container")?.remove("volumeMounts");
        side["resources"]["limits"]["ephemeral-storage"] = json!("100Mi");
        layer["spec"]["containers"].as_array_mut().context("containers")?.push(side);
        bed.create(layer).await?;
        bed.create(pod("pod-over", "dd if=/dev/zero of=/tmp/f bs=1M count=4", "", "2Mi")).await?;
        let message = async |name: &str| -> Result<String> {
            let p = wait_evicted(&bed, name, Duration::from_mins(1)).await?;
            Ok(p.status.and_then(|s| s.message).unwrap_or_default())
        };
        assert_eq!(message("volume-over").await?, "Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". ");
        assert_eq!(message("layer-over").await?, "Container main exceeded its local ephemeral storage limit \"2Mi\". ");
        assert_eq!(
            message("pod-over").await?,
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "
        );
        let within = bed.get("within").await?;
        assert!(running(&within), "{:?}", within.status);
        anyhow::Ok(())
    }))
    .await;
    finish(bed, outcome).await
}
