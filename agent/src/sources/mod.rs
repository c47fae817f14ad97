//! Pod sources (`pkg/kubelet/config`): where desired pods come from. Each source sends
//! full snapshots ([`PodUpdate::Set`], in the `types` leaf); the pod manager diffs them. Now: static pod
//! files ([`file::FileSource`]); the API server watch comes with API-server mode.

pub mod api;
pub mod defaults;
pub mod file;
pub mod metrics;

pub use crate::types::pod::PodUpdate;
