//! Pod admission on the node (upstream `predicateAdmitHandler` + `GeneralPredicates`):
//! the node's OS, its name, node selector and required node affinity, `NoExecute` taints,
//! host ports, `maxPods` and resource requests against allocatable. A rejected pod
//! becomes `Failed` with the kubelet's reason (`OutOfcpu`, `OutOfmemory`, `OutOfpods`,
//! `NodeAffinity`, `NodePorts`, `Taint`, `PodOSNotSupported`) and message. Extended
//! resources the node does not report, and those DRA serves the pod (its extended resource
//! claim), are not checked ([`without_dra_backed_requests`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec};

use crate::types::quantity;

/// Why a pod was not admitted: (reason, message) as the kubelet writes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// An admission check beyond the node-fit predicates (upstream `PodAdmitHandler`): the
/// topology manager (CPU, memory and device allocation), node shutdown. Handlers run in
/// registration order, after the eviction check and before the node-fit predicates (upstream
/// registers the topology manager before the predicate handler), in standalone mode too.
pub trait PodAdmitHandler: Send + Sync + std::fmt::Debug {
    /// Admits `pod` next to the `active` pods (admitted, not terminal, `pod` excluded).
    ///
    /// # Errors
    /// The rejection: reason and message as the kubelet writes them.
    fn admit(&self, pod: &Pod, active: &[Pod]) -> Result<(), Rejection>;
}

/// Adjusts the node the node-fit check sees (upstream `pluginResourceUpdateFunc`, the
/// device manager's `UpdatePluginResources`: allocatable of a device plugin resource is at
/// least what containers already hold, e.g. right after an agent restart).
pub trait PluginResourceUpdater: Send + Sync + std::fmt::Debug {
    fn update_plugin_resources(&self, node: &mut Node);
}

/// Refuses pods asking for `supplementalGroupsPolicy: Strict` when the runtime does not
/// support it (its CRI `Status` features; upstream 1.33+'s predicate, which reads them from
/// the node's `status.features`): such a runtime would silently merge the image's groups
/// in. Runs with the other admit handlers, before the node-fit predicates (upstream checks
/// it first among the predicates), and in standalone mode too.
#[derive(Debug)]
pub struct SupplementalGroupsPolicyAdmitHandler(pub Arc<crate::container::runtime_state::RuntimeState>);

impl PodAdmitHandler for SupplementalGroupsPolicyAdmitHandler {
    fn admit(&self, pod: &Pod, _active: &[Pod]) -> Result<(), Rejection> {
        let policy = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()?.supplemental_groups_policy.as_deref());
        if policy == Some("Strict") && !self.0.supports_supplemental_groups_policy() {
            return Err(reject(
                "SupplementalGroupsPolicyNotSupported",
                "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
            ));
        }
        Ok(())
    }
}

fn reject(reason: &str, message: String) -> Rejection {
    Rejection { reason: reason.into(), message }
}

/// The requests of a pod as the node-fit check counts them (upstream `PodRequests`):
/// app containers and sidecars summed, each init container with the sidecars before it,
/// the larger of the two, pod-level requests replacing the containers' where set, plus
/// overhead; cpu in millicores, the rest in units.
#[must_use]
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, i64> {
    use crate::types::pod_resources;
    let all = pod_resources::pod_requests(pod);
    ["cpu", "memory", "ephemeral-storage"]
        .into_iter()
        .map(|r| {
            let q = pod_resources::get(&all, r);
            (r.to_string(), if r == "cpu" { q.milli_value_saturating() } else { q.value_saturating() })
        })
        .collect()
}

/// Effective requests of extended resources (e.g. device plugin resources): the pod's
/// requests (defaulted from limits, sidecars and init containers as upstream sums them).
#[must_use]
pub fn extended_requests(pod: &Pod) -> BTreeMap<String, i64> {
    crate::types::pod_resources::pod_requests(pod)
        .into_iter()
        .filter(|(k, _)| crate::types::resource_names::is_extended_resource_name(k))
        .map(|(k, v)| (k, v.value_saturating()))
        .collect()
}

/// `pod` without the extended resources its extended resource claim serves (upstream
/// `removeMissingExtendedResources`, its DRA half; `DRAExtendedResource` is GA and locked
/// on): a container's request of a DRA extended resource name that
/// `status.extendedResourceClaimStatus` maps for that container is served by DRA devices,
/// not from the node's allocatable, so the node-fit check does not count it, even where a
/// device plugin reports the same name. Upstream drops the requests only (its pods have
/// them defaulted); here the limits go too, as requests default from them. Other pods'
/// requests count in full, as upstream's node info counts them.
#[must_use]
pub fn without_dra_backed_requests(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    let Some(ext) = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.clone()) else { return pod };
    let Some(spec) = pod.spec.as_mut() else { return pod };
    let containers = spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        let name = c.name.clone();
        let served = |r: &String| {
            crate::types::resource_names::is_dra_extended_resource_name(r)
                && ext.request_mappings.iter().any(|m| m.container_name == name && m.resource_name == *r)
        };
        if let Some(resources) = c.resources.as_mut() {
            for list in [resources.requests.as_mut(), resources.limits.as_mut()].into_iter().flatten() {
                list.retain(|r, _| !served(r));
            }
        }
    }
    pod
}

/// The pod's requests of device classes' implicit extended resource names
/// (`deviceclass.resource.kubernetes.io/<class>`), summed as [`extended_requests`].
fn device_class_requests(pod: &Pod) -> BTreeMap<String, i64> {
    crate::types::pod_resources::pod_requests(pod)
        .into_iter()
        .filter(|(k, _)| k.starts_with(crate::types::resource_names::DEVICE_CLASS_RESOURCE_PREFIX))
        .map(|(k, v)| (k, v.value_saturating()))
        .collect()
}

fn requirement_matches(req: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let v = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => v.is_some_and(|v| values.contains(v)),
        "NotIn" => v.is_none_or(|v| !values.contains(v)),
        "Exists" => v.is_some(),
        "DoesNotExist" => v.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) =
                (v.and_then(|v| v.parse::<i64>().ok()), values.first().and_then(|b| b.parse::<i64>().ok()))
            else {
                return false;
            };
            if req.operator == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let name = BTreeMap::from([("metadata.name".to_string(), node.metadata.name.clone().unwrap_or_default())]);
    exprs.iter().all(|r| requirement_matches(r, &labels)) && fields.iter().all(|r| requirement_matches(r, &name))
}

fn node_affinity_ok(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some(sel) = &spec.node_selector
        && sel.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref());
    required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)))
}

fn tolerates_no_execute_taints(spec: &PodSpec, node: &Node) -> Option<String> {
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    for taint in node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default() {
        if taint.effect != "NoExecute" {
            continue;
        }
        let tolerated = tolerations.iter().any(|t| {
            let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
            let key_ok = t.key.as_deref().is_none_or(|k| k.is_empty() || k == taint.key);
            let value_ok = match t.operator.as_deref() {
                Some("Exists") => true,
                _ => t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
            };
            effect_ok && key_ok && value_ok
        });
        if !tolerated {
            return Some(format!("{}={}:{}", taint.key, taint.value.as_deref().unwrap_or_default(), taint.effect));
        }
    }
    None
}

fn host_ports(spec: &PodSpec) -> Vec<(String, i32)> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| p.host_port.filter(|h| *h > 0).map(|h| (p.protocol.clone().unwrap_or_else(|| "TCP".into()), h)))
        .collect()
}

fn allocatable(node: &Node, r: &str) -> Option<i64> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get(r)?;
    if r == "cpu" { quantity::parse_milli_cpu(&q.0).ok() } else { quantity::parse_bytes(&q.0).ok() }
}

/// Admits `pod` on `node` next to the already admitted, running `active` pods.
pub fn admit(pod: &Pod, node: &Node, active: &[Pod]) -> Result<(), Rejection> {
    let spec = pod.spec.as_ref().ok_or_else(|| reject("UnexpectedAdmissionError", "pod has no spec".into()))?;
    if let Some(os) = spec.os.as_ref().map(|o| o.name.as_str())
        && os != "linux"
    {
        return Err(reject(
            "PodOSNotSupported",
            format!("Failed to admit pod as the OS field doesn't match node OS: pod OS is {os}, node OS is linux"),
        ));
    }
    let node_name = node.metadata.name.clone().unwrap_or_default();
    if let Some(n) = &spec.node_name
        && !n.is_empty()
        && *n != node_name
    {
        return Err(reject(
            "NodeName",
            "Predicate NodeName failed: node(s) didn't match the requested node name".into(),
        ));
    }
    if !node_affinity_ok(spec, node) {
        return Err(reject(
            "NodeAffinity",
            "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".into(),
        ));
    }
    if let Some(t) = tolerates_no_execute_taints(spec, node) {
        return Err(reject(
            "Taint",
            format!("Predicate TaintToleration failed: node(s) had untolerated taint {{{t}}}"),
        ));
    }
    let used_ports: HashSet<(String, i32)> =
        active.iter().filter_map(|p| p.spec.as_ref()).flat_map(host_ports).collect();
    if host_ports(spec).iter().any(|p| used_ports.contains(p)) {
        return Err(reject(
            "NodePorts",
            "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports".into(),
        ));
    }
    if let Some(max) = allocatable(node, "pods")
        && active.len() as i64 + 1 > max
    {
        return Err(reject(
            "OutOfpods",
            format!("Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {max}", active.len()),
        ));
    }
    let want = pod_requests(pod);
    // Each active pod's requests, aggregated once for the three resources.
    let mut active_requests: Option<Vec<BTreeMap<String, i64>>> = None;
    for (r, reason) in [("cpu", "OutOfcpu"), ("memory", "OutOfmemory"), ("ephemeral-storage", "OutOfephemeral-storage")]
    {
        let req = want.get(r).copied().unwrap_or(0);
        if req == 0 {
            continue;
        }
        let Some(cap) = allocatable(node, r) else { continue };
        let used: i64 = active_requests
            .get_or_insert_with(|| active.iter().map(pod_requests).collect())
            .iter()
            .map(|q| q.get(r).copied().unwrap_or(0))
            .sum();
        if used + req > cap {
            return Err(reject(
                reason,
                format!("Node didn't have enough resource: {r}, requested: {req}, used: {used}, capacity: {cap}"),
            ));
        }
    }
    // Extended resources the node does not report are cluster-level: not checked here
    // (upstream removeMissingExtendedResources); nor are those DRA serves the pod.
    let fit_pod = without_dra_backed_requests(pod);
    for (r, req) in extended_requests(&fit_pod) {
        let Some(cap) = allocatable(node, &r).filter(|_| req > 0) else { continue };
        let used: i64 = active.iter().map(|p| extended_requests(p).get(&r).copied().unwrap_or(0)).sum();
        if used + req > cap {
            return Err(reject(
                &format!("OutOf{r}"),
                format!("Node didn't have enough resource: {r}, requested: {req}, used: {used}, capacity: {cap}"),
            ));
        }
    }
    // A device class's implicit name (`deviceclass.resource.kubernetes.io/<class>`) is a
    // native-prefixed name, which upstream's removal of missing extended resources leaves
    // in: unless DRA serves it (removed above), it is checked against allocatable.
    for (r, req) in device_class_requests(&fit_pod).into_iter().filter(|(_, req)| *req > 0) {
        let cap = allocatable(node, &r).unwrap_or(0);
        let used: i64 = active.iter().map(|p| device_class_requests(p).get(&r).copied().unwrap_or(0)).sum();
        if used + req > cap {
            return Err(reject(
                &format!("OutOf{r}"),
                format!("Node didn't have enough resource: {r}, requested: {req}, used: {used}, capacity: {cap}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"disk": "ssd", "kubernetes.io/os": "linux"}},
            "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoExecute"}]},
            "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "3", "ephemeral-storage": "10Gi"}}
        }))
        .unwrap()
    }

    fn pod(extra: &serde_json::Value) -> Pod {
        let mut spec = serde_json::json!({
            "nodeName": "n1",
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}],
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}]
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    #[test]
    fn admits_a_fitting_pod() {
        assert_eq!(admit(&pod(&serde_json::json!({})), &node(), &[]), Ok(()));
    }

    #[test]
    fn rejects_with_upstream_reasons() {
        let n = node();
        let four = vec![pod(&serde_json::json!({})); 3];
        assert_eq!(admit(&pod(&serde_json::json!({})), &n, &four).unwrap_err().reason, "OutOfpods");
        let two = vec![pod(&serde_json::json!({})); 2];
        let big = pod(
            &serde_json::json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1500m"}}}]}),
        );
        let r = admit(&big, &n, &two).unwrap_err();
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(r.message, "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000");
        let sel = pod(&serde_json::json!({"nodeSelector": {"disk": "hdd"}}));
        assert_eq!(admit(&sel, &n, &[]).unwrap_err().reason, "NodeAffinity");
        let untolerated = pod(&serde_json::json!({"tolerations": []}));
        assert_eq!(admit(&untolerated, &n, &[]).unwrap_err().reason, "Taint");
        let win = pod(&serde_json::json!({"os": {"name": "windows"}}));
        assert_eq!(admit(&win, &n, &[]).unwrap_err().reason, "PodOSNotSupported");
        let port = serde_json::json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]});
        let r = admit(&pod(&port), &n, &[pod(&port)]).unwrap_err();
        assert_eq!(r.reason, "NodePorts");
    }

    #[test]
    fn strict_supplemental_groups_need_a_runtime_that_supports_them() {
        use crate::container::runtime_state::RuntimeState;
        use k8s_cri::v1 as api;
        let state = Arc::new(RuntimeState::default());
        let handler = SupplementalGroupsPolicyAdmitHandler(state.clone());
        let strict = pod(&serde_json::json!({"securityContext": {"supplementalGroupsPolicy": "Strict"}}));
        let merge = pod(&serde_json::json!({"securityContext": {"supplementalGroupsPolicy": "Merge"}}));
        let rejection = handler.admit(&strict, &[]).unwrap_err();
        assert_eq!(rejection.reason, "SupplementalGroupsPolicyNotSupported");
        assert_eq!(rejection.message, "SupplementalGroupsPolicy=Strict is not supported in this node");
        assert!(handler.admit(&merge, &[]).is_ok());
        assert!(handler.admit(&pod(&serde_json::json!({})), &[]).is_ok());
        let ready = |t: &str| api::RuntimeCondition { r#type: t.into(), status: true, ..Default::default() };
        state.apply(Ok(&api::StatusResponse {
            status: Some(api::RuntimeStatus { conditions: vec![ready("RuntimeReady"), ready("NetworkReady")] }),
            features: Some(api::RuntimeFeatures { supplemental_groups_policy: true }),
            ..Default::default()
        }));
        assert!(handler.admit(&strict, &[]).is_ok(), "a runtime that supports it (containerd 2.0+)");
    }

    #[test]
    fn extended_resources_against_allocatable() {
        let mut n = node();
        n.status
            .as_mut()
            .unwrap()
            .allocatable
            .as_mut()
            .unwrap()
            .insert("example.com/dev".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()));
        let dev = |count: &str| {
            pod(&serde_json::json!({"containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"example.com/dev": count}}}]}))
        };
        assert_eq!(admit(&dev("2"), &n, &[]), Ok(()));
        let r = admit(&dev("2"), &n, &[dev("1")]).unwrap_err();
        assert_eq!(r.reason, "OutOfexample.com/dev");
        assert_eq!(r.message, "Node didn't have enough resource: example.com/dev, requested: 2, used: 1, capacity: 2");
        // A resource the node does not report is cluster-level: not checked.
        let other = pod(&serde_json::json!({"containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"example.com/other": "5"}}}]}));
        assert_eq!(admit(&other, &n, &[]), Ok(()));
    }

    /// `DRAExtendedResource` (GA): an extended resource that the pod's extended resource
    /// claim serves is DRA's, not the node's: not counted against allocatable even where
    /// the node reports it (a device plugin of the same name), for that container only.
    #[test]
    fn extended_resources_served_by_dra_are_not_counted() {
        let mut n = node();
        n.status
            .as_mut()
            .unwrap()
            .allocatable
            .as_mut()
            .unwrap()
            .insert("example.com/dev".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()));
        let claimed = |spec: serde_json::Value, mappings: serde_json::Value| {
            let mut p = pod(&spec);
            p.status = Some(
                serde_json::from_value(serde_json::json!({"extendedResourceClaimStatus": {
                    "resourceClaimName": "p-extended-resources-x", "requestMappings": mappings}}))
                .unwrap(),
            );
            p
        };
        let with_claim = |mappings: serde_json::Value| {
            let spec = serde_json::json!({
                "initContainers": [{"name": "i", "image": "x", "resources": {"limits": {"example.com/dev": "2"}}}],
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"example.com/dev": "2"}}}],
            });
            claimed(spec, mappings)
        };
        let map = |container: &str| serde_json::json!({"containerName": container, "resourceName": "example.com/dev", "requestName": format!("{container}-0")});
        let both = with_claim(serde_json::json!([map("i"), map("c")]));
        assert_eq!(admit(&both, &n, &[]), Ok(()));
        assert_eq!(extended_requests(&without_dra_backed_requests(&both)), BTreeMap::new());
        // Only the init container's is DRA's: the app container's 2 do not fit in 1.
        let init_only = with_claim(serde_json::json!([map("i")]));
        let r = admit(&init_only, &n, &[]).unwrap_err();
        assert_eq!(r.message, "Node didn't have enough resource: example.com/dev, requested: 2, used: 0, capacity: 1");
        // Without the claim's status, the node's allocatable counts.
        let mut plain = both.clone();
        plain.status = None;
        assert_eq!(admit(&plain, &n, &[]).unwrap_err().reason, "OutOfexample.com/dev");
        // What other pods hold of it counts as upstream counts it: all of their requests.
        let holder = pod(&serde_json::json!({"containers": [{"name": "h", "image": "x",
            "resources": {"limits": {"example.com/dev": "1"}}}]}));
        let small = with_claim(serde_json::json!([map("c")]));
        let mut small_init = small.clone();
        small_init.spec.as_mut().unwrap().init_containers = None;
        assert_eq!(admit(&small_init, &n, std::slice::from_ref(&holder)), Ok(()));
        assert_eq!(admit(&plain, &n, &[holder]).unwrap_err().reason, "OutOfexample.com/dev");
        // A device class's implicit resource name is not an extended resource the node may
        // not know: unless DRA serves it, it is checked against allocatable, which never
        // lists it (upstream's fit check, without the scheduler's device classes).
        let class = "deviceclass.resource.kubernetes.io/gpu";
        let implicit = |mappings: serde_json::Value| {
            claimed(
                serde_json::json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {class: "1"}}}]}),
                mappings,
            )
        };
        let r = admit(&implicit(serde_json::json!([])), &n, &[]).unwrap_err();
        assert_eq!(r.reason, format!("OutOf{class}"));
        assert_eq!(r.message, format!("Node didn't have enough resource: {class}, requested: 1, used: 0, capacity: 0"));
        let served = serde_json::json!([{"containerName": "c", "resourceName": class, "requestName": "r"}]);
        assert_eq!(admit(&implicit(served), &n, &[]), Ok(()));
    }

    #[test]
    fn requests_take_the_largest_init_container() {
        let p = pod(&serde_json::json!({
            "initContainers": [{"name": "i", "image": "x", "resources": {"requests": {"cpu": "1"}}}]
        }));
        assert_eq!(pod_requests(&p)["cpu"], 1000);
    }

    /// The node-fit check counts requests as upstream's `PodRequests`: pod-level requests
    /// replace the containers' sum, and sidecars run beside the app containers.
    #[test]
    fn pod_level_requests_and_sidecars_count_as_upstream() {
        let n = node();
        let pod_level = pod(&serde_json::json!({"resources": {"requests": {"cpu": "2500m"}}}));
        let r = admit(&pod_level, &n, &[]).unwrap_err();
        assert_eq!(r.message, "Node didn't have enough resource: cpu, requested: 2500, used: 0, capacity: 2000");
        let sidecar = pod(&serde_json::json!({
            "initContainers": [{"name": "s", "image": "x", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "1600m"}}}]
        }));
        let r = admit(&sidecar, &n, &[]).unwrap_err();
        assert_eq!(r.message, "Node didn't have enough resource: cpu, requested: 2100, used: 0, capacity: 2000");
        // And on the other pods' side.
        let small = pod(&serde_json::json!({"containers": [{"name": "c", "image": "x"}]}));
        let r = admit(&pod(&serde_json::json!({})), &n, &[pod_level]).unwrap_err();
        assert_eq!(r.message, "Node didn't have enough resource: cpu, requested: 500, used: 2500, capacity: 2000");
        assert_eq!(admit(&small, &n, &[sidecar]), Ok(()));
    }
}
