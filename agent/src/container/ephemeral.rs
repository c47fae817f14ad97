//! Ephemeral containers (`spec.ephemeralContainers`, what `kubectl debug` adds through the
//! `pods/<name>/ephemeralcontainers` subresource), as the upstream kubelet runs them
//! (`kuberuntime_manager.go` `computePodActions`/`SyncPod`, `kuberuntime_container.go`
//! `startSpec`/`getTargetID`, `kuberuntime_container_linux.go`):
//!
//! - each one that the runtime has never had (no container of its name for the pod) is
//!   started once, in the pod's current sandbox, before the init containers (so even while
//!   an init container keeps failing), and never again, whatever the restart policy; a new
//!   sandbox does not bring them back either;
//! - with `targetContainerName` it joins the pid namespace of the newest container of that
//!   name (CRI `NamespaceMode::TARGET` with `target_id`), unless the pod's pid namespace is
//!   the node's or the pod's. No container of that name at all is a
//!   `CreateContainerConfigError` ("unable to find target container ..."); a target that is
//!   not running is passed on as it is, and the runtime refuses it (containerd: a
//!   `CreateContainerError`); either way the start is tried again at the next sync, as
//!   nothing was created;
//! - it has no probes, lifecycle hooks, ports or resources (the API server refuses them), and
//!   its status (`ephemeralContainerStatuses`) counts for neither the pod's phase nor its
//!   readiness.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, PodSpec};

use crate::container::pod_status::RuntimePodStatus;

/// The container part of an ephemeral container (upstream's conversion of
/// `EphemeralContainerCommon` to `Container`): every field but `targetContainerName`.
#[must_use]
pub fn as_container(ec: &EphemeralContainer) -> Container {
    // The two types share every field but `targetContainerName`; going through JSON keeps
    // that true as fields are added to both.
    let mut value = serde_json::to_value(ec).unwrap_or_default();
    if let Some(m) = value.as_object_mut() {
        m.remove("targetContainerName");
    }
    serde_json::from_value(value).unwrap_or_else(|_| Container { name: ec.name.clone(), ..Default::default() })
}

/// The pod's ephemeral containers as containers, in spec order.
#[must_use]
pub fn containers(spec: &PodSpec) -> Vec<Container> {
    spec.ephemeral_containers.iter().flatten().map(as_container).collect()
}

/// Indexes into `spec.ephemeralContainers` of those to start: the ones the runtime has no
/// container of (upstream: `FindContainerStatusByName(...) == nil`). An ephemeral
/// container that ran is never started again.
#[must_use]
pub fn to_start(spec: &PodSpec, status: &RuntimePodStatus) -> Vec<usize> {
    spec.ephemeral_containers
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, ec)| status.find_container(&ec.name).is_none())
        .map(|(i, _)| i)
        .collect()
}

/// Why an ephemeral container cannot be given its target (upstream `getTargetID`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to find target container {0}")]
pub struct TargetNotFound(pub String);

/// The runtime id of the container whose pid namespace an ephemeral container with
/// `targetContainerName: target` joins: the newest container of that name, in whatever
/// state (the runtime decides what a stopped target means). `None` without a target.
///
/// # Errors
/// [`TargetNotFound`] when the runtime has no container of that name for the pod.
pub fn target_id<'a>(target: Option<&str>, status: &'a RuntimePodStatus) -> Result<Option<&'a str>, TargetNotFound> {
    let Some(name) = target.filter(|t| !t.is_empty()) else { return Ok(None) };
    status.find_container(name).map(|c| Some(c.id.as_str())).ok_or_else(|| TargetNotFound(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::container::{ContainerState, RuntimeContainerStatus};

    fn spec() -> PodSpec {
        serde_json::from_value(json!({
            "containers": [{"name": "app", "image": "img"}],
            "ephemeralContainers": [
                {"name": "debug-1", "image": "busybox", "command": ["sh"], "stdin": true, "tty": true,
                 "targetContainerName": "app", "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                {"name": "debug-2", "image": "busybox"},
            ],
        }))
        .unwrap()
    }

    #[test]
    fn an_ephemeral_container_is_a_container_without_its_target() {
        let c = &containers(&spec())[0];
        assert_eq!(c.name, "debug-1");
        assert_eq!(c.image.as_deref(), Some("busybox"));
        assert_eq!(c.command.as_deref(), Some(&["sh".to_owned()][..]));
        assert_eq!((c.stdin, c.tty), (Some(true), Some(true)));
        assert_eq!(c.volume_mounts.as_ref().unwrap()[0].mount_path, "/v");
    }

    #[test]
    fn only_those_never_created_are_started() {
        let s = spec();
        let mut status = RuntimePodStatus::default();
        assert_eq!(to_start(&s, &status), [0, 1]);
        // Running, or exited long ago: never again.
        let mut exited = RuntimeContainerStatus::running_for_test("debug-2", "d2");
        exited.state = ContainerState::Exited;
        status.containers = vec![RuntimeContainerStatus::running_for_test("debug-1", "d1"), exited];
        assert!(to_start(&s, &status).is_empty());
    }

    #[test]
    fn the_target_is_the_newest_container_of_its_name() {
        let mut status = RuntimePodStatus::default();
        assert_eq!(target_id(None, &status), Ok(None));
        assert_eq!(target_id(Some(""), &status), Ok(None));
        assert_eq!(target_id(Some("app"), &status), Err(TargetNotFound("app".into())));
        assert_eq!(TargetNotFound("app".into()).to_string(), "unable to find target container app");
        let mut old = RuntimeContainerStatus::running_for_test("app", "old");
        old.state = ContainerState::Exited;
        // Newest first, as the runtime status lists them; a stopped one is still a target.
        status.containers = vec![RuntimeContainerStatus::running_for_test("app", "new"), old.clone()];
        assert_eq!(target_id(Some("app"), &status), Ok(Some("new")));
        status.containers = vec![old];
        assert_eq!(target_id(Some("app"), &status), Ok(Some("old")));
    }
}
