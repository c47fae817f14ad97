use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ContainerResizePolicy, Pod};

use super::*;
use crate::allocation::NodeResizeConfig;
use crate::cm::Result as CmResult;
use crate::cm::fake::{FakeCall, FakePodContainerManager};
use crate::container::api;
use crate::container::fake::FakeRuntime;
use crate::container::pod_status::RuntimeContainerStatus;
use crate::types::pod_resources::test_pods::{ctr, pod};
use crate::types::qos::QosClass;

fn values(cpu_req: i64, cpu_lim: i64, mem_req: i64, mem_lim: i64) -> ResourceValues {
    ResourceValues { cpu_request: cpu_req, cpu_limit: cpu_lim, memory_request: mem_req, memory_limit: mem_lim }
}

fn burstable(cpu_req: &str, cpu_lim: &str, mem_req: &str, mem_lim: &str, memory_restarts: bool) -> Pod {
    let mut c = ctr("c", &[("cpu", cpu_req), ("memory", mem_req)], &[("cpu", cpu_lim), ("memory", mem_lim)]);
    if memory_restarts {
        c.resize_policy = Some(vec![ContainerResizePolicy {
            resource_name: "memory".into(),
            restart_policy: "RestartContainer".into(),
        }]);
    }
    pod("u1", vec![c])
}

fn running(id: &str) -> RuntimeContainerStatus {
    RuntimeContainerStatus::running_for_test("c", id)
}

fn status(id: &str) -> RuntimePodStatus {
    RuntimePodStatus { uid: "u1".into(), containers: vec![running(id)], ..Default::default() }
}

const MI: i64 = 1 << 20;

#[test]
fn not_required_resizes_in_place() {
    let p = burstable("150m", "300m", "64Mi", "192Mi", false);
    let mut actions = PodActions::default();
    let now = values(100, 200, 64 * MI, 128 * MI);
    let plan = compute_pod_resize_action(&p, &status("id1"), &|_| Some(now), None, &mut actions).unwrap();
    assert!(actions.containers_to_kill.is_empty() && actions.containers_to_start.is_empty());
    assert!(plan.update_pod_resources);
    assert_eq!(plan.memory.len(), 1);
    assert_eq!(plan.cpu.len(), 1);
    assert_eq!(plan.cpu[0].desired, values(150, 300, 64 * MI, 192 * MI));
    assert_eq!(plan.cpu[0].current, now);
}

#[test]
fn restart_container_policy_restarts_on_memory_only() {
    let p = burstable("100m", "200m", "64Mi", "192Mi", true);
    let mut actions = PodActions::default();
    let now = values(100, 200, 64 * MI, 128 * MI);
    let plan = compute_pod_resize_action(&p, &status("id1"), &|_| Some(now), None, &mut actions).unwrap();
    assert_eq!(actions.containers_to_kill["id1"], ("c".to_string(), "Container c resize requires restart".to_string()));
    assert_eq!(actions.containers_to_start, [0]);
    assert!(plan.memory.is_empty() && plan.cpu.is_empty() && plan.update_pod_resources);

    // A cpu change of the same container stays in place.
    let p = burstable("150m", "200m", "64Mi", "128Mi", true);
    let mut actions = PodActions::default();
    let plan = compute_pod_resize_action(&p, &status("id1"), &|_| Some(now), None, &mut actions).unwrap();
    assert!(actions.containers_to_kill.is_empty());
    assert_eq!(plan.cpu.len(), 1);
}

/// A plain init container is resized while it runs (the pod is initializing): in place,
/// or restarted as an init container when its policy says so; once it exited, never.
#[test]
fn a_running_plain_init_container_is_resized() {
    let mut init = ctr("c", &[("cpu", "150m"), ("memory", "64Mi")], &[("cpu", "300m"), ("memory", "192Mi")]);
    let p = crate::types::pod_resources::test_pods::pod_with_init("u1", vec![init.clone()], vec![ctr("app", &[], &[])]);
    let now = values(100, 200, 64 * MI, 128 * MI);
    let mut actions = PodActions::default();
    let plan = compute_pod_resize_action(&p, &status("id1"), &|_| Some(now), None, &mut actions).unwrap();
    assert!(plan.cpu[0].init && plan.cpu[0].index == 0 && plan.memory.len() == 1, "{plan:?}");
    assert!(actions.containers_to_kill.is_empty());

    init.resize_policy =
        Some(vec![ContainerResizePolicy { resource_name: "memory".into(), restart_policy: "RestartContainer".into() }]);
    let p = crate::types::pod_resources::test_pods::pod_with_init("u1", vec![init], vec![ctr("app", &[], &[])]);
    let mut actions = PodActions::default();
    compute_pod_resize_action(&p, &status("id1"), &|_| Some(now), None, &mut actions).unwrap();
    assert!(actions.containers_to_kill.contains_key("id1"));
    assert_eq!(
        (actions.init_containers_to_start.as_slice(), actions.containers_to_start.as_slice()),
        (&[0][..], &[][..])
    );

    let mut exited = status("id1");
    exited.containers[0].state = ContainerState::Exited;
    assert_eq!(compute_pod_resize_action(&p, &exited, &|_| Some(now), None, &mut PodActions::default()), None);
}

#[test]
fn nothing_to_do_when_actuated_matches_or_the_pod_is_killed() {
    let p = burstable("100m", "200m", "64Mi", "128Mi", true);
    let now = values(100, 200, 64 * MI, 128 * MI);
    let mut actions = PodActions::default();
    assert_eq!(compute_pod_resize_action(&p, &status("id1"), &|_| Some(now), None, &mut actions), None);
    let mut actions = PodActions { kill_pod: true, ..Default::default() };
    let other = values(1, 1, 1, 1);
    assert_eq!(compute_pod_resize_action(&p, &status("id1"), &|_| Some(other), None, &mut actions), None);
    assert!(actions.containers_to_kill.is_empty());
}

#[test]
fn unknown_actuated_resources_are_reapplied_in_place_never_restarted() {
    let p = burstable("100m", "200m", "64Mi", "128Mi", true);
    let mut actions = PodActions::default();
    let plan = compute_pod_resize_action(&p, &status("id1"), &|_| None, None, &mut actions).unwrap();
    assert!(actions.containers_to_kill.is_empty());
    assert_eq!((plan.memory.len(), plan.cpu.len()), (1, 1));
}

#[test]
fn a_memory_request_change_alone_needs_no_runtime_call() {
    let p = burstable("100m", "200m", "96Mi", "128Mi", false);
    let mut actions = PodActions::default();
    let now = values(100, 200, 64 * MI, 128 * MI);
    let plan = compute_pod_resize_action(&p, &status("id1"), &|_| Some(now), None, &mut actions).unwrap();
    assert!(plan.memory.is_empty() && plan.cpu.is_empty());
    assert_eq!(plan.memory_request_only, [("c".to_string(), values(100, 200, 96 * MI, 128 * MI))]);
}

/// A pod container manager that notes, with every pod cgroup write, how many container
/// updates the runtime had seen by then.
#[derive(Debug)]
struct Ordered {
    inner: FakePodContainerManager,
    rt: Arc<FakeRuntime>,
    log: Mutex<Vec<(PodResourceConfig, usize)>>,
}

impl Ordered {
    fn updates(&self) -> usize {
        self.rt.calls().iter().filter(|c| *c == "update_container_resources").count()
    }
}

impl PodContainerManager for Ordered {
    fn ensure_node_cgroups(&self) -> CmResult<()> {
        self.inner.ensure_node_cgroups()
    }
    fn cgroup_parent(&self, pod: &Pod) -> String {
        self.inner.cgroup_parent(pod)
    }
    fn ensure_pod_cgroup(&self, pod: &Pod) -> CmResult<()> {
        self.inner.ensure_pod_cgroup(pod)
    }
    fn remove_pod_cgroup(&self, uid: &str) -> CmResult<()> {
        self.inner.remove_pod_cgroup(uid)
    }
    fn list_pod_cgroups(&self) -> CmResult<Vec<(String, QosClass)>> {
        self.inner.list_pod_cgroups()
    }
    fn pod_cgroup_exists(&self, uid: &str) -> bool {
        self.inner.pod_cgroup_exists(uid)
    }
    fn update_qos_cgroups(&self, pods: &[Pod]) -> CmResult<()> {
        self.inner.update_qos_cgroups(pods)
    }
    fn pod_cgroup_config(&self, pod: &Pod) -> CmResult<Option<PodResourceConfig>> {
        self.inner.pod_cgroup_config(pod)
    }
    fn update_pod_cgroup(&self, pod: &Pod, cfg: &PodResourceConfig) -> CmResult<()> {
        self.log.lock().unwrap().push((cfg.clone(), self.updates()));
        self.inner.update_pod_cgroup(pod, cfg)
    }
    fn pod_memory_usage(&self, pod: &Pod) -> CmResult<Option<u64>> {
        self.inner.pod_memory_usage(pod)
    }
}

async fn setup(from: &Pod) -> (Arc<FakeRuntime>, Ordered, AllocationManager, String) {
    let rt = Arc::new(FakeRuntime::default());
    let sb = rt.run_pod_sandbox(api::PodSandboxConfig::default(), String::new()).await.unwrap();
    let id = rt.create_container(&sb, api::ContainerConfig::default(), api::PodSandboxConfig::default()).await.unwrap();
    rt.start_container(&id).await.unwrap();
    let cm = Ordered { inner: FakePodContainerManager::default(), rt: rt.clone(), log: Mutex::default() };
    cm.inner.set_pod_config("u1", crate::cm::resources::resource_config_for_pod(from, true));
    (rt, cm, AllocationManager::in_memory(NodeResizeConfig::default()), id)
}

fn plan_for(p: &Pod, id: &str, now: ResourceValues) -> ResizePlan {
    compute_pod_resize_action(p, &status(id), &|_| Some(now), None, &mut PodActions::default()).unwrap()
}

#[tokio::test]
async fn growth_sets_the_pod_cgroup_before_the_containers() {
    let old = burstable("100m", "200m", "64Mi", "128Mi", false);
    let new = burstable("150m", "300m", "64Mi", "192Mi", false);
    let (rt, cm, alloc, id) = setup(&old).await;
    let plan = plan_for(&new, &id, values(100, 200, 64 * MI, 128 * MI));
    do_pod_resize_action(rt.as_ref(), &cm, &alloc, &new, &plan).await.unwrap();
    let log = cm.log.lock().unwrap().clone();
    // memory limit (before the memory update), cpu quota and shares (before the cpu update).
    assert_eq!(log.len(), 3, "{log:?}");
    assert_eq!((log[0].0.memory_limit, log[0].1), (Some(192 * MI), 0));
    assert_eq!((log[1].0.cpu_quota, log[1].1), (Some(30_000), 1));
    assert_eq!((log[2].0.cpu_shares, log[2].1), (Some(153), 1));
    assert_eq!(cm.updates(), 2);
    let st = rt.container_status(&id).await.unwrap();
    let linux = st.resources.unwrap().linux.unwrap();
    assert_eq!((linux.cpu_quota, linux.cpu_shares, linux.memory_limit_in_bytes), (30_000, 153, 192 * MI));
    assert_eq!(alloc.actuated("u1", "c"), Some(values(150, 300, 64 * MI, 192 * MI)));
}

#[tokio::test]
async fn shrinking_sets_the_pod_cgroup_after_the_containers() {
    let old = burstable("150m", "300m", "64Mi", "192Mi", false);
    let new = burstable("100m", "200m", "64Mi", "128Mi", false);
    let (rt, cm, alloc, id) = setup(&old).await;
    let plan = plan_for(&new, &id, values(150, 300, 64 * MI, 192 * MI));
    do_pod_resize_action(rt.as_ref(), &cm, &alloc, &new, &plan).await.unwrap();
    let log = cm.log.lock().unwrap().clone();
    assert_eq!(log.len(), 3, "{log:?}");
    assert_eq!((log[0].0.memory_limit, log[0].1), (Some(128 * MI), 1));
    assert_eq!((log[1].0.cpu_shares, log[1].1), (Some(102), 2));
    assert_eq!((log[2].0.cpu_quota, log[2].1), (Some(20_000), 2));
    assert!(cm.inner.calls().iter().any(|c| matches!(c, FakeCall::UpdatePodCgroup(u, _) if u == "u1")));
}

#[tokio::test]
async fn a_memory_limit_below_usage_is_refused() {
    let old = burstable("100m", "200m", "64Mi", "128Mi", false);
    let new = burstable("100m", "200m", "64Mi", "96Mi", false);
    let (rt, cm, alloc, id) = setup(&old).await;
    cm.inner.set_memory_usage("u1", u64::try_from(100 * MI).unwrap());
    let plan = plan_for(&new, &id, values(100, 200, 64 * MI, 128 * MI));
    let err = do_pod_resize_action(rt.as_ref(), &cm, &alloc, &new, &plan).await.unwrap_err();
    assert_eq!(
        err,
        "cannot decrease memory limits: attempting to set pod memory limit (100663296) below current usage (104857600)"
    );
    assert!(cm.log.lock().unwrap().is_empty());
    assert_eq!(cm.updates(), 0);
    assert_eq!(alloc.actuated("u1", "c"), None);
    // A limit that grows is not checked against the usage (upstream 1.37).
    let grown = burstable("100m", "200m", "64Mi", "160Mi", false);
    cm.inner.set_memory_usage("u1", u64::try_from(150 * MI).unwrap());
    let plan = plan_for(&grown, &id, values(100, 200, 64 * MI, 128 * MI));
    do_pod_resize_action(rt.as_ref(), &cm, &alloc, &grown, &plan).await.unwrap();
}

/// A pod with pod-level `requests` and `limits` and one container `c` with `requests`
/// only: it inherits the pod-level limits.
fn pod_level(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
    use crate::types::pod_resources::test_pods::with_pod_resources;
    with_pod_resources(pod("u1", vec![ctr("c", &[("cpu", "100m"), ("memory", "64Mi")], &[])]), requests, limits)
}

/// A pod-level limit is what a container without its own gets: changing it updates the
/// container (inherited limits compared) and the pod cgroup; a change of the pod-level
/// requests alone is a pod cgroup update.
#[test]
fn a_pod_level_resize_updates_the_containers_that_inherit_and_the_pod_cgroup() {
    let old = pod_level(&[("cpu", "200m"), ("memory", "128Mi")], &[("cpu", "400m"), ("memory", "256Mi")]);
    let new = pod_level(&[("cpu", "200m"), ("memory", "128Mi")], &[("cpu", "400m"), ("memory", "200Mi")]);
    let was = Some(ResourceValues::of_pod(&old));
    assert_eq!(was, Some(values(200, 400, 128 * MI, 256 * MI)));
    let inherited = values(100, 400, 64 * MI, 256 * MI);
    assert_eq!(ResourceValues::of_container(&old, &old.spec.as_ref().unwrap().containers[0]), inherited);
    let mut actions = PodActions::default();
    let plan = compute_pod_resize_action(&new, &status("id1"), &|_| Some(inherited), was, &mut actions).unwrap();
    assert_eq!(plan.pod_level, Some(values(200, 400, 128 * MI, 200 * MI)));
    assert!(plan.update_pod_resources);
    assert_eq!(plan.memory.len(), 1);
    assert_eq!(plan.memory[0].desired, values(100, 400, 64 * MI, 200 * MI));
    assert!(plan.cpu.is_empty());
    // Nothing changed: nothing to do.
    assert_eq!(compute_pod_resize_action(&old, &status("id1"), &|_| Some(inherited), was, &mut actions), None);
    // Pod-level requests only: the pod cgroup alone.
    let more = pod_level(&[("cpu", "300m"), ("memory", "128Mi")], &[("cpu", "400m"), ("memory", "256Mi")]);
    let plan = compute_pod_resize_action(&more, &status("id1"), &|_| Some(inherited), was, &mut actions).unwrap();
    assert_eq!(plan.pod_level, Some(values(300, 400, 128 * MI, 256 * MI)));
    assert!(plan.memory.is_empty() && plan.cpu.is_empty(), "{plan:?}");
}

#[tokio::test]
async fn a_pod_level_resize_sets_the_pod_cgroup_and_records_it() {
    let old = pod_level(&[("cpu", "200m"), ("memory", "128Mi")], &[("cpu", "400m"), ("memory", "256Mi")]);
    let new = pod_level(&[("cpu", "300m"), ("memory", "128Mi")], &[("cpu", "600m"), ("memory", "256Mi")]);
    let (rt, cm, alloc, id) = setup(&old).await;
    alloc.initialize_pod_actuated(&old);
    let inherited = values(100, 400, 64 * MI, 256 * MI);
    let plan = compute_pod_resize_action(
        &new,
        &status(&id),
        &|_| Some(inherited),
        alloc.pod_actuated("u1"),
        &mut PodActions::default(),
    )
    .unwrap();
    do_pod_resize_action(rt.as_ref(), &cm, &alloc, &new, &plan).await.unwrap();
    let log = cm.log.lock().unwrap().clone();
    // The cpu limit and shares grow on the pod cgroup before the container's quota does.
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!((log[0].0.cpu_quota, log[0].1), (Some(60_000), 0));
    assert_eq!((log[1].0.cpu_shares, log[1].1), (Some(307), 0));
    let st = rt.container_status(&id).await.unwrap();
    assert_eq!(st.resources.unwrap().linux.unwrap().cpu_quota, 60_000, "the inherited limit");
    assert_eq!(alloc.pod_actuated("u1"), Some(values(300, 600, 128 * MI, 256 * MI)));
    assert_eq!(alloc.actuated("u1", "c"), Some(values(100, 600, 64 * MI, 256 * MI)));
}

#[test]
fn reported_resources_stand_in_for_an_unknown_actuation() {
    let p = burstable("100m", "200m", "64Mi", "128Mi", false);
    let mut st = status("id1");
    assert_eq!(reported_values(&p, &st, "c"), None, "the runtime reports nothing");
    st.container_resources.insert(
        "id1".into(),
        api::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 20_000,
            cpu_shares: 102,
            memory_limit_in_bytes: 128 * MI,
            ..Default::default()
        },
    );
    assert_eq!(reported_values(&p, &st, "c"), Some(values(100, 200, 64 * MI, 128 * MI)));
    let mut actions = PodActions::default();
    let actual = |c: &str| reported_values(&p, &st, c);
    assert_eq!(compute_pod_resize_action(&p, &st, &actual, None, &mut actions), None, "nothing to re-apply");
}
