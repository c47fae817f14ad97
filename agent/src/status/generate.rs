//! Turning the runtime's view of a pod into a `v1.PodStatus`, as upstream does.

use crate::types::pod_resources::is_restartable_init_container;
use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::container::helpers::{
    all_containers_could_restart, all_containers_restart_cleaned_up, container_should_restart,
    should_all_containers_restart, should_container_be_restarted,
};
use crate::container::reasons;
use crate::container::{ContainerState, RuntimeContainerStatus, RuntimePodStatus};

/// What status generation needs besides the pod and the runtime state.
#[derive(Debug)]
pub struct StatusInputs<'a> {
    /// The previous status (for transition times and container history).
    pub old: Option<&'a PodStatus>,
    /// Runtime name for container ids (`containerd://<id>`).
    pub runtime_name: &'a str,
    /// Last start failure per container name: (reason, message).
    pub start_failures: &'a HashMap<String, (String, String)>,
    /// Whether the pod is terminal (its worker decided no container will run again).
    pub pod_is_terminal: bool,
    /// When the kubelet first saw the pod (`status.startTime`).
    pub start_time: Option<SystemTime>,
    /// The node's IP for hostIP, if known.
    pub host_ip: Option<&'a str>,
    /// `QoS` class of the pod.
    pub qos_class: &'a str,
    /// The prober, which decides `ready` and `started` (without it: running = ready).
    pub probes: Option<&'a crate::prober::ProbeManager>,
}

pub(crate) fn time(t: SystemTime) -> Time {
    // Kubernetes timestamps have second precision on the wire (metav1.Time).
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Upstream `getPhase` (with `ContainerRestartRules`).
#[must_use]
pub fn get_phase(spec: &PodSpec, info: &[ContainerStatus], pod_is_terminal: bool, is_static: bool) -> String {
    let find = |name: &str| info.iter().find(|s| s.name == name);
    // With `ContainerRestartRules` each container's own policy and rules say whether an
    // exit is final (`container_should_restart`); without them the pod's policy does.
    // A container stopped by a `RestartAllContainers` reset runs again too.
    let restarts = |c: &Container, t: &ContainerStateTerminated| {
        container_should_restart(c, spec, t.exit_code) || t.reason.as_deref() == Some(RESTARTING_ALL_CONTAINERS)
    };
    let mut pending_init = 0;
    let mut failed_init_for_good = 0;
    for c in spec.init_containers.iter().flatten().filter(|c| !is_restartable_init_container(c)) {
        let Some(s) = find(&c.name) else {
            pending_init += 1;
            continue;
        };
        let st = s.state.as_ref();
        if st.and_then(|x| x.running.as_ref()).is_some() {
            pending_init += 1;
        } else if let Some(t) = st.and_then(|x| x.terminated.as_ref()) {
            if t.exit_code != 0 && !restarts(c, t) {
                failed_init_for_good += 1;
            }
        } else if st.and_then(|x| x.waiting.as_ref()).is_some() {
            match s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
                Some(t) if t.exit_code != 0 && !restarts(c, t) => failed_init_for_good += 1,
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in spec.init_containers.iter().flatten().filter(|c| is_restartable_init_container(c)) {
        let Some(s) = find(&c.name) else {
            unknown += 1;
            continue;
        };
        let st = s.state.as_ref();
        if st.and_then(|x| x.running.as_ref()).is_some() {
            if !s.started.unwrap_or(false) {
                pending_init += 1;
            }
            running += 1;
        } else if st.and_then(|x| x.terminated.as_ref()).is_some() {
        } else if st.and_then(|x| x.waiting.as_ref()).is_some() {
            if s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_none() {
                pending_init += 1;
                waiting += 1;
            }
        } else {
            pending_init += 1;
            unknown += 1;
        }
    }
    let mut stopped_for_good = 0;
    for c in &spec.containers {
        let Some(s) = find(&c.name) else {
            unknown += 1;
            continue;
        };
        let st = s.state.as_ref();
        if st.and_then(|x| x.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = st.and_then(|x| x.terminated.as_ref()) {
            stopped += 1;
            if !restarts(c, t) {
                stopped_for_good += 1;
            }
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.and_then(|x| x.waiting.as_ref()).is_some() {
            if let Some(t) = s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
                stopped += 1;
                if !restarts(c, t) {
                    stopped_for_good += 1;
                }
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init_for_good > 0 {
        return "Failed".into();
    }
    let any_regular_started = spec.containers.iter().any(|c| {
        find(&c.name).is_some_and(|s| {
            s.state.as_ref().is_some_and(|x| x.running.is_some() || x.terminated.is_some())
                || s.last_state.as_ref().is_some_and(|l| l.terminated.is_some())
        })
    });
    if (pending_init > 0 && !any_regular_started) || waiting > 0 {
        return "Pending".into();
    }
    if running > 0 && unknown == 0 {
        return "Running".into();
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        // Upstream TODO(#116484) keeps static pods out of the terminal shortcut.
        if pod_is_terminal && !is_static {
            return if stopped == succeeded { "Succeeded" } else { "Failed" }.into();
        }
        // Some container will run again: the pod still runs.
        if stopped != stopped_for_good {
            return "Running".into();
        }
        return if stopped == succeeded { "Succeeded" } else { "Failed" }.into();
    }
    "Pending".into()
}

/// The reason of the states a `RestartAllContainers` reset gives (upstream
/// `RestartingAllContainers`).
pub const RESTARTING_ALL_CONTAINERS: &str = "RestartingAllContainers";
/// The message of a container a reset removed.
const REMOVED_BY_RESET: &str = "The container is removed because RestartAllContainers in place";

/// Upstream `convertContainerStatus`. `pod_restarting`: the pod restarts all its
/// containers in place. A reset removes the old instances, so the restart count and the
/// last termination come from the old status (`RestartAllContainersOnContainerExits`).
fn convert(
    cs: &RuntimeContainerStatus,
    runtime_name: &str,
    old: Option<&ContainerStatus>,
    pod_restarting: bool,
) -> ContainerStatus {
    let cid = format!("{runtime_name}://{}", cs.id);
    let mut st = ContainerStatus {
        name: cs.name.clone(),
        restart_count: cs.restart_count as i32,
        image: cs.image.clone(),
        image_id: cs.image_ref.clone(),
        container_id: Some(cid.clone()),
        // Upstream `convertContainerStatusUser` (SupplementalGroupsPolicy, GA): the
        // process's ids as the runtime reports them.
        user: cs.user.as_ref().map(|u| k8s_openapi::api::core::v1::ContainerUser {
            linux: Some(k8s_openapi::api::core::v1::LinuxContainerUser {
                uid: u.uid,
                gid: u.gid,
                supplemental_groups: Some(u.supplemental_groups.clone()),
            }),
        }),
        ..Default::default()
    };
    let old_terminated = old.and_then(|o| o.state.as_ref()?.terminated.as_ref());
    if let Some(o) = old {
        st.restart_count = st.restart_count.max(o.restart_count);
        if o.container_id != st.container_id && old_terminated.is_some() {
            st.last_state = Some(ApiState { terminated: old_terminated.cloned(), ..Default::default() });
        } else if let Some(t) = o.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
            st.last_state = Some(ApiState { terminated: Some(t.clone()), ..Default::default() });
        }
    }
    st.state = Some(match cs.state {
        ContainerState::Running => {
            if let Some(o) = old
                && old_terminated.is_some()
                && o.restart_count >= cs.restart_count as i32
            {
                st.restart_count = o.restart_count + 1;
            }
            ApiState {
                running: Some(ContainerStateRunning { started_at: cs.started_at.map(time) }),
                ..Default::default()
            }
        }
        ContainerState::Exited => ApiState {
            terminated: Some(ContainerStateTerminated {
                exit_code: cs.exit_code,
                reason: (!cs.reason.is_empty()).then(|| cs.reason.clone()),
                message: (!cs.message.is_empty()).then(|| cs.message.clone()),
                started_at: cs.started_at.map(time),
                finished_at: cs.finished_at.map(time),
                container_id: Some(cid),
                ..Default::default()
            }),
            ..Default::default()
        },
        ContainerState::Unknown if old.and_then(|o| o.state.as_ref()).is_some_and(|s| s.running.is_some()) => {
            st.restart_count = old.map_or(0, |o| o.restart_count) + 1;
            let reason = if pod_restarting { RESTARTING_ALL_CONTAINERS } else { "ContainerStatusUnknown" };
            ApiState {
                terminated: Some(ContainerStateTerminated {
                    reason: Some(reason.into()),
                    message: Some("The container could not be located when the pod was terminated".into()),
                    exit_code: 137,
                    ..Default::default()
                }),
                ..Default::default()
            }
        }
        _ => ApiState { waiting: Some(ContainerStateWaiting::default()), ..Default::default() },
    });
    st
}

/// Which list of a pod's containers (and of its status) a conversion is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    Containers,
    Init,
    Ephemeral,
}

/// Upstream `convertToAPIContainerStatuses` for one list of containers.
fn container_statuses(
    pod: &Pod,
    rt: &RuntimePodStatus,
    inputs: &StatusInputs<'_>,
    containers: &[Container],
    has_init: bool,
    list: List,
    pod_restarting: bool,
) -> Vec<ContainerStatus> {
    let is_init = list == List::Init;
    let old_list = inputs.old.and_then(|o| match list {
        List::Containers => o.container_statuses.as_ref(),
        List::Init => o.init_container_statuses.as_ref(),
        List::Ephemeral => o.ephemeral_container_statuses.as_ref(),
    });
    let old: HashMap<&str, &ContainerStatus> =
        old_list.iter().flat_map(|l| l.iter()).map(|s| (s.name.as_str(), s)).collect();
    let default_reason = if has_init { reasons::POD_INITIALIZING } else { reasons::CONTAINER_CREATING };
    let mut statuses: HashMap<String, ContainerStatus> = HashMap::new();
    for c in containers {
        let mut st = ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            state: Some(ApiState {
                waiting: Some(ContainerStateWaiting { reason: Some(default_reason.into()), message: None }),
                ..Default::default()
            }),
            ready: false,
            ..Default::default()
        };
        if let Some(o) = old.get(c.name.as_str()) {
            if o.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
                st = (*o).clone();
            } else {
                st.restart_count = o.restart_count;
                st.last_state.clone_from(&o.last_state);
            }
        }
        statuses.insert(c.name.clone(), st);
    }
    // A container that was running and is now gone from the runtime terminated somehow.
    for c in containers {
        if rt.containers.iter().any(|r| r.name == c.name) {
            continue;
        }
        let Some(o) = old.get(c.name.as_str()) else { continue };
        let st = statuses.get_mut(&c.name).expect("inserted above");
        // Removed by a `RestartAllContainers` reset: waiting to run again.
        if pod_restarting && o.state.as_ref().is_none_or(|s| s.waiting.is_none()) {
            st.state = Some(ApiState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(RESTARTING_ALL_CONTAINERS.into()),
                    message: Some(REMOVED_BY_RESET.into()),
                }),
                ..Default::default()
            });
            st.last_state = Some(ApiState {
                terminated: Some(ContainerStateTerminated {
                    reason: Some(RESTARTING_ALL_CONTAINERS.into()),
                    message: Some(REMOVED_BY_RESET.into()),
                    exit_code: 137,
                    ..Default::default()
                }),
                ..Default::default()
            });
            st.restart_count = o.restart_count + 1;
            continue;
        }
        if o.state.as_ref().is_none_or(|s| s.running.is_none()) {
            continue;
        }
        let is_default = st
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
        if !is_default || st.last_state.as_ref().is_some_and(|l| l.terminated.is_some()) {
            continue;
        }
        st.last_state = Some(ApiState {
            terminated: Some(ContainerStateTerminated {
                reason: Some("ContainerStatusUnknown".into()),
                message: Some(
                    "The container could not be located when the pod was deleted.  The container used to be Running"
                        .into(),
                ),
                exit_code: 137,
                ..Default::default()
            }),
            ..Default::default()
        });
        if pod.metadata.deletion_timestamp.is_none() {
            st.restart_count += 1;
        }
    }
    // Newest first: the first instance is the state, the second the last state.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for cs in &rt.containers {
        if !statuses.contains_key(&cs.name)
            || cs.init != is_init && rt.containers.iter().any(|x| x.name == cs.name && x.init == is_init)
        {
            continue;
        }
        let n = seen.entry(cs.name.as_str()).or_default();
        if *n >= 2 {
            continue;
        }
        let converted = convert(cs, inputs.runtime_name, old.get(cs.name.as_str()).copied(), pod_restarting);
        let entry = statuses.get_mut(&cs.name).expect("checked");
        if *n == 0 {
            *entry = converted;
        } else {
            entry.last_state = converted.state;
        }
        *n += 1;
    }
    // Containers that will be (re)started show why they are waiting.
    for c in containers {
        if is_init
            && let Some(s) = rt.find_container(&c.name)
            && s.state == ContainerState::Exited
            && s.exit_code == 0
        {
            continue;
        }
        if !should_container_be_restarted(c, pod, rt) {
            continue;
        }
        let Some((reason, message)) = inputs.start_failures.get(&c.name) else { continue };
        let st = statuses.get_mut(&c.name).expect("inserted above");
        if st.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
            st.last_state.clone_from(&st.state);
        }
        st.state = Some(ApiState {
            waiting: Some(ContainerStateWaiting { reason: Some(reason.clone()), message: Some(message.clone()) }),
            ..Default::default()
        });
    }
    // Without a prober, a running container is ready and started (the prober's
    // verdicts replace these in `generate_api_pod_status`). Ephemeral containers are
    // neither: no prober looks at them, and upstream leaves both unset.
    let mut out: Vec<ContainerStatus> = containers
        .iter()
        .filter_map(|c| statuses.remove(&c.name))
        .map(|mut s| {
            let running = s.state.as_ref().is_some_and(|x| x.running.is_some());
            s.ready = running && list != List::Ephemeral;
            s.started = (list != List::Ephemeral).then_some(running);
            s
        })
        .collect();
    if !is_init {
        out.sort_by(|a, b| a.name.cmp(&b.name));
    }
    out
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.map(Into::into),
        message,
        ..Default::default()
    }
}

/// Upstream `GeneratePodReadyCondition`: as `ContainersReady` while that is not True;
/// then False with reason `ReadinessGatesNotReady` while the condition of a readiness
/// gate is missing from `others` (the conditions other components set) or not True.
fn ready_condition(spec: &PodSpec, containers_ready: &PodCondition, others: &[PodCondition]) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition { type_: "Ready".into(), ..containers_ready.clone() };
    }
    let unready: Vec<String> = spec
        .readiness_gates
        .iter()
        .flatten()
        .filter_map(|gate| {
            let gate = gate.condition_type.as_str();
            match others.iter().find(|c| c.type_ == gate) {
                None => Some(format!("corresponding condition of pod readiness gate {gate:?} does not exist.")),
                Some(c) if c.status != "True" => {
                    Some(format!("the status of pod readiness gate {gate:?} is not \"True\", but {}", c.status))
                }
                Some(_) => None,
            }
        })
        .collect();
    if unready.is_empty() {
        condition("Ready", true, None, None)
    } else {
        condition("Ready", false, Some("ReadinessGatesNotReady"), Some(unready.join(", ")))
    }
}

fn not_ready_names(statuses: &[ContainerStatus], specs: &[Container], unknown_ok: bool) -> (Vec<String>, Vec<String>) {
    let (mut unknown, mut not_ready) = (Vec::new(), Vec::new());
    for c in specs {
        match statuses.iter().find(|s| s.name == c.name) {
            Some(s) if s.ready => {}
            Some(_) => not_ready.push(c.name.clone()),
            None if unknown_ok => {}
            None => unknown.push(c.name.clone()),
        }
    }
    (unknown, not_ready)
}

fn containers_ready_condition(spec: &PodSpec, all: &[ContainerStatus], phase: &str) -> PodCondition {
    let (unknown, mut not_ready) = not_ready_names(all, &spec.containers, false);
    let restartable: Vec<Container> =
        spec.init_containers.iter().flatten().filter(|c| is_restartable_init_container(c)).cloned().collect();
    let (_, nr) = not_ready_names(all, &restartable, true);
    not_ready.extend(nr);
    // Terminal phases: upstream `generateContainersReadyConditionForTerminalPhase` (a
    // succeeded pod only when every container is known; a failed one always, its
    // containers may still be terminating).
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("ContainersReady", false, Some("PodCompleted"), None);
    }
    if phase == "Failed" {
        return condition("ContainersReady", false, Some("PodFailed"), None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!("containers with unknown status: [{}]", unknown.join(" ")));
    }
    if !not_ready.is_empty() {
        msgs.push(format!("containers with unready status: [{}]", not_ready.join(" ")));
    }
    if msgs.is_empty() {
        condition("ContainersReady", true, None, None)
    } else {
        condition("ContainersReady", false, Some("ContainersNotReady"), Some(msgs.join(", ")))
    }
}

fn initialized_condition(spec: &PodSpec, all: &[ContainerStatus], phase: &str) -> PodCondition {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    if inits.is_empty() {
        let reason = (phase == "Succeeded").then_some("PodCompleted");
        return condition("Initialized", true, reason, None);
    }
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in inits {
        match all.iter().find(|s| s.name == c.name) {
            None => unknown.push(c.name.clone()),
            Some(s) => {
                let done = if is_restartable_init_container(c) {
                    s.started.unwrap_or(false)
                } else {
                    s.state.as_ref().and_then(|x| x.terminated.as_ref()).is_some_and(|t| t.exit_code == 0)
                };
                if !done {
                    incomplete.push(c.name.clone());
                }
            }
        }
    }
    // Once app containers ran, initialization happened even if init statuses are gone.
    let app_started = spec
        .containers
        .iter()
        .any(|c| all.iter().any(|s| s.name == c.name && s.state.as_ref().is_some_and(|x| x.waiting.is_none())));
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("Initialized", true, Some("PodCompleted"), None);
    }
    if app_started || (unknown.is_empty() && incomplete.is_empty()) {
        return condition("Initialized", true, None, None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!("containers with unknown status: [{}]", unknown.join(" ")));
    }
    if !incomplete.is_empty() {
        msgs.push(format!("containers with incomplete status: [{}]", incomplete.join(" ")));
    }
    condition("Initialized", false, Some("ContainersNotInitialized"), Some(msgs.join(", ")))
}

/// The condition a pod with a `RestartAllContainers` rule has (upstream
/// `v1.AllContainersRestarting`).
pub const ALL_CONTAINERS_RESTARTING: &str = "AllContainersRestarting";

/// Upstream `GenerateAllContainersRestartingCondition`: True from the exit that asks for a
/// reset until the runtime has none of the pod's containers left; the pod worker removes
/// them while it is True. `restarting`: [`should_all_containers_restart`] of the pod.
fn all_containers_restarting_condition(
    spec: &PodSpec,
    rt: &RuntimePodStatus,
    restarting: bool,
    phase: &str,
) -> PodCondition {
    match phase {
        "Succeeded" => return condition(ALL_CONTAINERS_RESTARTING, false, Some("PodCompleted"), None),
        "Failed" => return condition(ALL_CONTAINERS_RESTARTING, false, Some("PodFailed"), None),
        _ => {}
    }
    if !restarting || all_containers_restart_cleaned_up(spec, rt) {
        return condition(ALL_CONTAINERS_RESTARTING, false, None, None);
    }
    condition(
        ALL_CONTAINERS_RESTARTING,
        true,
        Some("RestartAllContainersStarted"),
        Some("container exited with restart policy rule".into()),
    )
}

/// Upstream `generateAPIPodStatus` (without resize), with the prober's readiness.
#[must_use]
pub fn generate_api_pod_status(pod: &Pod, rt: &RuntimePodStatus, inputs: &StatusInputs<'_>) -> PodStatus {
    // A pod without a spec (never synced: the pod worker refuses it) has no containers.
    static NO_SPEC: std::sync::LazyLock<k8s_openapi::api::core::v1::PodSpec> =
        std::sync::LazyLock::new(Default::default);
    let spec = pod.spec.as_ref().unwrap_or(&NO_SPEC);
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let has_init = !inits.is_empty();
    let mut s = PodStatus { qos_class: Some(inputs.qos_class.to_string()), ..Default::default() };
    let ips = rt.ips();
    if !ips.is_empty() {
        s.pod_ip = Some(ips[0].clone());
        s.pod_ips = Some(ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect());
    }
    let restarting = should_all_containers_restart(spec, Some(rt), inputs.old);
    s.container_statuses =
        Some(container_statuses(pod, rt, inputs, &spec.containers, has_init, List::Containers, restarting));
    if has_init {
        s.init_container_statuses = Some(container_statuses(pod, rt, inputs, inits, has_init, List::Init, restarting));
    }
    // Ephemeral containers get statuses like the others (default reason as the app
    // containers'), but neither the phase nor the conditions look at them.
    let ephemeral = crate::container::ephemeral::containers(spec);
    if !ephemeral.is_empty() {
        s.ephemeral_container_statuses =
            Some(container_statuses(pod, rt, inputs, &ephemeral, has_init, List::Ephemeral, restarting));
    }
    if let Some(probes) = inputs.probes {
        probes.update_pod_status(pod, &mut s);
    }
    let all: Vec<ContainerStatus> =
        s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()).cloned().collect();
    let is_static = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::types::pod::CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s != "api");
    let mut phase = get_phase(spec, &all, inputs.pod_is_terminal, is_static);
    // A pod never leaves a terminal phase.
    if let Some(old_phase) = inputs.old.and_then(|o| o.phase.as_deref())
        && (old_phase == "Failed" || old_phase == "Succeeded")
        && phase != old_phase
    {
        phase = old_phase.to_string();
    }
    if inputs.old.and_then(|o| o.phase.as_deref()) == Some(phase.as_str()) {
        s.reason = inputs.old.and_then(|o| o.reason.clone());
        s.message = inputs.old.and_then(|o| o.message.clone());
    }
    s.phase = Some(phase.clone());

    // Upstream `GeneratePodReadyToStartContainersCondition`: true unless the pod needs a
    // new sandbox, and then why.
    let (new_sandbox, _, _, why) = crate::container::helpers::pod_sandbox_changed_why(spec, rt);
    let mut conds = vec![if new_sandbox {
        condition("PodReadyToStartContainers", false, Some("PodSandboxNotReady"), Some(why.to_owned()))
    } else {
        condition("PodReadyToStartContainers", true, None, None)
    }];
    // Conditions other components own (readiness gates, DisruptionTarget, ...) are kept
    // as the API has them, before the kubelet's own (upstream `PodConditionByKubelet`).
    let kubelet_owned = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
        ALL_CONTAINERS_RESTARTING,
    ];
    let mut all_conds: Vec<PodCondition> = pod
        .status
        .as_ref()
        .and_then(|st| st.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| !kubelet_owned.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    let mut initialized = initialized_condition(spec, &all, &phase);
    // A pod that was initialized stays so while a reset runs its init containers again.
    let was_initialized = inputs
        .old
        .and_then(|o| o.conditions.as_ref())
        .is_some_and(|l| l.iter().any(|c| c.type_ == "Initialized" && c.status == "True"));
    if initialized.status != "True" && was_initialized {
        initialized = condition("Initialized", true, None, None);
    }
    conds.push(initialized);
    let cr = containers_ready_condition(spec, &all, &phase);
    conds.push(ready_condition(spec, &cr, &all_conds));
    conds.push(cr);
    conds.push(condition("PodScheduled", true, None, None));
    if all_containers_could_restart(spec) {
        conds.push(all_containers_restarting_condition(spec, rt, restarting, &phase));
    }
    // Transition times only move when the status flips.
    let now = time(SystemTime::now());
    for c in &mut conds {
        let prev = inputs.old.and_then(|o| o.conditions.as_ref()).and_then(|l| l.iter().find(|p| p.type_ == c.type_));
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
    }
    all_conds.extend(conds);
    s.conditions = Some(all_conds);
    s.start_time = inputs.old.and_then(|o| o.start_time.clone()).or_else(|| inputs.start_time.map(time));
    if let Some(ip) = inputs.host_ip {
        s.host_ip = Some(ip.to_string());
        s.host_ips = Some(vec![k8s_openapi::api::core::v1::HostIP { ip: ip.to_string() }]);
        if spec.host_network.unwrap_or(false) && s.pod_ip.is_none() {
            s.pod_ip = Some(ip.to_string());
            s.pod_ips = Some(vec![PodIP { ip: ip.to_string() }]);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::pod_status::SandboxStatus;

    fn cs(name: &str, running: Option<bool>, exit: i32, last_exit: Option<i32>) -> ContainerStatus {
        let term = |code| ApiState {
            terminated: Some(ContainerStateTerminated { exit_code: code, ..Default::default() }),
            ..Default::default()
        };
        ContainerStatus {
            name: name.into(),
            state: Some(match running {
                Some(true) => ApiState { running: Some(ContainerStateRunning::default()), ..Default::default() },
                Some(false) => term(exit),
                None => ApiState { waiting: Some(ContainerStateWaiting::default()), ..Default::default() },
            }),
            last_state: last_exit.map(term),
            ..Default::default()
        }
    }

    fn spec(policy: &str, inits: &[&str], containers: &[&str]) -> PodSpec {
        let mk = |n: &&str| Container { name: (*n).into(), ..Default::default() };
        PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: Some(inits.iter().map(mk).collect()),
            containers: containers.iter().map(mk).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn phases() {
        let s = spec("Always", &[], &["a", "b"]);
        assert_eq!(get_phase(&s, &[], false, true), "Pending");
        assert_eq!(
            get_phase(&s, &[cs("a", Some(true), 0, None), cs("b", Some(true), 0, None)], false, true),
            "Running"
        );
        assert_eq!(get_phase(&s, &[cs("a", Some(true), 0, None), cs("b", None, 0, None)], false, true), "Pending");
        // Crash-looping: waiting with a last termination counts as stopped.
        assert_eq!(get_phase(&s, &[cs("a", None, 0, Some(1)), cs("b", Some(true), 0, None)], false, true), "Running");
        let s = spec("Never", &[], &["a"]);
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 0, None)], false, true), "Succeeded");
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 2, None)], false, true), "Failed");
        let s = spec("OnFailure", &[], &["a"]);
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 2, None)], false, true), "Running");
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 0, None)], false, true), "Succeeded");
        let s = spec("Never", &["i"], &["a"]);
        assert_eq!(get_phase(&s, &[cs("i", Some(false), 1, None), cs("a", None, 0, None)], false, true), "Failed");
        let s = spec("Always", &["i"], &["a"]);
        assert_eq!(get_phase(&s, &[cs("i", Some(true), 0, None), cs("a", None, 0, None)], false, true), "Pending");
    }

    /// `ContainerRestartRules`: a container's own policy and rules decide whether its
    /// exit ends the pod.
    #[test]
    fn phases_follow_each_containers_own_restart_policy() {
        let with_policy = |mut s: PodSpec, name: &str, policy: &str, restart_on: Option<i32>| {
            let c = s.containers.iter_mut().chain(s.init_containers.iter_mut().flatten()).find(|c| c.name == name);
            let c = c.unwrap();
            c.restart_policy = Some(policy.into());
            c.restart_policy_rules = restart_on.map(|code| {
                vec![k8s_openapi::api::core::v1::ContainerRestartRule {
                    action: "Restart".into(),
                    exit_codes: Some(k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                        operator: "In".into(),
                        values: Some(vec![code]),
                    }),
                }]
            });
            s
        };
        // Pod Never, container OnFailure: a failure is restarted, so the pod runs on.
        let s = with_policy(spec("Never", &[], &["a"]), "a", "OnFailure", None);
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 2, None)], false, true), "Running");
        assert_eq!(get_phase(&s, &[cs("a", None, 0, Some(2))], false, true), "Running", "in back-off");
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 0, None)], false, true), "Succeeded");
        // Pod Always, container Never with a rule restarting on 42.
        let s = with_policy(spec("Always", &[], &["a"]), "a", "Never", Some(42));
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 42, None)], false, true), "Running");
        assert_eq!(get_phase(&s, &[cs("a", Some(false), 1, None)], false, true), "Failed");
        // An init container failing for good fails the pod whatever the pod's policy.
        let s = with_policy(spec("Always", &["i"], &["a"]), "i", "Never", None);
        assert_eq!(get_phase(&s, &[cs("i", Some(false), 1, None), cs("a", None, 0, None)], false, true), "Failed");
        let s = with_policy(spec("Never", &["i"], &["a"]), "i", "OnFailure", None);
        assert_eq!(get_phase(&s, &[cs("i", Some(false), 1, None), cs("a", None, 0, None)], false, true), "Pending");
    }

    fn rt_status(containers: Vec<RuntimeContainerStatus>) -> RuntimePodStatus {
        RuntimePodStatus {
            uid: "u".into(),
            sandboxes: vec![SandboxStatus {
                id: "sb".into(),
                ready: true,
                attempt: 0,
                created_at: 1,
                ips: vec!["10.1.0.5".into()],
                host_network: false,
            }],
            containers,
            ..Default::default()
        }
    }

    fn rc(name: &str, state: ContainerState, exit: i32, restarts: u32, created: i64) -> RuntimeContainerStatus {
        RuntimeContainerStatus {
            id: format!("{name}{restarts}"),
            name: name.into(),
            sandbox_id: "sb".into(),
            state,
            created_at: created,
            started_at: Some(SystemTime::UNIX_EPOCH),
            finished_at: None,
            exit_code: exit,
            image: "img".into(),
            image_ref: "sha256:abc".into(),
            reason: if state == ContainerState::Exited { "Error".into() } else { String::new() },
            message: String::new(),
            hash: String::new(),
            restart_count: restarts,
            init: false,
            termination_message: crate::container::termination_message::Source::default(),
            user: None,
        }
    }

    fn pod(policy: &str) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default(),
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                containers: vec![Container { name: "a".into(), image: Some("img".into()), ..Default::default() }],
                ..Default::default()
            }),
            status: None,
        }
    }

    /// The process's ids the runtime reports (containerd 2.x) are the status' `user`;
    /// a runtime that reports none (1.6) leaves it out.
    #[test]
    fn the_runtimes_user_is_the_container_status_user() {
        let user = crate::container::pod_status::LinuxUser { uid: 0, gid: 0, supplemental_groups: vec![0, 3000] };
        let with = RuntimeContainerStatus { user: Some(user), ..rc("a", ContainerState::Running, 0, 0, 1) };
        let st = convert(&with, "containerd", None, false);
        assert_eq!(
            serde_json::to_value(st.user).unwrap(),
            serde_json::json!({"linux": {"uid": 0, "gid": 0, "supplementalGroups": [0, 3000]}})
        );
        assert_eq!(convert(&rc("a", ContainerState::Running, 0, 0, 1), "containerd", None, false).user, None);
    }

    #[test]
    fn crash_loop_status_shows_waiting_with_last_state() {
        let p = pod("Always");
        let rt = rt_status(vec![rc("a", ContainerState::Exited, 1, 2, 3), rc("a", ContainerState::Exited, 1, 1, 2)]);
        let failures = HashMap::from([(
            "a".to_string(),
            ("CrashLoopBackOff".to_string(), "back-off 20s restarting failed container=a".to_string()),
        )]);
        let inputs = StatusInputs {
            old: None,
            runtime_name: "containerd",
            start_failures: &failures,
            pod_is_terminal: false,
            start_time: None,
            host_ip: None,
            qos_class: "BestEffort",
            probes: None,
        };
        let s = generate_api_pod_status(&p, &rt, &inputs);
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(c.restart_count, 2);
        assert_eq!(c.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("CrashLoopBackOff"));
        let last = c.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(last.exit_code, 1);
        assert_eq!(last.container_id.as_deref(), Some("containerd://a2"));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert!(!c.ready);
        let conds = s.conditions.unwrap();
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
    }

    fn inputs<'a>(failures: &'a HashMap<String, (String, String)>, old: Option<&'a PodStatus>) -> StatusInputs<'a> {
        StatusInputs {
            old,
            runtime_name: "containerd",
            start_failures: failures,
            pod_is_terminal: false,
            start_time: None,
            host_ip: None,
            qos_class: "BestEffort",
            probes: None,
        }
    }

    fn with_debugger(mut p: Pod, name: &str) -> Pod {
        let ec = k8s_openapi::api::core::v1::EphemeralContainer {
            name: name.into(),
            image: Some("busybox".into()),
            target_container_name: Some("a".into()),
            ..Default::default()
        };
        p.spec.as_mut().unwrap().ephemeral_containers.get_or_insert_with(Vec::new).push(ec);
        p
    }

    fn state_of(c: &ContainerStatus) -> &str {
        let s = c.state.as_ref().unwrap();
        if s.running.is_some() {
            "running"
        } else if s.terminated.is_some() {
            "terminated"
        } else {
            s.waiting.as_ref().unwrap().reason.as_deref().unwrap_or("waiting")
        }
    }

    /// Upstream `GeneratePodReadyCondition`: with its containers ready, a pod is Ready
    /// only when the condition of every readiness gate is there and True (conditions other
    /// components set, kept as the API has them); found by the node conformance suite
    /// ("should support pod readiness gates").
    #[test]
    fn readiness_gates_hold_the_ready_condition() {
        let failures = HashMap::new();
        let mut p = pod("Always");
        p.spec.as_mut().unwrap().readiness_gates = Some(
            ["k8s.io/gate-a", "k8s.io/gate-b"]
                .map(|t| k8s_openapi::api::core::v1::PodReadinessGate { condition_type: t.into() })
                .to_vec(),
        );
        let app = rc("a", ContainerState::Running, 0, 0, 1);
        let ready_of = |p: &Pod| {
            let s = generate_api_pod_status(p, &rt_status(vec![app.clone()]), &inputs(&failures, None));
            let conds = s.conditions.unwrap();
            let get = |t: &str| conds.iter().find(|c| c.type_ == t).cloned().unwrap();
            assert_eq!(get("ContainersReady").status, "True");
            let ready = get("Ready");
            (ready.status, ready.reason, ready.message)
        };
        assert_eq!(
            ready_of(&p),
            (
                "False".into(),
                Some("ReadinessGatesNotReady".into()),
                Some(
                    "corresponding condition of pod readiness gate \"k8s.io/gate-a\" does not exist., corresponding \
                     condition of pod readiness gate \"k8s.io/gate-b\" does not exist."
                        .into()
                )
            )
        );
        let gate = |t: &str, ok: bool| PodCondition { type_: t.into(), ..condition("", ok, None, None) };
        p.status = Some(PodStatus {
            conditions: Some(vec![gate("k8s.io/gate-a", true), gate("k8s.io/gate-b", false)]),
            ..Default::default()
        });
        assert_eq!(
            ready_of(&p),
            (
                "False".into(),
                Some("ReadinessGatesNotReady".into()),
                Some("the status of pod readiness gate \"k8s.io/gate-b\" is not \"True\", but False".into())
            )
        );
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[1] = gate("k8s.io/gate-b", true);
        assert_eq!(ready_of(&p), ("True".into(), None, None));
    }

    #[test]
    fn ephemeral_container_statuses_are_reported_but_count_for_nothing() {
        let failures = HashMap::new();
        // No ephemeral containers: no list at all.
        let plain = generate_api_pod_status(&pod("Always"), &rt_status(vec![]), &inputs(&failures, None));
        assert!(plain.ephemeral_container_statuses.is_none());

        // Added, not started yet: waiting as the app containers would.
        let p = with_debugger(with_debugger(pod("Always"), "zz-debug"), "debug");
        let app = rc("a", ContainerState::Running, 0, 0, 1);
        let s = generate_api_pod_status(&p, &rt_status(vec![app.clone()]), &inputs(&failures, None));
        let eph = s.ephemeral_container_statuses.as_ref().unwrap();
        assert_eq!(eph.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["debug", "zz-debug"], "sorted by name");
        assert_eq!(state_of(&eph[0]), "ContainerCreating");
        assert_eq!(eph[0].image, "busybox");
        let conds = s.conditions.as_ref().unwrap();
        assert!(
            conds.iter().filter(|c| c.type_ == "Ready" || c.type_ == "ContainersReady").all(|c| c.status == "True")
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));

        // Running: state, image, ids; never ready, never "started".
        let mut debug = rc("debug", ContainerState::Running, 0, 0, 2);
        debug.image = "docker.io/library/busybox:latest".into();
        let s = generate_api_pod_status(&p, &rt_status(vec![debug.clone(), app.clone()]), &inputs(&failures, None));
        let d = &s.ephemeral_container_statuses.as_ref().unwrap()[0];
        assert_eq!(state_of(d), "running");
        assert_eq!(d.container_id.as_deref(), Some("containerd://debug0"));
        assert_eq!((d.image.as_str(), d.image_id.as_str()), ("docker.io/library/busybox:latest", "sha256:abc"));
        assert_eq!((d.ready, d.started, d.restart_count), (false, None, 0));
        assert!(s.container_statuses.as_ref().unwrap()[0].ready);
        assert_eq!(s.phase.as_deref(), Some("Running"));

        // Exited: terminated, and it stays so (no waiting to restart) while the pod runs on.
        let mut done = debug.clone();
        done.state = ContainerState::Exited;
        let s1 = generate_api_pod_status(&p, &rt_status(vec![done, app]), &inputs(&failures, Some(&s)));
        let d = &s1.ephemeral_container_statuses.as_ref().unwrap()[0];
        assert_eq!(state_of(d), "terminated");
        assert!(d.last_state.is_none());
        assert_eq!(s1.phase.as_deref(), Some("Running"));

        // A start that failed shows its reason, as a container's would.
        let failures = HashMap::from([(
            "debug".to_string(),
            ("CreateContainerConfigError".to_string(), "unable to find target container a".to_string()),
        )]);
        let s = generate_api_pod_status(&p, &rt_status(vec![]), &inputs(&failures, None));
        let d = &s.ephemeral_container_statuses.as_ref().unwrap()[0];
        assert_eq!(state_of(d), "CreateContainerConfigError");
        assert_eq!(
            d.state.as_ref().unwrap().waiting.as_ref().unwrap().message.as_deref(),
            Some("unable to find target container a")
        );
    }

    #[test]
    fn a_running_ephemeral_container_does_not_keep_the_pod_running() {
        let failures = HashMap::new();
        let p = with_debugger(pod("Never"), "debug");
        let mut app = rc("a", ContainerState::Exited, 0, 0, 1);
        app.reason = "Completed".into();
        let debug = rc("debug", ContainerState::Running, 0, 0, 2);
        let s = generate_api_pod_status(&p, &rt_status(vec![debug, app]), &inputs(&failures, None));
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        // With init containers, a debugger not started yet waits as the others: PodInitializing.
        let mut p = with_debugger(pod("Always"), "debug");
        p.spec.as_mut().unwrap().init_containers =
            Some(vec![Container { name: "i".into(), image: Some("img".into()), ..Default::default() }]);
        let s = generate_api_pod_status(&p, &rt_status(vec![]), &inputs(&failures, None));
        assert_eq!(state_of(&s.ephemeral_container_statuses.as_ref().unwrap()[0]), "PodInitializing");
        assert_eq!(s.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn running_pod_is_ready_with_ip_and_qos() {
        let p = pod("Always");
        let rt = rt_status(vec![rc("a", ContainerState::Running, 0, 0, 1)]);
        let failures = HashMap::new();
        let inputs = StatusInputs {
            old: None,
            runtime_name: "containerd",
            start_failures: &failures,
            pod_is_terminal: false,
            start_time: Some(SystemTime::now()),
            host_ip: Some("192.0.2.1"),
            qos_class: "Guaranteed",
            probes: None,
        };
        let s = generate_api_pod_status(&p, &rt, &inputs);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.1.0.5"));
        assert_eq!(s.qos_class.as_deref(), Some("Guaranteed"));
        let conds = s.conditions.as_ref().unwrap();
        let types: Vec<_> = conds.iter().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
        assert_eq!(
            types,
            vec![
                ("PodReadyToStartContainers", "True"),
                ("Initialized", "True"),
                ("Ready", "True"),
                ("ContainersReady", "True"),
                ("PodScheduled", "True")
            ]
        );
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert!(c.ready && c.started == Some(true));
        assert_eq!(c.image_id, "sha256:abc");
        // Transition times are kept while nothing flips.
        let again = generate_api_pod_status(&p, &rt, &StatusInputs { old: Some(&s), ..inputs });
        assert_eq!(again.conditions, s.conditions);
    }

    fn cond<'a>(s: &'a PodStatus, type_: &str) -> (&'a str, Option<&'a str>, Option<&'a str>) {
        let c = s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref())
    }

    /// Found by `cargo xtask fidelity` against the upstream kubelet v1.37.2 (oom-kill,
    /// init-failure, kill-never): a failed pod's `Ready` and `ContainersReady` say `PodFailed`,
    /// and with its sandbox stopped `PodReadyToStartContainers` says why.
    #[test]
    fn terminal_pods_carry_upstreams_condition_reasons() {
        let failures = HashMap::new();
        let mut p = pod("Never");
        let mut rt = rt_status(vec![rc("a", ContainerState::Exited, 137, 0, 1)]);
        rt.sandboxes[0].ready = false;
        let s = generate_api_pod_status(&p, &rt, &inputs(&failures, None));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(cond(&s, "Ready"), ("False", Some("PodFailed"), None));
        assert_eq!(cond(&s, "ContainersReady"), ("False", Some("PodFailed"), None));
        assert_eq!(
            cond(&s, "PodReadyToStartContainers"),
            ("False", Some("PodSandboxNotReady"), Some("pod sandbox is not ready"))
        );
        assert_eq!(cond(&s, "Initialized"), ("True", None, None));

        let rt = rt_status(vec![rc("a", ContainerState::Exited, 0, 0, 1)]);
        let s = generate_api_pod_status(&p, &rt, &inputs(&failures, None));
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(cond(&s, "Ready"), ("False", Some("PodCompleted"), None));
        assert_eq!(cond(&s, "Initialized"), ("True", Some("PodCompleted"), None));

        // No sandbox yet, several ready ones, one without an address.
        let s = generate_api_pod_status(&p, &RuntimePodStatus::default(), &inputs(&failures, None));
        assert_eq!(
            cond(&s, "PodReadyToStartContainers"),
            ("False", Some("PodSandboxNotReady"), Some("no pod sandbox exists"))
        );
        let mut two = rt_status(vec![]);
        two.sandboxes.push(two.sandboxes[0].clone());
        let s = generate_api_pod_status(&p, &two, &inputs(&failures, None));
        assert_eq!(
            cond(&s, "PodReadyToStartContainers").2,
            Some("multiple pod sandboxes are ready and need to be reconciled")
        );
        let mut no_ip = rt_status(vec![]);
        no_ip.sandboxes[0].ips.clear();
        let s = generate_api_pod_status(&p, &no_ip, &inputs(&failures, None));
        assert_eq!(cond(&s, "PodReadyToStartContainers").2, Some("pod sandbox has no IP address"));
        p.spec.as_mut().unwrap().host_network = Some(true);
        let s = generate_api_pod_status(&p, &no_ip, &inputs(&failures, None));
        assert_eq!(
            cond(&s, "PodReadyToStartContainers").2,
            Some("network namespace mode changed and sandbox needs to be recreated")
        );
    }

    /// A container's exit with a `RestartAllContainers` rule: the condition goes True
    /// until the runtime has none of the pod's containers; the removed ones wait with
    /// reason `RestartingAllContainers` and one more restart; the pod stays Running and
    /// Initialized; the new instances keep the counts.
    #[test]
    fn a_restart_all_exit_resets_every_container_and_keeps_the_counts() {
        let mut p = pod("Never");
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers =
            Some(vec![Container { name: "i".into(), image: Some("img".into()), ..Default::default() }]);
        spec.containers = vec![
            Container {
                name: "src".into(),
                image: Some("img".into()),
                restart_policy: Some("Never".into()),
                restart_policy_rules: Some(vec![k8s_openapi::api::core::v1::ContainerRestartRule {
                    action: "RestartAllContainers".into(),
                    exit_codes: Some(k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                        operator: "In".into(),
                        values: Some(vec![42]),
                    }),
                }]),
                ..Default::default()
            },
            Container { name: "b".into(), image: Some("img".into()), ..Default::default() },
        ];
        let init =
            |id: &str| RuntimeContainerStatus { id: id.into(), init: true, ..rc("i", ContainerState::Exited, 0, 0, 1) };
        let failures = HashMap::new();
        let cond = |s: &PodStatus, t: &str| s.conditions.iter().flatten().find(|c| c.type_ == t).cloned().unwrap();
        let find = |s: &PodStatus, n: &str| {
            s.container_statuses
                .iter()
                .chain(&s.init_container_statuses)
                .flatten()
                .find(|c| c.name == n)
                .cloned()
                .unwrap()
        };

        let running = rt_status(vec![
            rc("src", ContainerState::Running, 0, 0, 2),
            rc("b", ContainerState::Running, 0, 0, 2),
            init("i0"),
        ]);
        let s1 = generate_api_pod_status(&p, &running, &inputs(&failures, None));
        assert_eq!(cond(&s1, ALL_CONTAINERS_RESTARTING).status, "False");
        assert_eq!(cond(&s1, "Initialized").status, "True");

        let exited = rt_status(vec![
            rc("src", ContainerState::Exited, 42, 0, 2),
            rc("b", ContainerState::Running, 0, 0, 2),
            init("i0"),
        ]);
        let s2 = generate_api_pod_status(&p, &exited, &inputs(&failures, Some(&s1)));
        let c = cond(&s2, ALL_CONTAINERS_RESTARTING);
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("True", Some("RestartAllContainersStarted")));
        assert_eq!(s2.phase.as_deref(), Some("Running"));

        let emptied = rt_status(vec![]);
        let s3 = generate_api_pod_status(&p, &emptied, &inputs(&failures, Some(&s2)));
        assert_eq!(cond(&s3, ALL_CONTAINERS_RESTARTING).status, "False", "nothing left to remove");
        assert_eq!(cond(&s3, "Initialized").status, "True", "stays initialized");
        assert_eq!(s3.phase.as_deref(), Some("Running"));
        for name in ["i", "src", "b"] {
            let st = find(&s3, name);
            let waiting = st.state.as_ref().unwrap().waiting.clone().unwrap();
            assert_eq!(waiting.reason.as_deref(), Some(RESTARTING_ALL_CONTAINERS), "{name}");
            let last = st.last_state.as_ref().unwrap().terminated.clone().unwrap();
            assert_eq!((last.reason.as_deref(), last.exit_code), (Some(RESTARTING_ALL_CONTAINERS), 137), "{name}");
            assert_eq!(st.restart_count, 1, "{name}");
        }

        let again = rt_status(vec![
            RuntimeContainerStatus { id: "src-new".into(), ..rc("src", ContainerState::Running, 0, 0, 5) },
            RuntimeContainerStatus { id: "b-new".into(), ..rc("b", ContainerState::Running, 0, 0, 5) },
            init("i-new"),
        ]);
        let s4 = generate_api_pod_status(&p, &again, &inputs(&failures, Some(&s3)));
        for name in ["src", "b"] {
            let st = find(&s4, name);
            assert!(st.state.as_ref().unwrap().running.is_some(), "{name}");
            assert_eq!(st.restart_count, 1, "{name}");
            let last = st.last_state.as_ref().unwrap().terminated.clone().unwrap();
            assert_eq!(last.reason.as_deref(), Some(RESTARTING_ALL_CONTAINERS), "{name}");
        }
        assert_eq!(cond(&s4, ALL_CONTAINERS_RESTARTING).status, "False");
        // A pod without such a rule has no such condition.
        let plain = generate_api_pod_status(&pod("Never"), &rt_status(vec![]), &inputs(&failures, None));
        assert!(plain.conditions.iter().flatten().all(|c| c.type_ != ALL_CONTAINERS_RESTARTING));
    }
}
