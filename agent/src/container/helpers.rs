//! Pure decisions about a pod and the runtime's view of it that both the runtime manager
//! and the status generation make (upstream `pkg/kubelet/container/helpers.go` and the
//! sandbox check of `kuberuntime_manager.go`).

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

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

/// Upstream `ShouldContainerBeRestarted`.
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
            let Some(spec) = pod.spec.as_ref() else { return false };
            match restart_policy(spec) {
                "Never" => false,
                "OnFailure" => c.exit_code != 0,
                _ => true,
            }
        }
    }
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
