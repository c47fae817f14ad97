//! What a sync must do to a pod (upstream `computePodActions` in
//! `kuberuntime_manager.go`): [`compute_pod_actions`] is a pure function of the pod's spec
//! and the runtime's state, with its helpers (`ShouldContainerBeRestarted`, the init
//! containers and sidecars to start (`computeInitContainerActions`), whether the sandbox
//! must be recreated).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::container::ephemeral;
use crate::container::helpers::{
    container_restart_policy, exit_restarts_all, pod_sandbox_changed_why, restart_policy, should_container_be_restarted,
};
use crate::container::labels;
use crate::container::pod_status::{ContainerState, RuntimeContainerStatus, RuntimePodStatus};
use crate::prober::{ProbeKill, ProbeType};
use crate::types::pod_resources::is_restartable_init_container;

/// What a sync must do to a pod (upstream `podActions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox.
    pub kill_pod: bool,
    /// Create a new sandbox (after killing the old one).
    pub create_sandbox: bool,
    /// The sandbox to use when not creating one.
    pub sandbox_id: String,
    /// Attempt number of the sandbox to create.
    pub attempt: u32,
    /// Indexes into `spec.initContainers` to start, in spec order (upstream
    /// `InitContainersToStart`): the next plain init container, and sidecars (restartable
    /// init containers) that must run again.
    pub init_containers_to_start: Vec<usize>,
    /// Indexes into `spec.ephemeralContainers` to start (upstream
    /// `EphemeralContainersToStart`): those the runtime never had.
    pub ephemeral_containers_to_start: Vec<usize>,
    /// Indexes into `spec.containers` to start.
    pub containers_to_start: Vec<usize>,
    /// Running containers to kill: container id -> (name, message of the `Killing` event).
    pub containers_to_kill: BTreeMap<String, (String, String)>,
    /// Grace periods for kills a failed liveness/startup probe asked for (the probe's
    /// own `terminationGracePeriodSeconds`): container id -> seconds.
    pub kill_grace: BTreeMap<String, i64>,
    /// Containers to remove from the runtime (killed first if they run) because the pod
    /// restarts all its containers in place (upstream `ContainersToReset`), in order.
    pub containers_to_reset: Vec<ContainerToReset>,
}

/// One container instance a `RestartAllContainers` reset removes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToReset {
    pub id: String,
    pub name: String,
    /// It has not exited: stop it (without a grace period) before removing it.
    pub kill: bool,
}

/// What the prober says about a running container (upstream's liveness and startup
/// result managers), as the actions need it.
pub trait ProbeVerdicts {
    /// Whether a failed liveness or startup probe wants container `id` killed.
    fn to_kill(&self, container: &Container, id: &str) -> Option<ProbeKill>;
    /// Whether container `id` has a startup probe success on record. Asked only for
    /// sidecars with a startup probe: until then, the next init container waits.
    fn startup_succeeded(&self, container: &Container, id: &str) -> bool;
}

/// No prober results yet: nothing to kill, no startup probe has succeeded.
#[derive(Debug)]
pub struct NoVerdicts;

impl ProbeVerdicts for NoVerdicts {
    fn to_kill(&self, _: &Container, _: &str) -> Option<ProbeKill> {
        None
    }
    fn startup_succeeded(&self, _: &Container, _: &str) -> bool {
        false
    }
}

fn should_restart_on_failure(spec: &PodSpec) -> bool {
    restart_policy(spec) != "Never"
}

/// Upstream `isInitContainerFailed`: exited non-zero, OOM-killed, or in an unknown state.
fn is_init_container_failed(c: &RuntimeContainerStatus) -> bool {
    c.reason == "OOMKilled"
        || (c.state == ContainerState::Exited && c.exit_code != 0)
        || c.state == ContainerState::Unknown
}

/// Whether a running container's hash says its spec changed (a container an earlier
/// swiftlet created carries the whole-spec hash and is kept).
fn definition_changed(c: &Container, s: &RuntimeContainerStatus) -> bool {
    !s.hash.is_empty() && s.hash != labels::container_hash(c) && s.hash != labels::legacy_container_hash(c)
}

/// Upstream `computeInitContainerActions`: puts the init containers to start (the next
/// plain one; sidecars that exited, were never seen, or must restart) and the sidecars to
/// kill into `actions`, and says whether the pod has initialized. A sidecar counts as
/// started once it runs and its startup probe, if any, succeeded; the next init container
/// starts only then. After initialization only sidecars are looked after: plain init
/// containers the runtime removed are not run again.
fn compute_init_container_actions(
    pod: &Pod,
    spec: &PodSpec,
    status: &RuntimePodStatus,
    probes: &dyn ProbeVerdicts,
    actions: &mut PodActions,
) -> bool {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    if inits.is_empty() {
        return true;
    }
    // An app container in the current sandbox means initialization finished there.
    let mut initialized = spec.containers.iter().any(|c| status.find_active_container(&c.name).is_some());
    let mut previously_initialized = initialized;
    let last = inits.len() - 1;
    let mut to_start = Vec::new();
    // Backwards: completed init containers may be gone from the runtime, so the last one
    // seen says how far initialization got.
    for (i, c) in inits.iter().enumerate().rev() {
        let sidecar = is_restartable_init_container(c);
        let Some(s) = status.find_active_container(&c.name) else {
            if previously_initialized && sidecar {
                to_start.push(i);
            }
            continue;
        };
        if previously_initialized && !sidecar {
            continue;
        }
        match s.state {
            // Created but never started (the start failed): start it again.
            ContainerState::Created => to_start.push(i),
            ContainerState::Running if sidecar => 'running: {
                let kill = probes.to_kill(c, &s.id);
                if let Some(kill) = kill.as_ref().filter(|k| k.probe_type == ProbeType::Startup) {
                    kill_to_restart(actions, s, kill.message.clone(), Some(kill.grace_period_seconds));
                    to_start.push(i);
                    break 'running;
                }
                if c.startup_probe.is_some() && !probes.startup_succeeded(c, &s.id) {
                    break 'running;
                }
                if i == last {
                    initialized = true;
                } else if !previously_initialized {
                    to_start.push(i + 1);
                }
                if definition_changed(c, s) {
                    kill_to_restart(actions, s, format!("Init container {} definition changed", c.name), None);
                    to_start.push(i);
                } else if let Some(kill) = kill {
                    kill_to_restart(actions, s, kill.message, Some(kill.grace_period_seconds));
                    to_start.push(i);
                }
            }
            // A plain init container still running: wait for it.
            ContainerState::Running => {}
            ContainerState::Exited if sidecar => to_start.push(i),
            ContainerState::Exited | ContainerState::Unknown if !sidecar && is_init_container_failed(s) => {
                // The container's own restart policy and rules first (`ContainerRestartRules`);
                // an unknown state has no exit code for the rules.
                let restart = match s.state {
                    ContainerState::Exited => should_container_be_restarted(c, pod, status),
                    _ => container_restart_policy(c, spec) != "Never",
                };
                if !restart {
                    actions.kill_pod = true;
                    actions.init_containers_to_start.clear();
                    return false;
                }
                if s.state == ContainerState::Unknown {
                    kill_to_restart(actions, s, unknown_state_message("Init container"), None);
                }
                to_start.push(i);
            }
            ContainerState::Exited => {
                if i == last {
                    initialized = true;
                } else {
                    to_start.push(i + 1);
                }
            }
            ContainerState::Unknown => {
                kill_to_restart(actions, s, unknown_state_message("Init container"), None);
                to_start.push(i);
            }
        }
        previously_initialized = true;
    }
    if !previously_initialized {
        to_start.push(0);
    }
    to_start.reverse();
    to_start.dedup();
    actions.init_containers_to_start = to_start;
    initialized
}

/// Upstream's message for a container in an unknown state, killed before its restart.
fn unknown_state_message(what: &str) -> String {
    format!("{what} is in \"unknown\" state, try killing it before restart")
}

fn kill_to_restart(actions: &mut PodActions, s: &RuntimeContainerStatus, message: String, grace: Option<i64>) {
    actions.containers_to_kill.insert(s.id.clone(), (s.name.clone(), message));
    if let Some(grace) = grace {
        actions.kill_grace.insert(s.id.clone(), grace);
    }
}

/// Upstream `podSandboxChanged`: (create a new sandbox?, attempt, current sandbox id).
fn pod_sandbox_changed(spec: &PodSpec, status: &RuntimePodStatus) -> (bool, u32, String) {
    let (changed, attempt, id, _) = pod_sandbox_changed_why(spec, status);
    (changed, attempt, id)
}

/// Upstream `computePodActions`, without prober results.
#[must_use]
pub fn compute_pod_actions(pod: &Pod, status: &RuntimePodStatus) -> PodActions {
    compute_pod_actions_with(pod, status, &NoVerdicts)
}

/// Upstream `HasAnyRegularContainerCreated`: an app container was created, so the init
/// containers had all run.
fn any_regular_container_created(spec: &PodSpec, status: &RuntimePodStatus) -> bool {
    spec.containers.iter().any(|c| {
        status.find_container(&c.name).is_some_and(|s| {
            matches!(s.state, ContainerState::Created | ContainerState::Running | ContainerState::Exited)
        })
    })
}

/// The actions of a sync while the pod's `AllContainersRestarting` condition is True
/// (upstream `computePodActions` with `restartAllContainers`): every instance of every
/// init and app container is removed, in reverse: first the app containers, then the init
/// containers that did not trigger the reset, then the app and init containers whose exit
/// did. Nothing starts; the next sync, with the runtime emptied, starts the pod again from
/// its first init container. A sandbox that must be recreated is, as in any sync.
#[must_use]
pub fn compute_reset_actions(pod: &Pod, status: &RuntimePodStatus) -> PodActions {
    let Some(spec) = pod.spec.as_ref() else { return PodActions::default() };
    let (create_sandbox, attempt, sandbox_id) = pod_sandbox_changed(spec, status);
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let (init_sources, init_targets) = containers_to_reset(inits, status);
    let (sources, targets) = containers_to_reset(&spec.containers, status);
    let containers_to_reset = [targets, init_targets, sources, init_sources].concat();
    PodActions {
        kill_pod: create_sandbox,
        create_sandbox,
        sandbox_id,
        attempt,
        containers_to_reset,
        ..Default::default()
    }
}

/// Upstream `getContainersToReset`: every runtime instance of `containers`, split into
/// those whose exit asked for the reset and the others.
fn containers_to_reset(
    containers: &[Container],
    status: &RuntimePodStatus,
) -> (Vec<ContainerToReset>, Vec<ContainerToReset>) {
    let (mut sources, mut targets) = (Vec::new(), Vec::new());
    for c in containers {
        for s in status.containers.iter().filter(|s| s.name == c.name) {
            let exited = s.state == ContainerState::Exited;
            let reset = ContainerToReset { id: s.id.clone(), name: c.name.clone(), kill: !exited };
            if exited && exit_restarts_all(c, s.exit_code) {
                sources.push(reset);
            } else {
                targets.push(reset);
            }
        }
    }
    (sources, targets)
}

/// [`compute_pod_actions`] with the prober's verdicts on the running containers.
pub fn compute_pod_actions_with(pod: &Pod, status: &RuntimePodStatus, probes: &dyn ProbeVerdicts) -> PodActions {
    // Nothing to run (`sync_pod` refuses such a pod before it gets here).
    let Some(spec) = pod.spec.as_ref() else { return PodActions::default() };
    let (create_sandbox, attempt, sandbox_id) = pod_sandbox_changed(spec, status);
    let mut actions =
        PodActions { kill_pod: create_sandbox, create_sandbox, sandbox_id, attempt, ..Default::default() };
    if create_sandbox {
        // A pod that must not restart and whose sandbox died after its containers ran is
        // finished: do not bring it back.
        if !should_restart_on_failure(spec) && attempt != 0 && !status.containers.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        // A container that runs until it succeeds (the pod's `OnFailure`, or its own) and
        // did succeed is not started again in the new sandbox.
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let run_once = container_restart_policy(c, spec) == "OnFailure";
                !(run_once
                    && status
                        .find_container(&c.name)
                        .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0))
            })
            .map(|(i, _)| i)
            .collect();
        // Initialization done and nothing left to run: no new sandbox, the pod is over.
        if to_start.is_empty() && any_regular_container_created(spec, status) {
            actions.create_sandbox = false;
            return actions;
        }
        if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
            actions.init_containers_to_start = vec![0];
            return actions;
        }
        actions.containers_to_start = to_start;
        return actions;
    }

    // Ephemeral containers start even while initialization fails (upstream computes them
    // before looking at the init containers), and only in a sandbox that exists.
    actions.ephemeral_containers_to_start = ephemeral::to_start(spec, status);

    let initialized = compute_init_container_actions(pod, spec, status, probes, &mut actions);
    if actions.kill_pod || !initialized {
        return actions;
    }

    let mut keep = 0;
    for (i, c) in spec.containers.iter().enumerate() {
        let s = status.find_container(&c.name);
        if let Some(s) = s.filter(|s| s.state == ContainerState::Unknown) {
            actions.containers_to_kill.insert(s.id.clone(), (c.name.clone(), unknown_state_message("Container")));
        }
        match s {
            Some(s) if s.state == ContainerState::Running => {
                if definition_changed(c, s) {
                    actions.containers_to_start.push(i);
                    actions.containers_to_kill.insert(
                        s.id.clone(),
                        (c.name.clone(), format!("Container {} definition changed, will be restarted", c.name)),
                    );
                } else if let Some(kill) = probes.to_kill(c, &s.id) {
                    // Upstream: a failed liveness/startup probe kills the container; it
                    // starts again unless the restart policy is Never.
                    if kill.restart {
                        actions.containers_to_start.push(i);
                    }
                    actions.containers_to_kill.insert(s.id.clone(), (c.name.clone(), kill.message));
                    actions.kill_grace.insert(s.id.clone(), kill.grace_period_seconds);
                } else {
                    keep += 1;
                }
            }
            _ => {
                if should_container_be_restarted(c, pod, status) {
                    actions.containers_to_start.push(i);
                }
            }
        }
    }
    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
        // Sidecars alone do not keep a pod alive.
        actions.init_containers_to_start.clear();
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::pod_status::SandboxStatus;

    fn pod(policy: &str, inits: &[&str], containers: &[&str]) -> Pod {
        let mk = |n: &&str| Container { name: (*n).into(), image: Some("busybox".into()), ..Default::default() };
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: if inits.is_empty() { None } else { Some(inits.iter().map(mk).collect()) },
                containers: containers.iter().map(mk).collect(),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn sandbox(ready: bool, attempt: u32) -> SandboxStatus {
        SandboxStatus {
            id: format!("sb{attempt}"),
            ready,
            attempt,
            created_at: i64::from(attempt),
            ips: vec!["10.0.0.2".into()],
            host_network: false,
        }
    }

    fn ctr(
        pod: &Pod,
        name: &str,
        state: ContainerState,
        exit: i32,
        restarts: u32,
        init: bool,
    ) -> RuntimeContainerStatus {
        let spec = pod.spec.as_ref().unwrap();
        let c = spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name).unwrap();
        RuntimeContainerStatus {
            id: format!("{name}-{restarts}"),
            name: name.into(),
            sandbox_id: "sb0".into(),
            state,
            created_at: 0,
            started_at: None,
            finished_at: None,
            exit_code: exit,
            image: String::new(),
            image_ref: String::new(),
            reason: String::new(),
            message: String::new(),
            hash: labels::container_hash(c),
            restart_count: restarts,
            init,
            termination_message: crate::container::termination_message::Source::default(),
            user: None,
        }
    }

    fn status(sandboxes: Vec<SandboxStatus>, containers: Vec<RuntimeContainerStatus>) -> RuntimePodStatus {
        RuntimePodStatus { uid: "u1".into(), sandboxes, containers, ..Default::default() }
    }

    /// Prober verdicts for the tests: kills by container id (id, probe, message, restart),
    /// with a 7 s grace, and the ids whose startup probe succeeded.
    #[derive(Default)]
    struct Verdicts {
        kill: Vec<(&'static str, ProbeType, &'static str, bool)>,
        started: Vec<&'static str>,
    }

    impl ProbeVerdicts for Verdicts {
        fn to_kill(&self, _: &Container, id: &str) -> Option<ProbeKill> {
            let (_, probe_type, message, restart) = self.kill.iter().find(|k| k.0 == id)?;
            Some(ProbeKill {
                probe_type: *probe_type,
                message: (*message).into(),
                grace_period_seconds: 7,
                restart: *restart,
            })
        }
        fn startup_succeeded(&self, _: &Container, id: &str) -> bool {
            self.started.contains(&id)
        }
    }

    /// `p` with these init containers made sidecars (`restartPolicy: Always`); the ones in
    /// `startup_probed` get a startup probe.
    fn with_sidecars(mut p: Pod, sidecars: &[&str], startup_probed: &[&str]) -> Pod {
        for c in p.spec.as_mut().unwrap().init_containers.iter_mut().flatten() {
            if sidecars.contains(&c.name.as_str()) {
                c.restart_policy = Some("Always".into());
            }
            if startup_probed.contains(&c.name.as_str()) {
                c.startup_probe = Some(k8s_openapi::api::core::v1::Probe::default());
            }
        }
        p
    }

    fn running(p: &Pod, name: &str, init: bool) -> RuntimeContainerStatus {
        ctr(p, name, ContainerState::Running, 0, 0, init)
    }

    #[test]
    fn a_started_sidecar_lets_the_next_init_container_start_and_keeps_running() {
        let p = with_sidecars(pod("Always", &["s1", "i2"], &["a"]), &["s1"], &[]);
        assert_eq!(compute_pod_actions(&p, &RuntimePodStatus::default()).init_containers_to_start, [0]);
        // The sidecar runs (no startup probe: started at once): the next init container goes.
        let s = status(vec![sandbox(true, 0)], vec![running(&p, "s1", true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.init_containers_to_start, [1], "{a:?}");
        assert!(a.containers_to_start.is_empty() && !a.kill_pod, "{a:?}");
        // i2 runs: wait for it.
        let s = status(vec![sandbox(true, 0)], vec![running(&p, "i2", true), running(&p, "s1", true)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty(), "{a:?}");
        // i2 done: the pod is initialized with its sidecar still running.
        let s = status(
            vec![sandbox(true, 0)],
            vec![ctr(&p, "i2", ContainerState::Exited, 0, 0, true), running(&p, "s1", true)],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(a.init_containers_to_start.is_empty() && a.containers_to_kill.is_empty(), "{a:?}");
        assert_eq!(a.containers_to_start, [0]);
        // App and sidecar running: nothing to do.
        let s = status(
            vec![sandbox(true, 0)],
            vec![running(&p, "a", false), ctr(&p, "i2", ContainerState::Exited, 0, 0, true), running(&p, "s1", true)],
        );
        assert_eq!(compute_pod_actions(&p, &s), PodActions { sandbox_id: "sb0".into(), ..Default::default() });
        // The runtime removed i2 after the app started: it is not run again.
        let s = status(vec![sandbox(true, 0)], vec![running(&p, "a", false), running(&p, "s1", true)]);
        assert_eq!(compute_pod_actions(&p, &s), PodActions { sandbox_id: "sb0".into(), ..Default::default() });
    }

    #[test]
    fn a_sidecar_with_a_startup_probe_holds_the_next_init_container_until_it_succeeds() {
        let p = with_sidecars(pod("Always", &["s1", "i2"], &["a"]), &["s1"], &["s1"]);
        let s = status(vec![sandbox(true, 0)], vec![running(&p, "s1", true)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.init_containers_to_start.is_empty() && a.containers_to_kill.is_empty(), "{a:?}");
        let ok = Verdicts { started: vec!["s1-0"], ..Default::default() };
        assert_eq!(compute_pod_actions_with(&p, &s, &ok).init_containers_to_start, [1]);
        // A failed startup probe restarts the sidecar, with upstream's message.
        let failed = Verdicts {
            kill: vec![("s1-0", ProbeType::Startup, "Init container s1 failed startup probe", true)],
            ..Default::default()
        };
        let a = compute_pod_actions_with(&p, &s, &failed);
        assert_eq!(a.containers_to_kill["s1-0"], ("s1".into(), "Init container s1 failed startup probe".into()));
        assert_eq!(a.kill_grace["s1-0"], 7);
        assert_eq!(a.init_containers_to_start, [0]);
    }

    #[test]
    fn sidecars_restart_after_exit_liveness_failure_change_or_unknown_state() {
        let p = with_sidecars(pod("Never", &["s1", "s2"], &["a"]), &["s1", "s2"], &[]);
        let app = running(&p, "a", false);
        // s1 exited, s2 gone from the runtime: both start again, whatever the pod's policy.
        let s = status(vec![sandbox(true, 0)], vec![app.clone(), ctr(&p, "s1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.init_containers_to_start, [0, 1]);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod, "{a:?}");
        // Liveness failure of a started sidecar.
        let both = vec![app.clone(), running(&p, "s2", true), running(&p, "s1", true)];
        let live = Verdicts {
            kill: vec![("s2-0", ProbeType::Liveness, "Init container s2 failed liveness probe", true)],
            ..Default::default()
        };
        let a = compute_pod_actions_with(&p, &status(vec![sandbox(true, 0)], both.clone()), &live);
        assert_eq!(a.init_containers_to_start, [1]);
        assert_eq!(a.containers_to_kill["s2-0"].1, "Init container s2 failed liveness probe");
        // Changed definition.
        let mut changed = both.clone();
        changed[2].hash = "deadbeef".into();
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], changed));
        assert_eq!(a.init_containers_to_start, [0]);
        assert_eq!(a.containers_to_kill["s1-0"].1, "Init container s1 definition changed");
        // Unknown state.
        let mut unknown = both;
        unknown[1].state = ContainerState::Unknown;
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], unknown));
        assert_eq!(a.init_containers_to_start, [1]);
        assert_eq!(
            a.containers_to_kill["s2-0"].1,
            "Init container is in \"unknown\" state, try killing it before restart"
        );
    }

    #[test]
    fn sidecars_do_not_keep_a_finished_pod_alive() {
        for policy in ["Never", "OnFailure"] {
            let p = with_sidecars(pod(policy, &["s1"], &["a"]), &["s1"], &[]);
            let s = status(
                vec![sandbox(true, 0)],
                vec![ctr(&p, "a", ContainerState::Exited, 0, 0, false), running(&p, "s1", true)],
            );
            let a = compute_pod_actions(&p, &s);
            assert!(a.kill_pod && !a.create_sandbox, "{policy}: {a:?}");
            assert!(a.init_containers_to_start.is_empty(), "{policy}: {a:?}");
            // Nor does a crashed sidecar of that pod come back.
            let s = status(
                vec![sandbox(true, 0)],
                vec![
                    ctr(&p, "a", ContainerState::Exited, 0, 0, false),
                    ctr(&p, "s1", ContainerState::Exited, 1, 0, true),
                ],
            );
            let a = compute_pod_actions(&p, &s);
            assert!(a.kill_pod && a.init_containers_to_start.is_empty(), "{policy}: {a:?}");
        }
    }

    /// `ContainerRestartRules`: a container's own restart policy and rules come before the
    /// pod's.
    #[test]
    fn containers_restart_by_their_own_policy_and_rules() {
        let rule = |code: i32| k8s_openapi::api::core::v1::ContainerRestartRule {
            action: "Restart".into(),
            exit_codes: Some(k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                operator: "In".into(),
                values: Some(vec![code]),
            }),
        };
        let mut p = pod("Never", &["i1"], &["a", "b"]);
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].restart_policy = Some("OnFailure".into());
        spec.containers[1].restart_policy = Some("Never".into());
        spec.containers[1].restart_policy_rules = Some(vec![rule(42)]);
        spec.init_containers.as_mut().unwrap()[0].restart_policy = Some("OnFailure".into());
        let sb = || vec![sandbox(true, 0)];
        let init_done = ctr(&p, "i1", ContainerState::Exited, 0, 0, true);
        for (a_exit, b_exit, want) in [(1, 42, vec![0, 1]), (0, 42, vec![1]), (1, 3, vec![0]), (0, 3, vec![])] {
            let s = status(
                sb(),
                vec![
                    ctr(&p, "a", ContainerState::Exited, a_exit, 0, false),
                    ctr(&p, "b", ContainerState::Exited, b_exit, 0, false),
                    init_done.clone(),
                ],
            );
            let a = compute_pod_actions(&p, &s);
            assert_eq!(a.containers_to_start, want, "a exited {a_exit}, b {b_exit}");
            assert_eq!(a.kill_pod, want.is_empty());
        }
        // The init container restarts after a failure although the pod says Never.
        let s = status(sb(), vec![ctr(&p, "i1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert!(!a.kill_pod && a.init_containers_to_start == [0], "{a:?}");
        // A new sandbox skips the OnFailure container that succeeded.
        let mut p = pod("Always", &[], &["a", "b"]);
        p.spec.as_mut().unwrap().containers[0].restart_policy = Some("OnFailure".into());
        let s = status(
            vec![sandbox(false, 0)],
            vec![ctr(&p, "a", ContainerState::Exited, 0, 0, false), ctr(&p, "b", ContainerState::Exited, 0, 0, false)],
        );
        assert_eq!(compute_pod_actions(&p, &s).containers_to_start, [1]);
    }

    /// A reset removes every instance of every init and app container, the exit that
    /// asked for it last, and starts nothing; running ones are killed first.
    #[test]
    fn a_reset_removes_every_container_the_sources_last() {
        let mut p = with_sidecars(pod("Never", &["i1", "side"], &["src", "app"]), &["side"], &[]);
        p.spec.as_mut().unwrap().containers[0].restart_policy = Some("Never".into());
        p.spec.as_mut().unwrap().containers[0].restart_policy_rules =
            Some(vec![k8s_openapi::api::core::v1::ContainerRestartRule {
                action: "RestartAllContainers".into(),
                exit_codes: Some(k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                    operator: "In".into(),
                    values: Some(vec![42]),
                }),
            }]);
        let s = status(
            vec![sandbox(true, 0)],
            vec![
                ctr(&p, "src", ContainerState::Exited, 42, 0, false),
                running(&p, "app", false),
                running(&p, "side", true),
                ctr(&p, "i1", ContainerState::Exited, 0, 1, true),
                ctr(&p, "i1", ContainerState::Exited, 1, 0, true),
            ],
        );
        let a = compute_reset_actions(&p, &s);
        let order: Vec<(&str, &str, bool)> =
            a.containers_to_reset.iter().map(|r| (r.name.as_str(), r.id.as_str(), r.kill)).collect();
        assert_eq!(
            order,
            [
                ("app", "app-0", true),
                ("i1", "i1-1", false),
                ("i1", "i1-0", false),
                ("side", "side-0", true),
                ("src", "src-0", false)
            ]
        );
        assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
        assert!(!a.kill_pod && !a.create_sandbox && a.sandbox_id == "sb0");
        // In the ordinary actions the source restarts like any container with a Restart rule.
        assert_eq!(compute_pod_actions(&p, &s).containers_to_start, [0]);
    }

    #[test]
    fn only_the_current_sandbox_says_whether_the_pod_initialized() {
        // The app ran in the old sandbox; the new one starts from its first init container.
        let p = pod("Always", &["i1"], &["a"]);
        let s = status(
            vec![sandbox(true, 1), sandbox(false, 0)],
            vec![
                ctr(&p, "a", ContainerState::Exited, 137, 0, false),
                ctr(&p, "i1", ContainerState::Exited, 0, 0, true),
            ],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(!a.create_sandbox, "{a:?}");
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn an_oom_killed_init_container_failed_even_with_exit_code_zero() {
        // Failed, it is restarted as its policy says (upstream asks `ShouldContainerBeRestarted`,
        // which under `OnFailure` would not restart an exit code 0).
        let p = pod("Always", &["i1"], &["a"]);
        let mut oom = ctr(&p, "i1", ContainerState::Exited, 0, 0, true);
        oom.reason = "OOMKilled".into();
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], vec![oom.clone()]));
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.containers_to_start.is_empty());
        let p = pod("Never", &["i1"], &["a"]);
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], vec![oom]));
        assert!(a.kill_pod && a.init_containers_to_start.is_empty(), "{a:?}");
    }

    #[test]
    fn new_pod_creates_sandbox_and_starts_all() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = compute_pod_actions(&p, &RuntimePodStatus::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn new_pod_with_init_starts_first_init_only() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let a = compute_pod_actions(&p, &RuntimePodStatus::default());
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_in_order_then_apps() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Running, 0, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.init_containers_to_start.is_empty());
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);

        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 0, 0, true)]);
        assert_eq!(compute_pod_actions(&p, &s).init_containers_to_start, [1]);

        let s = status(
            vec![sandbox(true, 0)],
            vec![ctr(&p, "i2", ContainerState::Exited, 0, 0, true), ctr(&p, "i1", ContainerState::Exited, 0, 0, true)],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(a.init_containers_to_start.is_empty());
        assert_eq!(a.containers_to_start, vec![0]);
    }

    #[test]
    fn failed_init_blocks_apps_and_restarts_or_kills() {
        let p = pod("Always", &["i1"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.init_containers_to_start, [0]);
        assert!(a.containers_to_start.is_empty());

        let p = pod("Never", &["i1"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.kill_pod);
        assert!(a.init_containers_to_start.is_empty());
    }

    #[test]
    fn restart_policies() {
        for (policy, exit, restart) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 3, true),
            ("Never", 0, false),
            ("Never", 1, false),
        ] {
            let p = pod(policy, &[], &["a"]);
            let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "a", ContainerState::Exited, exit, 0, false)]);
            let a = compute_pod_actions(&p, &s);
            assert_eq!(!a.containers_to_start.is_empty(), restart, "{policy} exit {exit}");
            // Nothing to run and nothing running: the sandbox goes.
            assert_eq!(a.kill_pod, !restart, "{policy} exit {exit}");
        }
    }

    #[test]
    fn running_pod_is_left_alone() {
        let p = pod("Always", &[], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "a", ContainerState::Running, 0, 0, false)]);
        assert_eq!(compute_pod_actions(&p, &s), PodActions { sandbox_id: "sb0".into(), ..Default::default() });
    }

    #[test]
    fn dead_sandbox_is_recreated_with_next_attempt() {
        let p = pod("Always", &[], &["a"]);
        let s = status(vec![sandbox(false, 0)], vec![ctr(&p, "a", ContainerState::Exited, 137, 0, false)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 1);
        assert_eq!(a.containers_to_start, vec![0]);

        // restartPolicy Never: a finished pod's sandbox is not brought back.
        let p = pod("Never", &[], &["a"]);
        let s = status(vec![sandbox(false, 0)], vec![ctr(&p, "a", ContainerState::Exited, 0, 0, false)]);
        let a = compute_pod_actions(&p, &s);
        assert!(!a.create_sandbox && a.kill_pod);
    }

    #[test]
    fn changed_spec_restarts_container() {
        let p = pod("Always", &[], &["a"]);
        let mut c = ctr(&p, "a", ContainerState::Running, 0, 0, false);
        c.hash = "deadbeef".into();
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], vec![c]));
        assert_eq!(a.containers_to_start, vec![0]);
        assert!(a.containers_to_kill.contains_key("a-0"));
    }

    #[test]
    fn changed_resources_do_not_restart_a_container() {
        let p = pod("Always", &[], &["a"]);
        let running = ctr(&p, "a", ContainerState::Running, 0, 0, false);
        let mut resized = p.clone();
        resized.spec.as_mut().unwrap().containers[0].resources =
            Some(k8s_openapi::api::core::v1::ResourceRequirements {
                limits: crate::types::pod_resources::test_pods::list(&[("cpu", "1")]),
                ..Default::default()
            });
        let a = compute_pod_actions(&resized, &status(vec![sandbox(true, 0)], vec![running.clone()]));
        assert!(a.containers_to_kill.is_empty() && a.containers_to_start.is_empty(), "{a:?}");
        // A container an earlier swiftlet created (whole-spec hash) is kept too.
        let legacy = RuntimeContainerStatus {
            hash: labels::legacy_container_hash(&p.spec.as_ref().unwrap().containers[0]),
            ..running
        };
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], vec![legacy]));
        assert!(a.containers_to_kill.is_empty(), "{a:?}");
    }

    #[test]
    fn failed_liveness_kills_and_restarts_unless_never() {
        let kill = |restart| Verdicts {
            kill: vec![("a-0", ProbeType::Liveness, "Container a failed liveness probe, will be restarted", restart)],
            ..Default::default()
        };
        let p = pod("Always", &[], &["a", "b"]);
        let s = status(
            vec![sandbox(true, 0)],
            vec![
                ctr(&p, "a", ContainerState::Running, 0, 0, false),
                ctr(&p, "b", ContainerState::Running, 0, 0, false),
            ],
        );
        let a = compute_pod_actions_with(&p, &s, &kill(true));
        assert_eq!(a.containers_to_start, [0]);
        assert_eq!(a.containers_to_kill["a-0"].1, "Container a failed liveness probe, will be restarted");
        assert_eq!(a.kill_grace["a-0"], 7);
        assert!(!a.kill_pod, "b keeps running");
        let never = pod("Never", &[], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&never, "a", ContainerState::Running, 0, 0, false)]);
        let a = compute_pod_actions_with(&never, &s, &kill(false));
        assert!(a.containers_to_start.is_empty());
        assert!(a.containers_to_kill.contains_key("a-0"));
    }

    /// `p` with ephemeral containers `(name, target)`.
    fn with_ephemeral(mut p: Pod, debuggers: &[(&str, Option<&str>)]) -> Pod {
        let list = debuggers
            .iter()
            .map(|(name, target)| k8s_openapi::api::core::v1::EphemeralContainer {
                name: (*name).into(),
                image: Some("busybox".into()),
                target_container_name: target.map(Into::into),
                ..Default::default()
            })
            .collect();
        p.spec.as_mut().unwrap().ephemeral_containers = Some(list);
        p
    }

    fn ephemeral_ctr(name: &str, state: ContainerState) -> RuntimeContainerStatus {
        RuntimeContainerStatus {
            state,
            sandbox_id: "sb0".into(),
            ..RuntimeContainerStatus::running_for_test(name, name)
        }
    }

    #[test]
    fn ephemeral_containers_start_once_in_the_current_sandbox() {
        let p = with_ephemeral(pod("Always", &[], &["a"]), &[("debug", None)]);
        // A pod whose sandbox is being created starts them at the next sync, in that sandbox.
        let a = compute_pod_actions(&p, &RuntimePodStatus::default());
        assert!(a.create_sandbox && a.ephemeral_containers_to_start.is_empty(), "{a:?}");
        let running = ctr(&p, "a", ContainerState::Running, 0, 0, false);
        let a = compute_pod_actions(&p, &status(vec![sandbox(true, 0)], vec![running.clone()]));
        assert_eq!(a.ephemeral_containers_to_start, [0]);
        assert!(!a.kill_pod && !a.create_sandbox && a.containers_to_start.is_empty(), "{a:?}");
        // Once the runtime has it, running or exited, it is never started again, whatever
        // the restart policy; a running one keeps nothing alive by itself.
        for policy in ["Always", "OnFailure", "Never"] {
            let p = with_ephemeral(pod(policy, &[], &["a"]), &[("debug", None)]);
            for state in [ContainerState::Running, ContainerState::Exited, ContainerState::Created] {
                let s = status(vec![sandbox(true, 0)], vec![ephemeral_ctr("debug", state), running.clone()]);
                let a = compute_pod_actions(&p, &s);
                assert!(a.ephemeral_containers_to_start.is_empty(), "{policy} {state:?}: {a:?}");
                assert!(a.containers_to_kill.is_empty(), "{policy} {state:?}: {a:?}");
            }
        }
        let p = with_ephemeral(pod("Never", &[], &["a"]), &[("debug", None)]);
        let done = ctr(&p, "a", ContainerState::Exited, 0, 0, false);
        let s = status(vec![sandbox(true, 0)], vec![ephemeral_ctr("debug", ContainerState::Running), done]);
        assert!(compute_pod_actions(&p, &s).kill_pod, "the app container is done; the debugger goes with the pod");
        // Nor does a new sandbox bring back the ones that ran in the old one.
        let p = with_ephemeral(pod("Always", &[], &["a"]), &[("debug", None)]);
        let s = status(
            vec![sandbox(true, 1), sandbox(false, 0)],
            vec![ctr(&p, "a", ContainerState::Running, 0, 1, false), ephemeral_ctr("debug", ContainerState::Exited)],
        );
        assert!(compute_pod_actions(&p, &s).ephemeral_containers_to_start.is_empty());
    }

    #[test]
    fn ephemeral_containers_start_while_an_init_container_fails() {
        let p = with_ephemeral(pod("Always", &["i1"], &["a"]), &[("debug", None), ("second", None)]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 1, 3, true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.ephemeral_containers_to_start, [0, 1]);
        assert_eq!(a.init_containers_to_start, [0], "the init container is retried too");
        // Still initializing: the same.
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Running, 0, 0, true)]);
        assert_eq!(compute_pod_actions(&p, &s).ephemeral_containers_to_start, [0, 1]);
    }
}
