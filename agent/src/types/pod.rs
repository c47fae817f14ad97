//! Pod identity and the pod tests every subsystem shares: UIDs, full names, where a pod
//! came from (the `kubernetes.io/config.*` annotations the sources set), static, mirror
//! and critical pods.

use k8s_openapi::api::core::v1::Pod;

/// `kubernetes.io/config.source`: which source a pod came from (`file`, `http`, `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// `kubernetes.io/config.hash`: the static pod's UID (hash of its manifest).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// `kubernetes.io/config.seen`: when the kubelet first saw this version of the pod.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// `kubernetes.io/config.mirror`: set on a mirror pod (the API copy of a static pod), with
/// the static pod's config hash.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Source name (and [`CONFIG_SOURCE_ANNOTATION`] value) of static pod files.
pub const FILE_SOURCE: &str = "file";
/// Source name (and [`CONFIG_SOURCE_ANNOTATION`] value) of API pods.
pub const API_SOURCE: &str = "api";

/// `scheduling.SystemCriticalPriority`: the priority at and above which a pod is
/// system-critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The priority class of node-critical pods.
pub const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

/// A pod's UID, the key pods are known by everywhere; `""` for a pod without one (every
/// source gives its pods one).
#[must_use]
pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The full name of a pod as upstream prints it: `name_namespace(uid)`.
#[must_use]
pub fn pod_full_name(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        uid(pod)
    )
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether a pod comes from a source other than the API server (upstream `IsStaticPod`).
#[must_use]
pub fn is_static_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|s| s != API_SOURCE)
}

/// Whether a pod is a mirror pod, the API copy of a static pod (upstream `IsMirrorPod`):
/// not a pod to run.
#[must_use]
pub fn is_mirror_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// `types.IsCriticalPod`: static, mirror, or priority ≥ system-critical.
#[must_use]
pub fn is_critical_pod(pod: &Pod) -> bool {
    let high_priority = pod.spec.as_ref().and_then(|s| s.priority).is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
    is_static_pod(pod) || is_mirror_pod(pod) || high_priority
}

/// `types.IsNodeCriticalPod`: critical and in the `system-node-critical` priority class.
#[must_use]
pub fn is_node_critical_pod(pod: &Pod) -> bool {
    is_critical_pod(pod)
        && pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()) == Some(SYSTEM_NODE_CRITICAL)
}

/// A snapshot of one pod source (upstream `kubetypes.PodUpdate`): what `sources` send
/// and the pod manager merges.
///
/// The pods are shared with the source: a source hands over the same `Arc` for a pod
/// that did not change since its last snapshot, and the pod manager skips those without
/// copying or comparing them. A watch event on a node of 500 pods so costs one pod's
/// work, not 500 (upstream's pod config compares pointers' targets, which Go shares).
#[derive(Clone, Debug)]
pub enum PodUpdate {
    /// Every pod the source wants now (replaces what it sent before).
    Set { source: &'static str, pods: Vec<std::sync::Arc<Pod>> },
}

impl PodUpdate {
    /// A snapshot of freshly made pods (none shared with an earlier snapshot).
    #[must_use]
    pub fn set(source: &'static str, pods: impl IntoIterator<Item = Pod>) -> Self {
        Self::Set { source, pods: pods.into_iter().map(std::sync::Arc::new).collect() }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(annotations: &[(&str, &str)], priority: Option<i32>, class: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                annotations: (!annotations.is_empty()).then(|| {
                    annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>()
                }),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec { priority, priority_class_name: class.map(str::to_owned), ..PodSpec::default() }),
            ..Pod::default()
        }
    }

    #[test]
    fn names_and_uids() {
        let p = pod(&[], None, None);
        assert_eq!(uid(&p), "u1");
        assert_eq!(pod_full_name(&p), "web_default(u1)");
        let bare = Pod::default();
        assert_eq!(uid(&bare), "");
        assert_eq!(pod_full_name(&bare), "_()");
    }

    #[test]
    fn static_and_mirror() {
        assert!(is_static_pod(&pod(&[(CONFIG_SOURCE_ANNOTATION, FILE_SOURCE)], None, None)));
        assert!(is_static_pod(&pod(&[(CONFIG_SOURCE_ANNOTATION, "http")], None, None)));
        assert!(!is_static_pod(&pod(&[(CONFIG_SOURCE_ANNOTATION, API_SOURCE)], None, None)));
        assert!(!is_static_pod(&pod(&[], None, None)));
        assert!(is_mirror_pod(&pod(&[(CONFIG_MIRROR_ANNOTATION, "abc")], None, None)));
        assert!(!is_mirror_pod(&pod(&[(CONFIG_SOURCE_ANNOTATION, FILE_SOURCE)], None, None)));
    }

    #[test]
    fn critical_and_node_critical() {
        assert!(is_critical_pod(&pod(&[(CONFIG_SOURCE_ANNOTATION, FILE_SOURCE)], None, None)));
        assert!(is_critical_pod(&pod(&[(CONFIG_MIRROR_ANNOTATION, "abc")], None, None)));
        assert!(is_critical_pod(&pod(&[], Some(SYSTEM_CRITICAL_PRIORITY), None)));
        assert!(!is_critical_pod(&pod(&[], Some(SYSTEM_CRITICAL_PRIORITY - 1), None)));
        assert!(!is_critical_pod(&pod(&[(CONFIG_SOURCE_ANNOTATION, API_SOURCE)], None, None)));
        assert!(!is_node_critical_pod(&pod(&[], None, Some(SYSTEM_NODE_CRITICAL))), "the class alone is not enough");
        assert!(is_node_critical_pod(&pod(&[], Some(SYSTEM_CRITICAL_PRIORITY + 1000), Some(SYSTEM_NODE_CRITICAL))));
        assert!(!is_node_critical_pod(&pod(&[], Some(SYSTEM_CRITICAL_PRIORITY), Some("system-cluster-critical"))));
    }
}
