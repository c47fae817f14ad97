//! The container runtime side of the kubelet (`pkg/kubelet/kuberuntime`): the
//! [`RuntimeManager`] that turns a pod spec plus the runtime's state into CRI calls
//! (`SyncPod`, `KillPod`), ephemeral containers included ([`crate::container::ephemeral`]), in-place resize
//! ([`resize`]), the security context of sandboxes and containers ([`security_context`])
//! and the limit on concurrent starts ([`start_gate`]). The manager's parts (pod actions,
//! sandbox, containers, image credentials, DNS, environment, sync results) are files under
//! `runtime/manager/`, as upstream's `kuberuntime_*.go`; see [`manager`]. The CRI client,
//! the CRI types, the runtime's view of a pod, the labels and the crash-loop back-off it
//! shares with the rest of the kubelet are in [`crate::container`].

pub mod manager;
pub mod metrics;
pub mod resize;
pub mod runtime_class;
pub mod security_context;
pub mod start_gate;
pub mod userns;

pub use manager::{PodSyncResult, RuntimeManager, SyncAction, SyncResult};
