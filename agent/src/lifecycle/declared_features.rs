//! Node declared features (`NodeDeclaredFeatures`, GA in 1.37; upstream
//! `k8s.io/component-helpers/nodedeclaredfeatures` and the kubelet's
//! `declaredFeaturesAdmitHandler`).
//!
//! A node lists in `status.declaredFeatures` the features of its agent that a pod may
//! depend on; the scheduler's `NodeDeclaredFeatures` plugin sends a pod that needs one only
//! to nodes that declare it, and the agent refuses such a pod when it does not
//! (`PodFeatureUnsupported`); the API server likewise refuses an update (a resize) that
//! needs a feature the pod's node lacks. swiftlet declares only what it implements:
//! [`DECLARED`]. Of upstream's registry, the features a pod's spec can require at
//! scheduling are [`RESTART_ALL_CONTAINERS`], `UserNamespacesHostNetworkSupport` (a
//! host-network pod with `hostUsers: false`) and `VolumeBindMountOptions` (a volume mount
//! with `bindMountOptions`). Of those that matter to updates, [`INIT_CONTAINER_RESIZE`] and
//! [`POD_LEVEL_RESOURCES_RESIZE`] are declared; memory-backed volume resize, DRA and
//! `ExtendWebSocketsToKubelet` are not, because swiftlet does not implement them.

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::admission::{PodAdmitHandler, Rejection};
use crate::container::helpers::all_containers_could_restart;

/// `RestartAllContainersOnContainerExits`: the `RestartAllContainers` restart rule action.
pub const RESTART_ALL_CONTAINERS: &str = "RestartAllContainersOnContainerExits";
const USER_NAMESPACES_HOST_NETWORK: &str = "UserNamespacesHostNetworkSupport";
const VOLUME_BIND_MOUNT_OPTIONS: &str = "VolumeBindMountOptions";

/// `InPlacePodVerticalScalingInitContainers`: resizing a plain (non-sidecar) init
/// container in place; the API server refuses such a resize for a node without it.
pub const INIT_CONTAINER_RESIZE: &str = "InPlacePodVerticalScalingInitContainers";

/// `InPlacePodLevelResourcesVerticalScaling`: resizing a pod's pod-level resources in
/// place; the API server refuses such a resize for a node without it.
pub const POD_LEVEL_RESOURCES_RESIZE: &str = "InPlacePodLevelResourcesVerticalScaling";

/// What the node declares in `status.declaredFeatures`, sorted as upstream sorts them.
pub const DECLARED: &[&str] = &[POD_LEVEL_RESOURCES_RESIZE, INIT_CONTAINER_RESIZE, RESTART_ALL_CONTAINERS];

/// The reason of a pod refused for a feature the node lacks.
pub const UNSUPPORTED_REASON: &str = "PodFeatureUnsupported";

/// Upstream `InferForPodScheduling`: the features `spec` needs from its node, sorted by
/// name.
#[must_use]
pub fn required_for_scheduling(spec: &PodSpec) -> Vec<&'static str> {
    let mut required = Vec::new();
    if all_containers_could_restart(spec) {
        required.push(RESTART_ALL_CONTAINERS);
    }
    if spec.host_network == Some(true) && spec.host_users == Some(false) {
        required.push(USER_NAMESPACES_HOST_NETWORK);
    }
    let bind_options = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .chain(spec.ephemeral_containers.iter().flatten().flat_map(|c| c.volume_mounts.iter().flatten()))
        .any(|m| m.bind_mount_options.as_ref().is_some_and(|o| !o.is_empty()));
    if bind_options {
        required.push(VOLUME_BIND_MOUNT_OPTIONS);
    }
    required
}

/// Upstream `declaredFeaturesAdmitHandler`: refuses a pod that needs a feature the node
/// does not declare.
#[derive(Debug, Default)]
pub struct DeclaredFeaturesAdmitHandler;

impl PodAdmitHandler for DeclaredFeaturesAdmitHandler {
    fn admit(&self, pod: &Pod, _active: &[Pod]) -> Result<(), Rejection> {
        let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
        let missing: Vec<&str> = required_for_scheduling(spec).into_iter().filter(|f| !DECLARED.contains(f)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Rejection {
            reason: UNSUPPORTED_REASON.into(),
            message: format!("Pod requires node features that are not available: {}", missing.join(", ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        p.spec = Some(serde_json::from_value(spec).unwrap());
        p
    }

    #[test]
    fn a_pod_needing_an_undeclared_feature_is_refused_with_its_names() {
        let h = DeclaredFeaturesAdmitHandler;
        let plain = pod(serde_json::json!({"containers": [{"name": "c"}]}));
        assert!(h.admit(&plain, &[]).is_ok());
        let restart_all = pod(serde_json::json!({"containers": [{"name": "c", "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]}]}));
        assert_eq!(required_for_scheduling(restart_all.spec.as_ref().unwrap()), [RESTART_ALL_CONTAINERS]);
        assert!(h.admit(&restart_all, &[]).is_ok(), "declared");
        let both = pod(serde_json::json!({"hostNetwork": true, "hostUsers": false, "containers": [{"name": "c",
            "volumeMounts": [{"name": "v", "mountPath": "/v", "bindMountOptions": ["nosuid"]}]}]}));
        let r = h.admit(&both, &[]).unwrap_err();
        assert_eq!(r.reason, "PodFeatureUnsupported");
        assert_eq!(
            r.message,
            "Pod requires node features that are not available: UserNamespacesHostNetworkSupport, VolumeBindMountOptions"
        );
        // hostUsers false alone, or on the pod network, needs nothing.
        let userns = pod(serde_json::json!({"hostUsers": false, "containers": [{"name": "c"}]}));
        assert!(required_for_scheduling(userns.spec.as_ref().unwrap()).is_empty());
    }
}
