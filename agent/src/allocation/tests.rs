use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};

use super::*;
use crate::container::pod_status::{RuntimeContainerStatus, RuntimePodStatus};
use crate::events::MemoryRecorder;
use crate::types::pod_resources::test_pods::{ctr, pod, sidecar};

fn burstable(uid: &str, cpu_req: &str, cpu_lim: &str, mem: &str) -> Pod {
    let mut p = pod(uid, vec![ctr("c", &[("cpu", cpu_req), ("memory", mem)], &[("cpu", cpu_lim), ("memory", mem)])]);
    p.metadata.generation = Some(1);
    p
}

fn resized(p: &Pod, cpu_req: &str, cpu_lim: &str, mem: &str) -> Pod {
    let mut n = burstable(p.metadata.uid.as_deref().unwrap(), cpu_req, cpu_lim, mem);
    n.metadata.generation = Some(p.metadata.generation.unwrap_or(1) + 1);
    n
}

#[expect(clippy::unnecessary_wraps, reason = "the shape of ResizeContext::fits")]
fn fits_always(_: &Pod) -> Result<(), Rejection> {
    Ok(())
}

fn manager() -> (AllocationManager, MemoryRecorder) {
    let recorder = MemoryRecorder::new("node");
    let m = AllocationManager::in_memory(NodeResizeConfig::default()).with_recorder(Arc::new(recorder.clone()));
    (m, recorder)
}

fn reasons_of(r: &MemoryRecorder) -> Vec<String> {
    r.list().into_iter().filter_map(|e| e.reason).collect()
}

fn pending(m: &AllocationManager, uid: &str) -> Option<(String, String)> {
    m.conditions(uid)
        .into_iter()
        .find(|c| c.type_ == reasons::POD_RESIZE_PENDING)
        .map(|c| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
}

fn has_in_progress(m: &AllocationManager, uid: &str) -> bool {
    m.conditions(uid).iter().any(|c| c.type_ == reasons::POD_RESIZE_IN_PROGRESS)
}

#[test]
fn a_new_pod_is_allocated_its_spec_and_a_restart_keeps_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let m = AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default()).unwrap();
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    m.write_admitted();
    assert!(dir.path().join(checkpoint::FILE_NAME).exists());
    // After a restart the checkpoint is the truth, not the (resized) spec.
    let m = AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default()).unwrap();
    let bigger = resized(&p, "300m", "400m", "64Mi");
    m.add_pod(&bigger);
    let (allocated, differs) = m.update_pod_from_allocation(&bigger);
    assert!(differs);
    assert_eq!(allocated.spec.unwrap().containers[0].resources, p.spec.as_ref().unwrap().containers[0].resources);
    m.remove_pod("u1");
    assert!(!m.is_pod_allocated("u1"));
    let m = AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default()).unwrap();
    assert!(!m.is_pod_allocated("u1"));
}

/// Admissions are not written one by one: the next `write_admitted` writes all of them
/// at once; a write that fails is made again by the next one.
#[test]
fn admissions_are_written_together_before_their_pods_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(checkpoint::FILE_NAME);
    let m = AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default()).unwrap();
    assert!(!m.has_unwritten());
    m.add_pod(&burstable("u1", "100m", "200m", "64Mi"));
    m.add_pod(&burstable("u2", "100m", "200m", "64Mi"));
    assert!(!file.exists(), "admission does not write");
    assert!(m.has_unwritten());
    m.write_admitted();
    assert!(!m.has_unwritten());
    assert_eq!(checkpoint::load(&file).unwrap().keys().collect::<Vec<_>>(), ["u1", "u2"]);
    // The checkpoint's place taken by a directory: the write fails and stays to be done.
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir_all(file.join("in-the-way")).unwrap();
    m.add_pod(&burstable("u3", "100m", "200m", "64Mi"));
    m.write_admitted();
    assert!(m.has_unwritten(), "the failed write is still to be made");
    std::fs::remove_dir_all(&file).unwrap();
    m.write_admitted();
    assert!(!m.has_unwritten());
    let restarted = AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default()).unwrap();
    assert!(["u1", "u2", "u3"].iter().all(|u| restarted.is_pod_allocated(u)));
}

/// Either checkpoint corrupt: the agent does not start (upstream neither), and says which.
#[test]
fn a_corrupt_checkpoint_refuses_to_start() {
    for file in [checkpoint::FILE_NAME, checkpoint::ACTUATED_FILE_NAME] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(file), r#"{"data":"{}","checksum":1}"#).unwrap();
        let err =
            AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default()).unwrap_err();
        assert!(err.to_string().ends_with(&format!("{file}: checkpoint is corrupted")), "{err}");
    }
}

#[test]
fn a_fitting_resize_is_allocated_and_in_progress() {
    let (m, rec) = manager();
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    let n = resized(&p, "150m", "300m", "64Mi");
    let ctx = ResizeContext { allocatable: Some((2000, 1 << 30)), fits: &fits_always };
    assert!(m.handle_resize(&n, &ctx));
    assert!(!m.update_pod_from_allocation(&n).1, "allocation follows the spec");
    let c = m.conditions("u1");
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].type_, "PodResizeInProgress");
    assert_eq!(c[0].status, "True");
    assert_eq!(c[0].observed_generation, Some(2));
    assert_eq!(c[0].reason, None);
    let events = rec.list();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason.as_deref(), Some("ResizeStarted"));
    let msg = events[0].message.clone().unwrap();
    assert!(msg.starts_with("Pod resize started: {\"containers\":[{\"name\":\"c\",\"resources\":{"), "{msg}");
    assert!(msg.ends_with("\"generation\":2}"), "{msg}");
    assert_eq!(m.metrics().in_progress.get(), 1);
}

#[test]
fn more_than_allocatable_is_infeasible_with_upstreams_message() {
    let (m, rec) = manager();
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    let ctx = ResizeContext { allocatable: Some((2000, 1 << 30)), fits: &fits_always };
    assert!(!m.handle_resize(&resized(&p, "3", "3", "64Mi"), &ctx));
    assert_eq!(
        pending(&m, "u1"),
        Some(("Infeasible".into(), "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000".into()))
    );
    assert!(m.update_pod_from_allocation(&resized(&p, "3", "3", "64Mi")).1, "allocation unchanged");
    assert!(!m.handle_resize(&resized(&p, "100m", "200m", "2Gi"), &ctx));
    assert_eq!(
        pending(&m, "u1"),
        Some((
            "Infeasible".into(),
            "Node didn't have enough capacity: memory, requested: 2147483648, capacity: 1073741824".into()
        ))
    );
    assert_eq!(reasons_of(&rec), ["ResizeInfeasible", "ResizeInfeasible"]);
    assert!(!m.has_pending(), "an infeasible resize is not retried");
    assert_eq!(
        m.metrics()
            .infeasible
            .get_or_create(&metrics::ReasonDetailLabels { reason_detail: "insufficient_node_allocatable".into() })
            .get(),
        2
    );
    // Reverting the spec clears the condition.
    assert!(!m.handle_resize(&p, &ctx));
    assert_eq!(pending(&m, "u1"), None);
    assert!(!m.has_pending());
}

#[test]
fn a_resize_that_does_not_fit_now_is_deferred_and_retried() {
    let (m, rec) = manager();
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    let n = resized(&p, "1500m", "1500m", "64Mi");
    let busy = |_: &Pod| -> Result<(), Rejection> {
        Err(Rejection {
            reason: "OutOfcpu".into(),
            message: "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000".into(),
        })
    };
    let ctx = ResizeContext { allocatable: Some((2000, 1 << 30)), fits: &busy };
    assert!(!m.handle_resize(&n, &ctx));
    let (reason, message) = pending(&m, "u1").unwrap();
    assert_eq!(reason, "Deferred");
    assert_eq!(message, "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000");
    // The same verdict again: no second event, same transition time.
    let before = m.conditions("u1")[0].last_transition_time.clone();
    assert!(!m.handle_resize(&n, &ctx));
    assert_eq!(m.conditions("u1")[0].last_transition_time, before);
    assert_eq!(reasons_of(&rec), ["ResizeDeferred"]);
    assert_eq!(m.metrics().pending.get_or_create(&metrics::ReasonLabels { reason: "deferred".into() }).get(), 1);
    // Room freed: the retry allocates it and asks for a sync.
    let free = ResizeContext { allocatable: Some((2000, 1 << 30)), fits: &fits_always };
    let synced = m.retry_pending(triggers::PODS_REMOVED, &|_| Some(n.clone()), &free);
    assert_eq!(synced.len(), 1);
    assert!(!m.has_pending());
    assert_eq!(pending(&m, "u1"), None);
    assert!(has_in_progress(&m, "u1"));
    assert_eq!(
        m.metrics()
            .deferred_accepted
            .get_or_create(&metrics::TriggerLabels { retry_trigger: "pods_removed".into() })
            .get(),
        1
    );
}

#[test]
fn static_pods_and_static_policies_are_infeasible() {
    let (m, _) = manager();
    let mut p = burstable("u1", "100m", "200m", "64Mi");
    p.metadata.annotations = Some(BTreeMap::from([("kubernetes.io/config.source".into(), "file".into())]));
    m.add_pod(&p);
    let mut n = resized(&p, "150m", "200m", "64Mi");
    n.metadata.annotations.clone_from(&p.metadata.annotations);
    let ctx = ResizeContext { allocatable: None, fits: &fits_always };
    assert!(!m.handle_resize(&n, &ctx));
    assert_eq!(
        pending(&m, "u1"),
        Some(("Infeasible".into(), "In-place resize of static-pods is not supported".into()))
    );

    let m = AllocationManager::in_memory(NodeResizeConfig { static_cpu_policy: true, static_memory_policy: false });
    let g = burstable("g", "1", "1", "64Mi");
    m.add_pod(&g);
    assert!(!m.handle_resize(&resized(&g, "2", "2", "64Mi"), &ctx));
    assert_eq!(
        pending(&m, "g"),
        Some((
            "Infeasible".into(),
            "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\"".into()
        ))
    );
    // Memory may still change under the static cpu policy.
    assert!(m.handle_resize(&resized(&g, "1", "1", "128Mi"), &ctx));
}

#[test]
fn retries_go_decreases_first_then_priority() {
    let (m, _) = manager();
    let a = burstable("a", "100m", "200m", "64Mi");
    let b = burstable("b", "100m", "200m", "64Mi");
    m.add_pod(&a);
    m.add_pod(&b);
    let grow = resized(&a, "1", "1", "64Mi");
    let mut shrink = resized(&b, "50m", "200m", "64Mi");
    shrink.spec.as_mut().unwrap().priority = Some(-5);
    m.push_pending("a");
    m.push_pending("b");
    let order = std::sync::Mutex::new(Vec::new());
    let fits = |p: &Pod| {
        order.lock().unwrap().push(p.metadata.uid.clone().unwrap());
        Ok(())
    };
    let ctx = ResizeContext { allocatable: None, fits: &fits };
    let pods = BTreeMap::from([("a".to_string(), grow), ("b".to_string(), shrink)]);
    m.retry_pending(triggers::PERIODIC, &|u| pods.get(u).cloned(), &ctx);
    assert_eq!(*order.lock().unwrap(), ["b", "a"]);
}

fn running(name: &str, id: &str) -> RuntimeContainerStatus {
    RuntimeContainerStatus::running_for_test(name, id)
}

#[test]
fn in_progress_clears_once_actuated_with_a_completed_event() {
    let (m, rec) = manager();
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    m.set_actuated("u1", "c", ResourceValues::of(p.spec.as_ref().unwrap().containers[0].resources.as_ref()));
    let n = resized(&p, "150m", "300m", "64Mi");
    let ctx = ResizeContext { allocatable: None, fits: &fits_always };
    assert!(m.handle_resize(&n, &ctx));
    let rt = RuntimePodStatus { uid: "u1".into(), containers: vec![running("c", "id1")], ..Default::default() };
    m.check_resize_in_progress(&n, &rt);
    assert!(has_in_progress(&m, "u1"), "actual differs from allocated");
    m.set_resize_error(&n, "boom");
    let c = m.conditions("u1");
    assert_eq!((c[0].reason.as_deref(), c[0].message.as_deref()), (Some("Error"), Some("boom")));
    m.clear_resize_error(&n);
    assert_eq!(m.conditions("u1")[0].reason, None);
    m.set_actuated("u1", "c", ResourceValues::of(n.spec.as_ref().unwrap().containers[0].resources.as_ref()));
    m.check_resize_in_progress(&n, &rt);
    assert!(m.conditions("u1").is_empty());
    assert_eq!(reasons_of(&rec), ["ResizeStarted", "ResizeError", "ResizeCompleted"]);
}

#[test]
fn status_reports_allocated_and_actual_resources_and_conditions() {
    let (m, _) = manager();
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    let n = resized(&p, "150m", "300m", "96Mi");
    let ctx = ResizeContext { allocatable: None, fits: &fits_always };
    assert!(m.handle_resize(&n, &ctx));
    let mut rt = RuntimePodStatus { uid: "u1".into(), containers: vec![running("c", "id1")], ..Default::default() };
    // The runtime reports the old values still (quota 20000/100000, 102 shares, 64Mi).
    rt.container_resources.insert(
        "id1".into(),
        api::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 20_000,
            cpu_shares: 102,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        },
    );
    let mut status = PodStatus {
        conditions: Some(vec![
            PodCondition { type_: "PodResizePending".into(), status: "True".into(), ..Default::default() },
            PodCondition { type_: "Ready".into(), status: "True".into(), ..Default::default() },
        ]),
        container_statuses: Some(vec![ContainerStatus { name: "c".into(), ..Default::default() }]),
        ..Default::default()
    };
    m.amend_status(&n, &rt, &mut status);
    assert_eq!(status.observed_generation, Some(2));
    let types: Vec<_> = status.conditions.as_ref().unwrap().iter().map(|c| c.type_.clone()).collect();
    assert_eq!(types, ["Ready", "PodResizeInProgress"], "stale conditions replaced by the current ones");
    assert_eq!(status.conditions.as_ref().unwrap()[0].observed_generation, Some(2));
    let cs = &status.container_statuses.as_ref().unwrap()[0];
    let quantity = |s: &str| Quantity(s.into());
    let list =
        |cpu: &str, mem: &str| Some(BTreeMap::from([("cpu".into(), quantity(cpu)), ("memory".into(), quantity(mem))]));
    assert_eq!(cs.allocated_resources, list("150m", "96Mi"));
    let actual = cs.resources.clone().unwrap();
    assert_eq!(actual.limits, list("200m", "64Mi"));
    assert_eq!(actual.requests, list("100m", "96Mi"));
}

#[test]
fn init_containers_are_resizable_and_quantities_print_as_upstream() {
    let p = crate::types::pod_resources::test_pods::pod_with_init(
        "u",
        vec![sidecar("s", &[("cpu", "10m")], &[]), ctr("init", &[("cpu", "1")], &[])],
        vec![ctr("app", &[], &[])],
    );
    let names: Vec<_> = resizable_containers(&p).map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["s", "init", "app"]);
    assert_eq!(milli_quantity(1500).0, "1500m");
    assert_eq!(milli_quantity(2000).0, "2");
    assert_eq!(binary_quantity(100_663_296).0, "96Mi");
    assert_eq!(binary_quantity(1000).0, "1000");
    assert_eq!(binary_quantity(1_000_000).0, "1000000");
    assert_eq!(shares_to_milli_cpu(153), 150);
    assert_eq!(shares_to_milli_cpu(1), 0);
    assert!(values_match(
        ResourceValues { cpu_request: 1, ..Default::default() },
        ResourceValues { cpu_request: 2, ..Default::default() }
    ));
}

#[test]
fn requested_resizes_are_counted_once_per_change() {
    let (m, _) = manager();
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    let n = resized(&p, "100m", "300m", "32Mi");
    let ctx = ResizeContext { allocatable: None, fits: &fits_always };
    m.handle_resize(&n, &ctx);
    m.handle_resize(&n, &ctx);
    let get = |resource: &str, requirement: &str, operation: &str| {
        m.metrics()
            .requested
            .get_or_create(&metrics::RequestedLabels {
                resource: resource.into(),
                requirement: requirement.into(),
                operation: operation.into(),
            })
            .get()
    };
    assert_eq!(get("cpu", "limits", "increase"), 1);
    assert_eq!(get("memory", "limits", "decrease"), 1);
    assert_eq!(get("memory", "requests", "decrease"), 1);
    assert_eq!(get("cpu", "requests", "increase"), 0);
}

#[test]
fn the_fit_check_may_look_at_other_allocations() {
    let (m, _) = manager();
    let a = burstable("a", "100m", "200m", "64Mi");
    let b = burstable("b", "100m", "200m", "64Mi");
    m.add_pod(&a);
    m.add_pod(&b);
    // As the sync loop's check does: the others at their allocated resources.
    let fits = |_: &Pod| {
        let (other, _) = m.update_pod_from_allocation(&b);
        assert!(other.spec.is_some());
        Ok(())
    };
    let ctx = ResizeContext { allocatable: None, fits: &fits };
    assert!(m.handle_resize(&resized(&a, "150m", "200m", "64Mi"), &ctx));
}

/// `burstable` with pod-level requests and limits.
fn with_pod_level(p: Pod, cpu: &str, mem: &str) -> Pod {
    crate::types::pod_resources::test_pods::with_pod_resources(
        p,
        &[("cpu", cpu), ("memory", mem)],
        &[("cpu", cpu), ("memory", mem)],
    )
}

/// Admits `p` (its pod cgroup made with its pod-level resources), then returns it resized
/// to pod-level cpu and memory `cpu` and `mem`, not allocated yet.
fn admitted_then_resized(m: &AllocationManager, p: &Pod, cpu: &str, mem: &str) -> Pod {
    m.add_pod(p);
    m.initialize_pod_actuated(p);
    let mut n = with_pod_level(p.clone(), cpu, mem);
    n.metadata.generation = Some(2);
    let (allocated, differs) = m.update_pod_from_allocation(&n);
    assert!(differs, "the pod-level resources are not allocated yet");
    assert_eq!(allocated.spec.unwrap().resources, p.spec.as_ref().unwrap().resources);
    n
}

/// A resize of pod-level resources (`InPlacePodLevelResourcesVerticalScaling`) is
/// allocated, checkpointed and in progress until the pod cgroup has it, as a container's.
#[test]
fn a_pod_level_resize_is_allocated_checkpointed_and_in_progress_until_actuated() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = MemoryRecorder::new("node");
    let m = AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default())
        .unwrap()
        .with_recorder(Arc::new(recorder.clone()));
    let p = with_pod_level(burstable("u1", "100m", "200m", "64Mi"), "300m", "128Mi");
    let n = admitted_then_resized(&m, &p, "500m", "256Mi");
    let ctx = ResizeContext { allocatable: Some((2000, 1 << 30)), fits: &fits_always };
    assert!(m.handle_resize(&n, &ctx));
    assert!(!m.update_pod_from_allocation(&n).1, "allocated");
    let rt = RuntimePodStatus { uid: "u1".into(), ..Default::default() };
    m.check_resize_in_progress(&n, &rt);
    assert!(has_in_progress(&m, "u1"), "the pod cgroup still has the old values");
    m.set_pod_actuated("u1", ResourceValues::of_pod(&n));
    m.check_resize_in_progress(&n, &rt);
    assert!(!has_in_progress(&m, "u1"));
    assert_eq!(reasons_of(&recorder), ["ResizeStarted", "ResizeCompleted"]);
    // The checkpoint keeps the pod-level allocation across a restart.
    let m = AllocationManager::new(dir.path(), NodeResizeConfig::default(), ResizeMetrics::default()).unwrap();
    assert!(!m.update_pod_from_allocation(&n).1);
    assert!(m.update_pod_from_allocation(&p).1);
    // More than the node has is infeasible, counted on the pod-level requests.
    let huge = with_pod_level(p.clone(), "3", "256Mi");
    assert!(!m.handle_resize(&huge, &ctx));
    assert_eq!(pending(&m, "u1").unwrap().0, "Infeasible");
}

/// A resize may add pod-level resources to a pod that had none: allocated, and in
/// progress until the pod cgroup has them.
#[test]
fn a_resize_that_adds_pod_level_resources_is_allocated() {
    let (m, _) = manager();
    let n = admitted_then_resized(&m, &burstable("u1", "100m", "200m", "64Mi"), "300m", "128Mi");
    let ctx = ResizeContext { allocatable: Some((2000, 1 << 30)), fits: &fits_always };
    assert!(m.handle_resize(&n, &ctx));
    assert!(!m.update_pod_from_allocation(&n).1);
    let rt = RuntimePodStatus { uid: "u1".into(), ..Default::default() };
    m.check_resize_in_progress(&n, &rt);
    assert!(has_in_progress(&m, "u1"), "the pod cgroup has no pod-level values yet");
}

/// An allocation checkpointed by an older swiftlet has no `PodLevelResources` at all
/// (upstream writes `null` for none): it leaves the spec's, and the pod's next admission
/// fills them in from the spec.
#[test]
fn an_allocation_from_before_pod_level_resources_keeps_the_specs() {
    let p = with_pod_level(burstable("u1", "100m", "200m", "64Mi"), "300m", "128Mi");
    let mut old = allocation_from_pod(&p);
    old.pod_level_resources = None;
    let (allocated, differs) = pod_from_allocation(&p, &old);
    assert!(!differs);
    assert_eq!(allocated.spec.unwrap().resources, p.spec.as_ref().unwrap().resources);
    let (m, _) = manager();
    m.inner.lock().unwrap().allocated.insert("u1".into(), old);
    m.add_pod(&p);
    let alloc = m.inner.lock().unwrap().allocated["u1"].clone();
    assert_eq!(alloc.pod_level_resources, Some(p.spec.as_ref().unwrap().resources.clone()));
}

fn restarted(dir: &std::path::Path) -> AllocationManager {
    AllocationManager::new(dir, NodeResizeConfig::default(), ResizeMetrics::default()).unwrap()
}

/// What the containers and the pod cgroup were last given outlives the agent, in
/// upstream's `actuated_pods_state`: a pod-level resize allocated but not yet actuated
/// when the agent stops is still in progress after its restart, not taken as done.
#[test]
fn actuated_records_survive_a_restart_so_an_interrupted_resize_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = restarted(dir.path());
    let p = with_pod_level(burstable("u1", "100m", "200m", "64Mi"), "300m", "128Mi");
    let n = admitted_then_resized(&m, &p, "500m", "256Mi");
    let c = &p.spec.as_ref().unwrap().containers[0];
    m.set_actuated("u1", "c", ResourceValues::of_container(&p, c));
    let ctx = ResizeContext { allocatable: Some((2000, 1 << 30)), fits: &fits_always };
    assert!(m.handle_resize(&n, &ctx), "allocated; the agent stops before the pod cgroup is set");
    let file = dir.path().join(checkpoint::ACTUATED_FILE_NAME);
    let on_disk = checkpoint::load(&file).unwrap();
    assert_eq!(on_disk["u1"].pod_level_resources, Some(Some(ResourceValues::of_pod(&p).to_requirements())));
    assert_eq!(on_disk["u1"].container_resources["c"], ResourceValues::of_container(&p, c).to_requirements());

    let m = restarted(dir.path());
    m.add_pod(&n);
    let (allocated, _) = m.update_pod_from_allocation(&n);
    m.initialize_pod_actuated(&allocated);
    assert_eq!(m.pod_actuated("u1"), Some(ResourceValues::of_pod(&p)), "the old values, not the allocation");
    assert_eq!(m.actuated("u1", "c"), Some(ResourceValues::of_container(&p, c)));
    let rt = RuntimePodStatus { uid: "u1".into(), ..Default::default() };
    m.check_resize_in_progress(&allocated, &rt);
    assert!(has_in_progress(&m, "u1"), "the pod cgroup still has the old values");

    // A pod the agent forgets leaves the file too.
    m.remove_pod("u1");
    assert!(checkpoint::load(&file).unwrap().is_empty());
    assert_eq!(restarted(dir.path()).pod_actuated("u1"), None);
}

/// A pod without pod-level resources is recorded with `null` ones, as upstream writes
/// them, and reads back as all zero; a record that does not change is not written again.
#[test]
fn actuated_records_without_pod_level_resources_are_null() {
    let dir = tempfile::tempdir().unwrap();
    let m = restarted(dir.path());
    let p = burstable("u1", "100m", "200m", "64Mi");
    m.add_pod(&p);
    m.initialize_pod_actuated(&p);
    let file = dir.path().join(checkpoint::ACTUATED_FILE_NAME);
    assert_eq!(checkpoint::load(&file).unwrap()["u1"].pod_level_resources, Some(None));
    std::fs::remove_file(&file).unwrap();
    m.initialize_pod_actuated(&p);
    m.set_pod_actuated("u1", ResourceValues::default());
    assert!(!file.exists(), "nothing changed, nothing written");
    assert_eq!(restarted(dir.path()).pod_actuated("u1"), None, "the file was removed above");
}
