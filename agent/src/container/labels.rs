//! The labels and annotations that tie CRI sandboxes and containers back to pods.
//!
//! They use the upstream kubelet's keys (`pkg/kubelet/types/labels.go`,
//! `kuberuntime/labels.go`) so that swiftlet adopts what a kubelet left behind and
//! tools that read them (crictl, dashboards) keep working. Adoption after an agent
//! restart depends only on these: nothing is kept on disk.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest, Sha256};

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Marks which kind of container a CRI container is (`init`, `regular` or `ephemeral`);
/// swiftlet's own key, because the CRI does not say and the status logic must tell them
/// apart when an init container and an app container share nothing but the pod.
pub const CONTAINER_TYPE: &str = "io.swiftlet.container.type";

/// The kinds of container a pod has (upstream's `container`, `init container` and
/// `ephemeral container`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerKind {
    /// `spec.containers`.
    Regular,
    /// `spec.initContainers`.
    Init,
    /// `spec.ephemeralContainers` (`kubectl debug`).
    Ephemeral,
}

impl ContainerKind {
    /// The value of the [`CONTAINER_TYPE`] label.
    #[must_use]
    pub fn label_value(self) -> &'static str {
        match self {
            Self::Regular => "regular",
            Self::Init => "init",
            Self::Ephemeral => "ephemeral",
        }
    }

    /// The `container_type` label of `kubelet_started_containers_total` and its errors
    /// counter (upstream `metrics.Container`, `InitContainer`, `EphemeralContainer`).
    #[must_use]
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Regular => "container",
            Self::Init => "init_container",
            Self::Ephemeral => "ephemeral_container",
        }
    }
}

/// Pod identity as found on a CRI object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub uid: String,
    pub name: String,
    pub namespace: String,
}

impl PodRef {
    /// Reads the pod identity from CRI labels; `None` for objects the kubelet did not make.
    #[must_use]
    pub fn from_labels(labels: &HashMap<String, String>) -> Option<Self> {
        Some(Self {
            uid: labels.get(POD_UID)?.clone(),
            name: labels.get(POD_NAME).cloned().unwrap_or_default(),
            namespace: labels.get(POD_NAMESPACE).cloned().unwrap_or_default(),
        })
    }
}

fn meta(pod: &Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default(),
    )
}

/// Labels of a pod sandbox: the pod's own labels plus the identity labels.
#[must_use]
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> =
        pod.metadata.labels.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    let (name, ns, uid) = meta(pod);
    labels.insert(POD_NAME.into(), name.into());
    labels.insert(POD_NAMESPACE.into(), ns.into());
    labels.insert(POD_UID.into(), uid.into());
    labels
}

/// Annotations of a pod sandbox: the pod's annotations.
#[must_use]
pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata.annotations.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Labels of a container (identity only, as upstream: pod labels stay on the sandbox).
#[must_use]
pub fn container_labels(pod: &Pod, container: &Container, kind: ContainerKind) -> HashMap<String, String> {
    let (name, ns, uid) = meta(pod);
    HashMap::from([
        (POD_NAME.into(), name.into()),
        (POD_NAMESPACE.into(), ns.into()),
        (POD_UID.into(), uid.into()),
        (CONTAINER_NAME.into(), container.name.clone()),
        (CONTAINER_TYPE.into(), kind.label_value().into()),
    ])
}

/// Annotations of a container: the hash of its spec, its restart count, and what the
/// kubelet needs to stop it or read its termination message after a restart.
#[must_use]
pub fn container_annotations(pod: &Pod, container: &Container, restart_count: u32) -> HashMap<String, String> {
    let mut a: HashMap<String, String> = HashMap::from([
        (CONTAINER_HASH.into(), container_hash(container)),
        (CONTAINER_RESTART_COUNT.into(), restart_count.to_string()),
        (
            CONTAINER_TERMINATION_MESSAGE_PATH.into(),
            container.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
            container.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
        ),
    ]);
    if let Some(g) = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds) {
        a.insert(POD_TERMINATION_GRACE_PERIOD.into(), g.to_string());
    }
    a
}

/// A stable hash of a container spec: a change means the container must be recreated.
/// Computed over the canonical JSON of the spec, so it is the same across agent restarts.
/// Resources and resize policies are left out: a resize changes them in place or restarts
/// the container as its `resizePolicy` says ([`super::resize`]), as upstream's hash (name
/// and image only) ignores them.
#[must_use]
pub fn container_hash(container: &Container) -> String {
    let mut container = container.clone();
    container.resources = None;
    container.resize_policy = None;
    let json = serde_json::to_vec(&container).unwrap_or_default();
    let digest = Sha256::digest(&json);
    hex::encode(&digest[..4])
}

/// The hash earlier swiftlet versions wrote (over the whole spec, resources included): a
/// container they created still matches its unchanged spec, so an upgrade restarts nothing.
#[must_use]
pub fn legacy_container_hash(container: &Container) -> String {
    let json = serde_json::to_vec(container).unwrap_or_default();
    let digest = Sha256::digest(&json);
    hex::encode(&digest[..4])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_sensitive() {
        let mut c = Container { name: "a".into(), image: Some("busybox".into()), ..Default::default() };
        let h1 = container_hash(&c);
        assert_eq!(h1, container_hash(&c.clone()));
        assert_eq!(h1.len(), 8);
        c.command = Some(vec!["sleep".into()]);
        assert_ne!(h1, container_hash(&c));
        // Resources and resize policies change in place: not part of the hash.
        let h2 = container_hash(&c);
        c.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements::default());
        c.resize_policy = Some(vec![]);
        assert_eq!(h2, container_hash(&c));
        assert_ne!(legacy_container_hash(&c), container_hash(&c));
    }

    #[test]
    fn the_container_kind_is_a_label_and_a_metric_label() {
        let pod = Pod::default();
        let c = Container { name: "debug".into(), ..Default::default() };
        let kinds = [ContainerKind::Regular, ContainerKind::Init, ContainerKind::Ephemeral];
        let labels: Vec<String> =
            kinds.iter().map(|k| container_labels(&pod, &c, *k)[CONTAINER_TYPE].clone()).collect();
        assert_eq!(labels, ["regular", "init", "ephemeral"]);
        let metric: Vec<&str> = kinds.iter().map(|k| k.metric_label()).collect();
        assert_eq!(metric, ["container", "init_container", "ephemeral_container"]);
    }

    #[test]
    fn pod_ref_needs_uid() {
        let mut l = HashMap::new();
        assert!(PodRef::from_labels(&l).is_none());
        l.insert(POD_UID.to_string(), "u".to_string());
        assert_eq!(PodRef::from_labels(&l).unwrap().uid, "u");
    }
}
