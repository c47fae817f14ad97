//! Pod lifecycle handlers of the kubelet: admission (`lifecycle/predicate.go`), the
//! checks a kubelet makes before it runs a pod bound to it, and the container hooks
//! (`lifecycle/handlers.go`): postStart and preStop handlers.

pub mod admission;
pub mod declared_features;
pub mod hooks;
pub mod sysctl;
