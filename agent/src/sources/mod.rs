//! Pod sources (`pkg/kubelet/config`): where desired pods come from. Each source sends
//! full snapshots ([`PodUpdate::Set`]); the pod manager diffs them. Now: static pod
//! files ([`file::FileSource`]); the API server watch comes with API-server mode.

pub mod api;
pub mod defaults;
pub mod file;

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
/// Source name of static pod files.
pub const FILE_SOURCE: &str = "file";

/// A snapshot of one source.
#[derive(Clone, Debug)]
pub enum PodUpdate {
    /// Every pod the source wants now (replaces what it sent before).
    Set { source: &'static str, pods: Vec<Pod> },
}

/// Whether a pod comes from a source other than the API server (upstream `IsStaticPod`).
#[must_use]
pub fn is_static_pod(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION)).is_some_and(|s| s != "api")
}
