//! What a sync must do to a pod (upstream `computePodActions` in
//! `kuberuntime_manager.go`): [`compute_pod_actions`] is a pure function of the pod's spec
//! and the runtime's state, with its helpers (`ShouldContainerBeRestarted`, the next init
//! container, whether the sandbox must be recreated).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::container::ephemeral;
use crate::container::helpers::{pod_sandbox_changed_why, restart_policy, should_container_be_restarted};
use crate::container::labels;
use crate::container::pod_status::{ContainerState, RuntimeContainerStatus, RuntimePodStatus};

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
    /// Index into `spec.initContainers` of the next init container to start.
    pub next_init_container: Option<usize>,
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
}

fn should_restart_on_failure(spec: &PodSpec) -> bool {
    restart_policy(spec) != "Never"
}

fn is_init_container_failed(c: &RuntimeContainerStatus) -> bool {
    (c.state == ContainerState::Exited && c.exit_code != 0) || c.state == ContainerState::Unknown
}

/// Upstream `findNextInitContainerToRun`: (status of the last failed init container,
/// index of the next init container to run, whether all are done).
fn find_next_init_container<'a>(
    spec: &PodSpec,
    status: &'a RuntimePodStatus,
) -> (Option<&'a RuntimeContainerStatus>, Option<usize>, bool) {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    if inits.is_empty() {
        return (None, None, true);
    }
    // A running app container means initialization happened (e.g. before an agent restart
    // after which init containers were garbage collected).
    if spec
        .containers
        .iter()
        .any(|c| status.find_container(&c.name).is_some_and(|s| s.state == ContainerState::Running))
    {
        return (None, None, true);
    }
    for (i, c) in inits.iter().enumerate().rev() {
        if let Some(s) = status.find_container(&c.name)
            && is_init_container_failed(s)
        {
            return (Some(s), Some(i), false);
        }
    }
    for (i, c) in inits.iter().enumerate().rev() {
        let Some(s) = status.find_container(&c.name) else { continue };
        match s.state {
            ContainerState::Running | ContainerState::Created => return (None, None, false),
            ContainerState::Exited => {
                if i == inits.len() - 1 {
                    return (None, None, true);
                }
                return (None, Some(i + 1), false);
            }
            ContainerState::Unknown => {}
        }
    }
    (None, Some(0), false)
}

/// Upstream `podSandboxChanged`: (create a new sandbox?, attempt, current sandbox id).
fn pod_sandbox_changed(spec: &PodSpec, status: &RuntimePodStatus) -> (bool, u32, String) {
    let (changed, attempt, id, _) = pod_sandbox_changed_why(spec, status);
    (changed, attempt, id)
}

/// Upstream `computePodActions`.
#[must_use]
pub fn compute_pod_actions(pod: &Pod, status: &RuntimePodStatus) -> PodActions {
    compute_pod_actions_with(pod, status, &|_, _| None)
}

/// [`compute_pod_actions`] with the prober's verdicts: `probe_kill(container, id)` says
/// whether a failed liveness or startup probe wants the running container killed.
pub fn compute_pod_actions_with(
    pod: &Pod,
    status: &RuntimePodStatus,
    probe_kill: &dyn Fn(&Container, &str) -> Option<crate::prober::ProbeKill>,
) -> PodActions {
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
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !(restart_policy(spec) == "OnFailure"
                    && status
                        .find_container(&c.name)
                        .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0))
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
            actions.next_init_container = Some(0);
            return actions;
        }
        actions.containers_to_start = to_start;
        return actions;
    }

    // Ephemeral containers start even while initialization fails (upstream computes them
    // before looking at the init containers), and only in a sandbox that exists.
    actions.ephemeral_containers_to_start = ephemeral::to_start(spec, status);

    let (last_failed, next, done) = find_next_init_container(spec, status);
    if !done {
        if let Some(next) = next {
            let failed = last_failed.is_some();
            if failed && !should_restart_on_failure(spec) {
                actions.kill_pod = true;
            } else {
                if let Some(s) = last_failed.filter(|s| s.state == ContainerState::Unknown) {
                    actions.containers_to_kill.insert(
                        s.id.clone(),
                        (s.name.clone(), "Init container is in unknown state, try killing it before restart".into()),
                    );
                }
                actions.next_init_container = Some(next);
            }
        }
        return actions;
    }

    let mut keep = 0;
    for (i, c) in spec.containers.iter().enumerate() {
        let s = status.find_container(&c.name);
        if let Some(s) = s.filter(|s| s.state == ContainerState::Unknown) {
            actions.containers_to_kill.insert(
                s.id.clone(),
                (c.name.clone(), "Container is in unknown state, try killing it before restart".into()),
            );
        }
        match s {
            Some(s) if s.state == ContainerState::Running => {
                if !s.hash.is_empty()
                    && s.hash != labels::container_hash(c)
                    && s.hash != labels::legacy_container_hash(c)
                {
                    actions.containers_to_start.push(i);
                    actions.containers_to_kill.insert(
                        s.id.clone(),
                        (c.name.clone(), format!("Container {} definition changed, will be restarted", c.name)),
                    );
                } else if let Some(kill) = probe_kill(c, &s.id) {
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
        }
    }

    fn status(sandboxes: Vec<SandboxStatus>, containers: Vec<RuntimeContainerStatus>) -> RuntimePodStatus {
        RuntimePodStatus { uid: "u1".into(), sandboxes, containers, ..Default::default() }
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
        assert_eq!(a.next_init_container, Some(0));
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_in_order_then_apps() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Running, 0, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.next_init_container, None);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);

        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 0, 0, true)]);
        assert_eq!(compute_pod_actions(&p, &s).next_init_container, Some(1));

        let s = status(
            vec![sandbox(true, 0)],
            vec![ctr(&p, "i2", ContainerState::Exited, 0, 0, true), ctr(&p, "i1", ContainerState::Exited, 0, 0, true)],
        );
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.next_init_container, None);
        assert_eq!(a.containers_to_start, vec![0]);
    }

    #[test]
    fn failed_init_blocks_apps_and_restarts_or_kills() {
        let p = pod("Always", &["i1"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.next_init_container, Some(0));
        assert!(a.containers_to_start.is_empty());

        let p = pod("Never", &["i1"], &["a"]);
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Exited, 1, 0, true)]);
        let a = compute_pod_actions(&p, &s);
        assert!(a.kill_pod);
        assert_eq!(a.next_init_container, None);
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
        let kill = |restart| {
            move |c: &Container, id: &str| {
                (c.name == "a" && id == "a-0").then(|| crate::prober::ProbeKill {
                    probe_type: crate::prober::ProbeType::Liveness,
                    message: "Container a failed liveness probe, will be restarted".into(),
                    grace_period_seconds: 7,
                    restart,
                })
            }
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
        assert_eq!(a.next_init_container, Some(0), "the init container is retried too");
        // Still initializing: the same.
        let s = status(vec![sandbox(true, 0)], vec![ctr(&p, "i1", ContainerState::Running, 0, 0, true)]);
        assert_eq!(compute_pod_actions(&p, &s).ephemeral_containers_to_start, [0, 1]);
    }
}
