//! The sync loop's part in in-place resize (upstream `HandlePodAdditions` /
//! `HandlePodUpdates` / `HandlePodRemoves` and the allocation manager's retry ticker):
//! allocate admitted pods, evaluate resizes on updates, retry pending resizes when pods
//! go away or finish, after another resize, and periodically.
//!
//! A resize is checked against the node-fit predicates ([`crate::lifecycle::admission`])
//! with the other active pods at their allocated resources. The other admit handlers
//! (topology manager) are not consulted for resizes: they allocate on admission, and the
//! resize of pods with exclusive resources is infeasible anyway.

use crate::types::pod::uid as pod_uid;
use std::collections::HashSet;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};

use super::SyncLoop;
use crate::allocation::{ResizeContext, triggers};
use crate::lifecycle::admission::Rejection;
use crate::pod_workers::WorkType;

/// Node allocatable as (cpu millicores, memory bytes).
#[must_use]
pub fn node_allocatable(node: &Node) -> Option<(i64, i64)> {
    let a = node.status.as_ref()?.allocatable.as_ref()?;
    let cpu = crate::types::quantity::parse_milli_cpu(&a.get("cpu")?.0).ok()?;
    let mem = crate::types::quantity::parse_bytes(&a.get("memory")?.0).ok()?;
    Some((cpu, mem))
}

impl SyncLoop {
    /// Admitted, non-terminal pods other than `exclude`, at their allocated resources.
    fn allocated_active_pods(&self, exclude: &str) -> Vec<Pod> {
        let a = self.runtime.allocation();
        let rejected = self.rejected.lock().unwrap().clone();
        self.pod_manager
            .pods()
            .into_iter()
            .filter(|p| {
                let u = pod_uid(p);
                u != exclude
                    && !rejected.contains(u)
                    && !self.status.get(u).is_some_and(|s| matches!(s.phase.as_deref(), Some("Succeeded" | "Failed")))
            })
            .map(|p| a.update_pod_from_allocation(&p).0)
            .collect()
    }

    fn resize_fits(&self, pod: &Pod, node: Option<&Node>) -> Result<(), Rejection> {
        let others = self.allocated_active_pods(pod_uid(pod));
        match node {
            Some(node) => crate::lifecycle::admission::admit(pod, node, &others),
            None => Ok(()),
        }
    }

    fn with_resize_context<T>(&self, f: impl FnOnce(&ResizeContext<'_>) -> T) -> T {
        let node = self.node.as_ref().and_then(|n| n.read().unwrap().clone());
        let fits = |p: &Pod| self.resize_fits(p, node.as_ref());
        let ctx = ResizeContext { allocatable: node.as_ref().and_then(node_allocatable), fits: &fits };
        f(&ctx)
    }

    /// An admitted pod: allocate it (or keep its checkpointed allocation) and handle a
    /// resize made while the agent was down.
    pub fn resize_pod_added(&self, pod: &Pod) {
        let a = self.runtime.allocation();
        a.add_pod(pod);
        if a.update_pod_from_allocation(pod).1 {
            self.resize_pod_updated(pod);
        }
    }

    /// A pod's spec may have been resized: evaluate it; an allocated resize may make room
    /// for nothing, but a changed allocation is a trigger for the others' retries.
    pub fn resize_pod_updated(&self, pod: &Pod) {
        let a = self.runtime.allocation().clone();
        if pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        let allocated = self.with_resize_context(|ctx| a.handle_resize(pod, ctx));
        if allocated {
            self.retry_pending_resizes(triggers::POD_RESIZED);
        }
    }

    /// A pod left its source.
    pub fn resize_pod_removed(&self, pod: &Pod) {
        let a = self.runtime.allocation().clone();
        a.remove_pod(pod_uid(pod));
        self.retry_pending_resizes(triggers::PODS_REMOVED);
    }

    /// Retries the pending resizes and syncs the pods whose resize moved on.
    pub fn retry_pending_resizes(&self, trigger: &str) {
        let a = self.runtime.allocation().clone();
        if !a.has_pending() || !self.pod_manager.sources_ready() {
            return;
        }
        let pod_of = |uid: &str| self.pod_manager.get(uid);
        let to_sync = self.with_resize_context(|ctx| a.retry_pending(trigger, &pod_of, ctx));
        for pod in to_sync {
            self.workers.update_pod(pod, WorkType::Sync);
        }
    }

    /// Housekeeping: forget pods no longer desired; retry pending resizes when a pod
    /// finished or the periodic retry is due.
    pub fn resize_housekeeping(&self, desired: &HashSet<String>) {
        let a = self.runtime.allocation().clone();
        a.remove_orphans(desired);
        let terminal: HashSet<String> = desired
            .iter()
            .filter(|u| matches!(self.status.phase(u).as_deref(), Some("Succeeded" | "Failed")))
            .cloned()
            .collect();
        if a.note_terminal_pods(&terminal) {
            self.retry_pending_resizes(triggers::POD_TERMINATED);
        } else if a.periodic_retry_due(Instant::now()) {
            self.retry_pending_resizes(triggers::PERIODIC);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    #[test]
    fn node_allocatable_in_millicores_and_bytes() {
        let node: Node =
            serde_json::from_value(json!({"status": {"allocatable": {"cpu": "1500m", "memory": "2Gi"}}})).unwrap();
        assert_eq!(super::node_allocatable(&node), Some((1500, 2 << 30)));
        let node: Node = serde_json::from_value(json!({"status": {"allocatable": {"cpu": "2"}}})).unwrap();
        assert_eq!(super::node_allocatable(&node), None, "no memory: no capacity check");
    }
}
