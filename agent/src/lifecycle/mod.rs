//! Pod lifecycle handlers of the kubelet. Now: admission (`lifecycle/predicate.go`),
//! the checks a kubelet makes before it runs a pod bound to it. Hooks (postStart,
//! preStop) come with the probes issue.

pub mod admission;
