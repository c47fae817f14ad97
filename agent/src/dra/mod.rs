//! Dynamic Resource Allocation on the node (upstream `pkg/kubelet/cm/dra`).

pub mod checkpoint;
