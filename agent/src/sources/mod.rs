//! Pod sources (`pkg/kubelet/config`): where desired pods come from. Each source sends
//! full snapshots ([`PodUpdate::Set`]); the pod manager diffs them. Now: static pod
//! files ([`file::FileSource`]); the API server watch comes with API-server mode.

pub mod api;
pub mod defaults;
pub mod file;

use k8s_openapi::api::core::v1::Pod;

/// A snapshot of one source.
#[derive(Clone, Debug)]
pub enum PodUpdate {
    /// Every pod the source wants now (replaces what it sent before).
    Set { source: &'static str, pods: Vec<Pod> },
}
