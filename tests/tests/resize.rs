//! End-to-end tests of in-place pod resize: a real `swiftlet` joined to the test bed's real
//! control plane (its `pods/<name>/resize` subresource and validation), real containers in the test bed's containerd, and the kernel's cgroups
//! (v1 here: `cpu.cfs_quota_us`, `cpu.shares`, `memory.limit_in_bytes`, the v1 names of
//! v2's `cpu.max`, `cpu.weight` and `memory.max`) checked for the container and the pod.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use swiftlet_tests::cluster::TestNode as Bed;
use swiftlet_tests::{Agent, AgentOptions, Cri, tail, testbed_lock};

/// A Burstable pod: requests cpu 100m / memory 64Mi, limits cpu 200m / memory 128Mi.
fn pod(name: &str, resize_policy: Option<Value>) -> Pod {
    let mut c = json!({
        "name": "main",
        "image": "localhost/busybox:latest",
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
    });
    if let Some(p) = resize_policy {
        c["resizePolicy"] = p;
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [c]},
    }))
    .unwrap()
}

/// A pod-level field of the pod's status (`resources`, `allocatedResources`).
fn pod_level(p: &Pod, field: &str) -> Value {
    serde_json::to_value(p.status.as_ref()).map(|s| s[field].clone()).unwrap_or_default()
}

async fn resize(bed: &Bed, name: &str, resources: Value) -> Result<Pod> {
    let pods = bed.pods();
    let patch = json!({"spec": {"containers": [{"name": "main", "resources": resources}]}});
    Ok(pods.patch_subresource("resize", name, &PatchParams::default(), &Patch::Strategic(patch)).await?)
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .is_some_and(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
}

fn container_status(p: &Pod) -> Value {
    serde_json::to_value(&p.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0]).unwrap()
}

fn resize_condition(p: &Pod, type_: &str) -> Option<Value> {
    let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)?;
    Some(serde_json::to_value(c).unwrap())
}

async fn running_container(cri: &Cri, uid: &str) -> Result<String> {
    cri.containers(uid).await?.into_iter().find(|c| c.state == 1).map(|c| c.id).context("no running container")
}

/// A v1 cgroup file of the pod (`container = None`) or of one of its containers.
fn cgroup_file(agent: &Agent, controller: &str, uid: &str, container: Option<&str>, file: &str) -> String {
    let mut cgroup = agent.pod_cgroup("burstable", uid);
    if let Some(c) = container {
        cgroup = agent.container_cgroup(&cgroup, c);
    }
    agent
        .cgroup_dir(controller, &cgroup)
        .and_then(|dir| Ok(std::fs::read_to_string(dir.join(file))?))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// (`cpu.cfs_quota_us`, `cpu.shares`, `memory.limit_in_bytes`) of the pod or a container.
fn limits(agent: &Agent, uid: &str, container: Option<&str>) -> (String, String, String) {
    (
        cgroup_file(agent, "cpu", uid, container, "cpu.cfs_quota_us"),
        cgroup_file(agent, "cpu", uid, container, "cpu.shares"),
        cgroup_file(agent, "memory", uid, container, "memory.limit_in_bytes"),
    )
}

fn triple(q: &str, s: &str, m: &str) -> (String, String, String) {
    (q.to_string(), s.to_string(), m.to_string())
}

/// Polls until `check` holds for the API pod, with the agent's log on failure.
async fn eventually(bed: &Bed, name: &str, secs: u64, what: &str, check: impl Fn(&Pod) -> bool) -> Result<Pod> {
    bed.eventually(name, Duration::from_secs(secs), what, check).await
}

#[tokio::test]
async fn cpu_and_memory_resize_in_place_without_restart() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("resize-inplace", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let created = bed.create(serde_json::to_value(pod("inplace", None))?).await?;
    let uid = created.metadata.uid.clone().unwrap();
    eventually(&bed, "inplace", 60, "running", running).await?;
    let id = running_container(cri, &uid).await?;
    // 200m -> quota 20000 µs of 100000; 100m -> 102 shares; 128Mi.
    assert_eq!(limits(agent, &uid, Some(&id)), triple("20000", "102", "134217728"));
    assert_eq!(limits(agent, &uid, None), triple("20000", "102", "134217728"));

    let resized = resize(
        &bed,
        "inplace",
        json!({"requests": {"cpu": "150m", "memory": "96Mi"}, "limits": {"cpu": "300m", "memory": "192Mi"}}),
    )
    .await?;
    assert_eq!(resized.metadata.generation, Some(2));
    let p = eventually(&bed, "inplace", 60, "resize actuated and reported", |p| {
        let cs = container_status(p);
        cs["resources"]["limits"] == json!({"cpu": "300m", "memory": "192Mi"})
            && cs["resources"]["requests"] == json!({"cpu": "150m", "memory": "96Mi"})
            && resize_condition(p, "PodResizeInProgress").is_none()
            && resize_condition(p, "PodResizePending").is_none()
            // The pod level, as upstream reports it for every pod: the pod cgroup's
            // cpu shares (153: 150m) and quota, its memory limit, the total requests.
            && pod_level(p, "resources")
                == json!({"limits": {"cpu": "300m", "memory": "192Mi"}, "requests": {"cpu": "150m", "memory": "96Mi"}})
    })
    .await?;
    assert_eq!(pod_level(&p, "allocatedResources"), json!({"cpu": "150m", "memory": "96Mi"}));
    let cs = container_status(&p);
    assert_eq!(cs["allocatedResources"], json!({"cpu": "150m", "memory": "96Mi"}));
    assert_eq!(cs["restartCount"], 0);
    assert_eq!(p.status.as_ref().unwrap().observed_generation, Some(2));
    // The same container, with new limits in the kernel; the pod cgroup follows.
    assert_eq!(running_container(cri, &uid).await?, id);
    assert_eq!(limits(agent, &uid, Some(&id)), triple("30000", "153", "201326592"));
    assert_eq!(limits(agent, &uid, None), triple("30000", "153", "201326592"));
    // The runtime took it (UpdateContainerResources): its ContainerStatus says so too.
    let st = cri.container_status(&id).await?.status.context("status")?;
    let linux = st.resources.and_then(|r| r.linux).context("CRI reports no resources")?;
    assert_eq!(
        (linux.cpu_quota, linux.cpu_period, linux.cpu_shares, linux.memory_limit_in_bytes),
        (30_000, 100_000, 153, 201_326_592)
    );

    // And back down: containers shrink before the pod cgroup, still in place.
    resize(
        &bed,
        "inplace",
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}),
    )
    .await?;
    eventually(&bed, "inplace", 60, "decrease actuated", |p| {
        container_status(p)["resources"]["limits"] == json!({"cpu": "200m", "memory": "128Mi"})
            && resize_condition(p, "PodResizeInProgress").is_none()
    })
    .await?;
    assert_eq!(running_container(cri, &uid).await?, id);
    assert_eq!(limits(agent, &uid, Some(&id)), triple("20000", "102", "134217728"));
    assert_eq!(limits(agent, &uid, None), triple("20000", "102", "134217728"));
    assert!(agent.metric("kubelet_container_requested_resizes_total{resource=\"cpu\",requirement=\"limits\",operation=\"increase\"}").await? >= 1.0);

    bed.delete("inplace").await?;
    bed.leave().await
}

#[tokio::test]
async fn memory_resize_restarts_the_container_when_its_policy_says_so() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("resize-restart", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let policy = json!([
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "RestartContainer"},
    ]);
    let created = bed.create(serde_json::to_value(pod("restart", Some(policy)))?).await?;
    let uid = created.metadata.uid.clone().unwrap();
    eventually(&bed, "restart", 60, "running", running).await?;
    let old = running_container(cri, &uid).await?;

    resize(&bed, "restart", json!({"requests": {"memory": "80Mi"}, "limits": {"memory": "160Mi"}})).await?;
    let p = eventually(&bed, "restart", 90, "restarted with the new memory limit", |p| {
        let cs = container_status(p);
        cs["restartCount"] == 1
            && running(p)
            && cs["resources"]["limits"]["memory"] == "160Mi"
            && resize_condition(p, "PodResizeInProgress").is_none()
    })
    .await?;
    assert_eq!(container_status(&p)["allocatedResources"], json!({"cpu": "100m", "memory": "80Mi"}));
    let new = running_container(cri, &uid).await?;
    assert_ne!(new, old, "a new container");
    assert_eq!(limits(agent, &uid, Some(&new)), triple("20000", "102", "167772160"));
    assert_eq!(cgroup_file(agent, "memory", &uid, None, "memory.limit_in_bytes"), "167772160");

    bed.delete("restart").await?;
    bed.leave().await
}

/// What the API server refuses never reaches the node. Since 1.33 the API server also
/// refuses a resize over the node's allocatable (the `NodeCapacity` cause), so the
/// kubelet's own `Infeasible` verdict for it (see `agent/src/allocation/tests.rs`) is
/// reached only when allocatable shrinks between the API's check and the kubelet's.
#[tokio::test]
async fn resizes_the_api_server_refuses_change_nothing() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("resize-refused", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let created = bed.create(serde_json::to_value(pod("huge", None))?).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    eventually(&bed, "huge", 60, "running", running).await?;
    let id = running_container(cri, &uid).await?;

    // A change of QoS class.
    let err = resize(&bed, "huge", json!({"requests": {"cpu": "200m", "memory": "128Mi"}})).await.unwrap_err();
    assert!(err.to_string().contains("Pod QOS Class may not change as a result of resizing"), "{err}");
    // More cpu than the node has.
    let err = resize(&bed, "huge", json!({"requests": {"cpu": "100"}, "limits": {"cpu": "100"}})).await.unwrap_err();
    let Some(kube::Error::Api(status)) = err.downcast_ref::<kube::Error>() else {
        anyhow::bail!("not an API refusal: {err}")
    };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"), "{err}");
    assert!(status.message.contains("node didn't have enough allocatable resources: cpu, requested: 100000"), "{err}");

    let p = bed.pods().get("huge").await?;
    assert_eq!(p.metadata.generation, Some(1), "the spec did not change");
    assert!(resize_condition(&p, "PodResizePending").is_none());
    assert!(resize_condition(&p, "PodResizeInProgress").is_none());
    let cs = container_status(&p);
    assert_eq!(cs["allocatedResources"], json!({"cpu": "100m", "memory": "64Mi"}));
    assert_eq!(cs["resources"]["limits"], json!({"cpu": "200m", "memory": "128Mi"}));
    assert_eq!(cs["restartCount"], 0);
    assert_eq!(running_container(cri, &uid).await?, id);
    assert_eq!(limits(agent, &uid, Some(&id)), triple("20000", "102", "134217728"));
    assert_eq!(limits(agent, &uid, None), triple("20000", "102", "134217728"));
    assert_eq!(agent.metric("kubelet_pod_pending_resizes{reason=\"infeasible\"}").await? as i64, 0);

    bed.delete("huge").await?;
    bed.leave().await
}

/// A pod asking for `cpu` (request only) that runs a shell loop.
fn cpu_pod(name: &str, cpu: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{
            "name": "main",
            "image": "localhost/busybox:latest",
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
            "resources": {"requests": {"cpu": cpu}},
        }]},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_deferred_resize_is_actuated_once_another_pod_leaves() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("resize-deferred", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let node = bed.node.node().await?.context("node")?;
    let alloc =
        node.status.and_then(|s| s.allocatable).and_then(|a| a.get("cpu").cloned()).context("allocatable cpu")?;
    let cpu = alloc.0.strip_suffix('m').map_or_else(|| alloc.0.parse::<i64>().map(|c| c * 1000), str::parse)?;
    // The hog leaves 400m; the small pod wants 500m of it.
    bed.create(serde_json::to_value(cpu_pod("hog", &format!("{}m", cpu - 400)))?).await?;
    let small = bed.create(serde_json::to_value(cpu_pod("small", "100m"))?).await?;
    let uid = small.metadata.uid.clone().unwrap();
    eventually(&bed, "hog", 60, "hog running", running).await?;
    eventually(&bed, "small", 60, "small running", running).await?;
    let id = running_container(cri, &uid).await?;

    resize(&bed, "small", json!({"requests": {"cpu": "500m"}})).await?;
    let p = eventually(&bed, "small", 60, "PodResizePending Deferred", |p| {
        resize_condition(p, "PodResizePending").is_some_and(|c| c["reason"] == "Deferred")
    })
    .await?;
    assert_eq!(
        resize_condition(&p, "PodResizePending").unwrap()["message"],
        format!("Node didn't have enough resource: cpu, requested: 500, used: {}, capacity: {cpu}", cpu - 400)
    );
    assert_eq!(container_status(&p)["allocatedResources"]["cpu"], "100m");
    assert_eq!(cgroup_file(agent, "cpu", &uid, Some(&id), "cpu.shares"), "102");

    // The hog goes: the resize is retried at once and actuated in place.
    bed.delete("hog").await?;
    let p = eventually(&bed, "small", 60, "resize accepted and actuated", |p| {
        let cs = container_status(p);
        cs["allocatedResources"]["cpu"] == "500m"
            && cs["resources"]["requests"]["cpu"] == "500m"
            && resize_condition(p, "PodResizePending").is_none()
            && resize_condition(p, "PodResizeInProgress").is_none()
    })
    .await?;
    assert_eq!(container_status(&p)["restartCount"], 0);
    assert_eq!(running_container(cri, &uid).await?, id);
    assert_eq!(cgroup_file(agent, "cpu", &uid, Some(&id), "cpu.shares"), "512");
    assert_eq!(cgroup_file(agent, "cpu", &uid, None, "cpu.shares"), "512");
    // Accepted when the hog finished (graceful deletion) or when it was gone.
    let mut accepted = 0.0;
    for trigger in ["pod_terminated", "pods_removed"] {
        accepted += agent
            .metric(&format!("kubelet_pod_deferred_accepted_resizes_total{{retry_trigger=\"{trigger}\"}}"))
            .await?;
    }
    assert_eq!(accepted as i64, 1);

    bed.delete("small").await?;
    bed.leave().await
}

#[tokio::test]
async fn an_agent_restart_keeps_the_allocation_and_restarts_nothing() -> Result<()> {
    let _g = testbed_lock().await;
    let mut bed = Bed::join("resize-kept", AgentOptions::default()).await?;
    let created = bed.create(serde_json::to_value(pod("kept", None))?).await?;
    let uid = created.metadata.uid.clone().unwrap();
    eventually(&bed, "kept", 60, "running", running).await?;
    let id = running_container(&bed.cri, &uid).await?;
    resize(
        &bed,
        "kept",
        json!({"requests": {"cpu": "150m", "memory": "64Mi"}, "limits": {"cpu": "300m", "memory": "192Mi"}}),
    )
    .await?;
    eventually(&bed, "kept", 60, "resize actuated", |p| {
        container_status(p)["resources"]["limits"] == json!({"cpu": "300m", "memory": "192Mi"})
            && resize_condition(p, "PodResizeInProgress").is_none()
    })
    .await?;
    // The checkpoint, in upstream's format, holds the new allocation.
    let checkpoint = std::fs::read_to_string(bed.node.agent.root_dir.join("allocated_pods_state"))?;
    let outer: Value = serde_json::from_str(&checkpoint)?;
    let data: Value = serde_json::from_str(outer["data"].as_str().context("data")?)?;
    assert_eq!(
        data["entries"][&uid]["ContainerResources"]["main"]["limits"],
        json!({"cpu": "300m", "memory": "192Mi"})
    );
    assert!(outer["checksum"].is_u64());

    bed.node.agent.kill9()?;
    bed.node.agent.spawn().await?;
    // The new agent has synced the pod once it has run a worker for it.
    let deadline = Instant::now() + Duration::from_mins(1);
    while bed.node.agent.metric("kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"}").await? < 1.0 {
        assert!(Instant::now() < deadline, "no pod sync after the restart\n{}", tail(&bed.node.agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = eventually(&bed, "kept", 30, "status kept", |p| {
        container_status(p)["allocatedResources"] == json!({"cpu": "150m", "memory": "64Mi"})
            && resize_condition(p, "PodResizeInProgress").is_none()
    })
    .await?;
    assert_eq!(container_status(&p)["restartCount"], 0);
    assert_eq!(running_container(&bed.cri, &uid).await?, id);
    assert_eq!(limits(&bed.node.agent, &uid, Some(&id)), triple("30000", "153", "201326592"));
    assert_eq!(limits(&bed.node.agent, &uid, None), triple("30000", "153", "201326592"));

    bed.delete("kept").await?;
    bed.leave().await
}

#[tokio::test]
async fn a_memory_limit_below_the_pods_usage_is_an_in_progress_error() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("resize-lowmem", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let mut p = pod("lowmem", None);
    // 60Mi of shared memory, charged to the pod's memory cgroup.
    p.spec.as_mut().context("spec")?.containers[0].command = Some(vec![
        "sh".into(),
        "-c".into(),
        "head -c 62914560 /dev/zero > /dev/shm/fill; touch /tmp/filled; trap 'exit 0' TERM; while true; do sleep 1; done"
            .into(),
    ]);
    let created = bed.create(serde_json::to_value(p)?).await?;
    let uid = created.metadata.uid.clone().unwrap();
    eventually(&bed, "lowmem", 60, "running", running).await?;
    let id = running_container(cri, &uid).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while cri.exec(&id, &["test", "-e", "/tmp/filled"]).await?.0 != 0 {
        assert!(Instant::now() < deadline, "shared memory not filled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    resize(&bed, "lowmem", json!({"requests": {"memory": "32Mi"}, "limits": {"memory": "48Mi"}})).await?;
    let p = eventually(&bed, "lowmem", 60, "PodResizeInProgress Error", |p| {
        resize_condition(p, "PodResizeInProgress").is_some_and(|c| c["reason"] == "Error")
    })
    .await?;
    let c = resize_condition(&p, "PodResizeInProgress").unwrap();
    // Upstream 1.37's message: the new limit (48Mi) and the usage.
    let message = c["message"].as_str().unwrap_or_default();
    let usage = message
        .strip_prefix(
            "cannot decrease memory limits: attempting to set pod memory limit (50331648) below current usage (",
        )
        .and_then(|rest| rest.strip_suffix(')'))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(usage.is_some_and(|u| u >= 50_331_648), "{message}");
    assert_eq!(c["observedGeneration"], 2);
    let cs = container_status(&p);
    // Allocated, not actuated: the kernel keeps the old limit, the container runs on.
    assert_eq!(cs["allocatedResources"]["memory"], "32Mi");
    assert_eq!(cs["resources"]["limits"]["memory"], "128Mi");
    assert_eq!(cs["restartCount"], 0);
    assert_eq!(running_container(cri, &uid).await?, id);
    assert_eq!(cgroup_file(agent, "memory", &uid, Some(&id), "memory.limit_in_bytes"), "134217728");
    assert_eq!(cgroup_file(agent, "memory", &uid, None, "memory.limit_in_bytes"), "134217728");

    bed.delete("lowmem").await?;
    bed.leave().await
}

/// A pod whose resources are set at the pod level (`spec.resources`), its container
/// without any: the container inherits the pod-level limits.
fn pod_level_pod(name: &str) -> Pod {
    let mut p = pod(name, None);
    let spec = p.spec.as_mut().unwrap();
    spec.containers[0].resources = None;
    spec.resources = Some(
        serde_json::from_value(json!({
            "requests": {"cpu": "200m", "memory": "64Mi"},
            "limits": {"cpu": "400m", "memory": "128Mi"},
        }))
        .unwrap(),
    );
    p
}

/// `InPlacePodLevelResourcesVerticalScaling` (beta, on in 1.37): a resize of the pod-level
/// resources is admitted (the node declares the feature, else the API server refuses it),
/// allocated and actuated in place on the pod cgroup and on the container that inherits
/// the pod-level limits, without a restart.
#[tokio::test]
async fn pod_level_resources_resize_in_place() -> Result<()> {
    let _g = testbed_lock().await;
    let bed = Bed::join("resize-podlevel", AgentOptions::default()).await?;
    let (agent, cri) = (bed.agent(), &bed.cri);
    let created = bed.create(serde_json::to_value(pod_level_pod("podlevel"))?).await?;
    let uid = created.metadata.uid.clone().unwrap();
    eventually(&bed, "podlevel", 60, "running", running).await?;
    let id = running_container(cri, &uid).await?;
    // 400m -> quota 40000; 200m -> 204 shares (the pod); the container inherits the limits
    // and, with no request of its own, has the shares of its (inherited) cpu limit.
    assert_eq!(limits(agent, &uid, None), triple("40000", "204", "134217728"));
    assert_eq!(limits(agent, &uid, Some(&id)), triple("40000", "409", "134217728"));

    let patch = json!({"spec": {"resources": {
        "requests": {"cpu": "300m", "memory": "64Mi"},
        "limits": {"cpu": "600m", "memory": "192Mi"},
    }}});
    let resized =
        bed.pods().patch_subresource("resize", "podlevel", &PatchParams::default(), &Patch::Strategic(patch)).await?;
    assert_eq!(resized.metadata.generation, Some(2));
    let p = eventually(&bed, "podlevel", 60, "pod-level resize actuated", |p| {
        pod_level(p, "allocatedResources") == json!({"cpu": "300m", "memory": "64Mi"})
            && resize_condition(p, "PodResizeInProgress").is_none()
            && resize_condition(p, "PodResizePending").is_none()
            && pod_level(p, "resources")["limits"] == json!({"cpu": "600m", "memory": "192Mi"})
    })
    .await?;
    assert_eq!(container_status(&p)["restartCount"], 0);
    assert_eq!(running_container(cri, &uid).await?, id, "resized in place");
    assert_eq!(limits(agent, &uid, None), triple("60000", "307", "201326592"));
    assert_eq!(limits(agent, &uid, Some(&id)), triple("60000", "614", "201326592"));
    // The events say so (they reach the API server a little later).
    let reasons = || {
        bed.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=podlevel",
            "-o",
            "jsonpath={.items[*].reason}",
        ])
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = reasons()?;
        if seen.contains("ResizeStarted") && seen.contains("ResizeCompleted") {
            break;
        }
        assert!(Instant::now() < deadline, "resize events missing: {seen}\n{}", tail(&agent.log(), 40));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    bed.delete("podlevel").await?;
    bed.leave().await
}
