//! Pure decisions about a pod and the runtime's view of it that both the runtime manager
//! and the status generation make (upstream `pkg/kubelet/container/helpers.go` and the
//! sandbox check of `kuberuntime_manager.go`).

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};

use super::pod_status::{ContainerState, RuntimePodStatus};

/// `spec.hostNetwork`.
#[must_use]
pub fn is_host_network(spec: &PodSpec) -> bool {
    spec.host_network.unwrap_or(false)
}

/// `spec.restartPolicy`, `Always` when unset (the API server's default).
#[must_use]
pub fn restart_policy(spec: &PodSpec) -> &str {
    spec.restart_policy.as_deref().unwrap_or("Always")
}

/// The restart policy that applies to container `c`: its own (`ContainerRestartRules`),
/// else the pod's.
#[must_use]
pub fn container_restart_policy<'a>(c: &'a Container, spec: &'a PodSpec) -> &'a str {
    c.restart_policy.as_deref().unwrap_or_else(|| restart_policy(spec))
}

/// Upstream `ShouldContainerBeRestarted` (with `ContainerRestartRules`, on by default
/// since 1.35: see [`container_should_restart`]).
#[must_use]
pub fn should_container_be_restarted(container: &Container, pod: &Pod, status: &RuntimePodStatus) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(c) = status.find_container(&container.name) else { return true };
    match c.state {
        ContainerState::Running => false,
        ContainerState::Unknown | ContainerState::Created => true,
        ContainerState::Exited => {
            pod.spec.as_ref().is_some_and(|spec| container_should_restart(container, spec, c.exit_code))
        }
    }
}

/// Upstream `podutil.ContainerShouldRestart`: whether a container that exited with
/// `exit_code` runs again. A container with its own `restartPolicy` (`ContainerRestartRules`)
/// first looks for the first of its `restartPolicyRules` whose exit codes match (`In` /
/// `NotIn`): action `Restart` restarts it, and so does `RestartAllContainers`
/// (`RestartAllContainersOnContainerExits`, beta and on since 1.36), which restarts the
/// others too. Otherwise its own policy decides, and without one the pod's.
#[must_use]
pub fn container_should_restart(c: &Container, spec: &PodSpec, exit_code: i32) -> bool {
    let by_policy = |policy: &str| match policy {
        "Never" => Some(false),
        "OnFailure" => Some(exit_code != 0),
        "Always" => Some(true),
        _ => None,
    };
    if let Some(policy) = c.restart_policy.as_deref() {
        if matching_restart_rule(c, exit_code).is_some_and(|action| action == "Restart" || action == RESTART_ALL) {
            return true;
        }
        if let Some(restart) = by_policy(policy) {
            return restart;
        }
    }
    by_policy(restart_policy(spec)).unwrap_or(true)
}

/// Upstream `FindMatchingContainerRestartRule`: the action of the first rule whose exit
/// codes match `exit_code`.
fn matching_restart_rule(c: &Container, exit_code: i32) -> Option<&str> {
    c.restart_policy_rules.iter().flatten().find_map(|rule| {
        let codes = rule.exit_codes.as_ref()?;
        let listed = codes.values.iter().flatten().any(|v| *v == exit_code);
        let matched = match codes.operator.as_str() {
            "In" => listed,
            "NotIn" => !listed,
            _ => false,
        };
        matched.then_some(rule.action.as_str())
    })
}

/// The rule action that restarts every container of the pod in place.
pub const RESTART_ALL: &str = "RestartAllContainers";

/// Whether container `c` exiting with `exit_code` restarts every container of its pod
/// (its first matching rule has the `RestartAllContainers` action).
#[must_use]
pub fn exit_restarts_all(c: &Container, exit_code: i32) -> bool {
    matching_restart_rule(c, exit_code) == Some(RESTART_ALL)
}

/// Upstream `podutil.AllContainersCouldRestart`: whether an init or app container has a
/// `RestartAllContainers` rule (such a pod gets the `AllContainersRestarting` condition).
#[must_use]
pub fn all_containers_could_restart(spec: &PodSpec) -> bool {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| c.restart_policy_rules.iter().flatten().any(|r| r.action == RESTART_ALL))
}

/// Upstream `ShouldAllContainersRestart`: whether an init or app container exited with a
/// code whose rule restarts every container, as the runtime has it (its newest instance)
/// or as the API status `api` has it.
#[must_use]
pub fn should_all_containers_restart(spec: &PodSpec, rt: Option<&RuntimePodStatus>, api: Option<&PodStatus>) -> bool {
    let api_statuses: Vec<_> = api
        .into_iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten()))
        .collect();
    spec.init_containers.iter().flatten().chain(&spec.containers).any(|c| {
        let in_runtime = rt
            .and_then(|rt| rt.find_container(&c.name))
            .is_some_and(|s| s.state == ContainerState::Exited && exit_restarts_all(c, s.exit_code));
        let in_api = api_statuses
            .iter()
            .find(|s| s.name == c.name)
            .and_then(|s| s.state.as_ref()?.terminated.as_ref())
            .is_some_and(|t| exit_restarts_all(c, t.exit_code));
        in_runtime || in_api
    })
}

/// Upstream `AllContainersRestartCleanedUp`: no init or app container of the pod is left
/// in the runtime.
#[must_use]
pub fn all_containers_restart_cleaned_up(spec: &PodSpec, rt: &RuntimePodStatus) -> bool {
    spec.init_containers.iter().flatten().chain(&spec.containers).all(|c| rt.find_container(&c.name).is_none())
}

/// Upstream `PodSandboxChanged` with its reason: the message of the
/// `PodReadyToStartContainers` condition when a new sandbox is needed (upstream
/// `kubetypes.PodSandboxNotReadyMsg*`), empty when not.
#[must_use]
pub fn pod_sandbox_changed_why(spec: &PodSpec, status: &RuntimePodStatus) -> (bool, u32, String, &'static str) {
    let Some(latest) = status.sandboxes.first() else { return (true, 0, String::new(), "no pod sandbox exists") };
    let ready = status.sandboxes.iter().filter(|s| s.ready).count();
    let next = latest.attempt + 1;
    if ready > 1 {
        return (true, next, latest.id.clone(), "multiple pod sandboxes are ready and need to be reconciled");
    }
    if !latest.ready {
        return (true, next, latest.id.clone(), "pod sandbox is not ready");
    }
    if latest.host_network != is_host_network(spec) {
        return (true, next, latest.id.clone(), "network namespace mode changed and sandbox needs to be recreated");
    }
    if !is_host_network(spec) && latest.ips.is_empty() {
        return (true, next, latest.id.clone(), "pod sandbox has no IP address");
    }
    (false, latest.attempt, latest.id.clone(), "")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerRestartRule, ContainerRestartRuleOnExitCodes};

    use super::*;

    fn spec(policy: &str) -> PodSpec {
        PodSpec { restart_policy: Some(policy.into()), ..Default::default() }
    }

    fn container(policy: Option<&str>, rules: &[(&str, &str, &[i32])]) -> Container {
        Container {
            name: "c".into(),
            restart_policy: policy.map(Into::into),
            restart_policy_rules: (!rules.is_empty()).then(|| {
                rules
                    .iter()
                    .map(|(action, op, codes)| ContainerRestartRule {
                        action: (*action).into(),
                        exit_codes: Some(ContainerRestartRuleOnExitCodes {
                            operator: (*op).into(),
                            values: Some(codes.to_vec()),
                        }),
                    })
                    .collect()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_pods_policy_decides_for_a_container_without_its_own() {
        let c = container(None, &[]);
        for (policy, code, want) in
            [("Always", 0, true), ("OnFailure", 0, false), ("OnFailure", 1, true), ("Never", 1, false)]
        {
            assert_eq!(container_should_restart(&c, &spec(policy), code), want, "{policy} {code}");
        }
    }

    #[test]
    fn a_containers_own_policy_and_rules_come_first() {
        // Pod Never, container OnFailure: a failure restarts it.
        let c = container(Some("OnFailure"), &[]);
        assert!(container_should_restart(&c, &spec("Never"), 3));
        assert!(!container_should_restart(&c, &spec("Always"), 0));
        // Container Never with a rule restarting on 42 (and only 42).
        let c = container(Some("Never"), &[("Restart", "In", &[42])]);
        assert!(container_should_restart(&c, &spec("Always"), 42));
        assert!(!container_should_restart(&c, &spec("Always"), 1));
        // NotIn: every code but those listed; the first matching rule wins.
        let c = container(Some("Never"), &[("Restart", "NotIn", &[0, 1]), ("Restart", "In", &[1])]);
        assert!(container_should_restart(&c, &spec("Never"), 7));
        assert!(!container_should_restart(&c, &spec("Never"), 0));
        assert!(container_should_restart(&c, &spec("Never"), 1), "the second rule matches 1");
        // RestartAllContainers restarts it (and the others); other codes: its policy.
        let c = container(Some("Never"), &[("RestartAllContainers", "In", &[5])]);
        assert!(container_should_restart(&c, &spec("Never"), 5));
        assert!(!container_should_restart(&c, &spec("Always"), 4));
        // Rules count only with a container-level policy.
        let mut c = container(None, &[("Restart", "In", &[5])]);
        assert!(!container_should_restart(&c, &spec("Never"), 5));
        c.restart_policy = Some("Always".into());
        assert!(container_should_restart(&c, &spec("Never"), 0));
    }

    #[test]
    fn an_exit_with_a_restart_all_rule_restarts_every_container_until_none_is_left() {
        use crate::container::pod_status::RuntimeContainerStatus;
        let mut pod = spec("Never");
        pod.containers = vec![
            Container { name: "app".into(), ..container(Some("Never"), &[("RestartAllContainers", "In", &[42])]) },
            Container { name: "other".into(), ..container(None, &[]) },
        ];
        assert!(all_containers_could_restart(&pod));
        assert!(!all_containers_could_restart(&spec("Never")));
        let exited = |code| {
            let mut c = RuntimeContainerStatus::running_for_test("app", "1");
            c.state = ContainerState::Exited;
            c.exit_code = code;
            c
        };
        let rt = |cs: Vec<RuntimeContainerStatus>| RuntimePodStatus { containers: cs, ..Default::default() };
        // From the runtime: the newest instance's exit code decides.
        assert!(should_all_containers_restart(&pod, Some(&rt(vec![exited(42)])), None));
        assert!(!should_all_containers_restart(&pod, Some(&rt(vec![exited(1)])), None));
        assert!(!should_all_containers_restart(&pod, Some(&rt(vec![exited(1), exited(42)])), None));
        // From the API status: a terminated state with that code.
        let api: PodStatus = serde_json::from_value(serde_json::json!({"containerStatuses": [
            {"name": "app", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 42}}}
        ]}))
        .unwrap();
        assert!(should_all_containers_restart(&pod, Some(&rt(vec![])), Some(&api)));
        // Cleaned up once the runtime has none of the pod's containers.
        assert!(!all_containers_restart_cleaned_up(&pod, &rt(vec![exited(42)])));
        let mut stranger = exited(42);
        stranger.name = "ephemeral".into();
        assert!(all_containers_restart_cleaned_up(&pod, &rt(vec![stranger])));
    }
}
